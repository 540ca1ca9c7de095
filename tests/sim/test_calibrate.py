"""Calibrating the simulator from bank-like counts: the fits recover known truth on
brute-force simulated martingales, hand values, and clear errors on degenerate banks."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.sim import calibrate
from trace_gym.sim import simulator as sim


def simulated_bank(a, b, kappa, *, prompts=3000, roots=8, continuations=4, turns=4, seed=0):
    """Counts a bank of the simulator's own world would hold, by brute force: per prompt p ~
    Beta(a, b); each root walks V_t by beta splitting; from each non-final prefix of each
    root, ``continuations`` fresh walks to the end; a flip is a continuation whose outcome
    differs from its root's."""
    rng = np.random.default_rng(seed)

    def walk(v, start):
        v = np.array(v, dtype=float)
        for _ in range(start, turns - 1):  # V_{t+1} for t + 1 < T
            inner = (v > 0) & (v < 1)
            v[inner] = rng.beta(kappa * v[inner], kappa * (1 - v[inner]))
        return (rng.random(v.shape) < v).astype(int)

    p = rng.beta(a, b, size=prompts)
    successes = np.zeros(prompts, dtype=int)
    flips = np.zeros(turns, dtype=int)
    trials = np.zeros(turns, dtype=int)
    for j in range(roots):
        path = [p.copy()]
        for _ in range(1, turns):
            v = path[-1].copy()
            inner = (v > 0) & (v < 1)
            v[inner] = rng.beta(kappa * v[inner], kappa * (1 - v[inner]))
            path.append(v)
        outcome = (rng.random(prompts) < path[-1]).astype(int)
        successes += outcome
        for t in range(1, turns):
            for _ in range(continuations):
                cont = walk(path[t], t)
                flips[t] += int((cont != outcome).sum())
                trials[t] += prompts
    return successes, np.full(prompts, roots), np.arange(1, turns), flips[1:], trials[1:]


def test_beta_from_counts_recovers_the_prior():
    rng = np.random.default_rng(1)
    p = rng.beta(0.6, 1.4, size=20_000)
    s = rng.binomial(8, p)
    a, b = calibrate.beta_from_counts(s, np.full(p.size, 8))
    assert a / (a + b) == pytest.approx(0.3, abs=0.01)
    assert a + b == pytest.approx(2.0, rel=0.1)


def test_beta_from_counts_hand_value_and_bounds():
    # two prompts, R = 2: rates 0 and 1: mean 0.5, var(ddof=1) = 0.5, rho = (2 * 0.5 / 0.25 - 1) / 1 = 3 -> clipped
    a, b = calibrate.beta_from_counts([0, 2], [2, 2])
    assert a == b == pytest.approx(calibrate.CONCENTRATION_BOUNDS[0] / 2)
    # equal rates: no spread beyond binomial noise -> the upper bound
    a, b = calibrate.beta_from_counts([4, 4, 4, 4], [8, 8, 8, 8])
    assert a + b == pytest.approx(calibrate.CONCENTRATION_BOUNDS[1])
    with pytest.raises(ValueError, match="every recorded root failed"):
        calibrate.beta_from_counts([0, 0, 0], [4, 4, 4])
    with pytest.raises(ValueError, match=">= 2 recorded roots"):
        calibrate.beta_from_counts([0, 1], [1, 4])


@pytest.mark.parametrize("kappa", [1.0, 3.0, 10.0])
def test_concentration_from_flips_recovers_kappa_of_a_simulated_bank(kappa):
    s, r, depths, flips, trials = simulated_bank(0.8, 0.8, kappa, prompts=3000, seed=int(kappa))
    prior = calibrate.beta_from_counts(s, r)
    fitted = calibrate.concentration_from_flips(depths, flips, trials, prior)
    ratio = kappa / (kappa + 1)
    assert fitted / (fitted + 1) == pytest.approx(ratio, abs=0.03)  # r = 0.5, 0.75, 0.91: far apart


