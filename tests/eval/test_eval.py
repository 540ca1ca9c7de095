"""Evaluation: pass@k and intervals against brute force, the held-out split, suites through the real
agent loop on a real (tiny) model, the result cache, and RUN@STEP policies."""

from __future__ import annotations

import itertools
import json
import math
import time

import pytest

from evaluators.run import EvalConfig, run_eval
from trace_gym.runs.policies import resolve_policy
from trace_gym.runs.weights import weights_hash
from evaluators.math.metrics import avg_at_k, mean_interval, pass_at_k, wilson_interval
from environments.train_data import TRAIN_DATA, generated_train
from evaluators.suites import SUITES, generated_heldout


def test_pass_at_k_matches_brute_force():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                brute = sum(any(i < c for i in s) for s in subsets) / len(subsets)  # samples 0..c-1 correct
                assert pass_at_k(n, c, k) == pytest.approx(brute)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_avg_and_intervals_hand_values():
    assert avg_at_k([[1, 0], [1, 1], [0, 0]]) == pytest.approx(0.5)
    lo, hi = wilson_interval(24, 64)  # p = 0.375
    z = 1.959964
    centre = (0.375 + z * z / 128) / (1 + z * z / 64)
    half = z * math.sqrt(0.375 * 0.625 / 64 + z * z / (4 * 64 * 64)) / (1 + z * z / 64)
    assert (lo, hi) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] > 0.2  # never a zero-width interval
    lo, hi = mean_interval([0.0, 0.5, 1.0])  # mean 0.5, sd 0.5, t(0.975, 2) = 4.303
    assert (lo, hi) == pytest.approx((0.5 - 4.3027 * 0.5 / math.sqrt(3), 0.5 + 4.3027 * 0.5 / math.sqrt(3)), abs=1e-3)


def test_heldout_prompts_never_reach_training():
    held = generated_heldout(64)
    assert len(held) == 64 and len({t.prompt for t in held}) == 64
    assert held == generated_heldout(64)  # deterministic
    train = generated_train(512, seed=0)
    assert not {t.prompt for t in held} & {t.prompt for t in train}
    assert not {t.prompt for t in held} & {t.prompt for t in TRAIN_DATA["generated"].load(512, seed=3)}


def test_eval_suite_on_a_local_math_file_is_cached(tmp_path, tiny_model_path):  # noqa: F811
    rows = [{"problem": "What is 2 + 2?", "answer": "4", "id": i} for i in range(3)]
    (tmp_path / "aime24.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = EvalConfig(policy=(str(tiny_model_path),), suites=("aime24",), data_dir=str(tmp_path), limit=0, samples=2,
                     temperature=1.0, pass_k=(1, 2), max_turns=2, max_turn_tokens=8, max_episode_tokens=1024,
                     out=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"), progress=False)
    t0 = time.perf_counter()
    (first,) = run_eval(cfg)
    assert first["tasks"] == 3 and first["samples"] == 2 and not first["cached"]
    assert set(first["per_task"]) == {"aime24/0", "aime24/1", "aime24/2"}
    assert all(len(v) == 2 for v in first["per_task"].values())
    assert set(first["pass_at_k"]) == {"1", "2"} and first["label"].startswith("ReAct (no RL): ")
    assert 0 <= first["accuracy"] <= 1 and first["accuracy_ci"][0] <= first["accuracy"] <= first["accuracy_ci"][1]
    slow = time.perf_counter() - t0
    t0 = time.perf_counter()
    (again,) = run_eval(cfg)
    assert again["cached"] and again["per_task"] == first["per_task"]
    assert time.perf_counter() - t0 < max(1.0, slow / 5)
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| aime24" in md and "pass@2 %" in md
    # another seed is another cache entry
    (other,) = run_eval(EvalConfig(**{**cfg.__dict__, "seed": 1}))
    assert not other["cached"]


def test_policy_specs_and_config_errors(tmp_path, tiny_model_path):  # noqa: F811
    from trace_gym.runs.run_dir import RunDir

    run = RunDir(tmp_path / "run")
    run.start("x: 1\n")
    for step in (1, 2):
        run.commit(step, {"step": step}, lambda f: (f / "policy").mkdir(), keep=0)
    assert resolve_policy(str(run.path))[0] == run.checkpoints / "step-2" / "policy"
    path, label, base = resolve_policy(f"{run.path}@1")
    assert path == run.checkpoints / "step-1" / "policy" and label == "run@1" and not base
    with pytest.raises(ValueError, match=r"no checkpoint for step 7; it has \[1, 2\]"):
        resolve_policy(f"{run.path}@7")
    assert resolve_policy(str(tiny_model_path))[2]
    with pytest.raises(ValueError, match="unknown suite"):
        EvalConfig(suites=("mmlu",))
    with pytest.raises(ValueError, match="identical samples"):
        EvalConfig(samples=4, temperature=0.0, pass_k=(1,))
    with pytest.raises(ValueError, match="pass_k"):
        EvalConfig(samples=2, temperature=1.0, pass_k=(4,))
    h = weights_hash(tiny_model_path)
    assert len(h) == 64 and weights_hash(tiny_model_path) == h


def test_suite_table_entries_are_complete():
    for name, suite in SUITES.items():
        assert suite.name == name and suite.env_id.startswith("trace_gym/") and suite.scorer in ("reward", "bfcl", "qa")
        assert callable(suite.load) and suite.description
    assert SUITES["generated"].offline and not SUITES["math500"].offline
    from evaluators.qa import SUITES as QA_SUITES

    assert all(SUITES[name].scorer == "qa" for name in QA_SUITES)  # the retrieval issue's suites, one entry each


def test_eval_cli_one_line_errors(tmp_path, capsys):
    from trace_gym.cli import main

    assert main(["eval", "--suite", "nope", f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown suite 'nope'" in err[0] and "aime24" in err[0]
    assert main(["eval", "--policy", str(tmp_path / "missing-run@3")]) == 2
    assert "not a run directory" in capsys.readouterr().err
