"""The files of a run directory, written atomically and read as untrusted input.

A run dir is written by one run (:class:`~trace_gym.checkpoint.RunDir` holds its lock)
and read again by its resume, by ``eval`` and by ``compare``, perhaps after a crash, a
bad copy or a hand edit. So every reader here is bounded and total: a file or line is
read up to a size, parsed within a depth (:func:`trace_gym.textsafe.loads_record`), and
checked for the shape its caller indexes; what fails is one ``ValueError`` naming the
file and what is wrong (or, where documented, a skipped line or a cache miss), never a
``RecursionError``, a bare ``ValueError`` of the int parser, a ``KeyError`` or an
``AttributeError``.

- :func:`atomic_write_text`: a unique temp name per writer (pid + random suffix, created
  exclusively, never through a link), fsync, ``os.replace``: concurrent writers of one
  file never share a temp file, and a reader sees the old file or a new one whole;
- :func:`read_json_file`, :func:`iter_json_lines`: the bounded readers;
- :func:`write_manifest`, :func:`verify_checkpoint`: a checkpoint counts only when its
  manifest lists exactly the plain files present (no link, nothing unlisted), at least
  the files every step writes (``required``), each with its size and SHA-256, and its
  ``state.json`` / ``metrics.json`` are of its step;
- :func:`link_outside`: where a path leads when links take it out of a folder.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping, Sequence

from trace_gym.textsafe import JSONRefused, loads_record

MANIFEST = "manifest.json"
#: Largest JSON file of a run dir read whole (a manifest, ``state.json``, an eval result), bytes.
MAX_JSON_FILE_BYTES = 64 << 20
#: Longest line of a JSON-lines file (``metrics.jsonl``, transcripts) parsed; longer ones are skipped.
MAX_JSON_LINE_BYTES = 16 << 20
#: Deepest nesting of a run file (a manifest is 3 deep, a metrics line about 5, a transcript about 8).
MAX_RUN_JSON_DEPTH = 64
#: Largest step number a run file may name (a count, exact as a float).
MAX_STEP = 2**53
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: What ``eval`` wrote into a checkpoint's ``policy/`` before issue 41 (the memo now lives in
#: the cache: :mod:`trace_gym.weights`); a run dir evaluated then still holds it.
OLD_EVAL_MEMO = ".trace_gym_weights_hash.json"


# ---------------------------------------------------------------------- writing
def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file of this writer's own (pid + random
    suffix, ``O_EXCL | O_NOFOLLOW``), fsync and ``os.replace``: never a torn file, never
    two writers in one temp file, never a write through a planted link."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------- one writer at a time
def exclusive_lock(lock: str | Path, owner: str, advice: str, user: str = "the run") -> BinaryIO:
    """Take an exclusive ``flock`` on the file ``lock`` (created if missing) and write the
    holder into it: ``pid P on HOST since YYYY-MM-DD HH:MM:SS (argv)``. Returns the open
    file: the lock is held while it stays open, and released when it is closed or the
    process ends, however it ends (:func:`release_lock`). The run dir's lock and the bank
    writer's use it.

    Raises:
        ValueError: another process holds the lock (``"<owner> is in use by <holder>;
            <advice>"``), or ``lock`` is a link (never followed), a folder (``user``: whose
            lock file it should be, in that message) or cannot be opened.
    """
    import fcntl
    import socket
    import sys
    import time

    lock = Path(lock)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError(f"{owner}: {lock.name} is a link (to {os.readlink(lock)}); a lock is taken on its "
                                 "own file only (remove the link)") from None
            what = f"is a folder, not {user}'s lock file (remove it)" if exc.errno == errno.EISDIR else \
                f"cannot be opened ({exc.strerror})"
            raise ValueError(f"{owner}: {lock.name} {what}") from None
        handle = os.fdopen(fd, "r+b")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            handle.close()
            raise ValueError(f"{owner} is in use by {holder}; {advice}") from None
        if _same_file(lock, fd):
            break
        handle.close()  # its holder removed it as we opened it (release_lock): lock the file now at the path
    handle.truncate(0)
    argv = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200]
    handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')} "
                 f"({argv})\n".encode())
    handle.flush()
    return handle


def _same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def release_lock(handle: BinaryIO | None, lock: str | Path, *, remove: bool = False) -> None:
    """Release :func:`exclusive_lock`'s lock; with ``remove``, delete the lock file first
    (while still held: a process that opened it meanwhile sees it gone and retries)."""
    if handle is None or handle.closed:
        return
    if remove and _same_file(Path(lock), handle.fileno()):
        Path(lock).unlink(missing_ok=True)
    handle.close()


# ---------------------------------------------------------------------- reading
class NotRegularFile(ValueError):
    """:func:`open_regular`'s refusal; ``is_dir`` tells a folder from a FIFO, socket or device."""

    def __init__(self, path: str | Path, is_dir: bool):
        super().__init__(f"{path} is not a regular file ({'a folder' if is_dir else 'a FIFO, socket or device'})")
        self.is_dir = is_dir


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened to read bytes, refused unless it is a regular file: a FIFO would
    block its reader for ever and ``/dev/zero`` never ends (:class:`NotRegularFile`, a
    ``ValueError`` naming it; ``OSError`` when it cannot be opened). Links are followed (a
    run dir's own checks say where they may lead); the run dirs and the banks read through it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO does not wait for a writer
    except IsADirectoryError:  # where a folder cannot be opened at all
        raise NotRegularFile(path, is_dir=True) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, is_dir=stat.S_ISDIR(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json_file(path: str | Path, *, max_bytes: int = MAX_JSON_FILE_BYTES,
                   max_depth: int = MAX_RUN_JSON_DEPTH, unique_keys: bool = False) -> Any:
    """The JSON value of ``path``, read to at most ``max_bytes`` and parsed within
    ``max_depth``; ``ValueError`` naming the file and why (too large, too deep, not UTF-8,
    not JSON, a number past Python's digit limit, with ``unique_keys`` a key given twice in
    one object). ``OSError`` when it cannot be read."""
    path = Path(path)
    with open_regular(path) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path.name} is more than {max_bytes:,} bytes long")
    try:
        return loads_record(data, max_depth=max_depth, unique_keys=unique_keys)
    except JSONRefused as exc:
        raise ValueError(f"{path.name} {exc}") from None


def iter_json_lines(path: str | Path, *, max_line_bytes: int = MAX_JSON_LINE_BYTES,
                    max_depth: int = MAX_RUN_JSON_DEPTH) -> Iterator[Any]:
    """The parsed lines of a JSON-lines file, one in memory at a time; a line that is
    longer than ``max_line_bytes``, deeper than ``max_depth`` or not JSON (a torn last
    line, an interleaved write, an edit) is skipped; ``ValueError`` when ``path`` is not a
    regular file (:func:`open_regular`)."""
    with open_regular(path) as f:
        while line := f.readline(max_line_bytes + 1):
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                while (rest := f.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass  # the rest of an overlong line, read in bounded pieces and dropped
                continue
            if not line.strip():
                continue
            try:
                yield loads_record(line, max_depth=max_depth)
            except JSONRefused:
                continue


def is_step(value: Any) -> bool:
    """Whether ``value`` is a step number (an int, not a bool, in 0..:data:`MAX_STEP`)."""
    return type(value) is int and 0 <= value <= MAX_STEP


def link_outside(root: str | Path, path: str | Path) -> str | None:
    """Where ``path`` leads (links resolved) when that is outside ``root`` (links resolved
    too), else ``None``; a path that does not exist leads nowhere."""
    if not os.path.lexists(path):
        return None
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    return None if os.path.commonpath([real_root, real]) == real_root else real


# ---------------------------------------------------------------------- checkpoints
def sha256_file(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, step: int) -> None:
    """Record every file under ``folder`` (size, SHA-256) in its ``manifest.json``, last."""
    files = {f.relative_to(folder).as_posix(): {"size": f.stat().st_size, "sha256": sha256_file(f)}
             for f in sorted(folder.rglob("*")) if f.is_file() and f.name != MANIFEST}
    atomic_write_text(folder / MANIFEST, json.dumps({"step": step, "complete": True, "files": files}, indent=1))


def drop_checkpoint_files(folder: Path, step: int, patterns: Sequence[str]) -> list[str]:
    """Make a complete checkpoint weights-only: the listed files matching ``patterns`` leave
    the manifest (rewritten atomically first, marked ``"resumable": false`` with the names
    under ``"dropped"``), then the files are deleted. Idempotent; killed between the two, the
    checkpoint is still complete (a dropped name may remain on disk until the next call).
    Returns the names dropped (none when nothing matched)."""
    manifest = read_json_file(folder / MANIFEST)
    if _manifest_problem(manifest, step):
        return []
    files, dropped = dict(manifest["files"]), list(manifest.get("dropped") or [])
    names = [n for n in files if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if names:
        manifest = {**manifest, "resumable": False, "files": {n: e for n, e in files.items() if n not in names},
                    "dropped": sorted(set(dropped) | set(names))}
        atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=1))
    for name in manifest.get("dropped") or []:
        if type(name) is str and "/" not in name and name != MANIFEST:
            (folder / name).unlink(missing_ok=True)
    return names


def is_resumable(folder: Path) -> bool:
    """Whether a checkpoint still holds its resume state (its manifest is not marked
    ``"resumable": false`` by :func:`drop_checkpoint_files`)."""
    try:
        return read_json_file(folder / MANIFEST).get("resumable", True) is not False
    except (OSError, ValueError, AttributeError):
        return False


def _dropped(manifest: Mapping[str, Any]) -> list[str]:
    """The names a weights-only manifest dropped (top-level file names only; else none)."""
    names = manifest.get("dropped") if manifest.get("resumable") is False else None
    if type(names) is not list:
        return []
    return [n for n in names if type(n) is str and n and "/" not in n and n not in (MANIFEST, ".", "..")]


def _shown(name: str) -> str:
    """A file name as a one-line reason shows it: as is, or quoted when it holds a newline or
    another character that is not printable."""
    return name if name.isprintable() else repr(name)


def _plain_files(folder: Path) -> tuple[dict[str, Path], str | None]:
    """``({relative name: path} of the files under folder, None)``, or the reason the folder
    holds something a checkpoint never does (a link, a device, a pipe)."""
    files: dict[str, Path] = {}
    for top, dirs, names in os.walk(folder, followlinks=False):
        for name in [*dirs, *names]:
            path = Path(top) / name
            rel = path.relative_to(folder).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                return files, f"{_shown(rel)} is a link (to {_shown(os.readlink(path))}); a checkpoint holds plain " \
                              "files only"
            if name in names:
                if not stat.S_ISREG(mode):
                    return files, f"{_shown(rel)} is not a regular file"
                files[rel] = path
    return files, None


def _manifest_problem(manifest: Any, step: int) -> str | None:
    """Why ``manifest`` is not a complete manifest of ``step``, naming the field, else ``None``."""
    if type(manifest) is not dict:
        return f"{MANIFEST} is a {type(manifest).__name__}, expected an object"
    if manifest.get("complete") is not True:
        return f"{MANIFEST} is not marked complete"
    if not is_step(manifest.get("step")) or manifest["step"] != step:
        return f"{MANIFEST} is of step {manifest.get('step')!r:.40}"
    files = manifest.get("files")
    if type(files) is not dict:
        return f"{MANIFEST}'s files is {type(files).__name__ if 'files' in manifest else 'missing'}, expected an object"
    for name, entry in files.items():
        parts = name.split("/")
        if not name or name == MANIFEST or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return f"{MANIFEST} lists {name!r:.80}, not a file inside the checkpoint"
        if type(entry) is not dict or not is_step(entry.get("size")) or type(entry.get("sha256")) is not str \
                or not _SHA256.fullmatch(entry["sha256"]):
            return f"{MANIFEST}'s entry of {name!r:.80} is {entry!r:.80}, expected {{'size': bytes, 'sha256': hex}}"
    return None


def state_problem(state: Any, step: int, *, cursor: bool = False) -> str | None:
    """Why ``state`` (a parsed ``state.json``) is not the state of ``step``: an object with
    ``step``, and when present (required with ``cursor``) ``cursor`` = ``{"epoch",
    "position"}`` counts and ``fallback_first`` a bool; else ``None``."""
    if type(state) is not dict:
        return f"state.json is a {type(state).__name__}, expected an object"
    if not is_step(state.get("step")) or state["step"] != step:
        return f"state.json is of step {state.get('step')!r:.40}, expected {step}"
    if cursor or "cursor" in state:
        c = state.get("cursor")
        if type(c) is not dict or not is_step(c.get("epoch")) or not is_step(c.get("position")):
            return f"state.json's cursor is {c!r:.80}, expected {{'epoch': count, 'position': count}}"
    if type(state.get("fallback_first", False)) is not bool:
        return f"state.json's fallback_first is {state['fallback_first']!r:.40}, expected true or false"
    return None


def _step_files_problem(folder: Path, step: int, files: Mapping[str, Any]) -> str | None:
    """Why the checkpoint's own JSON files (``state.json``, ``metrics.json``) are not of ``step``."""
    for name in ("state.json", "metrics.json"):
        if name not in files:
            continue
        try:
            value = read_json_file(folder / name)
        except (OSError, ValueError) as exc:
            return f"{name} is unreadable ({exc})"
        problem = state_problem(value, step) if name == "state.json" else (
            None if type(value) is dict and value.get("step") == step and is_step(value.get("step"))
            else f"metrics.json is not the metrics line of step {step}")
        if problem:
            return problem
    return None


def verify_checkpoint(folder: Path, step: int, *, hashes: bool = True,
                      required: Sequence[str] = ("metrics.json",)) -> str | None:
    """Why ``folder`` is not a complete checkpoint of ``step`` (naming the file), or ``None``.

    Complete: ``folder`` and everything in it are plain (no link anywhere); its manifest
    (read bounded) is of ``step`` and marked complete; it lists every file present and
    nothing else; at least one listed file matches each pattern of ``required`` (the files
    every step writes: a manifest listing ``{}`` does not make a step); each file has the
    listed size (and, with ``hashes``, SHA-256); ``state.json`` and ``metrics.json`` are
    of ``step``.
    """
    if os.path.islink(folder):
        return f"the folder is a link (to {_shown(os.readlink(folder))}); a checkpoint holds plain files only"
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return f"no {MANIFEST} (an incomplete or foreign folder)"
    present, odd = _plain_files(folder)
    if odd:
        return odd
    try:
        manifest = read_json_file(manifest_path)
    except (OSError, ValueError) as exc:
        return f"{MANIFEST} is unreadable ({exc})"
    problem = _manifest_problem(manifest, step)
    if problem:
        return problem
    files = manifest["files"]
    dropped = set(_dropped(manifest))  # a weights-only checkpoint: these went on purpose
    unlisted = sorted(set(present) - set(files) - {MANIFEST} - dropped)
    if unlisted:
        old_memo = " (the weights-hash memo eval wrote there before issue 41: safe to remove)" \
            if unlisted[0].rpartition("/")[2] == OLD_EVAL_MEMO else ""
        return f"{_shown(unlisted[0])} is not listed in {MANIFEST}{old_memo} (a checkpoint holds what its manifest " \
               "lists, nothing else)"
    for pattern in required:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in [*files, *dropped]):
            return f"{MANIFEST} lists no {pattern} (every checkpoint of this run holds one)"
    for name, entry in files.items():
        path = present.get(name)
        if path is None:
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, the manifest says {entry['size']}"
        if hashes and sha256_file(path) != entry["sha256"]:
            return f"{name} differs from the manifest (SHA-256)"
    return _step_files_problem(folder, step, files)


def listed_sha256(folder: Path, under: str) -> dict[str, str]:
    """``{name inside under/: sha256 hex}`` of the files a checkpoint's manifest lists in its
    sub-folder ``under`` (``"policy"``: the weights), so a caller that has just checked the
    checkpoint by content (:func:`verify_checkpoint` with ``hashes``) need not hash them
    again; ``{}`` when the manifest is unreadable or of the wrong shape."""
    try:
        manifest = read_json_file(folder / MANIFEST)
    except (OSError, ValueError):
        return {}
    files = manifest.get("files") if type(manifest) is dict else None
    prefix = under.strip("/") + "/"
    return {name[len(prefix):]: entry["sha256"] for name, entry in (files if type(files) is dict else {}).items()
            if name.startswith(prefix) and type(entry) is dict and type(entry.get("sha256")) is str}


def read_state(folder: Path, step: int) -> dict[str, Any]:
    """A training checkpoint's ``state.json`` (bounded, checked: :func:`state_problem` with
    its cursor); ``ValueError`` naming the file and the field."""
    try:
        state = read_json_file(folder / "state.json")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: state.json is unreadable ({exc})") from None
    problem = state_problem(state, step, cursor=True)
    if problem:
        raise ValueError(f"{folder}: {problem}")
    return state
