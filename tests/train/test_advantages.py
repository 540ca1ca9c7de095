"""Advantage estimators: hand-computed values, the one-level invariant, non-binary rewards."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_gym.train.advantages import (
    ESTIMATORS,
    get_estimator,
    group_normalize,
    grpo,
    leaf_sums,
    node_advantages,
    segment_heads,
    tree_grpo,
    treerpo,
)
from trace_gym.tree import ROOT, RolloutTree

S3 = math.sqrt(3.0)


def rollout(tree: RolloutTree, anchor: int, turns: int, reward: float) -> list[int]:
    """A branch of ``turns`` turns below ``anchor`` ending with ``reward``; its node ids."""
    b = tree.start_branch(anchor)
    ids, node = [], anchor
    for t in range(turns):
        last = t == turns - 1
        node = tree.add_turn(node, branch=b, policy_token_ids=[10 + node, 20 + node], observation_token_ids=[30],
                             logprobs=[-0.5, -0.25], reward=reward if last else None, terminal=last)
        ids.append(node)
    return ids


def one_level(rewards, turns=2) -> RolloutTree:
    tree = RolloutTree("t", [1, 2, 3])
    for r in rewards:
        rollout(tree, ROOT, turns, r)
    return tree


def expanded() -> tuple[RolloutTree, dict[str, int]]:
    """root -- a1 -- a2 (0); a1 -- c2 (1); a1 -- d2 (0); root -- b1 -- b2 (1)."""
    tree = RolloutTree("t", [1, 2, 3])
    a1, a2 = rollout(tree, ROOT, 2, 0.0)
    b1, b2 = rollout(tree, ROOT, 2, 1.0)
    (c2,) = rollout(tree, a1, 1, 1.0)
    (d2,) = rollout(tree, a1, 1, 0.0)
    return tree, dict(a1=a1, a2=a2, b1=b1, b2=b2, c2=c2, d2=d2)


def named(tree, adv, ids):
    per_node = node_advantages(tree, adv)
    return {name: per_node[i] for name, i in ids.items()}


def per_node(est, tree, **kw):
    return node_advantages(tree, est(tree, **kw))


def test_group_normalize_hand_values():
    # [1, 0, 0, 1]: mean 1/2, sample std sqrt(1/3) -> +-sqrt(3)/2
    assert group_normalize([1, 0, 0, 1], eps=0) == pytest.approx([S3 / 2, -S3 / 2, -S3 / 2, S3 / 2])
    # non-binary: mean 0.5, sample std 0.3
    assert group_normalize([0.2, 0.8, 0.5], eps=0) == pytest.approx([-1.0, 1.0, 0.0])
    assert group_normalize([1, 0, 0, 1], std_normalize=False) == [0.5, -0.5, -0.5, 0.5]  # Dr. GRPO
    assert group_normalize([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]  # exactly zero, no rounding noise
    # a group of one has nothing to contrast with: exactly 0 (verl's GRPO would give the raw value)
    assert group_normalize([1.0], eps=0.0) == [0.0] and group_normalize([0.7], std_normalize=False) == [0.0]
    assert group_normalize([1.0, 0.0], eps=1.0) == pytest.approx([0.5 / (math.sqrt(0.5) + 1), -0.5 / (math.sqrt(0.5) + 1)])
    with pytest.raises(ValueError, match="finite"):
        group_normalize([1.0, float("nan")])


def test_grpo_hand_values_on_an_expanded_tree():
    tree, ids = expanded()
    # leaves a2, c2, d2, b2 = 0, 1, 0, 1 -> -+sqrt(3)/2; a1 carries a2 + c2 + d2
    adv = grpo(tree, eps=0)
    h = S3 / 2
    assert adv.leaves == pytest.approx({ids["a2"]: -h, ids["c2"]: h, ids["d2"]: -h, ids["b2"]: h})
    assert named(tree, adv, ids) == pytest.approx(dict(a1=-h, a2=-h, c2=h, d2=-h, b1=h, b2=h))


def test_treerpo_hand_values_on_an_expanded_tree():
    tree, ids = expanded()
    got = named(tree, treerpo(tree, eps=0), ids)
    # root group: V(a1) = 1/3, V(b1) = 1 -> mean 2/3, sample std sqrt(2)/3 -> -+1/sqrt(2)
    # a1 group: 0, 1, 0 -> mean 1/3, std 1/sqrt(3) -> -1/sqrt(3), 2/sqrt(3), -1/sqrt(3)
    # b2 is b1's only child: it belongs to b1's segment
    r2 = 1 / math.sqrt(2)
    assert got == pytest.approx(dict(a1=-r2, a2=-1 / S3, c2=2 / S3, d2=-1 / S3, b1=r2, b2=r2))
    heads = segment_heads(tree)
    assert heads[ids["b2"]] == ids["b1"] and heads[ids["c2"]] == ids["c2"] and heads[ids["a1"]] == ids["a1"]
    assert set(treerpo(tree)) == set(ids.values())  # every edge once, the root never


def test_tree_grpo_hand_values_and_shared_prefix_sum():
    tree, ids = expanded()
    got = named(tree, tree_grpo(tree, eps=0), ids)
    h = S3 / 2
    # prompt group [0, 1, 0, 1] -> -+h; tree a1 {a2, c2, d2} = [0, 1, 0] -> -1/sqrt3, 2/sqrt3, -1/sqrt3;
    # tree b1 {b2} is a group of one: it adds 0
    leaf = dict(a2=-h - 1 / S3, c2=h + 2 / S3, d2=-h - 1 / S3, b2=h)
    assert {k: got[k] for k in leaf} == pytest.approx(leaf)
    # the shared prefix a1 carries the sum over its three leaves; b1 its one leaf
    assert got["a1"] == pytest.approx(leaf["a2"] + leaf["c2"] + leaf["d2"]) == pytest.approx(-h)
    assert got["b1"] == pytest.approx(leaf["b2"])


def test_on_a_one_level_tree_every_estimator_is_grpo():
    rng = np.random.default_rng(0)
    for trial in range(40):
        m = int(rng.integers(1, 7))
        rewards = rng.choice([0.0, 1.0], m) if trial % 2 else np.round(rng.random(m), 2)  # non-binary too
        tree = RolloutTree("t", [1])
        for r in rewards:
            rollout(tree, ROOT, int(rng.integers(1, 4)), float(r))  # multi-turn chains
        for std_normalize in (True, False):
            g = per_node(grpo, tree, std_normalize=std_normalize)
            assert per_node(treerpo, tree, std_normalize=std_normalize) == pytest.approx(g, rel=1e-12, abs=1e-12)
            # every tree of a one-level prompt is one rollout: a group of one, adding exactly 0
            assert per_node(tree_grpo, tree, std_normalize=std_normalize) == g


def test_a_group_of_one_contributes_zero_in_every_estimator():
    lone = one_level([1.0], turns=2)  # the prompt-level group and the root's sibling group have one member
    for est in ESTIMATORS.values():
        assert set(per_node(est, lone).values()) == {0.0}, est
    tree, ids = expanded()  # b1's tree {b2} is a Tree-GRPO group of one; a1's has three leaves
    prompt_only = grpo(tree, eps=0).leaves[ids["b2"]]
    assert tree_grpo(tree, eps=0).leaves[ids["b2"]] == prompt_only


def test_non_binary_rewards_hand_values():
    tree = one_level([0.2, 0.8, 0.5], turns=1)
    assert list(grpo(tree, eps=0).leaves.values()) == pytest.approx([-1.0, 1.0, 0.0])
    assert list(treerpo(tree, eps=0).values()) == pytest.approx([-1.0, 1.0, 0.0])
    assert list(grpo(tree, std_normalize=False).leaves.values()) == pytest.approx([-0.3, 0.3, 0.0])


def test_groups_without_variance_contribute_zero():
    tree = one_level([1.0, 1.0, 1.0])
    for est in ESTIMATORS.values():
        assert set(per_node(est, tree).values()) == {0.0}
    # a branch point whose children all agree: its segments get 0, the root group still counts
    t2 = RolloutTree("t", [1])
    a1, _ = rollout(t2, ROOT, 2, 1.0)
    rollout(t2, ROOT, 1, 0.0)
    rollout(t2, a1, 1, 1.0)
    adv = treerpo(t2)
    below_a1 = [c for c in t2.nodes[a1].children]
    assert [adv[c] for c in below_a1] == [0.0, 0.0] and adv[a1] > 0


def test_singleton_prompt_and_bad_trees():
    assert list(grpo(one_level([1.0], turns=1), eps=0).leaves.values()) == [0.0]
    assert list(treerpo(one_level([0.5], turns=1), eps=0).values()) == [0.0]
    empty = RolloutTree("t", [1])
    with pytest.raises(ValueError, match="no finished leaf"):
        grpo(empty)
    half = RolloutTree("t", [1])
    b = half.start_branch(ROOT)
    half.add_turn(ROOT, branch=b, policy_token_ids=[5])
    rollout(half, ROOT, 1, 1.0)
    with pytest.raises(ValueError, match="unfinished"):
        treerpo(half)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        get_estimator("ppo")


def test_leaf_sums_brute_force_on_random_trees():
    rng = np.random.default_rng(3)
    for _ in range(10):
        tree = RolloutTree("t", [1])
        for _ in range(int(rng.integers(2, 5))):
            rollout(tree, ROOT, int(rng.integers(1, 4)), float(rng.integers(0, 2)))
        for _ in range(int(rng.integers(0, 5))):  # continuations from root rollouts' inner nodes
            inner = [n.id for n in tree.nodes[1:] if not n.terminal]
            if inner:
                rollout(tree, int(rng.choice(inner)), int(rng.integers(1, 3)), float(rng.random()))
        for est in (grpo, tree_grpo):
            leaves = est(tree).leaves
            assert sorted(leaves) == sorted(n.id for n in tree.leaves())
            brute = {v: sum(a for leaf, a in leaves.items() if v in tree.path(leaf)) for v in range(1, len(tree.nodes))}
            assert leaf_sums(tree, leaves) == pytest.approx(brute)
            assert node_advantages(tree, est(tree)) == pytest.approx(brute)
        adv = treerpo(tree)
        heads = segment_heads(tree)
        for v, h in heads.items():
            assert adv[v] == adv[h]  # one advantage per segment
        for n in tree.nodes:  # std-normalised sibling advantages sum to zero at each branch point
            if n.id == ROOT or len(n.children) >= 2:
                assert sum(adv[c] for c in n.children) == pytest.approx(0.0, abs=1e-9)
