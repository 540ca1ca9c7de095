"""Trainer math without a model: PPO-clip (both sides, asymmetric), aggregation modes, IS weights,
KL, the LR schedule, and packing trees into rows (each trained node exactly once)."""

from __future__ import annotations

import math

import pytest
import torch

from trace_gym.batches import TokenNode, TokenTree, build_row, node_weights, plan_rows, slot_bases, token_tree
from trace_gym.trainer import TrainerConfig, lr_factor, ppo_clip_loss, truncated_is_weights
from trace_gym.tree import ROOT, RolloutTree


def loss_and_grad(ratios, advantages, weights, **kw):
    old = torch.zeros(len(ratios), dtype=torch.float64)
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    loss, sums = ppo_clip_loss(logp, old, torch.tensor(advantages, dtype=torch.float64),
                               torch.tensor(weights, dtype=torch.float64), **kw)
    loss.backward()
    return float(loss.detach()), logp.grad.tolist(), sums


def test_ppo_clip_both_sides_hand_values():
    # tokens: (ratio, A) = (1.5, +1) clipped high; (0.5, +1) not clipped; (0.5, -1) clipped low; (1.5, -1) not
    loss, grad, sums = loss_and_grad([1.5, 0.5, 0.5, 1.5], [1.0, 1.0, -1.0, -1.0], [0.25] * 4,
                                     clip_low=0.2, clip_high=0.2)
    per_token = [-1.2, -0.5, 0.8, 1.5]
    assert loss == pytest.approx(0.25 * sum(per_token))
    # d/dlogp of -A r w is -A r w where unclipped; 0 where the clipped side is taken
    assert grad == pytest.approx([0.0, -0.5 * 0.25, 0.0, 1.5 * 0.25])
    assert sums["clipped_high"] == 1 and sums["clipped_low"] == 1


def test_ppo_clip_is_asymmetric():
    # clip_low 0.1, clip_high 0.3: ratio 1.25 with A > 0 stays inside; 0.85 with A < 0 is clipped at 0.9
    loss, grad, sums = loss_and_grad([1.25, 0.85, 1.35], [2.0, -1.0, 1.0], [1.0, 1.0, 1.0], clip_low=0.1, clip_high=0.3)
    assert loss == pytest.approx(-2.5 + 0.9 - 1.3)
    assert grad == pytest.approx([-2.5, 0.0, 0.0])
    assert (sums["clipped_low"], sums["clipped_high"]) == (1, 1)


def test_ratio_one_gives_the_policy_gradient():
    loss, grad, _ = loss_and_grad([1.0, 1.0], [0.5, -2.0], [0.5, 0.5], clip_low=0.2, clip_high=0.2)
    assert loss == pytest.approx(0.5 * (-0.5 + 2.0)) and grad == pytest.approx([-0.25, 1.0])


def test_importance_weights_and_kl_hand_values():
    old = torch.tensor([-1.0, -2.0, -0.5])
    samp = torch.tensor([-1.5, -1.0, float("nan")])
    w = truncated_is_weights(old, samp, cap=1.5)
    assert w.tolist() == pytest.approx([1.5, math.exp(-1.0), 1.0])  # exp(0.5) = 1.65 capped; unknown -> 1
    logp = torch.tensor([-1.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.0 + math.log(2.0)], dtype=torch.float64)
    loss, sums = ppo_clip_loss(logp, logp.detach(), torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64),
                               clip_low=0.2, clip_high=0.2, ref_logp=ref, kl_coef=0.1)
    k3 = 2.0 - math.log(2.0) - 1.0
    assert sums["kl"] == pytest.approx(k3) and float(loss.detach()) == pytest.approx(0.1 * k3)
    loss.backward()
    assert logp.grad.item() == pytest.approx(0.1 * (1.0 - 2.0))  # d/dlogp [e^(ref-logp) - (ref-logp) - 1]
    with pytest.raises(ValueError, match="ref_logp"):
        ppo_clip_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1), clip_low=0.2, clip_high=0.2, kl_coef=0.1)


def two_trees() -> list[TokenTree]:
    """Tree 0: prompt, rollout 0 with 2 + 3 policy tokens, rollout 1 with 1. Tree 1: one rollout of 4."""
    t0 = TokenTree((
        TokenNode(-1, (1, 2), 0, 0.0),
        TokenNode(0, (10, 11, 90), 2, 1.0, sequence=0),
        TokenNode(1, (12, 13, 14), 3, 1.0, sequence=0),
        TokenNode(0, (15, 91), 1, -1.0, sequence=1),
    ))
    t1 = TokenTree((TokenNode(-1, (3,), 0, 0.0), TokenNode(0, (20, 21, 22, 23), 4, 0.5, sequence=0)))
    return [t0, t1]


def test_aggregation_weights_hand_values():
    trees = two_trees()
    # 10 policy tokens in 3 sequences of 5, 1 and 4 tokens
    assert node_weights(trees, "token-mean") == [[0, 0.1, 0.1, 0.1], [0, 0.1]]
    flat = lambda w: [x for row in w for x in row]  # noqa: E731
    # sequence of 5 tokens: 1/(3*5); of 1: 1/(3*1); of 4: 1/(3*4)
    assert flat(node_weights(trees, "seq-mean-token-mean")) == pytest.approx([0, 1 / 15, 1 / 15, 1 / 3, 0, 1 / 12])
    # Dr. GRPO: 1/(S * L), L = the longest sequence (5) or a given constant
    assert flat(node_weights(trees, "seq-mean-token-sum-norm")) == pytest.approx([0, 1 / 15, 1 / 15, 1 / 15, 0, 1 / 15])
    assert flat(node_weights(trees, "seq-mean-token-sum-norm", 8)) == pytest.approx([0, 1 / 24, 1 / 24, 1 / 24, 0, 1 / 24])
    for mode in ("token-mean", "seq-mean-token-mean"):  # a mean: weights sum to one
        w = node_weights(trees, mode)
        assert sum(w[t][v] * n.n_policy for t, tree in enumerate(trees) for v, n in enumerate(tree.nodes)) == pytest.approx(1)
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        node_weights(trees, "sum")


