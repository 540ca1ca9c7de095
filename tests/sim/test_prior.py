"""The simulator's prior of task types (trace_gym/sim/prior.py): each kind's fit recovers known Betas
from brute-force counts, the likelihood by hand, the pool's visible type, and one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from trace_gym.sim import prior as P
from trace_gym.sim.simulator import SimWorld, make_pool, mixed_probability

TWO_KINDS = ((0.6, 0.3, 1.2), (0.4, 34.0, 6.0))  # 60 % mostly failed (mean 0.2), 40 % of mean 0.85


def counts(prior, prompts, roots, seed):
    rng = np.random.default_rng(seed)
    p, _ = P.draw(prior, prompts, rng)
    return rng.binomial(roots, p), np.full(prompts, roots)


def test_the_likelihood_is_the_beta_binomial_by_hand():
    # Beta(1, 1), 1 success of 2: C(2, 1) B(2, 2) / B(1, 1) = 2 / 6
    assert P.log_likelihood(((1.0, 1.0, 1.0),), np.array([1]), np.array([2])) == pytest.approx(math.log(1 / 3))
    # half Beta(1, 1), half Beta(2, 1) (P(s = 2 of 2) = 1/3 and B(4, 1) / B(2, 1) = 1/2)
    got = P.log_likelihood(((0.5, 1.0, 1.0), (0.5, 2.0, 1.0)), np.array([2]), np.array([2]))
    assert got == pytest.approx(math.log(0.5 / 3 + 0.5 / 2))


def test_each_kind_gets_the_maximum_likelihood_beta_of_its_counts():
    # 3,000 prompts of two kinds, 16 roots each: shares, means and concentrations come back
    s, n = counts(TWO_KINDS, 3000, 16, seed=1)
    kinds = np.where(P.draw(TWO_KINDS, 3000, np.random.default_rng(1))[1] == 0, "gen/d1", "sum/m9")
    prior, names, bic = P.types_from_kinds(kinds, s, n)
    assert names == ("gen/d1", "sum/m9") and bic["bic_one"] - bic["bic_kinds"] > 1000
    assert [w for w, _, _ in prior] == pytest.approx([0.6, 0.4], abs=0.03)
    assert [a / (a + b) for _, a, b in prior] == pytest.approx([0.2, 0.85], abs=0.015)
    assert [a + b for _, a, b in prior] == pytest.approx([1.5, 40.0], rel=0.25)


def test_the_beta_likelihood_is_maximal_at_the_fit():
    s, n = counts(((1.0, 0.8, 2.2),), 400, 8, seed=3)
    a, b = P.beta_mle(s, n)
    best = P.log_likelihood(((1.0, a, b),), s, n)
    for da, db in ((1.05, 1), (0.95, 1), (1, 1.05), (1, 0.95), (1.05, 1.05)):
        assert P.log_likelihood(((1.0, a * da, b * db),), s, n) < best


def test_a_kind_that_never_succeeds_is_a_type_of_mean_near_zero():
    a, b = P.beta_mle([0] * 10, [16] * 10)
    assert a / (a + b) < 1e-6 and a == pytest.approx(P.PARAMETER_BOUNDS[0])


def test_types_need_two_kinds_of_enough_prompts():
    s, n = [1, 2, 3, 4, 5, 6], [8] * 6
    assert P.types_from_kinds(["a"] * 6, s, n) is None  # one kind
    assert P.types_from_kinds(["a"] * 4 + ["b"] * 2, s, n) is None  # a kind of 2 prompts
    assert P.types_from_kinds(["a"] * 3 + ["b"] * 3, s, n, margin=-math.inf) is not None
    assert P.types_from_kinds(["a"] * 3 + ["b"] * 3, s, n) is None  # six prompts cannot show two kinds


def test_kinds_that_do_not_explain_the_counts_are_not_types():
    # one Beta for all, kinds drawn at random: the kinds' BIC is not 10 below one Beta's
    s, n = counts(((1.0, 0.5, 1.5),), 600, 8, seed=11)
    kinds = np.random.default_rng(12).choice(["x/a", "x/b", "x/c"], size=600)
    assert P.types_from_kinds(kinds, s, n) is None
    typed = P.types_from_kinds(kinds, s, n, margin=-math.inf)
    assert typed is not None and typed[2]["bic_one"] < typed[2]["bic_kinds"]
    with pytest.raises(ValueError, match="one kind per prompt"):
        P.types_from_kinds(["a"] * 5, s, n)


def test_a_task_ids_kind_is_the_part_before_its_last_slash():
    from trace_gym.banks.stats import task_kind

    assert task_kind("gen/d1/s0/17") == "gen/d1/s0"
    assert task_kind("synthetic/director/5") == "synthetic/director"
    assert task_kind("guess") == "" and task_kind(None) == "" and task_kind(42) == ""


def test_one_component_draws_what_one_beta_always_drew():
    p, types = P.draw(((1.0, 0.7, 1.3),), 50, np.random.default_rng(3))
    assert (p == np.random.default_rng(3).beta(0.7, 1.3, size=50)).all() and not types.any()
    assert P.quantiles(((1.0, 0.7, 1.3),), 10).tolist() == pytest.approx(
        stats.beta.ppf((np.arange(10) + 0.5) / 10, 0.7, 1.3).tolist())


def test_the_moments_of_a_mixture_against_a_brute_force_draw():
    p, types = P.draw(TWO_KINDS, 400_000, np.random.default_rng(4))
    assert types.mean() == pytest.approx(0.4, abs=0.003)
    assert p.mean() == pytest.approx(0.6 * 0.2 + 0.4 * 0.85, abs=0.002)
    assert P.mean_variance_term(TWO_KINDS) == pytest.approx(float(np.mean(p * (1 - p))), abs=0.002)
    brute = float(np.mean(1 - p**4 - (1 - p) ** 4))
    assert P.mixed_share(TWO_KINDS, 4) == pytest.approx(brute, abs=0.003)
    assert P.mixed_share(((1.0, 2.0, 3.0),), 8) == mixed_probability(2.0, 3.0, 8)


@pytest.mark.parametrize("bad, said", [
    (((0.5, 1.0, 1.0), (0.6, 1.0, 1.0)), "shares must sum to 1, got 1.1"),
    (((1.0, 0.0, 1.0),), "a=0.0"),
    (((0.0, 1.0, 1.0), (1.0, 1.0, 1.0)), "share must lie in (0, 1], got 0.0"),
    ((1.0, 2.0, 3.0), "a Beta prior is a pair"),
])
def test_a_bad_prior_names_its_value(bad, said):
    with pytest.raises(ValueError) as err:
        P.components_of(bad)
    assert said in str(err.value)


def world(visibility):
    return SimWorld(type_shares=(0.5, 0.5), type_means=(0.05, 0.95), type_concentrations=(400.0, 400.0),
                    type_visibility=visibility, group_size=4)


@pytest.mark.parametrize("visibility", [0.0, 0.6, 1.0])
def test_the_predictor_sees_each_tasks_type_as_often_as_the_visibility_says(visibility):
    pool = make_pool(world(visibility), 100_000, np.random.default_rng(5))
    kind = (pool.success > 0.5).astype(int)  # the two types do not overlap at these concentrations
    seen = pool.features[:, 4:6]  # after the world's 4 features
    assert (seen.sum(1) == 1).all()  # one-hot
    right = float((seen[:, 1] == kind).mean())
    assert right == pytest.approx(visibility + (1 - visibility) / 2, abs=0.01)


def test_pools_that_differ_in_visibility_share_every_other_draw():
    a, b = (make_pool(world(v), 500, np.random.default_rng(6)) for v in (0.2, 0.9))
    assert (a.success == b.success).all() and (a.turns == b.turns).all()
    assert (a.features[:, :4] == b.features[:, :4]).all()


def test_the_feature_noise_reaches_its_spearman_under_types():
    from trace_gym.sim.predictors import noise_for_spearman

    sigma = noise_for_spearman(0.6, world(1.0).difficulty())
    p, _ = P.draw(world(1.0).difficulty(), 40_000, np.random.default_rng(7))
    z = np.log(p) - np.log1p(-p)
    feature = z + sigma * np.random.default_rng(8).standard_normal(p.size)
    assert stats.spearmanr(feature, p)[0] == pytest.approx(0.6, abs=0.02)


@pytest.mark.parametrize("kw, said", [
    (dict(type_shares=(0.5, 0.5), type_means=(0.1,), type_concentrations=(1.0, 1.0)), "one value per type"),
    (dict(type_shares=(0.5, 0.5), type_means=(0.1, 1.0), type_concentrations=(1.0, 1.0)), "type_means"),
    (dict(type_shares=(0.5, 0.5), type_means=(0.1, 0.5), type_concentrations=(1.0, -1.0)), "type_concentrations"),
    (dict(type_visibility=1.5), "type_visibility must lie in [0, 1], got 1.5"),
])
def test_a_bad_type_key_is_one_line(kw, said):
    with pytest.raises(ValueError) as err:
        SimWorld(**kw)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_a_bad_type_key_on_the_command_line_is_one_line(capsys):
    from trace_gym.cli import main

    code = main(["bench", "--sim", "type_shares=0.6,0.5", "type_means=0.1,0.8", "type_concentrations=2,2",
                 "pool_size=300", "candidates=50"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "type_shares" in err[0] and "1.1" in err[0], err


def test_calibration_sets_types_only_where_the_bank_has_kinds():
    from trace_gym.sim.calibrate import calibration, sim_overrides

    apart = ((0.6, 0.4, 3.6), (0.4, 34.0, 6.0))  # means 0.1 and 0.85
    s, n = counts(apart, 1500, 16, seed=9)
    kinds = np.where(P.draw(apart, 1500, np.random.default_rng(9))[1] == 0, "hard", "easy").tolist()
    out = calibration(s, n, [], [], [], [3] * 10, group_size=4, kinds=kinds)
    assert out["fitted"]["kinds"] == ["easy", "hard"]  # by name
    overrides = sim_overrides(out)
    assert overrides["type_means"] == pytest.approx((0.85, 0.1), abs=0.02)
    assert overrides["type_shares"] == pytest.approx((0.4, 0.6), abs=0.03)
    SimWorld(group_size=4, **{k: v for k, v in overrides.items() if k.startswith("type_")})
    plain = calibration(s, n, [], [], [], [3] * 10, group_size=4, kinds=["one/kind"] * len(s))
    assert "type_shares" not in plain and plain["fitted"]["kinds"] == []
