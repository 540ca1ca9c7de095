"""A frozen sentence encoder's embeddings, each computed once: in the process, and on disk.

The :class:`~trace_gym.predictor.EmbeddingPredictor`'s encoder is frozen, so what it
returns for a text never changes; the bench embeds the same recorded texts in every
repetition and arm. Two layers keep that work to once:

* in the process, :func:`shared_encoder`: one encoder per ``(folder, device)`` with an LRU
  of the vectors it returned, keyed by a hash of each text, that every predictor of that
  encoder shares (and the end of each history the encoder reads, :data:`Shared.recent`);
* on disk, an :class:`EmbeddingStore` that a caller switches on around a run
  (:func:`use_store`; ``bench --bank`` does, with ``embedding_cache=true``): it keeps the
  vectors of every encode call under the trace_gym cache
  (``$TRACE_GYM_CACHE/embeddings/<bank checksum>/<encoder>/``), so the next run of the
  same bench reads them instead of running the encoder.

Why the disk keeps whole calls, not single texts: the encoder's vector for a text
depends, in its last bits, on the other texts of the same call (the batch's padded
length and shape choose other kernels; measured on the guessing-game bank's histories:
74 of 97 vectors differ from the same text embedded alone, by up to 1.0e-7). A store keyed
by the text alone would hand a run vectors that a fresh run computes otherwise, and a
bench's numbers would depend on what ran before on the machine. So a call is keyed by
the encoder's identity (a digest of every file of its folder, the torch version, the
device, the CPU threads), the encode arguments and its exact texts in order: a hit is
exactly what the encoder returned for that very call, and a bench with the store prints
the same numbers as one without it.

A file that does not read back whole (cut short, damaged, written by another version)
is computed again and rewritten; files are written to a temporary name and renamed, so
two processes writing the same call never leave half a file. The store holds nothing in
memory, and stops adding files once its folder holds ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import logging
import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

_log = logging.getLogger(__name__)

#: The most bytes one store's folder may hold before it stops adding files (1 GiB).
MAX_STORE_BYTES = 1 << 30
#: The first bytes of a store file: the format, then a digest of the rest.
_MAGIC = b"trace_gym-embeddings-1\n"


@dataclass
class Shared:
    """One frozen encoder of the process and what it has computed.

    Attributes:
        encoder: the loaded ``SentenceTransformer``.
        vectors: text hash -> its vector (float32, shape ``(dim,)``), least recently used first.
        recent: ``(history hash, word pieces, first window)`` -> where the end of the history
            that the encoder reads starts (a character offset), least recently used first.
    """

    encoder: Any
    vectors: OrderedDict = field(default_factory=OrderedDict)
    recent: OrderedDict = field(default_factory=OrderedDict)


#: (encoder folder, device) -> the process's one :class:`Shared` of that encoder.
_ENCODERS: dict[tuple[str, str], Shared] = {}


def shared_encoder(key: tuple[str, str]) -> Shared:
    """The process's one frozen encoder (and its caches) for ``(folder, device)``; each
    predictor trims the shared caches to its own ``cache_size`` after it adds to them."""
    if key not in _ENCODERS:
        from sentence_transformers import SentenceTransformer

        from trace_gym.models import quiet_third_party

        quiet_third_party()
        _ENCODERS[key] = Shared(SentenceTransformer(key[0], device=key[1]))
    return _ENCODERS[key]


def text_key(text: str) -> str:
    """The hash a text's vector is kept under (32 hex digits)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def trim(cache: OrderedDict, size: int) -> None:
    """Drop the least recently used entries of ``cache`` beyond ``size``."""
    while len(cache) > size:
        cache.popitem(last=False)


# ---------------------------------------------------------------------- on disk
_IDENTITIES: dict[tuple[str, str], str] = {}


def encoder_identity(key: tuple[str, str]) -> str:
    """A digest of the encoder ``(folder, device)``: every file of the folder (names and bytes),
    the sentence-transformers and torch versions, the device and the machine (computed once
    per process)."""
    if key not in _IDENTITIES:
        import platform

        import sentence_transformers
        import torch

        from trace_gym.models import _sha256

        folder = Path(key[0])
        h = hashlib.sha256(f"{sentence_transformers.__version__}|{torch.__version__}|{key[1]}|"
                           f"{platform.machine()}".encode())
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            h.update(f"|{path.relative_to(folder).as_posix()}:{_sha256(path)}".encode())
        _IDENTITIES[key] = h.hexdigest()
    return _IDENTITIES[key]


