"""The trainer on a real (tiny, random) Llama: packed trees compute the unpacked log-probabilities,
observation and prompt tokens get zero gradient, a TreeRPO step trains each shared prefix edge
once, micro-batching does not change the gradient, and the engine matches after a weight sync."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trace_gym.train.advantages import PathAdvantages, grpo, tree_grpo, treerpo
from trace_gym.train.batches import LOSS_AGGREGATIONS, slot_bases, token_tree
from trace_gym.train.trainer import PolicyTrainer, TrainerConfig
from trace_gym.tree import ROOT, RolloutTree

#: HF engine (float32) vs the trainer (float32) on the same weights, nats per token. Both run
#: the same model code; the difference is batching/kernel order only (measured ~1e-6).
FP32_TOL = 1e-4


def assert_grads_close(got, want):
    """Same gradients up to float32 summation order: relative error of each tensor's norm."""
    assert set(got) == set(want)
    for name in want:
        err = float((got[name] - want[name]).norm())
        assert err <= 1e-4 * float(want[name].norm()) + 1e-8, (name, err, float(want[name].norm()))


def rollout(tree, anchor, turns, reward, rng):
    b = tree.start_branch(anchor)
    node = anchor
    for t in range(turns):
        last = t == turns - 1
        k, o = int(rng.integers(2, 6)), 0 if last else int(rng.integers(1, 4))
        node = tree.add_turn(node, branch=b, policy_token_ids=rng.integers(100, 40000, k).tolist(),
                             observation_token_ids=rng.integers(100, 40000, o).tolist(),
                             logprobs=(-rng.random(k)).tolist(), reward=reward if last else None, terminal=last)
    return node


def shared_prefix_tree(seed=0) -> tuple[RolloutTree, int]:
    """Two root rollouts of 3 turns; three continuations from the first rollout's first turn."""
    rng = np.random.default_rng(seed)
    tree = RolloutTree("t", rng.integers(100, 40000, 7).tolist())
    rollout(tree, ROOT, 3, 0.0, rng)
    rollout(tree, ROOT, 3, 1.0, rng)
    a1 = tree.nodes[ROOT].children[0]
    for r in (1.0, 0.0, 1.0):
        rollout(tree, a1, 2, r, rng)
    return tree, a1


@pytest.fixture(scope="module")
def trainer(tiny_model_path):  # noqa: F811
    return PolicyTrainer(tiny_model_path, TrainerConfig(lr=1e-3, micro_batch_tokens=10_000), total_steps=4)


def test_packed_row_logprobs_equal_unpacked_forwards(trainer):
    tree, _ = shared_prefix_tree(1)
    tt = token_tree(tree, treerpo(tree))
    rows, _ = trainer._rows([tt])
    base, _ = slot_bases([tt])
    got = torch.zeros(tt.policy_tokens)
    with torch.no_grad():
        for row in rows:
            got[row.slots] = trainer.row_logprobs(row)[0]
        for n in tree.nodes[1:]:
            context, _ = tree.context(n.parent)
            ids = torch.tensor([context + list(n.policy_token_ids)])
            lp = torch.log_softmax(trainer.model(input_ids=ids).logits[0, :-1].float(), -1)
            want = lp.gather(-1, ids[0, 1:, None])[-len(n.policy_token_ids):, 0]
            slot = base[(0, n.id)]
            if tt.nodes[n.id].advantage != 0:  # zero-advantage nodes are not run
                assert got[slot:slot + len(want)].tolist() == pytest.approx(want.tolist(), abs=1e-5)


