"""``trace-gym eval``: checkpoints on benchmark suites (cached), from an
:class:`~evaluators.run.EvalConfig`; ``--policy``, ``--suite`` and ``--dump-episodes`` are
aliases of its ``policy``, ``suites`` and ``dump_episodes`` keys."""

from __future__ import annotations

import argparse

from trace_gym.commands import add_config_flags, add_config_parser, command_config

#: The documented CPU-sized BFCL run (docs/evaluation.md): four entries, one per category,
#: in 2.5 min with SmolLM2-135M on the HF engine on an idle 2-core machine (the prompts
#: alone are ~4.2k tokens; the defaults allow 64 turns of 512 tokens).
BFCL_CPU = "limit=1 max_turns=6 max_turn_tokens=96 max_episode_tokens=6144"


def cmd_eval(args: argparse.Namespace) -> int:
    from evaluators.run import EvalConfig, run_eval

    run_eval(command_config(EvalConfig, args, {"policy": args.policy, "suites": args.suite,
                                               "dump_episodes": args.dump_episodes}))
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    from evaluators.run import EvalConfig
    from evaluators.suites import SUITES, Suite
    from trace_gym.registry import BUILTIN_ENVS, NAMESPACE

    env_limits = Suite("", "", list).limits()  # an env id's suite takes Suite's defaults
    suites = ("suites (suites=NAME[,NAME...] or --suite), each with its agent-loop limits (max_turns, "
              "max_turn_tokens, max_episode_tokens override them):\n"
              + "\n".join(f"  {name}: {s.description}\n      {s.limits()}" for name, s in SUITES.items())
              + "\n  any registered env id with a task loader (this repo's, offline: "
              + ", ".join(f"{NAMESPACE}/{name}" for name in BUILTIN_ENVS) + "; a plugin's with --plugin MODULE) or "
              "env family (math_python, ...): the held-out split of its tasks (task_kwargs: its loader's keyword "
              f"arguments)\n      {env_limits}\n\n"
              f"BFCL on a CPU (four entries in a few minutes): --suite bfcl {BFCL_CPU}\n\n")
    p = add_config_parser(subparsers, "eval", "evaluate checkpoints on benchmark suites (cached)", EvalConfig,
                          epilog_prefix=suites + "Every key is also a --flag (--limit 2 = limit=2, --out DIR = out=DIR)."
                          "\n\n")
    p.add_argument("--policy", help="model folder | RUN[@STEP] | model name (comma-separated for several); "
                   "= policy=...")
    p.add_argument("--suite", help="NAME[,NAME...] suite names or env ids (default: generated); = suites=...")
    p.add_argument("--dump-episodes", metavar="N", help="write N transcripts per policy and suite into out; "
                   "= dump_episodes=N")
    add_config_flags(p, {"eval": EvalConfig}, skip=("policy", "dump_episodes"))
    p.set_defaults(func=cmd_eval)
