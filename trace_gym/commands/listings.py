"""``trace-gym envs | strategies | estimators | predictors | models``: what is installed,
plugins included."""

from __future__ import annotations

import argparse
import sys

from trace_gym.commands import summary


#: ids shown per ecosystem before "... N more" (all with ``--ecosystem``)
SHOWN_PER_ECOSYSTEM = 8


def cmd_envs(args: argparse.Namespace) -> int:
    from trace_gym.registry import ECOSYSTEMS, ENV_FAMILIES, PLUGIN_ERRORS, env_ids, load_plugins

    wanted = getattr(args, "ecosystem", None)
    if wanted is not None and wanted not in ECOSYSTEMS:
        from trace_gym.utils.suggest import did_you_mean

        raise ValueError(f"--ecosystem {wanted!r} is not one of {sorted(ECOSYSTEMS)}{did_you_mean(wanted, ECOSYSTEMS)}")
    if wanted is None:
        load_plugins()
        print("registered env ids:")
        for env_id in env_ids():
            if env_id.split("/", 1)[-1].split(".")[0] not in ECOSYSTEMS:  # those are listed below
                print(f"  {env_id}")
        print("env families (--env NAME):")
        for name, fam in ENV_FAMILIES.items():
            print(f"  {name:<18} {fam.env_id:<26} {fam.description}")
    print("other ecosystems' envs (--env PREFIX:NAME; docs/ecosystem.md):")
    for prefix in ([wanted] if wanted else ECOSYSTEMS):
        print(f"  {prefix}: {ecosystem_listing(prefix, limit=None if wanted else SHOWN_PER_ECOSYSTEM)}")
    for source, error in PLUGIN_ERRORS.items():
        print(f"plugin {source} failed to load: {error}", file=sys.stderr)
    return 0


def ecosystem_listing(prefix: str, limit: int | None) -> str:
    """One ecosystem's ids for ``trace-gym envs``: its adapter's ``available()``, the
    first ``limit`` of them and a count of the rest, or why there are none."""
    from trace_gym.registry import ecosystem_module

    try:
        module = ecosystem_module(prefix)
        ids = list(module.available())
    except Exception as exc:  # noqa: BLE001  (a missing or broken package: say so, list the others)
        return f"unavailable ({type(exc).__name__}: {exc})"
    if not ids:
        return f"none found in the installed {module.PACKAGE} (name an importable module or URL: docs/ecosystem.md)"
    shown = ids if limit is None else ids[:limit]
    more = f" ... {len(ids) - len(shown)} more (trace-gym envs --ecosystem {prefix})" if len(ids) > len(shown) else ""
    return f"{len(ids)} from {module.PACKAGE}: " + ", ".join(shown) + more


def cmd_strategies(args: argparse.Namespace) -> int:
    from trace_gym.registry import load_plugins
    from trace_gym.strategies import STRATEGIES

    load_plugins()
    for name, s in STRATEGIES.items():
        print(f"{name:<18} {s.description}")
    return 0


def cmd_estimators(args: argparse.Namespace) -> int:
    from trace_gym.train.advantages import ESTIMATORS
    from trace_gym.registry import load_plugins

    load_plugins()
    for name, fn in ESTIMATORS.items():
        print(f"{name:<18} {summary(fn) or getattr(fn, '__module__', '')}")
    return 0


def cmd_predictors(args: argparse.Namespace) -> int:
    from trace_gym.predictor.kinds import PREDICTORS

    width = max(12, *(len(name) for name in PREDICTORS))
    for name, kind in PREDICTORS.items():
        reads = "real rollouts" if kind.reads == "text" else "the simulator"
        print(f"{name:<{width}} {reads:<14} {kind.description}")
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

    envs = subparsers.add_parser("envs", help="list registered environment ids, env families and other ecosystems' envs")
    envs.add_argument("--ecosystem", default=None, help="list every env of this ecosystem (gem, skyrl, verifiers, "
                      "openenv, reasoning_gym)")
    envs.set_defaults(func=cmd_envs)
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