def test_lr_schedule_hand_values():
    f = [lr_factor(u, warmup_steps=2, total_steps=6, schedule="cosine", min_lr_ratio=0.1) for u in range(7)]
    assert f[:2] == pytest.approx([1 / 3, 2 / 3])
    # cosine over the 4 updates after warm-up: progress 0, 1/4, 1/2, 3/4, 1
    cos = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)) for p in (0, 0.25, 0.5, 0.75, 1.0)]
    assert f[2:] == pytest.approx(cos)
    assert lr_factor(5, warmup_steps=0, total_steps=6, schedule="constant") == 1.0


def test_config_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="loss_aggregation .* 'mean'"):
        TrainerConfig(loss_aggregation="mean")
    with pytest.raises(ValueError, match="clip_low"):
        TrainerConfig(clip_low=1.5)
    with pytest.raises(ValueError, match="tis_cap"):
        TrainerConfig(tis_cap=0.0)


def test_build_row_layout_positions_predictors_and_mask():
    trees = two_trees()
    base, total = slot_bases(trees)
    assert total == 10
    w = node_weights(trees, "token-mean")
    units = plan_rows(trees, [[True] * 4, [True] * 2], budget=100)
    assert len(units) == 1
    row = build_row(trees, units[0], w, base)
    # tree 0 (larger) first: prompt, node 1 (full: it has a child), node 2 (policy only: a leaf), node 3 (policy only)
    assert row.input_ids.tolist() == [1, 2, 10, 11, 90, 12, 13, 14, 15, 3, 20, 21, 22, 23]
    assert row.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 2, 0, 1, 2, 3, 4]
    # node 3's first token (15) is predicted from the prompt's last token (position 1), not from 14
    assert row.targets.tolist() == [2, 3, 5, 6, 7, 8, 10, 11, 12, 13]
    assert row.predictors.tolist() == [1, 2, 4, 5, 6, 1, 9, 10, 11, 12]
    assert row.advantages.tolist() == [1, 1, 1, 1, 1, -1, 0.5, 0.5, 0.5, 0.5]
    mask = row.attention_mask()[0, 0]
    assert mask[8].nonzero()[:, 0].tolist() == [0, 1, 8]           # 15 sees the prompt and itself
    assert mask[7].nonzero()[:, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert mask[10].nonzero()[:, 0].tolist() == [9, 10]            # the second tree sees only itself
    assert sorted(row.slots.tolist()) == list(range(10))


def test_plan_rows_trains_every_node_once_within_the_budget():
    trees = two_trees()
    flags = [[True] * 4, [True] * 2]
    for budget in (3, 5, 7, 9, 13, 100):
        rows = plan_rows(trees, flags, budget)
        trained = sorted((u.tree, v) for units in rows for u in units for v in u.trained)
        assert trained == [(0, 1), (0, 2), (0, 3), (1, 1)]
        for units in rows:
            size = sum(u.tokens for u in units)
            assert size <= budget or len(units) == 1  # only an indivisible rollout may exceed it
    # budget 7: tree 0 (9 tokens) splits by rollout: {prompt, n1, n2} (7) and {prompt, n3} (3)
    rows = plan_rows(trees, flags, 7)
    units = sorted((u.tree, u.nodes, tuple(sorted(u.trained))) for r in rows for u in r)
    assert units == [(0, (0, 1, 2), (1, 2)), (0, (0, 3), (3,)), (1, (0, 1), (1,))]
    # untrained nodes (zero advantage) are left out; their ancestors stay as context
    rows = plan_rows(trees, [[False, False, True, False], [False, False]], 100)
    assert [(u.nodes, tuple(u.trained)) for r in rows for u in r] == [((0, 1, 2), (2,))]


def test_token_tree_from_a_rollout_tree_keeps_observations_untrained():
    tree = RolloutTree("t", [1, 2, 3])
    b = tree.start_branch(ROOT)
    n1 = tree.add_turn(ROOT, branch=b, policy_token_ids=[5, 6], observation_token_ids=[7, 8], logprobs=[-0.1, -0.2])
    n2 = tree.add_turn(n1, branch=b, policy_token_ids=[9], observation_token_ids=[], logprobs=[-0.3], reward=1.0,
                       terminal=True)
    tt = token_tree(tree, {n1: 0.5, n2: -0.5})
    assert [(n.token_ids, n.n_policy, n.advantage) for n in tt.nodes] == [
        ((1, 2, 3), 0, 0.0), ((5, 6, 7, 8), 2, 0.5), ((9,), 1, -0.5)]
    row = build_row([tt], plan_rows([tt], [[True] * 3], 100)[0], node_weights([tt], "token-mean"), slot_bases([tt])[0])
    kinds = ["prompt"] * 3 + ["policy"] * 2 + ["observation"] * 2 + ["policy"]
    assert [kinds[i] for i in row.targets.tolist()] == ["policy"] * 3  # no prompt or observation token is a target
    assert row.sampling_logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3])
    with pytest.raises(ValueError, match="node 2 has no advantage"):
        token_tree(tree, {n1: 0.5})
