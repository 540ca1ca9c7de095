"""Step, snapshot and restore latency of the BFCL env, per category, in one run.

For each category it replays the ground-truth responses of ``--entries`` entries,
timing every ``step`` (decode + execute on the real backends + turn checks), every
``snapshot()`` (taken after each step) and a ``restore()`` of each snapshot. Prints a
markdown table of median and p90 in milliseconds; ``--json PATH`` also writes the numbers.

    python benchmarks/bench_bfcl_env.py --entries 50 --json bench_bfcl.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments.bfcl import data  # noqa: E402
from environments.bfcl.env import BFCLEnv  # noqa: E402
from trace_gym.report import markdown_table  # noqa: E402


def bench_category(category: str, entries: int, action_format: str) -> dict:
    env = BFCLEnv(category=category, action_format=action_format)
    step_ms, snap_ms, restore_ms, snap_kb = [], [], [], []
    for task in env.tasks[:entries]:
        actions = env.reference_actions(task)
        env.reset(options={"task": task})
        snaps = []
        for action in actions:
            t0 = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            t1 = time.perf_counter()
            snap = env.snapshot()
            t2 = time.perf_counter()
            step_ms.append(1e3 * (t1 - t0))
            snap_ms.append(1e3 * (t2 - t1))
            snap_kb.append(len(pickle.dumps(snap)) / 1024)
            snaps.append(snap)
            if terminated or truncated:
                break
        for snap in snaps:
            t0 = time.perf_counter()
            env.restore(snap)
            restore_ms.append(1e3 * (time.perf_counter() - t0))

    def stats(xs: list[float]) -> dict:
        return {"median": float(np.median(xs)), "p90": float(np.percentile(xs, 90)), "n": len(xs)}

    return {"step_ms": stats(step_ms), "snapshot_ms": stats(snap_ms), "restore_ms": stats(restore_ms), "snapshot_kb": stats(snap_kb)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=50, help="entries per category (max 200)")
    parser.add_argument("--categories", nargs="+", default=list(data.CATEGORIES), choices=data.CATEGORIES)
    parser.add_argument("--action-format", default="python", choices=["python", "tool_call"])
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)

    results = {c: bench_category(c, args.entries, args.action_format) for c in args.categories}
    rows = [
        [c, r["step_ms"]["n"],
         f"{r['step_ms']['median']:.3f}", f"{r['step_ms']['p90']:.3f}",
         f"{r['snapshot_ms']['median']:.3f}", f"{r['snapshot_ms']['p90']:.3f}",
         f"{r['restore_ms']['median']:.3f}", f"{r['restore_ms']['p90']:.3f}",
         f"{r['snapshot_kb']['median']:.1f}"]
        for c, r in results.items()
    ]
    headers = ["category", "steps", "step med ms", "step p90 ms", "snapshot med ms", "snapshot p90 ms",
               "restore med ms", "restore p90 ms", "snapshot KB (med)"]
    print(f"BFCL env latency, {args.entries} entries per category, ground-truth responses, {args.action_format} format\n")
    print(markdown_table(headers, rows))
    if args.json:
        args.json.write_text(json.dumps({"entries": args.entries, "action_format": args.action_format, "results": results}, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
