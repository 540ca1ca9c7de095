"""Untrusted text at the retrieval server's boundary: JSON bounded before it is parsed,
and text that always encodes to UTF-8.

A deliberate copy of the few functions of :mod:`trace_gym.utils.textsafe` the index needs
(``json_problem``, ``loads_bounded``, ``JSONRefused``, ``first_unencodable``,
``clean_text``, ``clean_value``), so that ``retrieval_index`` stays a standalone package
that imports nothing of the project (``tests/retrieval/test_retrieval_units.py`` holds both: no
such import, and the same answers as the source). A fix there is made here too.

Why bounds before ``json.loads``: deep nesting raises ``RecursionError`` and a number of
more than 4,300 digits a plain ``ValueError``; :func:`loads_bounded` turns every failure
into one :class:`JSONRefused` naming it. Python ``str`` can hold lone surrogates
(``"\\ud800"``) that no UTF-8 encoder accepts: :func:`first_unencodable` finds one and
:func:`clean_text` writes them as visible ``\\udXXX`` escapes.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Default deepest nesting :func:`loads_bounded` accepts.
MAX_JSON_DEPTH = 32
#: Default longest run of digits :func:`loads_bounded` accepts (Python's int-to-str limit is 4,300).
MAX_JSON_DIGITS = 100

# A JSON string (to its closing quote, or to the end of an unterminated one; possessive,
# so it never backtracks), and a pair of brackets with no bracket inside.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*+"?', re.DOTALL)
_JSON_INNERMOST = re.compile(r"[\[{][^\[\]{}]*[\]}]")
#: :func:`json_problem`'s answer for brackets that never close (the text is not JSON).
UNCLOSED = "has brackets that never close"


class JSONRefused(ValueError):
    """Text that :func:`loads_bounded` would not or could not parse. The message is a
    predicate for the text's name (``f"the request body {exc}"``): ``is not valid JSON
    (...)``, ``is nested more than 32 levels deep``..."""


def json_problem(text: str, max_depth: int = MAX_JSON_DEPTH, max_digits: int = MAX_JSON_DIGITS) -> str | None:
    """Why ``text`` must not reach ``json.loads``, as a predicate (``is nested more than
    ``max_depth`` levels deep``, ``holds a number of more than ``max_digits`` digits``,
    or :data:`UNCLOSED`), else ``None``.

    Measured without parsing or recursion, in passes of the ``re`` engine: strings are
    blanked, then each of at most ``max_depth`` rounds deletes the innermost bracket
    pairs; a pair left after that is deeper than ``max_depth``, and an opening bracket
    left without one never closes (``json.loads`` would recurse into it before failing).
    """
    bare = _JSON_STRING.sub('""', text)
    if re.search(r"[0-9]{%d}" % (max_digits + 1), bare):
        return f"holds a number of more than {max_digits} digits"
    for _ in range(max_depth):
        bare, removed = _JSON_INNERMOST.subn("", bare)
        if not removed:
            break
    if _JSON_INNERMOST.search(bare):
        return f"is nested more than {max_depth} levels deep"
    if "[" in bare or "{" in bare:
        return UNCLOSED
    return None


def loads_bounded(data: str | bytes, *, max_depth: int = MAX_JSON_DEPTH, max_digits: int = MAX_JSON_DIGITS) -> Any:
    """``json.loads(data)`` within the bounds of :func:`json_problem`; every failure
    (a bound, bad UTF-8, bad JSON) is a :class:`JSONRefused` whose message names it."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONRefused(f"is not UTF-8 (byte {exc.start})") from None
    problem = json_problem(data, max_depth, max_digits)
    if problem == UNCLOSED:
        raise JSONRefused(f"is not valid JSON (it {problem})")
    if problem is not None:
        raise JSONRefused(problem)
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise JSONRefused(f"is not valid JSON ({exc.msg} at character {exc.pos})") from None
    except Exception as exc:  # not reached within the bounds; a net, so no caller sees another type
        raise JSONRefused(f"is not valid JSON ({type(exc).__name__}: {clean_text(str(exc)[:200])})") from None


def first_unencodable(text: str) -> int | None:
    """The index of the first character of ``text`` that UTF-8 cannot encode (a lone
    surrogate, U+D800..U+DFFF), or ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def clean_text(text: str) -> str:
    """``text`` as a str that always encodes to UTF-8: lone surrogates become ``\\udXXX``."""
    if first_unencodable(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clean_value(value: Any) -> Any:
    """A JSON-like value (str, list, tuple, dict, scalars) with :func:`clean_text` applied to every string in it."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, (list, tuple)):
        return type(value)(clean_value(v) for v in value)
    if isinstance(value, dict):
        return {clean_value(k): clean_value(v) for k, v in value.items()}
    return value
