"""Time every phase of the main job (``make demo``), so the next change that slows it is seen.

Reads the ``demo`` (or ``--target demo-full``) recipe from the Makefile, runs each command
as ``make`` would (``$(BIN)`` is the venv's bin folder), and prints one row per phase:
its seconds, the baseline's seconds (``benchmarks/demo_baseline.json``: the last run
recorded on this machine kind, idle) and the ratio. Checks: the whole job within the
promise (10 minutes idle, ``--budget-s``), and no phase more than 1.5x its baseline.
``--busy`` starts a second busy process (a numpy matmul loop at its default threads) for the
whole run, as a researcher's box beside other work; the promise there is 20 minutes.
``--record`` writes this run as the new baseline.

The demo runs with a cache folder of its own (``TRACE_GYM_CACHE``: the pulled models
linked in, no calibration fit, no eval results) and no earlier ``runs/demo``, so each run
measures what a fresh clone pays; ``--warm`` uses the usual cache.

Usage: ``python benchmarks/bench_demo.py [--busy] [--record] [--target demo]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "benchmarks" / "demo_baseline.json"


def recipe(target: str) -> list[str]:
    """The commands of a Makefile target (prerequisite targets' commands first, ``install`` skipped)."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n)+)", text, re.M)
    if match is None:
        raise SystemExit(f"no target {target!r} in the Makefile")
    before = [t for t in match.group(1).split() if t != "install"]
    lines = [ln.strip() for ln in match.group(2).splitlines() if ln.strip()]
    return [c for t in before for c in recipe(t)] + lines


def busy_loop(stop) -> None:
    """A second busy process: numpy matmuls at its default thread count until ``stop`` is set."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((400, 400))
    while not stop.is_set():
        a = np.tanh(a @ a / 400)


def run_phase(command: str) -> float:
    bin_dir = str(ROOT / ".venv" / "bin")
    line = command.replace("$(BIN)", bin_dir)
    t0 = time.perf_counter()
    subprocess.run(line, shell=True, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def label(command: str) -> str:
    words = command.replace("$(BIN)/", "").split()
    keep = [w for w in words if not w.startswith("--json") and not w.startswith("runs/")]
    return " ".join(keep)[:90]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="demo")
    ap.add_argument("--busy", action="store_true", help="run beside a second busy process")
    ap.add_argument("--budget-s", type=float, default=None, help="the promise (default 600 s idle, 1200 s busy)")
    ap.add_argument("--record", action="store_true", help="write this run as the baseline")
    ap.add_argument("--warm", action="store_true", help="keep the demo's caches (calibration fit, eval results)")
    args = ap.parse_args(argv)
    budget = args.budget_s or (1200.0 if args.busy else 600.0)
    if not args.warm:  # a cache of its own (the pulled models linked in), and no earlier demo run
        real = Path(os.environ.get("TRACE_GYM_CACHE", Path.home() / ".cache" / "trace_gym"))
        fresh = Path(tempfile.mkdtemp(prefix="bench_demo_cache_"))
        (fresh / "models").symlink_to(real / "models")
        os.environ["TRACE_GYM_CACHE"] = str(fresh)
        shutil.rmtree(ROOT / "runs" / "demo", ignore_errors=True)
    stop = multiprocessing.Event()
    helper = multiprocessing.Process(target=busy_loop, args=(stop,)) if args.busy else None
    if helper:
        helper.start()
    rows, total = [], 0.0
    try:
        for command in recipe(args.target):
            seconds = run_phase(command)
            total += seconds
            rows.append((label(command), seconds))
            print(f"{seconds:7.1f} s  {label(command)}", file=sys.stderr, flush=True)
    finally:
        if helper:
            stop.set()
            helper.join()
    key = f"{args.target}{'-busy' if args.busy else ''}"
    base = json.loads(BASELINE.read_text()).get(key, {}) if BASELINE.exists() else {}
    print(f"## make {args.target}, phase by phase ({'beside a busy process' if args.busy else 'idle'}; "
          f"load before: {os.getloadavg()[0]:.2f})\n")
    print("| phase | seconds | baseline | ratio |\n|---|---:|---:|---:|")
    slow = []
    for name, seconds in rows:
        was = base.get(name)
        ratio = seconds / was if was else float("nan")
        if was and ratio > 1.5:
            slow.append(name)
        print(f"| `{name}` | {seconds:.0f} | {was:.0f} | {ratio:.2f} |" if was else f"| `{name}` | {seconds:.0f} | - | - |")
    print(f"| **total** | **{total:.0f}** | {sum(base.values()):.0f} | |" if base else f"| **total** | **{total:.0f}** | | |")
    checks = [("PASS" if total <= budget else "FAIL", f"make {args.target} within {budget:.0f} s ({total:.0f} s)"),
              ("SKIP" if not any(base.get(name) for name, _ in rows) else "PASS" if not slow else "FAIL",
               "no phase over 1.5x its baseline" + (f" (slower: {', '.join(slow)})" if slow else "")
               + ("" if any(base.get(name) for name, _ in rows) else f" (no baseline recorded for {key!r})"))]
    print("\n" + "\n".join(f"{s}: {d}" for s, d in checks))
    if args.record:
        data = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
        data[key] = {name: round(seconds, 1) for name, seconds in rows}
        BASELINE.write_text(json.dumps(data, indent=1) + "\n")
    return 0 if all(s in ("PASS", "SKIP") for s, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
