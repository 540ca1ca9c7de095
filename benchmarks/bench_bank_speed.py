"""Where a bank bench's time goes, phase by phase and arm by arm, and whether it meets its target.

Runs ``trace-gym bench --bank BANK [KEY=VALUE ...]`` (the guessing-game bank's default bench
unless told otherwise) in a fresh process per run, side by side in one invocation:

* ``baseline``: ``embedding_cache=false``: every text is embedded by the encoder in the run,
  as before the store (issue 43: 238 s idle on ``36217c5``);
* ``cold``: the store on and empty (a cache folder of its own: the first run on a machine);
* ``warm``: the store on, as the cold run left it (every later run of the same bench).

Each child installs timers around the bench's phases (wrappers set up here, nothing in the
code): the predictor's scoring and update (the encoder's own calls and the store's reads
apart), the allocation (the strategy's own code, on the boundary's helper thread), the strategy
boundary (its thread, process-state snapshot and answer checks: the call less the strategy's
code), replay bookkeeping (the bank runner's draws and trees, the regression set, the warm-up's
trees), the driver's views, the warm-up and the predictors' copies, the replay check (the
subprocess that replays each arm's calls), metrics, and the rest (imports, loading the
encoder, the report). Time is counted where it is spent (a phase inside another is taken out
of it). It prints, per run: wall seconds (the command, interpreter start included) with the
load average before and after, a table of phases, a table of arms; then whether every run's
per-repetition metrics are byte-identical (timing fields aside), and PASS/FAIL: the last run
(``warm`` by default) within ``--target-s`` seconds (60). Exit status 1 on a FAIL.

The timers cost a little (about a microsecond per wrapped call); a plain run of the command is
what the target is about, and the numbers here are its upper bound. On a shared, loaded box
every time is inflated by the load: idle numbers need an idle machine.

Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_bank_speed.py [--bank guess_number_smollm2]
        [--runs baseline,cold,warm] [--target-s 60] [--cache DIR] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
#: The issue's target for the guessing-game bank's default bench, idle (seconds).
TARGET_S = 60.0
#: Result keys that are timings (they differ from run to run; everything else must not).
TIMING_KEYS = {"seconds", "allocator_ms", "allocator_ms_ci"}
PHASES = ("predictor scoring", "predictor update", "encoder", "embedding store", "allocation", "strategy boundary",
          "replay bookkeeping", "driver (views, waves)", "warm-up", "predictor builds (torch import)",
          "predictor copies", "replay check",
          "metrics", "encoder load", "other (imports, bank, report)")
RUNS = {"baseline": ["embedding_cache=false"], "cold": ["embedding_cache=true"], "warm": ["embedding_cache=true"]}


# ---------------------------------------------------------------------- in the child: timers
class Timers:
    """Exclusive seconds per phase on the main thread (a phase inside another is taken out of
    it), seconds of the strategy's own code on helper threads, and seconds per arm."""

    def __init__(self) -> None:
        self.self_s: dict[str, float] = {}
        self.arms: dict[str, float] = {}
        self.strategy_code_s = 0.0
        self._stack: list[list] = []  # [phase, start, seconds of nested phases]
        self._lock = threading.Lock()

    def wrap(self, fn: Callable, phase: str) -> Callable:
        main = threading.main_thread()

        def timed(*args, **kwargs):
            if threading.current_thread() is not main:
                return fn(*args, **kwargs)
            frame = [phase, time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = time.perf_counter() - frame[1]
                self.self_s[phase] = self.self_s.get(phase, 0.0) + spent - frame[2]
                if self._stack:
                    self._stack[-1][2] += spent

        timed.__wrapped__ = fn
        return timed

    def strategy_code(self, fn: Callable) -> Callable:
        """``fn`` timed wherever it runs (the boundary runs it on a helper thread)."""
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.strategy_code_s += time.perf_counter() - start

        return timed


def install(timers: Timers) -> None:
    """Wrap the bench's functions in ``timers`` (in this process only; nothing here loads torch,
    so the CLI's thread policy still runs before it loads)."""
    import trace_gym.strategies  # noqa: F401  (the zoo's predictor kinds join PREDICTORS)
    from trace_gym.bench import bank as bench_bank
    from trace_gym.bench import loop as bench
    from trace_gym.predictor import embeddings
    from trace_gym.predictor import kinds as predictor
    from trace_gym.step import driver, learning, strategy_boundary, strategy_replay
    from trace_gym.banks import replay, warmup
    from trace_gym.predictor.kinds import PREDICTORS

    def patch(owner: Any, name: str, phase: str) -> None:
        setattr(owner, name, timers.wrap(getattr(owner, name), phase))

    load = embeddings.shared_encoder

    def shared_encoder(key):
        first = key not in embeddings._ENCODERS
        shared = load(key)
        if first:  # the encoder's class is known once it is loaded
            patch(type(shared.encoder), "encode", "encoder")
        return shared

    predictor.shared_encoder = timers.wrap(shared_encoder, "encoder load")

    for kind in PREDICTORS.values():
        if kind.reads != "text" or "model_path" in kind.needs:
            continue
        cls = kind.factory()
        if isinstance(cls, type):
            for name, phase in (("predict", "predictor scoring"), ("posterior", "predictor scoring"),
                                ("update", "predictor update"), ("observe_outcomes", "predictor update")):
                if name in vars(cls):
                    patch(cls, name, phase)
    for name in ("predict", "update"):
        patch(replay.BankOraclePredictor, name, "predictor scoring" if name == "predict" else "predictor update")
    patch(embeddings.EmbeddingStore, "encode", "embedding store")
    for name in ("prompt_context", "node_context", "new_tree", "start_roots", "start_continuations", "advance"):
        patch(replay.BankBranchRunner, name, "replay bookkeeping")
    patch(learning, "predictor_samples", "replay bookkeeping")
    patch(warmup, "full_trees", "replay bookkeeping")
    patch(warmup, "warm_up", "warm-up")
    bench_bank.warm_up = warmup.warm_up
    patch(bench_bank.BankRepetition, "predictor", "predictor copies")
    patch(bench_bank, "make_predictor", "predictor builds (torch import)")
    patch(driver, "run_step", "driver (views, waves)")
    bench_bank.run_step = driver.run_step
    patch(strategy_replay, "replay_plays", "replay check")
    for name in ("step_record", "pooled_quality", "tree_metrics"):
        patch(bench, name, "metrics")
    patch(bench_bank.BankRepetition, "measure", "metrics")

    plan = strategy_boundary.StrategyBoundary.plan

    def boundary_plan(self, fn, view, rng, candidate=None):
        return plan(self, timers.strategy_code(fn), view, rng, candidate)

    strategy_boundary.StrategyBoundary.plan = timers.wrap(boundary_plan, "strategy boundary")
    run_arm = bench._run_arm

    def arm_timed(source, rep, arm, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run_arm(source, rep, arm, *args, **kwargs)
        finally:
            timers.arms[arm.name] = timers.arms.get(arm.name, 0.0) + time.perf_counter() - start

    bench._run_arm = arm_timed


def child(argv: list[str], out: str) -> int:
    """Run the CLI with ``argv`` under the timers; write ``{"phases", "arms", "bench_s"}`` to ``out``."""
    started = time.perf_counter()
    timers = Timers()
    install(timers)
    from trace_gym import cli

    with open(os.devnull, "w") as sink:
        real, sys.stdout = sys.stdout, sink
        try:
            code = cli.main(argv)
        finally:
            sys.stdout = real
    phases = dict(timers.self_s)
    # the strategy's own code ran while the main thread waited inside the boundary's call
    phases["strategy boundary"] = phases.get("strategy boundary", 0.0) - timers.strategy_code_s
    phases["allocation"] = timers.strategy_code_s
    phases["other (imports, bank, report)"] = time.perf_counter() - started - sum(phases.values())
    Path(out).write_text(json.dumps({"phases": phases, "arms": timers.arms, "code": code}))
    return code


# ---------------------------------------------------------------------- in the parent
def run(name: str, bank: str, keys: list[str], cache: Path, workdir: Path) -> dict[str, Any]:
    """One run in a fresh process; its timings, results and wall seconds."""
    results, timings = workdir / f"{name}.json", workdir / f"{name}.timings.json"
    argv = ["bench", "--bank", bank, *keys, *RUNS[name], "--json", str(results)]
    env = {**os.environ, "TRACE_GYM_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", str(timings), "--", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not timings.exists():
        raise SystemExit(f"{name}: the bench failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    out = json.loads(timings.read_text())
    return {**out, "wall_s": wall, "load": (load, os.getloadavg()[0]), "results": json.loads(results.read_text())}


def stripped(value: Any) -> Any:
    """``value`` without timing keys and the cache switch (what must not differ between runs)."""
    if isinstance(value, dict):
        return {k: stripped(v) for k, v in value.items() if k not in TIMING_KEYS and k != "embedding_cache"}
    if isinstance(value, list):
        return [stripped(v) for v in value]
    return value


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ (a JSON path), or ``None``."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}/{key}"
            found = first_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{path}[{i}]"))), None)
    return None if json.dumps(a) == json.dumps(b) else path or "/"


def report(runs: dict[str, dict[str, Any]], target_s: float, title: str) -> bool:
    """Print the tables and the checks; whether every check passed."""
    names = list(runs)
    print(f"## {title}\n")
    print(f"{os.cpu_count()} CPUs; load average (1 min) before/after each run: "
          + ", ".join(f"{n} {r['load'][0]:.1f}/{r['load'][1]:.1f}" for n, r in runs.items())
          + ". Idle numbers need an idle machine.\n")
    print("| phase | " + " | ".join(f"{n}, s" for n in names) + " |\n|---|" + "---:|" * len(names))
    for phase in PHASES:
        print(f"| {phase} | " + " | ".join(f"{r['phases'].get(phase, 0.0):.1f}" for r in runs.values()) + " |")
    print("| **bench (in process)** | " + " | ".join(f"**{r['results']['seconds']:.1f}**" for r in runs.values())
          + " |")
    print("| **command, wall** | " + " | ".join(f"**{r['wall_s']:.1f}**" for r in runs.values()) + " |\n")
    arms = list(next(iter(runs.values()))["arms"])
    print("| arm (all repetitions) | " + " | ".join(f"{n}, s" for n in names) + " |\n|---|" + "---:|" * len(names))
    for arm in arms:
        print(f"| {arm} | " + " | ".join(f"{r['arms'].get(arm, 0.0):.1f}" for r in runs.values()) + " |")
    checks = []
    base = stripped(runs[names[0]]["results"])
    for name in names[1:]:
        where = first_difference(base, stripped(runs[name]["results"]))
        checks.append(("PASS" if where is None else "FAIL",
                       f"{name}'s results equal {names[0]}'s, timing fields aside"
                       + ("" if where is None else f" (first difference at {where})")))
    last = names[-1]
    checks.append(("PASS" if runs[last]["wall_s"] <= target_s else "FAIL",
                   f"{last} run within {target_s:g} s: {runs[last]['wall_s']:.1f} s wall"
                   + (f" (load average {runs[last]['load'][0]:.1f}: not idle)" if runs[last]['load'][0] > 1.0 else "")))
    print("\n" + "\n".join(f"{status}: {text}" for status, text in checks))
    return all(status == "PASS" for status, _ in checks)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[3:], argv[1])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bank", default="guess_number_smollm2")
    ap.add_argument("--runs", default="baseline,cold,warm",
                    help="comma-separated, in order: baseline (store off), cold (store empty), warm (store filled)")
    ap.add_argument("--target-s", type=float, default=TARGET_S, help="the last run's limit in wall seconds")
    ap.add_argument("--cache", help="the cache folder of the cold and warm runs (default: a fresh one, removed after)")
    ap.add_argument("keys", nargs="*", help="KEY=VALUE overrides of the bench (e.g. continuations_per_root=1)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    bad = [n for n in names if n not in RUNS]
    if bad or not names:
        ap.error(f"--runs takes baseline, cold, warm; got {args.runs!r}")
    workdir = Path(tempfile.mkdtemp(prefix="bench_bank_speed_"))
    cache = Path(args.cache) if args.cache else workdir / "cache"
    try:
        runs = {}
        for name in names:
            if name == "cold" and not args.cache:
                shutil.rmtree(cache / "embeddings", ignore_errors=True)
            runs[name] = run(name, args.bank, args.keys, cache, workdir)
            print(f"{name}: {runs[name]['wall_s']:.1f} s", file=sys.stderr, flush=True)
        title = f"`trace-gym bench --bank {args.bank} {' '.join(args.keys)}`".replace("  ", " ")
        return 0 if report(runs, args.target_s, f"Speed of {title}") else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
