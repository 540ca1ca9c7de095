"""The adaptive split (trace_adaptive): a prompt's local budget to fresh roots or prefixes by
marginal gain per unit of cost, exact against brute force, the single-turn fallback its special case."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from trace_gym.allocation.split import (TraceSplitAllocator, beta_moments, prefix_value_curve, root_gain_curve,
                                        solve_split)
from trace_gym.allocation.planning import plan_expansion, single_turn_fallback
from trace_gym.tree import RolloutTree


def test_beta_moments_match_scipy():
    for a, b in ((2.0, 2.0), (0.3, 1.7), (5.0, 0.5)):
        assert beta_moments(a, b, 5) == pytest.approx([1.0, *[stats.beta(a, b).moment(k) for k in range(1, 6)]])
    assert beta_moments(0.0, 3.0, 3).tolist() == [1.0, 0.0, 0.0, 0.0]  # a point mass at 0


def test_root_gain_by_hand():
    # v = 0.5, kappa = 2, 2 failures observed: p ~ Beta(1, 3); one more root activates with E[p] = 1/4,
    # two with 1 - E[(1-p)^2] = 1 - (3/4)(4/5) = 2/5
    assert root_gain_curve(0.5, 0, 2, 2.0, 2) == pytest.approx([0.0, 0.25, 0.4])
    assert root_gain_curve(0.5, 2, 2, 2.0, 1) == pytest.approx([0.0, 0.25])  # all succeeded: symmetric
    assert root_gain_curve(0.3, 1, 3, 4.0, 4).tolist() == [0.0] * 5  # already mixed: no anchor to activate
    # no outcome yet: a group of k is mixed with 1 - E[p^k] - E[(1-p)^k]; p ~ Beta(2, 2): E[p^2] = 6/20,
    # so k = 2 gives 1 - 0.3 - 0.3 = 0.4
    assert root_gain_curve(0.5, 0, 0, 4.0, 2) == pytest.approx([0.0, 0.0, 0.4])
    with pytest.raises(ValueError, match="successes <= trials"):
        root_gain_curve(0.5, 3, 2, 4.0, 2)


def brute(q, gain, budget):
    """The best objective over every (fresh roots r, continuations k) that spends the budget."""
    best = -1.0
    for r in range(budget // 2 + 1):
        rest = budget - 2 * r
        for k in itertools.product(range(rest + 1), repeat=len(q)):
            if sum(k) == rest:
                best = max(best, gain[r] + sum(1 - qj ** kj for qj, kj in zip(q, k)))
    return best


def test_solve_split_is_exact_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n, budget = int(rng.integers(1, 4)), int(rng.integers(0, 9))
        q = rng.choice([0.0, 1.0, *rng.uniform(size=4)], size=n)
        s, m = int(rng.integers(0, 4)), 0
        m = int(rng.integers(s, s + 4))
        gain = root_gain_curve(float(rng.uniform()), s, m, float(rng.uniform(0.5, 8)), budget // 2)
        k, r = solve_split(q, gain, budget)
        assert 2 * r + k.sum() == budget and (k >= 0).all() and r >= 0
        value = gain[r] + np.sum(1 - q ** k)
        assert value == pytest.approx(brute(q.tolist(), gain, budget), abs=1e-9)


def test_prefix_value_curve_by_hand():
    # q = 0.5 and 0.9: gains 0.5, 0.25, 0.125 ... and 0.1, 0.09, ...; the best 2: 0.5 + 0.25
    assert prefix_value_curve(np.array([0.5, 0.9]), 3) == pytest.approx([0.0, 0.5, 0.75, 0.875])


def test_roots_are_bought_when_they_flip_more_per_unit_and_never_for_a_mixed_group():
    failed_twice = root_gain_curve(0.5, 0, 2, 2.0, 2)  # one more root: 0.25 for 2 units
    k, r = solve_split(np.array([0.95]), failed_twice, 4)  # a prefix that repeats 95 %: 0.05 per unit
    assert r == 2 and k.tolist() == [0]
    # a prefix that flips half the time: its first two continuations (0.5 + 0.25) beat a second root,
    # one root beats its third and fourth (0.125 + 0.0625): 0.25 + 0.75 = 1.0 > 0.9375 (all four) > 0.4
    k, r = solve_split(np.array([0.5]), failed_twice, 4)
    assert r == 1 and k.tolist() == [2]
    k, r = solve_split(np.array([0.99]), np.zeros(3), 4)  # mixed group: roots gain nothing
    assert r == 0 and k.tolist() == [4]


def _tree(outcomes, turns=2):
    tree = RolloutTree("t")
    for reward in outcomes:
        b = tree.start_branch()
        node = 0
        for t in range(turns):
            last = t == turns - 1
            node = tree.add_turn(node, branch=b, text="x", reward=float(reward) if last else None, terminal=last)
    return tree


def test_the_single_turn_fallback_is_the_special_case_without_prefixes():
    alloc, rng = TraceSplitAllocator(), np.random.default_rng(0)
    for budget in range(0, 9):
        plan = plan_expansion(_tree([0, 0], turns=1), [], budget, alloc, rng, root_value=0.3)
        assert plan == single_turn_fallback(budget)


def test_plan_expansion_uses_the_split_only_with_a_root_value():
    alloc, rng = TraceSplitAllocator(prior_strength=2.0), np.random.default_rng(0)
    tree = _tree([0, 0])  # two failed roots, one prefix each (depth 1)
    values = [0.02, 0.02]  # the prefixes look hopeless: q = 0.98
    split = plan_expansion(tree, values, 4, alloc, rng, root_value=0.5)
    assert split.extra_roots == 2 and split.spent_continuations == 0 and split.unspent_continuations == 0
    plain = plan_expansion(tree, values, 4, alloc, rng)  # no root value: TRACE's prefix allocation
    assert plain.extra_roots == 0 and plain.spent_continuations == 4
