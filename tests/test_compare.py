"""`trace-gym compare`: grouping seeds, intervals, the 'cannot be told apart' verdict, plots."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from trace_gym.compare import group_runs, load_run, run_compare


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
    # b - a: d = 1 on 12 tasks, 0 on 28: mean 0.3, t-interval half-width t(.975, 39) * sd / sqrt(40)
    d = np.array([1.0] * 12 + [0.0] * 28)
    half = 2.0227 * d.std(ddof=1) / math.sqrt(40)
    assert f"+30.0 ± {100 * half:.1f} pts (paired over 40 tasks): distinguishable" in rows["trace / treerpo (1 seed)"]
    assert "-2.5 ± 5.1 pts (paired over 40 tasks): cannot be told apart" in rows["pcl / treerpo (1 seed)"]
    assert "reference" in rows["uniform / treerpo (1 seed)"]
    # within a run: after - before, paired over the same 40 tasks
    assert f"+30.0 ± {100 * half:.1f} pts (paired over 40 tasks): a real change" in rows["trace / treerpo (1 seed)"]
    assert "+0.0 ± 0.0 pts (paired over 40 tasks): no detectable change" in rows["uniform / treerpo (1 seed)"]
    for png in ("reward.png", "effective_ratio.png", "accuracy.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000
    assert (tmp_path / "out" / "compare.md").read_text().startswith("| run")


def test_seeds_form_one_row_with_intervals(tmp_path):
    runs = [make_run(tmp_path / f"s{s}", "trace", s, [0.1 * (s + 1)] * 2, after=[s % 2] * 10) for s in range(3)]
    other = [make_run(tmp_path / f"u{s}", "uniform", s, [0.1] * 2, after=[0] * 10) for s in range(2)]
    groups = group_runs([load_run(p) for p in runs + other])
    assert [len(g) for g in groups.values()] == [3, 2]
    text = run_compare(runs + other)
    trace_row = next(line for line in text.splitlines() if line.startswith("| trace / treerpo (3 seeds)"))
    # train reward over seeds: means 0.1, 0.2, 0.3 -> 0.200 ± t(.975, 2) * 0.1 / sqrt(3) = 0.248
    assert "0.200 ± 0.248" in trace_row
    uniform_row = next(line for line in text.splitlines() if line.startswith("| uniform"))
    assert "2 seeds each" in uniform_row and "cannot be told apart" in uniform_row


def test_not_a_run_dir(tmp_path):
    with pytest.raises(ValueError, match="not a run directory"):
        load_run(tmp_path)
