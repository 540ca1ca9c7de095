"""Writing a bank: :class:`BankWriter` appends fsync'd lines and resumes a killed recording;
:func:`weights_hash` names the policy's weights for the manifest. The layout is in
:mod:`trace_gym.banks.format`."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Mapping, Sequence

from trace_gym.banks.format import (FORMAT, RUN_KEYS, VERSION, BankError, check_line_bytes, compress_line,
                                    encode_line, iter_members, parse_line, read_header, scan_bank)
from trace_gym.banks.lines import open_file
from trace_gym.banks.schema import check_encodable, check_manifest, check_prompt_record
from trace_gym.runs.files import exclusive_lock, release_lock

#: A header line's first bytes (gzip member header, then the JSON up to the format), for
#: recognising a header that a killed recorder left half-written.
_HEADER_MEMBER_START = compress_line(b"\n")[:4]  # magic, deflate, no flags (mtime, xfl, OS may differ)
_HEADER_TEXT_START = encode_line({"kind": "header", "format": FORMAT})[:-2]


def _normal(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


class BankWriter:
    """Appends prompts to a bank, durably: each line is one gzip member, flushed and fsync'd.

    A new file gets the header first. With ``resume`` an existing file is scanned: a
    partial last member (a recorder killed mid-write) is cut off, the prompts already
    there are known (:attr:`present`) and the checksum continues from them; a manifest
    that differs from the file's (except :data:`RUN_KEYS`) is refused, naming the keys.
    A file that holds nothing but the start of a header (a recorder killed as it
    started; :func:`torn_header`) is started afresh (:attr:`torn_header`). The manifest
    and every line are checked against the schema and bounds the readers hold them to
    (:mod:`trace_gym.banks.schema`), so the writer never writes a line a reader refuses.

    One writer per bank: the writer holds an exclusive lock on ``<bank>.lock``
    (:func:`~trace_gym.runs.files.exclusive_lock`, the run dir's mechanism) from before it
    reads the file until :meth:`close` (or the end of its process, however it ends); a
    second writer of the same file, in any process, is refused in one ``ValueError``
    naming the holder's pid, host and start time, before it reads or cuts anything.

    Args:
        path: the bank file.
        manifest: the header's manifest (JSON-friendly).
        resume: continue an existing file instead of refusing to overwrite it.
        lock: the bank's lock, already taken with :func:`lock_bank` (``bank record`` takes
            it before the model loads); the writer owns it from then on. ``None``: taken here.
    """

    def __init__(self, path: str | os.PathLike, manifest: Mapping[str, Any], *, resume: bool = False,
                 lock: BinaryIO | None = None):
        self.path = Path(path)
        self.manifest = _normal(dict(manifest))
        if self.path.exists() and not resume:  # checked again under the lock
            release_lock(lock, lock_path(self.path), remove=True)
            raise BankError(f"{self.path} exists; pass resume=True to continue it, or choose another path")
        try:
            check_manifest(self.manifest)
        except BankError as exc:
            release_lock(lock, lock_path(self.path), remove=True)
            raise BankError(f"{self.path}: refused to write a bank header: {exc}") from None
        #: the open lock file (:func:`lock_path`) while this writer holds it
        self._lock: BinaryIO | None = lock_bank(self.path) if lock is None else lock
        try:
            if self.path.exists() and not resume:
                raise BankError(f"{self.path} exists; pass resume=True to continue it, or choose another path")
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        """Cut what a killed recorder left, and resume the file or start it with its header."""
        self.present: set[str] = set()
        self.truncated_bytes = 0
        #: whether the file held only a half-written header (cut off, and the bank started afresh)
        self.torn_header = False
        self.complete = False
        self._digest = hashlib.sha256()
        self._runs: list[dict[str, Any]] = []
        self._last_write: dict[int, float] = {}
        if self.path.exists() and torn_header(self.path) is not None:
            self.truncated_bytes, self.torn_header = self.path.stat().st_size, True
            with open(self.path, "r+b") as f:
                f.truncate(0)
                os.fsync(f.fileno())
        if self.path.exists() and not self.torn_header:
            self._resume()
        else:
            header = {"kind": "header", "format": FORMAT, "version": VERSION, "manifest": self.manifest}
            self._append(encode_line(header))

    def close(self) -> None:
        """Release the lock (and remove its file); the writer takes no further line. Idempotent;
        a process that ends releases it too, however it ends."""
        release_lock(self._lock, lock_path(self.path), remove=True)
        self._lock = None

    def __enter__(self) -> "BankWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _resume(self) -> None:
        scan = scan_bank(self.path, lenient=True)
        old = {k: v for k, v in _portable_policy(scan.manifest).items() if k not in RUN_KEYS}
        new = {k: v for k, v in self.manifest.items() if k not in RUN_KEYS}
        differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if differ:
            detail = "; ".join(f"{k}: file {old.get(k)!r}, now {new.get(k)!r}" for k in differ)
            raise BankError(f"{self.path} was recorded with other settings ({detail}); resume with the same "
                            "settings, or record into another file")
        if scan.partial_bytes:
            with open(self.path, "r+b") as f:
                f.truncate(scan.end)
                os.fsync(f.fileno())
            self.truncated_bytes = scan.partial_bytes
        self.manifest = scan.manifest
        self.complete = scan.footer is not None
        self._runs = scan.runs
        for e in scan.prompts:
            self.present.add(e.task_id)
        with open(self.path, "rb") as f:  # the checksum continues from the prompts already there (checked by the scan)
            for number, offset, stop, line in iter_members(f, self.path, lenient=True):
                obj = parse_line(line, self.path, number, offset) if stop is not None else {}
                if obj.get("kind") == "prompt":
                    self._digest.update(line)
                    self._last_write[int(obj.get("run", 0))] = float(obj.get("written_at", 0.0))

    def _append(self, line: bytes) -> None:
        if self._lock is None:
            raise BankError(f"{self.path}: this writer was closed; open a new BankWriter to go on")
        try:
            check_line_bytes(line)
        except BankError as exc:
            raise BankError(f"{self.path}: refused to write {exc}") from None
        with open(self.path, "ab") as f:
            f.write(compress_line(line))
            f.flush()
            os.fsync(f.fileno())

    def start_run(self, command: Sequence[str] | None = None) -> int:
        """Record that a run starts now; returns its index (0 for the first)."""
        if self.complete:
            raise BankError(f"{self.path} is complete; nothing to record")
        run = {"kind": "run", "run": len(self._runs), "command": list(command or []), "started_at": time.time()}
        self._append(encode_line(run))
        self._runs.append(run)
        return run["run"]

    def add(self, record: Mapping[str, Any]) -> None:
        """Append one prompt line (checked with :func:`check_prompt_record`; a prompt already in the
        bank is refused)."""
        if self.complete:
            raise BankError(f"{self.path} is complete; cannot add prompts")
        record = {"kind": "prompt", **record}
        try:
            normal = _normal(record)
            check_prompt_record(normal, self.manifest)
            check_encodable(normal)
        except BankError as exc:
            raise BankError(f"{self.path}: refused a prompt line: {exc}") from None
        task_id = record["task"]["id"]
        if task_id in self.present:
            raise BankError(f"{self.path} already holds prompt {task_id!r}")
        line = encode_line(record)
        self._append(line)
        self._digest.update(line)
        self.present.add(task_id)
        self._last_write[int(record.get("run", 0))] = float(record.get("written_at", time.time()))

    def finish(self, *, last_run_ends_now: bool = True, **extra: Any) -> dict[str, Any]:
        """Append the footer (count, checksum, recording seconds summed over runs: each run from
        its start to its last prompt written, the last run to now unless ``last_run_ends_now``
        is false, as for a recording closed long after it was killed) and release the lock
        (:meth:`close`); returns the footer."""
        now = time.time()
        seconds = 0.0
        for n, run in enumerate(self._runs):
            ends_now = last_run_ends_now and n == len(self._runs) - 1
            last = now if ends_now else self._last_write.get(n, run["started_at"])
            seconds += max(last - run["started_at"], 0.0)
        footer = {"kind": "footer", "prompts": len(self.present), "sha256": self._digest.hexdigest(),
                  "finished_at": now, "runs": len(self._runs), "seconds": seconds, **_normal(extra)}
        self._append(encode_line(footer))
        self.complete = True
        self.close()  # the footer ends the writer's life
        return footer


def _portable_policy(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``manifest`` with its policy name made portable (a bank recorded before names were)."""
    out = dict(manifest)
    if isinstance(out.get("policy"), str):
        out["policy"] = portable_path(out["policy"])
    return out


