"""``trace-gym compare``: training runs side by side (:func:`trace_gym.compare.run_compare`)."""

from __future__ import annotations

import argparse


def cmd_compare(args: argparse.Namespace) -> int:
    from trace_gym.compare import run_compare

    run_compare(args.runs, args.out)
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="compare training runs: table + plots with confidence intervals")
    p.add_argument("runs", nargs="+", help="run directories (seeds of one config are grouped)")
    p.add_argument("--out", default=None, help="folder for compare.md and the PNG plots")
    p.set_defaults(func=cmd_compare)
