"""The commands of ``trace-gym`` (the face): one module per command, all added to the one
parser of :mod:`trace_gym.cli`.

=============  ===============================================================  ===================
command        what it does                                                    its keys
=============  ===============================================================  ===================
``bench``      strategies at one budget: simulator, real rollouts, or a bank   ``SimBenchConfig`` /
                                                                                ``EnvBenchConfig`` /
                                                                                ``BankBenchConfig``
``bank``       rollout banks: ``record`` (its keys), ``stats``, ``list``       ``BankRecordConfig``
``train``      one training run (run dir, resume, eval)                         ``TrainConfig``
``eval``       checkpoints on suites (cached)                                   ``EvalConfig``
``compare``    training runs and eval dirs side by side, paired                 its flags
``check-env``  the env conformance kit (``check_env``) on an env id             its flags
``index``      retrieval indexes: build, serve, recall, info                    its flags
``envs`` ...   listings: envs, strategies, estimators, predictors, models       its flags
=============  ===============================================================  ===================

Every command takes ``--config FILE`` and ``key=value``: for the commands with a config
dataclass the keys are its fields (dotted for a section: ``trainer.lr=1e-5``); for the
others the keys are the names of their flags (``out=runs/cmp`` = ``--out runs/cmp``).
Flags of a config command (``bench --seeds 3``) are aliases of its keys.
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping, Sequence

from trace_gym.config import config_help, load_config

#: argparse default that marks a parser whose keys are a config dataclass's fields.
CONFIG_KEYS = "config_keys"

#: Every entry point: the command line -> ``module:class`` of its config, each beside its entry point.
ENTRY_CONFIGS: dict[str, str] = {
    "bench --sim": "trace_gym.bench.config:SimBenchConfig",
    "bench --env": "trace_gym.bench.config:EnvBenchConfig",
    "bench --bank": "trace_gym.bench.config:BankBenchConfig",
    "train": "trace_gym.train.config:TrainConfig",
    "bank record": "trace_gym.banks.config:BankRecordConfig",
    "eval": "evaluators.run:EvalConfig",
}


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def by_meaning(entries: Sequence[tuple[str, Any, str]]) -> list[tuple[list[str], list[Any], str]]:
    """``(label, default, help)`` entries of one key (one per mode) grouped by help text, in
    order: ``[(labels, their defaults, help)]``. A key whose help differs by mode (bench's
    ``predictor``: the simulator's kinds or the text kinds) is described per mode."""
    groups: dict[str, tuple[list[str], list[Any]]] = {}
    for label, default, text in entries:
        labels, defaults = groups.setdefault(text, ([], []))
        labels.append(label)
        defaults.append(default)
    return [(labels, defaults, text) for text, (labels, defaults) in groups.items()]


def _defaults(labels: Sequence[str], defaults: Sequence[Any]) -> str:
    """``default 4`` when the defaults agree, else ``default: 8 with --sim, 4 with --env``."""
    if len({repr(d) for d in defaults}) == 1:
        return f"default {defaults[0]!r}"
    return "default: " + ", ".join(f"{d!r} with {label}" for label, d in zip(labels, defaults))


def config_epilog(*classes: type, title: str = "keys (--config YAML or key=value)",
                  labels: Sequence[str] | None = None) -> str:
    """The ``--help`` epilog listing every key of ``classes`` with type, default and help;
    with ``labels`` (one per class, e.g. bench's ``--sim``) a key whose help differs between
    classes is described per label."""
    rows: dict[str, list[tuple[str, str, Any, str]]] = {}
    for label, cls in zip(labels or [""] * len(classes), classes):
        for name, tname, default, text in config_help(cls):
            rows.setdefault(name, []).append((label, tname, default, text))
    lines = [f"{title}:"]
    for name, entries in rows.items():
        groups = by_meaning([(label, default, text) for label, _, default, text in entries])
        tname = entries[0][1]
        if labels is None or len(groups) == 1:
            lines.append(f"  {name} ({tname}, default {entries[0][2]!r}): {entries[0][3]}")
        else:
            lines.append(f"  {name} ({tname}): " + "; ".join(
                f"with {' or '.join(ls)}: {text} ({_defaults(ls, ds)})" for ls, ds, text in groups))
    return _escape("\n".join(lines))


def add_config_parser(subparsers: argparse._SubParsersAction, name: str, help_text: str, *classes: type,
                      description: str | None = None, epilog_prefix: str = "",
                      flags: bool = False, skip: Sequence[str] = (),
                      labels: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """A subcommand whose keys are the fields of ``classes``: ``--config FILE`` plus
    ``key=value`` (collected by :func:`trace_gym.cli.main` into ``args.overrides``), and
    with ``flags`` a ``--flag`` alias per key (:func:`add_config_flags`; ``skip``: keys whose
    flag the command adds itself); ``labels`` name the classes where a key's help differs
    between them (:func:`config_epilog`). The usage line names the full command path
    (``trace-gym bank record``): argparse fills ``%(prog)s`` from the parent parser's prog."""
    p = subparsers.add_parser(name, help=help_text, description=description or help_text,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=_escape(epilog_prefix) + config_epilog(*classes, labels=labels),
                              usage="%(prog)s [--config FILE] [options] [key=value ...]")
    p.add_argument("--config", metavar="FILE", help="YAML file of keys (key=value and flags override it)")
    p.set_defaults(**{CONFIG_KEYS: True})
    if flags:
        add_config_flags(p, {c.__name__: c for c in classes}, skip=skip)
    return p


def command_config(cls: type, args: argparse.Namespace, aliases: Mapping[str, Any] | None = None) -> Any:
    """``cls`` from ``--config``, then ``key=value``, then the flags given: every ``--key``
    alias of a field (:func:`add_config_flags`) and the named ``aliases`` (not ``None``)."""
    overrides = dict(getattr(args, "overrides", None) or {})
    registered = set(getattr(args, "_config_flags", ()) or ()) & {name for name, *_ in config_help(cls)}
    overrides.update({name: getattr(args, name) for name in sorted(registered) if getattr(args, name) is not None})
    overrides.update({k: v for k, v in (aliases or {}).items() if v is not None})
    return load_config(cls, getattr(args, "config", None), overrides)


def summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring, on one line ("" without one)."""
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def add_config_flags(parser: argparse.ArgumentParser, modes: dict[str, type], skip: Sequence[str] = ()) -> None:
    """One ``--flag`` per field of the mode configs (union); the help names each mode's default.

    Values stay strings here (``default=None`` marks "not given"); :func:`command_config`
    (and the bench's ``mode_config``) parse them by the field's type. The flags' names are
    recorded in the parser's ``_config_flags`` default, the only attributes read as aliases.
    """
    seen: dict[str, list[tuple[str, str, Any, str]]] = {}
    for mode, cls in modes.items():
        for name, tname, default, text in config_help(cls):
            if name not in skip:
                seen.setdefault(name, []).append((mode, tname, default, text))
    for name, entries in seen.items():
        _, tname, _, text = entries[0]
        groups = by_meaning([(f"--{mode}", default, text) for mode, _, default, text in entries])
        if len(entries) == 1 and len(modes) > 1:
            described = f"{text} (default: {entries[0][2]!r}; only with --{entries[0][0]})"
        elif len(groups) == 1:
            described = f"{text} ({_defaults(*groups[0][:2]).replace('default ', 'default: ', 1)})"
        else:  # the modes mean different things by it (bench's predictor kinds): each says its own
            described = "; ".join(f"with {' or '.join(ls)}: {t} ({_defaults(ls, ds)})" for ls, ds, t in groups)
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar=tname.split("[")[0].upper(),
                            help=described.replace("%", "%%"))
    parser.set_defaults(_config_flags=tuple(seen))