def test_calibration_round_trips_through_the_simulators_prior():
    s, r, depths, flips, trials = simulated_bank(1.2, 0.8, 3.0, prompts=3000, seed=5)
    out = calibrate.calibration(s, r, depths, flips, trials, [4] * 10, group_size=8, learned_spearman=0.4)
    assert out["mean_success"] == pytest.approx(0.6, abs=0.02)
    assert out["target_mixed"] == pytest.approx(sim.mixed_probability(1.2, 0.8, 8), abs=0.03)
    assert out["step_concentration"] == pytest.approx(3.0, rel=0.35)
    assert (out["min_turns"], out["max_turns"], out["feature_spearman"]) == (4, 4, 0.4)
    # the simulator accepts the settings: its calibrated prior reproduces the fitted one
    world = sim.SimWorld(target_mixed=out["target_mixed"], mean_success=out["mean_success"], group_size=8)
    a, b = world.prior()
    assert a / (a + b) == pytest.approx(out["fitted"]["a"] / out["fitted"]["concentration"], rel=1e-6)
    assert a + b == pytest.approx(out["fitted"]["concentration"], rel=1e-3)
    assert set(calibrate.sim_overrides(out)) == {"mean_success", "target_mixed", "step_concentration", "min_turns",
                                                 "max_turns", "feature_spearman"}
    # a bank's recorded shape brings its prefix cap (none: every prefix, 0)
    capped = calibrate.sim_overrides(out | {"recorded_shape": {"roots": 8, "continuations": 4, "prefixes_per_root": 2}})
    assert capped["prefixes_per_root"] == 2
    uncapped = out | {"recorded_shape": {"roots": 8, "continuations": 4, "prefixes_per_root": None}}
    assert calibrate.sim_overrides(uncapped)["prefixes_per_root"] == 0


def test_flips_under_lengths_that_ignore_the_outcome_are_the_closed_form():
    """Equal histograms: W_t = V_t, so flip(t) = E[2 V_t (1 - V_t)] = 2 E[p (1 - p)] r^t whatever the
    lengths and the depths kept (a = 1, b = 3: 2 E[p (1 - p)] = 2 * 3 / (4 * 5) = 0.3)."""
    from trace_gym.sim.lengths import LengthModel

    model = LengthModel.of(1, 4, (0.1, 0.2, 0.3, 0.4))
    kept = {1: [], 2: [1], 3: [1, 2], 4: [1, 3]}
    got = calibrate.flips_under_lengths(0.6, [1, 2, 3], (1.0, 3.0), model, kept)
    assert got == pytest.approx([0.3 * 0.6, 0.3 * 0.36, 0.3 * 0.216], rel=0.02)
    assert np.isnan(calibrate.flips_under_lengths(0.6, [3], (1.0, 3.0), model, {4: [1]})).all()  # no root keeps 3


def simulated_flips(world: sim.SimWorld, prompts: int = 1500) -> tuple[list[int], list[int], list[int]]:
    """``(depths, flips, continuations)`` of a bank grown by the simulator itself in ``world`` (8 roots, 4
    continuations at up to 2 prefixes per root, as the warm-up grows one): a flip is a continuation whose
    outcome differs from its root's."""
    from trace_gym.bench.sim_fit import RecordedShape, warmup_batches

    pool = sim.make_pool(world, prompts, np.random.default_rng(0))
    flips: dict[int, list[int]] = {}
    for _, step in warmup_batches(pool, world, range(prompts), RecordedShape(8, 4, 2), seed=1):
        for tree in step.trees:
            for branch in tree.branches:
                if branch.is_continuation:
                    root = tree.node(tree.branch_leaf(tree.nodes[branch.anchor].branch)).reward
                    f = flips.setdefault(tree.nodes[branch.anchor].depth, [0, 0])
                    f[0] += tree.node(tree.branch_leaf(branch.id)).reward != root
                    f[1] += 1
    depths = sorted(flips)
    return depths, [flips[d][0] for d in depths], [flips[d][1] for d in depths]


