"""Cost of the MathPython kernel, in one run.

1. Per-cell overhead: a trivial cell in the persistent kernel against a fresh
   ``python -c`` subprocess per cell (bare, and importing numpy+sympy as the kernel
   has), medians over ``--cells`` runs.
2. Restore time against the number of replayed cells (1, 4, 16, 64): ``restore()``
   itself (lazy), then the first cell after it, which takes a kernel and replays the
   recorded cells: with the warm spare kernel ready (``prestart_kernel=True``) and cold.

Usage: ``python benchmarks/bench_math_kernel.py [--cells 30] [--repeats 3] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__))))

from environments.math_python.env import MathPythonEnv  # noqa: E402
from environments.math_python.sandbox import Kernel  # noqa: E402
from trace_gym.types import Task  # noqa: E402

TASK = Task(id="bench", prompt="Benchmark.", answer="0")
CELL = "acc = acc + 1 if 'acc' in dir() else 1"


def per_cell(n: int) -> dict:
    kernel = Kernel()
    kernel.start(0)
    kernel.wait_ready()
    kernel.execute(CELL)
    persistent = []
    for _ in range(n):
        t0 = time.perf_counter()
        assert kernel.execute(CELL).status == "ok"
        persistent.append(time.perf_counter() - t0)
    kernel.close()
    bare, imports = [], []
    for i in range(n):
        for bucket, src in ((bare, "acc = 1"), (imports, "import numpy, sympy; acc = 1")):
            if bucket is imports and i >= max(3, n // 5):
                continue  # ~0.6 s each: a few runs give a stable median
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", src], check=True)
            bucket.append(time.perf_counter() - t0)
    return {"persistent_kernel_ms": 1e3 * statistics.median(persistent),
            "fresh_python_c_ms": 1e3 * statistics.median(bare),
            "fresh_python_c_numpy_sympy_ms": 1e3 * statistics.median(imports)}


def restore_times(n_cells: int, repeats: int, warm: bool) -> dict:
    env = MathPythonEnv([TASK], max_turns=10**6, prestart_kernel=warm)
    env.reset(seed=0, options={"task": TASK})
    env.step("\n".join(f"```python\n{CELL}\n```" for _ in range(n_cells)))
    snap = env.snapshot()
    lazy, first = [], []
    for _ in range(repeats):
        if warm:
            env.step("```python\n1\n```")  # make sure the spare exists, then give it time to import
            time.sleep(1.5)
        t0 = time.perf_counter()
        env.restore(snap)
        t1 = time.perf_counter()
        obs, *_ = env.step("```python\nprint(acc)\n```")
        t2 = time.perf_counter()
        assert obs[0].content == f"```output\n{n_cells}\n```", obs[0].content
        lazy.append(t1 - t0)
        first.append(t2 - t1)
    env.close()
    return {"restore_ms": 1e3 * statistics.median(lazy), "first_cell_after_restore_ms": 1e3 * statistics.median(first)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=30, help="cells per per-cell measurement")
    parser.add_argument("--repeats", type=int, default=3, help="restores per replay length")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()

    overhead = per_cell(args.cells)
    rows = []
    for n in (1, 4, 16, 64):
        warm, cold = restore_times(n, args.repeats, True), restore_times(n, args.repeats, False)
        rows.append({"replayed_cells": n, "restore_ms": warm["restore_ms"],
                     "rebuild_warm_ms": warm["first_cell_after_restore_ms"],
                     "rebuild_cold_ms": cold["first_cell_after_restore_ms"]})

    print(f"## Per-cell overhead (median of {args.cells})\n")
    print("| executor | ms per cell |\n|---|---:|")
    print(f"| persistent kernel | {overhead['persistent_kernel_ms']:.2f} |")
    print(f"| fresh `python -c` | {overhead['fresh_python_c_ms']:.1f} |")
    print(f"| fresh `python -c` + numpy/sympy import | {overhead['fresh_python_c_numpy_sympy_ms']:.1f} |")
    print(f"\n## Restore vs replayed cells (median of {args.repeats})\n")
    print("| replayed cells | restore() ms | first cell after restore, warm spare ms | ... cold start ms |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['replayed_cells']} | {r['restore_ms']:.2f} | {r['rebuild_warm_ms']:.1f} | {r['rebuild_cold_ms']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"per_cell": overhead, "restore": rows}, f, indent=2)


if __name__ == "__main__":
    main()
