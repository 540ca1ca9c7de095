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
:func:`iter_prompts`, :class:`Bank`) decompresses one member at a time, so memory stays bounded by the
largest prompt line whatever the bank's size, and keeps byte offsets so that
:meth:`Bank.prompt` reads one prompt back without reading the others.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping, Sequence

from trace_gym.tree import SUCCESS_THRESHOLD

FORMAT = "trace_gym.bank"
VERSION = 1
#: Versions this reader understands.
SUPPORTED_VERSIONS = (1,)
#: Manifest keys that may differ between a recording and its resume (the weights are named by
#: their hash, so the policy may sit in another folder on the resuming machine).
RUN_KEYS = ("command", "created_at", "policy_path")
_CHUNK = 1 << 20


class BankError(ValueError):
    """A bank file that is malformed, incomplete, tampered with, or not a bank; the message names it."""


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

    def prefix(self, root: int, depth: int) -> dict[str, Any] | None:
        """The recorded prefix of root ``root`` after ``depth`` turns, or ``None`` when it was left out."""
        for p in self.roots[root]["prefixes"]:
            if p["depth"] == depth:
                return p
        return None

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


def check_prompt_record(record: Mapping[str, Any]) -> None:
    """``BankError`` unless ``record`` has the shape of a prompt line (names the first bad field)."""
    def need(obj: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
        missing = [k for k in keys if k not in obj]
        if missing:
            raise BankError(f"{where} lacks {', '.join(missing)}")

    def episode(ep: Mapping[str, Any], where: str) -> None:
        need(ep, ("error", "reward", "success", "end", "turns"), where)
        for n, turn in enumerate(ep["turns"]):
            need(turn, TURN_KEYS, f"{where} turn {n}")
        if ep["turns"] and ep["reward"] is None:
            raise BankError(f"{where} has turns but no reward")

    need(record, ("kind", "task", "roots"), "prompt line")
    need(record["task"], ("id", "prompt"), "prompt line's task")
    where = f"prompt {record['task']['id']!r}"
    for j, root in enumerate(record["roots"]):
        episode(root, f"{where} root {j}")
        need(root, ("prefixes", "left_out"), f"{where} root {j}")
        for p in root["prefixes"]:
            if not 1 <= p["depth"] < len(root["turns"]):
                raise BankError(f"{where} root {j} has a prefix at depth {p['depth']}, outside "
                                f"1..{len(root['turns']) - 1}")
            for c, cont in enumerate(p["continuations"]):
                episode(cont, f"{where} root {j} prefix {p['depth']} continuation {c}")


#: Keys of every recorded turn (a tree node): what predictors read, and its exact costs.
TURN_KEYS = ("depth", "action", "observation", "finish_reason", "truncation", "env_error", "cached_tokens",
             "policy_tokens", "observation_tokens", "context_tokens", "prefill_tokens", "env_steps")


# ---------------------------------------------------------------------- members
def encode_line(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str) + "\n").encode()


def compress_line(line: bytes) -> bytes:
    return gzip.compress(line, compresslevel=6, mtime=0)


def iter_members(f: BinaryIO, path: Path, start: int = 0, *,
             lenient: bool = False) -> Iterator[tuple[int, int | None, bytes | None]]:
    """``(offset, end, line bytes)`` per complete gzip member from byte ``start``; a file that
    ends inside a member yields ``(offset, None, None)`` last. Corrupt data raises ``BankError``,
    or with ``lenient`` ends the scan like a partial member (a resume cuts it off)."""
    f.seek(start)
    offset = fed = start
    d, parts = zlib.decompressobj(31), []
    while chunk := f.read(_CHUNK):
        fed += len(chunk)
        data = chunk
        while data:
            try:
                parts.append(d.decompress(data))
            except zlib.error as exc:
                if lenient:
                    yield offset, None, None
                    return
                raise BankError(f"{path}: corrupt gzip data in the member at byte {offset}: {exc}") from None
            if not d.eof:
                break
            end = fed - len(d.unused_data)
            yield offset, end, b"".join(parts)
            data, offset, d, parts = d.unused_data, end, zlib.decompressobj(31), []
    if fed > offset:
        yield offset, None, None


