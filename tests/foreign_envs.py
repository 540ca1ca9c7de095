"""Envs written the way other ecosystems write them (no snapshot, global randomness), and
their adapters: the fixtures of tests/test_env_adapter.py (importable by check_env's
cross-process worker, which gets the test's sys.path)."""

from __future__ import annotations

import os
import random

from trace_gym.env_adapter import AdaptedEnv
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


class HotColdAdapter(AdaptedEnv):
    """The adapter of :class:`HotColdGame` (``copy`` by default, ``replay`` on request)."""

    global_rng = True

    def __init__(self, snapshot: str | None = None, high: int = 20, max_turns: int | None = None, **boundary):
        super().__init__(snapshot=snapshot, max_turns=max_turns, **boundary)  # call_timeout_s, max_observation_chars
        self.high = high

    def _default_tasks(self):
        return hot_cold_tasks(4)

    def _begin(self, task, seed):
        self.inner = HotColdGame(self.high)
        text, info = self.inner.reset()
        return [Message("user", text)], info

    def _act(self, action):
        text, reward, terminated, truncated, info = self.inner.step(action)
        return [Message("user", text)], reward, terminated, truncated, info


class UrandomGame(HotColdGame):
    """Like :class:`HotColdGame`, but its hint noise comes from ``os.urandom``: no seed
    reproduces it, so it cannot be snapshotted by replay."""

    def step(self, action: str):
        text, reward, terminated, truncated, info = super().step(action)
        if text in ("higher", "lower") and os.urandom(1)[0] < 128:
            text = "higher" if text == "lower" else "lower"
        return text, reward, terminated, truncated, info


class UrandomAdapter(HotColdAdapter):
    def _begin(self, task, seed):
        self.inner = UrandomGame(self.high)
        text, info = self.inner.reset()
        return [Message("user", text)], info


def hot_cold_tasks(n: int, seed: int = 0) -> list[Task]:
    """``n`` tasks, each naming the episode seed its secret is drawn with."""
    return [Task(id=f"hotcold/{seed + i}", prompt="", metadata={"seed": seed + i}) for i in range(n)]


class PlantedAdapter(HotColdAdapter):
    """:class:`HotColdAdapter` (a GEM-style game that draws from the global RNG, so its calls
    take the process-state lock) whose reset and step pass their reply through planted code:
    ``on_reset(obs, info) -> (obs, info)`` and ``on_step(reply) -> reply``, which may also
    raise, hang or change process state, as hostile foreign code does."""

    def __init__(self, on_reset=None, on_step=None, **kwargs):
        super().__init__(**kwargs)
        self.on_reset, self.on_step = on_reset, on_step

    def _begin(self, task, seed):
        obs, info = super()._begin(task, seed)
        return self.on_reset(obs, info) if self.on_reset else (obs, info)

    def _act(self, action):
        reply = super()._act(action)
        return self.on_step(reply) if self.on_step else reply
