"""The one step driver: the same decisions whatever runs the branches, the single-turn
fallback, honest accounting of an odd continuation budget, cleanup on errors."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.sim import simulator as sim
from trace_gym.budget import BudgetLedger
from trace_gym.step.driver import BranchResult, BranchRunner, forecast_fallback_first, run_step
from trace_gym.sim.predictors import OraclePredictor
from trace_gym.strategies import STRATEGIES, shaped_strategies
from trace_gym.tree import ROOT, RolloutTree

WORLD = sim.SimWorld()


class ScriptedRunner:
    """A branch runner that replays recorded trees, one branch per ``advance``.

    The j-th root rollout requested for tree ``key`` is the recorded tree's j-th root
    branch; the j-th continuation requested from node n is its j-th recorded branch
    anchored at n. Branches come back one at a time in an order shuffled across trees
    (as real episodes return when they happen to finish), in request order within a tree.
    """

    def __init__(self, recorded: dict[int, RolloutTree], pool: sim.TaskPool, seed: int):
        self.recorded, self.pool = recorded, pool
        self.order_rng = np.random.default_rng(seed)
        self.trees: dict[int, RolloutTree] = {}
        self.queue: dict[int, list[int]] = {}  # key -> recorded branch ids to replay, in order
        self.used: set[tuple[int, int]] = set()

    def prompt_context(self, candidate):
        return sim.root_state(self.pool, int(candidate), WORLD)

    def node_context(self, key, node_id):
        return self.trees[key].nodes[node_id].snapshot

    def new_tree(self, key, candidate):
        self.trees[key] = RolloutTree(task_id=f"sim/{int(candidate)}", snapshot=self.prompt_context(candidate))
        return self.trees[key]

    def _take(self, key: int, anchor: int, count: int) -> None:
        rec = self.recorded[key]
        free = [b.id for b in rec.branches if b.anchor == anchor and (key, b.id) not in self.used]
        assert len(free) >= count, f"tree {key}: {count} branches asked from node {anchor}, {len(free)} recorded"
        self.used.update((key, b) for b in free[:count])
        self.queue.setdefault(key, []).extend(free[:count])

    def start_roots(self, key, count, ledger):
        self._take(key, ROOT, count)

    def start_continuations(self, key, node_id, count, ledger):
        self._take(key, node_id, count)

    @property
    def live(self) -> int:
        return sum(map(len, self.queue.values()))

    def advance(self, ledger):
        keys = [k for k, q in self.queue.items() if q]
        key = keys[int(self.order_rng.integers(len(keys)))]
        b = self.queue[key].pop(0)
        rec, tree = self.recorded[key], self.trees[key]
        branch = tree.start_branch(rec.branches[b].anchor)
        node = rec.branches[b].anchor
        for i in rec.branch_nodes(b):
            n = rec.nodes[i]
            node = tree.add_turn(node, branch=branch, snapshot=n.snapshot, reward=n.reward, terminal=n.terminal,
                                 info=n.info)
        return [BranchResult(key, rec.branches[b].anchor, node)]

    def cancel(self):
        self.queue.clear()


@pytest.mark.parametrize("name", ["trace", "random_tree", "trace_root_only", "uniform"])
def test_simulator_and_a_scripted_runner_make_the_same_decisions(name):
    """Same strategy, budget and seeds through the simulator's branch runner and through a
    scripted one that returns the same branches in another order: same allocation."""
    strategy = shaped_strategies([name], group_size=4, continuations_per_root=2)[name]
    pool = sim.make_pool(WORLD, 400, np.random.default_rng(0))
    cands = list(range(100, 164))
    runner = sim.SimBranchRunner(pool, WORLD, np.random.default_rng(1))
    assert isinstance(runner, BranchRunner)
    a = run_step(cands, strategy, OraclePredictor(), runner, 64, np.random.default_rng(2))
    recorded = {int(k): t for k, t in zip(a.tree_candidates, a.trees)}
    scripted = ScriptedRunner(recorded, pool, seed=3)
    b = run_step(cands, strategy, OraclePredictor(), scripted, 64, np.random.default_rng(2))
    assert np.array_equal(a.values, b.values)
    assert np.array_equal(a.root_counts, b.root_counts) and np.array_equal(a.continuation_budgets,
                                                                           b.continuation_budgets)
    assert sorted(a.plans, key=lambda p: p[0]) == sorted(b.plans, key=lambda p: p[0])
    assert [t.to_dict() for t in a.trees] == [t.to_dict() for t in b.trees]
    assert a.ledger.rollouts == b.ledger.rollouts and a.ledger.continuations == b.ledger.continuations
    assert a.ledger.nominal == 64
    if strategy.expands:
        assert [k for k, _ in a.plans] != [k for k, _ in b.plans]  # the returns really came in another order
        assert a.ledger.continuations == 2 * a.ledger.rollouts


def test_single_turn_fallback_and_an_odd_continuation_budget_in_the_ledger():
    """One-turn tasks leave no prefix: continuations become roots at 2 : 1, and the odd
    unit of a prompt with m = 3, N = 1 is recorded as unspent, never silently dropped."""
    world = sim.SimWorld(min_turns=1, max_turns=1)
    pool = sim.make_pool(world, 50, np.random.default_rng(0))
    strategy = STRATEGIES["trace"].with_continuations(1)

    class TwoAndThree:  # m = (2, 3) on the first two candidates
        def allocate(self, values, budget, rng):
            out = np.zeros(len(values), dtype=np.int64)
            out[:2] = (2, budget - 2)
            return out

    strategy = type(strategy)(TwoAndThree(), strategy.prefix_allocator, 1)
    step = run_step(list(range(10)), strategy, OraclePredictor(), sim.SimBranchRunner(pool, world, np.random.default_rng(1)),
                    7.5, np.random.default_rng(2))
    # every root started (the fallback's extra root included); the continuation budgets as reserved
    assert step.root_counts.tolist()[:2] == [3, 4] and step.continuation_budgets.tolist()[:2] == [2, 3]
    plans = dict(step.plans)
    assert plans[0].extra_roots == 1 and plans[0].unspent_continuations == 0
    assert plans[1].extra_roots == 1 and plans[1].unspent_continuations == 1
    led = step.ledger
    assert (led.rollouts, led.continuations, led.unspent_continuations) == (7, 0, 1)
    assert led.nominal == 7.0 == 7.5 - 0.5 * led.unspent_continuations
    assert [len(t.branches) for t in step.trees] == [3, 4] and all(t.is_complete() for t in step.trees)


def test_a_single_turn_runner_starts_every_root_in_the_first_round():
    """A runner that says it is single-turn gets its fallback roots with its first ones:
    one start_roots call per prompt, before any branch returns; same spend, same ledger."""
    world = sim.SimWorld(min_turns=1, max_turns=1)
    pool = sim.make_pool(world, 50, np.random.default_rng(0))
    strategy = shaped_strategies(["trace"], group_size=4, continuations_per_root=2)["trace"]

    class Recording(sim.SimBranchRunner):
        single_turn = True

        def __init__(self, *args):
            super().__init__(*args)
            self.calls, self.returned = [], 0

        def start_roots(self, key, count, ledger):
            self.calls.append((key, count, self.returned))
            super().start_roots(key, count, ledger)

        def advance(self, ledger):
            out = super().advance(ledger)
            self.returned += len(out)
            return out

    results = {}
    for single in (False, True):
        runner = Recording(pool, world, np.random.default_rng(1))
        runner.single_turn = single
        step = run_step(list(range(16)), strategy, OraclePredictor(), runner, 24, np.random.default_rng(2))
        results[single] = (step, runner.calls)
    (two_rounds, calls_two), (one_round, calls_one) = results[False], results[True]
    assert all(returned == 0 for _, _, returned in calls_one)  # every root started before any came back
    assert len(calls_one) == len(one_round.trees) < len(calls_two)  # the default: a second round per prompt
    assert any(returned > 0 for _, _, returned in calls_two)
    for a, b in ((two_rounds.ledger, one_round.ledger),):
        assert (a.rollouts, a.continuations, a.unspent_continuations) == (b.rollouts, b.continuations,
                                                                         b.unspent_continuations)
    assert sorted((k, p.extra_roots) for k, p in two_rounds.plans) == sorted((k, p.extra_roots) for k, p in one_round.plans)


@pytest.mark.parametrize("turns", [1, 3])
def test_a_forecast_fallback_starts_every_root_first_and_a_miss_is_visible(turns):
    """fallback_first on a runner that does not say it is single-turn: every root starts
    before any returns. On a single-turn world the forecast holds (no prefix seen, and
    the next step forecasts the same); on a multi-turn one it misses: prefixes were seen,
    none was expanded, and the next step plans as usual."""
    world = sim.SimWorld(min_turns=turns, max_turns=turns)
    pool = sim.make_pool(world, 50, np.random.default_rng(0))
    strategy = shaped_strategies(["trace"], group_size=4, continuations_per_root=2)["trace"]
    runner = sim.SimBranchRunner(pool, world, np.random.default_rng(1))
    events = []
    start_roots, advance = runner.start_roots, runner.advance
    runner.start_roots = lambda key, count, ledger: (events.append("start"), start_roots(key, count, ledger))
    runner.advance = lambda ledger: events.append("advance") or advance(ledger)
    step = run_step(list(range(16)), strategy, OraclePredictor(), runner, 24, np.random.default_rng(2),
                    fallback_first=True)
    assert step.fallback_first and step.ledger.continuations == 0 and all(p.extra_roots for _, p in step.plans)
    # one start per prompt, every one before the first advance (no second round of roots)
    assert events.count("start") == len(step.trees) == events.index("advance")
    assert (step.prefixes_seen == 0) == (turns == 1)
    assert forecast_fallback_first(step) == (turns == 1)


def test_the_forecast_needs_a_previous_step_with_trees_and_no_prefix():
    class Step:
        def __init__(self, trees, prefixes):
            self.trees, self.prefixes_seen = trees, prefixes

    assert not forecast_fallback_first(None)
    assert not forecast_fallback_first(Step([], 0))
    assert forecast_fallback_first(Step(["tree"], 0))
    assert not forecast_fallback_first(Step(["tree"], 3))


def test_a_failing_predictor_cancels_every_live_branch():
    pool = sim.make_pool(WORLD, 50, np.random.default_rng(0))

    class FailsOnPrefixes:
        def predict(self, contexts):
            if any(c.turn > 0 for c in contexts):
                raise RuntimeError("predictor broke on a prefix")
            return np.full(len(contexts), 0.5)

    cancelled = []

    class Runner(sim.SimBranchRunner):
        def cancel(self):
            cancelled.append(self.live)
            super().cancel()

    runner = Runner(pool, WORLD, np.random.default_rng(1))
    with pytest.raises(RuntimeError, match="predictor broke"):
        run_step(list(range(20)), STRATEGIES["trace"], FailsOnPrefixes(), runner, 16, np.random.default_rng(2))
    assert cancelled and runner.live == 0


def test_each_step_has_its_own_ledger():
    pool = sim.make_pool(WORLD, 100, np.random.default_rng(0))
    runner = sim.SimBranchRunner(pool, WORLD, np.random.default_rng(1))
    a = run_step(list(range(40)), STRATEGIES["trace"], OraclePredictor(), runner, 16, np.random.default_rng(2))
    b = run_step(list(range(40, 80)), STRATEGIES["trace"], OraclePredictor(), runner, 16, np.random.default_rng(3))
    assert a.ledger is not b.ledger and a.ledger.nominal == b.ledger.nominal == 16
    rng = np.random.default_rng(4)
    led = run_step(list(range(40)), STRATEGIES["trace"], OraclePredictor(), sim.SimBranchRunner(pool, WORLD, rng), 16,
                   rng).ledger
    assert led.nominal == 16 and {"allocation", "simulation", "predictor_scoring", "predictor_update"} <= set(led.seconds)
