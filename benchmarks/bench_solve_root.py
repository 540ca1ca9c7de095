"""Exact fast root allocation (``solve_root``) against the reference DP (``solve_root_dp``).

Instances: N candidate prompts with predicted success v ~ Beta(alpha, beta), default
Beta(2, 2) (a pool centred on mid difficulty with tails towards 0 and 1), seed 0, and a
root budget of two rollouts per candidate on average: (N=1024, B=2048), (N=8192, B=16384).
No per-prompt cap.

Timing: ``solve_root`` is the median of ``--repeats`` runs; the DP is the median of 3 runs
at the small size and a single run at the large one (tens of seconds: it costs
O(B * sum_i M_i) with M_i its exchange bound on useful rollouts per prompt, see
``solve_root_dp``). Both run in this process, one after the other.

Checks: both allocations feasible and with equal objective sum_i V_root (1e-12 relative).
Exit status 1 if the objectives differ or the speedup at the largest size is below 50x.

Usage: ``python benchmarks/bench_solve_root.py [--repeats 20] [--alpha 2 --beta 2] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trace_gym.allocation.allocators import root_utility, solve_root, solve_root_dp  # noqa: E402

SIZES = ((1024, 2048), (8192, 16384))
MIN_SPEEDUP = 50.0


def timed(fn, repeats: int):
    """(median seconds, last result) over ``repeats`` calls."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def feasible(m: np.ndarray, budget: int) -> bool:
    return int(m.sum()) == budget and not (m == 1).any() and bool((m >= 0).all())


def run_size(n: int, budget: int, args) -> dict:
    v = np.random.default_rng(args.seed).beta(args.alpha, args.beta, n)
    solve_root(v, budget)  # warm-up (imports, allocator caches)
    fast_s, fast = timed(lambda: solve_root(v, budget), args.repeats)
    dp_s, dp = timed(lambda: solve_root_dp(v, budget), 3 if n * budget <= 4_000_000 else 1)
    fast_value, dp_value = float(root_utility(v, fast).sum()), float(root_utility(v, dp).sum())
    equal = abs(fast_value - dp_value) <= 1e-12 * max(1.0, abs(dp_value))
    return {
        "n": n, "budget": budget, "fast_ms": 1e3 * fast_s, "dp_ms": 1e3 * dp_s,
        "speedup": dp_s / fast_s,
        "values_equal": bool(equal and feasible(fast, budget) and feasible(dp, budget)),
        "fast_value": fast_value, "dp_value": dp_value, "same_allocation": bool((fast == dp).all()),
        "prompts_started": int((fast > 0).sum()), "max_rollouts": int(fast.max()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="fast-path runs per size (median)")
    parser.add_argument("--alpha", type=float, default=2.0, help="Beta(alpha, beta) for predicted success")
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args()

    rows = [run_size(n, budget, args) for n, budget in SIZES]
    print(f"values ~ Beta({args.alpha:g}, {args.beta:g}), seed {args.seed}, no cap\n")
    print("| N | budget | fast ms | DP ms | speedup | values equal |")
    print("|---:|---:|---:|---:|---:|:---:|")
    for r in rows:
        print(f"| {r['n']} | {r['budget']} | {r['fast_ms']:.2f} | {r['dp_ms']:.0f} | "
              f"{r['speedup']:.0f}x | {'yes' if r['values_equal'] else 'NO'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"alpha": args.alpha, "beta": args.beta, "seed": args.seed, "rows": rows}, f, indent=2)

    failures = [f"N={r['n']}: objective {r['fast_value']!r} (fast) != {r['dp_value']!r} (DP)"
                for r in rows if not r["values_equal"]]
    if rows[-1]["speedup"] < MIN_SPEEDUP:
        failures.append(f"speedup {rows[-1]['speedup']:.1f}x at N={rows[-1]['n']} is below {MIN_SPEEDUP:g}x")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
