"""Per-episode lengths in the simulator (issue 45, item 4; trace_gym/sim/lengths.py): lengths follow
their outcome's histogram, a continuation never ends at or before its anchor, values stay honest
(E[y | W_t] = W_t for the root's own outcome and for continuations), the ledger counts the turns
run, bad shares are one line, and the default world is main's to the digit."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from trace_gym.budget import BudgetLedger
from trace_gym.sim import simulator as sim
from trace_gym.sim.lengths import LengthModel, check_turn_shares, episode_paths, length_shares
from trace_gym.tree import ROOT, RolloutTree


def one_task(world: sim.SimWorld, p: float) -> sim.TaskPool:
    return sim.TaskPool(success=np.array([p]), features=np.zeros((1, world.feature_dim)),
                        turns=np.array([world.max_turns]))


def roots(world: sim.SimWorld, p: float, n: int, seed: int = 0) -> tuple[RolloutTree, list[int], BudgetLedger]:
    pool, ledger = one_task(world, p), BudgetLedger()
    tree = RolloutTree(snapshot=sim.root_state(pool, 0, world))
    leaves = sim.simulate_branches(tree, [ROOT] * n, pool, world, np.random.default_rng(seed), ledger)
    return tree, leaves, ledger


def test_lengths_follow_the_histogram():
    """Lengths independent of the outcome: shares 0.5 / 0.2 / 0.3 of 1 / 2 / 3 turns (SE ~0.004 at
    n = 20,000); the reward's mean is still p."""
    world = sim.SimWorld(min_turns=1, max_turns=3, turn_shares=(5, 2, 3))  # shares need not sum to 1
    tree, leaves, _ = roots(world, 0.3, 20_000)
    depth = np.array([tree.node(leaf).depth for leaf in leaves])
    assert np.bincount(depth, minlength=4)[1:] / depth.size == pytest.approx([0.5, 0.2, 0.3], abs=0.015)
    assert np.mean([tree.node(leaf).reward for leaf in leaves]) == pytest.approx(0.3, abs=0.015)


def test_failed_episodes_are_shorter_when_the_histograms_say_so():
    """Failed: 1 turn 0.6, 2 turns 0.4 (mean 1.4); successful: 2 or 3 turns, half each (mean 2.5)."""
    world = sim.SimWorld(min_turns=1, max_turns=3, turn_shares=(0.6, 0.4, 0.0), success_turn_shares=(0, 0.5, 0.5))
    tree, leaves, _ = roots(world, 0.4, 20_000, seed=1)
    depth = np.array([tree.node(leaf).depth for leaf in leaves])
    won = np.array([tree.node(leaf).reward for leaf in leaves]) == 1.0
    assert won.mean() == pytest.approx(0.4, abs=0.015)
    assert depth[~won].mean() == pytest.approx(1.4, abs=0.02) and depth[won].mean() == pytest.approx(2.5, abs=0.02)
    assert set(depth[won].tolist()) == {2, 3} and set(depth[~won].tolist()) == {1, 2}


def test_a_continuation_from_turn_t_never_ends_at_or_before_t():
    """From a turn-2 node of a 4-turn world, lengths 3 and 4 only, renormalised: failed 0.1 / 0.1 of
    the mass past 2 (so 1/2 each), successful 0.3 / 0.1 (3/4 and 1/4)."""
    world = sim.SimWorld(min_turns=1, max_turns=4, turn_shares=(0.5, 0.3, 0.1, 0.1),
                         success_turn_shares=(0.2, 0.4, 0.3, 0.1))
    tree, leaves, _ = roots(world, 0.5, 4000, seed=2)
    anchor = next(tree.path(leaf)[2] for leaf in leaves if tree.node(leaf).depth == 4)
    pool = one_task(world, 0.5)
    cont = sim.simulate_branches(tree, [anchor] * 20_000, pool, world, np.random.default_rng(3), BudgetLedger())
    depth = np.array([tree.node(leaf).depth for leaf in cont])
    won = np.array([tree.node(leaf).reward for leaf in cont]) == 1.0
    assert depth.min() == 3 and all(tree.node(leaf).is_continuation for leaf in cont)
    assert (depth[~won] == 3).mean() == pytest.approx(0.5, abs=0.02)
    assert (depth[won] == 3).mean() == pytest.approx(0.75, abs=0.02)
    # where no length past t remains, the smallest allowed: t + 1
    model = LengthModel.of(1, 3, (1, 0, 0), (0, 0, 1))
    assert model.draw(np.array([0.0, 0.0, 1.0]), np.array([1, 2, 1]), np.random.default_rng(0)).tolist() == [2, 3, 3]


