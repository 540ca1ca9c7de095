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
    assert report.total_contrast_pairs([t1, t2]) == 6


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


def test_mean_std_and_pm():
    assert report.mean_std([1.0, 3.0, math.nan]) == (2.0, 1.0)
    assert all(math.isnan(x) for x in report.mean_std([math.nan]))
    assert report.pm(0.5, 0.25, 2) == "0.50 ± 0.25"


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