def test_observation_and_prompt_tokens_get_exactly_zero_gradient(trainer):
    tree, _ = shared_prefix_tree(2)
    tt = token_tree(tree, grpo(tree))
    (row,), _ = trainer._rows([tt])
    kind = []  # every row position: prompt / policy / observation, from the tree itself
    for v in sorted(set(row.node_index.tolist())):
        n = tree.nodes[v]
        full = v in {tree.nodes[c].parent for c in range(len(tree.nodes))}
        kind += (["prompt"] * len(n.observation_token_ids) if v == ROOT else
                 ["policy"] * len(n.policy_token_ids) + (["observation"] * len(n.observation_token_ids) if full else []))
    assert len(kind) == len(row)
    # the log-probability of every row token under its context, as one leaf the loss reads from
    ids = row.input_ids[None]
    logits = trainer.model(input_ids=ids, position_ids=row.position_ids[None], attention_mask=row.attention_mask(),
                           use_cache=False).logits[0].float()
    all_lp = torch.log_softmax(logits, -1)
    token_lp = torch.full((len(row),), float("nan"))
    token_lp[row.targets] = all_lp[row.predictors, row.input_ids[row.targets]].detach()
    leaf = torch.zeros(len(row), requires_grad=True)
    with torch.no_grad():
        leaf.copy_(torch.nan_to_num(token_lp))
    from trace_gym.train.trainer import ppo_clip_loss

    logp = leaf[row.targets]
    loss, _ = ppo_clip_loss(logp, logp.detach(), row.pos, row.neg, row.weights, clip_low=0.2, clip_high=0.2)
    loss.backward()
    grad = leaf.grad
    for i, k in enumerate(kind):
        if k != "policy":
            assert grad[i].item() == 0.0, (i, k)
    policy = [i for i, k in enumerate(kind) if k == "policy"]
    assert sorted(row.targets.tolist()) == policy  # every policy token is trained, nothing else
    assert all(grad[i].item() != 0.0 for i in policy)  # grpo: every leaf has a non-zero advantage here


def branch_gradients(trainer, tree, adv, weight_of, per_leaf=False):
    """Reference gradient from plain causal forwards: one sequence per rollout (its anchor's
    context, then its own turns), each node trained once; or, with ``per_leaf``, one sequence
    per leaf with every node on its path trained (shared prefixes once per leaf)."""
    trainer.model.zero_grad(set_to_none=True)
    units = []
    if per_leaf:
        for leaf in tree.leaves():
            units.append((ROOT, tree.path(leaf.id)[1:]))
    else:
        for b in tree.branches:
            units.append((b.anchor, tree.branch_nodes(b.id)))
    for anchor, nodes in units:
        ids, trained = list(tree.context(anchor)[0]), []
        for v in nodes:
            n = tree.nodes[v]
            trained += [(len(ids) + k, v) for k in range(len(n.policy_token_ids))]
            ids += list(n.policy_token_ids) + list(n.observation_token_ids)
        x = torch.tensor([ids])
        lp = torch.log_softmax(trainer.model(input_ids=x).logits[0].float(), -1)
        pos = torch.tensor([p for p, _ in trained])
        logp = lp[pos - 1, x[0, pos]]
        a = torch.tensor([adv[v] for _, v in trained])
        w = torch.tensor([weight_of(v) for _, v in trained])
        (-(w * a * torch.exp(logp - logp.detach()))).sum().backward()
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_treerpo_step_trains_each_shared_prefix_edge_once(trainer):
    tree, a1 = shared_prefix_tree(3)
    adv = treerpo(tree)
    assert adv[a1] != 0 and len(tree.nodes[a1].children) == 4  # a shared prefix with its own advantage
    tt = token_tree(tree, adv)
    (row,), _ = trainer._rows([tt])
    # the shared prefix's tokens appear once in the row and are trained once
    assert int((row.node_index == a1).sum()) == len(tree.nodes[a1].policy_token_ids) + len(tree.nodes[a1].observation_token_ids)
    trained_a1 = [t for t in row.targets.tolist() if row.node_index[t] == a1]
    assert len(trained_a1) == len(tree.nodes[a1].policy_token_ids)
    n_policy = sum(len(n.policy_token_ids) for n in tree.nodes)
    got = trainer.gradients([tt])
    want = branch_gradients(trainer, tree, adv, lambda v: 1.0 / n_policy)
    assert_grads_close(got, want)
    # training the prefix once per leaf (flat sequences) is a different update
    naive = branch_gradients(trainer, tree, adv, lambda v: 1.0 / n_policy, per_leaf=True)
    diff = sum(float((naive[n] - got[n]).norm()) for n in got)
    assert diff > 1e-3 * sum(float(got[n].norm()) for n in got)


