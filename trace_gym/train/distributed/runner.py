"""The agent loop over env pools and rollout workers: the same step, other processes.

:class:`RayAgentRunner` *is* the in-process :class:`~trace_gym.agent.loop.AgentRunner` -- the
same episode bookkeeping, rounds, request grouping (``n = k`` per anchor), seeds,
truncation rules and turn records -- with two things moved out of the process:

- generation goes to an :class:`~trace_gym.train.distributed.engines.EngineGroup` (a
  ``RolloutEngine``; one call per rollout worker per round);
- env work goes to env pools through a :class:`~trace_gym.train.distributed.env_pool.PoolExecutor`
  in place of the loop's thread pool: the round's steps are sent as one call per pool
  when the round's generation is done, closes likewise, and new episodes' resets and
  restores as one call per pool (``_open``).

So :func:`trace_gym.agent.rollout.collect` / :func:`trace_gym.step.driver.run_step` over a
:class:`RayBranchRunner` (an :class:`~trace_gym.agent.rollout.AgentBranchRunner` over a
:class:`RayAgentRunner`) runs the very same step as in process: same trees, same
ledger, for the same seeds (``tests/train/test_distributed.py``), plus the work re-done after
an actor died, booked apart (``recovered_episodes``, ``redone_env_steps``,
``reissued_completions``).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from trace_gym.agent.loop import AgentConfig, AgentRunner, Episode
from trace_gym.budget import BudgetLedger
from trace_gym.train.distributed.env_pool import EnvPoolGroup, PoolExecutor
from trace_gym.env.contract import Snapshot
from trace_gym.agent.rollout import AgentBranchRunner
from trace_gym.types import SamplingParams, Task


class RayAgentRunner(AgentRunner):
    """:class:`~trace_gym.agent.loop.AgentRunner` whose envs live in env pools.

    Args:
        engine: a ``RolloutEngine``; normally an
            :class:`~trace_gym.train.distributed.engines.EngineGroup` (any engine works).
        tokenizer: the policy's tokenizer (chat template required), on the driver.
        pools: the env pools (their factory is the env family).
        sampling / config: as for :class:`~trace_gym.agent.loop.AgentRunner`.
    """

    def __init__(self, engine: Any, tokenizer: Any, pools: EnvPoolGroup, sampling: SamplingParams,
                 config: AgentConfig = AgentConfig()):
        super().__init__(engine, tokenizer, pools.make_env, sampling, config)
        self._pool.shutdown(wait=False)  # the base class's env threads: replaced by the pools
        self._pool = PoolExecutor(pools)  # type: ignore[assignment]
        self.pools = pools

    def _open(self, jobs: list[tuple[Task, int, Snapshot | None]], ledger: BudgetLedger) -> list[tuple]:
        t0 = time.perf_counter()
        rows = self._pool.open(jobs)
        ledger.add_seconds("environment", time.perf_counter() - t0)
        for (_, _, _, error, _, replay), (_, _, snapshot) in zip(rows, jobs):
            if snapshot is not None and error is None:
                ledger.add_replayed_env_steps(replay)
        ledger.add_seconds("environment_busy", sum(row[4] for row in rows))
        return [row[:4] for row in rows]

    def _generate(self) -> None:
        before = getattr(self.engine, "reissued_completions", 0)
        ledger = self._ready[0].ledger if self._ready else None
        super()._generate()
        self._pool.flush()  # the round's env steps: one call per pool, now
        reissued = getattr(self.engine, "reissued_completions", 0) - before
        if reissued and ledger is not None:
            ledger.add_reissued_completions(reissued)

    def _take_env_results(self) -> None:
        self._pool.flush()  # closes submitted since the last round
        super()._take_env_results()

    def _record(self, ep: Episode, payload: Any, *result: Any) -> None:
        episodes, steps = self._pool.take_redone(ep.uid)
        if episodes or steps:
            ep.ledger.add_recovered(episodes, steps)
        super()._record(ep, payload, *result)

    def cancel(self) -> None:
        self._pool.flush()
        super().cancel()


class RayBranchRunner(AgentBranchRunner):
    """The step driver's :class:`~trace_gym.step.driver.BranchRunner` on env pools and rollout
    workers: an :class:`~trace_gym.agent.rollout.AgentBranchRunner` over a :class:`RayAgentRunner`.

    Close it (``runner.agent.close()``) after the step, as with the in-process runner.
    """

    def __init__(self, engine: Any, tokenizer: Any, pools: EnvPoolGroup, sampling: SamplingParams,
                 config: AgentConfig = AgentConfig(), seed: int = 0):
        super().__init__(RayAgentRunner(engine, tokenizer, pools, sampling, config), seed)


def trajectories(trees: Sequence[Any]) -> list[tuple]:
    """Every leaf's full trajectory as ``(task id, token ids, loss mask, reward)``: the
    multiset a distributed step must reproduce (each exactly once)."""
    out = []
    for tree in trees:
        for leaf in tree.leaves():
            tokens, mask = tree.context(leaf.id)
            out.append((tree.task_id, tuple(tokens), tuple(mask), leaf.reward))
    return out
