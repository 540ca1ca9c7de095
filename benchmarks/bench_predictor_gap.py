"""Why TRACE with a learned predictor falls short of TRACE with the oracle (simulator).

Baselines named: the oracle predictor (an upper bound, never a headline) and uniform
GRPO groups. Four tables, one run:

1. effective ratio of uniform / pcl / trace as the task feature a learned predictor
   sees gets more informative (prompt-level Spearman of the feature), beside the
   oracle bound;
2. the prefix samples' share of the predictor's batch weight (the paper: about 6 %;
   every non-leaf node weighted alike gives about 95 %);
3. Newton steps per predictor update (1 = one regression step per training step,
   as in the paper; 3 = near convergence);
4. the diagnosis: is the predictor miscalibrated, or is the allocation objective
   over-optimistic? For the learned predictor's allocation, the mixed-group
   probability it *expects* at the root (plug-in 1 - v^m - (1 - v)^m with predicted v)
   against the probability it *gets* (the same formula with the true p), beside the
   oracle's allocation, and the calibration slope of truth on prediction.

Usage: ``python benchmarks/bench_predictor_gap.py [--seeds 3] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

from trace_gym.bench import sim as bench_sim
from trace_gym.sim import simulator as sim
from trace_gym.sim import predictors as sim_predictors
from trace_gym.allocation.allocators import solve_root
from trace_gym.bench.config import SimBenchConfig
from trace_gym.step.driver import run_step
from trace_gym.report import markdown_table, pm
from trace_gym.strategies import shaped_strategies

NAMES = ("uniform", "pcl", "trace")


def effective_ratios(cfg: SimBenchConfig) -> dict[str, tuple[float, float]]:
    table = shaped_strategies(NAMES, group_size=cfg.group_size, continuations_per_root=cfg.continuations_per_root)
    res = bench_sim.run_sim_bench(cfg, table)
    return {n: (v["effective_ratio"], v["effective_ratio_ci"]) for n, v in res["strategies"].items()}


def diagnosis(cfg: SimBenchConfig, seeds: int) -> dict[str, float]:
    """Expected vs realised root mixed probability per chosen prompt, and calibration."""
    world = bench_sim.sim_world(cfg)
    trace = shaped_strategies(["trace"], group_size=cfg.group_size, continuations_per_root=2)["trace"]
    rows = []
    for seed in range(seeds):
        pool = sim.make_pool(world, cfg.pool_size, np.random.default_rng([seed, 0]))
        predictor = sim_predictors.LearnedPredictor(pool.features)
        rng = np.random.default_rng([seed, 2])
        for step in range(cfg.steps):  # train as the bench does: the one step, learning half included
            cands = np.random.default_rng([seed, 1, step]).choice(cfg.pool_size, cfg.candidates, replace=False)
            run_step(cands.tolist(), trace, predictor, sim.SimBranchRunner(pool, world, rng), cfg.nominal_budget, rng,
                     prefix_share=cfg.prefix_share)
        cands = np.random.default_rng([seed, 99]).choice(cfg.pool_size, cfg.candidates, replace=False)
        v = predictor.predict([sim.root_state(pool, t, world) for t in cands])
        p = pool.success[cands]
        m, m_oracle = solve_root(v, cfg.root_budget), solve_root(p, cfg.root_budget)

        def mixed(x, mm):
            chosen = mm > 0
            return float(np.mean(1 - x[chosen] ** mm[chosen] - (1 - x[chosen]) ** mm[chosen]))

        rows.append([mixed(v, m), mixed(p, m), mixed(p, m_oracle), float((m > 0).sum()),
                     float((m_oracle > 0).sum()), float(np.polyfit(v, p, 1)[0])])
    keys = ["expected_mixed", "realised_mixed", "oracle_mixed", "prompts", "oracle_prompts", "calibration_slope"]
    return dict(zip(keys, np.mean(rows, axis=0).tolist()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    base = SimBenchConfig(seeds=args.seeds, oracle_upper_bound=False)
    out: dict = {"feature_spearman": {}, "prefix_share": {}, "newton_steps": {}, "diagnosis": {}}

    print("## 1. Effective ratio vs how much a prompt tells the learned predictor\n")
    rows = []
    for fs in (0.6, 0.8, 0.9, 0.95):
        eff = effective_ratios(dataclasses.replace(base, feature_spearman=fs))
        out["feature_spearman"][fs] = eff
        rows.append([f"learned, feature Spearman {fs}", *[pm(*eff[n]) for n in NAMES],
                     f"{eff['trace'][0] / eff['uniform'][0]:.2f}x"])
    eff = effective_ratios(dataclasses.replace(base, predictor="oracle"))
    out["feature_spearman"]["oracle"] = eff
    rows.append(["oracle (upper bound)", *[pm(*eff[n]) for n in NAMES], f"{eff['trace'][0] / eff['uniform'][0]:.2f}x"])
    print(markdown_table(["predictor", *NAMES, "trace / uniform"], rows))

    print("\n## 2. Prefix samples' share of the predictor's batch weight (feature Spearman 0.8)\n")
    rows = []
    for share in (0.0, 0.06, 0.5, 0.95):
        eff = effective_ratios(dataclasses.replace(base, prefix_share=share))
        out["prefix_share"][share] = eff["trace"]
        rows.append([f"{100 * share:.0f} %", pm(*eff["trace"])])
    print(markdown_table(["prefix share", "trace effective ratio"], rows))

    print("\n## 3. Newton steps per predictor update (feature Spearman 0.8)\n")
    rows = []
    original = bench_sim.SimRepetition.predictor
    try:
        for steps in (1, 3, 10):
            def with_steps(self, arm, steps=steps):
                predictor = original(self, arm)
                if isinstance(predictor, sim_predictors.LearnedPredictor):
                    predictor.newton_steps = steps
                return predictor

            bench_sim.SimRepetition.predictor = with_steps
            eff = effective_ratios(base)
            out["newton_steps"][steps] = eff["trace"]
            rows.append([steps, pm(*eff["trace"])])
    finally:
        bench_sim.SimRepetition.predictor = original
    print(markdown_table(["Newton steps", "trace effective ratio"], rows))

    print("\n## 4. Diagnosis: calibration vs the plug-in objective (per chosen prompt, root groups only)\n")
    rows = []
    for fs in (0.6, 0.8, 0.9, 0.95):
        d = diagnosis(dataclasses.replace(base, feature_spearman=fs), args.seeds)
        out["diagnosis"][fs] = d
        rows.append([fs, d["calibration_slope"], d["expected_mixed"], d["realised_mixed"], d["oracle_mixed"],
                     d["prompts"], d["oracle_prompts"]])
    print(markdown_table(["feature Spearman", "calibration slope", "expected mixed (plug-in)", "realised mixed",
                          "oracle allocation", "prompts chosen", "oracle prompts"], rows))
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