def test_values_stay_honest_where_length_goes_with_the_outcome():
    """Failed episodes end after 1 turn 80 % of the time, successful ones never: a root that reached
    turn 1 and goes on has W_1 = V_1 / (V_1 + 0.2 (1 - V_1)) > V_1. The root's own outcome and fresh
    continuations from the same nodes both average W_1, not V_1."""
    world = sim.SimWorld(min_turns=1, max_turns=3, step_concentration=2.0, turn_shares=(0.8, 0.1, 0.1),
                         success_turn_shares=(0.0, 0.5, 0.5))
    tree, leaves, _ = roots(world, 0.4, 20_000, seed=4)
    deep = [leaf for leaf in leaves if tree.node(leaf).depth > 1]
    nodes = [tree.path(leaf)[1] for leaf in deep]
    state = [tree.node(n).snapshot for n in nodes]
    w = np.array([s.value for s in state])
    v = np.array([s.latent_value for s in state])
    assert w == pytest.approx(v / (v + 0.2 * (1 - v)))
    y_root = np.array([tree.node(leaf).reward for leaf in deep])
    se = np.sqrt(0.25 / len(deep))
    assert abs(y_root.mean() - w.mean()) < 4 * se and abs(y_root.mean() - v.mean()) > 10 * se
    pool = one_task(world, 0.4)
    cont = sim.simulate_branches(tree, nodes, pool, world, np.random.default_rng(5), BudgetLedger())
    y_cont = np.array([tree.node(leaf).reward for leaf in cont])
    assert abs(y_cont.mean() - w.mean()) < 4 * se
    # calibrated by bins of W, not just on average: E[y | W in bin] = mean W in the bin
    for lo, hi in ((0.0, 0.5), (0.5, 0.8), (0.8, 1.0)):
        inside = (w >= lo) & (w < hi)
        assert inside.sum() > 500
        assert y_cont[inside].mean() == pytest.approx(w[inside].mean(), abs=4 * np.sqrt(0.25 / inside.sum()))


def test_the_ledger_counts_only_the_turns_run():
    world = sim.SimWorld(min_turns=1, max_turns=4, turn_shares=(0.7, 0.1, 0.1, 0.1),
                         success_turn_shares=(0.1, 0.1, 0.1, 0.7))
    tree, leaves, ledger = roots(world, 0.5, 300, seed=6)
    added = list(tree)[1:]
    assert ledger.env_steps == sum(tree.node(leaf).depth for leaf in leaves) == len(added)
    assert ledger.generated_tokens == sum(n.info["policy_tokens"] for n in added)
    assert ledger.prefill_tokens == 300 * world.prompt_tokens + sum(n.info["observation_tokens"] for n in added)
    assert all(n.info["observation_tokens"] == 0 for n in added if n.terminal)  # none after the last answer
    # continuations from turn-1 nodes: the turns after 1, and each anchor's whole context replayed
    anchors = [tree.path(leaf)[1] for leaf in leaves if tree.node(leaf).depth > 1][:50]
    before = len(tree.nodes)
    led = BudgetLedger()
    cont = sim.simulate_branches(tree, anchors, one_task(world, 0.5), world, np.random.default_rng(7), led)
    new = tree.nodes[before:]
    assert led.env_steps == sum(tree.node(leaf).depth - 1 for leaf in cont) == len(new)
    assert led.prefill_tokens == sum(tree.node(a).snapshot.context_tokens for a in anchors) + sum(
        n.info["observation_tokens"] for n in new)