def test_micro_batching_does_not_change_the_gradient(tiny_model_path):  # noqa: F811
    trees = [shared_prefix_tree(s)[0] for s in (4, 5, 6)]
    tts = [token_tree(t, treerpo(t)) for t in trees]
    one = PolicyTrainer(tiny_model_path, TrainerConfig(micro_batch_tokens=100_000, loss_aggregation="seq-mean-token-mean"))
    small = PolicyTrainer(tiny_model_path, TrainerConfig(micro_batch_tokens=24, loss_aggregation="seq-mean-token-mean"))
    rows_one, _ = one._rows(tts)
    rows_small, _ = small._rows(tts)
    assert len(rows_one) == 1 and len(rows_small) > 3
    assert max(len(r) for r in rows_small) < max(len(r) for r in rows_one) / 3  # memory bounded by the micro-batch
    g1, g2 = one.gradients(tts), small.gradients(tts)
    assert_grads_close(g2, g1)


def test_step_then_sync_gives_the_engine_the_trainers_logprobs(tiny_model_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine

    engine = HFEngine(tiny_model_path, dtype="float32", device="cpu", prefix_cache_bytes=0)
    trainer = PolicyTrainer(tiny_model_path, TrainerConfig(lr=5e-3, warmup_steps=0), total_steps=2)
    tree, _ = shared_prefix_tree(7)
    seq = tree.context(tree.leaves()[0].id)[0]
    before = engine.score([seq], start=1)[0]
    stats = trainer.step([token_tree(tree, grpo(tree))])
    assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0 and stats["trained_tokens"] > 0
    assert stats["clip_fraction_low"] == stats["clip_fraction_high"] == 0.0  # ratio 1 on the first pass
    assert 0 <= stats["mismatch_abs"] and stats["lr"] == pytest.approx(5e-3)
    after_trainer = trainer.score([seq])[0]
    assert max(abs(a - b) for a, b in zip(before, after_trainer)) > 100 * FP32_TOL  # the step moved the policy
    seconds = trainer.sync_weights(engine, version=1)
    assert engine.weights_version == 1 and seconds >= 0
    after_engine = engine.score([seq], start=1)[0]
    assert max(abs(a - b) for a, b in zip(after_engine, after_trainer)) < FP32_TOL

    class Stale:
        weights_version = 0

        def update_weights(self, named, version):
            list(named)

    with pytest.raises(RuntimeError, match="engine reports version 0, expected 2"):
        trainer.sync_weights(Stale(), version=2)
    engine.close()


def test_several_epochs_and_mini_batches_kl_and_tis(tiny_model_path):  # noqa: F811
    cfg = TrainerConfig(lr=1e-3, ppo_epochs=2, mini_batches=2, kl_coef=0.05, tis_cap=2.0, clip_high=0.28,
                        loss_aggregation="seq-mean-token-sum-norm", loss_norm_tokens=32, lr_schedule="cosine",
                        warmup_steps=1)
    trainer = PolicyTrainer(tiny_model_path, cfg, total_steps=3)
    trees = [token_tree(t, treerpo(t)) for t in (shared_prefix_tree(s)[0] for s in (8, 9))]
    first = trainer.step(trees)
    second = trainer.step(trees)
    assert first["lr"] == pytest.approx(5e-4) and second["lr"] == pytest.approx(1e-3)  # warm-up, then peak
    assert second["kl"] > 0  # moved away from the reference
    # the second epoch sees ratios != 1 against the step-start logprobs
    assert second["clip_fraction_low"] + second["clip_fraction_high"] > 0 or second["pg_loss"] != 0
    assert 0 < first["is_weight_mean"] <= 2.0
    # KL on: zero-advantage nodes are run too (their KL term has a gradient)
    assert first["trained_tokens"] == sum(t.policy_tokens for t in trees)


# -- the per-sequence objective against brute force, with the ratio away from 1 ----------------

def random_tree(seed: int) -> RolloutTree:
    """Root rollouts with both outcomes, and continuations of opposite outcomes from one inner
    node of the first (so a shared prefix holds leaves of both signs)."""
    rng = np.random.default_rng(seed)
    tree = RolloutTree("t", rng.integers(100, 40000, 5).tolist())
    rollout(tree, ROOT, 3, 0.0, rng)
    for r in rng.choice([0.0, 1.0], int(rng.integers(1, 3))).tolist() + [1.0]:
        rollout(tree, ROOT, int(rng.integers(1, 4)), float(r), rng)
    first = tree.nodes[ROOT].children[0]  # the 3-turn rollout that failed: its first turn is shared
    for r in (1.0, 1.0, 0.0):
        rollout(tree, first, int(rng.integers(1, 3)), r, rng)
    inner = [n.id for n in tree.nodes[1:] if not n.terminal]
    rollout(tree, int(rng.choice(inner)), int(rng.integers(1, 3)), float(rng.random()), rng)
    return tree


def sequences(tree, adv):
    """The objective's sequences of one tree: (anchor, nodes, advantage of each node)."""
    if isinstance(adv, PathAdvantages):
        return [(ROOT, tree.path(leaf)[1:], {v: a for v in tree.path(leaf)[1:]}) for leaf, a in adv.leaves.items()]
    return [(b.anchor, tree.branch_nodes(b.id), {v: adv[v] for v in tree.branch_nodes(b.id)}) for b in tree.branches]


def brute_force_loss(model, trees, advs, old, cfg, temperature=1.0):
    """Each sequence as its own causal forward, PPO per sequence (verl's form, dual-clip
    included), aggregated as the mode says; ``old`` by slot."""
    base, _ = slot_bases([token_tree(t, a) for t, a in zip(trees, advs)])
    per_seq = []  # (sum of token losses, policy tokens)
    for t, (tree, adv) in enumerate(zip(trees, advs)):
        for anchor, nodes, a_of in sequences(tree, adv):
            ids, where = list(tree.context(anchor)[0]), []
            for v in nodes:
                n = tree.nodes[v]
                where += [(len(ids) + k, v, k) for k in range(len(n.policy_token_ids))]
                ids += list(n.policy_token_ids) + list(n.observation_token_ids)
            x = torch.tensor([ids])
            lp = torch.log_softmax(model(input_ids=x).logits[0].float() / temperature, -1)
            pos = torch.tensor([p for p, _, _ in where])
            logp = lp[pos - 1, x[0, pos]]
            o = torch.tensor([float(old[base[(t, v)] + k]) for _, v, k in where])
            a = torch.tensor([a_of[v] for _, v, _ in where])
            r = torch.exp(torch.clamp(logp - o, -20, 20))
            loss = -torch.minimum(r * a, torch.clamp(r, 1 - cfg.clip_low, 1 + cfg.clip_high) * a)
            if cfg.clip_ratio_c is not None:
                loss = torch.where(a < 0, torch.minimum(loss, -a * cfg.clip_ratio_c), loss)
            per_seq.append((loss.sum(), len(where)))
    per_seq = [(l, n) for l, n in per_seq if n]
    S, N = len(per_seq), sum(n for _, n in per_seq)
    mode = cfg.loss_aggregation
    if mode == "token-mean":
        return sum(l for l, _ in per_seq) / N
    if mode == "seq-mean-token-mean":
        return sum(l / n for l, n in per_seq) / S
    if mode == "seq-mean-token-sum":
        return sum(l for l, _ in per_seq) / S
    return sum(l for l, _ in per_seq) / (S * cfg.loss_norm_tokens)


def assert_close(got, want, tol=1e-5):
    assert set(got) == set(want)
    for name in want:
        err = float((got[name] - want[name]).norm())
        assert err <= tol * float(want[name].norm()) + 1e-9, (name, err, float(want[name].norm()))


def perturbed_old_logprobs(trainer, tts, seed, spread=0.6):
    """Step-start log-probabilities moved by up to +-spread/2 nats per token, so that ratios
    fall on both sides of both clip bounds."""
    rows, total = trainer._rows(tts)
    old = torch.zeros(total)
    with torch.no_grad():
        for row in rows:
            old[row.slots] = trainer.row_logprobs(row)[0]
    g = torch.Generator().manual_seed(seed)
    return old + spread * (torch.rand(total, generator=g) - 0.5)


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS)
def test_trainer_equals_the_per_sequence_objective_away_from_ratio_one(tiny_model_path, mode):  # noqa: F811
    cfg = TrainerConfig(loss_aggregation=mode, loss_norm_tokens=64, clip_low=0.2, clip_high=0.28, clip_ratio_c=1.3,
                        micro_batch_tokens=40)  # small rows: trees split across micro-batches too
    trainer = PolicyTrainer(tiny_model_path, cfg)
    trees = [random_tree(s) for s in (11, 12)]
    for est in (grpo, tree_grpo, treerpo):
        advs = [est(t) for t in trees]
        tts = [token_tree(t, a) for t, a in zip(trees, advs)]
        old = perturbed_old_logprobs(trainer, tts, seed=3)
        loss, grads = trainer.objective(tts, old)
        trainer.model.zero_grad(set_to_none=True)
        want = brute_force_loss(trainer.model, trees, advs, old, cfg)
        want.backward()
        want_grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.model.zero_grad(set_to_none=True)
        assert loss == pytest.approx(float(want.detach()), abs=1e-5), est.__name__
        assert_close(grads, want_grads)


