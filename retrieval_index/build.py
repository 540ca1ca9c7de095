"""``trace-gym index build``: corpus -> embedding shards on disk -> FAISS index + manifest.

The build streams the corpus shard by shard (``shard_size`` passages), encodes each
shard and writes its embeddings atomically (``embeddings/shard_NNNNN.npy``, written as
``partial_NNNNN.npy`` and renamed), so:

* memory is bounded by one shard (plus the index itself), never by the corpus;
* a killed build resumes: finished shards are found on disk and not re-encoded, and
  the resumed build produces the same bytes as an uninterrupted one (each shard is
  encoded on its own, in a fixed order);
* the embeddings stay on disk, so another index type over the same corpus and model is
  built without encoding again (``--drop-embeddings`` deletes them at the end).

``embeddings/state.json`` pins what the shards were made with (model, rule, corpus
checksum, shard size); a build into a folder made with anything else stops with an
error naming the difference instead of mixing shards (``overwrite=True`` starts over).

The output folder::

    manifest.json        model, pooling, prefixes, dims, count, corpus checksum, index type
    index.faiss          the FAISS index (row i = line i of the corpus)
    corpus_offsets.npy   byte offset of every passage (random access without loading it)
    embeddings/          state.json + shard_00000.npy ...
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from retrieval_index.corpus import Corpus
from retrieval_index.faiss_index import build_from_shards, factory_string

MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
OFFSETS_FILE = "corpus_offsets.npy"
FORMAT = "trace_gym.retrieval.dense/1"


def shard_path(out_dir: Path, i: int) -> Path:
    return out_dir / "embeddings" / f"shard_{i:05d}.npy"


def build_dense_index(corpus: str | os.PathLike, out_dir: str | os.PathLike, *, model: str = "all-MiniLM-L6-v2",
                      index_type: str = "Flat", fp16: bool = False, shard_size: int = 4096, batch_size: int = 64,
                      device: str | None = None, train_size: int = 100_000, overwrite: bool = False,
                      drop_embeddings: bool = False, allow_download: bool = False, progress: bool = True,
                      encoder: Any = None) -> dict[str, Any]:
    """Build (or resume building) a dense index of a wiki-18 style JSONL corpus.

    Args:
        corpus: the JSONL file (``{"id", "contents"}`` per line).
        out_dir: the output folder (created; reused to resume).
        model: encoder name for :func:`retrieval_index.encoders.resolve_model`.
        index_type: ``Flat``, ``HNSW``, ``IVF-PQ`` or a FAISS factory string.
        fp16: fp16 vector storage (see :mod:`retrieval_index.faiss_index`).
        shard_size: passages per embedding shard (the memory bound of encoding).
        batch_size: passages per forward pass.
        device: encoder device (default: cuda when available).
        train_size: training sample of IVF/PQ indexes.
        overwrite: delete whatever ``out_dir`` holds and start over.
        drop_embeddings: delete the shards once the index is written.
        allow_download: let the encoder be fetched from the hub when not cached.
        progress: show a progress bar on stderr.
        encoder: an already-loaded :class:`~retrieval_index.encoders.Encoder` (else one is made).

    Returns:
        The manifest dict, plus ``build``: ``shards_total``, ``shards_reused``,
        ``shards_encoded``, ``encode_seconds``, ``passages_per_second``.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out = Path(out_dir)
    if overwrite and out.exists():
        shutil.rmtree(out)
    (out / "embeddings").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    docs = Corpus(corpus, offsets_cache=out / OFFSETS_FILE)
    count = len(docs)
    if count == 0:
        raise ValueError(f"corpus {str(corpus)!r} holds no passages")
    if encoder is None:
        from retrieval_index.encoders import Encoder

        encoder = Encoder(model, device=device, batch_size=batch_size, allow_download=allow_download)
    described = encoder.describe()
    state = {"corpus_sha256": docs.stats.sha256, "count": count, "shard_size": shard_size,
             **{k: described[k] for k in ("model", "dims", "query_prefix", "passage_prefix", "pooling",
                                          "normalize", "max_length")}}
    _check_state(out, state)
    n_shards = (count + shard_size - 1) // shard_size
    done = {i for i in range(n_shards) if _shard_ok(shard_path(out, i), _rows(i, shard_size, count), encoder.dim)}
    for stale in (out / "embeddings").glob("partial_*.npy"):
        stale.unlink()  # a shard being written when the last build was killed

    bar = _bar(count, "encode", progress)
    bar.update(sum(_rows(i, shard_size, count) for i in done))
    try:
        todo = [i for i in range(n_shards) if i not in done]
        encode_seconds, encoded = _encode_shards(docs, encoder, out, todo, shard_size, count, bar)
    finally:
        bar.close()
        docs.close()

    factory = _write_faiss_index(out, index_type, encoder.dim, count, fp16, n_shards, train_size, progress)
    manifest = _manifest(described, count, docs.stats.to_dict(), index_type, factory, fp16, shard_size)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if drop_embeddings:
        shutil.rmtree(out / "embeddings")
    manifest["build"] = {
        "shards_total": n_shards, "shards_reused": len(done), "shards_encoded": n_shards - len(done),
        "encode_seconds": encode_seconds, "passages_per_second": encoded / encode_seconds if encoded else None,
        "seconds": time.perf_counter() - started,
    }
    return manifest


