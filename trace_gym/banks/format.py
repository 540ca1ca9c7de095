"""The bank file: a gzip'd JSON-lines file, one gzip member per line, versioned, checksummed.

Layout (version 1; ``docs/banks.md`` is the reference):

- line 1, ``{"kind": "header", "format": "trace_gym.bank", "version": 1, "manifest": {...}}``:
  what made the bank (policy name, path and weights hash, env id and kwargs, sampling
  and agent limits, seed, the counts P / R / K and the per-root prefix cap, the command
  line, when);
- ``{"kind": "run", ...}``: one line where each recording run (the first and every
  resume) started, with its command line;
- ``{"kind": "prompt", ...}``: one self-contained line per prompt, in the order the
  prompts finished: the task, its R root rollouts, and for each recorded prefix of each
  root its K continuations (:class:`BankPrompt` reads one);
- last, once the recording is complete, ``{"kind": "footer", "prompts": n,
  "sha256": ...}``: the SHA-256 over the prompt lines (their decompressed bytes, newline
  included, in file order).

Every line is its own gzip member, written with one ``write`` + ``flush`` + ``fsync``
(:class:`trace_gym.banks.writer.BankWriter`): a killed recorder leaves at most one
partial member at the end, which a resume cuts off, and concatenated members are still
one valid ``.gz`` file (``zcat`` reads it). The reader (:func:`scan_bank`,
:func:`iter_prompts`, :class:`Bank`) decompresses one member at a time, and keeps byte
offsets so that :meth:`Bank.prompt` reads one prompt back without reading the others.

What a reader trusts: nothing. The checksum catches accidents, not intent (whoever edits
a line can recompute it), so every line is bounded before it is parsed and checked
against the schema after (:mod:`trace_gym.banks.schema`): a member stops inflating at
:data:`MAX_LINE_BYTES` (so memory stays bounded by the largest line a bank may hold,
whatever the file's size or compression ratio), a line nested deeper than
:data:`MAX_LINE_DEPTH` is refused before ``json.loads`` sees it
(:func:`trace_gym.utils.textsafe.loads_record`), and a violation is one :class:`BankError`
naming the file, the line number and the field. The writer holds itself to the same
bounds and schema, so it never writes a line a reader refuses.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

from trace_gym.banks.lines import (MAX_LINE_BYTES, MAX_LINE_DEPTH, MAX_LINE_VALUES, check_line, check_line_bytes,
                                   compress_line, encode_line, iter_members, open_file, parse_line, parsed_weight)
from trace_gym.banks.schema import TURN_KEYS, BankError, check_footer, check_prompt_record, show
from trace_gym.utils.textsafe import loads_record
from trace_gym.tree import SUCCESS_THRESHOLD

# re-exported: the line layer (trace_gym.banks.lines) and the schema (trace_gym.banks.schema)
__all__ = ["MAX_LINE_BYTES", "MAX_LINE_DEPTH", "MAX_LINE_VALUES", "TURN_KEYS", "BankError", "check_line_bytes",
           "check_prompt_record", "compress_line", "encode_line", "iter_members", "parse_line"]

FORMAT = "trace_gym.bank"
VERSION = 1
#: Versions this reader understands.
SUPPORTED_VERSIONS = (1,)
#: Manifest keys that may differ between a recording and its resume (the weights are named by
#: their hash, so the policy may sit in another folder on the resuming machine).
RUN_KEYS = ("command", "created_at", "policy_path")
#: Default budget of :class:`Bank`'s prompt cache (parsed weight, :func:`~trace_gym.banks.lines.parsed_weight`).
CACHE_BYTES = 256 << 20


# ---------------------------------------------------------------------- one prompt
@dataclass(frozen=True)
class BankPrompt:
    """One prompt of a bank, as recorded (see ``docs/banks.md`` for every field).

    Attributes:
        index: its position among the bank's prompts (file order).
        data: the prompt line: ``task``, ``task_index``, ``prompt_tokens``, ``roots``
            (each: ``seed``, ``error``, ``reward``, ``success``, ``end``, ``turns``,
            ``prefixes`` (``depth``, ``continuations``), ``left_out``).
    """

    index: int
    data: Mapping[str, Any] = field(repr=False)

    @property
    def task_id(self) -> str:
        return self.data["task"]["id"]

    @property
    def prompt(self) -> str:
        return self.data["task"]["prompt"]

    @property
    def roots(self) -> list[dict[str, Any]]:
        return self.data["roots"]

    def outcomes(self) -> list[bool]:
        """Success of every recorded root that reached a leaf (roots that failed to start have none)."""
        return [bool(r["success"]) for r in self.roots if r["turns"]]

    def prompt_rate(self) -> float:
        """The bank's empirical success rate of the prompt: mean over its roots with a leaf (0.5 with none)."""
        wins = self.outcomes()
        return sum(wins) / len(wins) if wins else 0.5

    @cached_property
    def _prefixes(self) -> list[dict[int, dict[str, Any]]]:
        """Per root, its recorded prefixes by depth (built once: a replay looks them up per node)."""
        return [{p["depth"]: p for p in root["prefixes"]} for root in self.roots]

    def prefix(self, root: int, depth: int) -> dict[str, Any] | None:
        """The recorded prefix of root ``root`` after ``depth`` turns, or ``None`` when it was left out."""
        return self._prefixes[root].get(depth)

    def prefix_rate(self, root: int, depth: int) -> float | None:
        """Mean success over the recorded continuations of a prefix that reached a leaf, or ``None``
        (a prefix left out, recorded with no continuations, or whose continuations all failed to start)."""
        p = self.prefix(root, depth)
        wins = [bool(c["success"]) for c in p["continuations"] if c["turns"]] if p else []
        return sum(wins) / len(wins) if wins else None

    def anchor_rate(self, root: int, depth: int) -> float:
        """The empirical value of the anchor after ``depth`` turns of root ``root`` (``depth`` 0: the
        prompt): its continuations' rate, else the deepest shallower recorded prefix of the same root
        that has one, else the prompt's rate."""
        for d in range(depth, 0, -1):
            rate = self.prefix_rate(root, d)
            if rate is not None:
                return rate
        return self.prompt_rate()


