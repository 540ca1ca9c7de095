"""``trace-gym compare``: training runs and evaluated checkpoints side by side
(:func:`trace_gym.runs.compare.run_compare`)."""

from __future__ import annotations

import argparse


def cmd_compare(args: argparse.Namespace) -> int:
    from trace_gym.bench.pair import is_bench_json
    from trace_gym.runs.output_paths import check_output

    if args.out:  # before any run is read
        check_output(args.out, "folder", key="--out")
    names = args.names.split(",") if args.names else None
    benches = [is_bench_json(p) for p in args.runs]
    if any(benches):
        if not all(benches):
            raise ValueError("compare pairs bench results (bench --json files) or run/eval dirs, not both: "
                             f"{', '.join(p for p, b in zip(args.runs, benches) if not b)} is not a bench result")
        return _pair_benches(args, names)
    from trace_gym.runs.compare import run_compare

    run_compare(args.runs, args.out, names=names)
    return 0


def _pair_benches(args: argparse.Namespace, names: list[str] | None) -> int:
    from pathlib import Path

    from trace_gym.bench.pair import format_paired, pair_bench_files
    from trace_gym.bench.report import results_json
    from trace_gym.bench.rank import plot_ranking

    results = pair_bench_files(args.runs, names)
    print(format_paired(results))
    if args.out:
        from trace_gym.runs.output_paths import write_output_text

        out = Path(args.out)
        written = write_output_text(out / "paired.json", results_json(results), key="--out")
        print(f"\nwrote {', '.join([str(written), *plot_ranking(results, out)])}")
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="compare training runs or evaluated checkpoints: paired table + plots with intervals",
        description="Training run dirs: one row per config (seeds grouped), each against the first. With any eval "
        "output dir (what `trace-gym eval --out DIR` writes) among them: each policy's held-out accuracy per suite, "
        "paired with the first folder's on the tasks both evaluated (Agresti-Min 95 % interval); a run dir "
        "contributes its last evaluation.")
    p.add_argument("runs", nargs="+", metavar="DIR", help="run dirs or eval output dirs (seeds of one config are "
                   "grouped), or bench results (bench --json files of the same draws: their arms paired after the "
                   "fact, ranked and checked as one bench)")
    p.add_argument("--names", metavar="A,B,...", help="row labels, one per DIR in order (default: the folders' names)")
    p.add_argument("--out", default=None, help="folder for compare.md and the PNG plots")
    p.set_defaults(func=cmd_compare)
