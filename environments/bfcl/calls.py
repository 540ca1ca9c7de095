"""What decoding a BFCL response yields, and what both action formats share: the bounds
on model text, and rebuilding an argument from its rendered text without evaluating it.

:class:`Call`, :class:`Decoded` and :class:`DecodeError` are the results of
:func:`environments.bfcl.parsing.decode`; the ``MAX_*`` constants are the bounds that
module's docstring describes; :func:`literal_value` and :func:`is_plain` turn a rendered
argument back into its value (or :class:`NotLiteral`).
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

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

# Model text is parsed under this file name, and its SyntaxWarnings ("invalid decimal
# literal" on random text) are filtered by it. The filter is (re)installed before each
# parse because test runners reset filters; unlike catch_warnings it is thread-safe.
_SOURCE_NAME = "<bfcl-action>"


def parse_expression(source: str) -> ast.Expression:
    """``source`` parsed as one expression, under the model-text file name (its SyntaxWarnings silenced)."""
    warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(_SOURCE_NAME))
    return ast.parse(source, filename=_SOURCE_NAME, mode="eval")


def too_deep(root: Any, children: Any) -> bool:
    """True when ``root`` is nested more than :data:`MAX_NESTING` levels (iterative: a
    deep input cannot exhaust the stack here)."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in children(node))
    return False


def too_big_int(value: Any) -> bool:
    """True when ``value`` is an integer over :data:`MAX_INT_BITS` bits."""
    return isinstance(value, int) and value.bit_length() > MAX_INT_BITS


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


class NotLiteral:
    """Sentinel: the rendered argument is not a literal (a nested call or an expression)."""


def short_message(exc: BaseException, limit: int = 200) -> str:
    """An exception's message, cut, as text that encodes to UTF-8 (it may quote model text)."""
    return str(exc)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def literal_value(rendered: str) -> Any:
    """The value the official executor's ``eval`` would see, when it is a literal."""
    try:
        tree = parse_expression(rendered)
        if any(isinstance(n, ast.Call) for n in ast.walk(tree)):
            return NotLiteral
        return ast.literal_eval(tree.body)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return NotLiteral


_SCALARS = (str, bytes, int, bool, type(None))


def is_plain(value: Any) -> bool:
    """True when ``literal_eval(repr(value)) == value`` with the same types (a fast path)."""
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    return False
