"""``trace-gym bench --sim``: the simulated allocation benchmark (its mode, run and report title).

The source is :mod:`trace_gym.bench.sim_source` (a seeded task pool per repetition, every arm on
the one step driver); ``calibrate_from=BANK`` first fits the simulator to a bank
(:mod:`trace_gym.bench.sim_calibration`).
"""

from __future__ import annotations

from typing import Any, Mapping

from trace_gym.allocation.strategy import Strategy
from trace_gym.bench.config import SimBenchConfig
from trace_gym.bench.loop import run_bench
from trace_gym.bench.modes import BenchMode
from trace_gym.bench.sim_calibration import calibrated
from trace_gym.bench.sim_fit import RecordedShape
from trace_gym.bench.sim_source import SimRepetition, SimSource, sim_task, sim_world, warmup_count

__all__ = ["MODE", "SimRepetition", "SimSource", "calibrated", "intro", "run_sim_bench", "sim_task", "sim_world",
           "warmup_count"]


def run_sim_bench(cfg: SimBenchConfig, strategies: Mapping[str, Strategy], *, progress: bool = False,
                  say: Any = None, out_dir: str | None = None) -> dict[str, Any]:
    """Run the simulated allocation benchmark (:func:`~trace_gym.bench.loop.run_bench` over a
    :class:`SimSource`); returns JSON-ready results. With ``cfg.calibrate_from`` the
    simulator is first calibrated to that bank (:func:`calibrated`; ``results["calibration"]``)."""
    calibration, shape = None, RecordedShape()
    if cfg.calibrate_from:
        cfg, calibration = calibrated(cfg, {k: strategies[k] for k in ("uniform", "random_tree") if k in strategies})
        shape = RecordedShape(**calibration["recorded_shape"])
    results = run_bench(SimSource(cfg, shape), strategies, progress=progress)
    if calibration is not None:
        results["calibration"] = calibration
    return results


def intro(results: Mapping[str, Any]) -> list[str]:
    """The report's title and description of a simulated bench."""
    from trace_gym.bench.report import applies_to, budget_note, interval_note

    cfg = results["config"]
    measured = f"{cfg['seeds']} seeds x {cfg['steps'] - cfg['warmup_steps']} measured steps"
    return [f"## Simulated allocation benchmark ({measured}; {results['seconds']:.1f} s)", "",
            f"Budget per step: {budget_note(results)}, M = {cfg['root_budget']}, N = {cfg['continuations_per_root']}; "
            f"{cfg['candidates']} candidates per step; group size {cfg['group_size']} ({applies_to(results)}). "
            f"Headline predictor: {cfg['predictor']} (task feature Spearman {cfg['feature_spearman']:g}, prefix share "
            f"{100 * cfg['prefix_share']:.0f} %); rows marked 'upper bound' use the oracle. Per-step means; "
            f"effective ratio: {interval_note(results)}."]


MODE = BenchMode("sim", SimBenchConfig, run_sim_bench, intro, "use the simulator (no model needed)",
                 columns=(("Spearman prefix", "prefix_spearman"),), verdict_label="simulated")
