"""`trace-gym compare`: grouping seeds, intervals, the 'cannot be told apart' verdict, plots."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from trace_gym.runs.compare import group_runs, load_run, run_compare


def make_run(path, strategy, seed, rewards, after=None, before=None, budget=16.0):
    path.mkdir(parents=True)
    cfg = {"run_dir": str(path), "strategy": strategy, "advantage": "treerpo", "seed": seed, "steps": len(rewards)}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = []
    for i, r in enumerate(rewards, 1):
        lines.append(json.dumps({"step": i, "reward": r, "effective_ratio": r / 2, "nominal_budget": budget,
                                 "generated_tokens": 100 * i, "step_seconds": 10.0, "prefill_tokens_uncached": 5,
                                 "env_steps": 3, "seconds": {"generation": 6.0, "policy_update": 3.0,
                                                             "predictor_scoring": 0.5}}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "evals").mkdir()
    for step, scores in ((0, before), (len(rewards), after)):
        if scores is not None:
            per_task = {f"t{i}": [float(s)] for i, s in enumerate(scores)}
            (path / "evals" / f"step-{step}.json").write_text(json.dumps(
                {"accuracy": float(np.mean(scores)), "accuracy_ci": [0.1, 0.9], "per_task": per_task}))
    return path


def test_paired_verdicts_and_seed_groups(tmp_path):
    base = [0] * 30 + [1] * 10
    better = [1] * 12 + [0] * 18 + [1] * 10  # 12 of 40 tasks flipped to correct, none lost
    a = make_run(tmp_path / "a", "uniform", 0, [0.2, 0.3], after=base, before=base)
    b = make_run(tmp_path / "b", "trace", 0, [0.3, 0.4], after=better, before=base)
    c = make_run(tmp_path / "c", "pcl", 0, [0.3, 0.4], after=base[:-1] + [0], before=base)  # one task lost
    text = run_compare([a, b, c], out_dir=str(tmp_path / "out"))
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    # b - a: d = 1 on 12 tasks, 0 on 28. Agresti-Min: W = 42, centre 12/42,
    # v = ((12 + 1)/42 - (12/42)^2)/42, bounds centre -/+ 1.96 sqrt(v) = [+14.1, +43.0] points
    centre, v = 12 / 42, (13 / 42 - (12 / 42) ** 2) / 42
    lo, hi = 100 * (centre - 1.959964 * math.sqrt(v)), 100 * (centre + 1.959964 * math.sqrt(v))
    assert (round(lo, 1), round(hi, 1)) == (14.1, 43.0)
    b_row = rows["b (1 seed)"]  # labelled by the folder, not by strategy / advantage
    assert f"+30.0 pts [{lo:+.1f}, {hi:+.1f}] (paired over 40 tasks): distinguishable" in b_row
    # c - a: one task lost (n21 = 1): centre -1/42, v = (2/42 - (1/42)^2)/42
    centre, v = -1 / 42, (2 / 42 - (1 / 42) ** 2) / 42
    lo, hi = 100 * (centre - 1.959964 * math.sqrt(v)), 100 * (centre + 1.959964 * math.sqrt(v))
    pcl_row = rows["c (1 seed)"]
    assert f"-2.5 pts [{lo:+.1f}, {hi:+.1f}] (paired over 40 tasks): cannot be told apart" in pcl_row
    assert "reference" in rows["a (1 seed)"]
    # within a run: after - before, paired over the same 40 tasks
    assert "(paired over 40 tasks): a real change" in b_row
    # no task changed: still an interval, +-1.96 / 42 = +-4.7 points, not "+0.0 ± 0.0"
    assert "+0.0 pts [-4.7, +4.7] (paired over 40 tasks): no detectable change" in rows["a (1 seed)"]
    # held-out accuracy carries Wilson's interval recomputed from the per-task outcomes
    # (10 of 40: [14.2, 40.2]), not the eval file's stored [10, 90]
    assert "| 25.0 [14.2, 40.2]" in rows["a (1 seed)"]
    assert "mix" not in text  # one env, one suite: no warning
    for png in ("reward.png", "effective_ratio.png", "accuracy.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000
    assert (tmp_path / "out" / "compare.md").read_text().startswith("| run")


def test_seeds_form_one_row_with_intervals(tmp_path):
    runs = [make_run(tmp_path / f"s{s}", "trace", s, [0.1 * (s + 1)] * 2, after=[s % 2] * 10) for s in range(3)]
    other = [make_run(tmp_path / f"u{s}", "uniform", s, [0.1] * 2, after=[0] * 10) for s in range(2)]
    groups = group_runs([load_run(p) for p in runs + other])
    assert [len(g) for g in groups.values()] == [3, 2]
    text = run_compare(runs + other)
    trace_row = next(line for line in text.splitlines() if line.startswith("| s0, s1, s2 (3 seeds)"))
    # train reward over seeds: means 0.1, 0.2, 0.3 -> 0.200 ± t(.975, 2) * 0.1 / sqrt(3) = 0.248
    assert "0.200 ± 0.248" in trace_row
    uniform_row = next(line for line in text.splitlines() if line.startswith("| u0, u1"))
    assert "2 seeds each" in uniform_row and "cannot be told apart" in uniform_row
    # uniform's two seeds trained with the same reward: no spread, said so, not "± 0.000"
    assert "0.100 ± 0 (all 2 equal)" in uniform_row


def test_zero_observed_variance_still_has_a_wide_interval(tmp_path):
    # 5 tasks, every one wrong before and after, in both runs: the paired difference has
    # zero observed variance, yet 5 tasks cannot make a difference certain: +-1.96 / 7
    a = make_run(tmp_path / "a", "uniform", 0, [0.0], after=[0] * 5, before=[0] * 5)
    b = make_run(tmp_path / "b", "trace", 0, [0.0], after=[0] * 5, before=[0] * 5)
    text = run_compare([a, b])
    half = 100 * 1.959964 / 7
    assert f"+0.0 pts [{-half:+.1f}, {half:+.1f}] (paired over 5 tasks): cannot be told apart" in text
    assert "0.0 [0.0, 43.4]" in text  # Wilson of 0 of 5, not [0.0, 0.0]
    assert "± 0.0 pts" not in text


def test_seeds_that_all_agree_tell_nothing_apart(tmp_path):
    runs = [make_run(tmp_path / f"t{s}", "trace", s, [0.1], after=[1, 0], before=[0, 0]) for s in range(2)]
    other = [make_run(tmp_path / f"u{s}", "uniform", s, [0.1], after=[0, 0], before=[0, 0]) for s in range(2)]
    text = run_compare(other + runs)
    trace_row = next(line for line in text.splitlines() if line.startswith("| t0, t1"))
    # every seed gained exactly 50 points: no spread over seeds to build an interval from
    assert "+50.0 ± 0 (every seed equal) pts (over 2 seeds): no detectable change" in trace_row
    assert "+50.0 ± 0 (every seed equal) pts (2 seeds each): cannot be told apart" in trace_row


def test_mixing_envs_or_suites_says_so_in_one_line(tmp_path):
    a = make_run(tmp_path / "a", "uniform", 0, [0.2], after=[0, 1], before=[0, 1])
    b = make_run(tmp_path / "b", "trace", 0, [0.2], after=[0, 1], before=[0, 1])
    c = make_run(tmp_path / "c", "trace", 1, [0.2], after=[0, 1], before=[0, 1])
    for run, env, suite in ((a, "math_python", "generated"), (b, "guess_number", "generated"),
                            (c, "math_python", "math500")):
        cfg = yaml.safe_load((run / "config.yaml").read_text()) | {"env": env, "eval_suite": suite}
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    text = run_compare([a, b, c])
    first = text.splitlines()[0]
    assert first.startswith("WARNING: these runs mix envs math_python (a, c); guess_number (b) and eval suites "
                            "generated (a, b); math500 (c)")
    assert sum("WARNING" in line for line in text.splitlines()) == 1
    assert "| a (1 seed)" in text  # still tabulated: existing usage keeps working
    same = run_compare([a])  # one env, one suite
    assert "WARNING" not in same


def test_not_a_run_dir(tmp_path):
    with pytest.raises(ValueError, match="neither a run directory"):
        load_run(tmp_path)


def test_accuracy_plot_draws_intervals_and_spreads_coincident_groups(tmp_path):
    from trace_gym.runs.compare import _accuracy_bars, side_offsets

    a = make_run(tmp_path / "a", "uniform", 0, [0.2, 0.3], after=[1] * 10 + [0] * 30, before=[0] * 40)
    b = make_run(tmp_path / "b", "trace", 0, [0.2, 0.3], after=[1] * 10 + [0] * 30, before=[0] * 40)  # identical
    run = load_run(a)
    low, high = _accuracy_bars([run], [0, 2])
    # step 0: 0 of 40 -> Wilson [0, 8.8 %]; step 2: 10 of 40 -> [14.2, 40.2] % around 25 %
    assert low[0] == 0 and high[0] == pytest.approx(0.0876, abs=1e-3)
    assert (0.25 - low[1], 0.25 + high[1]) == pytest.approx((0.1419, 0.4017), abs=1e-3)
    seeds = [load_run(make_run(tmp_path / f"s{i}", "pcl", i, [0.1], after=[i % 2] * 10)) for i in range(3)]
    low, high = _accuracy_bars(seeds, [1])  # over seeds: 1/3 +- t(.975, 2) * sd / sqrt(3), clipped to [0, 1]
    half = 4.302653 * np.std([0, 1, 0], ddof=1) / math.sqrt(3)
    assert low[0] == pytest.approx(1 / 3 - max(0.0, 1 / 3 - half)) and high[0] == pytest.approx(min(1.0, 1 / 3 + half) - 1 / 3)
    shifts = side_offsets(2, 100.0)
    assert shifts.tolist() == pytest.approx([-0.75, 0.75]) and len(set(side_offsets(5, 10.0).tolist())) == 5
    run_compare([a, b], out_dir=str(tmp_path / "out"))
    assert (tmp_path / "out" / "accuracy.png").stat().st_size > 1000
