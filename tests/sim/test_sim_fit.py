"""The simulator warmed up and fitted as the bank bench's predictor is (issue 45, item 4): the
measures the fit reads, the fit's objective, and the warm-up's equivalence with the bank's,
against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_gym.predictor.quality import drawn_group_mixed, selection_precision
from trace_gym.sim.simulator import SimState, SimWorld, TaskPool
from trace_gym.bench.sim_fit import RecordedShape, StartSample, closest, fit_predictor, shift_for_level, start_samples
from trace_gym.sim.predictors import LearnedPredictor


def test_a_group_drawn_from_recorded_roots_is_mixed_by_the_hypergeometric_count():
    # s = 1 of 8: a group of 4 misses the success with C(7, 4) / C(8, 4) = 35 / 70
    got = drawn_group_mixed([1, 4, 0, 8, 1, 0, 2], [8, 8, 8, 8, 2, 2, 4], 4)
    assert got.tolist() == pytest.approx([0.5, 1 - 2 / 70, 0.0, 0.0, 1.0, 0.0, 1.0])  # n < G: all of them
    with pytest.raises(ValueError, match="successes 9"):
        drawn_group_mixed([9], [8], 4)


def test_selection_precision_reads_the_prompts_nearest_one_half():
    # one pool of all four: the two nearest 0.5 are 0.5 (mixed 1) and 0.45 (mixed 0.5)
    assert selection_precision([0.5, 0.9, 0.1, 0.45], [1, 0, 0, 0.5], pool=4, picks=2) == 0.75
    # pools of 2 of 3: {0, 1} and {0, 2} pick candidate 0 (1.0); {1, 2} tie at 0.4, the earlier in the
    # (random) pool order wins: 0 or 0.2 alike. Expected (1 + 1 + 0.1) / 3 = 0.7.
    got = selection_precision([0.5, 0.9, 0.1], [1, 0, 0.2], pool=2, picks=1, draws=20000)
    assert got == pytest.approx(0.7, abs=0.01)


def test_the_level_shift_is_solved_by_bisection():
    flat = StartSample(np.zeros(4), np.full(4, 0.5), np.array([1.0, 0, 0, 1]))
    # predictions sigmoid(c) must average 0.25 = 0.5 - 0.25: c = logit(0.25) = -ln 3
    assert shift_for_level([flat, flat], -0.25) == pytest.approx(-math.log(3), abs=1e-9)
    assert shift_for_level([flat], 0.6) == 20.0  # a mean above 1 cannot be reached: the bound
    q = flat.quality(0.0, selection=(4, 2))
    assert (q["mixed_auc"], q["level_error"], q["selection_precision"]) == (0.5, 0.0, 0.5)  # all tied: pool order


def test_closest_takes_the_least_informative_of_equal_fits():
    assert closest([0.5, 0.6, 0.7], 0.64) == 1
    assert closest([0.5, 0.7], 0.6) == 0  # the less informative feature, first on the grid
    assert closest([0.45, 0.6, 0.592], 0.6, tolerance=0.01) == 1
    assert closest([0.45, 0.595, 0.6], 0.6, tolerance=0.01) == 1  # within the noise of the best: the weaker
    assert closest([math.nan, math.nan], 0.0) == 0  # a cold predictor measures nothing: the first, no IndexError
    assert closest([math.nan, 0.3, 0.1], 0.0) == 2


def test_the_level_shift_moves_prompt_predictions_only():
    world = SimWorld()
    pred = LearnedPredictor(np.array([[0.3, 0, 0, 0]]), level_shift=1.0)
    prompt, prefix = SimState(0, 0, 0.5), SimState(0, 1, 0.5, signal=0.2)
    assert pred.predict([prompt, prefix]).tolist() == [0.5, 0.5]  # cold: no information, no shift
    pred.update([prompt, prefix], [0.8, 0.3])
    plain = LearnedPredictor(pred.features, weights=pred.weights)
    z = plain.logits([prompt, prefix])
    assert pred.logits([prompt, prefix]).tolist() == pytest.approx([z[0] + 1.0, z[1]])
    assert world.feature_dim == 4


def certain_pool() -> TaskPool:
    """Two tasks of two turns: one always succeeds (p = 1), one always fails (p = 0)."""
    return TaskPool(success=np.array([1.0, 0.0]), features=np.zeros((2, 4)), turns=np.array([2, 2]))


def test_the_sim_warm_up_reads_what_a_bank_of_the_same_shape_gives(tmp_path):
    """R = 2 roots, K = 3 continuations at the one prefix (depth 1) of each root: per prompt 2 roots,
    6 continuations, and 3 samples (the prompt and its two roots' prefixes); the same counts as the
    bank warm-up reads from a recorded bank of that shape, through the same learning loop."""
    from bank_fixtures import write_synthetic_bank

    from trace_gym.banks import open_bank
    from trace_gym.banks.warmup import learn_from_batches, warm_up
    from trace_gym.step.learning import predictor_samples
    from trace_gym.predictor.kinds import make_predictor
    from trace_gym.bench.sim_fit import warmup_batches

    world, pool, shape = SimWorld(min_turns=2, max_turns=2), certain_pool(), RecordedShape(2, 3, None)
    batches = warmup_batches(pool, world, [0, 1], shape, seed=0)
    sim = learn_from_batches(LearnedPredictor(pool.features), batches, prefix_share=0.06)
    bank = write_synthetic_bank(tmp_path / "b.jsonl.gz", [2, 0], roots=2, continuations=3, turns=2)
    recorded = warm_up(make_predictor("constant"), open_bank(bank), [0, 1], seed=0, prefix_share=0.06)
    keys = ("prompts", "roots", "continuations", "updates", "samples")
    assert {k: sim[k] for k in keys} == {k: recorded[k] for k in keys} == {
        "prompts": 2, "roots": 4, "continuations": 12, "updates": 1, "samples": 6}
    runner, step = batches[0]
    _, targets, tree, _ = predictor_samples(step.trees, lambda t, n: None, root_rollouts_only=True)
    assert targets.tolist() == [1.0] * 3 + [0.0] * 3 and tree.tolist() == [0, 0, 0, 1, 1, 1]


def test_a_prefix_cap_keeps_the_recorders_prefixes():
    from trace_gym.bench.sim_fit import warmup_batches

    pool = TaskPool(success=np.array([0.5]), features=np.zeros((1, 4)), turns=np.array([6]))
    (_, step), = warmup_batches(pool, SimWorld(min_turns=6, max_turns=6), [0], RecordedShape(2, 1, 2), seed=1)
    tree = step.trees[0]
    anchors = sorted(tree.nodes[b.anchor].depth for b in tree.branches if b.is_continuation)
    assert anchors == [1, 1, 5, 5]  # prefix_depths(6, 2): the first and the last prefix of each root


def test_the_sim_bench_holds_its_warm_up_tasks_out_of_every_pool():
    from trace_gym.bench.sim import SimRepetition, SimSource
    from trace_gym.bench.config import SimBenchConfig

    cold = SimBenchConfig(pool_size=300, candidates=50, steps=3, seeds=1)
    warm = SimBenchConfig(pool_size=300, candidates=50, steps=3, seeds=1, warmup_prompts=100)
    old = [np.random.default_rng([0, 1, s]).choice(300, 50, replace=False) for s in range(3)]
    rep = SimRepetition(cold, SimSource(cold).world, 0)
    assert all((a == b).all() for a, b in zip(rep.draws, old))  # no warm-up: the draws are as before
    rep = SimRepetition(warm, SimSource(warm).world, 0)
    assert min(int(d.min()) for d in rep.draws) >= 100


@pytest.mark.parametrize("key, value", [("warmup_prompts", 260), ("warmup_prompts", -1),
                                        ("predictor_level_shift", math.inf), ("feature_spearman", 1.2)])
def test_a_bad_simulator_key_is_one_line(capsys, key, value):
    from trace_gym.cli import main

    code = main(["bench", "--sim", f"{key}={value}", "pool_size=300", "candidates=50"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and key in err[0], err


@pytest.mark.parametrize("value, said", [
    ("turn_shares=1,2", "turn_shares must be 4 shares >= 0, one per episode length 3..6, not all 0, got (1.0, 2.0)"),
    ("turn_shares=1,-1,1,1", "turn_shares: expected every item to be a finite number in [0, 1000000], got -1.0"),
    ("turn_shares=0,0,0,0", "turn_shares must be 4 shares >= 0, one per episode length 3..6, not all 0, got (0.0, "),
    ("success_turn_shares=1,1,1,1", "success_turn_shares (1.0, 1.0, 1.0, 1.0) needs turn_shares"),
])
def test_bad_episode_length_shares_are_one_line(capsys, value, said):
    from trace_gym.cli import main

    code = main(["bench", "--sim", value, "pool_size=300", "candidates=50"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and said in err[0], err


@pytest.mark.slow  # about 20 s: six grid points of simulated warm-ups
def test_the_fit_recovers_the_knobs_of_a_simulated_target():
    """A target measured on the simulator itself at feature Spearman 0.9 and shift +0.3 (where the
    selection precision is well above the base rate): the fit, on the same common random numbers,
    finds both again."""
    from trace_gym.bench.sim_fit import mean_quality

    world, shape = SimWorld(target_mixed=0.4, mean_success=0.4, group_size=4, min_turns=1, max_turns=3), \
        RecordedShape(4, 2, 1)
    kw = dict(warmup_prompts=32, scored=256, seeds=2, prefix_share=0.06)
    target = mean_quality(start_samples(world, shape, spearmans=[0.9], **kw)[0.9], 0.3, selection=(64, 8))
    fit = fit_predictor(world, shape, target, selection=(64, 8), grid=(0.3, 0.9), tolerance=0.0, **kw)
    assert fit["feature_spearman"] == 0.9 and fit["predictor_level_shift"] == pytest.approx(0.3, abs=1e-6)
    assert fit["reached"]["selection_precision"] == pytest.approx(target["selection_precision"])


def test_a_warm_simulated_bench_starts_its_first_step_informed():
    """Cold, the learned predictor says 0.5 for every candidate of step 0; warmed on 32 held-out
    tasks (R = 8 roots each: 256 roots) it does not, and the report says what it read."""
    from trace_gym.bench.sim import run_sim_bench
    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.strategies import shaped_strategies

    keys = dict(seeds=1, steps=1, warmup_steps=0, pool_size=300, candidates=50, root_budget=16, group_size=4,
                oracle_upper_bound=False, strategies=("pcl",))
    strategies = shaped_strategies(("pcl",), group_size=4, continuations_per_root=2)
    for held, spread in ((0, 0.0), (32, None)):
        out = run_sim_bench(SimBenchConfig(**keys, warmup_prompts=held), strategies)
        step0 = out["strategies"]["pcl"]["by_step"][0]["value_spread"]
        assert (step0 == 0.0) if spread == 0.0 else step0 > 0.05, (held, step0)
    assert out["warmup"]["roots"] == 256 and out["warmup"]["prompts"] == 32
    assert "32 held-out simulated tasks" in out["warmup"]["description"]


def test_calibrate_from_sets_each_episodes_length_by_its_outcome(tmp_path):
    """Failed roots 1 turn, successful ones 3: turn_shares (1, 0, 0), success_turn_shares (0, 0, 1), and
    kappa refitted under them; a min_turns or max_turns you set keeps the bank's shares off."""
    from trace_gym.banks import open_bank
    from trace_gym.bench.config import SimBenchConfig
    from bank_fixtures import write_bank_with_lengths

    from trace_gym.bench.sim_calibration import calibrated, lengths_by_outcome

    path = write_bank_with_lengths(tmp_path / "b.jsonl.gz", [1, 3, 5, 7] * 8)
    assert lengths_by_outcome(open_bank(str(path)), 1, 3) == {"turn_shares": (1.0, 0.0, 0.0),
                                                              "success_turn_shares": (0.0, 0.0, 1.0)}
    small = dict(candidates=32, root_budget=8, pool_size=400, steps=2, warmup_steps=0)  # the fit runs this shape
    cfg, info = calibrated(SimBenchConfig(calibrate_from=str(path), **small))
    assert (cfg.min_turns, cfg.max_turns, cfg.turn_shares, cfg.success_turn_shares) == (1, 3, (1, 0, 0), (0, 0, 1))
    assert info["fitted"]["r_without_lengths"] is not None and info["values"]["step_concentration"] > 0
    # fitted at the simulated bench's own shape (its 256 candidates: more than the bank's 24 past its warm-up)
    assert "32 candidates to the 24 prompts past its 8-prompt warm-up (M 8 to 6)" in info["spearman_note"]
    mine, info = calibrated(SimBenchConfig(calibrate_from=str(path), max_turns=4, **small))
    assert (mine.min_turns, mine.max_turns, mine.turn_shares) == (1, 4, ()) and info["kept"] == {"max_turns": 4}
    assert cfg.success_turn_tilt == 0.0  # one successful length: nothing for a tilt to move


def test_calibrate_from_tilts_the_successful_lengths_where_easier_prompts_succeed_earlier(tmp_path):
    """Prompts of 7 successful roots in 8 win at turn 1, those of 1 in 8 at turn 3: the roots pay for a
    tilt (gamma > 0, kept by BIC), each prompt's roots are counted by outcome and length, and the
    calibrated bench runs with it; the same bank with every success at turn 3 keeps none."""
    from trace_gym.banks import open_bank
    from trace_gym.bench.config import SimBenchConfig
    from bank_fixtures import write_bank_with_lengths

    from trace_gym.bench.sim_calibration import calibrated, root_length_counts

    path = write_bank_with_lengths(tmp_path / "b.jsonl.gz", [1, 7] * 16, win_turns=lambda s: 1 if s == 7 else 3)
    counts = root_length_counts(open_bank(str(path)), 1, 3)
    assert counts.shape == (32, 2, 3) and counts[0].tolist() == [[7, 0, 0], [0, 0, 1]]
    assert counts[1].tolist() == [[1, 0, 0], [7, 0, 0]]
    small = dict(candidates=32, root_budget=8, pool_size=400, steps=2, warmup_steps=0)
    cfg, info = calibrated(SimBenchConfig(calibrate_from=str(path), **small))
    tilt = info["fitted"]["tilt"]
    assert tilt["kept"] and tilt["gain"] > tilt["threshold"] and cfg.success_turn_tilt == tilt["tilt"] > 0
    assert cfg.success_turn_shares == pytest.approx(tilt["shares"])


def test_the_fit_runs_the_bank_bench_at_the_simulated_bench_shape():
    """The calibration reads the bank bench at the simulated bench's own shape (issue 45): its warm-up
    slice, candidates, M and steps; cut to what the bank holds, with one note saying how."""
    from trace_gym.bench.sim_calibration import FitShape

    def sizes(cfg):
        return cfg.warmup_prompts, cfg.candidates, cfg.root_budget, cfg.steps, cfg.warmup_steps, cfg.seeds

    cfg, note = FitShape().bank_bench("b", 256, 4, seeds=10)  # the bank bench's defaults on 256 prompts
    assert sizes(cfg) == (64, 64, 16, 3, 0, 10) and note is None and not cfg.oracle_upper_bound
    cfg, note = FitShape(15, 18, 16, 2, 3, 0).bank_bench("b", 69, 4, seeds=10)  # the shape bank's bench
    assert sizes(cfg) == (15, 18, 16, 3, 0, 10) and note is None
    # 5 steps of 64 from 192 prompts: one pass is 3 (a prompt seen again would draw the roots left)
    cfg, note = FitShape(None, 64, 16, 2, 5, 1).bank_bench("b", 256, 4, seeds=10)
    assert sizes(cfg)[3:5] == (3, 1) and note == "the bank bench cut to the bank: 5 steps to 3 (1 not measured)"
    # more candidates than the 98 prompts past the warm-up: all of them, M cut by the same share
    cfg, note = FitShape(None, 256, 256, 2, 5, 1).bank_bench("b", 130, 4, seeds=10)
    assert sizes(cfg)[:5] == (32, 98, 98, 1, 0)
    assert "256 candidates to the 98 prompts past its 32-prompt warm-up (M 256 to 98); 5 steps to 1" in note
    with pytest.raises(ValueError, match="warmup_prompts=69 leaves none of the bank's 69 prompts"):
        FitShape(warmup_prompts=69).bank_bench("b", 69, 4, seeds=10)


def test_the_uniform_arm_reads_its_predictor_on_the_same_candidates_whatever_it_predicts():
    """In-bench samples (trace_gym.bench.in_bench): one per repetition and measured step, the step's
    candidates with their truth; two simulated benches that differ only in the feature's information
    meet the same candidates and outcomes (the uniform arm does not read its predictor), and their
    predictions differ."""
    import dataclasses

    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.bench.in_bench import arm_samples
    from trace_gym.bench.sim import SimSource
    from trace_gym.predictor.quality import mixed_probability
    from trace_gym.strategies import shaped_strategies

    uniform = shaped_strategies(["uniform"], group_size=4, continuations_per_root=2)["uniform"]
    cfg = SimBenchConfig(seeds=2, steps=3, warmup_steps=1, pool_size=400, candidates=20, root_budget=16, group_size=4,
                         warmup_prompts=16, oracle_upper_bound=False)
    weak, sharp = (arm_samples(SimSource(dataclasses.replace(cfg, feature_spearman=s)), uniform) for s in (0.2, 0.95))
    assert len(weak) == len(sharp) == 2 * 2  # repetitions x measured steps
    for a, b in zip(weak, sharp):
        assert a.rates.shape == (20,) and np.array_equal(a.rates, b.rates)
        assert np.allclose(a.mixed, mixed_probability(a.rates, 4))
        assert not np.allclose(a.logits, b.logits)
    assert np.mean([b.quality(0.0)["prompt_spearman"] for b in sharp]) > \
        np.mean([a.quality(0.0)["prompt_spearman"] for a in weak]) + 0.3


def test_on_a_bank_the_truth_is_a_group_drawn_from_the_recorded_roots(tmp_path):
    """On a bank each candidate's mixed truth is P(a group of G drawn from its recorded roots without
    replacement is mixed): 1 - C(s, 4) / C(8, 4) - C(8 - s, 4) / C(8, 4) for s of 8 successes."""
    from math import comb

    from trace_gym.bench.bank import BankSource
    from trace_gym.bench.config import BankBenchConfig
    from bank_fixtures import write_bank_with_lengths

    from trace_gym.bench.in_bench import arm_samples
    from trace_gym.strategies import shaped_strategies

    wins = [0, 1, 2, 4, 6, 7, 8, 3] * 4
    path = write_bank_with_lengths(tmp_path / "b.jsonl.gz", wins)
    uniform = shaped_strategies(["uniform"], group_size=4, continuations_per_root=2)["uniform"]
    cfg = BankBenchConfig(bank=str(path), seeds=1, steps=2, warmup_prompts=8, candidates=12, root_budget=8,
                          group_size=4, predictor="constant", oracle_upper_bound=False)
    samples = arm_samples(BankSource(cfg), uniform)
    assert len(samples) == 2
    for sample in samples:
        s = np.rint(sample.rates * 8).astype(int)
        assert sample.mixed.tolist() == pytest.approx([1 - (comb(k, 4) + comb(8 - k, 4)) / comb(8, 4) for k in s])


def test_the_visibility_fit_finds_a_predictor_that_reads_the_type_alone():
    """A target measured on a two-type world whose predictor sees the type and no feature (visibility 1,
    feature Spearman 0): of visibilities 0 and 1, the fit takes 1, where the four measures meet."""
    from trace_gym.bench.sim_fit import fit_visibility, mean_quality

    world = SimWorld(type_shares=(0.5, 0.5), type_means=(0.1, 0.85), type_concentrations=(4.0, 30.0),
                     type_visibility=1.0, group_size=4, min_turns=1, max_turns=2)
    shape = RecordedShape(4, 2, 1)
    kw = dict(warmup_prompts=32, scored=256, seeds=1, prefix_share=0.06)
    target = mean_quality(start_samples(world, shape, spearmans=[0.0], **kw)[0.0], 0.0, selection=(64, 8))
    fit = fit_visibility(world, shape, target, grid=(0.0, 1.0), selection=(64, 8), **kw)
    assert fit["type_visibility"] == 1.0
    near = min(fit["visibility_grid"], key=lambda r: r["distance"])
    far = next(r for r in fit["visibility_grid"] if r["type_visibility"] == 0.0)
    assert near["type_visibility"] == 1.0 and near["distance"] < far["distance"]
    assert abs(near["brier"] - target["brier"]) < abs(far["brier"] - target["brier"])


def test_the_in_bench_choice_reads_the_picks_first_then_the_rest():
    from trace_gym.bench.in_bench_fit import choose_in_bench

    bank = {"selection_precision": 0.68, "brier": 0.11, "mixed_auc": 0.75, "prompt_spearman": 0.85}
    readings = [
        {"selection_precision": 0.683, "brier": 0.108, "mixed_auc": 0.78, "prompt_spearman": 0.92},  # .002+.03+.07
        {"selection_precision": 0.677, "brier": 0.115, "mixed_auc": 0.77, "prompt_spearman": 0.90},  # .005+.02+.05
        {"selection_precision": 0.723, "brier": 0.104, "mixed_auc": 0.75, "prompt_spearman": 0.84},  # picks far
    ]
    assert choose_in_bench(bank, readings) == 1  # the third picks 0.043 better than the bank: out
    assert choose_in_bench(bank, readings, tolerance=0.05) == 2  # within a looser tolerance it is nearest
    far = [dict(r, selection_precision=r["selection_precision"] - 0.1) for r in readings]
    assert choose_in_bench(bank, far) == 2  # none within: nearest over all four (.057 + .006 + 0 + .01)
    # one within (0.008 off) and one just past the tolerance (0.022 off) that reads nearer on the rest: a row
    # within the tolerance is taken whenever there is one (the band widened to 0.008 + 0.015 took the other
    # on the math bank under fit 10)
    split = [{"selection_precision": 0.672, "brier": 0.107, "mixed_auc": 0.78, "prompt_spearman": 0.93},
             {"selection_precision": 0.702, "brier": 0.104, "mixed_auc": 0.75, "prompt_spearman": 0.84}]
    assert choose_in_bench(bank, split) == 0
    # none within (the shape bank under fit 10): the nearest picks (0.018 off) reads far on the rest, the
    # type-alone predictor (0.034 off) reads near: the sum over all four takes it, the picks alone would not
    shape = {"selection_precision": 0.46, "brier": 0.114, "mixed_auc": 0.673, "prompt_spearman": 0.821}
    rows = [{"selection_precision": 0.442, "brier": 0.197, "mixed_auc": 0.637, "prompt_spearman": 0.645},
            {"selection_precision": 0.494, "brier": 0.116, "mixed_auc": 0.694, "prompt_spearman": 0.803}]
    assert choose_in_bench(shape, rows) == 1


def test_the_warmed_predictor_stays_finite_where_a_kind_never_succeeds():
    """Four task types, one that never succeeds, the type seen 90 % of the time and no feature: a pure
    Newton step ran the warmed predictor's logits to the +-30 clip in two of these four warm-ups (and
    the fit's level shift to its bound); the damped step keeps them within the types' own range."""
    world = SimWorld(type_shares=(0.17, 0.17, 0.16, 0.5), type_means=(0.335, 0.046, 0.006, 0.872),
                     type_concentrations=(15.3, 12.2, 1e5, 27.7), type_visibility=0.9, group_size=4, min_turns=1,
                     max_turns=3, step_concentration=1.2)
    samples = start_samples(world, RecordedShape(8, 4, None), warmup_prompts=64, scored=256, seeds=4,
                            prefix_share=0.06, spearmans=[0.0])[0.0]
    assert max(float(np.abs(s.logits).max()) for s in samples) < 10


def test_a_calibrated_bench_scores_prefixes_against_k_continuations_as_the_bank_bench_does():
    """The oracle predictor ranks prefixes by their true values exactly (Spearman 1 against them); a
    bench standing for a bank of K = 2 continuations per prefix reads the rate of 2 fresh continuations,
    as the bank bench reads its recorded ones, and that truth is noisy: the same predictor reads lower
    there, with the true reading kept beside."""
    import dataclasses

    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.bench.loop import run_bench
    from trace_gym.bench.sim_source import SimSource
    from trace_gym.strategies import STRATEGIES

    cfg = SimBenchConfig(seeds=1, steps=2, warmup_steps=0, pool_size=400, candidates=32, root_budget=32,
                         group_size=4, predictor="oracle", oracle_upper_bound=False)
    arms = {"trace": STRATEGIES["trace"]}
    plain = run_bench(SimSource(cfg), arms)["strategies"]["trace"]
    as_bank = run_bench(SimSource(dataclasses.replace(cfg, calibrate_from="a_bank"), RecordedShape(8, 2)),
                        arms)["strategies"]["trace"]
    assert plain["prefix_spearman"] == plain["prefix_spearman_true"] == as_bank["prefix_spearman_true"] == 1.0
    assert 0.5 < as_bank["prefix_spearman"] < 0.95


def test_every_world_key_a_bank_fit_sets_reaches_the_simulated_bench():
    """A key the fit sets (``SIM_WORLD_KEYS``) that ``sim_overrides`` leaves out is fitted, read in the bench's
    own in-bench fit, and then silently dropped from the bench it calibrates (fit 15's ``prefix_sees_turn`` was,
    on its first measurement)."""
    from trace_gym.bench.sim_fit import SIM_WORLD_KEYS
    from trace_gym.sim.calibrate import sim_overrides

    found = {k: (1,) for k in SIM_WORLD_KEYS}  # a tuple: the length and type keys are read as one
    assert set(SIM_WORLD_KEYS) <= set(sim_overrides(found))