def test_kappa_under_lengths_is_recovered_from_a_simulated_bank():
    """A bank grown by the simulator itself (kappa 3, failed episodes short, successful ones long; 8
    roots, 4 continuations at up to 2 prefixes per root): the fit under the lengths finds kappa again,
    where the closed form (which reads every flip as the value path's) does not."""
    from trace_gym.banks.record import prefix_depths

    world = sim.SimWorld(target_mixed=0.45, mean_success=0.5, group_size=4, min_turns=1, max_turns=4,
                         step_concentration=3.0, turn_shares=(0.6, 0.2, 0.1, 0.1),
                         success_turn_shares=(0.1, 0.1, 0.2, 0.6))
    depths, counts, trials = simulated_flips(world)
    kept = {n: prefix_depths(n, 2) for n in range(1, 5)}
    kappa = calibrate.concentration_under_lengths(depths, counts, trials, world.prior(), world.length_model(), kept)
    assert kappa / (kappa + 1) == pytest.approx(0.75, abs=0.03)
    closed = calibrate.concentration_from_flips(depths, counts, trials, world.prior())
    assert closed / (closed + 1) < 0.7


LENGTHS = dict(min_turns=1, max_turns=3, turn_shares=(0.2, 0.5, 0.3), success_turn_shares=(0.1, 0.3, 0.6))


def test_each_types_kappa_is_recovered_from_its_own_kinds_flips():
    """Flip counts drawn as the model says for two types of known kappa (0.5 and 20) give each its own back;
    a kind no continuation was recorded for takes the fallback."""
    from trace_gym.sim.calibrate import flips_under_lengths, type_kappas
    from trace_gym.sim.lengths import LengthModel

    model = LengthModel.of(*[LENGTHS[k] for k in ("min_turns", "max_turns", "turn_shares", "success_turn_shares")])
    kept = {n: list(range(1, n)) for n in (1, 2, 3)}
    prior, truth, n = ((0.5, 2.0, 4.0), (0.5, 6.0, 2.0)), (0.5, 20.0), 200_000
    counts = {}
    for name, (_, a, b), k in zip(("hard", "easy"), prior, truth):
        rates = flips_under_lengths(k / (k + 1), [1, 2], ((1.0, a, b),), model, kept)
        counts[name] = {str(d): [int(np.random.default_rng(d).binomial(n, q)), n] for d, q in zip((1, 2), rates)}
    assert type_kappas(counts, ["hard", "easy"], prior, model, kept, 3.0) == pytest.approx(truth, rel=0.05)
    assert type_kappas({"hard": counts["hard"]}, ["hard", "easy"], prior, model, kept, 3.0)[1] == 3.0


def test_the_simulator_flips_each_type_at_its_own_kappa():
    """Trees grown as a bank records them (8 roots, 4 continuations at every prefix) in a world of two
    types of kappa 0.3 and 30: each type's flips at depth 1 are the model's for its own kappa (within
    4 standard errors), and far apart from each other."""
    from trace_gym.bench.sim_fit import RecordedShape, warmup_batches
    from trace_gym.sim.calibrate import flips_under_lengths
    from trace_gym.tree import prefix_depths

    kappas = (0.3, 30.0)
    world = sim.SimWorld(type_shares=(0.5, 0.5), type_means=(0.3, 0.7), type_concentrations=(4.0, 4.0),
                         type_step_concentrations=kappas, **LENGTHS)
    pool = sim.make_pool(world, 1200, np.random.default_rng(1))
    counts = {0: [0, 0], 1: [0, 0]}
    for _, step in warmup_batches(pool, world, range(len(pool)), RecordedShape(8, 4), seed=2):
        for tree in step.trees:
            kind = int(pool.types[tree.nodes[0].snapshot.task])
            for b in tree.branches:
                if b.is_continuation and tree.nodes[b.anchor].depth == 1:
                    root = tree.nodes[b.anchor].branch
                    counts[kind][0] += tree.nodes[tree.branch_leaf(b.id)].success != \
                        tree.nodes[tree.branch_leaf(root)].success
                    counts[kind][1] += 1
    model = world.length_model()
    kept = {n: prefix_depths(n, None) for n in (1, 2, 3)}
    rates = []
    for kind, (_, a, b) in enumerate(world.difficulty()):
        want = flips_under_lengths(kappas[kind] / (kappas[kind] + 1), [1], ((1.0, a, b),), model, kept)[0]
        flips, n = counts[kind]
        assert abs(flips / n - want) < 4 * np.sqrt(want * (1 - want) / n), (kind, flips / n, want)
        rates.append(flips / n)
    assert rates[1] > 2 * rates[0]


