"""JSONL corpora in the wiki-18 format: streaming, checksums, and random access by row.

A corpus is a JSON-lines file, one passage a line: ``{"id": "...", "contents":
"\\"Title\\"\\ntext"}`` (other keys are ignored). Row ``i`` of a dense index is line ``i``
of its corpus, as in Search-R1's ``e5_Flat.index`` / ``wiki-18.jsonl`` pair.

:class:`Corpus` reads a passage by row with one ``pread`` (thread-safe) through a table
of byte offsets, made in one streaming pass and cached on disk; the file itself is
never loaded into memory (wiki-18 is 21 M lines, 14 GB; its offset table is 168 MB).
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from retrieval_index.protocol import Hit

_CHUNK = 1 << 22  # bytes read per block while scanning (4 MiB)


@dataclass(frozen=True)
class CorpusStats:
    """What one pass over a corpus file learns.

    Attributes:
        path: absolute path of the file.
        sha256: hex digest of the file's bytes.
        bytes: file size in bytes.
        count: number of passages (non-empty lines).
    """

    path: str
    sha256: str
    bytes: int
    count: int

    def to_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes, "count": self.count}


def scan(path: str | os.PathLike) -> tuple[CorpusStats, np.ndarray]:
    """One streaming pass: checksum, passage count, and the offsets table.

    Returns:
        ``(stats, offsets)`` where ``offsets`` (int64, shape ``(count + 1,)``) holds the
        byte offset of each non-blank line and, last, the size of the file; row ``i``
        is the first line of bytes ``offsets[i]:offsets[i + 1]``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    digest = hashlib.sha256()
    starts = array("q")  # 8 bytes per passage, not a Python int object each
    pos = 0
    with open(path, "rb", buffering=_CHUNK) as f:
        for raw in f:
            digest.update(raw)
            if not raw.isspace():
                starts.append(pos)
            pos += len(raw)
    starts.append(pos)
    offsets = np.frombuffer(starts, dtype=np.int64).copy()
    return CorpusStats(str(path.resolve()), digest.hexdigest(), pos, len(offsets) - 1), offsets


def parse_line(raw: bytes | str, where: str) -> tuple[str, str]:
    """``(id, contents)`` of one JSONL line, or a ``ValueError`` naming ``where``."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(obj, dict) or "contents" not in obj or "id" not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f"{where}: a passage needs 'id' and 'contents' (wiki-18 format), got {keys}")
    if not isinstance(obj["contents"], str):
        raise ValueError(f"{where}: 'contents' must be a string, got {type(obj['contents']).__name__}")
    return str(obj["id"]), obj["contents"]


def write_jsonl(path: str | os.PathLike, passages: Sequence[tuple[str, str]] | Iterator[tuple[str, str]]) -> int:
    """Write ``(id, contents)`` pairs as a wiki-18 JSONL file (atomically); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for pid, contents in passages:
            f.write(json.dumps({"id": str(pid), "contents": contents}, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


class Corpus:
    """Random access to a JSONL corpus by row (thread-safe; memory: the offsets table).

    Args:
        path: the JSONL file.
        offsets_cache: a ``.npy`` file for the offsets table (written after the first
            scan, reused while the file's size and mtime match); ``None``: scan on open.
    """

    def __init__(self, path: str | os.PathLike, offsets_cache: str | os.PathLike | None = None):
        self.path = str(Path(path).resolve())
        self.stats, self.offsets = _load_or_scan(self.path, offsets_cache)
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.stats.count

    def __getitem__(self, row: int) -> tuple[str, str]:
        """``(id, contents)`` of row ``row`` (0-based)."""
        if not 0 <= row < len(self):
            raise IndexError(f"corpus row {row} out of range [0, {len(self)})")
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        raw = os.pread(self._fd, end - start, start)
        return parse_line(raw.split(b"\n", 1)[0], f"{self.path} row {row}")

    def rows(self, start: int, stop: int) -> list[tuple[str, str]]:
        """``(id, contents)`` of rows ``start <= i < stop``, read in one call."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"corpus rows [{start}, {stop}) out of range [0, {len(self)}]")
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        raw = os.pread(self._fd, hi - lo, lo)
        lines = [line for line in raw.split(b"\n") if line.strip()]
        if len(lines) != stop - start:
            raise ValueError(f"{self.path} changed since it was scanned (rows {start}..{stop})")
        return [parse_line(line, f"{self.path} row {start + k}") for k, line in enumerate(lines)]

    def hit(self, row: int, score: float | None) -> Hit:
        pid, contents = self[row]
        return Hit(pid, contents, score)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def _load_or_scan(path: str, cache: str | os.PathLike | None) -> tuple[CorpusStats, np.ndarray]:
    st = os.stat(path)
    if cache is not None:
        cache = Path(cache)
        meta = cache.with_suffix(".json")
        if cache.exists() and meta.exists():
            info = json.loads(meta.read_text())
            if info.get("bytes") == st.st_size and info.get("mtime_ns") == st.st_mtime_ns and info.get("path") == path:
                stats = CorpusStats(path, info["sha256"], info["bytes"], info["count"])
                return stats, np.load(cache)
    stats, offsets = scan(path)
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(cache.stem + ".tmp.npy")
            np.save(tmp, offsets)
            os.replace(tmp, cache)
            meta.write_text(json.dumps(stats.to_dict() | {"mtime_ns": st.st_mtime_ns}))
        except OSError as exc:  # a read-only folder: work without the cache, say so once
            import warnings

            warnings.warn(f"could not write the corpus offsets cache {cache}: {exc}; the corpus will be "
                          "scanned again next time", stacklevel=3)
    return stats, offsets
