"""Intervals of binary outcomes over tasks (eval accuracy, compare's paired differences) and
of continuous quantities over repetitions: hand-computed values, and no zero-width interval
where the data cannot make a number certain."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from evaluators.math.metrics import clustered_wilson_interval, wilson_interval
from trace_gym import report

Z = 1.959964


def wilson_by_hand(p, n):
    denom = 1 + Z * Z / n
    centre = (p + Z * Z / (2 * n)) / denom
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / denom
    return centre - half, centre + half


def test_wilson_hand_values():
    # 0 of 5: the upper bound is z^2 / (n + z^2) = 3.8415 / 8.8415
    assert wilson_interval(0, 5) == pytest.approx((0.0, 0.4345), abs=1e-4)
    assert wilson_interval(0, 5)[0] == 0.0 and report.wilson_bounds(1.0, 5)[1] == 1.0
    assert report.wilson_bounds(0.0, 5) == pytest.approx((0.0, Z * Z / (5 + Z * Z)))
    assert wilson_interval(24, 64) == pytest.approx((0.26666, 0.49750), abs=1e-5)
    assert report.wilson_bounds(0.375, 64) == pytest.approx(wilson_by_hand(0.375, 64))
    assert all(math.isnan(x) for x in report.wilson_bounds(0.5, 0))
    with pytest.raises(ValueError, match="p must lie in"):
        report.wilson_bounds(1.5, 4)


def test_effective_sample_size_hand_values():
    # k = 1: n_eff = N, whatever the outcomes
    assert report.effective_sample_size([[1], [0], [1], [1], [0]]) == 5
    # 4 tasks x 2, every task agrees with itself (x = 1, 1, 0, 0): p = 1/2, s^2 = 1/4,
    # n_eff = 4 (1/4) / (1/4) = 4 = N: the design effect is k = 2
    assert report.effective_sample_size([[1, 1], [1, 1], [0, 0], [0, 0]]) == pytest.approx(4)
    # every task half right: s^2 = 0 with 0 < p < 1, so n_eff = n_max = N k = 8
    assert report.effective_sample_size([[1, 0]] * 4) == pytest.approx(8)
    # x = 1, 1, 0, 1/2: p = 5/8, s^2 = (2 (3/8)^2 + (5/8)^2 + (1/8)^2) / 4 = 11/64,
    # n_eff = 4 (5/8)(3/8) / (11/64) = 60/11, design effect 8 / (60/11) = 1.4667
    assert report.effective_sample_size([[1, 1], [1, 1], [0, 0], [1, 0]]) == pytest.approx(60 / 11)
    # all wrong: nothing tells how correlated a task's samples are; tasks are the unit
    assert report.effective_sample_size([[0, 0]] * 5) == 5
    # unequal sample counts: n_max = N^2 / sum(1/m_i) = 4 / (1 + 1/3) = 3
    assert report.effective_sample_size([[1], [0, 0, 0]]) == pytest.approx(2)  # clipped at N = 2
    assert report.effective_sample_size([[1], [1, 0, 1]]) == pytest.approx(3)  # p = 5/6, s^2 = 1/36 -> 10, cap 3
    with pytest.raises(ValueError, match="task 1 has no sampled outcome"):
        report.effective_sample_size([[1], []])
    with pytest.raises(ValueError, match=r"task 0: outcomes must lie in \[0, 1\]"):
        report.effective_sample_size([[2.0]])


def test_clustered_wilson_is_wilson_at_k_1_and_never_zero_width():
    rng = np.random.default_rng(0)
    for n in (1, 5, 17, 64):
        outcomes = rng.integers(0, 2, size=n)
        assert clustered_wilson_interval([[float(x)] for x in outcomes]) == pytest.approx(
            wilson_interval(int(outcomes.sum()), n))
    # the case: 5 tasks x 2 sampled answers, all wrong; was 0.0 [0.0, 0.0]
    lo, hi = clustered_wilson_interval([[0.0, 0.0]] * 5)
    assert (lo, hi) == pytest.approx((0.0, 0.4345), abs=1e-4) and hi - lo > 0
    assert clustered_wilson_interval([[1.0, 1.0]] * 5) == pytest.approx((1 - 0.4345, 1.0), abs=1e-4)
    assert clustered_wilson_interval([[1, 1], [1, 1], [0, 0], [0, 0]]) == pytest.approx(wilson_by_hand(0.5, 4))
    assert clustered_wilson_interval([[1, 0]] * 4) == pytest.approx(wilson_by_hand(0.5, 8))
    assert clustered_wilson_interval([[1, 1], [1, 1], [0, 0], [1, 0]]) == pytest.approx(wilson_by_hand(0.625, 60 / 11))
    assert all(math.isnan(x) for x in clustered_wilson_interval([]))


def test_eval_accuracy_over_five_tasks_with_zero_variance_has_width():
    from evaluators.suites import SUITES, score_episodes

    tasks = [SimpleNamespace(id=f"t{i}") for i in range(5)]
    episodes = [[SimpleNamespace(reward=0.0, own_turns=[]) for _ in range(2)] for _ in tasks]
    result = score_episodes(SUITES["generated"], tasks, episodes)
    lo, hi = result["accuracy_ci"]
    assert result["accuracy"] == 0.0 and hi - lo > 0


def test_paired_proportion_difference_hand_values():
    # 16 tasks, all agree: zero observed variance, yet +-z / (16 + 2)
    diff, lo, hi, n = report.paired_proportion_difference([0.0] * 16, [0.0] * 16)
    assert (diff, n) == (0.0, 16) and (lo, hi) == pytest.approx((-Z / 18, Z / 18))
    # 5 tasks, all agree: width > 0 (+-0.28)
    _, lo, hi, _ = report.paired_proportion_difference([1.0] * 5, [1.0] * 5)
    assert hi - lo == pytest.approx(2 * Z / 7) and hi - lo > 0
    # n12 = 3 tasks gained, n21 = 1 lost, 6 agree (N = 10): p12 = 3.5/12, p21 = 1.5/12,
    # bounds (p12 - p21) -/+ z sqrt((p12 + p21 - (p12 - p21)^2) / 12)
    a = [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]
    b = [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]
    p12, p21 = 3.5 / 12, 1.5 / 12
    half = Z * math.sqrt((p12 + p21 - (p12 - p21) ** 2) / 12)
    diff, lo, hi, n = report.paired_proportion_difference(a, b)
    assert diff == pytest.approx(0.2) and n == 10
    assert (lo, hi) == pytest.approx((p12 - p21 - half, p12 - p21 + half))
    # every task gained: clipped at 1
    assert report.paired_proportion_difference([1.0] * 5, [0.0] * 5)[2] == 1.0
    # per-task means (k samples): the same pseudo-task formula
    d = np.array([0.5, -0.5, 0.0, 1.0])
    w = 6.0
    centre, v = d.sum() / w, ((np.sum(d * d) + 1) / w - (d.sum() / w) ** 2) / w
    got = report.paired_proportion_difference([0.5, 0.0, 0.5, 1.0], [0.0, 0.5, 0.5, 0.0])
    assert got[1:3] == pytest.approx((centre - Z * math.sqrt(v), centre + Z * math.sqrt(v)))
    assert math.isnan(report.paired_proportion_difference([], [])[1])
    with pytest.raises(ValueError, match="length"):
        report.paired_proportion_difference([1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        report.paired_proportion_difference([2.0], [0.0])


def test_a_t_interval_over_equal_values_says_so():
    mean, half, n = report.mean_ci([0.1, 0.1, 0.1])
    assert mean == pytest.approx(0.1) and (half, n) == (0.0, 3)
    # equal up to rounding (0.6 - 0.4 != 0.2 in floating point): still exactly 0, not 1e-17
    assert report.paired_difference([0.5, 0.6, 0.7], [0.3, 0.4, 0.5])[1] == 0.0
    assert report.pm(mean, half, 3, n) == "0.100 ± 0 (all 3 equal)"
    assert report.pm(0.0, 0.0, 2) == "0.00 ± 0 (all equal)"
    assert not report.distinguishable(0.2, math.nan) and report.distinguishable(0.2, 0.1)
    assert not report.distinguishable(-0.05, 0.1)
    # no spread: the exact sign test, two-sided p = 2 / 2^n, apart from n = 6 at 95 %
    assert not report.distinguishable(0.2, 0.0, 5) and report.distinguishable(-0.2, 0.0, 6)
    assert not report.distinguishable(0.0, 0.0, 10) and not report.distinguishable(0.2, 0.0)  # unpaired: never
