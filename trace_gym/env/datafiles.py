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


#: Seconds the hub may take to answer one request before it counts as unreachable.
HUB_PROBE_S = 3.0
#: Variables that put ``datasets`` and ``huggingface_hub`` offline (they then read their cache only).
HUB_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


class HubUnreachable(ValueError):
    """A dataset was to come from the hub, which cannot be reached (offline) and has no
    cached copy: one line naming the dataset, the hub id, why, and what a local copy holds.

    Attributes:
        key: the dataset's name.
        hub_id: where on the hub it lives.
        reason: why the hub cannot be reached.
        local_hint: what a row of a local copy holds (the callers name their own key
            for the copy: ``data_dir=`` for ``eval``, ``data_path=`` for ``train``).
    """

    def __init__(self, key: str, hub_id: str, reason: str, local_hint: str):
        self.key, self.hub_id, self.reason, self.local_hint = key, hub_id, reason, local_hint
        super().__init__(f"{key!r} comes from the hub ({hub_id}), which cannot be reached ({reason}); offline, "
                         f"pass path= to a local copy ({local_hint})")


def hub_offline() -> bool:
    """True when one of :data:`HUB_OFFLINE_VARS` is set to 1 / true / yes / on."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in HUB_OFFLINE_VARS)


def hub_unreachable(timeout: float = HUB_PROBE_S) -> str | None:
    """Why the hub (``HF_ENDPOINT``, default ``https://huggingface.co``) cannot be reached
    now, in a few words, or ``None`` when it answered (any HTTP status) within ``timeout``
    seconds. One request, no retries (the ``datasets`` client retries for half a minute
    before it gives up); proxies from the environment apply; the lookup of the host
    counts towards ``timeout``."""
    import threading
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    answer: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            answer.append(None)
        except urllib.error.HTTPError:  # the server answered: it is reachable
            answer.append(None)
        except (OSError, ValueError) as exc:  # URLError, a timeout, a refused or unresolvable host, a bad URL
            answer.append(f"{endpoint}: {getattr(exc, 'reason', exc)}")

    worker = threading.Thread(target=probe, name="hub-probe", daemon=True)  # daemon: a hung lookup never blocks exit
    worker.start()
    worker.join(timeout)
    return answer[0] if answer else f"{endpoint}: no answer in {timeout:g} s"


def _hub_rows(key: str, hub_id: str, config: str | None, split: str, local_hint: str) -> Any:
    """``datasets.load_dataset(hub_id, config, split=split)``, or :class:`HubUnreachable` at
    once when the hub cannot be reached (checked first unless the hub is set offline, where
    ``datasets`` reads its cache and fails fast without one)."""
    where = f"{hub_id} (config {config})" if config else hub_id
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"loading {key!r} from the hub ({where}) needs the `datasets` package; install it, "
                          f"or pass path= to a local copy ({local_hint})") from exc
    if not hub_offline():
        reason = hub_unreachable()
        if reason is not None:
            raise HubUnreachable(key, where, reason, local_hint)
    try:
        return datasets.load_dataset(*((hub_id, config) if config else (hub_id,)), split=split)
    except ConnectionError as exc:  # offline mode without a cached copy, or the hub gone since the probe
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise HubUnreachable(key, where, first, local_hint) from None


def load_rows(key: str, path: str | None, split: str, hub_id: str, config: str | None = None,
              limit: int | None = None, local_hint: str = "rows in the hub's schema") -> Any:
    """Rows of dataset ``key``: from ``path`` (:func:`read_rows`) when given, else from the
    hub (``datasets.load_dataset(hub_id, config, split=split)``); the first ``limit`` only.
    ``local_hint`` says what a row of a local copy holds (for the errors).

    Raises:
        ImportError: no ``path`` and no ``datasets`` package (naming ``local_hint``).
        HubUnreachable: no ``path`` and the hub cannot be reached (within :data:`HUB_PROBE_S`
            seconds, or at once where it is set offline and nothing is cached).
    """
    if path is not None:
        rows = read_rows(path, split)
    else:
        rows = _hub_rows(key, hub_id, config, split, local_hint)
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


#: The share of a task family's prompts held out of training for evaluation, by prompt hash
#: (:func:`split_tasks`): the default of ``trace-gym train`` and ``trace-gym eval`` alike, so the
#: prompts one trains on are never the ones the other scores.
HELDOUT_FRACTION = 0.2


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
