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
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

from trace_gym.textsafe import UNCLOSED, json_problem

#: Responses longer than this many characters are not parsed (treated as no call).
MAX_ACTION_CHARS = 65536
#: Deepest syntax (AST levels, or JSON levels of a tool call) a response may have.
MAX_NESTING = 64
#: Longest string that arithmetic on literals may build ('a' * n, 'a' + 'b').
MAX_FOLDED_CHARS = 65536
#: Characters all folded strings of one response may add up to.
MAX_DECODED_CHARS = 4 * MAX_ACTION_CHARS
#: Calls one response may hold (BFCL's ground truth has at most 34 per turn).
MAX_CALLS_PER_RESPONSE = 128
#: Largest integer (in bits) a response may hold, as a literal or computed by arithmetic;
#: Python cannot write an int of more than 4,300 digits as text (``repr`` raises).
MAX_INT_BITS = 4096
#: Longest run of digits a ``<tool_call>`` JSON block may hold (checked before parsing).
MAX_INT_DIGITS = 1234  # the decimal digits of 2**MAX_INT_BITS
#: Names bfcl-eval's executor refuses to call (``execute_multi_turn_func_call``).
BLOCKED_NAMES = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")
ACTION_FORMATS = ("python", "tool_call")

_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Model text is parsed under this file name, and its SyntaxWarnings ("invalid decimal
# literal" on random text) are filtered by it. The filter is (re)installed before each
# parse because test runners reset filters; unlike catch_warnings it is thread-safe.
_SOURCE_NAME = "<bfcl-action>"


def _parse(source: str) -> ast.Expression:
    warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(_SOURCE_NAME))
    return ast.parse(source, filename=_SOURCE_NAME, mode="eval")


def _too_deep(root: Any, children: Any) -> bool:
    """True when ``root`` is nested more than :data:`MAX_NESTING` levels (iterative: a
    deep input cannot exhaust the stack here)."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in children(node))
    return False


def _json_children(value: Any) -> Any:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    return value if isinstance(value, list) else ()


def _too_big_int(value: Any) -> bool:
    return isinstance(value, int) and value.bit_length() > MAX_INT_BITS


def _big_literal(tree: ast.AST) -> bool:
    """True when the syntax tree holds an integer literal over :data:`MAX_INT_BITS` bits."""
    return any(isinstance(n, ast.Constant) and _too_big_int(n.value) for n in ast.walk(tree))


class _Budget:
    """Characters that folded strings of one response may still add up to."""

    def __init__(self, limit: int = MAX_DECODED_CHARS):
        self.left = limit

    def charge(self, text: str) -> None:
        if len(text) > MAX_FOLDED_CHARS:
            raise DecodeError(f"arithmetic result too large: a string of {len(text)} characters "
                              f"(limit {MAX_FOLDED_CHARS})")
        self.left -= len(text)
        if self.left < 0:
            raise DecodeError(f"the computed arguments of this response exceed {MAX_DECODED_CHARS} characters")


@dataclass(frozen=True)
class Call:
    """One decoded call.

    Attributes:
        name: the function name as decoded (may hold dots or be empty for refused calls).
        text: the call rendered exactly as bfcl-eval's decoder renders it (what the
            official executor would run, and the ``name`` of the tool message).
        kwargs: the literal keyword arguments, as ``(name, value)`` pairs; ``None`` when
            the call is refused.
        error: why the call is refused (it is never executed), or ``None``.
    """

    name: str
    text: str
    kwargs: tuple[tuple[str, Any], ...] | None
    error: str | None = None

    @property
    def arguments(self) -> dict[str, Any]:
        return dict(self.kwargs or ())


@dataclass(frozen=True)
class Decoded:
    """A decoded response: its calls, or why it has none (``error``; None for plain text)."""

    calls: tuple[Call, ...]
    error: str | None = None

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)


class DecodeError(ValueError):
    """The response is not a call list bfcl-eval could decode (the turn ends)."""


class _Nested:
    """Sentinel: the rendered argument is not a literal (a nested call or an expression)."""


class _CallSource(str):
    """The source text of a call used as a value (bfcl-eval passes it on as a string;
    the env refuses the call instead, so injected code never even looks like it ran)."""


def _has_call_source(value: Any) -> bool:
    if isinstance(value, _CallSource):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_call_source(v) for v in value)
    if isinstance(value, dict):
        return any(_has_call_source(k) or _has_call_source(v) for k, v in value.items())
    return False


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
        calls = _decode_python(text) if action_format == "python" else _decode_tool_calls(text)
        if len(calls) > MAX_CALLS_PER_RESPONSE:
            raise DecodeError(f"the response has {len(calls)} calls, over the limit of {MAX_CALLS_PER_RESPONSE}")
    except DecodeError as exc:
        return Decoded((), str(exc))
    except Exception as exc:  # never reached within the bounds; a net, so model text never raises
        return Decoded((), f"the response could not be decoded ({type(exc).__name__}: {_short(exc)})")
    return Decoded(tuple(calls))


def _short(exc: BaseException, limit: int = 200) -> str:
    """An exception's message, cut, as text that encodes to UTF-8 (it may quote model text)."""
    return str(exc)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