def test_the_default_world_is_mains_to_the_digit():
    """One TRACE step on the default world (one length per task), seed 11: the numbers main's
    simulator gave before per-episode lengths existed."""
    from trace_gym.sim.predictors import OraclePredictor
    from trace_gym.step.driver import run_step
    from trace_gym.strategies import STRATEGIES

    world = sim.SimWorld()
    rng = np.random.default_rng(11)
    pool = sim.make_pool(world, 300, rng)
    step = run_step(list(range(64)), STRATEGIES["trace"], OraclePredictor(), sim.SimBranchRunner(pool, world, rng),
                    96, rng, learn=False)
    # values to 9 decimals: the last bits of scipy's beta quantiles move between releases (scipy 1.17.1 moved them)
    nodes = [(n.snapshot.turn, round(n.snapshot.value, 9), round(n.snapshot.signal, 9), n.snapshot.context_tokens,
              n.reward) for t in step.trees for n in t.nodes]
    led = step.ledger
    assert (len(nodes), led.generated_tokens, led.prefill_tokens, led.env_steps) == (546, 106576, 95336, 534)
    assert hashlib.sha256(json.dumps(nodes).encode()).hexdigest()[:16] == "7900ec84f912db0a"
    assert world.length_model() is None and all(n.snapshot.latent is None for t in step.trees for n in t.nodes)


@pytest.mark.parametrize("kwargs, match", [
    (dict(turn_shares=(0.5, 0.5)), r"turn_shares must be 3 shares >= 0, one per episode length 1\.\.3, not all 0, "
                                   r"got \(0\.5, 0\.5\)"),
    (dict(turn_shares=(0.5, -0.1, 0.6)), r"turn_shares must be 3 shares .* got \(0\.5, -0\.1, 0\.6\)"),
    (dict(turn_shares=(0, 0, 0)), r"turn_shares must be .* not all 0, got \(0, 0, 0\)"),
    (dict(turn_shares=(1, 1, 1), success_turn_shares=(1, float("nan"), 1)), r"^success_turn_shares must be 3"),
    (dict(success_turn_shares=(1, 1, 1)), r"success_turn_shares \(1, 1, 1\) needs turn_shares"),
])
def test_bad_shares_are_one_line_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sim.SimWorld(min_turns=1, max_turns=3, **kwargs)


def test_length_shares_count_each_length():
    assert length_shares([1, 1, 1, 2, 3, 3], 1, 3) == pytest.approx((3 / 6, 1 / 6, 2 / 6))
    assert length_shares([4, 4], 1, 4) == (0.0, 0.0, 0.0, 1.0) and length_shares([], 1, 2) == ()
    check_turn_shares((), 1, 3)  # empty: the per-task default


def test_a_value_whose_beta_parameter_underflows_is_settled_not_an_error():
    """kappa * V underflows to 0 for a V near the smallest float (a small per-type kappa reached it in a
    calibrated warm-up): numpy's beta refuses a = 0, so such a value is settled, as 0 and 1 are."""
    model = LengthModel.of(1, 3, (0.2, 0.5, 0.3), (0.1, 0.3, 0.6))
    tiny = np.array([5e-324, 0.5])
    latents, values, ends = episode_paths(tiny, tiny, np.zeros(2, dtype=int), 0.05, model, np.random.default_rng(0))
    assert np.isfinite(values).all() and latents[0, 0] in (5e-324, 0.0)
    assert sim._task_paths([sim.SimState(task=0, turn=0, value=5e-324)], np.zeros(1, dtype=int), 3, 0.05,
                                     np.random.default_rng(0))[:, 0].tolist() == [5e-324, 5e-324, 0.0]


