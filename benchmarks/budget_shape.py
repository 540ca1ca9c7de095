"""Budget shape on real rollouts: more roots with fewer continuations, or fewer roots with more? (issue 45, item 5)

At equal nominal budget B = M (1 + N/2) (a continuation costs half a rollout), the paper's
budget-shape result is that wider root coverage beats deeper replay: (M, N) = (1024, 2) over
(512, 6) on HotpotQA. This script replays a rollout bank at two shapes of one budget, (16, 2)
and (8, 6) by default (B = 32 both), for the tree strategies (random tree, TRACE), and pairs
the two shapes repetition by repetition: both benches run the same seeds, so a repetition
draws the same candidate pools, warm-up slice and recorded rollouts at either shape, and the
difference is a paired one (:func:`trace_gym.bench.checks.paired`, the bench's own paired
interval). Per strategy and headline metric it prints both shapes' means, the difference with
its 95 % interval and the verdict word; a bench whose bank ran out (more than 1 % of branches
refused, :func:`trace_gym.bench.checks.exhaustion_check`) gives NO VERDICT for that shape, naming
the bank sizes it needed. With ``--sim`` the calibrated simulator (``calibrate_from=BANK``) runs
the same two shapes and the table says whether its verdict words are the bank's. The simulator runs
``--sim-seeds`` repetitions (default 3x ``--seeds``) and its word is read at the bank's power: in each
disjoint block of ``--seeds`` repetitions, and the word most blocks say is its word (none: ``split``;
:func:`trace_gym.bench.checks.modal_word`), each block's word printed beside. One run of 30 is one
draw of a word that is itself random where an effect lies near what 30 repetitions show (under fit 10
one run of 30 read random tree's effective ratio "shown below" where the bank's read "not shown",
the simulator's difference -0.086 inside the bank's interval for it, -0.050 [-0.118, +0.018])::

    python benchmarks/budget_shape.py                                  # the shape bank, (16, 2) vs (8, 6)
                                                                       # (its size: DEFAULT_OVERRIDES)
    python benchmarks/budget_shape.py --sim                            # and the calibrated simulator
    python benchmarks/budget_shape.py math_python_smollm2_deep         # a bank too small: NO VERDICT
    python benchmarks/budget_shape.py --from runs/budget_shape/BANK    # re-read the JSON, run nothing

The commands (their JSON lands in ``--out``, default ``runs/budget_shape/<bank>``)::

    trace-gym bench --bank BANK root_budget=M continuations_per_root=N seeds=S strategies=random_tree,trace
        oracle_upper_bound=false [overrides] --json bank-MxN.json
    trace-gym bench --sim calibrate_from=BANK root_budget=M continuations_per_root=N seeds=S candidates=C
        group_size=G steps=T warmup_steps=W strategies=random_tree,trace --json sim-MxN.json

Exit status 0 when every shape of the bank gave a verdict (and, with ``--sim``, the simulator's
words are the bank's), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

DEFAULT_BANK = "math_python_smollm2_shape"
#: The shape bank's bench size when none is given: its 69 prompts hold a 15-prompt warm-up slice and
#: 3 steps of 18 candidates without drawing a prompt twice (the bench's defaults, 64 + 3 x 64, do not fit).
DEFAULT_OVERRIDES = ("warmup_prompts=15", "candidates=18", "steps=3")
SHAPES = ((16, 2.0), (8, 6.0))
STRATEGIES = ("random_tree", "trace")
METRIC_KEYS = ("effective_ratio", "mixed_prompts")
WORDS = {1: "shown above", -1: "shown below", 0: "not shown"}
#: The bench keys the simulator copies from the bank bench's resolved config (its shape but M and N).
COPIED = ("candidates", "group_size", "steps", "warmup_steps")


# ---------------------------------------------------------------------- the comparison (pure)
def label(shape: tuple[int, float]) -> str:
    """``(16, 2)``: a shape as the paper writes it."""
    m, n = shape
    return f"({m}, {n:g})"


def nominal(shape: tuple[int, float]) -> float:
    """B = M (1 + N/2), the nominal budget of a shape (trajectory-equivalents)."""
    m, n = shape
    return m * (1 + n / 2)


def compare(runs: Mapping[tuple[int, float], Mapping[str, Any]], strategies: Sequence[str]) -> dict[str, Any]:
    """The paired comparison of the first shape of ``runs`` against the second, per strategy and metric.

    Returns ``{"rows": [{"strategy", "metric", "first", "second", "pair", "word"}], "exhausted": {shape
    label: the exhaustion check's detail}, "verdict": bool}``: ``verdict`` is False when any shape's
    bank ran out (then every word is "no verdict"). A pair whose repetitions all gave the same
    value on both shapes is degenerate and says so (``pair["note"]``)."""
    from trace_gym.bench.checks import METRICS, exhaustion_check, headline_rows, paired

    (s1, r1), (s2, r2) = list(runs.items())
    out_of = {label(s): c.detail for s, r in runs.items() if (c := exhaustion_check(r)) and c.status == "FAIL"}
    rows = []
    for name in strategies:
        merged = {"a": headline_rows(r1)[name], "b": headline_rows(r2)[name]}
        for key in METRIC_KEYS:
            p = paired(merged, "a", "b", METRICS[key])
            word = "no verdict" if out_of else WORDS[p["shown"]]
            rows.append({"strategy": name, "metric": METRICS[key].label, "first": p["mean_a"], "second": p["mean_b"],
                         "pair": p, "word": word})
    return {"rows": rows, "exhausted": out_of, "verdict": not out_of, "shapes": (label(s1), label(s2))}


def sentence(result: Mapping[str, Any]) -> str:
    """One line per strategy: which shape the bank favours, on both headline metrics."""
    if not result["verdict"]:
        return "NO VERDICT: " + "; ".join(f"{s}: {d}" for s, d in result["exhausted"].items())
    a, b = result["shapes"]
    by: dict[str, list[str]] = {}
    for r in result["rows"]:
        by.setdefault(r["strategy"], []).append(r["word"])
    said = {("shown above",) * 2: f"{a} beats {b} on both headline metrics",
            ("shown below",) * 2: f"{b} beats {a} on both headline metrics",
            ("not shown",) * 2: f"{a} and {b} cannot be told apart on either headline metric"}
    parts = []
    for name, words in by.items():
        each = {"shown above": "{a} above {b} on {m}", "shown below": "{b} above {a} on {m}",
                "not shown": "{a} and {b} not told apart on {m}", "no verdict": "no verdict on {m}"}
        text = said.get(tuple(words)) or ", ".join(each[w].format(a=a, b=b, m=m) for w, m in
                                                   zip(words, ("effective ratio", "mixed prompts/step")))
        parts.append(f"{name}: {text}")
    return "; ".join(parts)


def by_blocks(runs: Mapping[tuple[int, float], Mapping[str, Any]], strategies: Sequence[str],
              block: int) -> dict[str, Any]:
    """:func:`compare` of the whole ``runs`` (its means and intervals), each row's word the one most of its
    disjoint blocks of ``block`` repetitions say (the shapes ran the same seeds, so a block pairs the same
    repetitions at either shape), the blocks' words kept as ``blocks``."""
    from trace_gym.bench.checks import modal_word, repetition_blocks

    whole = compare(runs, strategies)
    cut = {shape: repetition_blocks(r, block) for shape, r in runs.items()}
    each = [compare({shape: cut[shape][i] for shape in runs}, strategies) for i in range(min(map(len, cut.values())))]
    for i, row in enumerate(whole["rows"]):
        words = [c["rows"][i]["word"] for c in each]
        row["blocks"], row["word"] = words, modal_word(words) if whole["verdict"] else row["word"]
    return whole


def table(title: str, result: Mapping[str, Any], commands: Sequence[str],
          sim: Mapping[str, Any] | None = None) -> str:
    """The markdown of one comparison (with ``sim``: the simulator's words beside the bank's)."""
    from trace_gym.bench.checks import interval_text

    a, b = result["shapes"]
    head = f"| strategy | metric | {a} | {b} | {a} - {b} (95 %) | verdict |"
    rule = "|---|---|---|---|---|---|"
    if sim is not None:
        head, rule = head + " calibrated sim | same |", rule + "---|---|"
    lines = [f"### {title}", "", *[f"`{c}`" + ("  " if i < len(commands) - 1 else "") for i, c in enumerate(commands)],
             "", head, rule]
    for i, r in enumerate(result["rows"]):
        cells = [r["strategy"], r["metric"], f"{r['first']:.3f}", f"{r['second']:.3f}", interval_text(r["pair"]),
                 r["word"]]
        if sim is not None:
            s = sim["rows"][i]
            same = "yes" if s["word"] == r["word"] else "**no**"
            blocks = f"; blocks: {', '.join(s['blocks'])}" if len(s.get("blocks", ())) > 1 else ""
            cells += [f"{s['word']} ({s['first']:.3f} vs {s['second']:.3f}{blocks})", same]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Bank: {sentence(result)}."]
    if sim is not None:
        lines.append(f"Calibrated simulator: {sentence(sim)}.")
    return "\n".join(lines)


# ---------------------------------------------------------------------- running
def run(args: list[str]) -> float:
    """Run ``trace-gym ARGS``; returns its wall-clock seconds."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trace_gym.cli", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def read(path: Path) -> dict[str, Any]:
    """A bench's JSON; a missing one is one line naming it (``--from`` a folder that lacks it)."""
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run without --from (or with --out) to write it")
    return json.loads(path.read_text())


def bank_args(bank: str, shape: tuple[int, float], seeds: int, overrides: Sequence[str]) -> list[str]:
    m, n = shape
    return ["bench", "--bank", bank, f"root_budget={m}", f"continuations_per_root={n:g}", f"seeds={seeds}",
            "strategies=" + ",".join(STRATEGIES), "oracle_upper_bound=false", *overrides]


def sim_args(bank: str, shape: tuple[int, float], seeds: int, config: Mapping[str, Any]) -> list[str]:
    from trace_gym.bench.config import sim_shape_overrides

    m, n = shape
    return ["bench", "--sim", f"calibrate_from={bank}", f"root_budget={m}", f"continuations_per_root={n:g}",
            f"seeds={seeds}", *sim_shape_overrides(config, COPIED), "strategies=" + ",".join(STRATEGIES)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bank", nargs="?", default=DEFAULT_BANK, help=f"a shipped bank or a bank file ({DEFAULT_BANK})")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of both bank benches (e.g. candidates=16)")
    ap.add_argument("--seeds", type=int, default=30, help="repetitions of each bench (paired across the shapes)")
    ap.add_argument("--sim", action="store_true", help="also the calibrated simulator at both shapes")
    ap.add_argument("--sim-seeds", type=int, default=None,
                    help="the simulator's repetitions (default 3x --seeds; its word: most of its blocks of --seeds)")
    ap.add_argument("--out", type=Path, default=None, help="where the JSON goes (default runs/budget_shape/<bank>)")
    ap.add_argument("--from", dest="read_from", type=Path, default=None, help="read the JSON from DIR, run nothing")
    ap.add_argument("--keep-bank", action="store_true", help="read bank benches already in --out instead of rerunning")
    args = ap.parse_args(argv)
    if args.bank == DEFAULT_BANK and not args.overrides:
        args.overrides = list(DEFAULT_OVERRIDES)
    if args.seeds < 2:
        print(f"--seeds must be >= 2 (a paired interval needs two repetitions), got {args.seeds}", file=sys.stderr)
        return 2
    if args.sim_seeds is not None and args.sim_seeds < args.seeds:
        print(f"--sim-seeds must be >= --seeds ({args.seeds}: one block), got {args.sim_seeds}", file=sys.stderr)
        return 2
    if nominal(SHAPES[0]) != nominal(SHAPES[1]):  # a guard for whoever edits SHAPES
        print(f"the shapes {SHAPES} have different nominal budgets", file=sys.stderr)
        return 2
    out = args.read_from or args.out or Path("runs/budget_shape") / Path(args.bank).name.split(".")[0]
    out.mkdir(parents=True, exist_ok=True)
    banks, sims, commands, sim_commands = {}, {}, [], []
    for shape in SHAPES:
        tag = f"{shape[0]}x{shape[1]:g}"
        cmd = bank_args(args.bank, shape, args.seeds, args.overrides)
        commands.append(" ".join(["trace-gym", *cmd]))
        if args.read_from is None and not (args.keep_bank and (out / f"bank-{tag}.json").exists()):
            seconds = run([*cmd, "--json", str(out / f"bank-{tag}.json")])
            print(f"{tag}: bank bench ... {seconds:.0f} s", file=sys.stderr)
        banks[shape] = read(out / f"bank-{tag}.json")
        if args.sim:
            cmd = sim_args(args.bank, shape, args.sim_seeds or 3 * args.seeds, banks[shape]["config"])
            sim_commands.append(" ".join(["trace-gym", *cmd]))
            if args.read_from is None:
                print(f"{tag}: simulator ... {run([*cmd, '--json', str(out / f'sim-{tag}.json')]):.0f} s",
                      file=sys.stderr)
            sims[shape] = read(out / f"sim-{tag}.json")
    result = compare(banks, STRATEGIES)
    sim = by_blocks(sims, STRATEGIES, args.seeds) if args.sim else None
    print(table(f"{args.bank}: budget shape at B = {nominal(SHAPES[0]):g}", result, commands + sim_commands, sim))
    agree = sim is None or all(s["word"] == r["word"] for s, r in zip(sim["rows"], result["rows"]))
    ok = result["verdict"] and agree
    print("\n" + ("PASS" if ok else "FAIL") + (": a verdict at both shapes" if result["verdict"] else ": no verdict")
          + ("" if sim is None else "; the simulator's words are the bank's" if agree else
             "; the simulator's words differ from the bank's"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
