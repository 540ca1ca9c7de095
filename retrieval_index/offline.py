"""The offline default: the SYNTHETIC world's corpus, questions and indexes, built once and cached.

Everything lives under ``$TRACE_GYM_CACHE/retrieval/<world name>/`` (``TRACE_GYM_CACHE``
defaults to ``~/.cache/trace_gym``, the project's cache convention)::

    synthetic_world_v2_seed0_scale1.jsonl             the corpus (20,940 passages)
    synthetic_world_v2_seed0_scale1.questions.jsonl   the two-hop questions (2,000)
    synthetic_world_v2_seed0_scale1.single_hop.jsonl  single-hop questions (750; an easy mix)
    dense/                                         all-MiniLM-L6-v2 Flat index (``index build`` output)
    bm25/                                          Lucene BM25 index

The first call builds what is missing (the dense build encodes the corpus, minutes on
a small CPU, and resumes if interrupted); later calls only check the manifests. A file
lock keeps two processes from building the same world at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any, Iterator

from retrieval_index.encoders import DEFAULT_MODEL
from retrieval_index.synthetic import read_questions, single_hop_path, world_name, write_world

KINDS = ("dense", "bm25")


def cache_root() -> Path:
    """``$TRACE_GYM_CACHE/retrieval`` (default ``~/.cache/trace_gym/retrieval``)."""
    env = os.environ.get("TRACE_GYM_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "trace_gym") / "retrieval"


def world_dir(seed: int = 0, scale: float = 1.0, root: str | os.PathLike | None = None) -> Path:
    return Path(root) if root is not None else cache_root() / world_name(seed, scale)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def offline_files(seed: int = 0, scale: float = 1.0, root: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """``(corpus, questions)`` JSONL paths of the synthetic world, written if missing."""
    folder = world_dir(seed, scale, root)
    with _locked(folder):
        return write_world(folder, seed, scale)


def offline_questions(seed: int = 0, scale: float = 1.0, root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The synthetic world's questions (FlashRAG fields plus ``metadata``)."""
    return read_questions(offline_files(seed, scale, root)[1])


def offline_single_hop_questions(seed: int = 0, scale: float = 1.0,
                                 root: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The world's single-hop questions (an easy mix for tiny models; not part of the two-hop set)."""
    return read_questions(single_hop_path(offline_files(seed, scale, root)[1]))


def offline_index(kind: str = "dense", seed: int = 0, scale: float = 1.0, *, model: str = DEFAULT_MODEL,
                  root: str | os.PathLike | None = None, progress: bool = True, **build_kwargs: Any) -> Path:
    """The folder of the synthetic world's ``kind`` index, built (or resumed) if missing.

    Args:
        kind: ``dense`` (FAISS Flat over ``model`` embeddings) or ``bm25``.
        seed, scale: which world (see :func:`retrieval_index.synthetic.generate_world`).
        model: the dense encoder (the folder is ``dense`` for the default, else
            ``dense-<model name>``).
        root: use this folder instead of the cache.
        build_kwargs: passed to the builder (``shard_size``, ``index_type`` ...).
    """
    if kind not in KINDS:
        raise ValueError(f"offline index kind must be one of {KINDS}, got {kind!r}")
    corpus, _ = offline_files(seed, scale, root)
    folder = world_dir(seed, scale, root)
    if kind == "bm25":
        out = folder / "bm25"
        with _locked(folder):
            if not (out / "manifest.json").exists():
                from retrieval_index.bm25 import build_bm25_index

                build_bm25_index(corpus, out, progress=progress, **build_kwargs)
        return out
    out = folder / ("dense" if model == DEFAULT_MODEL else "dense-" + model.replace("/", "--"))
    with _locked(folder):
        if not (out / "manifest.json").exists():
            from retrieval_index.build import build_dense_index

            build_dense_index(corpus, out, model=model, progress=progress, **build_kwargs)
    return out
