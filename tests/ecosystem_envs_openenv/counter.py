"""An echo-and-count OpenEnv env that can also misbehave on request.

Action: ``CounterAction(text: str)``. ``"sleep S"`` sleeps S seconds before answering
(a slow server); ``"crash"`` raises inside ``step`` (an env that fails).
Observation: ``CounterObservation(echo: str, count: int)``: the text echoed back and
how many steps the episode has had; reward ``0.1 * count``; ``done`` after ``limit``
steps (a reset kwarg, default 4). The first observation names the seed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class CounterAction(Action):
    text: str


class CounterObservation(Observation):
    echo: str
    count: int


class CounterEnvironment(Environment[CounterAction, CounterObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._limit = 4

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, limit: int = 4,
              **kwargs: Any) -> CounterObservation:
        self._limit = int(limit)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return CounterObservation(echo=f"counter ready (seed {seed}, limit {self._limit})", count=0)

    def step(self, action: CounterAction, timeout_s: Optional[float] = None, **kwargs: Any) -> CounterObservation:
        if action.text.startswith("sleep "):
            time.sleep(float(action.text.split()[1]))
        if action.text == "crash":
            raise RuntimeError("the counter env crashed on purpose")
        self._state.step_count += 1
        count = self._state.step_count
        return CounterObservation(echo=action.text, count=count, reward=0.1 * count, done=count >= self._limit)

    @property
    def state(self) -> State:
        return self._state


def parse_action(text: str) -> dict:
    """An ``action_parser``: the model's text, stripped, as the ``text`` field."""
    return {"text": text.strip()}


app = create_app(CounterEnvironment, CounterAction, CounterObservation, env_name="counter", max_concurrent_envs=8)
