"""``trace-gym eval``: checkpoints on benchmark suites (cached), from an
:class:`~evaluators.run.EvalConfig`; ``--policy`` and ``--suite`` are aliases of its
``policy`` and ``suites`` keys."""

from __future__ import annotations

import argparse

from trace_gym.commands import add_config_parser, command_config


def cmd_eval(args: argparse.Namespace) -> int:
    from evaluators.run import EvalConfig, run_eval

    run_eval(command_config(EvalConfig, args, {"policy": args.policy, "suites": args.suite}))
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    from evaluators.run import EvalConfig
    from evaluators.suites import SUITES

    suites = "suites (suites=NAME[,NAME...] or --suite):\n" + "\n".join(
        f"  {name}: {s.description}" for name, s in SUITES.items()) + "\n\n"
    p = add_config_parser(subparsers, "eval", "evaluate checkpoints on benchmark suites (cached)", EvalConfig,
                          epilog_prefix=suites)
    p.add_argument("--policy", help="PATH | RUN[@STEP] | model name (comma-separated for several); = policy=...")
    p.add_argument("--suite", help="NAME[,NAME...] (default: generated); = suites=...")
    p.set_defaults(func=cmd_eval)
