"""Accuracy metrics over sampled answers, with their uncertainty.

For a task with ``n`` sampled answers of which ``c`` are correct:

- ``avg@k`` (here always over all ``n`` samples): the mean over tasks of ``c / n``;
- ``pass@k`` (Chen et al., 2021, the unbiased estimator): the mean over tasks of
  ``1 - C(n - c, k) / C(n, k)``, the probability that at least one of ``k`` answers drawn
  without replacement from the ``n`` is correct; defined for ``k <= n``.

Uncertainty is over tasks (the sampling unit of a benchmark), for 0/1 outcomes, by
intervals that never have zero width: :func:`wilson_interval` for a proportion of tasks
(one sample per task) and :func:`clustered_wilson_interval` for avg@k with k >= 1
samples per task (Wilson at Kish's effective sample size; the same interval at k = 1;
formulas in :mod:`trace_gym.report`). Paired comparisons over tasks:
``trace_gym.report.paired_proportion_difference`` (Agresti-Min). :func:`mean_interval`
is the Student-t interval of a mean of continuous scores; over per-task accuracies it
collapses to zero width when every task scores the same (5 tasks x 2 samples, all
wrong: [0, 0]), so accuracy does not use it. All intervals are 95 % by default.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``n`` samples, ``c`` correct.

    >>> pass_at_k(4, 1, 2)
    0.5
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i = n-c+1}^{n} (1 - k / i), numerically stable form of the binomial ratio
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def avg_at_k(correct: Sequence[Sequence[float]]) -> float:
    """Mean over tasks of the mean score of the task's samples (rewards in [0, 1])."""
    if not correct:
        return math.nan
    return float(np.mean([np.mean(s) for s in correct]))


def accuracy_summary(correct: Sequence[Sequence[float]], pass_k: Sequence[int] = (1,)) -> dict[str, Any]:
    """``{"tasks", "accuracy", "accuracy_ci", "pass_at_k"}`` of 0/1 outcomes, ``correct[i]``
    task i's samples: avg@k, its 95 % :func:`clustered_wilson_interval`, and the unbiased
    pass@k (keys ``str(k)``) for each ``k`` of ``pass_k`` that every task has samples for.
    The overall numbers of a suite and each group of a breakdown (MMLU-Pro's categories)."""
    n = min((len(s) for s in correct), default=0)
    lo, hi = clustered_wilson_interval(correct)
    return {"tasks": len(correct), "accuracy": avg_at_k(correct), "accuracy_ci": [lo, hi],
            "pass_at_k": {str(k): float(np.mean([pass_at_k(len(s), int(sum(s)), k) for s in correct]))
                          for k in pass_k if 1 <= k <= n}}


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (95 % by default; formula:
    :func:`trace_gym.report.wilson_bounds`); 0 of 5 gives [0, 0.4345]."""
    from trace_gym.report import wilson_bounds

    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    return wilson_bounds(successes / n, n, z=z)


def clustered_wilson_interval(correct: Sequence[Sequence[float]], level: float = 0.95) -> tuple[float, float]:
    """Interval of avg@k over tasks, ``correct[i]`` the 0/1 outcomes of task i's samples:
    Wilson at the mean of task means with Kish's effective sample size
    (:func:`trace_gym.report.clustered_wilson_interval`, formula there); equal to
    :func:`wilson_interval` with one sample per task, and wide when every task agrees
    with itself (5 tasks x 2 samples, all wrong: [0, 0.4345])."""
    from trace_gym.report import clustered_wilson_interval as interval

    return interval(correct, level)


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of continuous ``values`` (NaN when fewer than two;
    zero width when all are equal, which is no spread rather than certainty: not for
    accuracies, see :func:`clustered_wilson_interval`)."""
    from trace_gym.report import mean_ci

    mean, half, _ = mean_ci(values, level)
    return (mean - half, mean + half)
