"""A real env (GuessNumber) with failures planted per task, for the runner's error paths."""

from __future__ import annotations

import time

from environments.guess_number import GuessNumberEnv, make_tasks
from trace_gym.types import Task

class PlantedEnv(GuessNumberEnv):
    """GuessNumber with a failure planted by the task's ``metadata["plant"]``:
    ``step`` raises on the 2nd step, ``reset`` / ``restore`` / ``close`` raise there,
    ``slow`` sleeps :data:`SLOW` seconds in its first step. Every instance is recorded."""

    instances: list = []

    def __init__(self):
        super().__init__(max_turns=4, lie_prob=0.0)
        self.mode, self.closed, self.slow_step_ended = None, False, None
        PlantedEnv.instances.append(self)

    def reset(self, *, seed=None, options=None):
        self.mode = options["task"].metadata.get("plant")
        if self.mode == "reset":
            raise RuntimeError("planted reset failure")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.mode == "step" and self._turn == 1:
            raise RuntimeError("planted step failure")
        if self.mode == "slow" and self._turn == 0:
            time.sleep(SLOW)
            self.slow_step_ended = time.perf_counter()
        return super().step(action)

    def restore(self, snapshot):
        if self.mode == "restore":
            raise RuntimeError("planted restore failure")
        super().restore(snapshot)

    def close(self):
        self.closed = True
        if self.mode == "close":
            raise RuntimeError("planted close failure")
        super().close()


SLOW = 3.0


def planted_tasks(*plants):
    return [Task(t.id, t.prompt, t.answer, t.source, {**t.metadata, "plant": p})
            for t, p in zip(make_tasks(len(plants), seed=1), plants)]
