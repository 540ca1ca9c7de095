"""Decoding the ``tool_call`` action format (Qwen style), ``<tool_call>`` blocks of
``{"name": ..., "arguments": {...}}``, as bfcl-eval's ``QwenFCHandler.decode_execute`` does.

:func:`decode_tool_calls` measures each JSON block before parsing it (nesting, digits), skips
blocks that are not JSON as bfcl-eval does, and refuses names and arguments that are not
plain identifiers or literal values.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from environments.bfcl.calls import (MAX_INT_BITS, MAX_INT_DIGITS, MAX_NESTING, Call, DecodeError, NotLiteral,
                                     is_plain, literal_value, too_big_int, too_deep)
from trace_gym.utils.textsafe import UNCLOSED, json_problem, tagged_blocks

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _json_children(value: Any) -> Any:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    return value if isinstance(value, list) else ()


def _loads(block: str, what: str) -> Any:
    """``json.loads(block)``, bounded before parsing; ``_NOT_JSON`` when it is not JSON."""
    problem = json_problem(block, MAX_NESTING, MAX_INT_DIGITS)
    if problem == UNCLOSED:
        return _NOT_JSON
    if problem is not None:
        raise DecodeError(f"{what} {problem}")  # "is nested more than 64 levels deep", ...
    try:
        value = json.loads(block)
    except Exception:  # JSONDecodeError, or anything else json refuses
        return _NOT_JSON
    if too_deep(value, _json_children):
        raise DecodeError(f"{what} is nested more than {MAX_NESTING} levels deep")
    if any(too_big_int(v) for v in _json_values(value)):
        raise DecodeError(f"{what} holds an integer of more than {MAX_INT_BITS} bits")
    return value


_NOT_JSON = object()


def _json_values(value: Any) -> Any:
    """Every value and key inside a parsed JSON value (iterative; depth already bounded)."""
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        stack.extend(_json_children(item))


def decode_tool_calls(text: str) -> list[Call]:
    """The calls of one ``tool_call``-format response (reasoning already stripped); raises
    DecodeError when a block is not a call object or is over a bound."""
    items = []
    for _, block in tagged_blocks(text, "<tool_call>\n", "\n</tool_call>"):
        item = _loads(block, "a <tool_call> block")
        if item is not _NOT_JSON:  # bfcl-eval skips blocks that are not JSON
            items.append(item)
    if any(not isinstance(item, dict) for item in items):
        raise DecodeError("every <tool_call> block must hold a JSON object")
    calls = []
    for item in items:
        if "name" not in item or "arguments" not in item:
            raise DecodeError('a <tool_call> object needs "name" and "arguments"')
        name, args = item["name"], item["arguments"]
        if isinstance(args, str):
            args = _loads(args, f"the arguments string of {str(name)[:60]!r}")
            if args is _NOT_JSON:
                raise DecodeError(f"the arguments of {str(name)[:60]!r} are a string that is not JSON")
        if not isinstance(args, dict):
            raise DecodeError(f'"arguments" must be a JSON object, got {type(args).__name__}')
        try:
            hash(name)
        except TypeError:
            raise DecodeError('"name" must be a string') from None
        rendered = [(k, repr(v)) for k, v in args.items()]
        text_form = f"{name}({','.join(f'{k}={r}' for k, r in rendered)})"
        calls.append(_tool_call(name, text_form, args, rendered))
    return calls


def _tool_call(name: Any, text: str, args: Mapping[str, Any], rendered: list[tuple[str, str]]) -> Call:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        return Call(str(name), text, None, f"the function name {str(name)[:60]!r} is not a plain identifier")
    kwargs = []
    for key, rendered_value in rendered:
        if not _IDENTIFIER.match(key):
            return Call(name, text, None, f"argument name {key[:60]!r} is not an identifier")
        literal = args[key] if is_plain(args[key]) else literal_value(rendered_value)
        if literal is NotLiteral:
            return Call(name, text, None, f"argument {key!r}={rendered_value[:80]} is not a literal value")
        kwargs.append((key, literal))
    return Call(name, text, tuple(kwargs))