def success(reward: float | None) -> bool | None:
    """A reward read as an outcome (the tree's :data:`~trace_gym.tree.SUCCESS_THRESHOLD`)."""
    return None if reward is None else bool(reward >= SUCCESS_THRESHOLD)


# ---------------------------------------------------------------------- scanning
@dataclass
class PromptEntry:
    """Where one prompt lies in the file, and what the bench needs without reading it again.

    Not the prompt's text (a prompt may be megabytes; :meth:`Bank.prompt` reads it back).

    Attributes:
        line: its line number in the file (from 1: the header).
        digest: BLAKE2b-128 of its line as checked, so :meth:`Bank.prompt` knows it reads back those bytes.
    """

    index: int
    offset: int
    length: int
    task_id: str
    outcomes: list[bool]
    run: int
    line: int = 0
    digest: bytes = b""


@dataclass
class BankScan:
    """One pass over a bank file (:func:`scan_bank`).

    Attributes:
        header: the header line (``manifest`` inside).
        runs: the run lines, in order.
        prompts: one entry per prompt line, in file order.
        footer: the footer line, or ``None`` when the recording is not complete.
        sha256: the checksum recomputed over the prompt lines.
        end: byte offset after the last complete member.
        partial_bytes: bytes of a partial member after ``end`` (a recorder killed mid-write).
    """

    path: Path
    header: dict[str, Any]
    runs: list[dict[str, Any]]
    prompts: list[PromptEntry]
    footer: dict[str, Any] | None
    sha256: str
    end: int
    partial_bytes: int

    @property
    def manifest(self) -> dict[str, Any]:
        return self.header["manifest"]


