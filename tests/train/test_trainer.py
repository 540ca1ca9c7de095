"""Trainer math without a model: PPO-clip (both sides, asymmetric), aggregation modes, IS weights,
KL, the LR schedule, and packing trees into rows (each trained node exactly once)."""

from __future__ import annotations

import math

import pytest
import torch

from trace_gym.train.batches import TokenNode, TokenTree, build_row, node_coefficients, plan_rows, slot_bases, token_tree
from trace_gym.train.trainer import TrainerConfig, lr_factor, ppo_clip_loss, truncated_is_weights
from trace_gym.tree import ROOT, RolloutTree


def loss_and_grad(ratios, advantages, weights, **kw):
    """One term per token: advantage A with weight w is pos = w A (A > 0) or neg = w A (A < 0)."""
    old = torch.zeros(len(ratios), dtype=torch.float64)
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    a, w = torch.tensor(advantages, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)
    loss, sums = ppo_clip_loss(logp, old, w * a.clamp(min=0), w * a.clamp(max=0), w, **kw)
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
    zero = torch.zeros(1, dtype=torch.float64)
    loss, sums = ppo_clip_loss(logp, logp.detach(), zero, zero, torch.ones(1, dtype=torch.float64),
                               clip_low=0.2, clip_high=0.2, ref_logp=ref, kl_coef=0.1)
    k3 = 2.0 - math.log(2.0) - 1.0
    assert sums["kl"] == pytest.approx(k3) and float(loss.detach()) == pytest.approx(0.1 * k3)
    loss.backward()
    assert logp.grad.item() == pytest.approx(0.1 * (1.0 - 2.0))  # d/dlogp [e^(ref-logp) - (ref-logp) - 1]
    with pytest.raises(ValueError, match="ref_logp"):
        ppo_clip_loss(logp, logp.detach(), torch.zeros(1), torch.zeros(1), torch.ones(1), clip_low=0.2, clip_high=0.2,
                      kl_coef=0.1)


def two_trees() -> list[TokenTree]:
    """Tree 0: prompt, rollout 0 with 2 + 3 policy tokens, rollout 1 with 1. Tree 1: one rollout of 4."""
    t0 = TokenTree((
        TokenNode(-1, (1, 2), 0),
        TokenNode(0, (10, 11, 90), 2, ((0, 1.0),), rollout=0),
        TokenNode(1, (12, 13, 14), 3, ((0, 1.0),), rollout=0),
        TokenNode(0, (15, 91), 1, ((1, -1.0),), rollout=1),
    ))
    t1 = TokenTree((TokenNode(-1, (3,), 0), TokenNode(0, (20, 21, 22, 23), 4, ((0, 0.5),), rollout=0)))
    return [t0, t1]


def weights(trees, mode, norm=None):
    return [[c.weight for c in row] for row in node_coefficients(trees, mode, norm)]


def test_aggregation_weights_hand_values():
    trees = two_trees()
    # 10 policy tokens in 3 sequences (one term per node: node advantages) of 5, 1 and 4 tokens
    assert weights(trees, "token-mean") == [[0, 0.1, 0.1, 0.1], [0, 0.1]]
    flat = lambda w: [x for row in w for x in row]  # noqa: E731
    # sequence of 5 tokens: 1/(3*5); of 1: 1/(3*1); of 4: 1/(3*4)
    assert flat(weights(trees, "seq-mean-token-mean")) == pytest.approx([0, 1 / 15, 1 / 15, 1 / 3, 0, 1 / 12])
    assert flat(weights(trees, "seq-mean-token-sum")) == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3, 0, 1 / 3])
    # Dr. GRPO: 1/(S * L) with L a constant, never the batch's longest sequence
    assert flat(weights(trees, "seq-mean-token-sum-norm", 8)) == pytest.approx([0, 1 / 24, 1 / 24, 1 / 24, 0, 1 / 24])
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm divides by a constant"):
        node_coefficients(trees, "seq-mean-token-sum-norm")
    for mode in ("token-mean", "seq-mean-token-mean"):  # a mean: weights sum to one
        w = weights(trees, mode)
        assert sum(w[t][v] * n.n_policy for t, tree in enumerate(trees) for v, n in enumerate(tree.nodes)) == pytest.approx(1)
    coef = node_coefficients(trees, "token-mean")
    assert [x for c in coef[0] for x in (c.pos, c.neg)] == pytest.approx([0, 0, 0.1, 0, 0.1, 0, 0, -0.1])
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        node_coefficients(trees, "sum")


def shared_tree() -> TokenTree:
    """A prefix of 2 policy tokens shared by two leaves: leaf a (3 tokens, A = +1) and leaf b
    (1 token, A = -2), both paths sequences (path advantages)."""
    return TokenTree((
        TokenNode(-1, (1,), 0),
        TokenNode(0, (10, 11), 2, ((2, 1.0), (3, -2.0)), rollout=0),
        TokenNode(1, (12, 13, 14), 3, ((2, 1.0),), rollout=0),
        TokenNode(1, (15,), 1, ((3, -2.0),), rollout=1),
    ))


