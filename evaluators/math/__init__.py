"""Math evaluation: avg@k, the unbiased pass@k estimator, and confidence intervals."""

from evaluators.math.metrics import accuracy_summary, avg_at_k, mean_interval, pass_at_k, wilson_interval

__all__ = ["accuracy_summary", "avg_at_k", "mean_interval", "pass_at_k", "wilson_interval"]
