"""The bank sections of ``docs/benchmarking.md``, from what a user runs.

For one shipped bank, this runs (or reads, with ``--from DIR``) the commands the section
quotes and prints its markdown: the bank's summary; every strategy's headline metrics
(effective ratio, mixed prompts per step, mixed groups per 1k generated tokens) beside
the calibrated simulator's at the same shape; the paired verdicts; the per-step curve;
the predictor's quality where it is used; the flip probability by depth; the budget
curve (PNGs copied to ``docs/images/<bank>/``)::

    python benchmarks/bank_doc_tables.py math_python_smollm2
    python benchmarks/bank_doc_tables.py guess_number_smollm2 continuations_per_root=1

The commands (their JSON lands in ``--out``, default ``runs/bank_docs/<bank>``)::

    trace-gym bench --bank BANK [overrides] --json bench.json
    trace-gym bank stats BANK --predictor none --json stats.json
    trace-gym bench --sim calibrate_from=BANK seeds=10 candidates=C root_budget=M group_size=G
        continuations_per_root=N steps=T warmup_steps=W --json sim.json     (the bank bench's shape)
    trace-gym bench --bank BANK [overrides] --root-budgets 8,16,32 --json sweep.json --out DIR

Nothing here computes a number of its own: every cell is read from those JSON files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (a, b) pairs of the verdict table, when both ran.
PAIRS = (("trace", "uniform"), ("trace", "pcl"), ("trace", "random_tree"), ("trace_adaptive", "uniform"),
         ("trace_adaptive", "trace"), ("trace_adaptive", "pcl"))
METRICS = (("effective_ratio", "effective ratio"), ("mixed_prompts", "mixed prompts/step"),
           ("mixed_per_1k_tokens", "mixed/1k tok"))


def shown(value: object) -> str:
    """A calibrated value as the section prints it (numbers to 4 digits, lists of them too)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def run(args: list[str]) -> float:
    """Run ``trace-gym ARGS``; returns its wall-clock seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trace_gym.cli", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def ci(row: dict | None, key: str) -> str:
    if row is None:
        return "n/a"
    half = row.get(key + "_ci")
    return f"{row[key]:.3f}" if half is None or half != half else f"{row[key]:.3f} ± {half:.3f}"


def paired(results: dict, a: str, b: str, key: str) -> str:
    for entry in results.get("paired", []):
        if {entry["a"], entry["b"]} == {a, b}:
            p = entry[key]
            if p is None:
                return "no contrast"
            sign = 1 if entry["a"] == a else -1
            word = {1: "shown above", -1: "shown below", 0: "not shown"}[sign * p["shown"]]
            lo, hi = sorted((sign * p["low"], sign * p["high"]))
            return f"{sign * p['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}]: {word}"
    return "n/a"


def strategy_rows(bench: dict, sim: dict) -> list[str]:
    lines = ["| strategy | predictor | bank: effective ratio | mixed/step | mixed/1k tok | exhausted | "
             "calibrated sim: effective ratio | mixed/step |", "|---|---|---|---|---|---|---|---|"]
    for name, row in bench["strategies"].items():
        s = sim["strategies"].get(name)
        lines.append(f"| {name} | {row['predictor']} | {ci(row, 'effective_ratio')} | {ci(row, 'mixed_prompts')} | "
                     f"{ci(row, 'mixed_per_1k_tokens')} | {row['exhausted_share']:.1%} | "
                     f"{ci(s, 'effective_ratio')} | {ci(s, 'mixed_prompts')} |")
    return lines


def verdict_rows(bench: dict, sim: dict) -> list[str]:
    lines = ["| paired difference (95 %) | metric | bank | calibrated sim |", "|---|---|---|---|"]
    for a, b in PAIRS:
        if a in bench["strategies"] and b in bench["strategies"]:
            for key, label in METRICS[:2]:
                lines.append(f"| {a} - {b} | {label} | {paired(bench, a, b, key)} | {paired(sim, a, b, key)} |")
    return lines + ["", f"Headline, bank: {bench['verdict']}", "", f"Headline, calibrated sim: {sim['verdict']}"]


def curve_rows(bench: dict) -> list[str]:
    steps = len(next(iter(bench["strategies"].values()))["by_step"])
    lines = ["| strategy | " + " | ".join(f"step {i}" for i in range(steps)) + " |", "|---|" + "---|" * steps]
    for name, row in bench["strategies"].items():
        lines.append(f"| {name} | " + " | ".join(f"{p['effective_ratio']:.3f} / {p['mixed_prompts']:.2f} / "
                                                 f"AUC {p.get('mixed_auc', float('nan')):.2f}"
                                                 for p in row["by_step"]) + " |")
    return lines


def quality_rows(bench: dict) -> list[str]:
    lines = ["| strategy | Spearman (prompt) | AUC mixed vs pure | Brier | level error | Spearman (prefix) |",
             "|---|---|---|---|---|---|"]
    for name, row in bench["strategies"].items():
        lines.append(f"| {name} | {row['prompt_spearman']:.3f} | {row['mixed_auc']:.3f} | {row['brier']:.3f} | "
                     f"{row['level_error']:+.3f} | {row.get('prefix_spearman', float('nan')):.3f} |")
    return lines


def sweep_rows(sweep: dict, bank: str) -> list[str]:
    budgets = sweep["root_budgets"]
    lines = []
    for key, label in METRICS[:2]:
        lines += ["", f"{label} by root budget M (mean ± 95 % CI):", "",
                  "| strategy | " + " | ".join(f"M = {m}" for m in budgets) + " |", "|---|" + "---|" * len(budgets)]
        names = list(dict.fromkeys(n for b in sweep["benches"] for n in b["strategies"]))
        for name in names:
            lines.append(f"| {name} | " + " | ".join(ci(b["strategies"].get(name), key) for b in sweep["benches"])
                         + " |")
    lines += ["", *[f"- M = {m}: {b['verdict']}" for m, b in zip(budgets, sweep["benches"])], ""]
    lines += [f"![{label} by budget](images/{bank}/budget_{key}.png)" for key, label in METRICS]
    return lines


def section(bank: str, bench: dict, stats: dict, sim: dict, sweep: dict, commands: list[str], seconds: float) -> str:
    rate, b, cfg = stats["success_rate"], bench["bank"], bench["config"]
    lines = [f"Bank: {stats['prompts']} prompts x R = {b['roots']} roots, K = {b['continuations']} continuations "
             f"per recorded prefix (cap {b['max_prefixes_per_root']} per root): {stats['prefixes']} prefixes, "
             f"{stats['continuations']} continuations, {stats['left_out_prefixes']} prefixes left out, "
             f"{stats['errors']} episodes ended on an error; prompt success mean {rate['mean']:.3f}, all-fail "
             f"{rate['all_fail']:.0%}, all-succeed {rate['all_success']:.0%}, mixed {rate['mixed']:.0%}; turns "
             f"per root mean {stats['turns']['mean']:.2f} (max {stats['turns']['max']}).", "",
             f"`{commands[0]}` ran in {seconds:.0f} s here ({cfg['seeds']} seeds x {cfg['steps']} steps; warm-up: "
             f"{bench['warmup']['description']}).", "", *strategy_rows(bench, sim), "", *verdict_rows(bench, sim),
             "", "Per-step curve of the bank bench (effective ratio / mixed prompts per step / the predictor's "
             "mixed-vs-pure AUC on that step's candidates; means over repetitions):", "", *curve_rows(bench), "",
             "Each arm's own predictor, in the bench (pooled over the measured steps; against the bank's "
             "empirical rates):", "", *quality_rows(bench)]
    flips = stats["flip_by_depth"]
    depths = sorted(flips, key=int)
    lines += ["", "P(one continuation from depth t flips the root's outcome) (depth 0: a second root differs "
              "from the first):", "", "| depth | " + " | ".join(depths) + " |", "|---|" + "---|" * len(depths),
              "| flip | " + " | ".join(f"{flips[d]['flip']:.3f}" for d in depths) + " |",
              "| n | " + " | ".join(str(flips[d]["continuations"]) for d in depths) + " |", ""]
    cal = sim.get("calibration") or {}
    used = ", ".join(f"{k} = {shown(v)}" for k, v in cal.get("values", {}).items())
    fit = cal.get("fitted", {})
    prior = f"; fitted prior Beta({fit['a']:.3g}, {fit['b']:.3g})" if "a" in fit else ""
    lines += [f"Calibrated simulator (`{commands[2]}`): {used}{prior}. Its learned predictor reaches "
              f"AUC {sim['strategies']['trace']['mixed_auc']:.3f} (the bank's embedding predictor: "
              f"{bench['strategies']['trace']['mixed_auc']:.3f}).", "",
              f"Budget curve (`{commands[3]}`):", *sweep_rows(sweep, bank)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bank", help="a shipped bank name or a bank file")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the bank bench (e.g. continuations_per_root=1)")
    ap.add_argument("--budgets", default="8,16,32", help="root budgets of the budget curve")
    ap.add_argument("--out", type=Path, default=None, help="where the JSON goes (default runs/bank_docs/<bank>)")
    ap.add_argument("--from", dest="read_from", type=Path, default=None,
                    help="read bench.json, stats.json, sim.json, sweep.json (and seconds.json) from DIR instead")
    args = ap.parse_intermixed_args(argv)
    name = Path(args.bank).name.removesuffix(".jsonl.gz")
    out = args.read_from or args.out or Path("runs/bank_docs") / name
    out.mkdir(parents=True, exist_ok=True)
    bench_args = ["bench", "--bank", args.bank, *args.overrides, "--pairs", "trace_adaptive:pcl"]
    commands = [" ".join(["trace-gym", *bench_args]), f"trace-gym bank stats {args.bank}", "", ""]
    if args.read_from is None:
        seconds = run([*bench_args, "--json", str(out / "bench.json")])
        (out / "seconds.json").write_text(json.dumps({"bench": seconds}))
        run(["bank", "stats", args.bank, "--predictor", "none", "--json", str(out / "stats.json")])
    bench = json.loads((out / "bench.json").read_text())
    shape = {k: bench["config"][k] for k in ("candidates", "root_budget", "group_size", "continuations_per_root",
                                             "steps", "warmup_steps")}  # the simulator warms up as the bank bench
    sim_args = ["bench", "--sim", f"calibrate_from={args.bank}", "seeds=10", *[f"{k}={v}" for k, v in shape.items()],
                "--pairs", "trace_adaptive:pcl"]
    sweep_args = [*bench_args, "--root-budgets", args.budgets]
    commands[2], commands[3] = " ".join(["trace-gym", *sim_args]), " ".join(["trace-gym", *sweep_args])
    if args.read_from is None:
        run([*sim_args, "--json", str(out / "sim.json")])
        run([*sweep_args, "--json", str(out / "sweep.json"), "--out", str(out / "plots")])
        images = ROOT / "docs" / "images" / name
        images.mkdir(parents=True, exist_ok=True)
        for png in (out / "plots").glob("budget_*.png"):
            shutil.copy(png, images / png.name)
    seconds = json.loads((out / "seconds.json").read_text())["bench"]
    stats, sim, sweep = (json.loads((out / f"{n}.json").read_text()) for n in ("stats", "sim", "sweep"))
    print(section(name, bench, stats, sim, sweep, commands, seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