def _read_lines(f: BinaryIO, path: Path, *, lenient: bool = False
                ) -> Iterator[tuple[int, int, int | None, bytes | None, dict[str, Any] | None]]:
    """``(line number, offset, end, line bytes, line)`` per line of an open bank, each bounded
    (:func:`iter_members`, :func:`parse_line`) and checked against the schema
    (:func:`check_line`); a partial last member yields ``(number, offset, None, None, None)``
    last. Refused, naming the file and the line: a first line that is no bank header, a
    second header, a line after the footer, a prompt recorded twice."""
    manifest, runs, footer, seen = None, 0, False, set()
    for number, offset, stop, line in iter_members(f, path, lenient=lenient):
        if stop is None:
            if manifest is None:
                raise BankError(f"{path}: not a bank (no header line; {os.fstat(f.fileno()).st_size - offset} bytes "
                                "of a partial first line)")
            yield number, offset, None, None, None
            return
        obj = parse_line(line, path, number, offset)
        kind = obj["kind"]
        if manifest is None:
            manifest = _check_header(obj, path, number)["manifest"]
        elif kind == "header":
            raise BankError(f"{path}: line {number} is a second header")
        elif footer:
            raise BankError(f"{path}: line {number} is a {kind} line after the footer")
        else:
            check_line(obj, path, number, manifest, runs)
            if kind == "run":
                runs += 1
            elif kind == "footer":
                footer = True
            elif obj["task"]["id"] in seen:
                raise BankError(f"{path}: line {number}: prompt {obj['task']['id']!r} is recorded twice")
            else:
                seen.add(obj["task"]["id"])
        yield number, offset, stop, line, obj
    if manifest is None:
        raise BankError(f"{path}: not a bank (no header line)")


def scan_bank(path: str | os.PathLike, *, lenient: bool = False) -> BankScan:
    """Read a bank once, member by member (memory: one prompt line), checking every line.

    Raises ``BankError`` naming the file and the line: not a bank (no header), an unknown
    version, a line outside the schema (:mod:`trace_gym.banks.schema`) or its bounds, a
    duplicate prompt, a line after the footer, corrupt data (with ``lenient``, corrupt data
    ends the scan and counts as ``partial_bytes``: what a resume cuts off and records
    again). A partial last member is not an error here (``partial_bytes``);
    :func:`open_bank` refuses an incomplete bank.
    """
    path = Path(path)
    header, footer, runs, prompts = None, None, [], []
    digest, end, partial = hashlib.sha256(), 0, 0
    with open_file(path) as f:
        for number, offset, stop, line, obj in _read_lines(f, path, lenient=lenient):
            if stop is None:
                partial = os.fstat(f.fileno()).st_size - offset
                break
            kind = obj["kind"]
            if header is None:
                header = obj
            elif kind == "run":
                runs.append(obj)
            elif kind == "footer":
                footer = obj
            else:
                digest.update(line)
                outcomes = [r["success"] for r in obj["roots"] if r["turns"]]
                prompts.append(PromptEntry(len(prompts), offset, stop - offset, obj["task"]["id"], outcomes,
                                           obj.get("run", 0), number,
                                           hashlib.blake2b(line, digest_size=16).digest()))
            end = stop
    return BankScan(path, header, runs, prompts, footer, digest.hexdigest(), end, partial)


