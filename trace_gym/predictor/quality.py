"""What selection needs from a success predictor, measured where it is used (pure functions).

TRACE's and PCL's root stages read predicted *values*, not ranks: they pick prompts
whose predicted v is near 0.5 and size their groups by it. So beside the prompt-level
Spearman against the truth, a bench reports, per step and pooled:

- ``mixed_auc``: the AUC of the score ``-|v - 0.5|`` for separating prompts whose
  group is mixed from pure ones (all-pass or all-fail): 1 when every mixed prompt is
  predicted closer to 0.5 than every pure one, 0.5 for no information.
- ``brier``: the Brier score of v against the prompt's outcomes, ``mean (v - y)^2``
  over its rollouts, i.e. ``(v - p)^2 + p (1 - p)`` for a prompt of success rate p
  (the second term is the floor no predictor can beat).
- ``level_error``: mean predicted minus mean true rate over the candidates: an offset
  in level is fatal to both value-reading selectors even at a perfect rank.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def closeness(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The score a mixed-seeking selector ranks by: ``-|v - 0.5|``."""
    return -np.abs(np.asarray(values, dtype=float) - 0.5)


def mixed_auc(scores: Sequence[float] | np.ndarray, mixed: Sequence[float] | np.ndarray) -> float:
    """AUC of ``scores`` for mixed (label 1) vs pure (label 0) prompts; labels may be probabilities.

    With labels in [0, 1] (a prompt mixed with probability m_i), the expected-label form:
    ``sum_ij m_i (1 - m_j) [s_i > s_j] / sum_ij m_i (1 - m_j)`` with ties counting one half
    (i != j). NaN when one class has no weight (every prompt mixed, or none).

    Shapes: ``scores`` and ``mixed`` (n,).
    """
    s = np.asarray(scores, dtype=float)
    m = np.asarray(mixed, dtype=float)
    if s.shape != m.shape or s.ndim != 1:
        raise ValueError(f"scores {s.shape} and mixed labels {m.shape} must be equal 1-d shapes")
    if np.any((m < 0) | (m > 1)) or not np.all(np.isfinite(m)):
        raise ValueError("mixed labels must be probabilities in [0, 1]")
    pos, neg = m, 1.0 - m
    greater = (s[:, None] > s[None, :]).astype(float) + 0.5 * (s[:, None] == s[None, :])
    np.fill_diagonal(greater, 0.0)
    pair = pos[:, None] * neg[None, :]
    np.fill_diagonal(pair, 0.0)
    total = pair.sum()
    return float((pair * greater).sum() / total) if total > 1e-12 else math.nan


def mixed_probability(rates: Sequence[float] | np.ndarray, group_size: int) -> np.ndarray:
    """P(a group of ``group_size`` fresh rollouts is mixed) = 1 - p^G - (1 - p)^G, elementwise."""
    p = np.asarray(rates, dtype=float)
    return 1.0 - p**group_size - (1.0 - p) ** group_size


def drawn_group_mixed(successes: Sequence[int] | np.ndarray, trials: Sequence[int] | np.ndarray,
                      group_size: int) -> np.ndarray:
    """P(a group of ``group_size`` drawn without replacement from ``trials`` recorded outcomes, ``successes``
    of them successes, is mixed) = 1 - C(s, G) / C(n, G) - C(n - s, G) / C(n, G), elementwise: what
    a bank bench's fixed group meets (it replays recorded roots without replacement), as
    :func:`mixed_probability` is what the simulator's fresh groups meet. Where n < G (fewer
    recorded than a group holds) the group is all of them: 1.0 when they are mixed, else 0.0.
    Shapes: ``successes``, ``trials`` (n,)."""
    from math import comb

    out = []
    for s, n in zip(np.asarray(successes, dtype=int).tolist(), np.asarray(trials, dtype=int).tolist()):
        if not 0 <= s <= n:
            raise ValueError(f"successes {s} must lie in [0, trials {n}]")
        if n < group_size:
            out.append(float(0 < s < n))
        else:
            out.append(1.0 - (comb(s, group_size) + comb(n - s, group_size)) / comb(n, group_size))
    return np.asarray(out, dtype=float)


def selection_precision(values: Sequence[float] | np.ndarray, mixed: Sequence[float] | np.ndarray, *, pool: int,
                        picks: int, draws: int = 1000, seed: int = 0) -> float:
    """What a selector that reads values meets: over ``draws`` random pools of ``pool`` candidates, the
    mean mixed label of the ``picks`` candidates predicted nearest 0.5 (PCL's choice, where TRACE's
    root stage starts too; ties go to the earlier candidate of the pool). Unlike the AUC, which
    weighs every mixed-pure pair alike, this reads only the few prompts a step picks. With
    ``pool`` at least the number of candidates, every draw is the same: the top ``picks`` of all.

    Shapes: ``values``, ``mixed`` (n,); ``mixed`` 0/1 labels or probabilities.
    """
    v, m = np.asarray(values, dtype=float), np.asarray(mixed, dtype=float)
    if v.shape != m.shape or v.ndim != 1 or not len(v):
        raise ValueError(f"values {v.shape} and mixed labels {m.shape} must be equal, non-empty 1-d shapes")
    pool = min(int(pool), len(v))
    picks = min(int(picks), pool)
    if picks < 1:
        raise ValueError(f"picks must be >= 1, got {picks!r}")
    if pool == len(v):  # one pool: all of them
        index = np.arange(len(v))[None, :]
    else:
        rng = np.random.default_rng(seed)
        index = np.stack([rng.choice(len(v), pool, replace=False) for _ in range(draws)])  # each in random order
    order = np.argsort(-closeness(v)[index], axis=1, kind="stable")[:, :picks]
    return float(m[np.take_along_axis(index, order, axis=1)].mean())


def predictor_quality(values: Sequence[float] | np.ndarray, rates: Sequence[float] | np.ndarray,
                      mixed: Sequence[float] | np.ndarray) -> dict[str, float]:
    """The four measures of the module docstring over one set of candidates.

    Args:
        values: predicted success v per candidate, shape (n,).
        rates: the true (simulator) or empirical (bank) success rate per candidate, (n,).
        mixed: whether each candidate's group is mixed: a 0/1 label (a bank's recorded
            roots) or a probability (the simulator's :func:`mixed_probability`), (n,).

    Returns:
        ``{"prompt_spearman", "mixed_auc", "brier", "level_error"}``; NaN where undefined
        (no candidates; a constant side for Spearman; one class for the AUC).
    """
    from trace_gym.report import spearman

    v, p = np.asarray(values, dtype=float), np.asarray(rates, dtype=float)
    if v.shape != p.shape:
        raise ValueError(f"values {v.shape} and rates {p.shape} differ in shape")
    if not len(v):
        return {"prompt_spearman": math.nan, "mixed_auc": math.nan, "brier": math.nan, "level_error": math.nan}
    return {"prompt_spearman": spearman(v, p),
            "mixed_auc": mixed_auc(closeness(v), mixed),
            "brier": float(np.mean((v - p) ** 2 + p * (1 - p))),
            "level_error": float(v.mean() - p.mean())}


#: The keys :func:`predictor_quality` returns, in the order tables print them.
QUALITY_KEYS = ("prompt_spearman", "mixed_auc", "brier", "level_error")
