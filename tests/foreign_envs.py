"""Envs written the way other ecosystems write them (no snapshot, global randomness), and
their adapters: the fixtures of tests/test_env_adapter.py (importable by check_env's
cross-process worker, which gets the test's sys.path)."""

from __future__ import annotations

import os
import random

from trace_gym.env_adapter import ForeignEnv
from trace_gym.types import Message, Task


class HotColdGame:
    """A GEM-style game: ``reset(seed)`` seeds nothing itself, draws its secret and a
    noisy hint from the global ``random`` module; observations are strings."""

    def __init__(self, high: int = 20, max_turns: int = 5):
        self.high, self.max_turns = high, max_turns

    def reset(self):
        self.secret = random.randint(1, self.high)
        self.turn = 0
        return f"Guess a number in 1..{self.high}.", {}

    def step(self, action: str):
        self.turn += 1
        if "boom" in action:
            raise KeyError("boom")  # foreign code that raises on odd model output
        digits = "".join(ch for ch in action if ch.isdigit())[:6]
        if not digits:
            return "say a number", -0.1, False, self.turn >= self.max_turns, {}
        guess = int(digits)
        if guess == self.secret:
            return "correct", 1.0, True, False, {}
        noise = random.random() < 0.3  # a lying hint, drawn from the global RNG
        hint = "higher" if (guess < self.secret) != noise else "lower"
        return hint, 0.0, False, self.turn >= self.max_turns, {}


class HotColdEpisode:
    """The :class:`~trace_gym.env_adapter.ForeignEpisode` driver of :class:`HotColdGame`
    (``copy`` by default, ``replay`` on request)."""

    snapshot_strategies = ("copy", "replay")
    global_rng = True
    game_class = HotColdGame

    def __init__(self, high: int = 20):
        self.high = high
        self.env_key = type(self).__name__
        self.game: HotColdGame | None = None

    def begin(self, task, seed):
        self.game = self.game_class(self.high)
        text, info = self.game.reset()
        return [Message("user", text)], info

    def act(self, action):
        text, reward, terminated, truncated, info = self.game.step(action)
        return [Message("user", text)], reward, terminated, truncated, info

    def state(self):
        return self.game

    def set_state(self, state):
        self.game = state

    def end(self):
        self.game = None

    def default_tasks(self):
        return hot_cold_tasks(4)

    def load_task(self, task_id):
        raise ValueError(f"{self.env_key} cannot load a task by id ({task_id!r}); pass the Task")


class HotColdAdapter(ForeignEnv):
    """:class:`HotColdEpisode` as an env (what ``gymnasium.make`` and ``check_env``'s
    cross-process worker build by name)."""

    episode_class = HotColdEpisode

    def __init__(self, snapshot: str | None = None, high: int = 20, max_turns: int | None = None, **boundary):
        # boundary: call_timeout_s, max_observation_chars
        super().__init__(self.episode_class(high), snapshot=snapshot, max_turns=max_turns, **boundary)


class UrandomGame(HotColdGame):
    """Like :class:`HotColdGame`, but its hint noise comes from ``os.urandom``: no seed
    reproduces it, so it cannot be snapshotted by replay."""

    def step(self, action: str):
        text, reward, terminated, truncated, info = super().step(action)
        if text in ("higher", "lower") and os.urandom(1)[0] < 128:
            text = "higher" if text == "lower" else "lower"
        return text, reward, terminated, truncated, info


class UrandomEpisode(HotColdEpisode):
    game_class = UrandomGame


class UrandomAdapter(HotColdAdapter):
    episode_class = UrandomEpisode


def hot_cold_tasks(n: int, seed: int = 0) -> list[Task]:
    """``n`` tasks, each naming the episode seed its secret is drawn with."""
    return [Task(id=f"hotcold/{seed + i}", prompt="", metadata={"seed": seed + i}) for i in range(n)]


class PlantedEpisode(HotColdEpisode):
    """:class:`HotColdEpisode` (a GEM-style game that draws from the global RNG, so its calls
    take the process-state lock) whose begin and act pass their reply through planted code:
    ``on_reset(obs, info) -> (obs, info)`` and ``on_step(reply) -> reply``, which may also
    raise, hang or change process state, as hostile foreign code does."""

    def __init__(self, on_reset=None, on_step=None, high: int = 20):
        super().__init__(high)
        self.on_reset, self.on_step = on_reset, on_step

    def begin(self, task, seed):
        obs, info = super().begin(task, seed)
        return self.on_reset(obs, info) if self.on_reset else (obs, info)

    def act(self, action):
        reply = super().act(action)
        return self.on_step(reply) if self.on_step else reply


class PlantedAdapter(ForeignEnv):
    """:class:`PlantedEpisode` as an env."""

    def __init__(self, on_reset=None, on_step=None, snapshot: str | None = None, high: int = 20,
                 max_turns: int | None = None, **boundary):
        super().__init__(PlantedEpisode(on_reset, on_step, high), snapshot=snapshot, max_turns=max_turns, **boundary)
