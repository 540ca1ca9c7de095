"""The files of a run directory, written atomically and read as untrusted input.

A run dir is written by one run (:class:`~trace_gym.runs.run_dir.RunDir` holds its lock)
and read again by its resume, by ``eval`` and by ``compare``, perhaps after a crash, a
bad copy or a hand edit. So every reader here is bounded and total: a file or line is
read up to a size, parsed within a depth (:func:`trace_gym.utils.textsafe.loads_record`), and
checked for the shape its caller indexes; what fails is one ``ValueError`` naming the
file and what is wrong (or, where documented, a skipped line or a cache miss), never a
``RecursionError``, a bare ``ValueError`` of the int parser, a ``KeyError`` or an
``AttributeError``.

- :func:`atomic_write_text`: a unique temp name per writer (pid + random suffix, created
  exclusively, never through a link), fsync, ``os.replace``: concurrent writers of one
  file never share a temp file, and a reader sees the old file or a new one whole;
- :func:`read_json_file`, :func:`iter_json_lines`: the bounded readers;
- :func:`link_outside`: where a path leads when links take it out of a folder;
- :func:`load_state_file`: a ``.pt`` state file, read as tensors, numbers and arrays only.

A checkpoint's own rules (its manifest, when it counts): :mod:`trace_gym.runs.checkpoint`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from trace_gym.utils.textsafe import JSONRefused, loads_record

#: Largest JSON file of a run dir read whole (a manifest, ``state.json``, an eval result), bytes.
MAX_JSON_FILE_BYTES = 64 << 20
#: Longest line of a JSON-lines file (``metrics.jsonl``, transcripts) parsed; longer ones are skipped.
MAX_JSON_LINE_BYTES = 16 << 20
#: Deepest nesting of a run file (a manifest is 3 deep, a metrics line about 5, a transcript about 8).
MAX_RUN_JSON_DEPTH = 64
#: Largest step number a run file may name (a count, exact as a float).
MAX_STEP = 2**53


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


def sha256_file(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------- state files
def load_state_file(path: str | Path, map_location: Any = None) -> Any:
    """A ``.pt`` file of a run dir (``rng.pt``, ``predictor.pt``, a shard's optimiser state),
    read with ``torch.load(weights_only=True)``: tensors, numbers, strings and containers,
    plus numpy arrays (the RNG states hold them), and nothing that runs code when unpickled
    (a run dir may have been edited by anyone: its manifest is no signature).

    Raises:
        ValueError: the file cannot be read that way (tampered, or not a state file), naming it.
    """
    import numpy as np
    import torch
    from numpy._core.multiarray import _reconstruct

    dtype_classes = [c for c in vars(np.dtypes).values() if isinstance(c, type) and issubclass(c, np.dtype)]
    try:
        with torch.serialization.safe_globals([_reconstruct, np.ndarray, np.dtype, *dtype_classes]):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001  (UnpicklingError, a torn zip, EOF, ...: every one is a bad file)
        raise ValueError(f"{path} is not a state file trace_gym wrote, or was changed: it is read only as tensors, "
                         f"numbers and arrays ({type(exc).__name__}: {str(exc).splitlines()[0][:300]})") from None
