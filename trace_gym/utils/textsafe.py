"""Untrusted text at a boundary: JSON bounded before it is parsed, and text that encodes.

Model output (a WikiQA tool call, a BFCL tool call) and request bodies (the retrieval
server) are parsed here with bounds checked *before* ``json.loads`` runs, because the
parser fails in ways its callers do not expect: deep nesting raises ``RecursionError``
and a number of more than 4,300 digits raises a plain ``ValueError``.
:func:`loads_bounded` turns every failure into one :class:`JSONRefused` naming it.
:func:`loads_record` does the same for the long UTF-8 lines of a file (a bank's prompt
lines, a run's metrics), at the speed of ``json.loads``: size and depth are measured on
the bytes (:func:`nesting_problem`), and a number past Python's digit limit is refused.

Python ``str`` can hold lone surrogates (``"\\ud800"``, from a JSON or Python escape)
that no UTF-8 encoder accepts; tokenizers raise ``TypeError``, HTTP clients and Lucene
``UnicodeEncodeError``. :func:`first_unencodable` finds one, :func:`clean_text` writes
them as visible ``\\udXXX`` escapes and :func:`drop_unencodable` removes them;
:func:`cap_text` cleans and bounds a text, with a visible note where it cut;
:func:`tagged_blocks` and :func:`first_tagged` find ``<tag>...</tag>`` blocks in linear time.

Only the standard library; the one place for this, imported by the environments, the
ecosystem adapters and the retrieval server.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Iterable, Iterator

#: Default deepest nesting :func:`loads_bounded` accepts (the server's bodies are 2 deep).
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


def drop_unencodable(text: str) -> str:
    """``text`` without the characters UTF-8 cannot encode (lone surrogates)."""
    if first_unencodable(text) is None:
        return text
    return text.encode("utf-8", "ignore").decode("utf-8")


def clean_value(value: Any) -> Any:
    """A JSON-like value (str, list, tuple, dict, scalars) with :func:`clean_text` applied to every string in it."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, (list, tuple)):
        return type(value)(clean_value(v) for v in value)
    if isinstance(value, dict):
        return {clean_value(k): clean_value(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------- records of a file
#: Every byte but the five that decide JSON nesting: the quote and the four brackets.
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'"[]{}')
#: Brackets as parentheses, so one ``bytes.replace`` deletes an innermost pair of either kind.
_AS_PARENS = bytes.maketrans(b"[]{}", b"()()")


def nesting_problem(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why the UTF-8 JSON text ``data`` must not reach ``json.loads``: ``is nested more than
    ``max_depth`` levels deep`` (or has brackets that never close; ``json.loads`` would
    recurse into them before failing), ``is not UTF-8 JSON (it holds a NUL byte)`` (UTF-16
    and UTF-32, which ``json.loads`` would also read, hold one), else ``None``.

    Measured on the bytes without parsing, in passes of C string methods (about a third
    of ``json.loads``'s time on a bank's lines): escaped backslashes and escaped quotes are dropped (in a
    valid string every backslash starts an escape, so dropping ``\\\\`` pairs left to
    right leaves exactly the escaping ones), everything but quotes and brackets is
    dropped, the strings (between remaining quotes) are dropped, then each of at most
    ``max_depth`` passes deletes the innermost bracket pairs. An opening bracket left
    after them is deeper than ``max_depth`` or never closes. Past a parse error the count
    may be off, which only refuses text ``json.loads`` would refuse anyway.
    """
    if b"\x00" in data:
        return "is not UTF-8 JSON (it holds a NUL byte)"
    bare = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_AS_PARENS, _NOT_STRUCTURE)
    bare = b"".join(bare.split(b'"')[0::2])
    for _ in range(max_depth):
        shorter = bare.replace(b"()", b"")
        if len(shorter) == len(bare):
            break
        bare = shorter
    if b"(" in bare:
        return f"is nested more than {max_depth} levels deep (or has brackets that never close)"
    return None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (``json.loads``'s ``object_pairs_hook``)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise JSONRefused(f"repeats the key {clean_text(key[:100])!r} in one object, where JSON keeps only the last")
    return out


def loads_record(data: bytes, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None,
                 unique_keys: bool = False) -> Any:
    """``json.loads(data)`` of one record of a file (UTF-8 bytes), bounded before it is
    parsed: at most ``max_bytes`` bytes and ``max_depth`` levels (:func:`nesting_problem`).
    Numbers are bounded by Python's own int-to-str limit (4,300 digits), whose
    ``ValueError`` is refused here like every other failure: one :class:`JSONRefused`
    naming it, never another type. With ``unique_keys`` an object that gives a key twice
    is refused too (``json.loads`` keeps the last silently), at the cost of a Python hook
    per object (for files of results, not for long logs)."""
    if max_bytes is not None and len(data) > max_bytes:
        raise JSONRefused(f"is {len(data):,} bytes long, more than the {max_bytes:,} allowed")
    problem = nesting_problem(bytes(data), max_depth)
    if problem is not None:
        raise JSONRefused(problem)
    try:
        return json.loads(data, object_pairs_hook=_unique_keys) if unique_keys else json.loads(data)
    except json.JSONDecodeError as exc:
        raise JSONRefused(f"is not valid JSON ({exc.msg} at character {exc.pos})") from None
    except UnicodeDecodeError as exc:
        raise JSONRefused(f"is not UTF-8 (byte {exc.start})") from None
    except MemoryError:
        raise JSONRefused(f"is too large to parse ({len(data):,} bytes: out of memory)") from None
    except JSONRefused:
        raise  # a key given twice
    except (ValueError, RecursionError) as exc:  # a number past the digit limit; the rest a net
        raise JSONRefused(f"is not valid JSON ({type(exc).__name__}: {clean_text(str(exc)[:120])})") from None


# ---------------------------------------------------------------------- bounded text
#: :func:`cap_text`'s default note where it cut (field ``{omitted}``, in characters).
CUT_NOTE = "\n[... truncated: {omitted} characters omitted ...]\n"


def cap_text(text: str, max_chars: int, note: str = CUT_NOTE) -> str:
    """``text`` as :func:`clean_text` writes it, at most ``max_chars`` characters long: the
    head 3/4 and the tail 1/4 around ``note`` (its ``{omitted}`` field filled in with the
    number of characters cut), so a reader sees that it was cut and by how much.

    Raises:
        ValueError: ``max_chars`` too small to hold the note and some text (under twice
            the note's length), naming it.
    """
    if max_chars < 2 * len(note):
        raise ValueError(f"max_chars must be at least {2 * len(note)} (twice the note), got {max_chars!r}")
    text = clean_text(str.__str__(text))  # a str subclass as a plain str
    if len(text) <= max_chars:
        return text
    marker = note.format(omitted=len(text))  # its longest form: the count only shrinks
    keep = max_chars - len(marker)
    head, tail = keep - keep // 4, keep // 4
    return text[:head] + note.format(omitted=len(text) - head - tail) + text[len(text) - tail:]


# ---------------------------------------------------------------------- tagged blocks
def tagged_blocks(text: str, open_tag: str, close_tag: str) -> Iterator[tuple[int, str]]:
    """``(start, body)`` of each ``open_tag ... close_tag`` block of ``text``, left to right,
    each body ending at the first ``close_tag`` after its opening: what
    ``re.finditer(open + "(.*?)" + close, DOTALL)`` finds, in time linear in ``len(text)``
    (that regex rescans to the end from every unclosed opening: 8,000 of them in 64 KB of
    model output took seconds)."""
    pos = 0
    while (start := text.find(open_tag, pos)) != -1:
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:  # no later opening can close either
            return
        yield start, text[start + len(open_tag): end]
        pos = end + len(close_tag)


def first_tagged(text: str, names: Iterable[str]) -> tuple[str, str] | None:
    """``(name, body)`` of the first ``<name>...</name>`` block of ``text`` over ``names``
    (the leftmost opening that closes), or ``None``; linear like :func:`tagged_blocks`."""
    found = [(start, name, body) for name in names
             for start, body in itertools.islice(tagged_blocks(text, f"<{name}>", f"</{name}>"), 1)]
    return min(found)[1:] if found else None