# --- python format -------------------------------------------------------------------


def _decode_python(text: str) -> list[Call]:
    # The same clean-up as default_decode_execute_prompting + ast_parse.
    s = text.strip("`\n ")
    if not s.startswith("["):
        s = "[" + s
    if not s.endswith("]"):
        s = s + "]"
    s = s.strip().strip("'")
    try:
        tree = _parse(s)
    except Exception as exc:  # SyntaxError, or the parser's own limits (RecursionError, MemoryError...)
        raise DecodeError(f"not a list of function calls ({type(exc).__name__}: {_short(exc)})") from None
    if _too_deep(tree, ast.iter_child_nodes):
        raise DecodeError(f"the response is nested more than {MAX_NESTING} levels deep")
    if _big_literal(tree):  # before anything renders it: repr() refuses ints over 4,300 digits
        raise DecodeError(f"the response holds an integer literal of more than {MAX_INT_BITS} bits")
    body = tree.body
    if isinstance(body, ast.Call):
        elements = [body]
    elif isinstance(body, (ast.List, ast.Tuple, ast.Set)):
        elements = list(body.elts)
    else:
        raise DecodeError(f"expected a list of calls like [f(a=1), g()], got a {type(body).__name__} expression")
    if len(elements) > MAX_CALLS_PER_RESPONSE:
        raise DecodeError(f"the response has {len(elements)} calls, over the limit of {MAX_CALLS_PER_RESPONSE}")
    calls, budget = [], _Budget()
    for element in elements:
        if not isinstance(element, ast.Call):
            raise DecodeError(f"every list item must be a function call, got a {type(element).__name__}")
        calls.append(_python_call(element, budget))
    return calls


def _python_call(node: ast.Call, budget: _Budget) -> Call:
    name, plain = _func_name(node.func)
    # positional args dropped, as bfcl-eval
    resolved = {arg.arg: _resolve(arg.value, budget) for arg in node.keywords}
    rendered = [(k, _render(v)) for k, v in resolved.items()]
    text = f"{name}({', '.join(f'{k}={r}' for k, r in rendered)})"
    if not plain:
        return Call(name, text, None, "only plain function names can be called (no attribute access or call chains)")
    if any(k is None for k in resolved):
        return Call(name, text, None, "**kwargs is not allowed; pass each argument as name=value")
    kwargs = []
    for (key, rendered_value), value in zip(rendered, resolved.values()):
        if _has_call_source(value):
            return Call(name, text, None, f"argument {key!r} is a function call; calls are not run inside arguments, pass a literal value")
        literal = value if _plain(value) else _literal(rendered_value)
        if literal is _Nested:
            return Call(name, text, None, f"argument {key!r}={rendered_value[:80]} is not a literal value (nested calls and expressions are not run)")
        kwargs.append((key, literal))
    return Call(name, text, tuple(kwargs))


def _func_name(func: ast.AST) -> tuple[str, bool]:
    """bfcl-eval's name (dotted attribute chain, base call dropped) and whether it is a plain name."""
    parts = []
    node = func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts)), isinstance(func, ast.Name)


