"""Common draws: a simulated bench's arms share their branches' outcomes as a bank bench's arms do."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trace_gym.budget import BudgetLedger
from trace_gym.sim import simulator as sim
from trace_gym.sim.draws import CommonDraws, _words

WORLD = sim.SimWorld(min_turns=3, max_turns=3, step_concentration=2.0)


def _grow(pool, draws, tasks, roots, rng_seed, continue_depth=1, count=3):
    """Roots of each task in ``tasks`` (in that order), then ``count`` continuations at depth
    ``continue_depth`` of each task's first root; returns {task: (root rewards, continuation rewards,
    every node's signal)}."""
    runner = sim.SimBranchRunner(pool, WORLD, np.random.default_rng(rng_seed), draws=draws)
    ledger = BudgetLedger()
    for t in tasks:
        runner.new_tree(t, t)
        runner.start_roots(t, roots, ledger)
    runner.advance(ledger)
    for t in tasks:
        tree = runner._trees[t]
        first = next(n.id for n in tree.nodes if n.branch == 0 and n.depth == continue_depth)
        runner.start_continuations(t, first, count, ledger)
    runner.advance(ledger)
    out = {}
    for t in tasks:
        tree = runner._trees[t]
        leaves = [tree.nodes[tree.branch_leaf(b.id)] for b in tree.branches]
        out[t] = ([leaf.reward for leaf, b in zip(leaves, tree.branches) if not b.is_continuation],
                  [leaf.reward for leaf, b in zip(leaves, tree.branches) if b.is_continuation],
                  [n.snapshot.signal for n in tree.nodes[1:]])
    return out


def test_two_arms_with_the_same_seed_draw_the_same_branches_whatever_else_they_ran():
    pool = sim.make_pool(WORLD, 40, np.random.default_rng(0))
    tasks = list(range(0, 40, 2))
    a = _grow(pool, CommonDraws(5), tasks, 4, rng_seed=1)
    # another arm: other tasks first and in another order, another arm stream: the shared tasks read alike
    b = _grow(pool, CommonDraws(5), list(range(1, 40, 2)) + tasks[::-1], 4, rng_seed=2)
    assert all(a[t] == b[t] for t in tasks)
    rewards = [r for t in tasks for r in a[t][0] + a[t][1]]
    assert 0 < np.mean(rewards) < 1  # outcomes of both kinds: the equality above is not of constants
    # a third arm at another repetition's seed draws otherwise
    c = _grow(pool, CommonDraws(6), tasks, 4, rng_seed=1)
    assert any(a[t][2] != c[t][2] for t in tasks)
    # without common draws the two arms' streams differ
    d = _grow(pool, None, tasks, 4, rng_seed=1)
    e = _grow(pool, None, tasks, 4, rng_seed=2)
    assert any(d[t][2] != e[t][2] for t in tasks)


def test_a_later_request_continues_the_stream_of_its_task_and_prefix():
    """An arm that asks for a task's roots over two steps gets the roots an arm asking for them at once
    gets (the n-th root is the n-th, whenever it is asked for)."""
    pool = sim.make_pool(WORLD, 4, np.random.default_rng(0))
    once = _grow(pool, CommonDraws(3), [1], 6, rng_seed=0)[1][0]
    draws = CommonDraws(3)
    first = _grow(pool, draws, [1], 2, rng_seed=0)[1][0]
    later = _grow(pool, draws, [1], 4, rng_seed=9)[1][0]
    assert first + later == once
    assert draws.roots[1] == 6


def test_branch_keys_map_to_distinct_seed_words():
    keys = [("r", 0), ("r", 1), ("c", (("r", 0), 1), 0), ("c", (("r", 0), 1), 1), ("c", (("r", 1), 1), 0),
            ("c", (("r", 0), 2), 0), ("c", (("c", (("r", 0), 1), 0), 2), 0)]
    words = [tuple(_words(k)) for k in keys]
    assert len(set(words)) == len(words)
    assert all(w >= 0 for ws in words for w in ws)


def test_prompts_alike_hides_every_task_feature_and_keeps_the_pool():
    world = sim.SimWorld(type_shares=(0.5, 0.5), type_means=(0.2, 0.7), type_concentrations=(5.0, 5.0))
    seen = sim.make_pool(world, 50, np.random.default_rng(4))
    alike = sim.make_pool(dataclasses.replace(world, prompts_alike=True), 50, np.random.default_rng(4))
    assert np.ptp(seen.features) > 0
    assert not alike.features.any() and alike.features.shape == seen.features.shape
    assert np.array_equal(alike.success, seen.success) and np.array_equal(alike.types, seen.types)


def test_a_bad_prompts_alike_is_one_line():
    with pytest.raises(ValueError, match="prompts_alike must be true or false, got 1"):
        sim.SimWorld(prompts_alike=1)
