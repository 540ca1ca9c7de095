"""``trace-gym envs | strategies | estimators | predictors | models``: what is installed,
plugins included."""

from __future__ import annotations

import argparse
import sys

from trace_gym.commands import summary


def cmd_envs(args: argparse.Namespace) -> int:
    from trace_gym.registry import ENV_FAMILIES, PLUGIN_ERRORS, env_ids, load_plugins

    load_plugins()
    print("registered env ids:")
    for env_id in env_ids():
        print(f"  {env_id}")
    print("env families (--env NAME):")
    for name, fam in ENV_FAMILIES.items():
        print(f"  {name:<18} {fam.env_id:<26} {fam.description}")
    for source, error in PLUGIN_ERRORS.items():
        print(f"plugin {source} failed to load: {error}", file=sys.stderr)
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from trace_gym.registry import load_plugins
    from trace_gym.strategies import STRATEGIES

    load_plugins()
    for name, s in STRATEGIES.items():
        print(f"{name:<18} {s.description}")
    return 0


def cmd_estimators(args: argparse.Namespace) -> int:
    from trace_gym.advantages import ESTIMATORS
    from trace_gym.registry import load_plugins

    load_plugins()
    for name, fn in ESTIMATORS.items():
        print(f"{name:<18} {summary(fn) or getattr(fn, '__module__', '')}")
    return 0


def cmd_predictors(args: argparse.Namespace) -> int:
    from trace_gym.predictor import PREDICTORS

    for name, kind in PREDICTORS.items():
        reads = "real rollouts" if kind.reads == "text" else "the simulator"
        print(f"{name:<12} {reads:<14} {kind.description}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from trace_gym import models

    if args.models_command == "pull":
        print(models.pull_model(args.name, cache_dir=args.cache_dir, force=args.force))
        return 0
    for name, spec in models.MODELS.items():
        folder = models.model_dir(name)
        state = "pulled" if models.verify_manifest(folder, full=False)[0] else "not pulled"
        print(f"{name}\t{state}\t{folder}\t{spec.description}")
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    from trace_gym.models import MODELS

    subparsers.add_parser("envs", help="list registered environment ids and env families").set_defaults(func=cmd_envs)
    subparsers.add_parser("strategies", help="list allocation strategies").set_defaults(func=cmd_strategies)
    subparsers.add_parser("estimators", help="list advantage estimators").set_defaults(func=cmd_estimators)
    subparsers.add_parser("predictors", help="list success predictors").set_defaults(func=cmd_predictors)
    p = subparsers.add_parser("models", help="pull and list local models")
    sub = p.add_subparsers(dest="models_command", required=True)
    pull = sub.add_parser("pull", help="pull a known model into the local cache")
    pull.add_argument("name", choices=sorted(MODELS))
    pull.add_argument("--force", action="store_true", help="pull again even if cached")
    pull.add_argument("--cache-dir", default=None, help="parent folder (default $TRACE_GYM_CACHE/models)")
    sub.add_parser("list", help="known models and where they are cached")
    p.set_defaults(func=cmd_models)
