"""QA task loaders in the FlashRAG format, and the offline SYNTHETIC question set.

FlashRAG rows: ``{"id", "question", "golden_answers": [str, ...], "metadata": {...}}``.
``golden_answers`` holds every accepted alias (a lone string is read as one alias).

==========  ===========================  =================  =====  ========================
name        hub id                       config             split  content
==========  ===========================  =================  =====  ========================
hotpotqa    RUC-NLPIR/FlashRAG_datasets  hotpotqa           dev    multi-hop (2 hops)
2wiki       RUC-NLPIR/FlashRAG_datasets  2wikimultihopqa    dev    multi-hop (2-4 hops)
musique     RUC-NLPIR/FlashRAG_datasets  musique            dev    multi-hop (2-4 hops)
bamboogle   RUC-NLPIR/FlashRAG_datasets  bamboogle          test   multi-hop (2 hops)
nq          RUC-NLPIR/FlashRAG_datasets  nq                 test   single-hop
triviaqa    RUC-NLPIR/FlashRAG_datasets  triviaqa           test   single-hop
popqa       RUC-NLPIR/FlashRAG_datasets  popqa              test   single-hop
synthetic   (offline, generated)         -                  -      two-hop, SYNTHETIC world
==========  ===========================  =================  =====  ========================

These are the evaluation splits Search-R1 reports. ``load_tasks(name)`` reads the hub
copy through the ``datasets`` package (imported only then; it is not a dependency, and
nothing here downloads unless asked to). ``load_tasks(name, path=...)`` reads a local
``.jsonl`` / ``.json`` / ``.parquet`` file in the FlashRAG schema, or a FlashRAG
dataset folder holding ``{split}.jsonl``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from trace_gym.utils.textsafe import clean_text, clean_value
from trace_gym.env.datafiles import jsonable, load_rows
from trace_gym.types import Task


@dataclass(frozen=True)
class QADataset:
    """Where a FlashRAG dataset lives."""

    hub_id: str
    config: str
    split: str
    multi_hop: bool


FLASHRAG_HUB = "RUC-NLPIR/FlashRAG_datasets"
DATASETS: dict[str, QADataset] = {
    "hotpotqa": QADataset(FLASHRAG_HUB, "hotpotqa", "dev", True),
    "2wiki": QADataset(FLASHRAG_HUB, "2wikimultihopqa", "dev", True),
    "musique": QADataset(FLASHRAG_HUB, "musique", "dev", True),
    "bamboogle": QADataset(FLASHRAG_HUB, "bamboogle", "test", True),
    "nq": QADataset(FLASHRAG_HUB, "nq", "test", False),
    "triviaqa": QADataset(FLASHRAG_HUB, "triviaqa", "test", False),
    "popqa": QADataset(FLASHRAG_HUB, "popqa", "test", False),
}
ALIASES = {"hotpot": "hotpotqa", "hotpot_qa": "hotpotqa", "2wikimultihopqa": "2wiki", "2wikimqa": "2wiki",
           "2wikimultihop": "2wiki", "trivia_qa": "triviaqa", "natural_questions": "nq", "offline": "synthetic"}
MULTI_HOP = tuple(name for name, spec in DATASETS.items() if spec.multi_hop)


def canonical_name(name: str) -> str:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in DATASETS and key != "synthetic":
        raise ValueError(f"unknown QA dataset {name!r}; expected one of {sorted([*DATASETS, 'synthetic'])}")
    return key


def row_to_task(row: Mapping[str, Any], source: str, index: int = 0) -> Task:
    """One FlashRAG row as a :class:`Task` (``answer`` = the list of gold aliases)."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{source} row {index} must be a JSON object, got {type(row).__name__}")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{source} row {index} needs a non-empty 'question' string, got {question!r:.80}")
    golds = row.get("golden_answers", row.get("answer"))
    if isinstance(golds, str):
        golds = [golds]
    elif hasattr(golds, "tolist"):  # numpy arrays from parquet
        golds = golds.tolist()
    if not isinstance(golds, list) or not golds or not all(isinstance(g, (str, int, float)) for g in golds):
        raise ValueError(f"{source} row {index} needs 'golden_answers', a non-empty list of strings, got {golds!r:.80}")
    ident = row.get("id", index)
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        metadata = {"metadata": metadata}
    metadata = {clean_value(k): clean_value(jsonable(v)) for k, v in metadata.items() if jsonable(v) is not None}
    task_id = clean_text(str(ident) if str(ident).startswith(f"{source}/") else f"{source}/{ident}")
    # text that cannot be encoded (a lone surrogate escape in the file) is written as \udXXX
    return Task(id=task_id, prompt=clean_text(question.strip()), answer=[clean_text(str(g)) for g in golds],
                source=source, metadata=metadata)


