"""A frozen sentence encoder's embeddings, each computed once: in the process, and on disk.

The :class:`~trace_gym.predictor.kinds.EmbeddingPredictor`'s encoder is frozen, so what it
returns for a text never changes; the bench embeds the same recorded texts in every
repetition and arm. Two layers keep that work to once:

* in the process, :func:`shared_encoder`: one encoder per ``(folder, device)`` with an LRU
  of the vectors it returned, keyed by a hash of each text, that every predictor of that
  encoder shares (and where the end of each history that the encoder reads starts,
  :func:`recent_history`);
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
memory, and stops adding files once the folder it is bounded by holds ``max_bytes`` (1 GiB
for every bank's store together).
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


def clear_caches() -> None:
    """Forget every vector and history end this process computed (the encoders stay loaded):
    what a fresh process starts from."""
    for shared in _ENCODERS.values():
        shared.vectors.clear()
        shared.recent.clear()


def text_key(text: str) -> str:
    """The hash a text's vector is kept under (32 hex digits)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def trim(cache: OrderedDict, size: int) -> None:
    """Drop the least recently used entries of ``cache`` beyond ``size``."""
    while len(cache) > size:
        cache.popitem(last=False)


def recent_history(shared: Shared, histories: Sequence[str], pieces: int, first_window: int,
                   cache_size: int) -> list[str]:
    """The end of each history that ``shared``'s encoder reads in full: unchanged when it has at
    most ``pieces`` word pieces, else from the first word start among its last ``pieces``
    (:meth:`trace_gym.predictor.kinds.EmbeddingPredictor.recent_history` says why that is exact).
    ``first_window``: characters of a history's end tokenised first (x4 until they hold the
    pieces). Where each end starts is kept in ``shared.recent`` (at most ``cache_size``), so a
    history is tokenised once per process."""
    out, recent = list(histories), shared.recent
    keys = {i: (text_key(h), pieces, first_window) for i, h in enumerate(out) if h}
    todo = []
    for i, key in keys.items():
        if key in recent:
            recent.move_to_end(key)
            out[i] = out[i][recent[key]:]
        else:
            todo.append(i)
    _cut_histories(shared.encoder.tokenizer, out, todo, pieces, first_window)
    for i in todo:
        recent[keys[i]] = len(histories[i]) - len(out[i])
    trim(recent, cache_size)
    return out


def _cut_histories(tokenizer: Any, out: list[str], todo: Sequence[int], pieces: int, first_window: int) -> None:
    """:func:`recent_history` of ``out[i]`` for each ``i`` of ``todo``, in place."""
    window = {i: first_window for i in todo}
    while window:  # one batched tokenizer call per round; most finish in the first
        rows = list(window)
        texts = [out[i][-window[i]:] for i in rows]
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, truncation=False,
                        verbose=False)
        for b, i in enumerate(rows):
            history, text = out[i], texts[b]
            words, offsets = enc.word_ids(b), enc["offset_mapping"][b]
            whole, n = len(text) == len(history), len(words)
            if whole and n <= pieces:
                del window[i]  # it fits: unchanged
                continue
            # the window may cut its first word, so only the pieces after that word are the history's own
            first_exact = 0 if whole else next((j for j in range(n) if words[j] != words[0]), n)
            if n - first_exact < pieces:
                window[i] *= 4
                continue
            start = n - pieces
            while start < n and words[start] == words[start - 1]:
                start += 1  # to the next word start
            cut = len(history) - len(text)
            out[i] = history[cut + offsets[start][0]:] if start < n else _cut_inside_word(
                tokenizer, history, cut, offsets, n, pieces)
            del window[i]


def _cut_inside_word(tokenizer: Any, history: str, cut: int, offsets: Any, n: int, pieces: int) -> str:
    """The tail of a word longer than the limit, from the earliest piece that re-tokenises within it."""
    for j in range(n - pieces, n):
        tail = history[cut + offsets[j][0]:]
        if len(tokenizer(tail, add_special_tokens=False, verbose=False)["input_ids"]) <= pieces:
            return tail
    return history[cut + offsets[n - 1][0]:]


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
        max_bytes: the most bytes ``bounded`` may hold; beyond it, new calls are not kept.
        bounded: the folder whose size ``max_bytes`` bounds (default ``folder``; the bank stores
            share one bound: every bank's folder together).

    Attributes:
        hits, misses: encode calls read from the folder, and computed.
        rejected: files that did not read back whole (computed again).
    """

    def __init__(self, folder: str | os.PathLike, max_bytes: int = MAX_STORE_BYTES,
                 bounded: str | os.PathLike | None = None):
        self.folder, self.max_bytes = Path(folder), int(max_bytes)
        self.bounded = Path(bounded) if bounded is not None else self.folder
        self.hits = self.misses = self.rejected = 0
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
                             "folder to start it afresh)", self.bounded, self.max_bytes)
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
        """Bytes the kept files under :attr:`bounded` hold."""
        return sum(p.stat().st_size for p in self.bounded.rglob("*.npy") if p.is_file())

    def summary(self) -> dict[str, Any]:
        """``{"folder", "calls_read", "calls_computed", "files_rejected"}`` (for a run's results)."""
        return {"folder": str(self.folder), "calls_read": self.hits, "calls_computed": self.misses,
                "files_rejected": self.rejected}


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

    root = cache_root() / "embeddings"
    return EmbeddingStore(root / sha256[:16], bounded=root)


def encode(encoder: Any, key: tuple[str, str], texts: list[str], **options: Any) -> np.ndarray:
    """``encoder.encode(texts, **options)`` as float32, through the store in use (:func:`use_store`)."""
    store = _STORE.get()
    if store is None:
        return np.asarray(encoder.encode(texts, **options), dtype=np.float32)
    return store.encode(encoder, key, texts, **options)
