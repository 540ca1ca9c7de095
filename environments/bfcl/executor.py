"""Run decoded calls on this episode's own instances of the real BFCL backends.

Mirrors ``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils.execute_multi_turn_func_call``
in everything that affects results and state, and differs only where it is unsafe:

* instances: one per involved class, ``cls()``, then (unless the class is stateless)
  ``_load_scenario(deepcopy(initial_config.get(cls, {})), long_context=...)``;
* the callable names: every public bound method of the involved instances, later
  classes winning a name clash (there are none in the data);
* results: a ``str`` as is, a ``dict`` as ``json.dumps`` (``str`` if that fails),
  anything else ``str(...)``; an exception as ``"Error during execution: <message>"``;
* the names bfcl-eval blocks (``kill``, ``exit``, ...) give its message.

Unlike the official executor nothing is ``eval``-ed: a call is a dictionary lookup of a
bound method of this episode's instances and ``method(**literal_kwargs)``. Unknown names
get the message Python's ``eval`` would give (``name 'x' is not defined``) without
looking anything up in builtins or module globals. Two resource guards protect the
process from absurd arguments (official runs would hang or exhaust memory): MathAPI
precision above :data:`MAX_PRECISION` digits and integer powers with more than
:data:`MAX_POWER_BITS` result bits are refused with an error result. MathAPI sets the
process-wide ``mpmath``/``decimal`` precision; it is restored after every call.
"""

from __future__ import annotations

import copy
import decimal
import functools
import importlib
import inspect
import json
import threading
from typing import Any, Iterable, Mapping

from environments.bfcl.data import BACKEND_CLASSES
from environments.bfcl.parsing import BLOCKED_NAMES, Call, parse_ground_truth_call

_MATH_LOCK = threading.Lock()
MAX_PRECISION = 10_000
MAX_POWER_BITS = 1 << 20
ERROR_PREFIX = "Error during execution: "


@functools.lru_cache(maxsize=None)
def backend_class(class_name: str) -> type:
    """The real backend class shipped in bfcl-eval (only the eight multi-turn ones)."""
    if class_name not in BACKEND_CLASSES:
        raise KeyError(f"{class_name!r} is not a multi-turn backend; expected one of {BACKEND_CLASSES}")
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


@functools.lru_cache(maxsize=1)
def stateless_classes() -> frozenset[str]:
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    return frozenset(STATELESS_CLASSES)


def make_instances(initial_config: Mapping[str, Any], involved_classes: Iterable[str], long_context: bool) -> dict[str, Any]:
    """Fresh backend instances, initialised exactly as the official executor does."""
    instances = {}
    for class_name in involved_classes:
        instance = backend_class(class_name)()
        if class_name not in stateless_classes():
            instance._load_scenario(copy.deepcopy(dict(initial_config).get(class_name, {})), long_context=long_context)
        instances[class_name] = instance
    return instances


def method_table(instances: Mapping[str, Any]) -> dict[str, str]:
    """Public method name -> class name (later classes win, as in bfcl-eval)."""
    table: dict[str, str] = {}
    for class_name, instance in instances.items():
        for name in public_methods(instance):
            table[name] = class_name
    return table


_PUBLIC_METHODS: dict[type, tuple[str, ...]] = {}


def public_methods(instance: Any) -> tuple[str, ...]:
    """Names of the instance's public bound methods (``inspect.ismethod``, as bfcl-eval)."""
    cls = type(instance)
    if cls not in _PUBLIC_METHODS:
        _PUBLIC_METHODS[cls] = tuple(
            n for n, _ in inspect.getmembers(instance, predicate=inspect.ismethod) if not n.startswith("_")
        )
    return _PUBLIC_METHODS[cls]


def format_result(value: Any) -> str:
    """A return value as the official executor writes it into the results list."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:  # the official executor falls back to str() on anything
            return str(value)
    return str(value)


def _guard(class_name: str, method: str, kwargs: Mapping[str, Any]) -> str | None:
    """Refuse arguments that would hang or exhaust the process; None when fine."""
    if class_name != "MathAPI":
        return None
    precision = kwargs.get("precision")
    if isinstance(precision, (int, float)) and not isinstance(precision, bool) and abs(precision) > MAX_PRECISION:
        return f"precision {precision} is above the env's limit of {MAX_PRECISION} digits"
    if method == "power":
        base, exponent = kwargs.get("base"), kwargs.get("exponent")
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
            if exponent * base.bit_length() > MAX_POWER_BITS:
                return f"power({base}, {exponent}) is above the env's limit of {MAX_POWER_BITS} result bits"
    for value in kwargs.values():  # huge ints make str()/Decimal slow
        if isinstance(value, int) and value.bit_length() > MAX_POWER_BITS:
            return "an integer argument is above the env's size limit"
    return None


def _call_isolated(method: Any, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """Call and format the result (an ``mpf``'s text depends on the precision the call
    set), then restore the process-wide precision MathAPI may have changed. MathAPI
    calls hold a lock: ``mpmath.mp.dps`` is shared by all threads (envs in a pool)."""
    if not isinstance(method.__self__, backend_class("MathAPI")):
        return format_result(method(*args, **kwargs))
    import mpmath

    with _MATH_LOCK:
        dps, ctx = mpmath.mp.dps, decimal.getcontext().copy()
        try:
            return format_result(method(*args, **kwargs))
        finally:
            mpmath.mp.dps = dps
            decimal.setcontext(ctx)


def execute(instances: Mapping[str, Any], table: Mapping[str, str], name: str, args: tuple = (), kwargs: Mapping[str, Any] | None = None) -> str:
    """Run one call by name on ``instances``; returns the result string (never raises)."""
    kwargs = dict(kwargs or {})
    if name in BLOCKED_NAMES:
        return f"{ERROR_PREFIX}Function call {name} is not allowed."
    class_name = table.get(name)
    if class_name is None:
        return f"{ERROR_PREFIX}name '{name}' is not defined"
    problem = _guard(class_name, name, kwargs)
    if problem is not None:
        return f"Error: {problem}; the call was not run."
    method = getattr(instances[class_name], name)
    try:
        return _call_isolated(method, args, kwargs)
    except Exception as exc:  # a backend error is a result the model reads, as in bfcl-eval
        return f"{ERROR_PREFIX}{exc}"


def execute_calls(instances: Mapping[str, Any], table: Mapping[str, str], calls: Iterable[Call]) -> list[str]:
    """Run decoded calls in order; refused calls give their error and run nothing."""
    results = []
    for call in calls:
        if call.error is not None:
            results.append(f"Error: {call.error}; the call was not run.")
        else:
            results.append(execute(instances, table, call.name, (), dict(call.kwargs or ())))
    return results


def keyword_form(table: Mapping[str, str], text: str) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string as ``(name, kwargs)``, positional arguments named.

    bfcl-eval's decoder drops positional arguments from model output, so a model must
    name them; the reference actions do, using the backend method's signature.
    """
    name, args, kwargs = parse_ground_truth_call(text)
    if args:
        if name not in table:
            raise ValueError(f"ground-truth call {text!r}: {name!r} is not a method of the involved classes")
        signature = inspect.signature(getattr(backend_class(table[name]), name))
        params = [p for p in signature.parameters.values() if p.name != "self"]
        if len(args) > len(params):
            raise ValueError(f"ground-truth call {text!r} has more positional arguments than {name} takes")
        named = {p.name: a for p, a in zip(params, args)}
        overlap = set(named) & set(kwargs)
        if overlap:
            raise ValueError(f"ground-truth call {text!r} gives {sorted(overlap)} twice")
        kwargs = {**named, **kwargs}
    return name, kwargs
