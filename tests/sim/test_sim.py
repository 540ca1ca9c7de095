"""Simulator: calibration, martingale, predictors, one allocation step (the step driver
with a SimBranchRunner), and the step's learning half on simulated trees."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from baselines import UniformRootAllocator
from trace_gym.sim import simulator as sim
from trace_gym.sim import predictors as sim_predictors
from trace_gym.sim.targets import target_error_study
from trace_gym.allocation.allocators import TracePrefixAllocator, TraceRootAllocator
from trace_gym.budget import BudgetLedger
from trace_gym.step.driver import run_step
from trace_gym.step.learning import predictor_samples
from trace_gym.report import effective_ratio, spearman
from trace_gym.strategies import Strategy
from trace_gym.tree import ROOT, RolloutTree

WORLD = sim.SimWorld()


def sim_step(pool, cands, strategy, predictor, budget, rng, ledger=None, **kw):
    """One step of the driver over the simulator: (trees, values, m); costs into ``ledger``."""
    kw.setdefault("learn", False)
    step = run_step([int(c) for c in cands], strategy, predictor, sim.SimBranchRunner(pool, WORLD, rng), budget, rng,
                    **kw)
    if ledger is not None:
        ledger.include(step.ledger)
    return step.trees, step.values, step.root_counts


def states_and_targets(trees, estimator="recursive"):
    contexts, targets, _, _ = predictor_samples(trees, lambda t, n: trees[t].nodes[n].snapshot, estimator=estimator)
    return contexts, targets


def test_mixed_probability_closed_form_hand_values():
    # Beta(1, 1) = uniform: E[p^G] = 1 / (G + 1), so P(mixed) = 1 - 2 / (G + 1).
    assert sim.mixed_probability(1, 1, 8) == pytest.approx(1 - 2 / 9)
    # G = 2: 1 - E[p^2] - E[(1-p)^2] = 2 E[p(1-p)] = 2ab / ((a+b)(a+b+1)); a=2, b=3: 12/30.
    assert sim.mixed_probability(2, 3, 2) == pytest.approx(12 / 30)
    with pytest.raises(ValueError, match="a=0"):
        sim.mixed_probability(0, 1)


def test_prior_calibrated_to_27_percent_mixed_groups_of_8():
    a, b = WORLD.prior()
    assert a / (a + b) == pytest.approx(0.5)
    assert sim.mixed_probability(a, b, 8) == pytest.approx(0.27, abs=1e-9)
    # Monte Carlo over the calibrated prior: 40k groups of 8 Bernoulli(p).
    rng = np.random.default_rng(0)
    p = rng.beta(a, b, size=40_000)
    wins = rng.binomial(8, p)
    mixed = np.mean((wins > 0) & (wins < 8))
    assert mixed == pytest.approx(0.27, abs=0.01)  # SE ~ 0.0022
    a2, b2 = sim.calibrate_prior(0.35, mean_success=0.7)
    assert a2 / (a2 + b2) == pytest.approx(0.7) and sim.mixed_probability(a2, b2) == pytest.approx(0.35)
    with pytest.raises(ValueError, match="target_mixed"):
        sim.calibrate_prior(0.999)


def _one_task_pool(p: float, turns: int) -> sim.TaskPool:
    return sim.TaskPool(success=np.array([p]), features=np.zeros((1, WORLD.feature_dim)), turns=np.array([turns]))


def test_martingale_from_root_and_from_a_prefix():
    """E[reward | V_t] = V_t: from the root (p = 0.3) and from a saved prefix."""
    pool = _one_task_pool(0.3, 5)
    rng = np.random.default_rng(1)
    tree = RolloutTree(snapshot=sim.root_state(pool, 0, WORLD))
    leaves = sim.simulate_branches(tree, [ROOT] * 6000, pool, WORLD, rng, BudgetLedger())
    rewards = np.array([tree.node(leaf).reward for leaf in leaves])
    assert set(np.unique(rewards)) <= {0.0, 1.0}
    assert rewards.mean() == pytest.approx(0.3, abs=0.02)  # SE ~ 0.006
    v1 = np.array([tree.node(tree.path(leaf)[1]).snapshot.value for leaf in leaves])
    assert v1.mean() == pytest.approx(0.3, abs=0.01)
    assert v1.var() == pytest.approx(0.3 * 0.7 / (WORLD.step_concentration + 1), rel=0.1)
    # Continuations from a turn-2 node: mean reward equals that node's V_2.
    anchor = tree.path(leaves[0])[2]
    v2 = tree.node(anchor).snapshot.value
    led = BudgetLedger()
    cont = sim.simulate_branches(tree, [anchor] * 4000, pool, WORLD, rng, led)
    cont_rewards = np.array([tree.node(leaf).reward for leaf in cont])
    assert cont_rewards.mean() == pytest.approx(v2, abs=4 * np.sqrt(v2 * (1 - v2) / 4000) + 1e-9)
    assert led.continuations == 0 and led.rollouts == 0  # nominal units are the step driver's
    assert led.env_steps == 4000 * 3  # turns 3, 4, 5
    assert all(tree.node(leaf).depth == 5 and tree.node(leaf).is_continuation for leaf in cont)


def test_uniform_groups_in_the_sim_are_mixed_27_percent_of_the_time():
    rng = np.random.default_rng(2)
    pool = sim.make_pool(WORLD, 1000, rng)
    uniform = Strategy(UniformRootAllocator(8))
    trees, _, m = sim_step(pool, np.arange(1000), uniform, sim_predictors.OraclePredictor(), 8 * 1000, rng)
    assert (m == 8).all() and len(trees) == 1000
    assert effective_ratio(trees) == pytest.approx(0.27, abs=0.045)  # SE ~ 0.014


def test_noisy_oracle_hits_the_chosen_spearman():
    a, b = WORLD.prior()
    rng = np.random.default_rng(3)
    p = rng.beta(a, b, size=20_000)
    states = [sim.SimState(task=0, turn=0, value=float(x)) for x in p]
    for target in (0.5, 0.8):
        pred = sim_predictors.NoisyOraclePredictor.with_spearman(target, WORLD, seed=4)
        achieved = stats.spearmanr(pred.predict(states), p).statistic
        assert achieved == pytest.approx(target, abs=0.02)
    assert sim_predictors.noise_for_spearman(1.0, (a, b)) == 0.0
    with pytest.raises(ValueError, match="1.5"):
        sim_predictors.noise_for_spearman(1.5, (a, b))


def test_learned_predictor_learns_from_tree_targets():
    rng = np.random.default_rng(5)
    pool = sim.make_pool(WORLD, 2000, rng)
    pred = sim_predictors.LearnedPredictor(pool.features)
    trace = Strategy(TraceRootAllocator(), TracePrefixAllocator(), 2)
    cands = np.arange(200)
    roots = [sim.root_state(pool, t, WORLD) for t in cands]
    assert np.all(pred.predict(roots) == 0.5)
    prefix_pred, prefix_true = [], []
    for step in range(3):
        cands = rng.choice(len(pool), 200, replace=False)
        trees, _, _ = sim_step(pool, cands, trace, pred, 256, rng)
        states, targets = states_and_targets(trees)
        assert len(states) == len(targets) > 0 and ((0 <= targets) & (targets <= 1)).all()
        info = pred.update(states, targets)
        assert info["n"] >= len(states)
        deep = [s for s in states if s.turn > 0]
        prefix_pred += list(pred.predict(deep))
        prefix_true += [s.value for s in deep]
    held_out = np.arange(1000, 2000)
    rho = spearman(pred.predict([sim.root_state(pool, t, WORLD) for t in held_out]), pool.success[held_out])
    assert rho > 0.6  # the informative feature alone has Spearman ~0.82 with p
    assert spearman(prefix_pred, prefix_true) > 0.3


def test_a_predictor_that_sees_the_turn_learns_each_turns_level_where_the_signal_is_noise():
    """Failures run all 4 turns and successes mostly end early, so a prefix at turn 3 is nearly always a
    failure: the mean target falls with the turn. With the per-turn signal pure noise (std 1000), the
    predictor with ``turn_slots`` reads each turn's mean target to 0.03; the one prefix intercept reads
    every turn alike (its spread over turns a fraction of the truth's). Same trees, same targets."""
    world = sim.SimWorld(min_turns=1, max_turns=4, turn_shares=(0, 0, 0, 1), success_turn_shares=(0.5, 0.2, 0.2, 0.1),
                         signal_noise=1000.0, prefix_sees_turn=True, group_size=4)
    rng = np.random.default_rng(11)
    pool = sim.make_pool(world, 600, rng)
    tree = Strategy(UniformRootAllocator(4), TracePrefixAllocator(), 2)
    states, targets = [], []
    for start in (0, 200, 400):
        step = run_step(list(range(start, start + 200)), tree, sim_predictors.OraclePredictor(),
                        sim.SimBranchRunner(pool, world, rng), 800, rng, learn=False)
        got = states_and_targets(step.trees)
        states += got[0]
        targets += list(got[1])
    targets = np.asarray(targets)
    turns = np.array([c.turn for c in states])
    truth = {t: targets[turns == t].mean() for t in (1, 2, 3)}
    assert truth[1] - truth[3] > 0.1  # the premise: the level falls with the turn
    seeing, blind = (sim_predictors.LearnedPredictor(pool.features, turn_slots=k) for k in (world.max_turns - 1, 0))
    read = {}
    for name, pred in (("seeing", seeing), ("blind", blind)):
        pred.update(states, targets)
        out = pred.predict(states)
        read[name] = {t: out[turns == t].mean() for t in (1, 2, 3)}
    assert all(abs(read["seeing"][t] - truth[t]) < 0.03 for t in truth)
    assert read["blind"][1] - read["blind"][3] < 0.5 * (truth[1] - truth[3])


def test_a_level_whose_examples_weigh_little_is_read_unpulled_while_the_other_weights_stay_penalised():
    """Prefixes at 6 % of the batch weight (the bench's prefix_share) with mean target 0.05: the prefix intercept
    carries no L2 penalty, so the predictor reads 0.05 (a penalty of 1e-3 on it read 0.148: the level
    pulled towards 0.5). A feature weight is still penalised: at l2 = 10 a feature that tells targets apart
    moves the prediction by less than a tenth of what it does at 1e-3."""
    rng = np.random.default_rng(3)
    features = rng.standard_normal((400, 1))
    prompts = [sim.SimState(task=i, turn=0, value=0.5) for i in range(200)]
    prefixes = [sim.SimState(task=200 + i, turn=1 + i % 3, value=0.05) for i in range(200)]
    y = np.concatenate([np.full(200, 0.5), (features[200:, 0] > 1.6449).astype(float)])  # P(z > 1.645) = 0.05
    w = np.concatenate([np.full(200, 0.94 / 200), np.full(200, 0.06 / 200)])
    spread = {}
    for l2 in (1e-3, 10.0):
        pred = sim_predictors.LearnedPredictor(features, l2=l2, newton_steps=50, turn_slots=3)
        pred.update(prompts + prefixes, y, w)
        out = pred.predict(prefixes)
        assert np.mean(y[200:]) == pytest.approx(0.05, abs=0.02)
        if l2 == 1e-3:
            assert float(np.mean(out)) == pytest.approx(float(np.mean(y[200:])), abs=0.01)
        spread[l2] = float(np.ptp(pred.logits(prefixes)))
    assert spread[10.0] < 0.1 * spread[1e-3]


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_turn_slots_is_one_line(bad):
    with pytest.raises(ValueError, match=f"turn_slots must be an integer >= 0 .*got {bad!r}"):
        sim_predictors.LearnedPredictor(np.zeros((2, 1)), turn_slots=bad)


def test_a_bad_prefix_sees_turn_is_one_line():
    with pytest.raises(ValueError, match="prefix_sees_turn must be true or false, got 'yes'"):
        sim.SimWorld(prefix_sees_turn="yes")


def test_run_step_spends_exactly_the_strategy_budget():
    rng = np.random.default_rng(6)
    pool = sim.make_pool(WORLD, 500, rng)
    trace = Strategy(TraceRootAllocator(), TracePrefixAllocator(), 2)
    led = BudgetLedger()
    trees, values, m = sim_step(pool, np.arange(100), trace, sim_predictors.OraclePredictor(), 128, rng, led)
    assert m.sum() == 64 and set(m.tolist()) <= {0} | set(range(2, 65))
    assert led.rollouts == 64 and led.continuations == 128 and led.nominal == 128
    assert len(trees) == int((m > 0).sum())
    assert sum(len(t.branches) for t in trees) == 64 + 128
    assert all(t.is_complete() for t in trees)
    assert led.env_steps == sum(len(t) - 1 for t in trees)
    assert led.generated_tokens == sum(n.info["policy_tokens"] for t in trees for n in list(t)[1:])
    assert np.allclose(values, pool.success[:100])
    assert {"allocation", "simulation", "predictor_scoring"} <= set(led.seconds)


def test_recursive_targets_track_the_truth_better_than_pooled_leaves():
    """Expansion below observed outcomes: the recursive mean's prompt-level squared error
    against the true p is well below the pooled leaf mean's (which over-weights the
    expanded subtrees). Sim numbers: about 0.003 vs 0.013."""
    from trace_gym.strategies import STRATEGIES

    rng = np.random.default_rng(7)
    pool = sim.make_pool(WORLD, 2000, rng)
    rec, pooled, truth = [], [], []
    for _ in range(3):
        trees, _, _ = sim_step(pool, rng.choice(2000, 256, replace=False), STRATEGIES["trace_prefix_only"],
                               sim_predictors.OraclePredictor(), 512, rng)
        for t in trees:
            rec.append(t.targets()[ROOT])
            pooled.append(t.pooled_targets()[ROOT])
            truth.append(t.root.snapshot.value)
    rec, pooled, truth = map(np.asarray, (rec, pooled, truth))
    assert np.mean((rec - truth) ** 2) < 0.5 * np.mean((pooled - truth) ** 2)


def test_target_estimator_study_reports_which_is_closer_to_the_true_value():
    """Outcome-triggered expansion: the recursive mean leans toward the outcome that
    triggered it; the mean over fresh continuations does not, but averages fewer samples.
    Measured (5 seeds): lean +0.12 vs 0.00 at expanded prefixes, and the recursive mean
    has the lower RMSE at prompt, prefix and expanded nodes (0.28 vs 0.38 at expanded)."""
    from trace_gym.strategies import STRATEGIES

    study = target_error_study(STRATEGIES["trace"], sim_predictors.OraclePredictor(), steps=3, seed=0)
    assert set(study) == {"prompt", "prefix", "expanded"}
    expanded = study["expanded"]
    n = expanded["fresh"]["n"]
    assert n == expanded["recursive"]["n"] > 500
    se = expanded["fresh"]["rmse"] / np.sqrt(n)
    assert abs(expanded["fresh"]["bias_toward_observed"]) < 3.5 * se  # unbiased where it expands
    assert expanded["recursive"]["bias_toward_observed"] > 0.08  # leans toward the observed outcome
    for group, row in study.items():
        assert row["lower_error"] == min(("recursive", "fresh"), key=lambda e: row[e]["rmse"]), group
        print(group, row["lower_error"], {e: round(row[e]["rmse"], 3) for e in ("recursive", "fresh")})
    assert study["prompt"]["recursive"]["n"] == study["prompt"]["fresh"]["n"] > 0


def test_predictor_samples_take_either_target_estimator():
    from trace_gym.strategies import STRATEGIES

    rng = np.random.default_rng(8)
    pool = sim.make_pool(WORLD, 300, rng)
    trees, _, _ = sim_step(pool, np.arange(100), STRATEGIES["trace"], sim_predictors.OraclePredictor(), 64, rng)
    s_rec, t_rec = states_and_targets(trees)
    s_fresh, t_fresh = states_and_targets(trees, "fresh")
    assert s_rec == s_fresh and len(t_rec) == len(t_fresh) > 0
    expanded = {b.anchor for t in trees for b in t.branches if b.is_continuation}
    assert expanded and not np.array_equal(t_rec, t_fresh)


def test_the_steps_learning_half_weights_prefixes_to_their_share_and_scores_them_before_the_update():
    """run_step's learning half on simulated trees: every non-terminal node is a sample with
    its recursive-mean target; prefix samples hold ``prefix_share`` of the weight; the
    prefix scores are the predictor's values *before* it trained on them; the update ran."""
    from trace_gym.step.learning import prefix_weight_for_share
    from trace_gym.strategies import STRATEGIES

    rng = np.random.default_rng(9)
    pool = sim.make_pool(WORLD, 500, rng)
    pred = sim_predictors.LearnedPredictor(pool.features)
    step = run_step(list(range(100)), STRATEGIES["trace"], pred, sim.SimBranchRunner(pool, WORLD, rng), 128, rng,
                    prefix_share=0.25, score_prefixes=True)
    learning = step.learning
    inner = [(ti, n.id) for ti, t in enumerate(step.trees) for n in t.nodes if not n.terminal]
    assert list(zip(learning.tree_index.tolist(), learning.node_ids.tolist())) == inner
    for c, ti, node, y in zip(learning.contexts, learning.tree_index, learning.node_ids, learning.targets):
        assert c is step.trees[ti].nodes[node].snapshot and y == step.trees[ti].targets()[node]
    prefix = learning.depths > 0
    assert learning.weights[prefix].sum() / learning.weights.sum() == pytest.approx(0.25)
    assert learning.prefix_weight == prefix_weight_for_share(int((~prefix).sum()), int(prefix.sum()), 0.25)
    # before the update the learned predictor knows nothing: 0.5 everywhere; after it, it does
    assert learning.prefix_predictions.shape == (int(prefix.sum()),) and np.all(learning.prefix_predictions == 0.5)
    assert pred.weights is not None and learning.stats["n"] == len(learning.targets)
    assert "predictor_update" in step.ledger.seconds and learning.warning is None
    # learn=False leaves the predictor as it was
    untouched = sim_predictors.LearnedPredictor(pool.features)
    off = run_step(list(range(100)), STRATEGIES["trace"], untouched, sim.SimBranchRunner(pool, WORLD, rng), 128, rng,
                   learn=False)
    assert off.learning is None and untouched.weights is None



def anchor_depths(trees) -> set[int]:
    """The depths of the prefixes every continuation of ``trees`` started from."""
    return {t.nodes[b.anchor].depth for t in trees for b in t.branches if b.is_continuation}


def test_a_prefix_cap_offers_only_the_depths_a_capped_bank_records():
    """Five-turn episodes: with a cap of 2 a root offers its prefixes at depths 1 and 4 (what a bank
    recording with max_prefixes_per_root = 2 keeps, and the bank bench offers), and TRACE's continuations
    start there and nowhere else; with no cap they start at every depth 1..4."""
    from trace_gym.tree import prefix_depths

    world = sim.SimWorld(min_turns=5, max_turns=5)
    rng = np.random.default_rng(3)
    pool = sim.make_pool(world, 400, rng)
    trace = Strategy(TraceRootAllocator(), TracePrefixAllocator(), 4)
    got = {}
    for cap in (None, 2):
        runner = sim.SimBranchRunner(pool, world, np.random.default_rng(4), cap)
        step = run_step(list(range(200)), trace, sim_predictors.OraclePredictor(), runner, 256,
                        np.random.default_rng(5), learn=False)
        assert all(isinstance(t, sim.CappedTree) == (cap is not None) for t in step.trees)
        offered = {t.nodes[n].depth for t in step.trees for n, _ in t.expansion_candidates()}
        assert offered == set(prefix_depths(5, cap))
        got[cap] = anchor_depths(step.trees)
    assert got[None] == {1, 2, 3, 4} and got[2] == {1, 4}


def test_the_capped_trees_depths_follow_each_roots_own_length():
    """Per-episode lengths (3 and 5 turns): a 3-turn root offers depths 1 and 2, a 5-turn root 1 and 4."""
    world = sim.SimWorld(min_turns=3, max_turns=5, turn_shares=(0.5, 0.0, 0.5), success_turn_shares=(0.5, 0.0, 0.5))
    rng = np.random.default_rng(8)
    pool = sim.make_pool(world, 50, rng)
    runner, ledger = sim.SimBranchRunner(pool, world, rng, 2), BudgetLedger()
    tree = runner.new_tree(0, 0)
    runner.start_roots(0, 40, ledger)
    runner.advance(ledger)
    by_length = {}
    for n, _ in tree.expansion_candidates():
        turns = tree.nodes[tree.branch_leaf(tree.nodes[n].branch)].depth
        by_length.setdefault(turns, set()).add(tree.nodes[n].depth)
    assert by_length == {3: {1, 2}, 5: {1, 4}}