def call_key(identity: str, texts: Sequence[str], options: dict[str, Any]) -> str:
    """The key of one encode call: the encoder's identity, the CPU threads torch computes with,
    the encode ``options`` and every text, in order (64 hex digits)."""
    import torch

    h = hashlib.sha256(f"{identity}|threads={torch.get_num_threads()}|{sorted(options.items())!r}|"
                       f"{len(texts)}".encode())
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little") + data)  # length-prefixed: no two lists collide
    return h.hexdigest()


class EmbeddingStore:
    """Encode calls kept on disk, one file each (see the module docstring).

    Args:
        folder: where the files live (one folder per bank and encoder: :func:`bank_store`).
        max_bytes: the most bytes the folder may hold; beyond it, new calls are not kept.
    """

    def __init__(self, folder: str | os.PathLike, max_bytes: int = MAX_STORE_BYTES):
        self.folder, self.max_bytes = Path(folder), int(max_bytes)
        self.hits = self.misses = self.rejected = 0  # calls read, computed, and files that did not read back
        self._full = False
        self._bytes: int | None = None  # the folder's size, read at the first write

    def encode(self, encoder: Any, key: tuple[str, str], texts: list[str], **options: Any) -> np.ndarray:
        """``encoder.encode(texts, **options)`` (float32, shape ``(len(texts), dim)``), read from
        the folder when this exact call was kept, else computed and kept."""
        name = call_key(encoder_identity(key), texts, options)
        path = self.folder / encoder_identity(key)[:16] / f"{name}.npy"
        got = self._read(path, len(texts))
        if got is not None:
            self.hits += 1
            return got
        self.misses += 1
        vectors = np.asarray(encoder.encode(texts, **options), dtype=np.float32)
        self._write(path, vectors)
        return vectors

    def _read(self, path: Path, rows: int) -> np.ndarray | None:
        """The vectors kept in ``path``, or ``None`` when it is missing or does not read back whole."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head = len(_MAGIC) + 32
        if data[:len(_MAGIC)] != _MAGIC or hashlib.blake2b(data[head:], digest_size=32).digest() != data[len(_MAGIC):head]:
            self.rejected += 1
            return None
        try:
            vectors = np.load(io.BytesIO(data[head:]), allow_pickle=False)
        except (ValueError, OSError, EOFError):
            self.rejected += 1
            return None
        if vectors.dtype != np.float32 or vectors.ndim != 2 or len(vectors) != rows:
            self.rejected += 1
            return None
        return vectors

    def _write(self, path: Path, vectors: np.ndarray) -> None:
        """Keep ``vectors`` in ``path`` (whole or not at all); a folder that is full or cannot be
        written is said once and the run goes on without keeping."""
        if self._full:
            return
        buffer = io.BytesIO()
        np.save(buffer, vectors, allow_pickle=False)
        data = buffer.getvalue()
        data = _MAGIC + hashlib.blake2b(data, digest_size=32).digest() + data
        temporary = None
        try:
            if self._bytes is None:
                self._bytes = self.size()
            if self._bytes + len(data) > self.max_bytes:
                self._full = True
                _log.warning("embedding cache %s holds over %d bytes: new embeddings are not kept (delete the "
                             "folder to start it afresh)", self.folder, self.max_bytes)
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as tmp:
                temporary = tmp.name
                tmp.write(data)
            os.replace(temporary, path)  # atomic: a reader sees the old file or the whole new one
            self._bytes += len(data)
        except OSError as exc:
            self._full = True
            _log.warning("embedding cache %s cannot be written (%s): embeddings are not kept", self.folder, exc)
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)

    def size(self) -> int:
        """Bytes the folder's files hold."""
        return sum(p.stat().st_size for p in self.folder.rglob("*.npy") if p.is_file())


_STORE: contextvars.ContextVar[EmbeddingStore | None] = contextvars.ContextVar("embedding_store", default=None)


@contextlib.contextmanager
def use_store(store: EmbeddingStore | None) -> Iterator[EmbeddingStore | None]:
    """Encode calls made inside the block go through ``store`` (``None``: straight to the encoder)."""
    token = _STORE.set(store)
    try:
        yield store
    finally:
        _STORE.reset(token)


def bank_store(sha256: str) -> EmbeddingStore:
    """The store of the bank whose checksum is ``sha256``: ``<cache root>/embeddings/<sha256[:16]>``
    (:func:`trace_gym.models.cache_root`), never beside or inside the bank."""
    from trace_gym.models import cache_root

    return EmbeddingStore(cache_root() / "embeddings" / sha256[:16])


def encode(encoder: Any, key: tuple[str, str], texts: list[str], **options: Any) -> np.ndarray:
    """``encoder.encode(texts, **options)`` as float32, through the store in use (:func:`use_store`)."""
    store = _STORE.get()
    if store is None:
        return np.asarray(encoder.encode(texts, **options), dtype=np.float32)
    return store.encode(encoder, key, texts, **options)