def close_recording(path: str | os.PathLike) -> dict[str, Any]:
    """End an interrupted recording at the prompts it holds: append the footer (their count
    and checksum, the recording seconds, ``tasks`` the manifest's planned prompts and
    ``closed_early: true``), so the bank replays; it can no longer be resumed. Returns the footer.

    For a recording whose budget ran out (a bank of the first 192 of 256 planned prompts is
    a bank of 192 prompts: each prompt line is whole and independent). Takes the writer's
    lock first, so a recorder still running is refused, named, before anything is touched;
    a partial last line (a recorder killed mid-write) is cut as a resume would cut it.

    Raises:
        BankError: not a bank, already complete, or holding no prompt.
        ValueError: another writer holds the bank (its pid, host and start time).
    """
    path = Path(path)
    manifest = _portable_policy(read_header(path)["manifest"])  # compared as a resume compares it
    with BankWriter(path, manifest, resume=True) as writer:
        if writer.complete:
            raise BankError(f"{path} is already complete ({len(writer.present)} prompts); nothing to close")
        if not writer.present:
            raise BankError(f"{path} holds no prompt yet; record at least one before closing it")
        planned = manifest.get("prompts")
        if planned is not None and len(writer.present) >= planned:  # killed as it wrote its footer
            raise BankError(f"{path} holds all {planned} planned prompts; rerun its `trace-gym bank record` "
                            "command to finish it (that writes the footer with the run's costs)")
        try:
            return writer.finish(last_run_ends_now=False, closed_early=True,
                                 **({"tasks": planned} if planned is not None else {}))
        except OSError as exc:
            raise BankError(f"{path}: could not write the footer: {exc}") from None


