"""Decode a model response into calls, exactly as bfcl-eval does, without ever eval-ing it.

Two action formats:

``python`` (BFCL's prompting format, the default)
    A Python-style list of calls, ``[cd(folder='document'), ls(a=True)]``. Decoding
    mirrors ``bfcl_eval.model_handler.utils.default_decode_execute_prompting`` step by
    step (the same string clean-up, the same AST walk, the same rendering of each call
    to a string), so the env sees the very calls the official pipeline would execute,
    including its quirks: positional arguments are dropped, a bare name ``x`` becomes
    the string ``'x'``, ``a[0]`` becomes the string ``'a[0]'``, and
    ``-``/``+``/``~``/``not`` in front of a number all negate it. One deliberate
    difference: bfcl-eval passes a call used as an argument value (``cd(folder=pwd())``)
    on as its source text, or, with keywords, runs it; the env refuses such a call.
``tool_call`` (Qwen style)
    ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks, decoded as
    bfcl-eval's ``QwenFCHandler.decode_execute`` does.

Either way, text up to a final ``</think>`` is reasoning and is dropped first (as
bfcl-eval's Qwen handlers do).

Safety: the official decoder ``eval``s arithmetic and the official executor ``eval``s the
rendered call strings. Here nothing is evaluated: argument values are rebuilt from the
rendered text with :func:`ast.literal_eval`, arithmetic on literal numbers/strings is
folded by a small interpreter with size limits, and a call that would need anything
else (attribute access, calls used as argument values, ``**kwargs``, non-literal values)
is *refused*: it becomes an error result and is not executed. A response that bfcl-eval
cannot decode at all (syntax error, a list item that is not a call, lambdas,
comprehensions, f-strings, names inside arithmetic...) has no calls, which ends the user
turn, as in BFCL's inference loop. Responses longer than ``max_chars`` are not parsed.

Bounds (model text can never exhaust the stack or memory; a response over a bound has
no calls, like any undecodable response): syntax nested more than
:data:`MAX_NESTING` levels (``1+1+...+1`` with 100 terms, ``arguments`` nested 100
deep in JSON; JSON is measured *before* it is parsed), an integer over
:data:`MAX_INT_BITS` bits (a literal such as ``0x`` + 4,000 digits, whose decimal text
Python refuses to write, or a JSON number over :data:`MAX_INT_DIGITS` digits), a folded
string over :data:`MAX_FOLDED_CHARS`, folded strings adding up to more than
:data:`MAX_DECODED_CHARS` per response, more than :data:`MAX_CALLS_PER_RESPONSE` calls.
Any other failure while decoding is reported the same way (the error names it): no
model text makes :func:`decode` raise.

Layout: this module holds :func:`decode`, :func:`render_action` and the ground-truth
parser; the formats' decoders are :mod:`environments.bfcl.python_calls` and
:mod:`environments.bfcl.tool_calls`; the results (:class:`Call`, :class:`Decoded`,
:class:`DecodeError`) and the bounds are :mod:`environments.bfcl.calls`, importable from here.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any, Mapping

from environments.bfcl.calls import (  # noqa: F401  (re-exported)
    MAX_ACTION_CHARS, MAX_CALLS_PER_RESPONSE, MAX_DECODED_CHARS, MAX_FOLDED_CHARS, MAX_INT_BITS, MAX_INT_DIGITS,
    MAX_NESTING, Call, Decoded, DecodeError, short_message)
from environments.bfcl.python_calls import decode_python
from environments.bfcl.tool_calls import decode_tool_calls

#: Names bfcl-eval's executor refuses to call (``execute_multi_turn_func_call``).
BLOCKED_NAMES = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
ACTION_FORMATS = ("python", "tool_call")


def strip_reasoning(text: str) -> str:
    """Drop everything up to the last ``</think>`` (bfcl-eval's Qwen handlers do this)."""
    if "</think>" in text:
        return text.split("</think>")[-1].lstrip("\n")
    return text


def decode(text: Any, action_format: str = "python", max_chars: int = MAX_ACTION_CHARS) -> Decoded:
    """Decode one model response; never raises on model input."""
    if action_format not in ACTION_FORMATS:
        raise ValueError(f"action_format must be one of {ACTION_FORMATS}, got {action_format!r}")
    if not isinstance(text, str):
        return Decoded((), f"the action must be a str, got {type(text).__name__}")
    if len(text) > max_chars:
        return Decoded((), f"the response has {len(text)} characters, over the {max_chars} limit; it was not parsed")
    text = strip_reasoning(text)
    try:
        calls = decode_python(text) if action_format == "python" else decode_tool_calls(text)
        if len(calls) > MAX_CALLS_PER_RESPONSE:
            raise DecodeError(f"the response has {len(calls)} calls, over the limit of {MAX_CALLS_PER_RESPONSE}")
    except DecodeError as exc:
        return Decoded((), str(exc))
    except Exception as exc:  # never reached within the bounds; a net, so model text never raises
        return Decoded((), f"the response could not be decoded ({type(exc).__name__}: {short_message(exc)})")
    return Decoded(tuple(calls))


# --- rendering calls back into actions ---------------------------------------------


def render_action(calls: list[tuple[str, Mapping[str, Any]]], action_format: str = "python") -> str:
    """Write ``[(name, kwargs), ...]`` as one model response in ``action_format``."""
    if action_format == "python":
        return "[" + ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in kw.items())})" for name, kw in calls) + "]"
    if action_format == "tool_call":
        return "\n".join(
            "<tool_call>\n" + json.dumps({"name": name, "arguments": dict(kw)}) + "\n</tool_call>" for name, kw in calls
        )
    raise ValueError(f"action_format must be one of {ACTION_FORMATS}, got {action_format!r}")


def parse_ground_truth_call(text: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """A ground-truth call string ``f(1, b='x')`` -> ``('f', (1,), {'b': 'x'})`` (literals only)."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"ground-truth call {text!r} is not valid Python: {exc}") from None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError(f"ground-truth call {text!r} is not a plain call f(...)")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError as exc:
        raise ValueError(f"ground-truth call {text!r} has a non-literal argument: {exc}") from None
    if None in kwargs:
        raise ValueError(f"ground-truth call {text!r} uses **kwargs")
    return node.func.id, args, kwargs


def is_finite_literal(value: Any) -> bool:
    """True when ``repr(value)`` reads back with ``ast.literal_eval`` (no inf/nan)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(is_finite_literal(v) for v in value)
    if isinstance(value, dict):
        return all(is_finite_literal(k) and is_finite_literal(v) for k, v in value.items())
    return True