@pytest.mark.parametrize("kw, said", [
    (dict(type_step_concentrations=(1.0,)), "one value per type (2), got 1"),
    (dict(type_step_concentrations=(1.0, -2.0)), "finite and > 0, got -2.0"),
])
def test_a_bad_type_kappa_is_one_line(kw, said):
    types = dict(type_shares=(0.5, 0.5), type_means=(0.3, 0.7), type_concentrations=(4.0, 4.0))
    with pytest.raises(ValueError) as err:
        sim.SimWorld(**types, **kw)
    assert said in str(err.value) and "\n" not in str(err.value)


def tilted_roots(tilt: float, prompts: int = 300, roots: int = 8, seed: int = 0) -> np.ndarray:
    """Each prompt's roots by outcome and length (shape (prompts, 2, 4)) drawn as the model says:
    p ~ Beta(1.5, 6), y ~ Bernoulli(p), the length from the failed histogram or the task's tilted one."""
    from trace_gym.sim.lengths import LengthModel

    model = LengthModel.of(1, 4, (0, 0, 0, 1), (0.4, 0.25, 0.2, 0.15), tilt=tilt, pivot=1.5 / 7.5)
    rng = np.random.default_rng(seed)
    out = np.zeros((prompts, 2, 4))
    for i, p in enumerate(rng.beta(1.5, 6.0, size=prompts)):
        y = (rng.random(roots) < p).astype(float)
        lengths = model.at(p).draw(y, np.zeros(roots, dtype=int), rng)
        np.add.at(out[i], (y.astype(int), lengths - 1), 1)
    return out


def test_the_success_tilt_is_recovered_and_kept_only_when_the_roots_pay_for_it():
    """Roots drawn with gamma 1 give gamma near 1 back (its shares near the truth at the pivot) and keep it
    (BIC); roots drawn with gamma 0 do not pay for one (the roots' own histogram, tilt 0)."""
    prior = ((1.0, 1.5, 6.0),)
    fit = calibrate.success_tilt(tilted_roots(1.0), prior, 0.2)
    assert fit["kept"] and fit["tilt"] == pytest.approx(1.0, abs=0.35) and fit["gain"] > fit["threshold"]
    assert fit["shares"] == pytest.approx((0.4, 0.25, 0.2, 0.15), abs=0.08)
    counts = tilted_roots(0.0, seed=1)
    flat = calibrate.success_tilt(counts, prior, 0.2)
    wins = counts[:, 1].sum(axis=0)
    assert not flat["kept"] and flat["tilt"] == 0.0 and flat["shares"] == pytest.approx(wins / wins.sum())
    # one successful length: nothing to tilt; a bad shape is one line
    single = np.zeros((5, 2, 3))
    single[:, 1, 2] = 1
    assert calibrate.success_tilt(single, prior, 0.2)["kept"] is False
    with pytest.raises(ValueError, match=r"counts must have shape \(prompts, 2, lengths\).*\(5, 3\)"):
        calibrate.success_tilt(np.zeros((5, 3)), prior, 0.2)


