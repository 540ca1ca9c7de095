"""``trace-gym bench``: allocation strategies at one budget, on any source of rollouts.

The modes are the table :data:`trace_gym.bench.modes.BENCH_SOURCES` (the simulator, real
rollouts, a recorded rollout bank, and any mode a user registers): each gives this command
its ``--MODE`` flag, its config class (the keys), its run and its report. The keys are the
fields of the mode's config; each also has a ``--flag`` alias, typed by the field, with
each mode's default in its help. A key that does not apply to the chosen mode is refused
with a message naming the mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from trace_gym.bench.checks import Roles
from trace_gym.bench.modes import bench_mode, bench_modes
from trace_gym.bench.report import format_bench, results_json, write_bench_plots
from trace_gym.commands import add_config_flags, add_config_parser, command_config
from trace_gym.utils.suggest import did_you_mean
from trace_gym.commands.bank import bank_path


def mode_configs() -> dict[str, type]:
    """Each mode's config class, in table order."""
    return {name: mode.config for name, mode in bench_modes().items()}


def mode_config(args: argparse.Namespace, mode: str, modes: dict[str, type]) -> Any:
    """The config of ``mode``: YAML (``--config``), then ``key=value``, then every given
    ``--flag`` on top (:func:`trace_gym.commands.command_config`), once every key and flag
    given is checked to belong to ``mode``.

    Raises:
        ValueError: a key or flag that belongs to another mode only, an unknown key, or a bad value.
    """
    cls = modes[mode]
    own = {f.name for f in dataclasses.fields(cls)}
    everyone: dict[str, list[str]] = {}
    for m, c in modes.items():
        for f in dataclasses.fields(c):
            everyone.setdefault(f.name, []).append(m)

    def only(name: str) -> str:
        return " or ".join(f"--{m}" for m in everyone[name])

    for key in getattr(args, "overrides", None) or {}:
        if key not in everyone:
            raise ValueError(f"command line: unknown key {key!r} for bench --{mode}{did_you_mean(key, sorted(own))}")
        if key not in own:
            raise ValueError(f"{key}= does not apply to --{mode} (only to {only(key)})")
    for name in everyone:
        if getattr(args, name, None) is not None and name not in own:
            raise ValueError(f"--{name.replace('_', '-')} does not apply to --{mode} (only to {only(name)})")
    values = {m.value: getattr(args, m.name, None) for m in bench_modes().values() if m.value and m.value in own}
    return command_config(cls, args, {k: v for k, v in values.items() if v not in (None, True, False)})


def cmd_bench(args: argparse.Namespace) -> int:
    from trace_gym.runs.output_paths import check_output
    from trace_gym.registry import load_plugins

    if args.json:  # where the results go, checked before any work (a bench can run for hours)
        check_output(args.json, "file", key="--json")
    if args.out:
        check_output(args.out, "folder", key="--out")
    modes = bench_modes()
    chosen = [name for name in modes if getattr(args, name, None)]
    if not chosen:  # a bank named by key (bank=FILE, or a config's bank:) makes a bank bench
        from trace_gym.config import read_yaml

        named = (getattr(args, "overrides", None) or {}).get("bank") or (
            read_yaml(args.config).get("bank") if getattr(args, "config", None) else None)
        if isinstance(named, str) and named:
            args.bank, chosen = named, ["bank"]
    if len(chosen) != 1:
        flags = ", ".join(f"--{n}" + (f" {m.metavar or m.value.upper()}" if m.value else "") for n, m in modes.items())
        raise ValueError(f"give exactly one of {flags}")
    mode = chosen[0]
    if mode == "bank":
        args.bank = bank_path(args.bank)
    cfg = mode_config(args, mode, mode_configs())
    if mode == "sim" and cfg.calibrate_from:
        cfg = dataclasses.replace(cfg, calibrate_from=bank_path(cfg.calibrate_from))
    load_plugins(cfg.plugins)
    # what the mode's run requires (its env family), resolved now: a bad env or kwarg is one line before any work
    resources = {name: RESOURCES[name](cfg) for name in bench_mode(mode).requires}
    run = mode_runner(mode, args, resources)
    if args.root_budgets:
        return _sweep(args, cfg, run)
    results = run(cfg)
    _report(args, results, write_bench_plots, format_bench, results.get("episode_files", []))
    failed = [c for c in results.get("checks", []) if c.failed]
    return 1 if (failed and args.strict) or results.get("violations") else 0


