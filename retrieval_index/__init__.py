"""Retrieval for the QA environments: corpus -> dense (FAISS) / BM25 (pyserini) index -> server.

Imports nothing of the rest of the project; heavy backends (torch, FAISS, pyserini, the
HTTP stack) load lazily inside their modules. The seam is :class:`~retrieval_index.protocol.Searcher`.
See ``docs/retrieval.md``.
"""

from retrieval_index.protocol import Hit, Searcher

__all__ = ["Hit", "Searcher"]
