"""``trace-gym compare``: training runs and evaluated checkpoints side by side
(:func:`trace_gym.runs.compare.run_compare`)."""

from __future__ import annotations

import argparse


def cmd_compare(args: argparse.Namespace) -> int:
    from trace_gym.runs.compare import run_compare

    run_compare(args.runs, args.out, names=args.names.split(",") if args.names else None)
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="compare training runs or evaluated checkpoints: paired table + plots with intervals",
        description="Training run dirs: one row per config (seeds grouped), each against the first. With any eval "
        "output dir (what `trace-gym eval --out DIR` writes) among them: each policy's held-out accuracy per suite, "
        "paired with the first folder's on the tasks both evaluated (Agresti-Min 95 % interval); a run dir "
        "contributes its last evaluation.")
    p.add_argument("runs", nargs="+", metavar="DIR", help="run dirs or eval output dirs (seeds of one config are "
                   "grouped)")
    p.add_argument("--names", metavar="A,B,...", help="row labels, one per DIR in order (default: the folders' names)")
    p.add_argument("--out", default=None, help="folder for compare.md and the PNG plots")
    p.set_defaults(func=cmd_compare)
