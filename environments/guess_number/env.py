"""GuessNumber: the reference multi-turn agent environment.

It is small on purpose: the docs' "how to add an environment" walks through it, and
the core's tests use it. It has everything a real agent env has: a task, a parser that
turns malformed actions into readable observations, env-side randomness (a noisy
hint) that must survive snapshot/restore, and a verifiable terminal reward.

## Action Space
``TextAction``: the model's raw text. The env reads the *last* ``guess: N`` in it
(case-insensitive, ``:`` or ``=`` optional); with ``guess_format="number"`` it reads the
last integer of the reply instead (at most 12 digits; a longer digit run is no guess), for
small models that do not follow the ``guess:`` format.

## Observation Space
``ChatObservation``: at reset a system and a user message; after each step one user
message with the feedback (``higher`` / ``lower`` / ``correct`` or a format error).

## Rewards
1.0 on the step that names the secret, else 0.0.

## Episode End
Terminated when the guess is right; truncated after ``max_turns`` steps.

## Snapshot
``state``: secret, turn, finished flag and the env RNG's state, frozen to bytes.

## Version History
v0: first version; ``guess_format`` added later (default ``"tagged"``: unchanged).
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium

from trace_gym.env.contract import Snapshot, freeze, rng_from_state, rng_state, task_from_options, thaw
from trace_gym.env.spaces import ChatObservation, TextAction
from trace_gym.types import Message, Task

_GUESS = re.compile(r"guess\s*[:=]?\s*(-?\d{1,12})", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\d-])(-?\d{1,12})(?!\d)")
#: How a reply is read: ``tagged`` (``guess: N``) or ``number`` (its last integer).
GUESS_FORMATS = {"tagged": _GUESS, "number": _NUMBER}

SYSTEM_PROMPT = (
    "You are playing a guessing game. Each turn, reply with `guess: N` for an integer N. "
    "You will be told whether the secret is higher or lower."
)


def make_tasks(n: int, low: int = 1, high: int = 64, seed: int = 0) -> list[Task]:
    """``n`` tasks with secrets drawn uniformly from ``[low, high]`` (deterministic in ``seed``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        Task(
            id=f"guess/{i}",
            prompt=f"I am thinking of an integer between {low} and {high}. Find it.",
            answer=int(rng.integers(low, high + 1)),
            source="guess_number",
            metadata={"low": low, "high": high},
        )
        for i in range(n)
    ]


def varied_range_tasks(n: int, seed: int = 0, *, low: int = 1, high: int = 64, min_span: int = 8) -> list[Task]:
    """``n`` tasks whose ranges vary: each asks for a secret in ``[low, top]``, ``top`` drawn
    uniformly from ``[low + min_span - 1, high]``, the secret uniformly from ``[low, top]``
    (deterministic in ``seed``; ids ``guess/s{seed}/{i}``).

    The prompt states the range, so the tasks have ``high - low - min_span + 2`` distinct
    prompts (57 by default), and a held-out split by prompt text
    (:func:`trace_gym.env.datafiles.split_tasks`) holds some ranges out; :func:`make_tasks`
    asks every task the same question, which no such split can divide.
    """
    import numpy as np

    if not 1 <= min_span <= high - low + 1:
        raise ValueError(f"need 1 <= min_span <= high - low + 1, got min_span={min_span}, low={low}, high={high}")
    rng = np.random.default_rng(seed)
    tops = rng.integers(low + min_span - 1, high + 1, size=n)
    return [
        Task(
            id=f"guess/s{seed}/{i}",
            prompt=f"I am thinking of an integer between {low} and {int(top)}. Find it.",
            answer=int(rng.integers(low, int(top) + 1)),
            source="guess_number",
            metadata={"low": low, "high": int(top)},
        )
        for i, top in enumerate(tops)
    ]