def lock_path(bank: str | os.PathLike) -> Path:
    """The lock file of a bank's writer: ``<bank>.lock`` beside it (removed when the writer closes)."""
    bank = Path(bank)
    return bank.with_name(bank.name + ".lock")


def lock_bank(bank: str | os.PathLike) -> BinaryIO:
    """Take the exclusive lock of ``bank``'s writer (:func:`lock_path`; its folder is made);
    the open lock file, for :class:`BankWriter`'s ``lock``.

    Raises:
        ValueError: another writer holds it: one line naming its pid, host and start time.
    """
    bank = Path(bank)
    bank.parent.mkdir(parents=True, exist_ok=True)
    return exclusive_lock(lock_path(bank), f"bank {str(bank)!r}",
                          "wait for that recording to end, or record into another file", user="the writer")


def torn_header(path: str | os.PathLike, limit: int = 1 << 20) -> int | None:
    """The size of ``path`` when all it holds is the start of a bank header line: nothing,
    or a prefix of one gzip member that starts as :func:`compress_line` starts every
    member and whose text so far is a prefix of a header's (a recorder killed while it
    wrote the header); else ``None`` (a complete first line, corrupt data, another file).
    Reads at most ``limit`` bytes; ``BankError`` for a path that is no regular file (a FIFO would hang)."""
    with open_file(Path(path)) as f:
        data = f.read(limit + 1)
    if len(data) > limit or data[:4] != _HEADER_MEMBER_START[:len(data)]:
        return None
    d = zlib.decompressobj(31)
    try:
        text = d.decompress(data, limit)
    except zlib.error:
        return None
    if d.eof or text[:len(_HEADER_TEXT_START)] != _HEADER_TEXT_START[:len(text)]:
        return None
    return len(data)


# ---------------------------------------------------------------------- paths a bank may carry
def portable_path(path: str, cwd: str | os.PathLike | None = None) -> str:
    """``path`` as a bank's manifest records it, meaningful wherever the bank is copied: an
    absolute path (``~`` expanded) inside the working folder ``cwd`` (default: the current
    one) relative to it, an absolute path elsewhere (a model cache, a temp folder) by its
    last name only; anything else (a model name, a relative path) as given.

    >>> portable_path("/work/banks/b.jsonl.gz", "/work"), portable_path("/tmp/rec/b.jsonl.gz", "/work")
    ('banks/b.jsonl.gz', 'b.jsonl.gz')
    """
    full = os.path.expanduser(str(path))
    if not os.path.isabs(full):
        return str(path)
    here = _working_folder(cwd)
    if _inside(full, here):
        return os.path.relpath(full, here)
    return os.path.basename(os.path.normpath(full)) or str(path)


def _working_folder(cwd: str | os.PathLike | None) -> str:
    return os.path.abspath(cwd if cwd is not None else os.getcwd())


def _inside(full: str, here: str) -> bool:
    """Whether the absolute path ``full`` lies in the folder ``here`` (or is it)."""
    full = os.path.normpath(full)
    return full == here or full.startswith(here.rstrip(os.sep) + os.sep)


def portable_command(argv: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
    """A command line as a bank records it: each argument that is an absolute path, or a
    ``key=PATH`` / ``--flag=PATH`` whose value is one, through :func:`portable_path`.

    >>> portable_command(["/work/.venv/bin/trace-gym", "bank", "record", "out=/tmp/rec/b.jsonl.gz"], "/work")
    ['.venv/bin/trace-gym', 'bank', 'record', 'out=b.jsonl.gz']
    """
    out = []
    for arg in map(str, argv):
        key, sep, value = arg.partition("=")
        if sep and key and "/" not in key and os.path.isabs(os.path.expanduser(value)):
            out.append(f"{key}={portable_path(value, cwd)}")
        else:
            out.append(portable_path(arg, cwd))
    return out


def shared_policy_path(folder: str | os.PathLike | None, cwd: str | os.PathLike | None = None) -> str | None:
    """The policy folder as a bank's manifest records it: relative to the working folder when
    it lies inside it, else ``None`` (the model cache, another machine's folder: the manifest's
    ``policy`` name and ``weights_sha256`` identify the policy).

    >>> shared_policy_path("/work/models/q", "/work"), shared_policy_path("/root/.cache/m/q", "/work")
    ('models/q', None)
    """
    if folder is None:
        return None
    full = os.path.expanduser(str(folder))
    if not os.path.isabs(full):
        return str(folder)
    return portable_path(full, cwd) if _inside(full, _working_folder(cwd)) else None


# ---------------------------------------------------------------------- the policy's weights
def weights_hash(folder: str | os.PathLike | None) -> str | None:
    """:func:`trace_gym.runs.weights.weights_hash` of the policy folder (the one definition, shared
    with the eval cache), or ``None`` without a folder or without weights files."""
    from trace_gym.runs.weights import weights_hash as sha256_of_weights

    if folder is None or not Path(folder).is_dir():
        return None
    try:
        return sha256_of_weights(folder)
    except ValueError:
        return None
