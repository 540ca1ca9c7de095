"""One line of a bank: a gzip member, inflated within a bound and parsed within a bound.

The layer under :mod:`trace_gym.banks.format`: every line of a bank is its own gzip
member (:func:`compress_line` of :func:`encode_line`). :func:`iter_members` inflates one
member at a time and stops at :data:`MAX_LINE_BYTES` (a member inflating past it is
refused as it inflates, so a reader's memory is one line whatever the compression
ratio); :func:`parse_line` refuses a line deeper than :data:`MAX_LINE_DEPTH` before
``json.loads`` sees it (:func:`trace_gym.utils.textsafe.loads_record`); :func:`check_line`
holds it to the schema (:mod:`trace_gym.banks.schema`). Every refusal is a
:class:`~trace_gym.banks.schema.BankError` naming the file and the line number.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

from trace_gym.banks.schema import (BankError, check_encodable, check_footer, check_manifest, check_prompt_record,
                                    check_run)
from trace_gym.runs.files import NotRegularFile, open_regular
from trace_gym.utils.textsafe import JSONRefused, loads_record, nesting_problem

#: Longest line (decompressed bytes, newline included) a bank may hold; a member inflating
#: past it is refused as it inflates, so this bounds a reader's memory.
MAX_LINE_BYTES = 32 << 20
#: Deepest JSON nesting of a line (a recorded prompt line is 11 deep; task metadata may add some).
MAX_LINE_DEPTH = 64
#: Most JSON values (numbers, strings, lists, objects...; object keys not counted) a line may hold,
#: counted on its bytes before ``json.loads`` (:func:`count_values`). A parsed value costs 30-190
#: bytes of memory (``[{},{},...]`` parses to ~25x its text), so this bounds the memory of one parse
#: to about MAX_LINE_BYTES + VALUE_BYTES x this (~0.4 GB); the shipped banks' longest line holds 3,200.
MAX_LINE_VALUES = 1 << 21
#: Bytes a parsed value is counted as (:func:`parsed_weight`, the weight of a cached prompt): about
#: the most one costs in CPython (a one-key object, 184 bytes, plus its slot in its container).
VALUE_BYTES = 192
_CHUNK = 1 << 20
#: :func:`count_values`'s view of a byte: the quote, the four brackets and the comma as they are,
#: every other byte (deleted: JSON whitespace) as ``0``, so an empty list or object reads ``[]``/``{}``.
_VALUE_VIEW = bytes(b if b in b'"[]{},' else ord("0") for b in range(256))
#: A JSON escape of a UTF-16 surrogate (a pair is fine, a lone one no UTF-8 encoder accepts).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def encode_line(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str) + "\n").encode()


def compress_line(line: bytes) -> bytes:
    return gzip.compress(line, compresslevel=6, mtime=0)


def iter_members(f: BinaryIO, path: Path, start: int = 0, *, lenient: bool = False,
                 max_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, int, int | None, bytes | None]]:
    """``(line number, offset, end, line bytes)`` per complete gzip member from byte ``start``
    (line numbers count from 1 there); a file that ends inside a member yields
    ``(number, offset, None, None)`` last.

    A member is inflated at most to ``max_bytes`` + 1 bytes: one that inflates further is
    a ``BankError`` as soon as it does (a bank never holds such a line, so even a resume
    does not cut it off). Corrupt data raises ``BankError``, or with ``lenient`` ends the
    scan like a partial member (a resume cuts it off)."""
    f.seek(start)
    offset = fed = start
    number, d, parts, size = 1, zlib.decompressobj(31), [], 0
    while chunk := f.read(_CHUNK):
        fed += len(chunk)
        data = chunk
        while data:
            try:
                out = d.decompress(data, max_bytes + 1 - size)
            except zlib.error as exc:
                if lenient:
                    yield number, offset, None, None
                    return
                raise BankError(f"{path}: line {number}: corrupt gzip data in the member at byte {offset}: "
                                f"{exc}") from None
            parts.append(out)
            size += len(out)
            if size > max_bytes:
                raise BankError(f"{path}: line {number} (the gzip member at byte {offset}) inflates to more than "
                                f"{max_bytes:,} bytes, the longest line a bank may hold")
            if not d.eof:
                data = d.unconsumed_tail
                continue
            end = fed - len(d.unused_data)
            yield number, offset, end, b"".join(parts)
            data, offset, d, parts, size, number = d.unused_data, end, zlib.decompressobj(31), [], 0, number + 1
    if fed > offset:
        yield number, offset, None, None


def count_values(line: bytes) -> int:
    """The JSON values of the UTF-8 JSON text ``line`` (object keys not counted), measured on
    the bytes in passes of C string methods, without parsing: escaped backslashes and quotes
    are dropped (as in :func:`trace_gym.utils.textsafe.nesting_problem`), whitespace is dropped,
    every byte but quotes, brackets and commas becomes ``0``, and so does every string;
    every value is then the top one, one after a comma, or the first of a list or object
    that is not ``[]`` or ``{}``. Past a syntax error the count may be off, which only
    refuses text ``json.loads`` would refuse anyway.

    >>> count_values(b'{"a": [1, 2, {}], "b": "x,[{", "c": ["s"]}')
    8
    """
    bare = line.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_VALUE_VIEW, b" \t\r\n")
    bare = b"0".join(bare.split(b'"')[0::2])
    containers = bare.count(b"[") + bare.count(b"{")
    empty = bare.count(b"[]") + bare.count(b"{}")
    return 1 + bare.count(b",") + containers - empty


def parsed_weight(line: bytes) -> int:
    """What a checked line is counted as once parsed: its bytes plus :data:`VALUE_BYTES` per value."""
    return len(line) + VALUE_BYTES * count_values(line)


def values_problem(line: bytes, max_values: int | None = None) -> str | None:
    """Why ``line`` holds too many JSON values to parse (a predicate), else ``None``."""
    limit = MAX_LINE_VALUES if max_values is None else max_values
    values = count_values(line)
    if values > limit:
        return (f"holds {values:,} JSON values, more than {limit:,} JSON values a line may hold (parsed, a value "
                f"costs tens of bytes)")
    return None


def parse_line(line: bytes, path: Path, number: int, offset: int) -> dict[str, Any]:
    """One line's JSON object, bounded before it is parsed (:data:`MAX_LINE_DEPTH`,
    :data:`MAX_LINE_VALUES`), with a known ``kind`` and no string UTF-8 cannot encode."""
    if not line.endswith(b"\n") or b"\n" in line[:-1]:
        raise BankError(f"{path}: line {number} (the member at byte {offset}) is not one JSON line")
    problem = values_problem(line) if len(line) > 2 * MAX_LINE_VALUES else None  # a value takes 2 bytes or more
    if problem is not None:
        raise BankError(f"{path}: line {number} {problem}")
    try:
        obj = loads_record(line, max_depth=MAX_LINE_DEPTH)
    except JSONRefused as exc:
        raise BankError(f"{path}: line {number} {exc}") from None
    if not isinstance(obj, dict) or obj.get("kind") not in ("header", "run", "prompt", "footer"):
        raise BankError(f"{path}: line {number} has no known kind (header, run, prompt, footer)")
    if _SURROGATE_ESCAPE.search(line):  # only an escape can make a lone surrogate (raw ones are not UTF-8)
        try:
            check_encodable(obj)
        except BankError as exc:
            raise BankError(f"{path}: line {number}: {exc}") from None
    return obj


def check_line(obj: dict[str, Any], path: Path, number: int, manifest: Mapping[str, Any] | None,
               runs: int | None = None) -> None:
    """``BankError`` naming the file, the line and the field unless ``obj`` (a line of a bank
    with ``manifest``; ``runs``: the run lines before it) follows the schema. A header's
    format and version are checked by its reader (``trace_gym.banks.format``)."""
    try:
        kind = obj["kind"]
        if kind == "header":
            check_manifest(obj.get("manifest"))
        elif kind == "prompt":
            check_prompt_record(obj, manifest)
        elif kind == "run":
            check_run(obj, runs)
        else:
            check_footer(obj)
    except BankError as exc:
        raise BankError(f"{path}: line {number}: {exc}") from None


def check_line_bytes(line: bytes) -> None:
    """``BankError`` unless a reader would accept ``line``'s size and depth (the writer's check)."""
    if len(line) > MAX_LINE_BYTES:
        raise BankError(f"a line of {len(line):,} bytes, more than the {MAX_LINE_BYTES:,} a bank may hold")
    problem = nesting_problem(line, MAX_LINE_DEPTH) or values_problem(line)
    if problem is not None:
        raise BankError(f"a line that {problem}")


def open_file(path: Path) -> BinaryIO:
    """``path`` opened for reading (:func:`~trace_gym.runs.files.open_regular`: without
    blocking, checked with ``fstat``, so a FIFO or a device named like a bank is refused
    instead of hanging the reader), or a ``BankError`` naming why not (a directory, no
    file, no permission, not a regular file)."""
    try:
        return open_regular(path)  # the caller closes it
    except FileNotFoundError:
        raise BankError(f"no bank file at {path}") from None
    except NotRegularFile as exc:
        if exc.is_dir:
            raise BankError(f"{path} is a directory, not a bank file (`trace-gym bank list {path}` lists the banks "
                            "in it)") from None
        raise BankError(f"{path} is not a regular file (a FIFO, a socket or a device), not a bank file") from None
    except OSError as exc:
        raise BankError(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