def rows_to_tasks(name: str, rows: Iterable[Mapping[str, Any]]) -> list[Task]:
    return [row_to_task(row, name, i) for i, row in enumerate(rows)]


def load_tasks(name: str, path: str | None = None, split: str | None = None, limit: int | None = None,
               **synthetic_kwargs: Any) -> list[Task]:
    """Tasks of QA dataset ``name`` from the hub or from ``path`` (see the module docstring).

    Args:
        name: a key of :data:`DATASETS` (or an alias), or ``synthetic``.
        path: a local file or FlashRAG folder; ``None`` loads from the hub.
        split: the split (default: the dataset's evaluation split).
        limit: keep the first ``limit`` tasks.
        synthetic_kwargs: for ``synthetic``: ``world_seed``, ``scale``.
    """
    key = canonical_name(name)
    if key == "synthetic":
        tasks = offline_tasks(seed=None, **synthetic_kwargs)
        return tasks[:limit] if limit is not None else tasks
    spec = DATASETS[key]
    split = split or spec.split
    rows = load_rows(key, path, split, spec.hub_id, spec.config, limit,
                     local_hint="FlashRAG rows with 'question' and 'golden_answers'")
    return rows_to_tasks(key, rows)


def offline_tasks(n: int | None = None, seed: int | None = 0, *, world_seed: int = 0, scale: float = 1.0,
                  types: Iterable[str] | None = None, single_hop_share: float = 0.0) -> list[Task]:
    """Questions of the SYNTHETIC offline world (see :mod:`retrieval_index.synthetic`).

    Args:
        n: how many (``None``: all, in generation order).
        seed: draws the ``n`` questions without replacement (``None``: the first ``n``).
        world_seed, scale: which world (must match the env's ``offline_seed`` / ``offline_scale``).
        types: keep only these question types.
        single_hop_share: the fraction of the ``n`` questions taken from the world's
            single-hop set (an easy mix, like the math family's digit sums, so a tiny
            policy succeeds sometimes); the two kinds alternate in the result.
    """
    from retrieval_index.offline import offline_questions, offline_single_hop_questions

    if not 0.0 <= single_hop_share <= 1.0:
        raise ValueError(f"single_hop_share must lie in [0, 1], got {single_hop_share!r}")
    pools = [offline_questions(world_seed, scale)]
    if single_hop_share > 0:
        pools.append(offline_single_hop_questions(world_seed, scale))
    if types is not None:
        wanted = set(types)
        pools = [[r for r in rows if r["metadata"]["type"] in wanted] for rows in pools]
    if n is None:
        rows = [r for rows in pools for r in rows]
    else:
        wanted_single = int(round(n * single_hop_share)) if single_hop_share > 0 else 0
        counts = [n - wanted_single] + ([wanted_single] if single_hop_share > 0 else [])
        picked = []
        for k, (rows, count) in enumerate(zip(pools, counts)):
            if count > len(rows):
                raise ValueError(f"asked for {count} offline questions, the world (scale {scale:g}) has {len(rows)}")
            order = range(count) if seed is None else np.random.default_rng([seed, k]).choice(len(rows), count,
                                                                                            replace=False)
            picked.append([rows[int(i)] for i in order])
        rows = [r for group in itertools.zip_longest(*picked) for r in group if r is not None]
    return [row_to_task(r, "synthetic", i) for i, r in enumerate(rows)]
