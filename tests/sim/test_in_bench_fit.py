"""The calibrated simulator's choices made in the bench (trace_gym/bench/in_bench_fit.py, fit version 11)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest


def test_a_measure_the_bank_leaves_undefined_does_not_decide():
    """A bank predictor that reads every prompt alike has no Spearman (NaN): the choice reads Brier and AUC
    alone, where a NaN in the sum would have made every candidate as near as every other (the first)."""
    from trace_gym.bench.in_bench_fit import choose_in_bench

    bank = {"selection_precision": 0.40, "brier": 0.13, "mixed_auc": 0.50, "prompt_spearman": math.nan}
    readings = [{"selection_precision": 0.40, "brier": 0.20, "mixed_auc": 0.60, "prompt_spearman": 0.0},
                {"selection_precision": 0.41, "brier": 0.13, "mixed_auc": 0.51, "prompt_spearman": 0.3}]
    assert choose_in_bench(bank, readings) == 1


def _fit(typed: bool) -> dict:
    grid = [{"feature_spearman": s, "shift": 0.1 * s, "selection_precision": 0.2} for s in (0.0, 0.5, 1.0)]
    fit = {"grid": grid, "visibility_grid": [{"type_visibility": 1.0, "feature_spearman": 0.0,
                                              "predictor_level_shift": 0.3}] if typed else []}
    return {"predictor_fit": fit, **({"type_shares": (0.5, 0.5)} if typed else {})}


def test_the_candidates_read_in_the_bench_follow_the_world_and_the_bank_predictor():
    """Task types: the visibility grid. One type, a bank predictor that ranks prompts: the feature grid, each
    row with its level-matching shift. One type, a bank predictor that reads every prompt alike: none (the
    start-of-step fit stands: there is no feature to match)."""
    from trace_gym.bench.in_bench_fit import _candidates

    ranks = {"prompt_spearman": 0.24}
    flat = {"prompt_spearman": math.nan}
    assert [r["type_visibility"] for r in _candidates(_fit(True), ranks)] == [1.0]
    rows = _candidates(_fit(False), ranks)
    assert [(r["feature_spearman"], r["predictor_level_shift"]) for r in rows] == [(0.0, 0.0), (0.5, 0.05), (1.0, 0.1)]
    assert _candidates(_fit(False), flat) == []


def test_bracketed_meets_the_target_on_the_line_between_the_first_pair_around_it():
    """Hand-computed: between (0.90, 0.653) and (0.95, 0.757) the picks 0.746 lie at 0.90 + 0.093 / 0.104 * 0.05.
    A target no pair brackets, or a flat pair, gives None; a target equal to a reading gives its feature."""
    from trace_gym.bench.in_bench_fit import bracketed

    xs, ys = [0.85, 0.90, 0.95, 1.0], [0.575, 0.653, 0.757, 0.790]
    assert bracketed(xs, ys, 0.746) == pytest.approx(0.90 + 0.093 / 0.104 * 0.05)
    assert bracketed(xs, ys, 0.653) == pytest.approx(0.90)
    assert bracketed(xs, ys, 0.80) is None and bracketed(xs, ys, 0.50) is None
    assert bracketed([0.1, 0.2], [0.3, 0.3], 0.3) is None
    assert bracketed([0.1, 0.2, 0.3], [0.5, 0.3, 0.4], 0.35) == pytest.approx(0.175)  # falling pair: the first


def test_the_resolve_reads_the_chosen_feature_and_the_one_between_the_bracketing_grid_readings():
    """A reading whose picks climb steeply between two grid points (the deep bank's, fit 13): the re-solve
    reads the chosen feature (0.94, off the grid), the grid within 0.1 of it, then the interpolated
    feature, and keeps the nearest to the bank's picks with its own shift, where the grid's nearest was
    0.011 off."""
    from trace_gym.bench.in_bench_fit import _resolve_feature

    def picks(x: float) -> float:
        return float(np.interp(x, [0.85, 0.90, 0.95, 1.0], [0.575, 0.653, 0.757, 0.790]))

    asked = []

    def read(knobs, bank_q, seeds):
        asked.append(knobs["feature_spearman"])
        return {}, {"selection_precision": picks(knobs["feature_spearman"]), "predictor_level_shift": -knobs[
            "feature_spearman"]}

    found = {"feature_spearman": 0.94, "predictor_fit": {}}
    reading = _resolve_feature(read, {"type_visibility": 0.0}, found, {"selection_precision": 0.746})
    assert asked[:5] == [0.85, 0.9, 0.94, 0.95, 1.0] and len(asked) == 6
    assert found["feature_spearman"] == asked[-1] == pytest.approx(0.945)
    assert reading["selection_precision"] == pytest.approx(picks(0.945))
    assert abs(reading["selection_precision"] - 0.746) < abs(picks(0.95) - 0.746)
    assert found["predictor_level_shift"] == pytest.approx(-0.945)
    assert set(found["predictor_fit"]["picks_scan"]) == {"0.85", "0.9", "0.94", "0.945", "0.95", "1"}


def test_the_prefix_reading_rises_as_the_signal_sharpens():
    """The random tree arm's prefix Spearman (read as the bench reads it) in a simulator whose prefix
    signal is sharp (noise 0.25) against one whose signal is all but noise (64): the sharp one reads the
    prefixes' values better. Same pool, candidates and draws otherwise."""
    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.bench.in_bench import arm_prefix_spearman
    from trace_gym.bench.sim import SimSource
    from trace_gym.strategies import shaped_strategies

    tree = shaped_strategies(["random_tree"], group_size=4, continuations_per_root=2)["random_tree"]
    cfg = SimBenchConfig(seeds=3, steps=2, warmup_steps=0, pool_size=400, candidates=16, root_budget=16, group_size=4,
                         warmup_prompts=32, oracle_upper_bound=False, feature_spearman=0.0, target_mixed=0.5,
                         mean_success=0.4, step_concentration=1.5, min_turns=3, max_turns=3)
    sharp, blind = (arm_prefix_spearman(SimSource(dataclasses.replace(cfg, signal_noise=s)), tree)
                    for s in (0.25, 64.0))
    assert np.isfinite(sharp) and np.isfinite(blind)
    assert sharp > blind + 0.2


@pytest.mark.parametrize("bad", [-1.0, math.inf])
def test_a_bad_signal_noise_is_one_line(bad):
    from trace_gym.sim.simulator import SimWorld

    with pytest.raises(ValueError, match=f"signal_noise must be a finite number >= 0, got {bad!r}"):
        SimWorld(signal_noise=bad)


def test_a_calibration_with_both_reference_arms_matches_the_level_and_the_prefix_reading_in_the_bench(tmp_path,
                                                                                                     monkeypatch):
    """``calibrate_from`` with the uniform and random tree strategies among the arms: the simulated
    predictor's in-bench level error is the bank bench's (its shift solved there; where the feature is solved
    again, both on the re-solve's own repetitions), the signal noise is
    the one of the grid whose prefix reading lies nearest the bank's, and both are what the simulated
    bench runs with."""
    from bank_fixtures import write_synthetic_bank

    from trace_gym.bench import in_bench_fit
    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.bench.sim_calibration import calibrated
    from trace_gym.strategies import shaped_strategies

    for name, value in (("SIGNAL_GRID", (64.0, 4.0, 1.0, 0.25)), ("IN_BENCH_SIM_SEEDS", 6), ("PREFIX_BANK_SEEDS", 6),
                        ("RESOLVE_BANK_SEEDS", 8), ("RESOLVE_SIM_SEEDS", 12)):
        monkeypatch.setattr(in_bench_fit, name, value)  # the grid and the repetitions cut to a test's time
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", [1, 3, 5, 7, 0, 8, 2, 6] * 5, roots=8, continuations=4)
    refs = shaped_strategies(["uniform", "random_tree"], group_size=4, continuations_per_root=2)
    small = dict(candidates=16, root_budget=8, pool_size=400, steps=2, warmup_steps=0, group_size=4)
    cfg, info = calibrated(SimBenchConfig(calibrate_from=str(path), **small), refs)
    bench = info["in_bench"]
    assert bench["simulated"]["level_error"] == pytest.approx(bench["bank"]["level_error"], abs=1e-6)
    assert cfg.predictor_level_shift == pytest.approx(bench["simulated"]["predictor_level_shift"])
    scan = info["predictor_fit"]["picks_scan"]  # a predictor that reads the feature: solved again at that level
    start = info["predictor_fit"]["reached"]  # (the chosen start-of-step fit's own reading)
    assert cfg.feature_spearman > 0 and 2 <= len(scan) <= 7 and start
    assert max(float(x) for x in scan) - min(float(x) for x in scan) <= 0.2 + 1e-9
    nearest = min(scan, key=lambda x: abs(scan[x] - bench["bank"]["selection_precision"]))
    assert bench["simulated"]["selection_precision"] == scan[nearest]
    assert cfg.feature_spearman == pytest.approx(float(nearest))
    assert (bench["repetitions"], bench["sim_repetitions"]) == (8, 12)  # the re-solve's finer readings
    prefix = info["prefix_in_bench"]
    readings = {float(k): v for k, v in prefix["simulated"].items()}
    assert sorted(readings) == [0.25, 1.0, 4.0, 64.0] and all(np.isfinite(r) for r in readings.values())
    nearest = min(readings.values(), key=lambda r: abs(r - prefix["bank"]))
    assert readings[prefix["signal_noise"]] == nearest and cfg.signal_noise == prefix["signal_noise"]
    assert "signal_noise" in info["spearman_note"]
