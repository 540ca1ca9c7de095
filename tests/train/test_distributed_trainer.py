"""The data-parallel policy update: 2 gloo ranks (Ray actors) vs the single-process update.

Tolerance: the ranks sum their rows' gradients in another order than one process does,
so float32 gradients agree to ~1e-6 relative, and after AdamW steps (lr 1e-3) the
parameters agree within ``PARAM_ATOL`` = 1e-5 absolute (1 % of one step's size); the two
ranks' replicas are bit-identical to each other.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_gym.train.batches import TokenNode, TokenTree
from trace_gym.train.distributed.trainer import combine_metrics, deal_rows
from trace_gym.train.trainer import TrainerConfig

PARAM_ATOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-7
# one thread on every side (the single process and each rank), pinned here, not by the caller's
# OMP_NUM_THREADS: another thread count changes float reductions (8e-5 apart against PARAM_ATOL)
CONFIG = TrainerConfig(lr=1e-3, micro_batch_tokens=64, max_grad_norm=1.0, cpu_threads=1)


def test_deal_rows_by_hand():
    # largest first: 50 -> r0 (50), 40 -> r1 (40), 20 -> r1 (60), 10 -> r0 (60)
    assert deal_rows([10, 50, 20, 40], 2) == [0, 0, 1, 1]
    assert deal_rows([5, 5, 5], 1) == [0, 0, 0]
    assert deal_rows([], 3) == []
    with pytest.raises(ValueError, match="world_size must be >= 1, got 0"):
        deal_rows([1], 0)


def test_combine_metrics_by_hand():
    a = {"loss": 1.0, "pg_loss": 0.5, "kl": 0.0, "entropy": 2.0, "clip_fraction_low": 0.0, "clip_fraction_high": 0.5,
         "mismatch_abs": 0.1, "mismatch_kl": 0.01, "is_weight_mean": math.nan, "grad_norm": 3.0, "lr": 0.1,
         "micro_batches": 2.0, "row_tokens": 100.0, "trained_tokens": 30.0, "policy_tokens": 90.0, "seconds": 1.0}
    b = dict(a, loss=-0.25, pg_loss=0.25, entropy=4.0, clip_fraction_high=0.0, trained_tokens=10.0, micro_batches=1.0,
             row_tokens=40.0, seconds=2.0)
    out = combine_metrics([a, b])
    assert out["loss"] == 0.75 and out["pg_loss"] == 0.75
    assert out["entropy"] == pytest.approx((2.0 * 30 + 4.0 * 10) / 40)
    assert out["clip_fraction_high"] == pytest.approx(0.5 * 30 / 40)
    assert (out["micro_batches"], out["row_tokens"], out["trained_tokens"]) == (3.0, 140.0, 40.0)
    assert out["grad_norm"] == 3.0 and out["policy_tokens"] == 90.0 and out["seconds"] == 2.0
    assert math.isnan(out["is_weight_mean"])


def random_trees(n_trees: int, seed: int, vocab: int = 2000) -> list[TokenTree]:
    """Trees with a prompt, 3 root rollouts of 2 turns and a continuation from one of them."""
    rng = np.random.default_rng(seed)
    toks = lambda k: tuple(int(t) for t in rng.integers(10, vocab, size=k))  # noqa: E731
    trees = []
    for _ in range(n_trees):
        nodes = [TokenNode(-1, toks(int(rng.integers(6, 14))), 0)]
        for b in range(3):
            n_pol = int(rng.integers(3, 9))
            nodes.append(TokenNode(0, toks(n_pol + 4), n_pol, ((b, float(rng.normal())),),
                                   tuple(float(x) for x in -rng.random(n_pol) * 3), b))
            parent = len(nodes) - 1
            n_pol = int(rng.integers(2, 7))
            nodes.append(TokenNode(parent, toks(n_pol), n_pol, ((b, float(rng.normal())),), (), b))
        n_pol = int(rng.integers(2, 6))
        nodes.append(TokenNode(1, toks(n_pol), n_pol, ((3, float(rng.normal())),), (), 3))
        trees.append(TokenTree(tuple(nodes)))
    return trees


@pytest.mark.parametrize("shard", [False, True], ids=["replicas", "fsdp2"])
def test_two_gloo_ranks_update_like_one_process(cluster, tiny_model_path, shard, tmp_path):  # noqa: F811
    """Replicas (one gradient all-reduce) and FSDP2 (sharded parameters, gradients and AdamW
    state) on 2 gloo ranks against one process: gradient, two AdamW steps, metrics, and
    (sharded) the checkpoint's full weights."""
    import torch

    from trace_gym.train.distributed.engines import unpack_weights
    from trace_gym.train.distributed.trainer import TrainerGroup
    from trace_gym.train.trainer import PolicyTrainer

    torch.set_num_threads(1)
    batches = [random_trees(3, seed=1), random_trees(2, seed=2)]
    single = PolicyTrainer(tiny_model_path, CONFIG, total_steps=2, device="cpu", seed=0)
    group = TrainerGroup(tiny_model_path, CONFIG, total_steps=2, device="cpu", seed=0, world_size=2, num_threads=1,
                         shard=shard)
    try:
        # the all-reduced gradient is the single-process gradient
        want = single.gradients(batches[0])
        got = group.gradients(batches[0])
        assert set(got) == set(want)
        for name, g in want.items():
            torch.testing.assert_close(got[name], g, rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
        # two AdamW steps: same parameters within PARAM_ATOL, the replicas identical
        for trees in batches:
            m_single = single.step(trees)
            m_group = group.step(trees)
            assert m_group["trained_tokens"] == m_single["trained_tokens"]
            assert m_group["micro_batches"] == m_single["micro_batches"] >= 2  # rows were really split
            assert m_group["loss"] == pytest.approx(m_single["loss"], rel=1e-5, abs=1e-7)
            assert m_group["grad_norm"] == pytest.approx(m_single["grad_norm"], rel=1e-5)
            assert m_group["entropy"] == pytest.approx(m_single["entropy"], rel=1e-5)
        packed = cluster_get([a.packed_weights.remote(True) for a in group.ranks])  # a collective when sharded
        ranks = [dict(unpack_weights(p)) for p in packed]
        worst = 0.0
        moved = 0.0
        start = dict(PolicyTrainer(tiny_model_path, CONFIG, device="cpu").named_weights())
        for name, p in single.named_weights():
            assert torch.equal(ranks[0][name], ranks[1][name]), name  # the replicas never drift
            worst = max(worst, float((ranks[0][name] - p).abs().max()))
            moved = max(moved, float((p - start[name]).abs().max()))
        assert worst <= PARAM_ATOL, worst
        assert moved > 100 * PARAM_ATOL  # the update is large against the tolerance
        assert group.updates == single.updates == 2
        # the checkpoint holds the full weights (a sharded group gathers them), loadable in one process
        group.save(tmp_path / "ckpt")
        back = dict(PolicyTrainer(tmp_path / "ckpt" / "policy", CONFIG, device="cpu").named_weights())
        assert max(float((back[n] - p).abs().max()) for n, p in single.named_weights()) <= PARAM_ATOL
        files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
        assert files == (["policy", "trainer-rank0-of-2.pt", "trainer-rank1-of-2.pt"] if shard
                         else ["policy", "trainer.pt"])
        group.load_state(tmp_path / "ckpt")
        assert group.updates == 2
    finally:
        group.close()


def cluster_get(ref):
    import ray

    return ray.get(ref)


@pytest.mark.slow  # ~26 s; test_two_gloo_ranks_update_like_one_process covers the gloo group, test_distributed.py
# the workers' weight sync through the object store and a killed rollout worker
def test_weights_broadcast_from_trainer_rank_0_to_rollout_workers(cluster, tiny_model_path):  # noqa: F811
    """The collective path (gloo here, NCCL across GPU nodes): FSDP2 ranks gather, rank 0
    broadcasts, every rollout worker loads and reports the version; a replaced worker joins
    a rebuilt group at the next sync."""
    import ray

    from trace_gym.train.distributed.launch import launch_rollout_workers
    from trace_gym.train.distributed.trainer import TrainerGroup
    from trace_gym.engines.hf import HFEngine
    from trace_gym.types import SamplingParams

    kw = {"dtype": "float32", "device": "cpu", "prefix_cache_bytes": 0}
    group = TrainerGroup(tiny_model_path, CONFIG, world_size=2, device="cpu", num_threads=1, shard=True,
                         weight_sync="broadcast")
    engine = launch_rollout_workers("hf", str(tiny_model_path), 2, engine_kwargs=kw, num_cpus=0.5, num_threads=1)
    reference = HFEngine(tiny_model_path, **kw)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    prefixes = [[5, 6, 7, 8], [9, 10, 11], [300, 301]]

    def served():
        return [c[0].token_ids for c in engine.generate(prefixes, [1, 1, 1], greedy)]

    try:
        before = served()
        for version in (1, 2):
            group.step(random_trees(3, seed=version))
            group.sync_weights(engine, version=version)
            reference.update_weights(group.named_weights(), version)
            assert [ray.get(w.weights_version.remote()) for w in engine.workers] == [version, version]
            assert served() == [c[0].token_ids for c in reference.generate(prefixes, [1, 1, 1], greedy)]
            if version == 1:
                assert served() != before  # the update changed what the workers serve
                ray.kill(engine.workers[0])
                served()  # the death is found (and the request re-issued) mid-step
                assert engine.alive == [False, True]
        assert engine.alive == [True, True] and group._broadcast.rebuilds == 2
    finally:
        engine.close()
        group.close()
