"""The one name of a model folder's weights: :func:`weights_hash`, and its memo in the cache.

The hash keys the eval cache and names the policy in a bank's manifest. Computing it reads
every ``*.safetensors`` byte (about 1 s per 500 MB), so it is memoised, but never inside
the folder it names: a model folder, a checkpoint above all, is read-only to every reader
(a memo written into ``checkpoints/step-N/policy/`` made the checkpoint fail its manifest,
and the next ``train`` moved the trained weights aside). The memo lives in the cache::

    $TRACE_GYM_CACHE/weights_hashes/<blake2b of the folder's real path>.json

keyed by each file's device, inode, size, mtime and ctime (``ctime`` cannot be set back by
a user, so an edit that restores size and mtime still misses). Timestamps are coarse (a
kernel tick; a second on some filesystems), so a file changed within
:data:`RACY_SECONDS` of its hashing is not memoised: an edit in the same tick would keep
its ctime (git's "racily clean" entries). A cache that cannot be read or written is a
miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Mapping

from trace_gym.runs.files import atomic_write_text, read_json_file, sha256_file

#: Memo format version (2 was the memo inside the model folder, keyed by size and mtime).
_MEMO_VERSION = 3
#: A file whose ctime is this close to (or after) the start of its hashing is not memoised, seconds.
RACY_SECONDS = 2.0
#: The manifest a pulled model carries (:data:`trace_gym.models.MANIFEST`; named here so
#: this module need not import the model cache).
_PULL_MANIFEST = "trace_gym_manifest.json"


def weights_hash(folder: str | os.PathLike, *, known: Mapping[str, str] | None = None) -> str:
    """SHA-256 naming a model folder's weights: over ``name:sha256`` of each ``*.safetensors``
    file, sorted by name (hex, 64 characters). Writes nothing into ``folder``.

    Each file's SHA-256 comes from, in order: ``known`` (the caller vouches for it: a
    checkpoint's ``manifest.json`` that was just checked against the files by content);
    the folder's ``trace_gym_manifest.json`` when the size matches (a pulled model); the
    memo in the cache (:func:`memo_path`) when every file's stat key matches; else the bytes.

    Args:
        folder: the model folder.
        known: ``{file name: sha256 hex}`` for files of ``folder`` the caller has verified.

    Raises:
        ValueError: the folder holds no ``*.safetensors`` file.
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(folder)!r}")
    hashes = {f.name: known[f.name] for f in files if known and f.name in known}
    hashes.update(_pulled_hashes(folder, [f for f in files if f.name not in hashes]))
    rest = [f for f in files if f.name not in hashes]
    if rest:
        memo, stamp = memo_path(folder), [_stat_key(f) for f in rest]
        saved = _read_memo(memo)
        kept = saved.get("files") if saved.get("stamp") == stamp else None
        if isinstance(kept, dict) and all(isinstance(kept.get(f.name), str) for f in rest):
            hashes.update({f.name: kept[f.name] for f in rest})
        else:
            started = time.time_ns()
            fresh = {f.name: sha256_file(f) for f in rest}
            hashes.update(fresh)
            if all(key[5] < started - RACY_SECONDS * 1e9 for key in stamp):  # else an edit could keep the stamp
                _write_memo(memo, {"version": _MEMO_VERSION, "folder": str(folder.resolve()), "stamp": stamp,
                                   "files": fresh})
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.name}:{hashes[f.name]}\n".encode())
    return digest.hexdigest()


def memo_path(folder: str | os.PathLike) -> Path:
    """Where :func:`weights_hash` memoises ``folder``'s file hashes: a file in the trace_gym
    cache (``$TRACE_GYM_CACHE/weights_hashes/``) named by the folder's real path."""
    from trace_gym.models import cache_root  # the cache's one definition

    key = hashlib.blake2b(os.path.realpath(folder).encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    return cache_root() / "weights_hashes" / f"{key}.json"


def _stat_key(file: Path) -> list:
    """What changes when ``file``'s bytes change: ``[name, device, inode, size, mtime_ns, ctime_ns]``."""
    st = file.stat()
    return [file.name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _pulled_hashes(folder: Path, files: list[Path]) -> dict[str, str]:
    """The SHA-256 of ``files`` a pulled model's manifest lists with the same size (read
    bounded; a missing or malformed manifest lists none)."""
    try:
        listed = read_json_file(folder / _PULL_MANIFEST).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    out = {}
    for f in files:
        meta = listed.get(f.name) if isinstance(listed, dict) else None
        if isinstance(meta, dict) and meta.get("size") == f.stat().st_size and isinstance(meta.get("sha256"), str):
            out[f.name] = meta["sha256"]
    return out


def _read_memo(path: Path) -> dict:
    """The memo at ``path``, or ``{}`` when there is none, or it is unreadable, torn or of another version."""
    try:
        memo = read_json_file(path)
    except (OSError, ValueError):
        return {}
    return memo if type(memo) is dict and memo.get("version") == _MEMO_VERSION else {}


def _write_memo(path: Path, memo: dict) -> None:
    """Store ``memo`` atomically; a cache that cannot be written (read-only, not a folder) is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(memo))
    except OSError:
        pass  # the hash is recomputed next time