def parse_line(line: bytes, path: Path, offset: int) -> dict[str, Any]:
    if not line.endswith(b"\n") or b"\n" in line[:-1]:
        raise BankError(f"{path}: the member at byte {offset} is not one JSON line")
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise BankError(f"{path}: the line at byte {offset} is not JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("kind") not in ("header", "run", "prompt", "footer"):
        raise BankError(f"{path}: the line at byte {offset} has no known kind (header, run, prompt, footer)")
    return obj


# ---------------------------------------------------------------------- scanning
@dataclass
class PromptEntry:
    """Where one prompt lies in the file, and what the bench needs without reading it again."""

    index: int
    offset: int
    length: int
    task_id: str
    prompt: str
    outcomes: list[bool]
    run: int


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


def scan_bank(path: str | os.PathLike, *, lenient: bool = False) -> BankScan:
    """Read a bank once, member by member (memory: one prompt line), checking its structure.

    Raises ``BankError`` naming the file: not a bank (no header), an unknown version, a
    duplicate prompt, a line after the footer, corrupt data (with ``lenient``, corrupt data
    ends the scan and counts as ``partial_bytes``: what a resume cuts off and records
    again). A partial last member is not an error here (``partial_bytes``);
    :func:`open_bank` refuses an incomplete bank.
    """
    path = Path(path)
    if not path.is_file():
        raise BankError(f"no bank file at {path}")
    header, footer, runs, prompts = None, None, [], []
    digest, seen, end, partial = hashlib.sha256(), set(), 0, 0
    with open(path, "rb") as f:
        for offset, stop, line in iter_members(f, path, lenient=lenient):
            if stop is None:
                partial = path.stat().st_size - offset
                break
            obj = parse_line(line, path, offset)
            kind = obj["kind"]
            if header is None:
                header = _check_header(obj, path)
            elif kind == "header":
                raise BankError(f"{path}: a second header at byte {offset}")
            elif footer is not None:
                raise BankError(f"{path}: a {kind} line after the footer (byte {offset})")
            elif kind == "run":
                runs.append(obj)
            elif kind == "footer":
                footer = obj
            else:
                task_id = obj["task"]["id"]
                if task_id in seen:
                    raise BankError(f"{path}: prompt {task_id!r} is recorded twice (second at byte {offset})")
                seen.add(task_id)
                digest.update(line)
                outcomes = [bool(r["success"]) for r in obj["roots"] if r["turns"]]
                prompts.append(PromptEntry(len(prompts), offset, stop - offset, task_id, obj["task"]["prompt"],
                                           outcomes, int(obj.get("run", 0))))
            end = stop
    if header is None:
        raise BankError(f"{path}: not a bank (no header line)")
    return BankScan(path, header, runs, prompts, footer, digest.hexdigest(), end, partial)


def _check_header(obj: dict[str, Any], path: Path) -> dict[str, Any]:
    if obj.get("kind") != "header" or obj.get("format") != FORMAT:
        raise BankError(f"{path}: not a bank (its first line is not a {FORMAT} header)")
    if obj.get("version") not in SUPPORTED_VERSIONS:
        raise BankError(f"{path}: bank format version {obj.get('version')!r}; this trace_gym reads "
                        f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
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
    if scan.footer.get("prompts") != len(scan.prompts):
        raise BankError(f"{path}: the footer counts {scan.footer.get('prompts')} prompts, the file holds "
                        f"{len(scan.prompts)}")
    if scan.footer.get("sha256") != scan.sha256:
        raise BankError(f"{path}: checksum mismatch: the prompt lines hash to {scan.sha256}, the footer says "
                        f"{scan.footer.get('sha256')}; the file was modified or damaged after recording")


# ---------------------------------------------------------------------- reading
def iter_prompts(path: str | os.PathLike, *, verify: bool = True) -> Iterator[BankPrompt]:
    """Stream a bank's prompts in file order, one line in memory at a time.

    With ``verify`` the checksum is recomputed on the way and checked against the footer
    once the stream ends (``BankError`` then, after the last prompt was yielded).
    """
    path = Path(path)
    digest, count, header, footer = hashlib.sha256(), 0, None, None
    with open(path, "rb") as f:
        for offset, stop, line in iter_members(f, path):
            if stop is None:
                break
            obj = parse_line(line, path, offset)
            if header is None:
                header = _check_header(obj, path)
            elif obj["kind"] == "footer":
                footer = obj
            elif obj["kind"] == "prompt":
                digest.update(line)
                yield BankPrompt(count, obj)
                count += 1
    if header is None:
        raise BankError(f"{path}: not a bank (no header line)")
    if verify:
        if footer is None:
            raise BankError(f"{path}: incomplete bank (no footer): rerun the same `trace-gym bank record` command")
        if footer.get("sha256") != digest.hexdigest() or footer.get("prompts") != count:
            raise BankError(f"{path}: checksum mismatch: the prompt lines hash to {digest.hexdigest()}, the footer "
                            f"says {footer.get('sha256')}; the file was modified or damaged after recording")


class Bank:
    """An opened bank: its manifest, a per-prompt index, and random access to any prompt.

    Opening scans the file once (checking the structure and, with ``verify``, the
    checksum, with a clear error naming the file); only the index stays in memory, and
    :meth:`prompt` reads one prompt back from its byte offset (an LRU cache of
    ``cache_prompts`` keeps the recent ones), so a bank larger than memory can be replayed.
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = True, cache_prompts: int = 1024):
        self.scan = scan_bank(path)
        if verify:
            verify_scan(self.scan)
        self.path = self.scan.path
        self.manifest = self.scan.manifest
        self.entries = self.scan.prompts
        self._cache: OrderedDict[int, BankPrompt] = OrderedDict()
        self._cache_prompts = max(int(cache_prompts), 1)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def roots(self) -> int:
        """R: root rollouts recorded per prompt."""
        return int(self.manifest["roots"])

    @property
    def continuations(self) -> int:
        """K: continuations recorded per recorded prefix."""
        return int(self.manifest["continuations"])

    def prompt(self, index: int) -> BankPrompt:
        """Prompt ``index`` (file order), read from its byte offset."""
        if index in self._cache:
            self._cache.move_to_end(index)
            return self._cache[index]
        e = self.entries[index]
        with open(self.path, "rb") as f:
            f.seek(e.offset)
            raw = f.read(e.length)
        record = BankPrompt(index, json.loads(zlib.decompress(raw, 31)))
        self._cache[index] = record
        while len(self._cache) > self._cache_prompts:
            self._cache.popitem(last=False)
        return record

    def __iter__(self) -> Iterator[BankPrompt]:
        return iter_prompts(self.path, verify=False)


def open_bank(path: str | os.PathLike, *, verify: bool = True, cache_prompts: int = 1024) -> Bank:
    """Open a bank for replay (see :class:`Bank`)."""
    return Bank(path, verify=verify, cache_prompts=cache_prompts)


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The header line alone (the first member; nothing else is read)."""
    path = Path(path)
    with open(path, "rb") as f:
        for offset, stop, line in iter_members(f, path):
            if stop is None:
                break
            return _check_header(parse_line(line, path, offset), path)
    raise BankError(f"{path}: not a bank (no header line)")


def read_footer(path: str | os.PathLike, tail_bytes: int = 1 << 16) -> dict[str, Any] | None:
    """The footer line without reading the whole file (it is the last, small member), or
    ``None`` when the bank is incomplete. Not a verification: :func:`open_bank` is."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - tail_bytes))
        tail = f.read()
    start = tail.rfind(b"\x1f\x8b\x08")
    while start >= 0:
        d = zlib.decompressobj(31)
        try:
            line = d.decompress(tail[start:])
            if d.eof and not d.unused_data:
                obj = json.loads(line)
                return obj if isinstance(obj, dict) and obj.get("kind") == "footer" else None
        except (zlib.error, ValueError):
            pass
        start = tail.rfind(b"\x1f\x8b\x08", 0, start)
    return None


def list_banks(folder: str | os.PathLike, pattern: str = "**/*.jsonl.gz") -> list[dict[str, Any]]:
    """One row per bank under ``folder`` (files that are not banks are skipped): path, env, policy,
    counts, size, whether complete; from the header and footer only (fast, not verified)."""
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
                     "complete": footer is not None, "bytes": path.stat().st_size, "created_at": m.get("created_at")})
    return rows