def test_a_tilt_moves_an_easier_tasks_successes_earlier_by_the_hand_computed_shares():
    """Shares (1/2, 1/2) at the pivot 0.25, gamma 1: a task at p = 0.5 (logit 0 - logit 0.25 = ln 3) weighs
    length 2 by exp(-ln 3) = 1/3, so 3/4 of its successes end at turn 1; one at p = 1/12 (logit -ln 11,
    -ln 11 + ln 3 = -ln(11/3)) weighs it by 11/3, so 3/14 do. Simulated roots follow each task's own
    shares; the failed lengths do not move."""
    model = LengthModel.of(1, 2, (0.4, 0.6), (0.5, 0.5), tilt=1.0, pivot=0.25)
    assert model.success_shares([0.25, 0.5, 1 / 12]) == pytest.approx(np.array([[0.5, 0.5], [0.75, 0.25],
                                                                               [3 / 14, 11 / 14]]))
    assert model.at(0.5).success == pytest.approx([0.75, 0.25]) and model.at(0.5).tilt == 0.0
    assert LengthModel.of(1, 2, (0.4, 0.6), (0.5, 0.5)).at(0.9).success == pytest.approx([0.5, 0.5])
    world = sim.SimWorld(min_turns=1, max_turns=2, mean_success=0.25, turn_shares=(0.4, 0.6),
                         success_turn_shares=(0.5, 0.5), success_turn_tilt=1.0)
    for p, early in ((0.5, 0.75), (1 / 12, 3 / 14)):
        tree, leaves, _ = roots(world, p, 20_000, seed=8)
        depth = np.array([tree.node(leaf).depth for leaf in leaves])
        won = np.array([tree.node(leaf).reward for leaf in leaves]) == 1.0
        assert won.mean() == pytest.approx(p, abs=0.015)
        assert (depth[won] == 1).mean() == pytest.approx(early, abs=0.03)
        assert (depth[~won] == 1).mean() == pytest.approx(0.4, abs=0.02)


def test_values_stay_honest_under_a_tilt():
    """With a tilt the value at turn 1 reads the task's own successful lengths: p = 0.5, pivot 0.25,
    gamma 1, shares (0.5, 0.5) at the pivot, so S_1(1) = 1/4 for this task (not the pivot's 1/2) and
    W_1 = V_1 / 4 / (V_1 / 4 + (1 - V_1) 0.6); continuations from the turn-1 nodes average W_1."""
    world = sim.SimWorld(min_turns=1, max_turns=2, step_concentration=2.0, mean_success=0.25, turn_shares=(0.4, 0.6),
                         success_turn_shares=(0.5, 0.5), success_turn_tilt=1.0)
    tree, leaves, _ = roots(world, 0.5, 20_000, seed=9)
    nodes = [tree.path(leaf)[1] for leaf in leaves if tree.node(leaf).depth > 1]
    state = [tree.node(n).snapshot for n in nodes]
    w, v = np.array([s.value for s in state]), np.array([s.latent_value for s in state])
    assert w == pytest.approx(v * 0.25 / (v * 0.25 + (1 - v) * 0.6))
    cont = sim.simulate_branches(tree, nodes, one_task(world, 0.5), world, np.random.default_rng(10), BudgetLedger())
    y = np.array([tree.node(leaf).reward for leaf in cont])
    assert abs(y.mean() - w.mean()) < 4 * np.sqrt(0.25 / len(y))


@pytest.mark.parametrize("kwargs, match", [
    (dict(turn_shares=(1, 1, 1), success_turn_tilt=float("nan")),
     r"^success_turn_tilt must be a finite number, got nan"),
    (dict(success_turn_tilt=0.5), r"^success_turn_tilt 0\.5 needs turn_shares"),
])
def test_a_bad_tilt_is_one_line_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sim.SimWorld(min_turns=1, max_turns=3, **kwargs)
