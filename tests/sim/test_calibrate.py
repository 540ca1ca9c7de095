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