class GuessNumberEnv(gymnasium.Env):
    """Guess a secret integer; the hint lies with probability ``lie_prob``.

    Args:
        low, high: inclusive range of secrets for tasks without an ``answer``.
        max_turns: steps before truncation.
        lie_prob: probability that a ``higher``/``lower`` hint is flipped (drawn from
            the env's own seeded RNG, so snapshots must carry the RNG state).
        tasks: the pool ``reset()`` draws from when no task is given.
        guess_format: ``"tagged"`` (the last ``guess: N``) or ``"number"`` (the last integer).
    """

    metadata = {"render_modes": []}
    snapshot_mode = "state"

    @classmethod
    def load_tasks(cls, n: int, seed: int = 0, **kwargs: Any) -> list[Task]:
        """The task loader of ``trace_gym/GuessNumber-v0`` (what ``trace-gym eval --suite
        trace_gym/GuessNumber-v0`` and ``train --env`` of the id read): :func:`varied_range_tasks`."""
        return varied_range_tasks(n, seed, **kwargs)

    def __init__(self, low: int = 1, high: int = 64, max_turns: int = 8, lie_prob: float = 0.1,
                 tasks: list[Task] | None = None, guess_format: str = "tagged"):
        if not low < high:
            raise ValueError(f"need low < high, got low={low}, high={high}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not 0.0 <= lie_prob <= 1.0:
            raise ValueError(f"lie_prob must be in [0, 1], got {lie_prob}")
        if guess_format not in GUESS_FORMATS:
            raise ValueError(f"guess_format must be one of {sorted(GUESS_FORMATS)}, got {guess_format!r}")
        self.low, self.high, self.max_turns, self.lie_prob = low, high, max_turns, lie_prob
        self._pattern = GUESS_FORMATS[guess_format]
        self.tasks = list(tasks) if tasks is not None else make_tasks(16, low, high)
        self.action_space = TextAction(max_length=4096)
        self.observation_space = ChatObservation()
        self._secret: int | None = None
        self._turn = 0
        self._done = False

    # -- gymnasium API ------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = task_from_options(options, self.tasks, self.np_random, self._load)
        lo, hi = task.metadata.get("low", self.low), task.metadata.get("high", self.high)
        self._secret = int(task.answer) if task.answer is not None else int(self.np_random.integers(lo, hi + 1))
        self._turn, self._done = 0, False
        obs = [Message("system", SYSTEM_PROMPT), Message("user", task.prompt)]
        return obs, {"task_id": task.id}

    def step(self, action: str):
        if self._secret is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return [Message("user", "The game is over.")], 0.0, True, False, {"error": "episode_over"}
        self._turn += 1
        matches = self._pattern.findall(action if isinstance(action, str) else "")
        info: dict[str, Any] = {"turn": self._turn}
        if not matches:
            text, reward = "I could not read a guess. Reply with `guess: N`.", 0.0
            info["error"] = "no_guess"
        else:
            guess = int(matches[-1])
            info["guess"] = guess
            if guess == self._secret:
                self._done = True
                return [Message("user", "correct")], 1.0, True, False, info
            higher = guess < self._secret
            if self.np_random.random() < self.lie_prob:
                higher = not higher
            text, reward = ("higher" if higher else "lower"), 0.0
        truncated = self._turn >= self.max_turns
        self._done = truncated
        return [Message("user", text)], reward, False, truncated, info

    def close(self) -> None:
        self._secret = None

    # -- snapshot contract -------------------------------------------------------
    def snapshot(self) -> Snapshot:
        state = (self._secret, self._turn, self._done, rng_state(self._np_random))
        return Snapshot(type(self).__name__, self.snapshot_mode, self._turn, freeze(state))

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.env_id != type(self).__name__:
            raise ValueError(f"snapshot from {snapshot.env_id!r} cannot restore a {type(self).__name__}")
        self._secret, self._turn, self._done, rng = thaw(snapshot.state)
        self._np_random = rng_from_state(rng)

    # -- helpers -----------------------------------------------------------------
    def reference_actions(self, task: Task) -> list[str]:
        """A fixed, partly malformed action script used by ``check_env``."""
        return ["guess: 32", "hmm", "Guess = 16", "guess: 48", f"guess: {task.answer}", "guess: 1"]

    def _load(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(f"unknown task id {task_id!r}")
