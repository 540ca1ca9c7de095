"""The step on a local Ray cluster (CPU): 2 rollout workers (tiny HF model) and 2 env pools.

Done-when tests of the Ray backend: the same trees and ledger as the in-process step for
the same seeds; ``ray.kill`` of an env actor mid-episode and of a rollout worker
mid-generation, after which the step still completes with every trajectory once and the
re-done work in the ledger; weights through the object store with version checks.
Skips with the reason when Ray is missing or cannot start here.
"""

from __future__ import annotations

import time

import pytest
from distributed_fixtures import AGENT, ENGINE_KW, MAKE_ENV, SAMPLING, assert_same_step, run_step

from trace_gym.agent.loop import AgentRunner
from trace_gym.train.distributed.cluster import ray_available
from trace_gym.train.distributed.runner import RayAgentRunner
from trace_gym.types import SamplingParams

ok, why = ray_available()
pytestmark = pytest.mark.skipif(not ok, reason=why)


@pytest.fixture(scope="module")
def actors(cluster, tiny_model_path):  # noqa: F811
    from trace_gym.train.distributed.launch import launch_env_pools, launch_rollout_workers

    pools = launch_env_pools(MAKE_ENV, 2, num_cpus=0.5, threads=2)
    # 0.15 s inside each generate call before decoding: a fault drill can see the call running
    engine = launch_rollout_workers("hf", str(tiny_model_path), 2, engine_kwargs=ENGINE_KW, num_cpus=1,
                                    num_threads=1, latency_seconds=0.15)
    yield pools, engine
    engine.close()
    pools.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine

    engine = HFEngine(tiny_model_path, **ENGINE_KW)
    batch = run_step(lambda: AgentRunner(engine, engine.tokenizer, MAKE_ENV, SAMPLING, AGENT))
    engine.close()
    return batch


def test_ray_step_equals_the_in_process_step(actors, reference):
    import ray

    pools, engine = actors
    runner = RayAgentRunner(engine, engine.tokenizer, pools, SAMPLING, AGENT)
    batch = run_step(lambda: runner)
    assert_same_step(reference, batch)
    assert batch.ledger.env_steps > 2 * len(batch.trees)  # multi-turn episodes, continuations included
    led = batch.ledger
    assert (led.recovered_episodes, led.redone_env_steps, led.reissued_completions) == (0, 0, 0)
    # batched: at most one step call per pool per round, not one call per env step
    rounds = runner._calls  # generate calls (one per round here: one token budget)
    assert runner._pool.calls["step"] <= 2 * rounds < led.env_steps
    stats = pools.stats()
    assert sum(s["steps"] for s in stats) >= led.env_steps and all(s["live"] == 0 for s in stats)
    names = ray.util.list_named_actors()
    assert sum(n.startswith("trace_gym/env-pool-") for n in names) >= 2
    assert sum(n.startswith("trace_gym/rollout-worker-") for n in names) >= 2


def test_weights_through_the_object_store_and_version_checks(actors, tiny_model_path):  # noqa: F811
    import torch

    from trace_gym.train.distributed.engines import StaleWeightsError
    from trace_gym.engines.hf import HFEngine

    _, engine = actors
    one = HFEngine(tiny_model_path, **ENGINE_KW)
    original = [(name, p.detach().clone()) for name, p in one.model.named_parameters()]
    scaled = [(name, t * 0.5) for name, t in original]
    one.update_weights(scaled, 5)
    engine.update_weights(scaled, 5)
    assert engine.weights_version == 5
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    prefixes = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]
    got = engine.generate(prefixes, [1, 1, 1], greedy)
    assert [c[0].token_ids for c in got] == [c[0].token_ids for c in one.generate(prefixes, [1, 1, 1], greedy)]
    # a worker that holds another version refuses to serve, naming both
    engine.transport.call(engine.workers[1], "update_weights", engine.transport.put({}), 9).result()
    with pytest.raises(StaleWeightsError, match="holds weights version 9, the driver expects version 5"):
        engine.generate(prefixes, [1, 1, 1], greedy)
    engine.update_weights(original, 6)  # back to the original weights for the next tests
    assert [engine.transport.call(w, "weights_version").result() for w in engine.workers] == [6, 6]
    assert torch.equal(dict(one.model.named_parameters())[original[0][0]], scaled[0][1])
    one.close()


def test_ray_kill_of_an_env_actor_and_a_rollout_worker_mid_step(actors, reference):
    """ray.kill of env pool 0 while its episodes are mid-episode (after their first turn),
    and of a rollout worker while its generate call is running: the step completes, with
    the in-process step's trajectories each exactly once and the re-done work counted."""
    import ray

    pools, engine = actors
    seen = {}
    start = engine.calls

    def drill(call, futures):
        call -= start  # this step's generate calls, from 1
        if call == 2:  # every episode has stepped once; pool 0's envs hold live episodes
            ray.kill(pools.pools[0])
            seen["pool"] = call
        if call >= 3 and "worker" not in seen and len(futures) == 2:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not engine.transport.call(engine.workers[0], "busy").result():
                time.sleep(0.005)
            seen["busy"] = engine.transport.call(engine.workers[0], "busy").result()
            ray.kill(engine.workers[0])
            seen["worker"] = call

    engine.on_dispatch = drill
    try:
        batch = run_step(lambda: RayAgentRunner(engine, engine.tokenizer, pools, SAMPLING, AGENT))
    finally:
        engine.on_dispatch = None
    assert seen.get("pool") == 2 and seen.get("worker", 0) >= 3 and seen["busy"] is True
    assert_same_step(reference, batch)
    led = batch.ledger
    assert led.recovered_episodes > 0 and led.redone_env_steps >= led.recovered_episodes
    assert led.reissued_completions > 0
    assert pools.alive == [False, True] and engine.alive == [False, True]
    # replacements: a fresh pool, and a fresh worker that gets the current weights before serving
    assert pools.revive() == 1 and engine.revive() == 1
    assert engine.transport.call(engine.workers[0], "weights_version").result() == engine.weights_version
    again = run_step(lambda: RayAgentRunner(engine, engine.tokenizer, pools, SAMPLING, AGENT))
    assert_same_step(reference, again)
