"""Decoding the ``python`` action format, ``[cd(folder='document'), ls(a=True)]``, as
bfcl-eval's ``default_decode_execute_prompting`` does, minus its ``eval`` calls.

:func:`decode_python` mirrors the official clean-up, AST walk and rendering of each call
(quirks included, see :mod:`environments.bfcl.parsing`); arithmetic on literals is folded
by a small interpreter with size limits (:func:`_fold`), and a call that would need
anything else is refused.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

from environments.bfcl.calls import (MAX_CALLS_PER_RESPONSE, MAX_DECODED_CHARS, MAX_FOLDED_CHARS, MAX_INT_BITS,
                                     MAX_NESTING, Call, DecodeError, NotLiteral, is_plain, literal_value,
                                     parse_expression, short_message, too_big_int, too_deep)


def _big_literal(tree: ast.AST) -> bool:
    """True when the syntax tree holds an integer literal over :data:`MAX_INT_BITS` bits."""
    return any(isinstance(n, ast.Constant) and too_big_int(n.value) for n in ast.walk(tree))


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


def decode_python(text: str) -> list[Call]:
    """The calls of one ``python``-format response (reasoning already stripped); raises
    DecodeError when bfcl-eval could not decode it or it is over a bound."""
    # The same clean-up as default_decode_execute_prompting + ast_parse.
    s = text.strip("`\n ")
    if not s.startswith("["):
        s = "[" + s
    if not s.endswith("]"):
        s = s + "]"
    s = s.strip().strip("'")
    try:
        tree = parse_expression(s)
    except Exception as exc:  # SyntaxError, or the parser's own limits (RecursionError, MemoryError...)
        raise DecodeError(f"not a list of function calls ({type(exc).__name__}: {short_message(exc)})") from None
    if too_deep(tree, ast.iter_child_nodes):
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
        literal = value if is_plain(value) else literal_value(rendered_value)
        if literal is NotLiteral:
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
