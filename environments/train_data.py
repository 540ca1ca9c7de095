"""Named training sets: ``trace-gym train data=NAME`` and ``trace-gym bank record data=NAME``.

:data:`TRAIN_DATA` is the one table. Each set loads through its env family's own data
module (:mod:`environments.math_python.generated` / ``.data``, :mod:`environments.bfcl.data`,
:mod:`environments.wiki_qa.data`); an empty ``data`` is the env family's own tasks minus
the held-out split (the face's business, not this table's). Evaluation keeps its suites in
:mod:`evaluators.suites`; the two share only the held-out split
(:func:`trace_gym.env.datafiles.split_tasks` at
:data:`~trace_gym.env.datafiles.HELDOUT_FRACTION`), so training setup never reads the evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from trace_gym.env.datafiles import HELDOUT_FRACTION, HubUnreachable, split_tasks
from trace_gym.types import Task


@dataclass(frozen=True)
class TrainData:
    """A named training set (``trace-gym train data=NAME``): ``load(n, seed, path)``."""

    load: Callable[..., list[Task]]
    offline: bool
    description: str


def _shuffled(tasks: list[Task], n: int, seed: int) -> list[Task]:
    order = np.random.default_rng(seed).permutation(len(tasks))
    return [tasks[i] for i in order[:n]]


def generated_train(n: int, seed: int = 0, heldout_fraction: float = HELDOUT_FRACTION) -> list[Task]:
    """``n`` training prompts of the generated family with every held-out prompt removed."""
    from environments.math_python.generated import generate_mixed_tasks

    size = n + n // 2 + 8
    while True:
        kept = split_tasks(generate_mixed_tasks(size, seed=seed), "train", heldout_fraction)
        if len(kept) >= n:
            return kept[:n]
        size *= 2


def deepscaler_train(n: int, seed: int = 0, path: str | None = None) -> list[Task]:
    """``n`` DeepScaleR problems (a seeded draw), from ``path`` or the hub."""
    from environments.math_python.data import load_tasks

    return _shuffled(load_tasks("deepscaler", path=path or None, limit=None), n, seed)


def bfcl_train_split(n: int, seed: int = 0, path: str | None = None) -> list[Task]:
    """``n`` entries (a seeded draw) of the BFCL multi-turn train split, all four categories (80 %)."""
    from environments.bfcl import data

    return _shuffled([t for c in data.CATEGORIES for t in data.load_tasks(c, "train")], n, seed)


def _qa_train(name: str, path: str | None) -> list[Task]:
    from environments.wiki_qa.data import load_tasks

    return load_tasks(name, path=path or None, split="train")


#: Named training sets. The generated family needs none (``data`` empty: the family's own
#: tasks minus the held-out split).
TRAIN_DATA: dict[str, TrainData] = {
    "generated": TrainData(lambda n, seed=0, path=None: generated_train(n, seed), True,
                           "generated math family minus its held-out split"),
    "deepscaler": TrainData(deepscaler_train, False, "DeepScaleR-Preview (hub agentica-org/DeepScaleR-Preview-Dataset)"),
    "bfcl": TrainData(bfcl_train_split, True, "BFCL v4 multi-turn train split (80 %, all categories)"),
    "hotpotqa": TrainData(lambda n, seed=0, path=None: _shuffled(_qa_train("hotpotqa", path), n, seed), False,
                          "HotpotQA train split (FlashRAG hub copy, or a local file)"),
}


def get_train_data(name: str) -> TrainData:
    """The training set called ``name`` (``ValueError`` naming the closest names)."""
    if name not in TRAIN_DATA:
        from trace_gym.utils.suggest import did_you_mean

        raise ValueError(f"unknown training data {name!r}{did_you_mean(name, list(TRAIN_DATA))}; "
                         f"known: {sorted(TRAIN_DATA)} (empty: the env family's own tasks)")
    return TRAIN_DATA[name]


def load_train_data(name: str, n: int, seed: int, path: str | None) -> list:
    """``n`` tasks of the training set ``name`` (``path``: a local copy); a missing local
    file, or the hub out of reach without one, is one ``ValueError`` naming ``data_path``."""
    try:
        return list(get_train_data(name).load(n, seed=seed, path=path or None))
    except FileNotFoundError as exc:  # a user's path: one line, naming the key
        raise ValueError(f"data_path={path!r} for data={name}: {exc}") from None
    except HubUnreachable as exc:
        raise ValueError(f"data={name} reads {exc.hub_id} from the hub, which cannot be reached ({exc.reason}); "
                         f"offline, set data_path=FILE, a local copy ({exc.local_hint})") from None


@dataclass(frozen=True)
class TrainTasks:
    """Where a training run's prompts come from: ``load()`` returns them (held-out prompts
    already removed), ``offline`` says whether that works without network, ``description``
    is one line for ``--dry-run``."""

    load: Callable[[], list[Task]]
    offline: bool
    description: str


def train_tasks(data: str, family: Any, *, pool: int, seed: int, heldout_fraction: float,
                path: str = "") -> TrainTasks:
    """The ``pool`` training prompts of a run: the training set ``data`` (``path``: its local
    copy), or with ``data`` empty the env ``family``'s own tasks minus its held-out split (a
    :class:`trace_gym.env.family.EnvFamily`; drawn larger until ``pool`` remain). An unknown
    ``data`` is one ``ValueError`` here, before anything loads."""
    if data:
        source = get_train_data(data)
        return TrainTasks(lambda: load_train_data(data, pool, seed, path), source.offline or bool(path),
                          f"{data} ({path or source.description})")

    def load() -> list[Task]:
        size = int(pool / max(1e-9, 1 - heldout_fraction)) + 16
        while True:
            kept = split_tasks(family.load_tasks(size, seed=seed), "train", heldout_fraction)
            if len(kept) >= pool or size > 64 * pool:
                return kept[:pool]
            size *= 2

    return TrainTasks(load, True, f"{family.task_loader} minus the held-out {heldout_fraction:.0%}")