def mode_runner(mode: str, args: argparse.Namespace, resources: dict[str, Any] | None = None):
    """``cfg -> results`` of ``mode``: the strategies shaped for ``cfg``, the mode's run (with the
    resources it requires: ``resources`` where resolved already, else resolved from ``cfg``), then
    judged with the user's roles (``--baseline``, ``--pairs``)."""
    from trace_gym.bench import loop as bench
    from trace_gym.strategies import shaped_strategies

    entry = bench_mode(mode)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    def run(cfg: Any) -> dict[str, Any]:
        strategies = shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                                       continuations_per_root=cfg.continuations_per_root)
        given = {name: RESOURCES[name](cfg) for name in entry.requires} if resources is None else resources
        if "policy" in {f.name for f in dataclasses.fields(cfg)}:  # a mode that loads a model: checked first
            from trace_gym.runs.policies import with_policy

            cfg = with_policy(cfg)
        results = entry.run(cfg, strategies, progress=True, say=say, out_dir=args.out, **given)
        roles = bench_roles(args, results)
        return bench.judge(results, roles) if roles != Roles() else results

    return run


def _family(cfg: Any) -> Any:
    from trace_gym.registry import resolve_env

    return resolve_env(cfg.env, cfg.env_kwargs, cfg.task_kwargs)


#: What the face resolves for a mode's run (:attr:`BenchMode.requires`).
RESOURCES = {"family": _family}


def _sweep(args: argparse.Namespace, cfg: Any, run) -> int:
    from trace_gym.bench.sweep import format_sweep, parse_budgets, run_sweep, write_sweep_plots

    sweep = run_sweep(cfg, parse_budgets(args.root_budgets), run)
    _report(args, sweep, write_sweep_plots, format_sweep, [])
    failed = [c for b in sweep["benches"] for c in b.get("checks", []) if c.failed]
    return 1 if failed and args.strict else 0


def _report(args: argparse.Namespace, results: dict[str, Any], write_plots: Any, text: Any, files: list[str]) -> None:
    """The plots into ``--out``, the table, the JSON into ``--json``. A write that fails (the path
    changed while the bench ran) is one ``ValueError`` line after the rest is printed and kept:
    the JSON where it could go (:func:`~trace_gym.runs.output_paths.write_output_text`)."""
    from trace_gym.runs.output_paths import write_failure, write_output_text

    failure = None
    if args.out:
        try:
            results["plots"] = write_plots(results, args.out)
        except OSError as exc:
            results["plots"], failure = [], write_failure("--out", args.out, exc)
    print(text(results))
    if args.json:
        write_output_text(args.json, results_json(results), key="--json")
        print(f"\nwrote {args.json}")
    if failure is not None:
        raise ValueError(failure)
    if args.out:
        print(f"wrote {', '.join(results['plots'] + files)}")


def bench_roles(args: argparse.Namespace, results: dict[str, Any]) -> Roles:
    """The baseline, the method and extra pairs the user named, checked against the arms that ran."""
    roles = Roles(baseline=args.baseline or "uniform", method=args.method or "trace",
                  pairs=Roles.parse_pairs(args.pairs or ""))
    ran = sorted(results["strategies"])
    for name in [roles.baseline if args.baseline else None, roles.method if args.method else None,
                 *[n for p in roles.pairs for n in p]]:
        if name is not None and name not in ran:
            raise ValueError(f"--baseline/--method/--pairs: no strategy {name!r} ran{did_you_mean(name, ran)}; ran: "
                             f"{', '.join(ran)}")
    return roles


def add(subparsers: argparse._SubParsersAction) -> None:
    modes = bench_modes()
    p = add_config_parser(subparsers, "bench", "benchmark allocation strategies at equal budget (no training)",
                          *mode_configs().values(), labels=[f"--{name}" for name in modes],
                          epilog_prefix="Every key is also a --flag (--root-budget 32 = root_budget=32).\n\n")
    for name, mode in modes.items():
        if mode.value:
            p.add_argument(f"--{name}", metavar=mode.metavar or mode.value.upper(), help=mode.help)
        else:
            p.add_argument(f"--{name}", action="store_true", help=mode.help)
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--out", help="write PNG plots (and with --dump-episodes, transcripts) into this folder")
    p.add_argument("--strict", action="store_true", help="exit 1 when a check FAILs")
    p.add_argument("--baseline", metavar="NAME", help="the strategy every other is paired with (default uniform)")
    p.add_argument("--method", metavar="NAME", help="the strategy whose checks and verdict are printed, and that "
                   "every other is also paired with (default trace); the paper's 2x check applies to trace alone")
    p.add_argument("--pairs", metavar="A:B,...", help="more paired comparisons, e.g. my_strategy:pcl")
    p.add_argument("--root-budgets", metavar="M,M,...", help="a budget curve: the bench at each root budget M "
                   "(a table per headline metric; with --out, budget_<metric>.png)")
    add_config_flags(p, mode_configs(), skip=tuple(m.value for m in modes.values() if m.value) + tuple(modes))
    p.set_defaults(func=cmd_bench)
