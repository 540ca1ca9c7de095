"""RolloutTree: structure, recursive targets, contrast pairs (hand values + brute force), JSON."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from trace_gym.tree import ROOT, RolloutTree


def rollout(tree: RolloutTree, anchor: int, rewards_or_len, reward: float | None = None) -> list[int]:
    """Append a branch of ``n`` turns below ``anchor`` ending with ``reward``; returns its node ids."""
    n = rewards_or_len
    b = tree.start_branch(anchor)
    ids, node = [], anchor
    for t in range(n):
        last = t == n - 1
        node = tree.add_turn(
            node,
            branch=b,
            policy_token_ids=[100 + node, 200 + node],
            observation_token_ids=[300 + node],
            logprobs=[-0.5, -0.25],
            snapshot=("state", node),
            reward=reward if last else None,
            terminal=last,
        )
        ids.append(node)
    return ids


def failure_expanded_tree() -> tuple[RolloutTree, dict[str, int]]:
    """Root rollouts A (fails) and B (succeeds), two turns each; A's first turn expanded twice.

        root ── a1 ── a2 (r=0)            A: observed failure
          │      ├── c2 (r=1)             continuation 1 from a1
          │      └── d2 (r=0)             continuation 2 from a1
          └── b1 ── b2 (r=1)            B: success
    """
    tree = RolloutTree(task_id="t", prompt_token_ids=[1, 2, 3], snapshot="s0")
    a1, a2 = rollout(tree, ROOT, 2, 0.0)
    b1, b2 = rollout(tree, ROOT, 2, 1.0)
    (c2,) = rollout(tree, a1, 1, 1.0)
    (d2,) = rollout(tree, a1, 1, 0.0)
    return tree, dict(a1=a1, a2=a2, b1=b1, b2=b2, c2=c2, d2=d2)


def test_recursive_targets_differ_from_pooled_mean_after_expansion_below_failure():
    tree, n = failure_expanded_tree()
    t = tree.targets()
    # a1's children are a2 (0), c2 (1), d2 (0): 1/3.  b1 -> b2: 1.  root: mean(1/3, 1) = 2/3.
    assert t[n["a1"]] == pytest.approx(1 / 3)
    assert t[n["b1"]] == pytest.approx(1.0)
    assert t[ROOT] == pytest.approx(2 / 3)
    # Pooled: the 4 leaves below the root, 2 of them grown because A failed: (0 + 1 + 0 + 1) / 4.
    pooled = tree.pooled_targets()
    assert pooled[ROOT] == pytest.approx(0.5)
    assert pooled[n["a1"]] == pytest.approx(1 / 3)
    # The two root rollouts alone (no expansion) say 1/2 as well; the recursive mean keeps
    # each root rollout at weight 1/2 however many continuations its subtree received.
    assert t[ROOT] != pytest.approx(pooled[ROOT])
    assert all(t[leaf.id] == leaf.reward for leaf in tree.leaves())


def test_fresh_targets_drop_the_child_that_triggered_the_expansion():
    tree, n = failure_expanded_tree()
    fresh = tree.targets("fresh")
    # a1 was expanded (c2, d2 are continuations anchored there): mean(1, 0) = 1/2, without a2.
    assert fresh[n["a1"]] == pytest.approx(1 / 2)
    assert fresh[n["b1"]] == pytest.approx(1.0)  # not expanded: its one child, as before
    assert fresh[ROOT] == pytest.approx((1 / 2 + 1.0) / 2)  # root rollouts are never outcome-triggered
    recursive = tree.targets("recursive")
    assert recursive == tree.targets()
    assert {k: v for k, v in fresh.items() if k != n["a1"] and k != ROOT} == {
        k: v for k, v in recursive.items() if k != n["a1"] and k != ROOT}
    # a tree without continuations: both estimators are the same numbers
    plain = RolloutTree()
    rollout(plain, ROOT, 3, 1.0)
    rollout(plain, ROOT, 2, 0.0)
    assert plain.targets("fresh") == plain.targets("recursive")
    with pytest.raises(ValueError, match="unknown target estimator 'pooled'"):
        tree.targets("pooled")  # type: ignore[arg-type]


def test_path_tokens_is_one_episode_for_a_trainer():
    tree, n = failure_expanded_tree()
    tokens, mask, logprobs = tree.path_tokens(n["c2"])  # the continuation from a1: root, a1, c2
    a1 = n["a1"]  # the helper names each turn's tokens after its parent's id
    assert tokens == [1, 2, 3, 100, 200, 300, 100 + a1, 200 + a1, 300 + a1]
    assert mask == [0, 0, 0, 1, 1, 0, 1, 1, 0]
    assert logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -0.5, -0.25, 0.0]
    assert (tokens, mask) == tree.context(n["c2"])
    bare = RolloutTree(prompt_token_ids=[7])
    leaf = bare.add_turn(ROOT, branch=bare.start_branch(), policy_token_ids=[8, 9], reward=1.0, terminal=True)
    t, m, lp = bare.path_tokens(leaf)
    assert (t, m) == ([7, 8, 9], [0, 1, 1]) and lp[0] == 0.0 and all(np.isnan(lp[1:]))  # unrecorded: NaN


def test_contrast_pairs_hand_example():
    tree, n = failure_expanded_tree()
    # Pairs: (a2,b2),(d2,b2) anchored at the root; (a2,c2),(d2,c2) anchored at a1 (depth 1).
    assert tree.contrast_pairs() == {0: 2, 1: 2}
    assert tree.contrast_pairs_by_anchor() == {ROOT: 2, n["a1"]: 2}
    assert tree.is_mixed()


def _brute_force_pairs(tree: RolloutTree) -> dict[int, int]:
    out: dict[int, int] = {}
    for x, y in itertools.combinations(tree.leaves(), 2):
        if x.success == y.success:
            continue
        px, py = tree.path(x.id), tree.path(y.id)
        common = [a for a, b in zip(px, py) if a == b]
        depth = tree.node(common[-1]).depth
        out[depth] = out.get(depth, 0) + 1
    return dict(sorted(out.items()))


def _random_tree(rng: np.random.Generator) -> RolloutTree:
    tree = RolloutTree()
    for _ in range(int(rng.integers(1, 5))):
        rollout(tree, ROOT, int(rng.integers(1, 5)), float(rng.random() < 0.5))
    for _ in range(int(rng.integers(0, 8))):
        inner = [nd.id for nd in tree if not nd.terminal and nd.id != ROOT]
        if not inner:
            break
        anchor = int(rng.choice(inner))
        rollout(tree, anchor, int(rng.integers(1, 4)), float(rng.random() < 0.5))
    return tree


def test_contrast_pairs_match_brute_force_and_partition_all_pairs():
    rng = np.random.default_rng(0)
    for _ in range(300):
        tree = _random_tree(rng)
        pairs = tree.contrast_pairs()
        assert pairs == _brute_force_pairs(tree)
        s = sum(leaf.success for leaf in tree.leaves())
        f = len(tree.leaves()) - s
        assert sum(pairs.values()) == s * f
        assert tree.is_mixed() == (s > 0 and f > 0)


def test_recursive_targets_match_definition_on_random_trees():
    rng = np.random.default_rng(1)
    for _ in range(100):
        tree = _random_tree(rng)
        t = tree.targets()
        for nd in tree:
            if nd.terminal:
                assert t[nd.id] == nd.reward
            else:
                assert t[nd.id] == pytest.approx(np.mean([t[c] for c in nd.children]))


def test_edges_each_once_and_context_masks():
    tree, n = failure_expanded_tree()
    edges = tree.edges()
    assert len(edges) == len(tree) - 1
    assert sorted(child for _, child in edges) == list(range(1, len(tree)))
    assert (n["a1"], n["c2"]) in edges and (ROOT, n["a1"]) in edges
    tokens, mask = tree.context(n["a2"])
    # root obs [1,2,3]; a1: policy [101, 201] obs [301]; a2 (parent a1=1): policy [101+1...]
    assert tokens == [1, 2, 3, 100, 200, 300, 101, 201, 301]
    assert mask == [0, 0, 0, 1, 1, 0, 1, 1, 0]


def test_branches_continuations_and_expansion_candidates():
    tree, n = failure_expanded_tree()
    assert [b.is_continuation for b in tree.branches] == [False, False, True, True]
    assert not tree.node(n["a1"]).is_continuation
    assert tree.node(n["c2"]).is_continuation and tree.node(n["c2"]).branch == 2
    # Non-terminal turns t >= 1 of root rollouts, with the reward their rollout ended with.
    assert tree.expansion_candidates() == [(n["a1"], 0.0), (n["b1"], 1.0)]
    assert tree.is_complete()
    assert tree.branch_leaf(0) == n["a2"]


def test_targets_skip_unfinished_branches_and_candidates_need_finished_roots():
    tree = RolloutTree()
    b = tree.start_branch(ROOT)
    a1 = tree.add_turn(ROOT, branch=b)
    assert tree.targets() == {}
    assert not tree.is_complete()
    with pytest.raises(ValueError, match="has not finished"):
        tree.expansion_candidates()
    tree.add_turn(a1, branch=b, reward=1.0, terminal=True)
    assert tree.targets() == {2: 1.0, 1: 1.0, 0: 1.0}
    assert not tree.is_mixed()


def test_building_errors_name_the_problem():
    tree, n = failure_expanded_tree()
    with pytest.raises(ValueError, match="leaf"):
        tree.add_turn(n["a2"], branch=0)
    with pytest.raises(ValueError, match="episode already ended"):
        tree.start_branch(n["b2"])
    with pytest.raises(ValueError, match="unknown branch 9"):
        tree.add_turn(n["a1"], branch=9)
    with pytest.raises(ValueError, match="needs a reward"):
        tree.add_turn(n["a1"], branch=0, terminal=True)
    with pytest.raises(ValueError, match="non-terminal"):
        tree.add_turn(n["a1"], branch=0, reward=1.0)
    with pytest.raises(ValueError, match="logprobs has 1 entries for 2"):
        tree.add_turn(n["a1"], branch=0, policy_token_ids=[1, 2], logprobs=[0.0])
    with pytest.raises(KeyError, match="no node 99"):
        tree.node(99)


def test_json_round_trip_drops_snapshots():
    tree, n = failure_expanded_tree()
    text = tree.to_json()
    assert "state" not in text  # the snapshots ("state", id) are not serialised
    back = RolloutTree.from_json(text)
    assert back.to_dict() == json.loads(text)
    assert all(nd.snapshot is None for nd in back)
    assert back.targets() == tree.targets()
    assert back.contrast_pairs() == tree.contrast_pairs()
    assert back.expansion_candidates() == tree.expansion_candidates()
    assert back.node(n["a1"]).logprobs == (-0.5, -0.25)
    with pytest.raises(ValueError, match="position 1 has id 5"):
        d = tree.to_dict()
        d["nodes"][1]["id"] = 5
        RolloutTree.from_dict(d)


def test_targets_are_outcomes_when_rewards_leave_zero_one():
    # GEM: -0.1 for a format error, partial credit 0.7 or 0.3; the predictor regresses success
    tree = RolloutTree()
    first = rollout(tree, ROOT, 2, -0.1)
    rollout(tree, ROOT, 1, 0.7)
    rollout(tree, first[0], 1, 0.3)
    targets = tree.targets(outcomes=True)
    assert targets[first[-1]] == 0.0 and sorted(targets[leaf.id] for leaf in tree.leaves()) == [0.0, 0.0, 1.0]
    assert all(0.0 <= v <= 1.0 for v in targets.values()) and targets[ROOT] == pytest.approx(0.5)
    assert tree.pooled_targets(outcomes=True)[ROOT] == pytest.approx(1 / 3)
    # the advantages' values stay rewards
    assert tree.targets()[first[-1]] == -0.1 and tree.targets()[ROOT] == pytest.approx(((-0.1 + 0.3) / 2 + 0.7) / 2)


def test_prefix_depths_are_numpys_evenly_spaced_points_rounded_half_to_even():
    """Brute force against numpy.linspace + numpy.round (what a bank recording kept before the function
    moved here without numpy), every length and cap up to 60."""
    import numpy as np

    from trace_gym.tree import prefix_depths

    def by_numpy(turns, cap):
        depths = list(range(1, max(turns, 1)))
        if cap is None or len(depths) <= cap:
            return depths
        return [depths[i] for i in np.round(np.linspace(0, len(depths) - 1, cap)).astype(int)]

    assert all(prefix_depths(t, c) == by_numpy(t, c) for t in range(61) for c in (None, *range(1, 61)))
    assert prefix_depths(10, 3) == [1, 5, 9] and prefix_depths(5, 2) == [1, 4] and prefix_depths(1, 2) == []
