"""Prompts per minute of ``bank record`` (the math family), the recorder before and now, beside
the shipped bank's rate.

Arms, each in a fresh process (OpenMP reads its thread settings once, when torch loads),
recording ``--prompts`` prompts of ``configs/banks/math_python_smollm2.yaml`` (its roots,
continuations and limits; ``--batch-prompts`` in flight) into a scratch file:

- ``old``: the recorder before: each batch of prompts waits for its last one
  (``schedule="batches"``), every core and OpenMP's default wait policy (no thread policy);
- ``new``: what ``trace-gym bank record`` does now: the rolling window
  (``schedule="rolling"``) under :func:`trace_gym.utils.threads.apply_thread_policy`.

``--engines hf,vllm`` runs the new arm once per engine (the measurement behind ``engine:
auto``'s choice for recording). By default every arm runs beside a busy process (a torch
matmul loop at its default threads and wait policy, as a neighbouring job); ``--idle`` runs
them without it. An arm stops after ``--arm-timeout-s``; its rate is the prompts written
over the seconds to the last one (model load excluded, reported apart).

Check (PASS/FAIL, exit 1 on FAIL): the new hf arm records at least ``--min-speedup`` (4x,
the issue's goal) the old arm's prompts per minute. ``--plant serial`` runs the old recorder
as "new": the check must then FAIL.

Usage: ``python benchmarks/bench_bank_record.py [--prompts 6 --batch-prompts 2] [--idle] [--engines hf,vllm]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_threads import BURNER, clean_env  # noqa: E402

CONFIG = ROOT / "configs" / "banks" / "math_python_smollm2.yaml"
SHIPPED = ROOT / "trace_gym" / "banks" / "data" / "math_python_smollm2.jsonl.gz"


def shipped_rate() -> tuple[float, str]:
    """Prompts per minute of the shipped bank's recording (its footer's seconds over all runs) and its engine."""
    with gzip.open(SHIPPED, "rt") as f:
        lines = f.readlines()
    header, footer = json.loads(lines[0]), json.loads(lines[-1])
    return footer["prompts"] / footer["seconds"] * 60, header.get("manifest", header).get("engine", "?")


def worker(arm: str, engine_kind: str, prompts: int, batch_prompts: int, out: str) -> None:
    """One arm in this fresh process: print one JSON line at load and per prompt written."""
    if arm == "new":
        from trace_gym.utils.threads import apply_thread_policy

        decision = apply_thread_policy()
        print(json.dumps({"threads": f"{decision.threads} ({decision.source}), passive wait"}), flush=True)
    from trace_gym.agent.loop import AgentConfig
    from trace_gym.banks import record_bank
    from trace_gym.commands.bank import BankRecordConfig, resolve_record
    from trace_gym.config import load_config
    from trace_gym.engines import make_engine
    from trace_gym.models import resolve_model
    from trace_gym.types import SamplingParams

    cfg = load_config(BankRecordConfig, str(CONFIG), {"prompts": str(prompts), "out": out, "progress": "false",
                                                      "batch_prompts": str(batch_prompts)})
    t0 = time.perf_counter()
    engine = make_engine(engine_kind, resolve_model(cfg.policy))
    print(json.dumps({"load_s": time.perf_counter() - t0, "engine": type(engine).__name__}), flush=True)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if msg.startswith("prompt "):
            print(json.dumps({"prompt_s": time.perf_counter() - t0, "line": msg}), flush=True)

    record_bank(out, engine=engine, family=resolve_record(cfg), prompts=cfg.prompts, roots=cfg.roots,
                continuations=cfg.continuations, max_prefixes_per_root=cfg.max_prefixes_per_root or None,
                sampling=SamplingParams(max_tokens=cfg.max_turn_tokens, temperature=cfg.temperature, seed=cfg.seed),
                agent_config=AgentConfig(max_turn_tokens=cfg.max_turn_tokens,
                                         max_episode_tokens=cfg.max_episode_tokens, max_turns=cfg.max_turns),
                seed=cfg.seed, batch_prompts=cfg.batch_prompts, schedule="rolling" if arm == "new" else "batches",
                policy=cfg.policy, say=say)
    engine.close()


def run_arm(arm: str, engine_kind: str, args: argparse.Namespace, busy: bool, folder: str) -> dict:
    burner = subprocess.Popen([sys.executable, "-c", BURNER], env=clean_env()) if busy else None
    if busy:
        time.sleep(4.0)
    out = os.path.join(folder, f"{arm}-{engine_kind}-{'busy' if busy else 'idle'}.jsonl.gz")
    cmd = [sys.executable, __file__, "--worker", arm, "--engine", engine_kind, "--prompts", str(args.prompts),
           "--batch-prompts", str(args.batch_prompts), "--out", out]
    load = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    events: list[dict] = []
    reader = threading.Thread(target=lambda: events.extend(json.loads(line) for line in proc.stdout
                                                           if line.startswith("{")), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=args.arm_timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        proc.kill()
        proc.wait()
        reader.join(timeout=5)
        if burner is not None:
            burner.terminate()
            burner.wait()
    written = [e["prompt_s"] for e in events if "prompt_s" in e]
    info = {k: v for e in events for k, v in e.items() if k in ("threads", "load_s", "engine")}
    rate = len(written) / written[-1] * 60 if written else 0.0
    return info | {"arm": arm, "engine_kind": engine_kind, "machine": "busy" if busy else "idle",
                   "prompts": len(written), "seconds": written[-1] if written else args.arm_timeout_s,
                   "prompts_per_min": rate, "load_1m": load, "load_1m_after": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6, help="prompts recorded per arm")
    parser.add_argument("--batch-prompts", type=int, default=2, help="prompts in flight")
    parser.add_argument("--engines", default="hf", help="engines of the new arm: hf, vllm (comma-separated)")
    parser.add_argument("--idle", action="store_true", help="no busy process beside the arms")
    parser.add_argument("--arm-timeout-s", type=float, default=300.0, help="an arm stops here (its rate so far)")
    parser.add_argument("--min-speedup", type=float, default=4.0, help="new hf / old prompts per minute")
    parser.add_argument("--plant", choices=["serial"], default=None, help="the old recorder as 'new': must FAIL")
    parser.add_argument("--worker", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="hf", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.engine, args.prompts, args.batch_prompts, args.out)
        return 0
    busy = not args.idle
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        arms = [("old", "hf")] + [("new", e.strip()) for e in args.engines.split(",") if e.strip()]
        for label, kind in arms:
            arm = "old" if args.plant == "serial" else label
            rows.append(run_arm(arm, kind, args, busy, folder) | {"label": label})
            r = rows[-1]
            print(f"done: {label} {kind}: {r['prompts']} prompts, {r['prompts_per_min']:.2f} prompts/min",
                  file=sys.stderr, flush=True)
    ship, ship_engine = shipped_rate()
    where = "beside a busy process" if busy else "idle"
    print(f"bank record, math_python_smollm2 settings, {args.prompts} prompts ({args.batch_prompts} in flight), "
          f"{where}; {os.cpu_count()} CPUs" + (" (planted: serial)" if args.plant else ""))
    print("| recorder | engine | threads | prompts | s | prompts/min | s/prompt | load s | load 1m before/after |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        per = f"{60 / r['prompts_per_min']:.1f}" if r["prompts_per_min"] else "-"
        print(f"| {r['label']} | {r['engine_kind']} | {r.get('threads', 'all cores, default wait')} | {r['prompts']} | "
              f"{r['seconds']:.0f} | {r['prompts_per_min']:.2f} | {per} | {r.get('load_s', 0):.1f} | "
              f"{r['load_1m']:.2f}/{r['load_1m_after']:.2f} |")
    print(f"| shipped bank (its footer) | {ship_engine} | - | 256 | - | {ship:.2f} | {60 / ship:.1f} | - | - |")
    old = rows[0]["prompts_per_min"] or 60 / rows[0]["seconds"]  # none written: below one per timeout
    bound = "" if rows[0]["prompts_per_min"] else "at least "
    new = next(r for r in rows if r["label"] == "new" and r["engine_kind"] == "hf")["prompts_per_min"]
    speedup = new / old
    ok = speedup >= args.min_speedup
    print(f"{'PASS' if ok else 'FAIL'}: the new recorder records {bound}{speedup:.2f}x the old one's prompts/min "
          f"{where} (goal >= {args.min_speedup:g}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
