"""The zoo's rules on hand-computed cases: each published method's arm (baselines/, listed in
docs/strategies.md) driven directly with hand-built step views, and the predictors it brings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from zoo_views import drive, make_view

from baselines.ar3po import AR3PO
from baselines.cero import CERO, expected_variance, target_exposure
from baselines.dapo import DAPODynamicSampling
from baselines.greso import GRESO, skip_probabilities
from baselines.knapsack import KnapsackRL, knapsack_counts, knapsack_extras, mixed_value
from baselines.mopps import MoPPS, closest_to_target
from baselines.pilot_commit import PilotCommit
from baselines.predictors import BetaPosteriorPredictor, RunningRatePredictor
from trace_gym.allocation.allocators import GroupSized
from trace_gym.predictor.kinds import Context, ObservesOutcomes, SuccessPredictor


def outcomes(*successes_of_four: int) -> dict[int, list[int]]:
    """Scripts of 4 roots per candidate with the given successes (successes first)."""
    return {i: [1] * s + [0] * (4 - s) for i, s in enumerate(successes_of_four)}


# ---------------------------------------------------------------------- DAPO
def test_dapo_refills_until_b_train_groups_are_mixed_and_trains_on_the_first():
    script = outcomes(4, 2, 0, 1, 3, 0, 2, 2)  # P1..P8: 4/4, 2/4, 0/4 | 1/4, 3/4, 0/4 | ...
    arm = DAPODynamicSampling(group_size=4, train_groups=2, generation_groups=3)
    waves, _ = drive(arm, 8, 24, script)
    assert waves == [{0: 4, 1: 4, 2: 4}, {3: 4, 4: 4, 5: 4}]  # kept P2, then P4, P5: 3 >= 2, stop
    assert arm.trained == (1, 3)  # P5's mixed group is surplus: DAPO drops it
    waves, _ = drive(arm, 8, 16, script)  # 16 roots: the second wave buys one group only
    assert waves == [{0: 4, 1: 4, 2: 4}, {3: 4}] and arm.trained == (1, 3)


def test_dapo_stops_at_the_budget_or_max_waves_and_trains_on_what_it_kept():
    script = outcomes(*[0] * 12)
    arm = DAPODynamicSampling(group_size=4, train_groups=2, generation_groups=2)
    waves, last = drive(arm, 12, 20, script)
    assert [sum(w.values()) for w in waves] == [8, 8, 4] and arm.trained == () and last.remaining == 0
    waves, _ = drive(DAPODynamicSampling(4, 2, 2, max_waves=2), 12, 20, script)
    assert len(waves) == 2


def test_dapo_default_sizes_scale_with_the_step_budget():
    view = make_view(64, 32)
    assert DAPODynamicSampling().sizes(view) == (1, 3)  # G = 8: 24 roots, then one group
    assert DAPODynamicSampling().with_group_size(4).sizes(view) == (2, 6)


# ---------------------------------------------------------------------- GRESO
def test_greso_skip_probabilities_and_injected_draws():
    skip = skip_probabilities([2, 1, 0, 0, 7], [1, -1, 0, 0, 1], 0.5, 0.5, 0.01)
    assert skip == pytest.approx([0.75, 0.5, 0.0, 0.0, 0.99])  # P5: 1 - max(0.5^7, 0.01)
    draws = np.array([0.70, 0.60, 0.10, 0.90, 0.985])
    assert np.flatnonzero(draws < skip).tolist() == [0, 4]  # skip P1 and P5


def test_greso_skips_with_the_steps_rng_in_pool_order():
    history = dict(pure_streak=[2, 1, 0, 0, 7, 3], streak_kind=[1, -1, 0, 0, 1, -1], chosen=[2, 1, 1, 0, 7, 3])
    arm = GRESO(group_size=2, train_groups=6, sampling_groups=6)
    view = make_view(6, 12, **history)
    wave = arm.plan(view, np.random.default_rng(5))
    draws = np.random.default_rng(5).random(6)
    kept = np.flatnonzero(draws >= skip_probabilities(view.pure_streak, view.streak_kind, 0.5, 0.5, 0.01))
    assert sorted(wave.roots) == kept.tolist() and set(arm.skipped) == set(range(6)) - set(kept.tolist())
    assert 0 < len(kept) < 6  # the seed skips some and keeps some: the test sees both


def test_greso_second_wave_size_and_final_flag():
    # B_train 8, S 12, min 4, G 4; wave 1: 6 of 12 mixed -> zvr 0.5, est int(2 / 0.5 * 1.25) = 5 <= 12: final
    script = {i: ([1, 0, 0, 0] if i < 6 else [0, 0, 0, 0]) for i in range(40)}
    arm = GRESO(group_size=4, train_groups=8, sampling_groups=12, min_wave_groups=4)
    waves, _ = drive(arm, 40, 128, script)
    assert [sorted(w) for w in waves] == [list(range(12)), list(range(12, 17))]  # then stop, though only 6 kept
    assert arm.trained == (0, 1, 2, 3, 4, 5)


def test_greso_adapts_its_exploration_probabilities_after_the_step():
    # 40 groups: 5 all-pass (0.125 >= 0.25 / 3), 4 all-fail (0.10 < 0.5 / 3), 31 mixed
    s = [4] * 5 + [0] * 4 + [2] * 31
    view = make_view(40, 160, wave=1, spent_roots=160, roots=[4] * 40, successes=s, failures=[4 - x for x in s],
                     chosen=[1] * 40)
    arm = GRESO(group_size=4, train_groups=8)
    assert arm.plan(view, np.random.default_rng(0)) is None
    assert (arm.p_easy, arm.p_hard) == (pytest.approx(0.49), pytest.approx(0.51))
    fresh = GRESO(group_size=4, train_groups=8)
    fresh.plan(make_view(40, 160, wave=1, spent_roots=160, roots=[4] * 40, successes=s,
                         failures=[4 - x for x in s]), np.random.default_rng(0))
    assert (fresh.p_easy, fresh.p_hard) == (0.5, 0.5)  # no prompt seen before: the code's first epoch


# ---------------------------------------------------------------------- MoPPS
def test_mopps_keeps_the_samples_nearest_one_half():
    # squared distances (0.16, 0.0025, 0.16, 0.01) -> #2 and #4
    assert closest_to_target(np.array([0.90, 0.45, 0.10, 0.60]), 2).tolist() == [1, 3]
    assert closest_to_target(np.array([0.25, 0.75, 0.5]), 2).tolist() == [2, 0]  # a tie: pool order


def test_mopps_thompson_samples_the_views_posterior_with_its_rng():
    alpha, beta = [1.0, 9.0, 2.0, 5.0, 1.0, 30.0], [1.0, 1.0, 2.0, 5.0, 9.0, 30.0]
    arm = MoPPS(group_size=4)
    wave = arm.plan(make_view(6, 8, alpha=alpha, beta=beta), np.random.default_rng(3))
    expect = closest_to_target(np.random.default_rng(3).beta(alpha, beta), 2)
    assert wave.roots == {int(i): 4 for i in expect}
    # without a posterior: Beta(1 + past successes, 1 + past failures) from the history
    wave = arm.plan(make_view(6, 8, past_successes=[0, 8, 1, 4, 0, 29], past_failures=[0, 0, 1, 4, 8, 29]),
                    np.random.default_rng(3))
    assert wave.roots == {int(i): 4 for i in expect}
    assert arm.plan(make_view(6, 8, wave=1, spent_roots=8), np.random.default_rng(3)) is None  # one wave


def test_beta_posterior_predictor_decays_toward_the_prior():
    ctx = [Context("P")]
    half = BetaPosteriorPredictor(decay=0.5)
    half.observe_outcomes(ctx, [2], [8])  # from (1, 1): (3, 7) whatever the decay
    assert [x.tolist() for x in half.posterior(ctx)] == [[3.0], [7.0]]
    half.observe_outcomes(ctx, [3], [8])  # 0.5 * 3 + 0.5 * 1 + 3 = 5, 0.5 * 7 + 0.5 * 1 + 5 = 9
    assert [x.tolist() for x in half.posterior(ctx)] == [[5.0], [9.0]]
    assert half.predict(ctx).tolist() == [5 / 14] and half.predict([Context("never")]).tolist() == [0.5]
    keep = BetaPosteriorPredictor()
    keep.observe_outcomes(ctx, [2], [8])
    assert [x.tolist() for x in keep.posterior(ctx)] == [[3.0], [7.0]]
    assert isinstance(keep, SuccessPredictor) and isinstance(keep, ObservesOutcomes)
    assert keep.update(ctx, [0.3]) == {}


def test_beta_posterior_predictor_state_and_bounded_memory():
    pred = BetaPosteriorPredictor(capacity=2)
    pred.observe_outcomes([Context("a"), Context("b"), Context("c")], [1, 2, 3], [4, 4, 4])
    a, _ = pred.posterior([Context("a"), Context("b"), Context("c")])
    assert a.tolist() == [1.0, 3.0, 4.0]  # "a", least recently seen, was forgotten
    copy = BetaPosteriorPredictor()
    copy.load_state_dict(pred.state_dict())
    assert [x.tolist() for x in copy.posterior([Context("c")])] == [[4.0], [2.0]] and copy.capacity == 2
    with pytest.raises(ValueError, match="entry 0 has 3.0 of 2.0"):
        pred.observe_outcomes([Context("a")], [3], [2])
    with pytest.raises(ValueError, match="decay must be a number in \\(0, 1\\], got 0"):
        BetaPosteriorPredictor(decay=0)


# ---------------------------------------------------------------------- Knapsack RL
def test_knapsack_hand_cases():
    # (1) base 2 each, rem 8, need 3 + 8 >= 8; the knapsack over (0.5, 0.1): (3, 5) extra is best
    assert knapsack_counts([0.5, 0.1, 1.0, 0.0], [True] * 4, 4, n_max=8).tolist() == [5, 7, 2, 2]
    assert mixed_value(0.5, 5) + mixed_value(0.1, 7) == pytest.approx(0.15945, abs=5e-5)
    # (2) need 3 < rem 8: surplus 5 to the two p = 0 prompts (3, 2), the knapsack places 3 on p = 0.5
    assert knapsack_counts([0.5, 1.0, 0.0, 0.0], [True] * 4, 4, n_max=8).tolist() == [5, 2, 5, 4]
    # (3) nothing known: uniform
    assert knapsack_counts([0.5, 0.1, 1.0, 0.0], [False] * 4, 4).tolist() == [4, 4, 4, 4]
    # no effective prompt, one solved and one unsolved: rem to the unsolved
    assert knapsack_counts([1.0, 0.0], [True, True], 4).tolist() == [2, 6]


@pytest.mark.parametrize("seed", range(5))
def test_knapsack_extras_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    rates, budget, most = rng.uniform(0.05, 0.95, 3), int(rng.integers(0, 13)), 5
    got = knapsack_extras(rates, budget, 2, most)
    value = lambda ks: sum(mixed_value(p, 2 + k) if k else 0.0 for p, k in zip(rates, ks))  # noqa: E731
    best = max(value(ks) for ks in itertools.product(range(most + 1), repeat=3) if sum(ks) == min(budget, 15))
    assert got.sum() == min(budget, 15) and value(got) == pytest.approx(best)


def test_knapsack_arm_splits_the_first_batch_by_rate_and_evidence():
    values = [0.5, 0.1, 1.0, 0.0, 0.5, 0.5]
    arm = KnapsackRL(group_size=4, n_max=8)
    wave = arm.plan(make_view(6, 16, values=values, past_successes=[2, 1, 4, 0, 0, 0],
                              past_failures=[2, 3, 0, 4, 0, 0]), np.random.default_rng(0))
    assert wave.roots == {0: 5, 1: 7, 2: 2, 3: 2}  # batch = first 16 // 4 prompts; 4 seen rollouts = known
    wave = arm.plan(make_view(6, 16, values=values, past_successes=[1, 0, 2, 0, 0, 0],
                              past_failures=[1, 2, 0, 2, 0, 0]), np.random.default_rng(0))
    assert wave.roots == {0: 4, 1: 4, 2: 4, 3: 4}  # 2 rollouts seen < n = 4: not yet known, uniform


def test_running_rate_predictor_reads_the_latest_visits_holding_the_window():
    ctx = [Context("P")]
    pred = RunningRatePredictor(window=8)
    for s, t in [(1, 2), (2, 2), (0, 4)]:
        pred.observe_outcomes(ctx, [s], [t])
    assert pred.predict(ctx).tolist() == [3 / 8]  # 4 + 2 + 2 rollouts hold the window
    pred.observe_outcomes(ctx, [8], [8])
    assert pred.predict(ctx).tolist() == [1.0]  # the last visit alone holds 8
    assert pred.predict([Context("never")]).tolist() == [11 / 16]  # pooled over every rollout seen
    copy = RunningRatePredictor()
    copy.load_state_dict(pred.state_dict())
    assert copy.predict(ctx).tolist() == [1.0] and copy.window == 8


# ---------------------------------------------------------------------- Pilot-Commit
def test_pilot_commit_pilots_then_commits_by_pilot_spread_and_evicts_the_solved():
    script = {i: [1] * s + [0] * (4 - s) + [1, 0, 1, 0] for i, s in enumerate([4, 2, 0, 1, 3, 4, 2, 2, 2, 2])}
    arm = PilotCommit(group_size=8, prompts=2, pilots_per_wave=6)
    assert (arm.pilot, arm.commit) == (4, 4)
    waves, _ = drive(arm, 10, 32, script)
    # pilot means 1, .5, 0, .25, .75, 1: P2, P4, P5 pass; commit by std: P2 (.5), then P4 / P5 tied: pool order
    assert waves == [{i: 4 for i in range(6)}, {1: 4, 3: 4}]
    assert arm.committed == [1, 3] and list(arm.evicted) == ["p0", "p5"]  # P3 (0 of 4) is only deferred
    waves, _ = drive(arm, 10, 32, script)  # the next step pilots around the evicted prompts
    assert sorted(waves[0]) == [1, 2, 3, 4, 6, 7]


def test_pilot_commit_pilots_only_what_the_budget_can_still_commit():
    script = {i: [0, 0, 0, 0] for i in range(20)}  # every pilot deferred
    waves, last = drive(PilotCommit(group_size=8), 20, 32, script)  # B = 32 // 16 = 2, M = 6
    # 6 pilots (24 roots); no passer: (8 - 4) // 4 = 1 more pilot leaves room for its commit; then none
    assert waves == [{i: 4 for i in range(6)}, {6: 4}] and last.remaining == 2 * 4
    script[6] = [1, 1, 0, 0, 1, 1, 1, 1]
    waves, last = drive(PilotCommit(group_size=8), 20, 32, script)
    assert waves[1:] == [{6: 4}, {6: 4}] and last.remaining == 0  # the late pilot passed and is committed
    assert PilotCommit().with_group_size(4).sizes(make_view(64, 32)) == (4, 12)


# ---------------------------------------------------------------------- AR3PO
def test_ar3po_rounds_until_each_prompt_has_a_success():
    script = {0: [1, 0], 1: [0, 0, 0, 0, 0, 1], 2: [1, 1]}
    arm = AR3PO(prompts=3)
    waves, last = drive(arm, 3, 24, script)
    assert waves == [{0: 2, 1: 2, 2: 2}, {1: 2}, {1: 2}] and last.spent == 2 * 10  # B stops after round 3
    assert arm.would_reuse == ()


def test_ar3po_marks_the_groups_a_stored_correct_response_would_rescue():
    script = {0: [0] * 8, 1: [1, 1]}
    arm = AR3PO(prompts=2)
    waves, _ = drive(arm, 2, 16, script, past_successes=[1, 0], past_failures=[3, 4])
    assert [w.get(0) for w in waves] == [2, 2, 2, 2] and arm.would_reuse == (0,)
    drive(arm, 2, 16, script)
    assert arm.would_reuse == ()  # never seen succeed: nothing stored
    assert AR3PO().with_group_size(4).rounds == 2 and isinstance(AR3PO(), GroupSized)


# ---------------------------------------------------------------------- CERO
def test_cero_helpers():
    assert expected_variance(1, 1) == pytest.approx(1 / 6) and expected_variance(5, 5) == pytest.approx(25 / 110)
    z = target_exposure(np.array([0.0, 1.0, 1.0, 1.0]), np.array([0.5, 1.5, 1e-9, 0.5]), 8.0)
    assert z.tolist() == pytest.approx([0.0, 0.0, 8.0, np.log(2.0)])


def test_cero_three_rounds_by_hand():
    """The notes' case in groups of 8 (= the paper's 2 units of 4): M = 3, C = 1, K = 4, B = 2."""
    arm = CERO(group_size=8, groups_per_round=1, rounds=4, run_groups=2, dataset_size=3)
    waves, _ = drive(arm, 3, 8, {0: [1] * 4 + [0] * 4})  # d = 1/6 each: P0 (pool order)
    assert waves == [{0: 8}]
    assert list(arm.theta.values()) == pytest.approx([0.1951, 2 / 3, 2 / 3], abs=1e-4)
    assert (arm.price, arm.budget_left) == (1.0, 1.0)
    waves, _ = drive(arm, 3, 8, {}, past_successes=[4, 0, 0], past_failures=[4, 0, 0])  # every d < 0
    assert waves == [] and arm.price == pytest.approx(0.5)
    assert list(arm.theta.values()) == pytest.approx([0.3362, 2 / 3, 2 / 3], abs=1e-4)
    waves, _ = drive(arm, 3, 8, {1: [1] * 8}, past_successes=[4, 0, 0], past_failures=[4, 0, 0])
    assert waves == [{1: 8}]
    assert list(arm.theta.values()) == pytest.approx([0.4274, 1 / 6, 2 / 3], abs=1e-4)
    assert (arm.price, arm.budget_left) == (1.0, 0.0)
    waves, _ = drive(arm, 3, 8, {})
    assert waves == [] and arm.price == 1.0  # the run's budget is spent: nothing more, nothing moves


# ---------------------------------------------------------------------- every arm
@pytest.mark.parametrize("make", [DAPODynamicSampling, GRESO, MoPPS, KnapsackRL, PilotCommit, CERO])
def test_group_size_reaches_every_arm_and_bad_knobs_are_named(make):
    arm = make()
    assert isinstance(arm, GroupSized) and arm.with_group_size(4).group_size == 4
    assert arm.description and arm.predictor in {"constant", "beta_posterior", "running_rate"}
    with pytest.raises(ValueError, match="group_size must be an integer >= 2, got 1"):
        make(group_size=1)
