"""Accuracy metrics over sampled answers, with their uncertainty.

For a task with ``n`` sampled answers of which ``c`` are correct:

- ``avg@k`` (here always over all ``n`` samples): the mean over tasks of ``c / n``;
- ``pass@k`` (Chen et al., 2021, the unbiased estimator): the mean over tasks of
  ``1 - C(n - c, k) / C(n, k)``, the probability that at least one of ``k`` answers drawn
  without replacement from the ``n`` is correct; defined for ``k <= n``.

Uncertainty is over tasks (the sampling unit of a benchmark): :func:`wilson_interval`
for a proportion of tasks (one sample per task), :func:`mean_interval` (Student t) for a
mean of per-task scores (paired comparisons: ``trace_gym.report.paired_difference``).
All intervals are 95 % by default.
"""

from __future__ import annotations

import math
from typing import Sequence

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


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (95 % by default)."""
    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of ``values`` (NaN when fewer than two)."""
    from trace_gym.report import mean_ci

    mean, half, _ = mean_ci(values, level)
    return (mean - half, mean + half)
