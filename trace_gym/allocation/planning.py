"""One step's allocation decisions, as pure functions shared by every rollout driver.

The one step driver (:func:`trace_gym.step.driver.run_step`) calls these for the simulator
and for real rollouts alike, so a strategy means the same thing in a benchmark and in
training:

1. ``allocate_roots(values, root_budget, allocator, rng)``: predicted prompt success
   -> m_i root rollouts per candidate (0 or >= 2), validated.
2. ``continuation_budgets(root_counts, continuation_budget)``: each chosen prompt's
   local continuation budget, proportional to its rollout count (N m_i when the total
   is N M).
3. As soon as prompt i's root rollouts return:
   ``plan_expansion(tree, prefix_values, budget, allocator, rng)``: its visited prefixes
   (``tree.expansion_candidates()``), their predicted values Ṽ(H_ijt) and the observed
   rewards r_ij -> repeat probabilities q -> k continuations per prefix. When the
   prompt has no visited prefix (every root rollout ended after one turn), the
   *single-turn fallback*: a continuation from the root is a fresh rollout, so the
   budget buys ``budget // 2`` more root rollouts at the nominal rate (two
   continuations = one rollout), and an odd budget leaves one continuation unit
   unspent, which the plan says (``ExpansionPlan.unspent_continuations``) and the
   driver records in the ledger.

No function here generates, steps an environment, or reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from trace_gym.allocation.allocators import PrefixAllocator, RootAllocator, probabilities_1d, repeat_probability
from trace_gym.allocation.split import SplitAllocator, root_gain_curve
from trace_gym.tree import SUCCESS_THRESHOLD, RolloutTree


def _check_counts(name: str, counts: Any, n: int, budget: int) -> np.ndarray:
    """An allocator's answer as int64 counts, shape (n,): each an integral, finite number in
    ``[0, budget]``, summed as Python ints (so counts that wrap int64 when summed, such as
    ``[2**62] * 4``, are refused), at most ``budget`` in all; ``ValueError`` naming ``name``."""
    counts = np.asarray(counts)
    if counts.shape != (n,):
        raise ValueError(f"{name} returned shape {counts.shape}, expected ({n},)")
    if counts.dtype == bool or not (np.issubdtype(counts.dtype, np.integer) or np.issubdtype(counts.dtype, np.floating)):
        raise ValueError(f"{name} returned {counts.dtype} counts, expected integers")
    values = counts.tolist()
    for i, v in enumerate(values):
        if not (isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())):
            raise ValueError(f"{name} returned count {v!r} at index {i}, expected an integral, finite count")
        if not 0 <= v <= budget:
            raise ValueError(f"{name} returned count {int(v)} at index {i}, expected a count in [0, {budget}]")
    total = sum(int(v) for v in values)
    if total > budget:
        raise ValueError(f"{name} spent {total} > budget {budget}")
    return np.asarray([int(v) for v in values], dtype=np.int64).reshape(n)


def allocate_roots(
    values: Sequence[float] | np.ndarray,
    root_budget: int,
    allocator: RootAllocator,
    rng: np.random.Generator,
) -> np.ndarray:
    """Root rollouts per candidate.

    Args:
        values: predicted success v_i in [0, 1], shape (n_candidates,).
        root_budget: M, full rollouts to spend (int >= 0).
        allocator: any ``RootAllocator``.
        rng: randomness for stochastic allocators.

    Returns:
        int64 (n_candidates,), every entry 0 or >= 2, sum <= M.
    """
    v = probabilities_1d(values, "candidate values")
    if root_budget < 0 or int(root_budget) != root_budget:
        raise ValueError(f"root_budget must be an integer >= 0, got {root_budget!r}")
    if root_budget == 0 or len(v) == 0:
        return np.zeros(len(v), dtype=np.int64)
    m = _check_counts(type(allocator).__name__, allocator.allocate(v, int(root_budget), rng), len(v), int(root_budget))
    if (m == 1).any():
        raise ValueError(f"{type(allocator).__name__} gave a prompt exactly 1 rollout (index {int(np.flatnonzero(m == 1)[0])})")
    return m


def continuation_budgets(root_counts: Sequence[int] | np.ndarray, continuation_budget: int) -> np.ndarray:
    """Split the continuation budget over prompts in proportion to their root rollouts.

    Largest-remainder apportionment of C * m_i / sum(m): floors first, then one more
    to the largest fractional parts (ties to the lower index). Exact N m_i when
    C = N * sum(m) for an integer N. Prompts with m_i = 0 get 0; with no roots at all
    nothing is spent.

    Args:
        root_counts: m_i, shape (n_candidates,).
        continuation_budget: C, continuations to spend (int >= 0).

    Returns:
        int64 (n_candidates,), summing to C (or 0 when sum(m) == 0).
    """
    m = np.asarray(root_counts, dtype=np.int64)
    if m.ndim != 1 or (m < 0).any():
        raise ValueError(f"root_counts must be a 1-d array of counts >= 0, got {m!r:.200}")
    if continuation_budget < 0 or int(continuation_budget) != continuation_budget:
        raise ValueError(f"continuation_budget must be an integer >= 0, got {continuation_budget!r}")
    total = int(m.sum())
    if total == 0 or continuation_budget == 0:
        return np.zeros(len(m), dtype=np.int64)
    exact = continuation_budget * m / total
    out = np.floor(exact + 1e-12).astype(np.int64)
    left = int(continuation_budget - out.sum())
    if left > 0:
        frac = exact - out
        order = np.lexsort((np.arange(len(m)), -frac))  # largest fraction, then lowest index
        out[order[:left]] += 1
    return out


def repeat_probabilities(prefix_values: Sequence[float] | np.ndarray, observed_rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """q = r V + (1 - r)(1 - V): chance one fresh continuation repeats the outcome.

    Rewards are read as outcomes: success (1) when ``reward >= SUCCESS_THRESHOLD``,
    else failure (0), so q is the probability of *not* flipping the observed outcome.

    Args:
        prefix_values: Ṽ(H_ijt) in [0, 1], shape (n_prefixes,).
        observed_rewards: r_ij of the rollout each prefix lies on, shape (n_prefixes,).
    """
    v = probabilities_1d(prefix_values, "prefix values")
    r = np.asarray(observed_rewards, dtype=float)
    if r.shape != v.shape:
        raise ValueError(f"observed_rewards shape {r.shape} != prefix_values shape {v.shape}")
    outcome = (r >= SUCCESS_THRESHOLD).astype(float)
    return np.asarray(repeat_probability(outcome, v), dtype=float)


def allocate_prefixes(
    prefix_values: Sequence[float] | np.ndarray,
    observed_rewards: Sequence[float] | np.ndarray,
    budget: int,
    allocator: PrefixAllocator,
    rng: np.random.Generator,
) -> np.ndarray:
    """Continuations per prefix: repeat probabilities -> ``allocator``, validated.

    Returns int64 (n_prefixes,) summing to ``budget`` (zeros when there are no
    prefixes: that budget stays unspent, and the ledger shows it).
    """
    q = repeat_probabilities(prefix_values, observed_rewards)
    if budget < 0 or int(budget) != budget:
        raise ValueError(f"continuation budget must be an integer >= 0, got {budget!r}")
    if len(q) == 0 or budget == 0:
        return np.zeros(len(q), dtype=np.int64)
    k = _check_counts(type(allocator).__name__, allocator.allocate(q, int(budget), rng), len(q), int(budget))
    if k.sum() != budget:
        raise ValueError(f"{type(allocator).__name__} spent {int(k.sum())} of continuation budget {budget}")
    return k


@dataclass(frozen=True)
class ExpansionPlan:
    """What one prompt does with its continuation budget once its roots are back.

    Attributes:
        continuations: ``((node_id, k), ...)``: k >= 1 continuations from each listed
            prefix, in candidate order.
        extra_roots: fresh root rollouts instead (the single-turn fallback).
        unspent_continuations: continuation units left unspent (0, or 1 when the
            fallback meets an odd budget: half a rollout cannot be bought).
    """

    continuations: tuple[tuple[int, int], ...] = ()
    extra_roots: int = 0
    unspent_continuations: int = 0

    @property
    def spent_continuations(self) -> int:
        """Continuations the plan starts."""
        return sum(k for _, k in self.continuations)


def single_turn_fallback(budget: int) -> ExpansionPlan:
    """The plan for a prompt without visited prefixes: ``budget // 2`` more root
    rollouts (a continuation from the root is a fresh rollout, and two continuations
    cost one rollout); an odd budget leaves one continuation unit unspent."""
    if budget < 0 or int(budget) != budget:
        raise ValueError(f"continuation budget must be an integer >= 0, got {budget!r}")
    return ExpansionPlan(extra_roots=int(budget) // 2, unspent_continuations=int(budget) % 2)


def plan_expansion(
    tree: RolloutTree,
    prefix_values: Sequence[float] | np.ndarray,
    budget: int,
    allocator: PrefixAllocator,
    rng: np.random.Generator,
    root_value: float | None = None,
) -> ExpansionPlan:
    """Where one prompt's continuations go, once its root rollouts have finished.

    Args:
        tree: the prompt's tree with its root rollouts finished.
        prefix_values: predicted Ṽ for each node of ``tree.expansion_candidates()``,
            in that order (empty when there is none).
        budget: this prompt's continuation budget.
        allocator: any ``PrefixAllocator``; a :class:`~trace_gym.allocation.split.SplitAllocator`
            also weighs fresh roots (:func:`plan_split`) when ``root_value`` is given.
        rng: randomness for stochastic allocators.
        root_value: the prompt's predicted success v (what a split allocator's prior reads).

    Returns:
        An :class:`ExpansionPlan`: continuations from the prefixes, or, when the tree
        has no visited prefix, :func:`single_turn_fallback`.
    """
    cands = tree.expansion_candidates()
    if len(prefix_values) != len(cands):
        raise ValueError(
            f"got {len(prefix_values)} prefix values for {len(cands)} expansion candidates"
        )
    if isinstance(allocator, SplitAllocator) and root_value is not None:
        return plan_split(tree, cands, prefix_values, budget, allocator, rng, root_value)
    if not cands:
        return single_turn_fallback(budget)
    rewards = [r for _, r in cands]
    k = allocate_prefixes(prefix_values, rewards, budget, allocator, rng)
    return ExpansionPlan(tuple((node_id, int(kk)) for (node_id, _), kk in zip(cands, k) if kk > 0))


def plan_split(tree: RolloutTree, cands: Sequence[tuple[int, float]], prefix_values: Sequence[float] | np.ndarray,
               budget: int, allocator: SplitAllocator, rng: np.random.Generator, root_value: float) -> ExpansionPlan:
    """A split allocator's plan: continuations per prefix and fresh roots, by marginal gain per
    unit of cost (:mod:`trace_gym.allocation.split`); with no prefix, the single-turn fallback."""
    if budget < 0 or int(budget) != budget:
        raise ValueError(f"continuation budget must be an integer >= 0, got {budget!r}")
    successes, trials = tree.root_outcomes()
    gain = root_gain_curve(float(root_value), successes, trials, allocator.prior_strength, int(budget) // 2)
    q = repeat_probabilities(prefix_values, [r for _, r in cands]) if cands else np.zeros(0)
    k, roots = allocator.allocate_split(q, gain, int(budget), rng)
    k = _check_counts(type(allocator).__name__, k, len(q), int(budget) - 2 * int(roots))
    if roots < 0 or 2 * roots + int(k.sum()) > budget or (cands and 2 * roots + int(k.sum()) != budget):
        raise ValueError(f"{type(allocator).__name__} split {budget} units into {int(k.sum())} continuations and "
                         f"{roots} roots (2 units each)")
    unspent = int(budget) - 2 * int(roots) - int(k.sum())
    return ExpansionPlan(tuple((node_id, int(kk)) for (node_id, _), kk in zip(cands, k) if kk > 0),
                         extra_roots=int(roots), unspent_continuations=unspent)