def _check_header(obj: dict[str, Any], path: Path, number: int = 1) -> dict[str, Any]:
    if obj.get("kind") != "header" or obj.get("format") != FORMAT:
        raise BankError(f"{path}: not a bank (its first line is not a {FORMAT} header)")
    if type(obj.get("version")) is not int or obj["version"] not in SUPPORTED_VERSIONS:
        raise BankError(f"{path}: bank format version {show(obj.get('version'))}; this trace_gym reads "
                        f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
    check_line(obj, path, number, None)
    return obj


def verify_scan(scan: BankScan) -> None:
    """``BankError`` unless the scanned bank is complete and its checksum and count match its footer."""
    path = scan.path
    if scan.footer is None:
        tail = f" and {scan.partial_bytes} bytes of a partial line" if scan.partial_bytes else ""
        raise BankError(f"{path}: incomplete bank ({len(scan.prompts)} prompts{tail}, no footer): the recording "
                        "was interrupted; rerun the same `trace-gym bank record` command to finish it")
    if scan.partial_bytes:
        raise BankError(f"{path}: {scan.partial_bytes} bytes after the footer")
    if scan.footer["prompts"] != len(scan.prompts):
        raise BankError(f"{path}: the footer counts {scan.footer['prompts']} prompts, the file holds "
                        f"{len(scan.prompts)}")
    if scan.footer["sha256"] != scan.sha256:
        raise BankError(f"{path}: checksum mismatch: the prompt lines hash to {scan.sha256}, the footer says "
                        f"{scan.footer['sha256']}; the file was modified or damaged after recording")


# ---------------------------------------------------------------------- reading
def iter_prompts(path: str | os.PathLike, *, verify: bool = True) -> Iterator[BankPrompt]:
    """Stream a bank's prompts in file order, one line in memory at a time, each checked
    like :func:`scan_bank` checks it.

    With ``verify`` the checksum is recomputed on the way and checked against the footer
    once the stream ends (``BankError`` then, after the last prompt was yielded).
    """
    path = Path(path)
    digest, count, footer = hashlib.sha256(), 0, None
    with open_file(path) as f:
        for _, _, stop, line, obj in _read_lines(f, path):
            if stop is None:
                break
            if obj["kind"] == "footer":
                footer = obj
            elif obj["kind"] == "prompt":
                digest.update(line)
                yield BankPrompt(count, obj)
                count += 1
    if verify:
        if footer is None:
            raise BankError(f"{path}: incomplete bank (no footer): rerun the same `trace-gym bank record` command")
        if footer["sha256"] != digest.hexdigest() or footer["prompts"] != count:
            raise BankError(f"{path}: checksum mismatch: the prompt lines hash to {digest.hexdigest()}, the footer "
                            f"says {footer['sha256']}; the file was modified or damaged after recording")


class Bank:
    """An opened bank: its manifest, a per-prompt index, and random access to any prompt.

    Opening scans the file once (checking every line and, with ``verify``, the checksum,
    with a clear error naming the file); only the index stays in memory, and
    :meth:`prompt` reads one prompt back from its byte offset (an LRU cache keeps the
    recent ones: at most ``cache_prompts`` of them, weighing at most ``cache_bytes`` in all,
    each weighed by :func:`~trace_gym.banks.lines.parsed_weight`; the last one read is
    always kept), so a bank larger than memory can be replayed.
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True, cache_prompts: int = 1024,
                 cache_bytes: int = CACHE_BYTES):
        self.scan = scan_bank(path)
        if verify:
            verify_scan(self.scan)
        self.path = self.scan.path
        self.manifest = self.scan.manifest
        self.entries = self.scan.prompts
        self._cache: OrderedDict[int, tuple[BankPrompt, int]] = OrderedDict()
        self._cache_prompts = max(int(cache_prompts), 1)
        self._cache_bytes = int(cache_bytes)
        self._cache_used = 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def roots(self) -> int:
        """R: root rollouts recorded per prompt."""
        return self.manifest["roots"]

    @property
    def continuations(self) -> int:
        """K: continuations recorded per recorded prefix."""
        return self.manifest["continuations"]

    def prompt(self, index: int) -> BankPrompt:
        """Prompt ``index`` (file order), read from its byte offset: the very line the scan
        checked (its digest), else ``BankError`` (the file changed since it was opened)."""
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index][0]
        e = self.entries[index]
        with open_file(self.path) as f:
            f.seek(e.offset)
            raw = f.read(e.length)
        d = zlib.decompressobj(31)
        try:
            line = d.decompress(raw, MAX_LINE_BYTES + 1)
        except zlib.error:
            line = b""
        if not d.eof or hashlib.blake2b(line, digest_size=16).digest() != e.digest:
            raise BankError(f"{self.path}: line {e.line} (prompt {e.task_id!r}) changed since the bank was opened; "
                            "open it again")
        record = BankPrompt(index, parse_line(line, self.path, e.line, e.offset))
        weight = parsed_weight(line)
        self._cache[index] = (record, weight)
        self._cache_used += weight
        while len(self._cache) > 1 and (len(self._cache) > self._cache_prompts or self._cache_used > self._cache_bytes):
            self._cache_used -= self._cache.popitem(last=False)[1][1]
        return record

    def __iter__(self) -> Iterator[BankPrompt]:
        return iter_prompts(self.path, verify=False)


def open_bank(path: str | os.PathLike, *, verify: bool = True, cache_prompts: int = 1024,
              cache_bytes: int = CACHE_BYTES) -> Bank:
    """Open a bank for replay (see :class:`Bank`)."""
    return Bank(path, verify=verify, cache_prompts=cache_prompts, cache_bytes=cache_bytes)


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header line alone (the first member, bounded and checked; nothing else is read)."""
    path = Path(path)
    with open_file(path) as f:
        for number, offset, stop, line in iter_members(f, path):
            if stop is None:
                break
            return _check_header(parse_line(line, path, number, offset), path, number)
    raise BankError(f"{path}: not a bank (no header line)")


def read_footer(path: str | os.PathLike, tail_bytes: int = 1 << 16) -> dict[str, Any] | None:
    """The footer line without reading the whole file (it is the last, small member), or
    ``None`` when the bank is incomplete or its last line is no footer (bounded and
    checked like every line). Not a verification: :func:`open_bank` is."""
    path = Path(path)
    try:
        with open_file(path) as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - tail_bytes))
            tail = f.read()
    except (BankError, OSError):
        return None
    start = tail.rfind(b"\x1f\x8b\x08")
    while start >= 0:
        d = zlib.decompressobj(31)
        try:
            line = d.decompress(tail[start:], tail_bytes)
            if d.eof and not d.unused_data:
                obj = loads_record(line, max_depth=MAX_LINE_DEPTH)
                if not isinstance(obj, dict) or obj.get("kind") != "footer":
                    return None
                check_footer(obj)
                return obj
        except zlib.error:
            pass
        except ValueError:  # JSONRefused, BankError: a last line that is no footer
            return None
        start = tail.rfind(b"\x1f\x8b\x08", 0, start)
    return None


def list_banks(folder: str | os.PathLike, pattern: str = "**/*.jsonl.gz") -> list[dict[str, Any]]:
    """One row per bank under ``folder`` (files that are not banks are skipped): path, env, policy,
    counts, size (bytes), whether complete, and a complete bank's recording time (``seconds`` over
    ``runs`` runs, from its footer) and, for one closed early (``bank close``), the prompts it
    ``planned``; from the header and footer only (fast, not verified)."""
    rows = []
    for path in sorted(Path(folder).glob(pattern)):
        try:
            m = read_header(path)["manifest"]
        except (BankError, OSError):
            continue
        footer = read_footer(path)
        rows.append({"path": str(path), "env_id": m.get("env_id"), "policy": m.get("policy"),
                     "prompts": footer["prompts"] if footer else None, "roots": m.get("roots"),
                     "continuations": m.get("continuations"), "max_prefixes_per_root": m.get("max_prefixes_per_root"),
                     "complete": footer is not None, "bytes": path.stat().st_size, "created_at": m.get("created_at"),
                     "seconds": footer.get("seconds") if footer else None, "runs": footer.get("runs") if footer else None,
                     "planned": footer.get("tasks") if footer and footer.get("closed_early") else None})
    return rows
