"""Rows of a local dataset file: one reader for every environment family's loaders, and
the held-out split of a task pool (:func:`split_tasks`).

Formats: ``.jsonl`` (one JSON object a line; a bad line is named by number), ``.json``
(a list, or ``{"data": [...]}`` as HotpotQA ships it), ``.parquet`` (needs pyarrow), or a
folder holding ``{split}.jsonl`` / ``.parquet`` / ``.json`` (the hub's and FlashRAG's
layouts).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Sequence


def read_rows(path: str, split: str | None = None) -> list[dict]:
    """Rows of ``path`` (a file, or a folder holding ``{split or 'test'}.<ext>``).

    Raises:
        FileNotFoundError: the file, or the split inside the folder, does not exist.
        ValueError: an unsupported extension, or a JSONL line that is not JSON (with its number).
        ImportError: a parquet file without pyarrow installed.
    """
    if os.path.isdir(path):
        for ext in (".jsonl", ".parquet", ".json"):
            candidate = os.path.join(path, f"{split or 'test'}{ext}")
            if os.path.exists(candidate):
                return read_rows(candidate)
        raise FileNotFoundError(f"no {split or 'test'}.jsonl/.parquet/.json in {path}")
    if not path.endswith((".jsonl", ".json", ".parquet")):
        raise ValueError(f"unsupported file type {path!r}; expected .jsonl, .json or .parquet")
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file {path!r} does not exist")
    if path.endswith(".jsonl"):
        rows = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
        return rows
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data["data"] if isinstance(data, dict) and "data" in data else list(data)
    try:  # .parquet
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow)") from exc
    return pq.read_table(path).to_pylist()


def load_rows(key: str, path: str | None, split: str, hub_id: str, config: str | None = None,
              limit: int | None = None, local_hint: str = "a local .jsonl/.parquet copy") -> Any:
    """Rows of dataset ``key``: from ``path`` (:func:`read_rows`) when given, else from the
    hub (``datasets.load_dataset(hub_id, config, split=split)``); the first ``limit`` only.

    Raises:
        ImportError: no ``path`` and no ``datasets`` package (naming ``local_hint``).
    """
    if path is not None:
        rows = read_rows(path, split)
    else:
        try:
            import datasets
        except ImportError as exc:
            where = f"{hub_id}, {config}" if config else hub_id
            raise ImportError(f"loading {key!r} from the hub ({where}) needs the `datasets` package; install it, "
                              f"or pass path= to {local_hint}") from exc
        rows = datasets.load_dataset(*((hub_id, config) if config else (hub_id,)), split=split)
    if limit is not None:
        rows = [rows[i] for i in range(min(limit, len(rows)))]
    return rows


def jsonable(value: Any) -> Any:
    """A row's field as JSON can hold it (a numpy array from parquet as a list), or ``None``
    where it cannot (images and other binary columns: the loaders drop those)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


def split_tasks(tasks: Sequence[Any], split: str, heldout_fraction: float) -> list[Any]:
    """The ``"train"`` or ``"heldout"`` part of ``tasks`` (``Task``s), by a hash of the prompt text.

    A prompt is held out when ``sha256("trace_gym/heldout/" + prompt)`` maps below
    ``heldout_fraction``: the same prompt text is always on the same side, whatever its id,
    seed or position, so held-out prompts never reach training.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")

    def held(task: Any) -> bool:
        digest = hashlib.sha256(f"trace_gym/heldout/{task.prompt}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction

    return [t for t in tasks if held(t) == (split == "heldout")]