def _resolve(node: ast.AST, budget: _Budget) -> Any:
    """bfcl-eval's ``resolve_ast_by_type``, minus its two ``eval`` calls."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        operand = node.operand  # bfcl-eval negates the operand's value whatever the operator
        if isinstance(operand, ast.Constant) and isinstance(operand.value, (int, float, complex)):
            return -operand.value
        raise DecodeError(f"unsupported unary expression {type(node.op).__name__} on {type(operand).__name__}")
    if isinstance(node, ast.List):
        return [_resolve(v, budget) for v in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise DecodeError("dict unpacking (**) is not supported in arguments")
        return {_resolve(k, budget): _resolve(v, budget) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp):
        return _fold(node, budget)
    if isinstance(node, ast.Call):
        if not node.keywords:  # bfcl-eval passes a keyword-less call on as its source text
            return _CallSource(ast.unparse(node))
        name, _ = _func_name(node.func)  # bfcl-eval renders it back as a nested call (refused below)
        return {name: {k.arg: _resolve(k.value, budget) for k in node.keywords}}
    if isinstance(node, ast.Tuple):
        return tuple(_resolve(v, budget) for v in node.elts)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise DecodeError(f"unsupported argument expression: {type(node).__name__}")


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,  # numbers only: '%s' % x is string formatting (refused below)
    ast.Pow: operator.pow,
}


def _fold(node: ast.AST, budget: _Budget) -> Any:
    """Arithmetic on literals (bfcl-eval ``eval``s it; we compute it safely, with limits)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex, str, bool)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _fold(node.operand, budget)
        if not isinstance(value, (int, float, complex)):
            raise DecodeError("unary +/- needs a number")
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _fold(node.left, budget), _fold(node.right, budget)
        if isinstance(node.op, ast.Pow):
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                if right > MAX_INT_BITS or max(left.bit_length(), 1) * right > MAX_INT_BITS:
                    raise DecodeError("arithmetic result too large")
        if isinstance(node.op, ast.Mod) and not all(isinstance(x, (int, float, complex)) for x in (left, right)):
            raise DecodeError("% is only supported between numbers")
        if isinstance(node.op, ast.Mult) and any(isinstance(x, str) for x in (left, right)):
            count = right if isinstance(left, str) else left
            text = left if isinstance(left, str) else right
            if isinstance(count, int) and count * len(text) > MAX_FOLDED_CHARS:
                raise DecodeError("arithmetic result too large")
        if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
            if len(left) + len(right) > MAX_FOLDED_CHARS:
                raise DecodeError("arithmetic result too large")
        try:
            value = _BINOPS[type(node.op)](left, right)
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise DecodeError(f"arithmetic failed: {type(exc).__name__}: {exc}") from None
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise DecodeError("arithmetic result too large")
        if isinstance(value, str):
            budget.charge(value)
        return value
    raise DecodeError(f"only arithmetic on literal numbers and strings is supported, got {type(node).__name__}")


def _render(value: Any) -> str:
    """bfcl-eval's ``parse_nested_value``: how a decoded value is written into the call string."""
    if isinstance(value, dict):
        if all(isinstance(v, dict) for v in value.values()):
            if not value:
                raise DecodeError("an empty dict argument cannot be decoded by bfcl-eval ({} reads as a call)")
            func_name = list(value)[0]
            inner = ", ".join(f"{k}={_render(v)}" for k, v in value[func_name].items())
            return f"{func_name}({inner})"
        return "{" + ", ".join(f"'{k}': {_render(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _literal(rendered: str) -> Any:
    """The value the official executor's ``eval`` would see, when it is a literal."""
    try:
        tree = _parse(rendered)
        if any(isinstance(n, ast.Call) for n in ast.walk(tree)):
            return _Nested
        return ast.literal_eval(tree.body)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _Nested


_SCALARS = (str, bytes, int, bool, type(None))


def _plain(value: Any) -> bool:
    """True when ``literal_eval(repr(value)) == value`` with the same types (a fast path)."""
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return False


# --- tool-call format ----------------------------------------------------------------


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
    if _too_deep(value, _json_children):
        raise DecodeError(f"{what} is nested more than {MAX_NESTING} levels deep")
    if any(_too_big_int(v) for v in _json_values(value)):
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


def _decode_tool_calls(text: str) -> list[Call]:
    items = []
    for block in _TOOL_CALL.findall(text):
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
        literal = args[key] if _plain(args[key]) else _literal(rendered_value)
        if literal is _Nested:
            return Call(name, text, None, f"argument {key!r}={rendered_value[:80]} is not a literal value")
        kwargs.append((key, literal))
    return Call(name, text, tuple(kwargs))


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
