"""One evaluation suite's record (:class:`Suite`): its tasks, env, scorer and agent-loop
defaults. The table of suites, their loaders and the runner are in :mod:`evaluators.suites`
(which exports this name too); the runner (:mod:`evaluators.episodes`) and the scorers
(:mod:`evaluators.scoring`) take a suite, so the record sits below all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from trace_gym.types import Task


@dataclass(frozen=True)
class Suite:
    """One evaluation suite.

    Attributes:
        name: the suite's name in :data:`SUITES`.
        env_id: registered Gymnasium id the episodes run in.
        load: ``load(limit, seed, path, heldout_fraction) -> list[Task]`` (``limit`` None: all).
        env_kwargs: keyword arguments of ``gymnasium.make``.
        scorer: ``"reward"`` (per-sample reward, success at >= 0.5), ``"bfcl"`` (the
            official checks, per category) or ``"qa"`` (EM and F1, :mod:`evaluators.qa`).
        offline: tasks load without network.
        max_turns, max_turn_tokens, max_episode_tokens: the agent loop's defaults here
            (turns per episode; generated tokens per turn; context tokens per episode).
        description: one line.
        data_file: the tasks come from ``data_dir/<name>.jsonl`` (``.parquet``, ``.json``,
            a folder ``<name>/``) when ``data_dir`` is set, else from the hub; a set
            ``data_dir`` without that file is an error, never a silent hub download.
        hash_tasks: the result cache's key hashes the loaded tasks (loaders defined
            outside this table, e.g. a plugin env's, whose output can change with no file
            to hash).
        breakdown: a ``Task.metadata`` key (MMLU-Pro's ``"category"``): the result adds
            accuracy, its interval and pass@k per value of it (``"breakdown"`` in the
            JSON, a table in the markdown); empty: none.
    """

    name: str
    env_id: str
    load: Callable[..., list[Task]]
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    scorer: str = "reward"
    offline: bool = True
    max_turns: int = 4
    max_turn_tokens: int = 512
    max_episode_tokens: int = 4096
    description: str = ""
    data_file: bool = False
    hash_tasks: bool = False
    breakdown: str = ""

    def data_file_names(self) -> tuple[str, ...]:
        """The names looked for in ``data_dir``, in order (the folder form ends in ``/``)."""
        return (f"{self.name}.jsonl", f"{self.name}.parquet", f"{self.name}.json", f"{self.name}/")

    def limits(self) -> str:
        """The agent-loop defaults on one line (``--help`` and the docs)."""
        return (f"max_turns {self.max_turns}, max_turn_tokens {self.max_turn_tokens}, "
                f"max_episode_tokens {self.max_episode_tokens}")
