"""The ``trace-gym`` command line: parse arguments, look names up, call the library.

Subcommands come from one explicit table, :data:`SUBCOMMANDS`: name -> ``"module:function"``
where the function takes argparse's subparsers, adds its parser, and sets
``func=<callable(args) -> int>`` as the parser default. ``bench``, ``envs``,
``strategies`` and ``models`` are built here; ``train``, ``eval``, ``compare`` and
``index`` are added by their own modules through the same table (an entry whose module
does not exist yet, or fails to import, still shows up in ``--help`` and explains itself
when run).

Config flags are built from the entry point's dataclass config
(:mod:`trace_gym.config`): one ``--flag`` per field, parsed by the field's type, with
the default of the mode it belongs to in its help. A flag that does not apply to the
chosen mode is refused with a message naming the mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from trace_gym.config import EnvBenchConfig, SimBenchConfig, config_help, load_config, parse_field_text

#: Subcommands added by other modules: name -> "module:add_parser_function".
SUBCOMMANDS: dict[str, str] = {
    "train": "evaluators.cli:add_train_subcommand",
    "eval": "evaluators.cli:add_eval_subcommand",
    "compare": "trace_gym.compare:add_compare_subcommand",
    "index": "retrieval_index.cli:add_index_subcommand",
}

#: The two modes of ``bench`` and their configs.
BENCH_MODES: dict[str, type] = {"sim": SimBenchConfig, "env": EnvBenchConfig}


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def add_config_flags(parser: argparse.ArgumentParser, modes: dict[str, type], skip: Sequence[str] = ()) -> None:
    """One ``--flag`` per field of the mode configs (union); the help names each mode's default.

    Values stay strings here (``default=None`` marks "not given"); :func:`mode_config`
    parses them by the field's type.
    """
    seen: dict[str, list[tuple[str, str, Any, str]]] = {}
    for mode, cls in modes.items():
        for name, tname, default, text in config_help(cls):
            if name not in skip:
                seen.setdefault(name, []).append((mode, tname, default, text))
    for name, entries in seen.items():
        _, tname, _, text = entries[0]
        if len(entries) == 1 and len(modes) > 1:
            defaults = f"default: {entries[0][2]!r}; only with --{entries[0][0]}"
        elif len({repr(e[2]) for e in entries}) == 1:
            defaults = f"default: {entries[0][2]!r}"
        else:
            defaults = "default: " + ", ".join(f"{e[2]!r} with --{e[0]}" for e in entries)
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar=tname.split("[")[0].upper(),
                            help=_escape(f"{text} ({defaults})"))


def mode_config(args: argparse.Namespace, mode: str, modes: dict[str, type]) -> Any:
    """The config of ``mode``: YAML (``--config``) first, then every given ``--flag`` on top.

    Raises:
        ValueError: a given flag that belongs to another mode only, or a bad value.
    """
    cls = modes[mode]
    own = {f.name for f in dataclasses.fields(cls)}
    overrides: dict[str, Any] = {}
    for other, other_cls in modes.items():
        for f in dataclasses.fields(other_cls):
            raw = getattr(args, f.name, None)
            if raw is None:
                continue
            if f.name not in own:
                raise ValueError(f"--{f.name.replace('_', '-')} does not apply to --{mode} (only to --{other})")
            overrides[f.name] = parse_field_text(cls, f.name, raw)
    return load_config(cls, getattr(args, "config", None), overrides)


# ---------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    from trace_gym import bench
    from trace_gym.strategies import shaped_strategies

    if args.sim == bool(args.env):
        raise ValueError("give exactly one of --sim or --env ENV (with --policy MODEL)")
    mode = "sim" if args.sim else "env"
    cfg = mode_config(args, mode, BENCH_MODES)
    from trace_gym.registry import load_plugins, resolve_env

    load_plugins(cfg.plugins)
    strategies = shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                                   continuations_per_root=cfg.continuations_per_root)
    if mode == "sim":
        from trace_gym.bench_sim import run_sim_bench

        results = run_sim_bench(cfg, strategies, progress=True)
    else:
        from trace_gym.bench_env import run_env_bench

        family = resolve_env(cfg.env, cfg.env_kwargs, cfg.task_kwargs)
        results = run_env_bench(cfg, strategies, family, progress=True, out_dir=args.out,
                                say=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.out:
        results["plots"] = bench.write_bench_plots(results, args.out)
    print(bench.format_bench(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"\nwrote {args.json}")
    if args.out:
        print(f"wrote {', '.join(results['plots'] + results.get('episode_files', []))}")
    failed = [c for c in results.get("checks", []) if c["status"] == "FAIL"]
    return 1 if failed and args.strict else 0


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark allocation strategies at equal budget (no training)")
    p.add_argument("--sim", action="store_true", help="use the simulator (no model needed)")
    p.add_argument("--env", metavar="ENV", help="run on real rollouts in this env family or env id (e.g. math_python), "
                   "with --policy MODEL")
    p.add_argument("--config", help="YAML file with the mode's config fields (flags override it)")
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--out", help="write PNG plots (and with --dump-episodes, transcripts) into this folder")
    p.add_argument("--strict", action="store_true", help="exit 1 when a check FAILs")
    add_config_flags(p, BENCH_MODES, skip=("env",))
    p.set_defaults(func=cmd_bench)


# ---------------------------------------------------------------------- listings
def cmd_envs(args: argparse.Namespace) -> int:
    from trace_gym.registry import ENV_FAMILIES, PLUGIN_ERRORS, env_ids

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


def _add_listings(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("envs", help="list registered environment ids and env families").set_defaults(func=cmd_envs)
    subparsers.add_parser("strategies", help="list allocation strategies").set_defaults(func=cmd_strategies)
    from trace_gym.models import MODELS

    p = subparsers.add_parser("models", help="pull and list local models")
    sub = p.add_subparsers(dest="models_command", required=True)
    pull = sub.add_parser("pull", help="pull a known model into the local cache")
    pull.add_argument("name", choices=sorted(MODELS))
    pull.add_argument("--force", action="store_true", help="pull again even if cached")
    pull.add_argument("--cache-dir", default=None, help="parent folder (default $TRACE_GYM_CACHE/models)")
    sub.add_parser("list", help="known models and where they are cached")
    p.set_defaults(func=cmd_models)


# ---------------------------------------------------------------------- external subcommands
def _add_unavailable(subparsers: argparse._SubParsersAction, name: str, help_text: str, reason: str) -> None:
    p = subparsers.add_parser(name, help=help_text, add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: print(reason, file=sys.stderr) or 2)


def _add_external(subparsers: argparse._SubParsersAction, name: str, target: str) -> None:
    """Import ``target`` and let it add its parser; explain instead when it cannot load."""
    module, _, function = target.partition(":")
    try:
        add = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        reason = f"trace-gym {name}: not available yet ({target} could not be loaded: {exc})"
        _add_unavailable(subparsers, name, f"(not available: {module})", reason)
        return
    add(subparsers)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The full parser. Only the external subcommand named in ``argv`` is imported
    (so ``trace-gym bench`` never imports the trainer); the others are listed by name."""
    parser = argparse.ArgumentParser(prog="trace-gym", description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="show third-party INFO logs (vLLM, transformers)")
    parser.add_argument("--plugin", metavar="MODULE", help="import MODULE first (an uninstalled plugin: its envs and "
                        "strategies register on import); repeatable, allowed anywhere on the line")
    names = ["bench", "envs", "strategies", "models", *SUBCOMMANDS]
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(names) + "}")
    _add_bench(sub)
    _add_listings(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    requested = next((a for a in argv if not a.startswith("-")), None)
    for name, target in SUBCOMMANDS.items():
        if name == requested:
            _add_external(sub, name, target)
        else:
            _add_unavailable(sub, name, f"see `trace-gym {name} --help` ({target.partition(':')[0]})", "unreachable")
    return parser


def configure_logging(verbose: bool) -> None:
    """Third-party logs at WARNING (INFO with ``--verbose``); set before any backend loads."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info" if verbose else "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("vllm", "transformers", "sentence_transformers", "httpx", "urllib3", "filelock"):
        logging.getLogger(name).setLevel(level)
    from trace_gym.engines.vllm import quiet_known_noise  # imports no vLLM

    quiet_known_noise()
    if not verbose:  # a deprecation inside vLLM's Triton shim, nothing a user can act on
        import warnings

        warnings.filterwarnings("ignore", message=".*torch.distributed.reduce_op.*", category=FutureWarning)


def split_plugins(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--plugin MODULE`` / ``--plugin=MODULE`` anywhere on the line (any subcommand):
    returns (modules, the other arguments)."""
    modules, rest, it = [], [], iter(argv)
    for arg in it:
        if arg == "--plugin":
            value = next(it, None)
            if value is None or value.startswith("-"):
                raise SystemExit("trace-gym: error: --plugin needs a module name")
            modules.append(value)
        elif arg.startswith("--plugin="):
            modules.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return modules, rest


def main(argv: Sequence[str] | None = None) -> int:
    modules, argv = split_plugins(list(sys.argv[1:] if argv is None else argv))
    args = build_parser(argv).parse_args(argv)
    configure_logging(args.verbose)
    try:
        if modules:
            from trace_gym.registry import load_plugins

            load_plugins(modules)
        return int(args.func(args) or 0)
    except ValueError as exc:  # bad configuration or input: say what, without a traceback
        print(f"trace-gym {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
