"""FAISS index types, construction from embedding shards, and GPU placement (the one FAISS module).

Index types (all inner product; with normalised embeddings that is cosine):

=========  ===================================  ===================================
type       FAISS factory (``fp16=False``)        ``fp16=True``
=========  ===================================  ===================================
Flat       ``Flat`` (exact)                      ``SQfp16`` (exact on fp16 vectors)
HNSW       ``HNSW32`` (graph; ``efSearch``)      ``HNSW32,SQfp16``
IVF-PQ     ``IVF{nlist},PQ{m}`` (``nprobe``)     (PQ codes are already compressed:
                                                 ``fp16`` only affects GPU search)
=========  ===================================  ===================================

Any other string is passed to ``faiss.index_factory`` as is. ``nlist`` defaults to
about ``4 sqrt(N)`` (at most 65536, and at most N / 39 so k-means has data), ``m`` to
the largest divisor of the dimension that is at most ``dim / 4`` and 64, and codes have
8 bits (fewer for corpora under 39 x 256 = 9,984 passages). Trained indexes learn from an evenly
strided sample of at most ``train_size`` vectors, read shard by shard, so memory stays
bounded by the sample, never by the corpus. FAISS's k-means is seeded, so Flat and IVF
builds are reproducible (an HNSW graph built by several OpenMP threads may differ in
detail between builds).

On a machine where the installed FAISS has GPU support (the ``gpu`` extra installs
``faiss-gpu-cu12`` instead of ``faiss-cpu``) and sees a GPU, :func:`to_search_device`
moves the index to every GPU (fp16 storage when asked), as FlashRAG does.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

INDEX_TYPES = ("Flat", "HNSW", "IVF-PQ")


def factory_string(index_type: str, dim: int, count: int, fp16: bool = False) -> str:
    """The ``faiss.index_factory`` string for an :data:`INDEX_TYPES` name (or a raw string)."""
    if dim < 1 or count < 1:
        raise ValueError(f"need dim >= 1 and count >= 1, got dim={dim}, count={count}")
    key = index_type.strip()
    if key.lower() == "flat":
        return "SQfp16" if fp16 else "Flat"
    if key.lower() == "hnsw":
        return "HNSW32,SQfp16" if fp16 else "HNSW32"
    if key.lower() in ("ivf-pq", "ivfpq", "ivf_pq"):
        # FAISS's k-means wants >= 39 training points per centroid: per IVF list, and per
        # entry of each PQ codebook (2**nbits entries); under that, training crawls
        nlist = max(1, min(65536, int(4 * math.sqrt(count)), count // 39))
        nbits = max(1, min(8, int(math.log2(max(2, count // 39)))))
        return f"IVF{nlist},PQ{pq_subquantizers(dim)}" + ("" if nbits == 8 else f"x{nbits}")
    if not key:
        raise ValueError(f"index_type must be one of {INDEX_TYPES} or a FAISS factory string, got {index_type!r}")
    return key  # a FAISS factory string, used as given


def pq_subquantizers(dim: int) -> int:
    """The largest divisor of ``dim`` that is <= min(64, dim // 4) (at least 1)."""
    cap = max(1, min(64, dim // 4))
    return max(m for m in range(1, cap + 1) if dim % m == 0)


def build_from_shards(factory: str, dim: int, count: int, shards: Sequence[Callable[[], np.ndarray]], *,
                      train_size: int = 100_000, progress: Callable[[int], None] | None = None) -> Any:
    """Build a FAISS index from embedding shards, loading one shard at a time.

    Args:
        factory: a ``faiss.index_factory`` string (see :func:`factory_string`).
        dim: embedding dimension.
        count: total number of vectors (for the training sample).
        shards: zero-argument loaders, in row order, each returning ``(rows, dim)`` float32.
        train_size: vectors sampled (evenly strided) to train IVF/PQ/SQ indexes.
        progress: called with the number of vectors added after each shard.
    """
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(_training_sample(shards, count, train_size))
    for load in shards:
        vectors = np.ascontiguousarray(load(), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != dim:
            raise ValueError(f"embedding shard has shape {vectors.shape}, expected (rows, {dim})")
        index.add(vectors)
        if progress:
            progress(len(vectors))
    if index.ntotal != count:
        raise ValueError(f"index holds {index.ntotal} vectors, the corpus has {count} passages")
    return index


def _training_sample(shards: Sequence[Callable[[], np.ndarray]], count: int, train_size: int) -> np.ndarray:
    step = max(1, count // max(1, train_size))
    picked, offset = [], 0
    for load in shards:
        block = load()
        first = (-offset) % step  # the first global row in this shard that is a multiple of step
        picked.append(np.asarray(block[first::step], dtype=np.float32))
        offset += len(block)
    return np.ascontiguousarray(np.concatenate(picked)[:train_size])


def set_search_params(index: Any, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """Set ``nprobe`` (IVF) / ``efSearch`` (HNSW) where the index has them."""
    import faiss

    if nprobe is not None:
        try:
            faiss.extract_index_ivf(index).nprobe = int(nprobe)
        except RuntimeError:
            pass  # not an IVF index
    if ef_search is not None:
        hnsw = getattr(faiss.downcast_index(index), "hnsw", None)
        if hnsw is not None:
            hnsw.efSearch = int(ef_search)


def gpu_count() -> int:
    """GPUs visible to the installed FAISS (0 for faiss-cpu)."""
    import faiss

    return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0


def to_search_device(index: Any, use_gpu: str | bool = "auto", fp16: bool = False) -> tuple[Any, str]:
    """``(index, device)``: the index on all GPUs when asked/available, else unchanged on CPU.

    Args:
        use_gpu: ``"auto"`` (GPU when FAISS sees one), ``True`` (required) or ``False``.
        fp16: store vectors in fp16 on the GPU (``useFloat16``).
    """
    n = gpu_count()
    if use_gpu is True and n == 0:
        raise RuntimeError("use_gpu=True, but FAISS sees no GPU (is faiss-gpu installed? see the 'gpu' extra)")
    if use_gpu is False or n == 0:
        return index, "cpu"
    import faiss

    options = faiss.GpuMultipleClonerOptions()
    options.useFloat16 = bool(fp16)
    options.shard = True
    return faiss.index_cpu_to_all_gpus(index, co=options), f"gpu x{n}"