def test_clipping_the_summed_advantage_is_a_different_objective(tiny_model_path):  # noqa: F811
    """The check above can fail: the old objective (a shared prefix's leaf advantages summed,
    then clipped) differs from the per-leaf one once the ratio moves. (seq-mean-token-sum: one
    sequence per leaf either way, each rollout ending in one leaf, so the weights agree.)"""
    cfg = TrainerConfig(micro_batch_tokens=10_000, loss_aggregation="seq-mean-token-sum")
    trainer = PolicyTrainer(tiny_model_path, cfg)
    trees = [random_tree(s) for s in (11, 12)]
    advs = [grpo(t) for t in trees]
    from trace_gym.train.advantages import node_advantages

    summed = [token_tree(t, node_advantages(t, a)) for t, a in zip(trees, advs)]  # one term per node: the sum
    old = perturbed_old_logprobs(trainer, summed, seed=3)
    loss_summed, _ = trainer.objective(summed, old)
    want = float(brute_force_loss(trainer.model, trees, advs, old, cfg).detach())
    assert abs(loss_summed - want) > 1e-3
    # ... and at ratio 1 the two agree in gradient (the sum is exact there)
    _, g_sum = trainer.objective(summed)
    _, g_leaf = trainer.objective([token_tree(t, a) for t, a in zip(trees, advs)])
    assert_close(g_sum, g_leaf, tol=1e-4)


