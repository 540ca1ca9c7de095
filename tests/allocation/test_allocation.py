"""Tests for trace_gym.allocation.allocators: brute force, the reference DP, hand-worked values, errors."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from trace_gym.allocation.allocators import (
    PrefixAllocator,
    RootAllocator,
    TracePrefixAllocator,
    TraceRootAllocator,
    _max_useful_rollouts,
    _solve_root_dp,
    prefix_utility,
    repeat_probability,
    root_utility,
    solve_prefix,
    solve_root,
    solve_root_dp,
)

TOL = 1e-12


def root_value(v, m) -> float:
    return float(root_utility(np.asarray(v, float), m).sum())


def prefix_value(q, k) -> float:
    return float(prefix_utility(np.asarray(q, float), k).sum())


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


def tied_pool_values(rng, n: int) -> np.ndarray:
    """Values with many exact duplicates and 0, 0.5, 1; mathematically equal gains are then
    bitwise equal, so the tie rule can be checked exactly."""
    pool = np.concatenate([[0.0, 0.5, 1.0], rng.random(rng.integers(1, 4))])
    return rng.choice(pool, n)


@functools.lru_cache(maxsize=None)
def all_allocations(n: int, budget: int, choices: tuple[int, ...]) -> np.ndarray:
    """Every vector in choices^n summing to budget, shape (count, n)."""
    rows = [m for m in itertools.product(choices, repeat=n) if sum(m) == budget]
    return np.array(rows, dtype=np.int64).reshape(len(rows), n)


def brute_force(utility, v, budget, choices):
    """(optimal value, lexicographically greatest optimal allocation) or None if infeasible."""
    allocs = all_allocations(len(v), budget, tuple(choices))
    if len(allocs) == 0:
        return None
    values = utility(np.asarray(v)[None, :], allocs).sum(axis=1)
    best = values.max()
    optimal = allocs[values >= best - TOL * max(1.0, best)]
    return float(best), max(map(tuple, optimal.tolist()))


def check_root_invariants(m, budget, cap=None):
    assert m.dtype == np.int64
    assert m.sum() == budget
    assert not (m == 1).any() and (m >= 0).all()
    if cap is not None:
        assert (m <= cap).all()


# ------------------------------------------------------------------- brute force


def test_solve_root_and_dp_match_brute_force_on_small_instances():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(2500):
        n = int(rng.integers(1, 5))
        budget = int(rng.integers(0, 11))
        cap = None if rng.random() < 0.5 else int(rng.integers(2, 7))
        v = tied_pool_values(rng, n) if rng.random() < 0.6 else rng.random(n)
        c = budget if cap is None else min(cap, budget)
        expected = brute_force(root_utility, v, budget, [0, *range(2, c + 1)])
        if expected is None or budget == 1:
            for solver in (solve_root, solve_root_dp):
                with pytest.raises(ValueError, match="budget"):
                    solver(v, budget, cap)
            continue
        best, lexmax = expected
        fast, dp = solve_root(v, budget, cap), solve_root_dp(v, budget, cap)
        for m in (fast, dp):
            check_root_invariants(m, budget, cap)
            assert close(root_value(v, m), best), (v, budget, cap, m, best)
        assert tuple(fast) == lexmax, (v, budget, cap, fast, lexmax)
        assert tuple(dp) == lexmax, (v, budget, cap, dp, lexmax)
        checked += 1
    assert checked > 1500


def test_solve_prefix_matches_brute_force_on_small_instances():
    rng = np.random.default_rng(1)
    for _ in range(1500):
        n = int(rng.integers(1, 5))
        budget = int(rng.integers(0, 11))
        cap = None if rng.random() < 0.5 else int(rng.integers(0, 6))
        q = tied_pool_values(rng, n) if rng.random() < 0.6 else rng.random(n)
        c = budget if cap is None else min(cap, budget)
        expected = brute_force(prefix_utility, q, budget, range(c + 1))
        if expected is None:
            with pytest.raises(ValueError, match="infeasible"):
                solve_prefix(q, budget, cap)
            continue
        best, lexmax = expected
        k = solve_prefix(q, budget, cap)
        assert k.dtype == np.int64 and k.sum() == budget and (k >= 0).all()
        assert close(prefix_value(q, k), best), (q, budget, cap, k, best)
        assert tuple(k) == lexmax, (q, budget, cap, k, lexmax)


# ------------------------------------------------------------- fast path vs DP


def test_fast_path_equals_dp_on_medium_instances_with_ties():
    rng = np.random.default_rng(2)
    for _ in range(250):
        n = int(rng.integers(1, 61))
        cap = None if rng.random() < 0.6 else int(rng.integers(2, 12))
        budget = int(rng.integers(2, 201))
        if cap is not None:
            budget = min(budget, n * cap - (cap == 2) * (n * cap % 2))
            budget -= budget % 2 if cap == 2 else 0
        if budget < 2:
            continue
        kind = rng.integers(3)
        if kind == 0:
            v = tied_pool_values(rng, n)
        elif kind == 1:
            v = rng.choice([0.0, 0.5, 1.0, 0.1, 0.9], n)
        else:
            v = rng.beta(0.5, 0.5, n)
        fast, dp = solve_root(v, budget, cap), solve_root_dp(v, budget, cap)
        check_root_invariants(fast, budget, cap)
        check_root_invariants(dp, budget, cap)
        assert close(root_value(v, fast), root_value(v, dp)), (v.tolist(), budget, cap)
        if kind == 2:  # continuous values: the optimum is unique, allocations must agree
            assert (fast == dp).all(), (v.tolist(), budget, cap)


def test_dp_exchange_bound_is_exact_and_prunes():
    rng = np.random.default_rng(3)
    pruned_somewhere = False
    for _ in range(60):
        n = int(rng.integers(4, 40))
        budget = int(rng.integers(2, 2 * n + 1))  # budget <= 2n: the bound is active
        v = rng.beta(1, 1, n) if rng.random() < 0.5 else tied_pool_values(rng, n)
        bound = _max_useful_rollouts(v, budget, budget)
        pruned_somewhere |= bool((bound < budget).any())
        pruned, full = _solve_root_dp(v, budget, prune=True), _solve_root_dp(v, budget, prune=False)
        assert close(root_value(v, pruned), root_value(v, full))
        assert (full <= bound).all()
    assert pruned_somewhere


# ----------------------------------------------------------- hand-worked values


def test_utilities_by_hand():
    assert root_utility(0.5, 2) == pytest.approx(0.5)  # 1 - 1/4 - 1/4
    assert root_utility(0.5, 5) == pytest.approx(1 - 2 / 32)  # > 90 %, as the method page says
    assert root_utility(0.3, 2) == pytest.approx(0.42)  # 2 * 0.3 * 0.7
    assert root_utility(0.3, 4) == pytest.approx(1 - 0.0081 - 0.2401)
    np.testing.assert_array_equal(root_utility([0.0, 1.0, 0.4, 0.4], [5, 7, 0, 1]), 0.0)
    assert root_utility(0.25, 6) == root_utility(0.75, 6)  # symmetric (exact complements)
    assert root_utility(1e-20, 2) == pytest.approx(2e-20, rel=1e-12)  # no cancellation
    assert prefix_utility(0.5, 3) == pytest.approx(0.875)
    np.testing.assert_array_equal(prefix_utility([0.0, 1.0, 0.3], [1, 5, 0]), [1.0, 0.0, 0.0])
    assert repeat_probability(1, 0.8) == pytest.approx(0.8)
    assert repeat_probability(0, 0.8) == pytest.approx(0.2)
    np.testing.assert_allclose(repeat_probability([1, 0], [0.25, 0.25]), [0.25, 0.75])


def test_greedy_trap_two_prompts():
    # v = (0.5, 0.3), budget 4. Marginal greedy: 0.5 -> 2 (0.5), then 0.5 -> 4 (+0.25 +0.125)
    # = 0.875. Optimum (2, 2): 0.5 + 2 * 0.3 * 0.7 = 0.92. (0, 4): 1 - 0.3^4 - 0.7^4 = 0.7518.
    for solver in (solve_root, solve_root_dp):
        m = solver([0.5, 0.3], 4)
        assert m.tolist() == [2, 2]
        assert root_value([0.5, 0.3], m) == pytest.approx(0.92)


def test_parity_repair_by_adding_a_unit():
    # v = (0.5, 0.2), budget 4: (4, 0) = 1 - 2/16 = 0.875 beats (2, 2) = 0.5 + 0.32 = 0.82.
    assert solve_root([0.5, 0.2], 4).tolist() == [4, 0]
    # v = (0.5, 0.25): (4, 0) = 0.875 = 0.5 + 2 * 0.25 * 0.75, an exact tie.
    m = solve_root([0.5, 0.25], 4)
    assert m.tolist() in ([4, 0], [2, 2]) and root_value([0.5, 0.25], m) == pytest.approx(0.875)


def test_method_page_behaviour():
    v = [0.99, 0.9, 0.5, 0.5, 0.15, 0.02]
    assert solve_root(v, 4).tolist() == [0, 0, 2, 2, 0, 0]  # tight: all to the 0.5s
    assert solve_root(v, 8).tolist() == [0, 0, 3, 3, 2, 0]  # then 0.15 is started
    for budget in range(4, 33):
        m = solve_root(v, budget)
        assert m[0] == 0 and m[5] == 0, (budget, m)  # 0.99 and 0.02 skipped at modest budgets
    for budget in (24, 32):
        m = solve_root(v, budget)  # the 0.5s saturate at 5 (> 90 % mixed); extra goes to 0.9/0.15
        assert m[2] == m[3] == 5 and m[1] > 5 and m[4] > 5, m
    assert solve_root(v, 48)[5] > 0  # 0.02 only near the top of the range
    assert solve_root(v, 80)[0] == 0  # 0.99 enters only when everything else is saturated
    assert solve_root(v, 100)[0] > 0


def test_tie_rule_is_lexicographically_greatest():
    v = [0.5] * 4
    assert solve_root(v, 4).tolist() == [2, 2, 0, 0]  # not [4, 0, 0, 0] (0.875 < 1.0)
    assert solve_root(v, 5).tolist() == [3, 2, 0, 0]
    assert solve_root(v, 6).tolist() == [3, 3, 0, 0]  # ties with [2, 2, 2, 0] (both 1.5)
    assert solve_root([0.0, 1.0, 0.5], 9, max_per_prompt=3).tolist() == [3, 3, 3]
    assert solve_root([0.0, 1.0, 0.5], 7, max_per_prompt=3).tolist() == [2, 2, 3]
    assert solve_root([0.0, 0.5], 4, max_per_prompt=3).tolist() == [2, 2]
    assert solve_root([0.0, 0.0], 5).tolist() == [5, 0]
    assert solve_prefix([0.5, 0.5], 3).tolist() == [2, 1]
    assert solve_prefix([1.0, 0.0], 3).tolist() == [2, 1]  # zero gains go to lower index


def test_solve_prefix_by_hand():
    # gains: q=0.5: 0.5, 0.25, 0.125, 0.0625; q=0.9: 0.1, 0.09, ...
    assert solve_prefix([0.5, 0.9], 3).tolist() == [3, 0]
    assert solve_prefix([0.5, 0.9], 4).tolist() == [3, 1]
    assert prefix_value([0.5, 0.9], [3, 1]) == pytest.approx(0.975)
    assert solve_prefix([0.5, 0.9], 4, max_per_prefix=2).tolist() == [2, 2]
    assert solve_prefix([0.0, 0.3], 1).tolist() == [1, 0]


# ---------------------------------------------------------------- invariants


def test_invariants_determinism_and_input_types():
    rng = np.random.default_rng(4)
    for _ in range(30):
        n = int(rng.integers(1, 500))
        budget = int(rng.integers(2, 2000))
        cap = None if rng.random() < 0.5 else int(rng.integers(3, 40))
        if cap is not None:
            budget = min(budget, n * cap)
        v = rng.beta(0.7, 0.7, n)
        v[rng.random(n) < 0.1] = 0.5
        v_before = v.copy()
        m = solve_root(v, budget, cap)
        check_root_invariants(m, budget, cap)
        np.testing.assert_array_equal(v, v_before)
        np.testing.assert_array_equal(solve_root(v, budget, cap), m)
        np.testing.assert_array_equal(solve_root(v.tolist(), np.int64(budget), cap), m)
        k = solve_prefix(v, budget, None if cap is None else cap)
        assert k.sum() == budget and (k >= 0).all() and (cap is None or (k <= cap).all())
        np.testing.assert_array_equal(solve_prefix(tuple(v), np.int32(budget), cap), k)


def test_permutation_behaviour():
    rng = np.random.default_rng(5)
    for _ in range(20):
        v = rng.random(int(rng.integers(2, 80)))  # distinct values: unique optimum
        budget = int(rng.integers(2, 300))
        perm = rng.permutation(len(v))
        np.testing.assert_array_equal(solve_root(v[perm], budget), solve_root(v, budget)[perm])
        np.testing.assert_array_equal(solve_prefix(v[perm], budget), solve_prefix(v, budget)[perm])
    # with ties the rule follows the indices, not the prompts
    assert solve_root([0.3, 0.5, 0.3], 4).tolist() == [2, 2, 0]  # ties with [0, 2, 2]
    assert solve_root([0.3, 0.3], 2).tolist() == [2, 0]


def test_large_pool_and_heavy_ties():
    rng = np.random.default_rng(6)
    v = rng.beta(2, 2, 8192)
    check_root_invariants(solve_root(v, 16384), 16384)
    m = solve_root(np.full(3000, 0.5), 4501)  # thousands of units tied at one gain
    check_root_invariants(m, 4501)
    assert m.tolist() == [3] * 1499 + [2, 2] + [0] * 1499  # 4501 units at gain 1/4, no 1
    v = np.concatenate([np.zeros(50), np.full(5, 0.5)])
    check_root_invariants(solve_root(v, 301, max_per_prompt=7), 301, 7)
    assert solve_root([0.5], 5000).tolist() == [5000]
    k = solve_prefix(rng.random(5000), 100000)
    assert k.sum() == 100000


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize("solver", [solve_root, solve_root_dp])
@pytest.mark.parametrize(
    "values, budget, cap, message",
    [
        ([0.2, float("nan")], 4, None, r"values\[1\] = nan"),
        ([0.2, float("inf")], 4, None, r"values\[1\] = inf"),
        ([-0.1, 0.2], 4, None, r"values\[0\] = -0.1 .*\[0, 1\]"),
        ([0.2, 1.5], 4, None, r"values\[1\] = 1.5"),
        ([[0.2, 0.3]], 4, None, r"values must be 1-D, got shape \(1, 2\)"),
        (["a", "b"], 4, None, r"values must be numbers"),
        ([0.2, 0.3], -2, None, r"budget must be a non-negative int, got -2"),
        ([0.2, 0.3], 4.0, None, r"budget must be a non-negative int, got 4.0 \(float\)"),
        ([0.2, 0.3], True, None, r"budget must be a non-negative int, got True \(bool\)"),
        ([0.2, 0.3], 1, None, r"budget = 1 is infeasible"),
        ([], 4, None, r"budget = 4 but values is empty"),
        ([0.2, 0.3], 4, 1, r"max_per_prompt = 1 < 2"),
        ([0.2, 0.3], 4, -1, r"max_per_prompt must be a non-negative int, got -1"),
        ([0.2, 0.3], 4, 2.5, r"max_per_prompt must be a non-negative int, got 2.5"),
        ([0.2, 0.3], 5, 2, r"budget = 5 is infeasible .* expected an even budget <= 4"),
        ([0.2, 0.3], 8, 3, r"budget = 8 is infeasible .* expected a budget <= 6"),
        ([0.2], 4, 3, r"budget = 4 is infeasible for 1 prompts"),
    ],
)
def test_root_errors_name_the_bad_value(solver, values, budget, cap, message):
    with pytest.raises(ValueError, match=message):
        solver(values, budget, cap)


def test_root_edge_cases_that_are_valid():
    assert solve_root([], 0).tolist() == []
    assert solve_root([0.2, 0.3], 0, max_per_prompt=0).tolist() == [0, 0]
    assert solve_root(np.array([0.3, 0.2], np.float32), np.int64(2)).tolist() == [2, 0]
    assert solve_root([0.2], 7).tolist() == [7]
    assert solve_root([0.2, 0.3], 6, max_per_prompt=3).tolist() == [3, 3]


@pytest.mark.parametrize(
    "values, budget, cap, message",
    [
        ([0.2, float("nan")], 4, None, r"repeat_probabilities\[1\] = nan"),
        ([0.2, 1.01], 4, None, r"repeat_probabilities\[1\] = 1.01"),
        (np.zeros((2, 2)), 4, None, r"repeat_probabilities must be 1-D"),
        ([0.2], -1, None, r"budget must be a non-negative int, got -1"),
        ([0.2], 2.5, None, r"budget must be a non-negative int, got 2.5"),
        ([0.2], np.True_, None, r"budget must be a non-negative int, got .*True"),
        ([], 3, None, r"budget = 3 but repeat_probabilities is empty"),
        ([0.2, 0.3], 5, 2, r"budget = 5 is infeasible for 2 prefixes with max_per_prefix = 2"),
        ([0.2, 0.3], 1, 0, r"budget = 1 is infeasible"),
        ([0.2, 0.3], 1, -3, r"max_per_prefix must be a non-negative int, got -3"),
    ],
)
def test_prefix_errors_name_the_bad_value(values, budget, cap, message):
    with pytest.raises(ValueError, match=message):
        solve_prefix(values, budget, cap)


def test_helper_and_allocator_errors():
    with pytest.raises(ValueError, match=r"v\[1\] = 1.2"):
        root_utility([0.1, 1.2], 2)
    with pytest.raises(ValueError, match=r"m must be non-negative integers"):
        root_utility(0.1, 1.5)
    with pytest.raises(ValueError, match=r"k must be non-negative integers"):
        prefix_utility(0.1, -1)
    with pytest.raises(ValueError, match=r"value = nan"):
        repeat_probability(1, float("nan"))
    with pytest.raises(ValueError, match=r"reward\[0\] = 2.0"):
        repeat_probability([2.0], [0.5])
    with pytest.raises(ValueError, match=r"max_per_prompt must be a non-negative int, got -1"):
        TraceRootAllocator(max_per_prompt=-1)
    with pytest.raises(ValueError, match=r"max_per_prefix must be a non-negative int, got True"):
        TracePrefixAllocator(max_per_prefix=True)


# ---------------------------------------------------------------- strategies


def test_trace_allocators_satisfy_protocols():
    rng = np.random.default_rng(7)
    root, prefix = TraceRootAllocator(max_per_prompt=8), TracePrefixAllocator(max_per_prefix=3)
    assert isinstance(root, RootAllocator) and isinstance(prefix, PrefixAllocator)
    v = rng.random(20)
    np.testing.assert_array_equal(root.allocate(v, 40, rng), solve_root(v, 40, 8))
    np.testing.assert_array_equal(prefix.allocate(v, 30, rng), solve_prefix(v, 30, 3))
    with pytest.raises(Exception):
        root.max_per_prompt = 3  # frozen
