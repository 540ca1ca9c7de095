"""Common draws in the simulated bench: what they cost, and what they buy (a paired reading's correlation).

A bank bench's arms replay the same recorded rollouts for the same requests; ``common_draws=true`` gives
the simulator's arms the same (:mod:`trace_gym.sim.draws`), at the price of simulating branches one at a
time instead of vectorised over a tree. This runs one simulated bench twice, side by side in one process,
``common_draws`` false (the baseline: each arm its own stream) and true, and prints per arm the effective
ratio, per pair of arms the correlation of their per-repetition effective ratios and the standard
deviation of the paired difference, and the wall-clock seconds of each run.

Checks (PASS/FAIL, exit 1 on a FAIL): with common draws the mean correlation over the pairs rises by at
least ``--min-gain`` (0.15), and the run costs at most ``--max-cost`` (3x) the baseline's seconds.
``--plant own-streams`` gives each arm a common stream of its own (its seed offset by its name): the
correlation check must then FAIL.

Usage: ``python benchmarks/bench_common_draws.py [--seeds 30] [--plant own-streams]`` (about a minute here).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import zlib

import numpy as np

#: The bench both runs read: the default simulated world at a small shape (every strategy that continues).
SHAPE = dict(pool_size=1024, candidates=128, root_budget=64, steps=3, warmup_steps=0, oracle_upper_bound=False,
             strategies=("uniform", "pcl", "random_tree", "trace"))


def run(seeds: int, common: bool) -> tuple[dict, float]:
    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.bench.sim import run_sim_bench
    from trace_gym.strategies import shaped_strategies

    cfg = SimBenchConfig(seeds=seeds, common_draws=common, **SHAPE)
    strategies = shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                                   continuations_per_root=cfg.continuations_per_root)
    t0 = time.perf_counter()
    out = run_sim_bench(cfg, strategies)
    return out, time.perf_counter() - t0


def per_rep(result: dict) -> dict[str, np.ndarray]:
    return {n: np.array([r["effective_ratio"] for r in row["per_rep"]]) for n, row in result["strategies"].items()}


def plant_own_streams() -> None:
    """Each arm draws from a common stream of its own: the pairing common draws exist for is gone."""
    from trace_gym.bench import sim_source
    from trace_gym.sim.draws import CommonDraws

    original = sim_source.SimRepetition.predictor

    def predictor(self, arm):
        out = original(self, arm)
        if self.cfg.common_draws:
            self.common[arm.name] = CommonDraws(self.seed * 1000 + zlib.crc32(arm.name.encode()) % 997)
        return out

    sim_source.SimRepetition.predictor = predictor


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--min-gain", type=float, default=0.15)
    ap.add_argument("--max-cost", type=float, default=3.0)
    ap.add_argument("--plant", choices=("own-streams",), default=None)
    args = ap.parse_args(argv)
    if args.plant:
        plant_own_streams()
    (base, t_base), (common, t_common) = run(args.seeds, False), run(args.seeds, True)
    a, b = per_rep(base), per_rep(common)
    names = list(SHAPE["strategies"])
    print(f"Simulated bench, {args.seeds} repetitions, {SHAPE} (common draws: {args.plant or 'as shipped'})\n")
    print("| arm | effective ratio, own streams (baseline) | effective ratio, common draws |")
    print("|---|---:|---:|")
    for n in names:
        print(f"| {n} | {a[n].mean():.3f} | {b[n].mean():.3f} |")
    print("\n| pair | correlation, own streams | correlation, common draws | sd of the paired difference, own "
          "| sd, common |")
    print("|---|---:|---:|---:|---:|")
    gains = []
    for x, y in itertools.combinations(names, 2):
        ra, rb = (float(np.corrcoef(d[x], d[y])[0, 1]) for d in (a, b))
        gains.append((ra, rb))
        print(f"| {x} - {y} | {ra:.3f} | {rb:.3f} | {np.std(a[x] - a[y], ddof=1):.3f} | "
              f"{np.std(b[x] - b[y], ddof=1):.3f} |")
    before, after = (float(np.nanmean([g[i] for g in gains])) for i in (0, 1))
    print(f"\n| run | seconds |\n|---|---:|\n| own streams (baseline) | {t_base:.1f} |\n"
          f"| common draws | {t_common:.1f} |")
    checks = [(f"mean correlation rises by >= {args.min_gain} ({before:.3f} -> {after:.3f})",
               after - before >= args.min_gain),
              (f"common draws cost <= {args.max_cost}x the baseline ({t_common / t_base:.2f}x)",
               t_common <= args.max_cost * t_base)]
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}: {label}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
