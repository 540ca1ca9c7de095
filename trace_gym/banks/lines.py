"""One line of a bank: a gzip member, inflated within a bound and parsed within a bound.

The layer under :mod:`trace_gym.banks.format`: every line of a bank is its own gzip
member (:func:`compress_line` of :func:`encode_line`). :func:`iter_members` inflates one
member at a time and stops at :data:`MAX_LINE_BYTES` (a member inflating past it is
refused as it inflates, so a reader's memory is one line whatever the compression
ratio); :func:`parse_line` refuses a line deeper than :data:`MAX_LINE_DEPTH` before
``json.loads`` sees it (:func:`trace_gym.textsafe.loads_record`); :func:`check_line`
holds it to the schema (:mod:`trace_gym.banks.schema`). Every refusal is a
:class:`~trace_gym.banks.schema.BankError` naming the file and the line number.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

from trace_gym.banks.schema import BankError, check_footer, check_manifest, check_prompt_record, check_run
from trace_gym.textsafe import JSONRefused, loads_record, nesting_problem

#: Longest line (decompressed bytes, newline included) a bank may hold; a member inflating
#: past it is refused as it inflates, so this bounds a reader's memory.
MAX_LINE_BYTES = 32 << 20
#: Deepest JSON nesting of a line (a recorded prompt line is 11 deep; task metadata may add some).
MAX_LINE_DEPTH = 64
_CHUNK = 1 << 20


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


def parse_line(line: bytes, path: Path, number: int, offset: int) -> dict[str, Any]:
    """One line's JSON object, bounded before it is parsed (:data:`MAX_LINE_DEPTH`), with a known ``kind``."""
    if not line.endswith(b"\n") or b"\n" in line[:-1]:
        raise BankError(f"{path}: line {number} (the member at byte {offset}) is not one JSON line")
    try:
        obj = loads_record(line, max_depth=MAX_LINE_DEPTH)
    except JSONRefused as exc:
        raise BankError(f"{path}: line {number} {exc}") from None
    if not isinstance(obj, dict) or obj.get("kind") not in ("header", "run", "prompt", "footer"):
        raise BankError(f"{path}: line {number} has no known kind (header, run, prompt, footer)")
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
    problem = nesting_problem(line, MAX_LINE_DEPTH)
    if problem is not None:
        raise BankError(f"a line that {problem}")


def open_file(path: Path) -> BinaryIO:
    """``path`` opened for reading, or a ``BankError`` naming why not (a directory, no file, no permission)."""
    if path.is_dir():
        raise BankError(f"{path} is a directory, not a bank file (`trace-gym bank list {path}` lists the banks in it)")
    try:
        return open(path, "rb")  # noqa: SIM115  (the caller closes it)
    except FileNotFoundError:
        raise BankError(f"no bank file at {path}") from None
    except OSError as exc:
        raise BankError(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
