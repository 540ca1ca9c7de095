"""Task loaders by name: the paper's training and evaluation sets, and the generated family.

==============  ==========================================  =====  ======================
name            hub id                                      split  question / answer
==============  ==========================================  =====  ======================
deepscaler      agentica-org/DeepScaleR-Preview-Dataset     train  problem / answer
aime24          HuggingFaceH4/aime_2024                     train  problem / answer
amc23           math-ai/amc23                               test   question / answer
math500         HuggingFaceH4/MATH-500                      test   problem / answer
minerva         math-ai/minervamath                         test   question / answer
olympiadbench   math-ai/olympiadbench                       test   question / final_answer
generated       (offline, :mod:`generated`)                 -      -
==============  ==========================================  =====  ======================

``load_tasks(name)`` reads the hub copy through the ``datasets`` package (imported only
then; it is not a dependency). ``load_tasks(name, path=...)`` reads a local ``.jsonl``,
``.json`` or ``.parquet`` file (parquet needs ``pyarrow``) in the same schema; a
directory is searched for ``{split}.jsonl`` / ``{split}.parquet`` / ``{split}.json``.
Every other field of a row goes to ``Task.metadata``; the id is the row's ``unique_id``
/ ``id`` / ``idx`` field when present, else its position. Text that UTF-8 cannot encode
(a lone surrogate, e.g. from a ``\\ud800`` escape in a JSON file) is written as
``\\udXXX`` in every task field, so the first observation always encodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from environments.math_python.generated import generate_tasks
from trace_gym.utils.textsafe import clean_text
from trace_gym.env.datafiles import jsonable, load_rows
from trace_gym.types import Task


@dataclass(frozen=True)
class DatasetSpec:
    """Where a named dataset lives and which fields hold the question and the answer."""

    hub_id: str
    split: str
    question_field: str
    answer_field: str
    purpose: str  # "train" or "eval"


DATASETS: dict[str, DatasetSpec] = {
    "deepscaler": DatasetSpec("agentica-org/DeepScaleR-Preview-Dataset", "train", "problem", "answer", "train"),
    "aime24": DatasetSpec("HuggingFaceH4/aime_2024", "train", "problem", "answer", "eval"),
    "amc23": DatasetSpec("math-ai/amc23", "test", "question", "answer", "eval"),
    "math500": DatasetSpec("HuggingFaceH4/MATH-500", "test", "problem", "answer", "eval"),
    "minerva": DatasetSpec("math-ai/minervamath", "test", "question", "answer", "eval"),
    "olympiadbench": DatasetSpec("math-ai/olympiadbench", "test", "question", "final_answer", "eval"),
}

#: Other spellings accepted by :func:`load_tasks`.
ALIASES = {
    "deepscaler-preview": "deepscaler", "aime2024": "aime24", "aime_2024": "aime24", "amc2023": "amc23",
    "math-500": "math500", "math_500": "math500", "minervamath": "minerva", "minerva_math": "minerva",
    "olympiad_bench": "olympiadbench", "olympiad": "olympiadbench", "gen": "generated",
}

EVAL_SETS = tuple(name for name, spec in DATASETS.items() if spec.purpose == "eval")
_ID_FIELDS = ("unique_id", "id", "idx")


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in DATASETS and key != "generated":
        raise ValueError(f"unknown math dataset {name!r}; expected one of {sorted([*DATASETS, 'generated'])}")
    return key


def rows_to_tasks(name: str, rows: Iterable[Mapping[str, Any]], spec: DatasetSpec | None = None) -> list[Task]:
    """Map raw rows in ``spec``'s schema to tasks (a missing field is a clear error)."""
    spec = spec or DATASETS[canonical_name(name)]
    tasks = []
    for i, row in enumerate(rows):
        for needed in (spec.question_field, spec.answer_field):
            if needed not in row:
                raise ValueError(f"{name} row {i} has no {needed!r} field (fields: {sorted(row)})")
        answer = row[spec.answer_field]
        if isinstance(answer, tuple):
            answer = list(answer)
        elif hasattr(answer, "tolist"):  # numpy arrays from parquet
            answer = answer.tolist()
        if answer is None or answer == [] or answer == "":
            raise ValueError(f"{name} row {i} has an empty {spec.answer_field!r}")
        ident = next((row[f] for f in _ID_FIELDS if row.get(f) is not None), i)
        metadata = {k: _clean(jsonable(v)) for k, v in row.items()
                    if k not in (spec.question_field, spec.answer_field) and jsonable(v) is not None}
        tasks.append(Task(id=clean_text(f"{name}/{ident}"), prompt=clean_text(str(row[spec.question_field])),
                          answer=_clean(answer) if isinstance(answer, list) else clean_text(str(answer)), source=name,
                          metadata=metadata))
    return tasks


def _clean(value: Any) -> Any:
    """``value`` with :func:`clean_text` applied to every string in it (JSON-like values)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    return value


def load_tasks(name: str, path: str | None = None, split: str | None = None, limit: int | None = None,
               **generated_kwargs: Any) -> list[Task]:
    """Tasks of dataset ``name`` from the hub or from ``path`` (see the module docstring).

    Args:
        name: a key of :data:`DATASETS` (or an alias), or ``"generated"``.
        path: a local file or directory in the dataset's schema; ``None`` loads from the hub.
        split: the split to load (default: the dataset's own).
        limit: keep only the first ``limit`` tasks.
        generated_kwargs: for ``"generated"``: ``n``, ``difficulty``, ``seed``.
    """
    key = canonical_name(name)
    if key == "generated":
        kwargs = {"n": 64, "difficulty": (0, 1, 2), "seed": 0, **generated_kwargs}
        tasks = generate_tasks(**kwargs)
        return tasks[:limit] if limit is not None else tasks
    spec = DATASETS[key]
    split = split or spec.split
    rows = load_rows(key, path, split, spec.hub_id, limit=limit,
                     local_hint=f"rows with {spec.question_field!r} and {spec.answer_field!r}")
    return rows_to_tasks(key, rows, spec)
