"""A user's keyword arguments checked against the signature of what they are for, before the call.

A config's dict-valued keys (``env_kwargs``, ``task_kwargs``, ``predictor_kwargs``) reach a
constructor only when the work starts: an env at its first rollout, a predictor after the
policy has loaded. :func:`kwargs_problem` reads the callee's signature instead, so an unknown
name (``{"bogus": 1}``) or a value of the wrong plain type (``{"newton_steps": "x"}`` for an
``int``) is one line when the config is read.

Only names and the plain annotated types (``int``, ``float``, ``bool``, ``str``, their
``X | None``) are checked; any other annotation, and a callee that takes ``**kwargs``, is
left to the callee.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any, Callable, Collection, Mapping

from trace_gym.utils.config_fields import shown
from trace_gym.utils.suggest import did_you_mean

#: A plain annotated type -> whether a value is one (a bool is no int; an int is a float).
_PLAIN: dict[Any, Callable[[Any], bool]] = {
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    bool: lambda v: isinstance(v, bool),
    str: lambda v: isinstance(v, str),
}


def _hints(callee: Any) -> dict[str, Any]:
    """The callee's resolved annotations (``{}`` where they cannot be resolved)."""
    target = callee.__init__ if isinstance(callee, type) and not dataclasses.is_dataclass(callee) else callee
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001  (a forward reference the callee's module cannot resolve: no type check)
        return {}


def _fits(tp: Any, value: Any) -> bool:
    """Whether ``value`` is of the plain type ``tp`` (``True`` for any type this module does not check)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if not all(o in _PLAIN or o is type(None) for o in options):
            return True
        return any(value is None if o is type(None) else _PLAIN[o](value) for o in options)
    return _PLAIN.get(tp, lambda v: True)(value)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def kwargs_problem(callee: Callable[..., Any], kwargs: Mapping[str, Any], *,
                   supplied: Collection[str] = ()) -> str | None:
    """Why ``callee(**kwargs)`` would fail on its names or plain types, as a predicate
    (``does not take 'bogus'; it takes a, b``, ``takes newton_steps as
    int, got 'x'``), else ``None``.

    Args:
        callee: a function or class (its ``__init__``).
        kwargs: the user's keyword arguments.
        supplied: names the caller passes itself (the run's seed, the policy folder); the
            user may not set them, and they are not listed as taken.
    """
    try:
        params = inspect.signature(callee).parameters
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes = [n for n, p in params.items() if p.kind in named and not n.startswith("_") and n not in supplied]
    clash = sorted(set(kwargs) & set(supplied))
    if clash:
        return f"is given {', '.join(map(repr, clash))} by the run; remove it"
    any_name = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in kwargs if k not in takes and not any_name]
    if unknown:
        listed = ", ".join(takes[:12]) + (f" and {len(takes) - 12} more" if len(takes) > 12 else "")
        return (f"does not take {', '.join(map(repr, unknown))}; it takes {listed or 'none'}"
                f"{did_you_mean(str(unknown[0]), takes)}")
    hints = _hints(callee)
    for key, value in kwargs.items():
        if key in hints and not _fits(hints[key], value):
            return f"takes {key} as {_type_name(hints[key])}, got {shown(value)}"
    return None
