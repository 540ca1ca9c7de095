"""Strategies, baseline allocators and the shared planning functions."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from baselines import PCLRootAllocator, RandomPrefixAllocator, UniformRootAllocator, fixed_groups
from trace_gym.allocation import planning
from trace_gym.allocation.allocators import TracePrefixAllocator, TraceRootAllocator, solve_prefix
from trace_gym.budget import nominal_cost
from trace_gym.strategies import STRATEGIES, Strategy
from trace_gym.tree import ROOT, RolloutTree

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------- baselines
def test_fixed_groups_spend_the_budget_exactly():
    order = np.arange(10)
    assert fixed_groups(order, 24, 8, 10).tolist() == [8, 8, 8, 0, 0, 0, 0, 0, 0, 0]
    assert fixed_groups(order, 27, 8, 10).tolist() == [8, 8, 8, 3, 0, 0, 0, 0, 0, 0]  # remainder group
    assert fixed_groups(order, 25, 8, 10).tolist() == [8, 8, 9, 0, 0, 0, 0, 0, 0, 0]  # 1 joins the last
    assert fixed_groups(order, 0, 8, 10).sum() == 0
    with pytest.raises(ValueError, match="needs 4 prompts, but the candidate pool has only 3"):
        fixed_groups(np.arange(3), 32, 8, 3)
    with pytest.raises(ValueError, match="group_size must be an integer >= 2, got 1"):
        fixed_groups(order, 8, 1, 10)
    with pytest.raises(ValueError, match="got 1"):
        fixed_groups(order, 1, 8, 10)


def test_uniform_takes_the_first_candidates_and_ignores_values():
    v = np.array([0.0, 1.0, 0.5, 0.5, 0.3])
    assert UniformRootAllocator(2).allocate(v, 4, RNG).tolist() == [2, 2, 0, 0, 0]


def test_pcl_takes_values_closest_to_half_ties_by_index():
    v = np.array([0.9, 0.45, 0.1, 0.55, 0.5, 0.62])
    # |v - 0.5| = .4 .05 .4 .05 0 .12 -> order 4, 1, 3, 5, ...
    assert PCLRootAllocator(3).allocate(v, 9, RNG).tolist() == [0, 3, 0, 3, 3, 0]
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        PCLRootAllocator(2).allocate(np.array([0.2, 1.5]), 2, RNG)


def test_random_prefix_allocator_is_uniform_and_reproducible():
    alloc = RandomPrefixAllocator()
    q = np.array([0.1, 0.99, 0.5, 0.7])
    ks = np.array([alloc.allocate(q, 8, np.random.default_rng(s)) for s in range(2000)])
    assert (ks.sum(axis=1) == 8).all()
    assert np.allclose(ks.mean(axis=0), 2.0, atol=0.1)  # ignores q
    assert (alloc.allocate(q, 8, np.random.default_rng(3)) == alloc.allocate(q, 8, np.random.default_rng(3))).all()
    with pytest.raises(ValueError, match="no prefixes"):
        alloc.allocate(np.zeros(0), 2, RNG)


# ---------------------------------------------------------------------- strategies
def test_strategy_table_has_the_builtins_and_the_zoo():
    assert set(STRATEGIES) == {"uniform", "pcl", "random_tree", "trace", "trace_adaptive", "trace_root_only",
                               "trace_prefix_only", "dapo", "greso", "mopps", "knapsack", "pilot_commit", "ar3po",
                               "cero"}
    from trace_gym.predictor.kinds import PREDICTORS
    from trace_gym.allocation.waves import is_wave_strategy

    zoo = {n: s for n, s in STRATEGIES.items() if is_wave_strategy(s)}
    assert set(zoo) == {"dapo", "greso", "mopps", "knapsack", "pilot_commit", "ar3po", "cero"}
    assert all(s.predictor in PREDICTORS and s.description for s in zoo.values())  # each names its predictor kind
    assert not STRATEGIES["uniform"].expands and not STRATEGIES["pcl"].expands
    assert isinstance(STRATEGIES["trace"].root_allocator, TraceRootAllocator)
    assert isinstance(STRATEGIES["trace"].prefix_allocator, TracePrefixAllocator)
    assert isinstance(STRATEGIES["trace_root_only"].prefix_allocator, RandomPrefixAllocator)
    assert isinstance(STRATEGIES["trace_prefix_only"].root_allocator, UniformRootAllocator)


def test_register_strategy_adds_one_entry_and_refuses_clashes(monkeypatch):
    from trace_gym import strategies

    monkeypatch.setattr(strategies, "STRATEGIES", dict(STRATEGIES))
    mine = Strategy(UniformRootAllocator(4), TracePrefixAllocator(), 2, description="mine")
    strategies.register_strategy("mine", mine)
    strategies.register_strategy("mine", mine)  # the same object again: fine
    assert strategies.STRATEGIES["mine"] is mine
    with pytest.raises(ValueError, match="'trace' is taken"):
        strategies.register_strategy("trace", mine)
    with pytest.raises(ValueError, match="must be a trace_gym.allocation.strategy.Strategy or have a plan.*got dict"):
        strategies.register_strategy("bad", {})
    with pytest.raises(ValueError, match="a strategy name must be a letter"):
        strategies.register_strategy(" ", mine)


@pytest.mark.parametrize("m,n", [(256, 2), (512, 6), (100, 1)])
def test_every_strategy_spends_the_same_nominal_budget(m, n):
    budget = nominal_cost(m, n)
    for name, strategy in STRATEGIES.items():
        if not isinstance(strategy, Strategy):
            continue  # a wave strategy brings its own shape (tests/step/test_zoo_driver.py holds the zoo to the budget)
        s = strategy.with_continuations(n)
        roots, conts = s.budget_split(budget)
        assert roots + conts / 2 == budget, name
        if s.expands:
            assert (roots, conts) == (m, m * n), name
        else:
            assert (roots, conts) == (budget, 0), name  # M' = M (1 + N/2) full rollouts


def test_strategy_validation():
    with pytest.raises(ValueError, match="expands iff"):
        Strategy(UniformRootAllocator(), None, 2)
    with pytest.raises(ValueError, match="expands iff"):
        Strategy(UniformRootAllocator(), RandomPrefixAllocator(), 0)
    with pytest.raises(ValueError, match="-1"):
        Strategy(UniformRootAllocator(), RandomPrefixAllocator(), -1)
    assert STRATEGIES["uniform"].with_continuations(6) is STRATEGIES["uniform"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        STRATEGIES["trace"].continuations_per_root = 3  # type: ignore[misc]


# ---------------------------------------------------------------------- planning
def test_continuation_budgets_proportional_to_rollout_counts():
    assert planning.continuation_budgets([0, 2, 5, 0, 3], 20).tolist() == [0, 4, 10, 0, 6]  # N = 2
    # 7 over m = (2, 2, 3): exact 2, 2, 3 -> floors already sum to 7
    assert planning.continuation_budgets([2, 2, 3], 7).tolist() == [2, 2, 3]
    # 5 over (1, 1, 1): 5/3 each -> floors 1,1,1, then +1 to the two lowest indices
    assert planning.continuation_budgets([1, 1, 1], 5).tolist() == [2, 2, 1]
    assert planning.continuation_budgets([0, 0], 5).tolist() == [0, 0]
    with pytest.raises(ValueError, match="-2"):
        planning.continuation_budgets([1], -2)


def test_repeat_probabilities_hand_values():
    # success observed: q = V; failure observed: q = 1 - V
    q = planning.repeat_probabilities([0.9, 0.9, 0.2, 0.0], [1.0, 0.0, 0.0, 1.0])
    assert q == pytest.approx([0.9, 0.1, 0.8, 0.0])
    with pytest.raises(ValueError, match=r"prefix values\[1\] = 1.5"):
        planning.repeat_probabilities([0.5, 1.5], [0, 1])


def test_allocate_roots_validates_allocators():
    class Bad:
        def allocate(self, values, budget, rng):
            return np.array([1, budget - 1])

    with pytest.raises(ValueError, match="exactly 1 rollout"):
        planning.allocate_roots([0.5, 0.5], 4, Bad(), RNG)
    with pytest.raises(ValueError, match=r"candidate values\[0\] = nan"):
        planning.allocate_roots([np.nan], 4, TraceRootAllocator(), RNG)
    m = planning.allocate_roots([0.99, 0.5, 0.5, 0.01], 4, TraceRootAllocator(), RNG)
    assert m.tolist() == [0, 2, 2, 0]


def test_plan_expansion_hand_example():
    """Failed rollout with prefixes at V = 0.9 and 0.1, successful one at V = 0.6.

    q = (0.1, 0.9, 0.6). Gains 1 - q^k: first continuation at prefix 1 is worth 0.9;
    the second best is 0.4 (prefix 3, k=1) over 0.09 (prefix 1, k=2) and 0.1 (prefix 2).
    """
    tree = RolloutTree()
    nodes = []
    for reward, n in ((0.0, 3), (1.0, 2)):
        b = tree.start_branch(ROOT)
        node = ROOT
        for t in range(n):
            node = tree.add_turn(node, branch=b, reward=reward if t == n - 1 else None, terminal=t == n - 1)
            nodes.append(node)
    cands = tree.expansion_candidates()
    assert cands == [(nodes[0], 0.0), (nodes[1], 0.0), (nodes[3], 1.0)]
    plan = planning.plan_expansion(tree, [0.9, 0.1, 0.6], 2, TracePrefixAllocator(), RNG)
    assert plan == planning.ExpansionPlan(((nodes[0], 1), (nodes[3], 1)))
    assert plan.spent_continuations == 2 and plan.extra_roots == plan.unspent_continuations == 0
    q = planning.repeat_probabilities([0.9, 0.1, 0.6], [0.0, 0.0, 1.0])
    for budget in range(8):  # same answer as the solver called directly
        k = planning.allocate_prefixes([0.9, 0.1, 0.6], [0.0, 0.0, 1.0], budget, TracePrefixAllocator(), RNG)
        assert k.tolist() == solve_prefix(q, budget).tolist()
    with pytest.raises(ValueError, match="got 2 prefix values for 3"):
        planning.plan_expansion(tree, [0.5, 0.5], 2, TracePrefixAllocator(), RNG)


def test_single_turn_fallback_buys_roots_at_two_to_one_and_names_an_odd_unit():
    """Roots that all ended after one turn leave no prefix: budget // 2 fresh roots;
    an odd budget leaves one continuation unit unspent, in the plan (never silently)."""
    tree = RolloutTree()
    for reward in (0.0, 1.0):
        tree.add_turn(ROOT, branch=tree.start_branch(ROOT), reward=reward, terminal=True)
    assert tree.expansion_candidates() == []
    for budget, roots, unspent in ((4, 2, 0), (5, 2, 1), (1, 0, 1), (0, 0, 0)):
        plan = planning.plan_expansion(tree, [], budget, TracePrefixAllocator(), RNG)
        assert plan == planning.ExpansionPlan(extra_roots=roots, unspent_continuations=unspent)
        assert 2 * plan.extra_roots + plan.unspent_continuations + plan.spent_continuations == budget
    with pytest.raises(ValueError, match="-1"):
        planning.single_turn_fallback(-1)


# ---------------------------------------------------------------------- import direction
def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
    return mods


def test_baselines_import_only_the_core_and_the_core_not_baselines():
    for path in (REPO / "baselines").glob("*.py"):
        for mod in _imports(path):
            if mod.startswith("trace_gym"):
                assert mod in ("trace_gym.allocation.allocators", "trace_gym.tree", "trace_gym.budget",
                               "trace_gym.allocation.waves", "trace_gym.predictor.kinds",
                               "trace_gym.predictor.memory"), (path, mod)
            assert not mod.startswith(("environments", "evaluators", "retrieval_index")), (path, mod)
    for name in ("tree", "budget", "allocation/planning", "sim/simulator", "report", "allocation/strategy", "step/driver",
                 "agent/rollout", "agent/loop", "env/contract"):
        for mod in _imports(REPO / "trace_gym" / f"{name}.py"):
            assert not mod.startswith(("baselines", "trace_gym.strategies", "trace_gym.cli", "trace_gym.registry",
                                       "environments", "evaluators", "retrieval_index")), (name, mod)


def test_zero_continuations_make_a_tree_strategy_flat():
    from trace_gym.strategies import STRATEGIES, shaped_strategies

    flat = STRATEGIES["trace"].with_continuations(0)
    assert not flat.expands and flat.prefix_allocator is None
    assert flat.budget_split(16) == (16, 0)
    table = shaped_strategies([], group_size=4, continuations_per_root=0)
    assert all(not s.expands for s in table.values() if isinstance(s, Strategy))