def test_kappa_under_a_tilt_is_recovered_from_a_simulated_bank():
    """As above, with successful lengths that move with p (gamma 3): the flips the fit expects read each
    sample's own tilted lengths, as the simulator's continuations do, so kappa comes back; the same
    lengths without the tilt expect flips the simulated bank does not show (depth 1: 0.202 against
    0.183, about 6 standard errors)."""
    import dataclasses

    from trace_gym.banks.record import prefix_depths

    world = sim.SimWorld(target_mixed=0.45, mean_success=0.3, group_size=4, min_turns=1, max_turns=4,
                         step_concentration=3.0, turn_shares=(0.6, 0.2, 0.1, 0.1),
                         success_turn_shares=(0.3, 0.2, 0.2, 0.3), success_turn_tilt=3.0)
    depths, counts, trials = simulated_flips(world)
    kept = {n: prefix_depths(n, 2) for n in range(1, 5)}
    kappa = calibrate.concentration_under_lengths(depths, counts, trials, world.prior(), world.length_model(), kept)
    assert kappa / (kappa + 1) == pytest.approx(0.75, abs=0.03)
    observed = counts[0] / trials[0]
    se = np.sqrt(observed * (1 - observed) / trials[0])
    flat = dataclasses.replace(world, success_turn_tilt=0.0).length_model()
    tilted_rate, flat_rate = (calibrate.flips_under_lengths(0.75, depths[:1], world.prior(), m, kept)[0]
                              for m in (world.length_model(), flat))
    assert abs(tilted_rate - observed) < 2 * se < 4 * se < abs(flat_rate - observed)


def test_on_the_guessing_bank_the_tilt_fitted_on_roots_predicts_its_last_turn_continuations():
    """Out of sample: the tilt is fitted on the shipped guessing bank's roots alone, and it predicts
    the bank's depth-3 continuations (one guess left), which succeed about 2 % of the time whatever
    their prompt's roots did. P(y = 1 | p, L > 3) at each root-win count's posterior mean p: with the
    tilt, within 3 standard errors of the bank's rate at every count of 0..4 wins; with the roots' one
    histogram (fit 11), 0.8 % at 0 wins against the bank's 1.8 %, and some count is off by more."""
    from pathlib import Path

    from trace_gym.banks import open_bank
    from trace_gym.bench.sim_calibration import root_length_counts
    from trace_gym.sim.lengths import LengthModel

    data = Path(__file__).resolve().parents[2] / "trace_gym" / "banks" / "data"
    bank = open_bank(data / "guess_number_smollm2.jsonl.gz")
    counts = root_length_counts(bank, 1, 4)
    wins, roots = counts[:, 1].sum(axis=1), counts.sum(axis=(1, 2))
    a, b = calibrate.beta_from_counts(wins.astype(int), roots.astype(int))
    tilt = calibrate.success_tilt(counts, ((1.0, a, b),), a / (a + b))
    assert tilt["kept"] and tilt["tilt"] > 0.3
    seen = np.zeros((5, 2))  # by root wins 0..4: depth-3 continuation successes, trials
    for k, record in zip(wins.astype(int), bank):
        if k <= 4:
            for r in range(len(record.roots)):
                prefix = record.prefix(r, 3)
                outcomes = [bool(c["success"]) for c in prefix["continuations"] if c["turns"]] if prefix else []
                seen[k] += (sum(outcomes), len(outcomes))
    rate = seen[:, 0] / seen[:, 1]
    se = np.sqrt(rate * (1 - rate) / seen[:, 1])
    tilted = LengthModel.of(1, 4, (0, 0, 0, 1), tilt["shares"], tilt["tilt"], a / (a + b))
    flat = LengthModel.of(1, 4, (0, 0, 0, 1), (counts[:, 1].sum(axis=0)))
    p = (a + np.arange(5)) / (a + b + 8)
    z = {name: (np.array([m.at(x).value(x, 3) for x in p]) - rate) / se for name, m in (("tilt", tilted),
                                                                                         ("flat", flat))}
    assert np.abs(z["tilt"]).max() < 3 < np.abs(z["flat"]).max()
