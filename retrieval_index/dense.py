"""The in-process dense searcher: encoder + FAISS index + corpus, behind the Searcher Protocol.

Two ways to open one:

* :meth:`DenseSearcher.load` a folder made by ``trace-gym index build`` (its manifest
  names the model, rule and corpus);
* :meth:`DenseSearcher.from_files` published artifacts as they are, with no rebuild:
  Search-R1's ``e5_Flat.index`` + ``wiki-18.jsonl`` (+ ``intfloat/e5-base-v2``). Row i
  of the index is line i of the corpus; the index dimension must match the encoder's
  and the row count the corpus's, or it stops with an error naming both numbers.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from retrieval_index.build import OFFSETS_FILE, load_manifest
from retrieval_index.corpus import Corpus
from retrieval_index.faiss_index import gpu_count, set_search_params, to_search_device
from retrieval_index.protocol import Hit, check_queries, check_topk


class DenseSearcher:
    """Top-k inner-product search of encoded queries over a FAISS index.

    Thread-safe: the encoder serialises its forward passes, FAISS search is read-only,
    and passages are read with ``pread``.

    Args:
        index: a FAISS index (row i = corpus row i).
        corpus: the :class:`Corpus` the index was built from.
        encoder: a :class:`~retrieval_index.encoders.Encoder` with the index's rule.
        manifest: what :meth:`info` reports.
        nprobe, ef_search: IVF / HNSW search breadth.
        use_gpu: ``"auto"``, ``True`` or ``False`` (see ``faiss_index.to_search_device``).
        fp16: fp16 vectors on the GPU.
    """

    def __init__(self, index: Any, corpus: Corpus, encoder: Any, *, manifest: dict | None = None,
                 nprobe: int | None = 64, ef_search: int | None = 128, use_gpu: str | bool = "auto",
                 fp16: bool = False):
        if index.d != encoder.dim:
            raise ValueError(f"index dimension {index.d} != encoder {encoder.name!r} dimension {encoder.dim}")
        if index.ntotal != len(corpus):
            raise ValueError(f"index holds {index.ntotal} vectors but corpus {corpus.path!r} has {len(corpus)} passages")
        set_search_params(index, nprobe=nprobe, ef_search=ef_search)
        self.index, self.device = to_search_device(index, use_gpu, fp16)
        self.corpus = corpus
        self.encoder = encoder
        self.manifest = dict(manifest or {})
        self._search_lock = threading.Lock() if self.device != "cpu" else None

    @classmethod
    def load(cls, index_dir: str | os.PathLike, *, device: str | None = None, encoder: Any = None,
             **kwargs: Any) -> "DenseSearcher":
        """Open a ``trace-gym index build`` folder."""
        import faiss

        from retrieval_index.encoders import Encoder, EncoderRule

        manifest = load_manifest(index_dir)
        if "kind" in manifest and manifest["kind"] != "dense":
            raise ValueError(f"{str(index_dir)!r} is a {manifest['kind']!r} index, not a dense one")
        if encoder is None:
            rule = EncoderRule(manifest["query_prefix"], manifest["passage_prefix"], manifest["pooling"],
                               manifest["normalize"], manifest["max_length"])
            encoder = Encoder(manifest["model"], rule=rule, device=device)
        index = faiss.read_index(str(Path(index_dir) / manifest["index"]["file"]))
        corpus = Corpus(manifest["corpus"]["path"], offsets_cache=Path(index_dir) / OFFSETS_FILE)
        if corpus.stats.sha256 != manifest["corpus"]["sha256"]:
            raise ValueError(f"corpus {corpus.path!r} changed since the index was built (checksum differs)")
        return cls(index, corpus, encoder, manifest=manifest, fp16=manifest["index"].get("fp16", False), **kwargs)

    @classmethod
    def from_files(cls, index_file: str | os.PathLike, corpus_file: str | os.PathLike,
                   model: str = "intfloat/e5-base-v2", *, device: str | None = None,
                   offsets_cache: str | os.PathLike | None = None, allow_download: bool = False,
                   **kwargs: Any) -> "DenseSearcher":
        """Serve published artifacts as they are (e.g. Search-R1's ``e5_Flat.index`` + ``wiki-18.jsonl``).

        Args:
            index_file: a FAISS index written with ``faiss.write_index``.
            corpus_file: the JSONL corpus whose line i is index row i.
            model: the encoder that made the index (its rule comes from the table).
            offsets_cache: where to keep the corpus offsets table between starts.
        """
        import faiss

        from retrieval_index.encoders import Encoder

        if not Path(index_file).is_file():
            raise FileNotFoundError(f"FAISS index file {str(index_file)!r} does not exist")
        encoder = Encoder(model, device=device, allow_download=allow_download)
        index = faiss.read_index(str(index_file))
        corpus = Corpus(corpus_file, offsets_cache=offsets_cache)
        manifest = {"format": "published", **encoder.describe(), "count": int(index.ntotal),
                    "corpus": corpus.stats.to_dict(),
                    "index": {"file": str(Path(index_file).resolve()), "type": type(index).__name__,
                              "metric": "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2"}}
        return cls(index, corpus, encoder, manifest=manifest, **kwargs)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """One list of at most ``topk`` hits per query, best first (inner-product scores)."""
        queries = check_queries(queries)
        topk = check_topk(topk)
        if not queries:
            return []
        scores, rows = self.search_rows(queries, topk)
        return [[self.corpus.hit(int(r), float(s)) for s, r in zip(srow, rrow) if r >= 0]
                for srow, rrow in zip(scores, rows)]

    def search_rows(self, queries: Sequence[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)``, each ``(len(queries), min(topk, N))``; row -1 where FAISS found fewer."""
        vectors = self.encoder.encode_queries(list(queries))
        k = min(topk, self.index.ntotal)
        if self._search_lock is None:
            return self.index.search(vectors, k)
        with self._search_lock:  # one GPU stream
            return self.index.search(vectors, k)

    def info(self) -> dict[str, Any]:
        """The manifest plus where the index runs."""
        return {**self.manifest, "kind": "dense", "device": self.device, "gpus": gpu_count()}

    def close(self) -> None:
        self.corpus.close()


__all__ = ["DenseSearcher"]
