"""Replaying strategies on the shipped rollout banks against generating the same rollouts live.

For each shipped bank (``trace-gym bank list``), ``trace-gym bench --bank NAME seeds=10``
runs every built-in strategy (and the oracle upper bound) over 10 repetitions, and the
run is timed here. The baseline is what those rollouts cost to generate: the bank's
recording seconds per recorded episode (its footer) times the episodes the replay used
(rollouts + continuations of every arm, repetition and step). The goal: under 2
minutes per bank on this machine (issue "Real-rollout evidence"), and at least 10x
cheaper than generating.

Exit status 1 when a bank's replay takes 2 minutes or more, or is not 10x cheaper.

Usage: ``python benchmarks/bench_bank_replay.py [--seeds 10] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GOAL_SECONDS = 120.0
MIN_SPEEDUP = 10.0


def main(argv: list[str] | None = None) -> int:
    from trace_gym.banks import bank_stats, list_banks, read_footer
    from trace_gym.bench.bank import run_bank_bench
    from trace_gym.bench.config import BankBenchConfig
    from trace_gym.commands.bank import SHIPPED
    from trace_gym.report import markdown_table
    from trace_gym.strategies import shaped_strategies

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows, out, ok = [], {}, True
    for bank in list_banks(SHIPPED):
        footer = read_footer(bank["path"]) or {}
        episodes_recorded = max(1, bank_stats(bank["path"], verify=False)["costs"]["episodes"])
        cfg = BankBenchConfig(bank=bank["path"], seeds=args.seeds)
        t0 = time.perf_counter()
        res = run_bank_bench(cfg, shaped_strategies((), group_size=cfg.group_size,
                                                    continuations_per_root=cfg.continuations_per_root))
        replay = time.perf_counter() - t0
        measured = cfg.steps - cfg.warmup_steps
        used = sum((r["rollouts"] + r["continuations"]) * measured * r["repetitions"]
                   for r in res["strategies"].values())
        live = footer.get("seconds", 0.0) / episodes_recorded * used
        speedup = live / max(replay, 1e-9)
        passed = replay < GOAL_SECONDS and speedup >= MIN_SPEEDUP
        ok &= passed
        name = os.path.basename(bank["path"])
        rows.append([name, len(res["strategies"]), args.seeds, f"{replay:.1f}", f"{used:.0f}", f"{live:.0f}",
                     f"{speedup:.0f}x", "PASS" if passed else "FAIL"])
        out[name] = {"replay_seconds": replay, "episodes_used": used, "live_seconds": live, "speedup": speedup,
                     "verdict": res["verdict"]}
        print(f"{name}: {res['verdict']}", file=sys.stderr)
    if not rows:
        print("no shipped banks found", file=sys.stderr)
        return 1
    print(markdown_table(["bank", "arms", "seeds", "replay s", "episodes used (measured steps)",
                          "live s for them (recording rate)", "speedup", f"< {GOAL_SECONDS:.0f} s and >= "
                          f"{MIN_SPEEDUP:.0f}x"], rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