def test_several_epochs_and_mini_batches_follow_the_per_leaf_objective(tiny_model_path):  # noqa: F811
    """ppo_epochs = 2, mini_batches = 2: at every optimizer step the accumulated gradient is
    the brute-force per-leaf gradient of that mini-batch at the current weights, with the
    old log-probabilities of the step's start (computed once, before the first epoch)."""
    cfg = TrainerConfig(lr=2e-2, ppo_epochs=2, mini_batches=2, loss_aggregation="seq-mean-token-mean",
                        max_grad_norm=0.0, micro_batch_tokens=10_000)
    trainer = PolicyTrainer(tiny_model_path, cfg, total_steps=1)
    trees = [random_tree(s) for s in (21, 22, 23, 24)]
    advs = [grpo(t) for t in trees]
    groups = [[i for i in range(len(trees)) if i % 2 == g] for g in range(2)]
    old_by_group = []
    for g in groups:  # step-start log-probabilities, unpacked, by the group's slots
        tts = [token_tree(trees[i], advs[i]) for i in g]
        rows, total = trainer._rows(tts)
        buf = torch.zeros(total)
        with torch.no_grad():
            for row in rows:
                buf[row.slots] = trainer.row_logprobs(row)[0]
        old_by_group.append(buf)
    seen, ratios_moved = [], []
    clip = trainer._clip

    def checking_clip():
        k = len(seen)
        g = groups[k % 2]
        got = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.model.zero_grad(set_to_none=True)
        brute_force_loss(trainer.model, [trees[i] for i in g], [advs[i] for i in g], old_by_group[k % 2], cfg).backward()
        want = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        for n, p in trainer.model.named_parameters():
            p.grad = got.get(n)
        seen.append((got, want))
        with torch.no_grad():
            tts = [token_tree(trees[i], advs[i]) for i in g]
            rows, _ = trainer._rows(tts)
            now = torch.cat([trainer.row_logprobs(row)[0] for row in rows])
            then = torch.cat([old_by_group[k % 2][row.slots] for row in rows])
            ratios_moved.append(float((now - then).abs().max()))
        return clip()

    trainer._clip = checking_clip
    trainer.step([token_tree(t, a) for t, a in zip(trees, advs)])
    assert len(seen) == 4  # 2 epochs x 2 mini-batches
    assert ratios_moved[0] < 1e-4 and min(ratios_moved[1:]) > 1e-3  # after the first update the ratio moves
    for got, want in seen:
        assert_close(got, want, tol=1e-4)
