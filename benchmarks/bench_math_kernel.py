"""Cost of the MathPython kernel: today's fork server against the spawn path it replaced, in one run.

The baseline ("spawn") is the code of ``--baseline-commit`` (default ``dd7df32``, the last
commit before the fork server), loaded from git into a private package: one
``python _kernel_driver.py`` process per kernel, each importing numpy and sympy, plus a
warm spare per env, closed by a uid sweep that forks the host. Measured, medians:

1. a continuation's first step after ``restore``: a fresh env (``make_env``), ``reset``,
   ``restore`` of a snapshot holding ``--replay`` cells, then at once the first step,
   which needs a new kernel and replays the cells; the step is timed, ``restore`` (the
   fork server path forks the kernel there) and the whole;
2. 12 continuations started together: the same, in 12 threads at once; wall time
   until all 12 first steps are done;
3. closing a kernel from a host process holding >= 2 GiB (``--ballast-gib``);
4. one trivial cell in a live kernel.

Usage: ``python benchmarks/bench_math_kernel.py [--repeats 7] [--replay 2] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from environments.math_python.env import MathPythonEnv  # noqa: E402
from environments.math_python.sandbox import Kernel  # noqa: E402
from environments.math_python.zygote import ForkServer  # noqa: E402
from trace_gym.types import Task  # noqa: E402

TASK = Task(id="bench", prompt="Benchmark.", answer="0")
CELL = "acc = acc + 1 if 'acc' in dir() else 1"
GOALS = {"first_step_ms": 50.0, "twelve_s": 0.5, "close_ms": 10.0}


def load_baseline(commit: str):
    """Today's-path modules (env, sandbox) from ``commit``, as package ``baseline_math_python``."""
    tmp = tempfile.mkdtemp(prefix="bench_math_baseline_")
    pkg = os.path.join(tmp, "baseline_math_python")
    os.mkdir(pkg)
    for name in ("sandbox.py", "_kernel_driver.py", "env.py"):
        src = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:environments/math_python/{name}"],
                             check=True, capture_output=True, text=True).stdout
        src = src.replace("environments.math_python.sandbox", "baseline_math_python.sandbox")
        with open(os.path.join(pkg, name), "w") as f:
            f.write(src)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    sys.path.insert(0, tmp)
    import baseline_math_python.env as env
    import baseline_math_python.sandbox as sandbox

    return env.MathPythonEnv, sandbox.Kernel


def median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values)


def snapshot_with_cells(env_cls, n_cells: int):
    env = env_cls(max_turns=10**6)
    env.reset(seed=0, options={"task": TASK})
    env.step("\n".join(f"```python\n{CELL}\n```" for _ in range(n_cells)))
    snap = env.snapshot()
    env.close()
    return snap


def continuation(env_cls, snap, n_cells: int) -> tuple[float, float, float]:
    """(restore s, first step s, make_env + reset + restore + first step s) of one fresh
    continuation; the step follows restore at once (no generation time to hide work in)."""
    t0 = time.perf_counter()
    env = env_cls(max_turns=10**6)  # the default task pool, as make_env builds it
    env.reset(seed=0, options={"task": TASK})
    t1 = time.perf_counter()
    env.restore(snap)
    t2 = time.perf_counter()
    obs, *_ = env.step("```python\nprint(acc)\n```")
    t3 = time.perf_counter()
    assert obs[0].content == f"```output\n{n_cells}\n```", obs[0].content
    env.close()
    return t2 - t1, t3 - t2, t3 - t0


def first_steps(env_cls, n_cells: int, repeats: int) -> dict:
    snap = snapshot_with_cells(env_cls, n_cells)
    continuation(env_cls, snap, n_cells)  # warm-up (imports, the fork server)
    runs = [continuation(env_cls, snap, n_cells) for _ in range(repeats)]
    return {"restore_ms": median_ms([r[0] for r in runs]), "first_step_ms": median_ms([r[1] for r in runs]),
            "whole_ms": median_ms([r[2] for r in runs])}