def _encode_shards(docs: Corpus, encoder: Any, out: Path, todo: list[int], shard_size: int, count: int,
                   bar: Any) -> tuple[float, int]:
    """Encode the shards ``todo`` of ``docs`` and write each atomically. Returns the seconds
    spent encoding and the passages encoded."""
    encode_seconds, encoded = 0.0, 0
    for i in todo:
        start, stop = i * shard_size, min(count, (i + 1) * shard_size)
        texts = [contents for _, contents in docs.rows(start, stop)]
        t0 = time.perf_counter()
        vectors = encoder.encode_passages(texts, progress=bar.update)
        encode_seconds += time.perf_counter() - t0
        encoded += len(texts)
        tmp = out / "embeddings" / f"partial_{i:05d}.npy"
        np.save(tmp, vectors)
        os.replace(tmp, shard_path(out, i))  # a shard exists whole or not at all
    return encode_seconds, encoded


def _write_faiss_index(out: Path, index_type: str, dim: int, count: int, fp16: bool, n_shards: int,
                       train_size: int, progress: bool) -> str:
    """Build the FAISS index from the ``n_shards`` shards on disk and write it atomically
    to ``out/index.faiss``. Returns its factory string."""
    factory = factory_string(index_type, dim, count, fp16)
    loaders = [lambda i=i: np.load(shard_path(out, i)) for i in range(n_shards)]
    bar = _bar(count, f"index {factory}", progress)
    index = build_from_shards(factory, dim, count, loaders, train_size=train_size, progress=bar.update)
    bar.close()
    import faiss

    tmp = out / (INDEX_FILE + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out / INDEX_FILE)
    return factory


def _manifest(described: dict[str, Any], count: int, corpus_stats: dict[str, Any], index_type: str,
              factory: str, fp16: bool, shard_size: int) -> dict[str, Any]:
    """The manifest of a built index (``described``: the encoder's own description)."""
    return {
        "format": FORMAT,
        **described,
        "count": count,
        "corpus": corpus_stats,
        "index": {"file": INDEX_FILE, "type": index_type, "factory": factory, "metric": "inner_product",
                  "fp16": fp16},
        "shard_size": shard_size,
        "embedding_dtype": "float32",
    }


def load_manifest(index_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a built index folder (a clear error when there is none)."""
    path = Path(index_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{str(index_dir)!r} has no {MANIFEST}: not a finished `trace-gym index build` output")
    return json.loads(path.read_text())


def _rows(i: int, shard_size: int, count: int) -> int:
    return min(shard_size, count - i * shard_size)


def _shard_ok(path: Path, rows: int, dim: int) -> bool:
    if not path.exists():
        return False
    try:
        arr = np.load(path, mmap_mode="r")
    except (ValueError, OSError):
        return False
    return arr.shape == (rows, dim) and arr.dtype == np.float32


def _check_state(out: Path, state: dict[str, Any]) -> None:
    path = out / "embeddings" / "state.json"
    if path.exists():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), v) for k, v in state.items() if old.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: {a!r} on disk vs {b!r} now" for k, (a, b) in sorted(diff.items()))
            raise ValueError(f"{out} holds embeddings made differently ({detail}); "
                             "pass overwrite=True (--overwrite) or another folder")
    else:
        path.write_text(json.dumps(state, indent=2))


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="passage", disable=not enabled, file=sys.stderr, dynamic_ncols=True)


