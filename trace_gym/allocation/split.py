"""Beyond the paper: a prompt's local budget split between fresh roots and prefix continuations.

TRACE fixes the shape (M roots, N continuations per root) before any outcome is seen.
Once a prompt's roots return, its continuation budget C (in continuation units; a
continuation costs 1, a fresh root 2: the nominal convention of full rollout = 1,
continuation = 1/2) can buy either, and which pays depends on what came back: on the
math bank a depth-1 continuation flipped the outcome 6.8 % of the time, a second root
19.4 %. The *adaptive split* spends C by marginal gain per unit of cost over both kinds
of anchor, with one objective: the expected number of anchors that become contrast
anchors (at least one descendant of the opposite outcome):

- a visited prefix j with observed outcome r_j and repeat probability q_j: k
  continuations activate it with probability ``1 - q_j^k`` (TRACE's own V_pref);
- the prompt itself, the depth-0 anchor, with its m observed roots (s successes): k
  fresh roots activate it with the probability that the group becomes mixed, under the
  posterior of its success rate p ~ Beta(kappa v + s, kappa (1 - v) + m - s) (the
  predictor's v as the prior, worth kappa outcomes, updated by what came back):
  ``1 - E[p^k]`` after all successes, ``1 - E[(1 - p)^k]`` after all failures,
  ``1 - E[p^k] - E[(1 - p)^k]`` with no outcome yet, and 0 when the group is already
  mixed (the anchor is active; more roots add pairs, not anchors).

Both gains are concave in k, so the best value of b units on the prefixes is the sum of
the b largest prefix marginal gains (exactly what :func:`~trace_gym.allocation.allocators.solve_prefix`
spends), and the exact split is the best number of fresh roots r in 0..C // 2 with the
rest, C - 2 r, on the prefixes (:func:`solve_split`; ties go to fewer roots, as TRACE).
A prompt with no visited prefix spends everything on roots, C // 2 of them, an odd unit
unspent: the single-turn fallback is the special case of an empty prefix set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from trace_gym.allocation.solvers import _nonneg_int, probabilities_1d, solve_prefix

#: Gains closer than this are ties (broken toward fewer fresh roots).
TIE = 1e-12


def beta_moments(a: float, b: float, count: int) -> np.ndarray:
    """``E[p^k]`` for k = 0..count under p ~ Beta(a, b): prod_{i<k} (a + i) / (a + b + i).

    ``a, b >= 0`` with ``a + b > 0`` (a zero parameter is a point mass at 0 or 1)."""
    if a < 0 or b < 0 or a + b <= 0:
        raise ValueError(f"need a, b >= 0 and a + b > 0, got a={a!r}, b={b!r}")
    i = np.arange(count, dtype=float)
    return np.concatenate([[1.0], np.cumprod((a + i) / (a + b + i))])


def root_gain_curve(value: float, successes: int, trials: int, strength: float, max_roots: int) -> np.ndarray:
    """Probability that ``k`` fresh roots make the prompt's group mixed when it is not yet,
    for k = 0..max_roots (0 at k = 0; all zeros when the observed group is already mixed).

    Args:
        value: the predictor's v for the prompt, in [0, 1].
        successes, trials: the prompt's finished root rollouts and how many succeeded.
        strength: kappa, the prior's weight in outcomes (> 0).
        max_roots: the largest k of the curve (>= 0).

    Returns:
        float array (max_roots + 1,), nondecreasing and concave in k.
    """
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"value must lie in [0, 1], got {value!r}")
    if not 0 <= successes <= trials or not strength > 0:
        raise ValueError(f"need 0 <= successes <= trials and strength > 0, got {successes!r}, {trials!r}, "
                         f"{strength!r}")
    max_roots = _nonneg_int(max_roots, "max_roots")
    if 0 < successes < trials:
        return np.zeros(max_roots + 1)
    a, b = strength * value + successes, strength * (1 - value) + trials - successes
    all_succeed, all_fail = beta_moments(a, b, max_roots), beta_moments(b, a, max_roots)
    if trials == 0:
        curve = 1.0 - all_succeed - all_fail
        curve[0] = 0.0
        return np.maximum(curve, 0.0)
    return 1.0 - (all_succeed if successes == trials else all_fail)


def prefix_value_curve(repeat_probabilities: np.ndarray, budget: int) -> np.ndarray:
    """The best ``sum_j 1 - q_j^k_j`` with ``sum k = b``, for b = 0..budget, shape (budget + 1,):
    the cumulative sum of the largest marginal gains q^k (1 - q) (exact: each prefix's gains fall)."""
    q = probabilities_1d(repeat_probabilities, "repeat_probabilities")
    budget = _nonneg_int(budget, "budget")
    if len(q) == 0:
        return np.zeros(budget + 1)
    k = np.arange(budget, dtype=float)
    gains = np.sort((q[:, None] ** k[None, :] * (1.0 - q[:, None])).ravel())[::-1][:budget]
    return np.concatenate([[0.0], np.cumsum(gains)])


def solve_split(repeat_probabilities, root_gain: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
    """Exact split of ``budget`` continuation units: ``(k per prefix, fresh roots r)``.

    Maximises ``root_gain[r] + sum_j (1 - q_j^k_j)`` over ``2 r + sum k = budget`` (all of it
    spent; with no prefix, ``r = budget // 2`` and an odd unit is left over). Ties go to the
    smaller r; the prefix counts are :func:`~trace_gym.allocation.allocators.solve_prefix`'s.

    Args:
        repeat_probabilities: q_j of the visited prefixes, shape (n,) (may be empty).
        root_gain: :func:`root_gain_curve` with at least ``budget // 2 + 1`` entries.
        budget: continuation units C (int >= 0).
    """
    q = probabilities_1d(repeat_probabilities, "repeat_probabilities")
    budget = _nonneg_int(budget, "budget")
    gain = np.asarray(root_gain, dtype=float)
    if gain.ndim != 1 or len(gain) < budget // 2 + 1:
        raise ValueError(f"root_gain needs at least budget // 2 + 1 = {budget // 2 + 1} entries, got shape {gain.shape}")
    if len(q) == 0:
        return np.zeros(0, np.int64), budget // 2
    prefix = prefix_value_curve(q, budget)
    totals = np.array([gain[r] + prefix[budget - 2 * r] for r in range(budget // 2 + 1)])
    best = int(np.flatnonzero(totals >= totals.max() - TIE)[0])
    return solve_prefix(q, budget - 2 * best), best


@runtime_checkable
class SplitAllocator(Protocol):
    """A prefix allocator that may spend a prompt's continuation budget on fresh roots too.

    The planner (:func:`trace_gym.allocation.planning.plan_expansion`) asks for it: given the
    prefixes' repeat probabilities and the prompt's :func:`root_gain_curve` (built with
    ``prior_strength``), ``allocate_split`` returns continuations per prefix and a number
    of fresh roots, 2 units each, spending the budget.
    """

    prior_strength: float

    def allocate(self, repeat_probabilities: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray: ...

    def allocate_split(self, repeat_probabilities: np.ndarray, root_gain: np.ndarray, budget: int,
                       rng: np.random.Generator) -> tuple[np.ndarray, int]: ...


@dataclass(frozen=True)
class TraceSplitAllocator:
    """The adaptive split (see the module docstring): exact, deterministic (``rng`` unused).

    Attributes:
        prior_strength: kappa, the weight of the predictor's v, in outcomes, against the
            prompt's observed roots (> 0).
    """

    prior_strength: float = 4.0

    def __post_init__(self) -> None:
        if not self.prior_strength > 0:
            raise ValueError(f"prior_strength must be > 0, got {self.prior_strength!r}")

    def allocate(self, repeat_probabilities: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        return solve_prefix(repeat_probabilities, budget)

    def allocate_split(self, repeat_probabilities: np.ndarray, root_gain: np.ndarray, budget: int,
                       rng: np.random.Generator) -> tuple[np.ndarray, int]:
        return solve_split(repeat_probabilities, root_gain, budget)
