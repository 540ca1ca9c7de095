"""The step both distributed test modules compare: the in-process run and the distributed
run (in-process transport or real Ray actors) on the same tasks, seeds and tiny model.

Import what you use (``from distributed_fixtures import ...``).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any, Callable

import numpy as np

from environments.guess_number import GuessNumberEnv, make_tasks
from trace_gym.agent import AgentConfig
from trace_gym.distributed.runner import trajectories
from trace_gym.predictor import ConstantPredictor
from trace_gym.rollout import collect
from trace_gym.strategies import shaped_strategies
from trace_gym.types import SamplingParams

ENGINE_KW = {"dtype": "float32", "device": "cpu", "prefix_cache_bytes": 0}
MAKE_ENV = functools.partial(GuessNumberEnv, max_turns=3, lie_prob=0.2)
AGENT = AgentConfig(max_turn_tokens=8, max_episode_tokens=1024, max_turns=3, straggler_seconds=60)
SAMPLING = SamplingParams(temperature=1.0, seed=7)
LOGPROB_TOL = 1e-5  # float32 logits differ in the last bits with the batch's make-up
COUNTS = ("rollouts", "continuations", "generated_tokens", "prefill_tokens", "env_steps", "replayed_env_steps",
          "errors", "unspent_continuations")


def run_step(runner_factory: Callable[[], Any], n_tasks: int = 6, budget: float = 8) -> Any:
    """One TRACE step (constant predictor) on guess-number tasks with the runner that
    ``runner_factory`` builds; the runner is closed afterwards."""
    tasks = make_tasks(n_tasks, seed=3)
    strategy = shaped_strategies(["trace"], group_size=2, continuations_per_root=2)["trace"]
    runner = runner_factory()
    try:
        return collect(tasks, strategy, ConstantPredictor(0.5), runner, budget, np.random.default_rng(1), seed=11)
    finally:
        runner.close()


def assert_same_step(a: Any, b: Any) -> None:
    """Same trees (token ids, texts, observations, rewards, structure, snapshots' turns;
    logprobs within LOGPROB_TOL), same allocation, each trajectory exactly once, same
    ledger counts, errors and truncations."""
    assert np.array_equal(a.values, b.values) and np.array_equal(a.root_counts, b.root_counts)
    assert np.array_equal(a.continuation_budgets, b.continuation_budgets)
    assert [(k, p.continuations, p.extra_roots) for k, p in a.plans] == [(k, p.continuations, p.extra_roots)
                                                                         for k, p in b.plans]
    assert len(a.trees) == len(b.trees) and a.trees
    worst = 0.0
    for ta, tb in zip(a.trees, b.trees):
        da, db = ta.to_dict(), tb.to_dict()
        for na, nb in zip(da["nodes"], db["nodes"]):
            lpa, lpb = na.pop("logprobs"), nb.pop("logprobs")
            assert len(lpa) == len(lpb)
            worst = max([worst, *(abs(x - y) for x, y in zip(lpa, lpb))])
        assert da == db
    assert worst <= LOGPROB_TOL, worst
    assert Counter(trajectories(a.trees)) == Counter(trajectories(b.trees))
    assert len(set(trajectories(b.trees))) == len(trajectories(b.trees))  # each trajectory exactly once
    assert {k: getattr(a.ledger, k) for k in COUNTS} == {k: getattr(b.ledger, k) for k in COUNTS}
    assert a.errors == b.errors and a.extras["truncations"] == b.extras["truncations"]
