"""``trace-gym check-env ENV``: the conformance kit (:func:`trace_gym.env.checks.check_env`)
on any env id, from the command line.

The env is resolved as every command resolves ``--env`` (a family, a registered id, or
another ecosystem's ``gem:...``, ``verifiers:MODULE``, ...); its first ``tasks`` tasks
are played with the env's reference actions (else seeded samples). Each check prints
PASS (with the cases it verified), SKIP (with why) or FAIL (with the env's error) as it
finishes; the kit stops at the first failure. Every call into the env has --call-timeout-s
seconds (a hung reset or step is a FAIL naming the call and the deadline), and an env that
calls sys.exit, or whose task loader or constructor raises, is a FAIL line too. Exit 0
when nothing failed, 1 when a check (or loading the env) failed, 2 for a bad env id,
check name or option (checked before the env loads).
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from trace_gym.env.boundary import DEFAULT_CALL_TIMEOUT_S, error_text
from trace_gym.utils.suggest import did_you_mean
from trace_gym.utils.textsafe import clean_text


def check_names(only: str | None) -> tuple[str, ...]:
    """The checks ``only=a,b`` names, in the kit's order (all of them for ``None``).

    Raises:
        ValueError: a name that is no check (one line, with the closest ones).
    """
    from trace_gym.env.checks import CHECKS

    if only is None:
        return tuple(CHECKS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    for name in names:
        if name not in CHECKS:
            raise ValueError(f"only: {name!r} is not a check{did_you_mean(name, CHECKS)}; the checks are "
                             f"{', '.join(CHECKS)}")
    if not names:
        raise ValueError(f"only is empty; name checks among {', '.join(CHECKS)}")
    return tuple(n for n in CHECKS if n in names)


def _json_object(flag: str, text: str | None) -> dict[str, Any]:
    """The JSON object of ``--flag`` (the config loader's bounded parse: depth, size, string keys)."""
    from trace_gym.config import coerce

    if not text:
        return {}
    try:
        return coerce(dict, text)
    except ValueError as exc:
        raise ValueError(f"--{flag}: {exc}") from None


def say(text: str) -> None:
    """Print one line of the verdict: its whitespace folded, lone surrogates written as
    ``\\udXXX`` (an env's error text may hold them; stdout's encoder would refuse them)."""
    print(clean_text(" ".join(text.split()) if "\n" in text else text), flush=True)


class EnvCodeFailed(Exception):
    """The env's task loader or constructor raised or exited (one line naming which)."""


def env_code(what: str, make: Callable[[], Any]) -> Any:
    """``make()``: the env's own code run on the main thread (a verifiers env must be built
    there), its failures (``sys.exit`` and a missing entry module included) one
    :class:`EnvCodeFailed` line. A ``ValueError`` passes (exit 2): a loader or constructor
    refusing its arguments, which are the user's."""
    try:
        return make()
    except (ValueError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001  (the env's code: whatever it raised, sys.exit included)
        raise EnvCodeFailed(f"{what} raised {error_text(exc)}") from exc


def cmd_check_env(args: argparse.Namespace) -> int:
    from trace_gym.env.checks import check_env, check_options
    from trace_gym.env.contract import EnvCheckError
    from trace_gym.models import quiet_third_party
    from trace_gym.registry import load_plugins, resolve_env

    names = check_names(args.only)  # a bad name or option before anything loads
    if args.tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {args.tasks}")
    check_options(max_steps=args.max_steps, seed=args.seed, process_timeout=args.process_timeout,
                  call_timeout_s=args.call_timeout_s)
    load_plugins()
    quiet_third_party()
    family = resolve_env(args.env, _json_object("env-kwargs", args.env_kwargs),
                         _json_object("task-kwargs", args.task_kwargs), keys=("--env-kwargs", "--task-kwargs"))
    try:
        tasks = env_code("its task loader", lambda: family.load_tasks(args.tasks, seed=args.seed))
        env = env_code("building the env", family.make_env)
    except EnvCodeFailed as exc:
        if args.verbose and isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None
        say(f"check-env {args.env}: FAIL: {exc} (no check ran)")
        return 1
    say(f"check-env {args.env} ({family.env_id}): {len(tasks)} task(s) from seed {args.seed}, "
        f"{len(names)} of the kit's checks")
    done: list[str] = []

    def said(name: str, passed: int | None, report: Any) -> None:
        done.append(name)
        if passed is not None:
            say(f"  PASS  {name} ({passed} case{'s' if passed != 1 else ''})")
        elif name in report.skipped:
            say(f"  SKIP  {name}: {report.skipped[name]}")
        else:  # a check that applies to other envs only (replay_deterministic to replayed ones)
            say(f"  n/a   {name} (not for this env: snapshot strategy {report.snapshot_strategy})")

    try:
        report = check_env(env, tasks, make_env=family.make_env, max_steps=args.max_steps, seed=args.seed,
                           process_timeout=args.process_timeout, only=names, on_check=said,
                           call_timeout_s=args.call_timeout_s)
    except Exception as exc:  # noqa: BLE001  (the env under test failing a check, whatever it raised)
        if args.verbose:
            raise
        failed = exc.check if isinstance(exc, EnvCheckError) else next(n for n in names if n not in done)
        text = str(exc).removeprefix(f"[{failed}] ") if isinstance(exc, EnvCheckError) else error_text(exc)
        say(f"  FAIL  {failed}: {' '.join(text.split())}")
        rest = [n for n in names if n not in done and n != failed]
        if rest:
            say(f"  not run: {', '.join(rest)} (the kit stops at the first failure; only={','.join(rest)} runs them)")
        return 1
    say(f"OK: snapshot strategy {report.snapshot_strategy}; {len(report.passed)} passed, "
        f"{len(report.skipped)} skipped")
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    from trace_gym.env.checks import CHECKS

    p = subparsers.add_parser(
        "check-env", help="run the env conformance kit (check_env) on an env id",
        description=__doc__.split("\n\n", 1)[1].replace("``", "`"),
        epilog="checks (only=NAME[,NAME...], run in this order): " + ", ".join(CHECKS))
    p.add_argument("env", metavar="ENV", help="env family, registered id or another ecosystem's id (gem:..., "
                   "verifiers:MODULE, ...); `trace-gym envs` lists them")
    p.add_argument("--only", metavar="CHECK[,CHECK...]", help="run just these checks (default: all)")
    p.add_argument("--tasks", type=int, default=3, help="tasks played (default 3)")
    p.add_argument("--seed", type=int, default=0, help="task seed and reset seed (default 0)")
    p.add_argument("--max-steps", type=int, default=12, help="actions per task at most (default 12)")
    p.add_argument("--process-timeout", type=float, default=300.0,
                   help="seconds for the cross-process snapshot check (default 300)")
    p.add_argument("--call-timeout-s", type=float, default=DEFAULT_CALL_TIMEOUT_S,
                   help="seconds each call into the env (reset, step, snapshot, restore, close) may take "
                   f"(default {DEFAULT_CALL_TIMEOUT_S:g}); an adapted env (gem:..., verifiers:...) keeps its own "
                   "call_timeout_s")
    p.add_argument("--env-kwargs", metavar="JSON", help="extra env keyword arguments, a JSON object")
    p.add_argument("--task-kwargs", metavar="JSON", help="extra task-loader keyword arguments, a JSON object")
    p.set_defaults(func=cmd_check_env)