def test_a_shared_prefix_counts_once_per_leaf_in_every_mode():
    tree = [shared_tree()]
    # the sequences are the two paths: 2 + 3 = 5 and 2 + 1 = 3 policy tokens, S = 2, N = 8
    by_mode = {
        "token-mean": [(1 / 8, -2 / 8, 2 / 8), (1 / 8, 0, 1 / 8), (0, -2 / 8, 1 / 8)],
        "seq-mean-token-mean": [(1 / 10, -2 / 6, 1 / 10 + 1 / 6), (1 / 10, 0, 1 / 10), (0, -2 / 6, 1 / 6)],
        "seq-mean-token-sum": [(1 / 2, -1, 1), (1 / 2, 0, 1 / 2), (0, -1, 1 / 2)],
    }
    for mode, want in by_mode.items():
        got = [x for c in node_coefficients(tree, mode)[0][1:] for x in (c.pos, c.neg, c.weight)]
        assert got == pytest.approx([x for t in want for x in t]), mode
    got = [x for c in node_coefficients(tree, "seq-mean-token-sum-norm", 10)[0][1:] for x in (c.pos, c.neg, c.weight)]
    assert got == pytest.approx([1 / 20, -2 / 20, 2 / 20, 1 / 20, 0, 1 / 20, 0, -2 / 20, 1 / 20])


def test_opposite_sign_leaves_are_clipped_apart_not_summed():
    """The shared prefix's tokens carry +1 and -2 (c = 1): at ratio 1.5 the positive term is
    clipped to 1.2 and the negative one is not: -(1 * 1.2) - (-2 * 1.5) = 1.8; clipping the
    sum (-1) would give -(-1 * 1.5) = 1.5 with another gradient."""
    logp = torch.tensor([math.log(1.5)], dtype=torch.float64, requires_grad=True)
    one = torch.ones(1, dtype=torch.float64)
    loss, sums = ppo_clip_loss(logp, torch.zeros(1, dtype=torch.float64), one, -2 * one, 2 * one,
                               clip_low=0.2, clip_high=0.2)
    assert float(loss.detach()) == pytest.approx(1.8)
    loss.backward()
    assert logp.grad.item() == pytest.approx(2 * 1.5)  # only the unclipped negative term moves
    assert sums["clipped_high"] == 1 and sums["clipped_low"] == 0


def test_log_ratio_is_clamped_at_20_nats():
    # a log-ratio of 100 nats would make the ratio inf; clamped, it is e^20 (and its gradient 0)
    logp = torch.tensor([100.0, -100.0], dtype=torch.float64, requires_grad=True)
    zero, one = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    loss, _ = ppo_clip_loss(logp, zero, zero, -one, one, clip_low=0.2, clip_high=0.2)
    assert float(loss.detach()) == pytest.approx(math.exp(20.0) + 0.8)  # -(-1 * e^20) - (-1 * max(e^-20, 0.8))
    loss.backward()
    assert logp.grad.tolist() == [0.0, 0.0]


def test_dual_clip_caps_a_negative_advantage_ratio_term():
    # A = -1, ratio 5: PPO gives -A * max(r, clip(r)) = 5; dual-clip at C = 3 gives 3 (no gradient)
    for c, want, grad in ((None, 5.0, 5.0), (3.0, 3.0, 0.0)):
        loss, g, sums = loss_and_grad([5.0, 5.0], [-1.0, 1.0], [1.0, 1.0], clip_low=0.2, clip_high=0.2,
                                      clip_ratio_c=c)
        assert loss == pytest.approx(want - 1.2) and g == pytest.approx([grad, 0.0])  # the A > 0 token: clip 1.2
        assert sums["clipped_dual"] == (1 if c else 0)
    # below C nothing changes: ratio 2 < 3
    assert loss_and_grad([2.0], [-1.0], [1.0], clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0)[:2] == (
        pytest.approx(2.0), pytest.approx([2.0]))
    with pytest.raises(ValueError, match=r"clip_ratio_c: expected a finite number in \(1, .*got 1.0"):
        TrainerConfig(clip_ratio_c=1.0)


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
    w = node_coefficients(trees, "token-mean")
    units = plan_rows(trees, [[True] * 4, [True] * 2], budget=100)
    assert len(units) == 1
    row = build_row(trees, units[0], w, base)
    # tree 0 (larger) first: prompt, node 1 (full: it has a child), node 2 (policy only: a leaf), node 3 (policy only)
    assert row.input_ids.tolist() == [1, 2, 10, 11, 90, 12, 13, 14, 15, 3, 20, 21, 22, 23]
    assert row.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 2, 0, 1, 2, 3, 4]
    # node 3's first token (15) is predicted from the prompt's last token (position 1), not from 14
    assert row.targets.tolist() == [2, 3, 5, 6, 7, 8, 10, 11, 12, 13]
    assert row.predictors.tolist() == [1, 2, 4, 5, 6, 1, 9, 10, 11, 12]
    assert row.pos.tolist() == pytest.approx([0.1] * 5 + [0] + [0.05] * 4)  # c = 1/10 times A
    assert row.neg.tolist() == pytest.approx([0] * 5 + [-0.1] + [0] * 4)
    assert row.weights.tolist() == pytest.approx([0.1] * 10)
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
    row = build_row([tt], plan_rows([tt], [[True] * 3], 100)[0], node_coefficients([tt], "token-mean"), slot_bases([tt])[0])
    kinds = ["prompt"] * 3 + ["policy"] * 2 + ["observation"] * 2 + ["policy"]
    assert [kinds[i] for i in row.targets.tolist()] == ["policy"] * 3  # no prompt or observation token is a target
    assert row.sampling_logprobs.tolist() == pytest.approx([-0.1, -0.2, -0.3])
    with pytest.raises(ValueError, match="node 2 has no advantage"):
        token_tree(tree, {n1: 0.5})
