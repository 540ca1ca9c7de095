"""The bank sections of ``docs/benchmarking.md``, from what a user runs.

For one shipped bank, this runs (or reads, with ``--from DIR``) the three commands the
section quotes and prints its markdown: the bank's summary, every strategy's effective
ratio with its interval beside the calibrated simulator's, the paired verdicts (TRACE
against uniform, PCL and random_tree) and the headline of each, the flip probability by
depth, and the learned predictor's Spearman::

    python benchmarks/bank_doc_tables.py math_python_smollm2 --seeds 30
    python benchmarks/bank_doc_tables.py guess_number_smollm2 --seeds 10 continuations_per_root=1

The commands (their JSON lands in ``--out``, default ``runs/bank_docs/<bank>``)::

    trace-gym bench --bank BANK seeds=S [overrides] --json bench.json
    trace-gym bank stats BANK --json stats.json
    trace-gym bench --sim calibrate_from=BANK seeds=10 --json sim.json

Nothing here computes a number of its own: every cell is read from those JSON files.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PAIRS = ("uniform", "pcl", "random_tree")


def run(args: list[str]) -> float:
    """Run ``trace-gym ARGS``; returns its wall-clock seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trace_gym.cli", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def ci(row: dict, key: str = "effective_ratio") -> str:
    return f"{row[key]:.3f} ± {row[key + '_ci']:.3f}"


def check(results: dict, other: str) -> str:
    name = f"trace effective ratio above {other}"
    found = next((c for c in results["checks"] if c["name"] == name), None)
    return found["detail"].split("; ", 1)[-1] if found else "n/a"


def section(bank: str, bench: dict, stats: dict, sim: dict, command: str, seconds: float) -> str:
    rate, counts = stats["success_rate"], stats
    lines = [f"Bank: {counts['prompts']} prompts x R = {bench['bank']['roots']} roots, K = "
             f"{bench['bank']['continuations']} continuations per recorded prefix (cap "
             f"{bench['bank']['max_prefixes_per_root']} per root): {counts['prefixes']} prefixes, "
             f"{counts['continuations']} continuations, {counts['left_out_prefixes']} prefixes left out, "
             f"{counts['errors']} episodes ended on an error; prompt success mean {rate['mean']:.3f}, all-fail "
             f"{rate['all_fail']:.0%}, all-succeed {rate['all_success']:.0%}, mixed {rate['mixed']:.0%}; turns "
             f"per root mean {stats['turns']['mean']:.2f} (max {stats['turns']['max']}).",
             f"`{command}` ran in {seconds:.0f} s here.", "",
             "| strategy | predictor | bank: effective ratio | exhausted | calibrated sim: effective ratio |",
             "|---|---|---|---|---|"]
    for name, row in bench["strategies"].items():
        s = sim["strategies"].get(name)
        lines.append(f"| {name} | {row['predictor']} | {ci(row)} | {row['exhausted_share']:.1%} | "
                     f"{ci(s) if s else 'n/a'} |")
    lines += ["", "| paired verdict (95 %) | bank | calibrated sim |", "|---|---|---|"]
    for other in PAIRS:
        lines.append(f"| TRACE vs {other} | {check(bench, other)} | {check(sim, other)} |")
    lines.append(f"| headline | {bench['verdict']} | {sim['verdict']} |")
    flips = stats["flip_by_depth"]
    depths = sorted(flips, key=int)
    lines += ["", "P(one continuation from depth t flips the root's outcome) (depth 0: a second root differs "
              "from the first):", "", "| depth | " + " | ".join(depths) + " |",
              "|---|" + "---|" * len(depths),
              "| flip | " + " | ".join(f"{flips[d]['flip']:.3f}" for d in depths) + " |",
              "| n | " + " | ".join(str(flips[d]["continuations"]) for d in depths) + " |", ""]
    p = stats["predictor"]
    by_depth = ", ".join(f"depth {d}: {v:.3f}" for d, v in sorted(p["by_depth"].items(), key=lambda kv: int(kv[0])))
    lines.append(f"The learned (embedding) predictor, online and out-of-sample over the bank: Spearman against "
                 f"the bank's empirical rates {p['prompt']:.3f} at prompt level, {p['prefix']:.3f} over prefixes "
                 f"({by_depth}).")
    cal = sim.get("calibration") or {}
    used = ", ".join(f"{k} = {v:.4g}" for k, v in cal.get("values", {}).items())
    fit = cal.get("fitted", {})
    prior = f"; fitted prior Beta({fit['a']:.3g}, {fit['b']:.3g})" if "a" in fit else ""
    lines.append(f"Calibrated simulator (`bench --sim calibrate_from={bank} seeds=10`): {used}{prior}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bank", help="a shipped bank name or a bank file")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the bank bench (e.g. continuations_per_root=1)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None, help="where the JSON goes (default runs/bank_docs/<bank>)")
    ap.add_argument("--from", dest="read_from", type=Path, default=None,
                    help="read bench.json, stats.json, sim.json (and seconds.json) from DIR instead of running")
    args = ap.parse_intermixed_args(argv)
    out = args.read_from or args.out or Path("runs/bank_docs") / Path(args.bank).name
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["trace-gym bench --bank", args.bank, f"seeds={args.seeds}", *args.overrides])
    if args.read_from is None:
        seconds = run(["bench", "--bank", args.bank, f"seeds={args.seeds}", *args.overrides,
                       "--json", str(out / "bench.json")])
        run(["bank", "stats", args.bank, "--json", str(out / "stats.json")])
        run(["bench", "--sim", f"calibrate_from={args.bank}", "seeds=10", "--json", str(out / "sim.json")])
        (out / "seconds.json").write_text(json.dumps({"bench": seconds}))
    seconds = json.loads((out / "seconds.json").read_text())["bench"]
    bench, stats, sim = (json.loads((out / f"{n}.json").read_text()) for n in ("bench", "stats", "sim"))
    print(section(args.bank, bench, stats, sim, command, seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
