"""Which retriever a WikiQA env searches: a spec string (or any Searcher object) -> a shared searcher.

The env talks to retrieval only through :class:`retrieval_index.protocol.Searcher`.
Specs are strings so that an env is picklable and ``gymnasium.make`` kwargs stay plain:

==========================  ==========================================================
spec                        searcher
==========================  ==========================================================
``offline`` (default)       dense (all-MiniLM-L6-v2, FAISS Flat) over the SYNTHETIC
                            world's corpus, built into the cache on first use
``offline:bm25``            pyserini BM25 over the same corpus
``dense:<index dir>``       a ``trace-gym index build`` folder, in process
``bm25:<index dir>``        a ``trace-gym index build --bm25`` folder, in a JVM host
``http://host:port``        a retrieval server (``trace-gym index serve`` or Search-R1's)
==========================  ==========================================================

Searchers are loaded once per process and shared by every env that names the same
spec (a model and an index are too big to load per episode).
"""

from __future__ import annotations

import threading
from typing import Any

from retrieval_index.protocol import Searcher

_shared: dict[tuple, Any] = {}
_lock = threading.Lock()


def resolve_searcher(spec: Any, *, offline_seed: int = 0, offline_scale: float = 1.0) -> Searcher:
    """The searcher for ``spec`` (see the module docstring); objects with ``search`` pass through."""
    if not isinstance(spec, str):
        if callable(getattr(spec, "search", None)):
            return spec
        raise TypeError(f"searcher must be a spec string or an object with search(queries, topk), got {spec!r:.100}")
    key = (spec, offline_seed, offline_scale) if spec.startswith("offline") else (spec,)
    with _lock:
        if key not in _shared:
            _shared[key] = _load(spec, offline_seed, offline_scale)
        return _shared[key]


def _load(spec: str, seed: int, scale: float) -> Searcher:
    if spec in ("offline", "offline:dense", "offline:bm25"):
        from retrieval_index.offline import offline_index

        kind = "bm25" if spec.endswith("bm25") else "dense"
        folder = offline_index(kind, seed, scale)
        spec = f"{kind}:{folder}"
    if spec.startswith(("http://", "https://")):
        from retrieval_index.client import RetrievalClient

        return RetrievalClient(spec)
    kind, _, path = spec.partition(":")
    if kind == "dense" and path:
        from retrieval_index.dense import DenseSearcher

        return DenseSearcher.load(path)
    if kind == "bm25" and path:
        from retrieval_index.bm25 import BM25Searcher

        return BM25Searcher(path)
    raise ValueError(f"unknown searcher spec {spec!r}; expected 'offline', 'offline:bm25', 'dense:<dir>', "
                     "'bm25:<dir>' or an http(s):// url")
