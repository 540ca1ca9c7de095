"""Exact costs count what a restore re-executes (replay-snapshot envs, e.g. math_python's cells)."""

from __future__ import annotations

import numpy as np

from environments.guess_number.env import GuessNumberEnv, make_tasks
from trace_gym.agent.loop import AgentConfig, AgentRunner
from trace_gym.env.contract import ReplayCost
from trace_gym.agent.rollout import collect
from trace_gym.strategies import shaped_strategies
from trace_gym.types import SamplingParams

RESTORED: list[int] = []


class ReplayingGuess(GuessNumberEnv):
    """GuessNumber that declares its restore re-runs one step per recorded turn."""

    def replay_steps(self, snapshot) -> int:
        RESTORED.append(snapshot.turn)
        return snapshot.turn


def test_replayed_steps_are_env_steps_and_counted_apart(tiny_engine):
    assert isinstance(ReplayingGuess(), ReplayCost) and not isinstance(GuessNumberEnv(), ReplayCost)
    RESTORED.clear()
    runner = AgentRunner(tiny_engine, tiny_engine.tokenizer, lambda: ReplayingGuess(max_turns=3, lie_prob=0.0),
                         SamplingParams(max_tokens=6, temperature=1.0, seed=0),
                         AgentConfig(max_turn_tokens=6, max_episode_tokens=512, max_turns=3))
    try:
        trace = shaped_strategies(["trace"], group_size=2, continuations_per_root=2)["trace"]
        batch = collect(make_tasks(2, seed=3), trace, _Half(), runner, 4, np.random.default_rng(0))
    finally:
        runner.close()
    led = batch.ledger
    assert led.continuations > 0 and RESTORED  # continuations restored snapshots
    assert led.replayed_env_steps == sum(RESTORED) > 0
    stepped = sum(len(t.nodes) - 1 for t in batch.trees)  # one env.step per tree node below the root
    assert led.env_steps == stepped + led.replayed_env_steps
    assert led.to_dict()["replayed_env_steps"] == led.replayed_env_steps


class _Half:
    def predict(self, contexts):
        return np.full(len(contexts), 0.5)

    def update(self, contexts, targets, weights=None):
        return {}


def test_math_python_reports_the_cells_a_restore_replays():
    from environments.math_python.env import MathPythonEnv
    from trace_gym.types import Task

    task = Task(id="r", prompt="What is 2 + 3?", answer="5")
    env = MathPythonEnv([task], prestart_kernel=False)
    try:
        env.reset(seed=0, options={"task": task})
        assert isinstance(env, ReplayCost)
        assert env.replay_steps(env.snapshot()) == 0
        env.step("```python\nx = 2\n```\n```python\nprint(x + 3)\n```")
        snap = env.snapshot()
        assert env.replay_steps(snap) == 2
    finally:
        env.close()
