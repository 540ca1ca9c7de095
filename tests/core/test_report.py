"""Report helpers: metrics on trees, Spearman, markdown, PNG plots."""

from __future__ import annotations

import math

import pytest

from trace_gym import report
from trace_gym.tree import ROOT, RolloutTree


def tree_with(rewards: list[float]) -> RolloutTree:
    """One 2-turn root rollout per reward (the first rollout's turn 1 is node 1)."""
    tree = RolloutTree()
    for r in rewards:
        b = tree.start_branch(ROOT)
        a = tree.add_turn(ROOT, branch=b)
        tree.add_turn(a, branch=b, reward=r, terminal=True)
    return tree


def test_effective_ratio_counts_prompts_with_rollouts():
    mixed = tree_with([1.0, 0.0, 0.0])
    all_fail = tree_with([0.0, 0.0])
    all_win = tree_with([1.0, 1.0, 1.0])
    empty = RolloutTree()  # skipped prompt: not counted
    assert report.effective_ratio([mixed, all_fail, all_win, empty]) == pytest.approx(1 / 3)
    assert math.isnan(report.effective_ratio([empty]))


def test_contrast_pairs_by_depth_sums_over_trees():
    t1 = tree_with([1.0, 0.0, 0.0])  # 1 success x 2 failures, all anchored at the root
    t2 = tree_with([1.0, 1.0, 0.0])
    b = t2.start_branch(1)  # a continuation from the first rollout's turn 1
    t2.add_turn(1, branch=b, reward=0.0, terminal=True)
    # t2 leaves: s1, s2, f3 (root rollouts) and f_cont (continuation below node 1, s1's turn).
    # Anchored at the root: s1-f3, s2-f3, s2-f_cont (3); at node 1 (depth 1): s1-f_cont.
    assert t2.contrast_pairs() == {0: 3, 1: 1}
    assert report.contrast_pairs_by_depth([t1, t2]) == {0: 5, 1: 1}


def test_continuations_by_depth_counts_ended_continuations_and_their_successes_by_anchor_depth():
    """Two trees of 2-turn roots: from a depth-1 prefix, one continuation wins and one fails in the first tree and
    one fails in the second; a continuation still running is not counted, and roots never are."""
    t1, t2 = tree_with([0.0, 0.0]), tree_with([1.0, 0.0])
    for tree, reward in ((t1, 1.0), (t1, 0.0), (t2, 0.0)):
        b = tree.start_branch(1)
        tree.add_turn(1, branch=b, reward=reward, terminal=True)
    t2.start_branch(1)  # running: no leaf yet
    assert report.continuations_by_depth([t1, t2]) == {1: (3, 1)}
    assert report.continuations_by_depth([tree_with([1.0, 0.0])]) == {}


def test_spearman_hand_values():
    assert report.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert report.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks (1,2,3) vs (1,3,2): 1 - 6 * 2 / (3 * 8) = 0.5
    assert report.spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert math.isnan(report.spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="shape"):
        report.spearman([1, 2], [1, 2, 3])
    by_depth = report.spearman_by_depth([1, 2, 3, 3, 2, 1], [1, 2, 3, 1, 2, 3], [0, 0, 0, 1, 1, 1])
    assert by_depth == {0: pytest.approx(1.0), 1: pytest.approx(-1.0)}


def test_spearman_within_weighs_each_depth_by_its_entries_and_skips_undefined_depths():
    # depth 1: 4 entries ranked alike (+1); depth 2: 3 ranked (1,3,2) (+0.5); depth 3: a constant side (NaN)
    p = [1, 2, 3, 4, 1, 2, 3, 5, 5, 5]
    t = [1, 2, 3, 4, 1, 3, 2, 1, 2, 3]
    d = [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert report.spearman_within(p, t, d) == pytest.approx((4 * 1.0 + 3 * 0.5) / 7)
    # across depths the same predictions rank the truth otherwise: within reads each depth apart
    assert math.isnan(report.spearman_within([1, 2, 10, 11], [5, 6, 1, 2], [1, 1, 2, 2]))  # 2 entries a depth
    assert report.spearman([1, 2, 3, 10, 11, 12], [5, 6, 7, 1, 2, 3]) < 0
    assert report.spearman_within([1, 2, 3, 10, 11, 12], [5, 6, 7, 1, 2, 3], [1, 1, 1, 2, 2, 2]) == pytest.approx(1.0)
    assert math.isnan(report.spearman_within([], [], []))


def test_mean_ci_and_pm_hand_values():
    # [1, 3]: mean 2, sample sd sqrt(2), t_{0.975, 1} = 12.7062 -> half = 12.7062 * sqrt(2) / sqrt(2)
    mean, half, n = report.mean_ci([1.0, 3.0, math.nan])
    assert (mean, n) == (2.0, 2) and half == pytest.approx(12.7062, abs=1e-4)
    # [1, 2, 3]: sd 1, t_{0.975, 2} = 4.3027 -> half = 4.3027 / sqrt(3)
    assert report.mean_ci([1.0, 2.0, 3.0])[1] == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)
    one = report.mean_ci([0.25])
    assert one[0] == 0.25 and math.isnan(one[1]) and one[2] == 1
    assert report.pm(0.5, 0.25, 2) == "0.50 ± 0.25"
    assert report.pm(0.5, math.nan, 2) == "0.50"  # one repetition: no interval printed


def test_paired_difference_tells_apart_only_consistent_gaps():
    mean, half, n = report.paired_difference([0.5, 0.6, 0.7], [0.3, 0.4, 0.5])
    assert mean == pytest.approx(0.2) and half == pytest.approx(0.0, abs=1e-12) and n == 3
    mean, half, _ = report.paired_difference([0.5, 0.1, 0.7], [0.3, 0.4, 0.5])
    assert abs(mean) < half  # inconsistent sign: not distinguishable
    with pytest.raises(ValueError, match="length"):
        report.paired_difference([1.0], [1.0, 2.0])


def test_markdown_table_exact():
    table = report.markdown_table(["name", "x"], [["a", 0.123456], ["bb", 12345.0]])
    assert table == "| name | x      |\n|------|--------|\n| a    | 0.123  |\n| bb   | 12,345 |"
    with pytest.raises(ValueError, match="1 cells for 2 headers"):
        report.markdown_table(["a", "b"], [["x"]])


def test_plots_write_png(tmp_path):
    png = b"\x89PNG"
    p1 = report.plot_bars(["a", "b"], [0.2, 0.6], [0.01, 0.02], tmp_path / "bars.png", ylabel="y", title="t", hline=(0.4, "2x"))
    p2 = report.plot_grouped({"a": {0: 1.0, 1: 2.0}, "b": {0: 3.0}}, tmp_path / "g" / "grouped.png", xlabel="d", ylabel="n", title="t")
    p3 = report.plot_root_allocation([0.5, 0.9], [2, 4], [[2, 0], [2, 2]], tmp_path / "root.png")
    for p in (p1, p2, p3):
        assert p.read_bytes()[:4] == png
