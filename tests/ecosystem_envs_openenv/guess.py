"""Guess the number, as an OpenEnv env: the secret is drawn from the reset seed.

Action: ``GuessAction(message: str)``, the first integer in the text is the guess.
Observation: ``GuessObservation(text: str, attempts_left: int)``; ``done`` on the right
guess (reward 1.0) or when the attempts run out (reward 0.0); a wrong guess is told
"higher"/"lower" (reward 0.0), text with no number costs an attempt (reward -0.1).
Reset kwargs: ``seed``, ``high`` (the secret is in 1..high, default 20), ``attempts``
(default 6).
"""

from __future__ import annotations

import random
import re
import uuid
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    text: str
    attempts_left: int


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # no shared state: each session owns its game

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self._secret, self._left, self._high = 1, 0, 20

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, high: int = 20,
              attempts: int = 6, **kwargs: Any) -> GuessObservation:
        self._high, self._left = int(high), int(attempts)
        self._secret = random.Random(seed).randint(1, self._high)
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return GuessObservation(text=f"Guess a number in 1..{self._high}. You have {self._left} tries.",
                                attempts_left=self._left)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        self._left -= 1
        found = re.search(r"-?\d+", action.message)
        if found is None:
            text, reward, done = "Say a number.", -0.1, self._left <= 0
        elif int(found.group()) == self._secret:
            text, reward, done = f"Correct, it was {self._secret}!", 1.0, True
        else:
            hint = "higher" if int(found.group()) < self._secret else "lower"
            text, reward, done = f"{found.group()} is wrong: go {hint}.", 0.0, self._left <= 0
        return GuessObservation(text=text, attempts_left=self._left, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=4)
