"""The distributed driver's logic in one process (no Ray): the same actor bodies
(env pools, rollout workers with real tiny HF engines) called through the in-process
transport. Routing, seed-preserving sharding, per-pool batching, recovery from env
snapshots after a pool dies, re-issue after a worker dies, version checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from distributed_fixtures import (AGENT, ENGINE_KW, LOGPROB_TOL, MAKE_ENV, SAMPLING, assert_same_step,
                                  run_step)

from trace_gym.agent.loop import AgentRunner
from trace_gym.train.distributed.engines import (
    EngineGroup,
    RolloutWorker,
    Router,
    StaleWeightsError,
    pack_weights,
    prefix_hashes,
    unpack_weights,
)
from trace_gym.train.distributed.env_pool import EnvPool, EnvPoolGroup
from trace_gym.train.distributed.runner import RayAgentRunner
from trace_gym.train.distributed.transport import ActorDied, LocalTransport
from trace_gym.types import SamplingParams



# ---------------------------------------------------------------------- pure pieces
def test_prefix_hashes_identify_prefixes():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 5, size=int(rng.integers(1, 9))).tolist() for _ in range(300)]
    table = {}
    for s in seqs:
        for length, h in zip(range(1, len(s) + 1), prefix_hashes(s).tolist()):
            table.setdefault(h, set()).add(tuple(s[:length]))
    assert all(len(v) == 1 for v in table.values())  # no collisions among distinct prefixes
    assert prefix_hashes([3, 1, 4])[:2].tolist() == prefix_hashes([3, 1, 9, 9])[:2].tolist()


def test_router_is_sticky_within_a_fair_share():
    r = Router()
    a, b, c = [1, 2, 3], [7, 8, 9], [1, 2, 5]
    first = r.assign([a, b], [2, 2], [0, 1])
    assert sorted(len(v) for v in first.values()) == [1, 1]  # balanced when nothing is known
    owner_a = next(w for w, idx in first.items() if 0 in idx)
    # a's next turn extends a: same worker; c shares only [1, 2] with a, which was never a prefix sent
    nxt = r.assign([a + [4, 4], b + [6], c], [1, 1, 1], [0, 1])
    assert 0 in nxt[owner_a] and 1 in nxt[1 - owner_a]
    assert r.sticky == 2
    # a worker at ceil(1.25 x its fair share) + 1 rows takes no more: 8 rows of one owner are split
    crowd = r.assign([a + [4, 4, k] for k in range(8)], [1] * 8, [0, 1])
    assert len(crowd[owner_a]) == 6 and len(crowd[1 - owner_a]) == 2
    r.forget_worker(owner_a)
    assert r.assign([a + [4, 4]], [1], [0, 1]) in ({0: [0]}, {1: [0]})
    with pytest.raises(RuntimeError, match="no live rollout worker"):
        r.assign([a], [1], [])


def test_weights_pack_and_unpack_exactly():
    torch = pytest.importorskip("torch")
    named = [("w", torch.randn(3, 4)), ("b", torch.randn(5).to(torch.bfloat16)), ("h", torch.randn(2).half())]
    back = dict(unpack_weights(pack_weights(named)))
    for name, t in named:
        assert back[name].dtype == t.dtype and torch.equal(back[name], t)


# ---------------------------------------------------------------------- real engines and envs, local transport
@pytest.fixture(scope="module")
def local(tiny_model_path):  # noqa: F811
    """Two rollout workers and two env pools as plain objects behind the local transport."""
    from transformers import AutoTokenizer

    transport = LocalTransport(threads=8)
    workers = [RolloutWorker("hf", str(tiny_model_path), ENGINE_KW) for _ in range(2)]
    pools = [EnvPool(MAKE_ENV, threads=2, name=f"pool-{i}") for i in range(2)]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    yield transport, workers, pools, tokenizer
    transport.shutdown()


def _groups(local, spawn=False):
    transport, workers, pools, tokenizer = local
    engine = EngineGroup(list(workers), transport, tokenizer)
    group = EnvPoolGroup(list(pools), transport, MAKE_ENV)
    return engine, group


@pytest.fixture(scope="module")
def reference(tiny_model_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine

    engine = HFEngine(tiny_model_path, **ENGINE_KW)
    batch = run_step(lambda: AgentRunner(engine, engine.tokenizer, MAKE_ENV, SAMPLING, AGENT))
    engine.close()
    return batch


def test_sharded_generate_draws_the_same_samples(local, tiny_model_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine

    engine, _ = _groups(local)
    one = HFEngine(tiny_model_path, **ENGINE_KW)
    rng = np.random.default_rng(5)
    prefixes = [rng.integers(0, 40000, size=int(n)).tolist() for n in (12, 30, 7, 21, 16)]
    n = [2, 0, 3, 1, 2]
    sampling = SamplingParams(temperature=1.0, seed=7, max_tokens=12)
    want = one.generate(prefixes, n, sampling)
    got = engine.generate(prefixes, n, sampling)
    assert [[c.token_ids for c in cs] for cs in got] == [[c.token_ids for c in cs] for cs in want]
    assert max(abs(x - y) for cs, ws in zip(got, want) for c, w in zip(cs, ws)
               for x, y in zip(c.logprobs, w.logprobs)) <= LOGPROB_TOL
    assert engine.calls == 1 and engine.reissued_completions == 0


def test_local_step_equals_the_in_process_step_with_batched_env_calls(local, reference):
    engine, group = _groups(local)
    runners = []

    def make():
        runners.append(RayAgentRunner(engine, engine.tokenizer, group, SAMPLING, AGENT))
        return runners[-1]

    batch = run_step(make)
    assert_same_step(reference, batch)
    # batched: each round sends one step call per pool, not one per env step
    rounds = runners[0]._calls  # generate calls (one per round here: one token budget)
    assert runners[0]._pool.calls["step"] <= 2 * rounds < batch.ledger.env_steps == 24
    assert sum(group.load) == 0  # every env closed


def test_dead_pool_and_dead_worker_are_recovered_locally(local, reference, tiny_model_path):  # noqa: F811
    transport, workers, pools, tokenizer = local
    fresh_workers = [RolloutWorker("hf", str(tiny_model_path), ENGINE_KW) for _ in range(2)]
    fresh_pools = [EnvPool(MAKE_ENV, threads=2) for _ in range(2)]
    engine = EngineGroup(fresh_workers, transport, tokenizer)
    group = EnvPoolGroup(fresh_pools, transport, MAKE_ENV)
    killed = []

    def drill(call, futures):
        if call == 2:  # episodes on pool 0 are mid-episode, waiting for their second turn
            transport.kill(fresh_pools[0])
            killed.append("pool")
        if call >= 3 and "worker" not in killed and len(futures) == 2:  # mid-generation: its call is out
            transport.kill(fresh_workers[0])
            killed.append("worker")

    engine.on_dispatch = drill
    batch = run_step(lambda: RayAgentRunner(engine, tokenizer, group, SAMPLING, AGENT))
    assert killed == ["pool", "worker"]
    assert_same_step(reference, batch)
    led = batch.ledger
    assert led.recovered_episodes > 0 and led.redone_env_steps >= led.recovered_episodes
    assert led.reissued_completions > 0
    assert group.alive == [False, True] and engine.alive == [False, True]
    with pytest.raises(RuntimeError, match="every env pool is dead"):
        transport.kill(fresh_pools[1])
        group.mark_dead(1)
        group.place(1)


def test_a_worker_with_other_weights_refuses_to_serve(local):
    transport, workers, pools, tokenizer = local
    engine = EngineGroup([workers[0]], transport, tokenizer)
    engine._version = 4  # the driver believes version 4 was pushed; the worker holds 0
    with pytest.raises(StaleWeightsError, match="holds weights version 0, the driver expects version 4"):
        engine.generate([[1, 2, 3]], [1], SAMPLING)


def test_weight_update_reaches_every_worker(local, tiny_model_path):  # noqa: F811
    import torch

    from trace_gym.engines.hf import HFEngine

    transport, _, _, tokenizer = local
    workers = [RolloutWorker("hf", str(tiny_model_path), ENGINE_KW) for _ in range(2)]
    engine = EngineGroup(workers, transport, tokenizer)
    one = HFEngine(tiny_model_path, **ENGINE_KW)
    new = [(name, p.detach() * 0.5) for name, p in one.model.named_parameters()]
    one.update_weights(new, 3)
    engine.update_weights(new, 3)
    assert engine.weights_version == 3 and [w.engine.weights_version for w in workers] == [3, 3]
    prefixes = [[5, 6, 7, 8], [9, 10, 11]]
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    assert ([[c.token_ids for c in cs] for cs in engine.generate(prefixes, [1, 1], greedy)]
            == [[c.token_ids for c in cs] for cs in one.generate(prefixes, [1, 1], greedy)])
    params = dict(workers[1].engine.model.named_parameters())
    assert all(torch.equal(params[name], t) for name, t in new)
    transport.kill(workers[0])
    assert engine.generate(prefixes, [1, 1], greedy)  # the other worker serves; the dead one is dropped
    assert engine.alive == [False, True] and engine.reissued_completions >= 1


def test_local_transport_runs_calls_in_order_and_kills():
    transport = LocalTransport(threads=4)

    class Counter_:
        def __init__(self):
            self.seen = []

        def add(self, x):
            self.seen.append(x)
            return x

    a = Counter_()
    futures = [transport.call(a, "add", i) for i in range(50)]
    assert [f.result() for f in futures] == list(range(50)) and a.seen == list(range(50))
    transport.kill(a)
    with pytest.raises(ActorDied):
        transport.call(a, "add", 1).result()
    transport.shutdown()


# ---------------------------------------------------------------------- configuration
def test_ray_options_name_bad_values():
    from trace_gym.train.distributed.backend import ray_options

    assert ray_options({"rollout_workers": "4", "trainer_shard": "true"}).rollout_workers == 4
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['rollout_worker'\]"):
        ray_options({"rollout_worker": 2})
    with pytest.raises(ValueError, match="ray_options.env_pools must be >= 1, got 0"):
        ray_options({"env_pools": 0})
    with pytest.raises(ValueError, match="ray_options.worker_gpus must be >= 0, got -0.5"):
        ray_options({"worker_gpus": -0.5})


RAY_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "ray").glob("*.yaml"))


@pytest.mark.parametrize("path", RAY_CONFIGS, ids=lambda p: p.name)
def test_ray_configs_resolve(path, tmp_path):
    from trace_gym.cli import main
    from trace_gym.train.distributed.backend import ray_options
    from trace_gym.config import load_config
    from trace_gym.train.config import TrainConfig

    cfg = load_config(TrainConfig, path)
    opts = ray_options(cfg.ray_options)
    assert cfg.ray == "local" and cfg.nominal_budget == 2048 and cfg.root_budget == 1024
    assert opts.trainer_shard and opts.rollout_workers * opts.worker_gpus + opts.trainer_workers * opts.trainer_gpus == 8
    assert opts.env_pools * opts.envs_per_pool >= 3 * cfg.root_budget  # roots + continuations live at once
    # the LM critic on the GPU, in bf16 (checked against its constructor by --dry-run below)
    assert cfg.predictor == "lm_critic" and cfg.predictor_kwargs == {"device": "cuda", "dtype": "bfloat16"}
    assert main(["train", "--config", str(path), "--dry-run", "--ray", "auto", f"run_dir={tmp_path / 'r'}"]) == 0


def test_check_fits_names_what_each_role_asks():
    from trace_gym.train.distributed.backend import check_fits, ray_options, resource_demand

    opts = ray_options({"rollout_workers": 1, "trainer_workers": 1, "env_pools": 2, "pool_cpus": 0.5})
    assert resource_demand(opts) == {"CPU": 3.0, "GPU": 0.0}
    check_fits(opts, {"CPU": 3.0})  # exactly full is fine
    with pytest.raises(ValueError, match=r"ask for 3 CPU \(1 rollout workers x 1, 2 env pools x 0.5, "
                                         r"1 trainer ranks x 1\) but the cluster has 2; .*num_cpus"):
        check_fits(opts, {"CPU": 2.0})
    gpu = ray_options({"rollout_workers": 8, "worker_gpus": 0.5, "trainer_workers": 8, "trainer_gpus": 0.75})
    with pytest.raises(ValueError, match=r"ask for 10 GPU .* but the cluster has 8; lower worker_gpus"):
        check_fits(gpu, {"CPU": 64.0, "GPU": 8.0})
    # 1.8 GPUs in all fit in 2 by sum, but three 0.6 shares need three devices
    over_half = ray_options({"rollout_workers": 3, "worker_gpus": 0.6, "trainer_workers": 0})
    with pytest.raises(ValueError, match=r"3 x worker_gpus=0.6 need 3 GPUs of their own .* the cluster has 2"):
        check_fits(over_half, {"CPU": 8.0, "GPU": 2.0})
    check_fits(over_half, {"CPU": 8.0, "GPU": 3.0})
    # the paper configs' colocation: 8 workers and 8 ranks at 0.5 on 8 devices
    check_fits(ray_options({"rollout_workers": 8, "worker_gpus": 0.5, "trainer_workers": 8, "trainer_gpus": 0.5}),
               {"CPU": 64.0, "GPU": 8.0})
    # shares count at Ray's 1e-4 granularity: three 0.33334 shares fit one device, as Ray places them
    check_fits(ray_options({"rollout_workers": 3, "worker_gpus": 0.33334, "trainer_workers": 0}), {"CPU": 8.0, "GPU": 1.0})
    no_trainer_actors = ray_options({"rollout_workers": 2, "trainer_workers": 0, "env_pools": 2})
    assert resource_demand(no_trainer_actors)["CPU"] == 4.0