def together(env_cls, n_cells: int, repeats: int, k: int = 12) -> float:
    """Median wall seconds for ``k`` continuations started at once to finish their first step."""
    snap = snapshot_with_cells(env_cls, n_cells)
    walls = []
    for _ in range(repeats):
        errors: list[BaseException] = []

        def one():
            try:
                continuation(env_cls, snap, n_cells)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(k)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        walls.append(time.perf_counter() - t0)
        if errors:
            raise errors[0]
    return statistics.median(walls)


def close_times(kernel_cls, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        kernel = kernel_cls()
        kernel.start(0)
        assert kernel.execute("print(1)").stdout.text() == "1\n"
        t0 = time.perf_counter()
        kernel.close()
        times.append(time.perf_counter() - t0)
    return median_ms(times)


def cell_times(kernel_cls, n: int) -> float:
    kernel = kernel_cls()
    kernel.start(0)
    kernel.execute(CELL)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        assert kernel.execute(CELL).status == "ok"
        times.append(time.perf_counter() - t0)
    kernel.close()
    return median_ms(times)


def rss_gib() -> float:
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs per median")
    parser.add_argument("--replay", type=int, default=2, help="cells recorded in the snapshot")
    parser.add_argument("--ballast-gib", type=float, default=2.2, help="host size for the close measurement")
    parser.add_argument("--baseline-commit", default="dd7df32", help="today's path (before the fork server)")
    parser.add_argument("--no-baseline", action="store_true", help="measure the fork server only")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()

    paths = {"fork server": (MathPythonEnv, Kernel)}
    if not args.no_baseline:
        try:
            paths = {"spawn (baseline)": load_baseline(args.baseline_commit), **paths}
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"baseline unavailable ({exc}); pass --no-baseline to skip it", file=sys.stderr)
            raise SystemExit(2)

    t0 = time.perf_counter()
    server = ForkServer.shared()
    server.fork({"cpu_time_s": 10, "memory_mb": 512, "max_open_files": 64, "max_processes": 8,
                 "output_bytes": 1024, "disk_mb": 8})  # starts it; that kernel dies with its pipes
    zygote_start = time.perf_counter() - t0

    results: dict[str, dict] = {name: {} for name in paths}
    for name, (env_cls, kernel_cls) in paths.items():
        results[name].update(first_steps(env_cls, args.replay, args.repeats))
        results[name]["twelve_s"] = together(env_cls, args.replay, max(3, args.repeats // 2))
        results[name]["cell_ms"] = cell_times(kernel_cls, 30)
    import numpy as np

    ballast = np.ones(int(args.ballast_gib * (1 << 30) / 8))  # touched: resident, as a model host's
    host_gib = rss_gib()
    for name, (_, kernel_cls) in paths.items():
        results[name]["close_ms"] = close_times(kernel_cls, args.repeats)
    del ballast

    names = list(paths)
    print(f"## MathPython kernel: spawn path vs fork server (medians; {os.cpu_count()} CPUs, "
          f"fork server start once per host: {zygote_start:.2f} s)\n")
    print("| measure | " + " | ".join(names) + " | goal |")
    print("|---|" + "---:|" * len(names) + "---:|")
    rows = [
        (f"continuation's first step after restore ({args.replay} replayed cells), ms", "first_step_ms", "{:.1f}",
         f"<= {GOALS['first_step_ms']:g}"),
        ("restore() itself, ms", "restore_ms", "{:.1f}", ""),
        ("make_env + reset + restore + first step, ms", "whole_ms", "{:.1f}", ""),
        ("12 continuations started together, wall s", "twelve_s", "{:.2f}", f"<= {GOALS['twelve_s']:g}"),
        (f"close a kernel from a {host_gib:.1f} GiB host, ms", "close_ms", "{:.2f}", f"<= {GOALS['close_ms']:g}"),
        ("one trivial cell in a live kernel, ms", "cell_ms", "{:.2f}", ""),
    ]
    for label, key, fmt, goal in rows:
        print(f"| {label} | " + " | ".join(fmt.format(results[n][key]) for n in names) + f" | {goal} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "zygote_start_s": zygote_start, "host_gib": host_gib,
                       "replay": args.replay, "repeats": args.repeats}, f, indent=2)


if __name__ == "__main__":
    main()
