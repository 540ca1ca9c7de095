"""evaluators.bfcl: per-category and overall scores, policy runs, result-file replay, reports."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("bfcl_eval")

from environments.bfcl import data  # noqa: E402
from environments.bfcl.env import END_TURN, BFCLEnv  # noqa: E402
from evaluators.bfcl import EntryResult, replay_results, run_ground_truth, run_policy, score, write_report  # noqa: E402
from evaluators.bfcl.__main__ import main  # noqa: E402


def test_overall_is_the_unweighted_mean_of_categories():
    rows = [EntryResult(f"multi_turn_base_{i}", "multi_turn_base", i < 3, None if i < 3 else {"check": "x"}) for i in range(4)]
    rows += [EntryResult("multi_turn_miss_func_0", "multi_turn_miss_func", False, {"check": "y"})]
    rows += [EntryResult(f"multi_turn_long_context_{i}", "multi_turn_long_context", True) for i in range(2)]
    rows += [EntryResult("multi_turn_miss_param_0", "multi_turn_miss_param", True)]
    s = score(rows)
    assert s.categories["multi_turn_base"].accuracy == 0.75
    assert s.categories["multi_turn_base"].failures == {"x": 1}
    assert math.isclose(s.overall, (0.75 + 1.0 + 0.0 + 1.0) / 4) and s.overall_complete and s.entries == 8
    partial = score(rows[:4])
    assert not partial.overall_complete and partial.overall == 0.75


def test_score_rejects_duplicates_and_unknown_things():
    row = EntryResult("multi_turn_base_0", "multi_turn_base", True)
    with pytest.raises(ValueError, match="twice"):
        score([row, row])
    with pytest.raises(TypeError):
        score([3])
    with pytest.raises(ValueError, match="terminal"):
        score([{"turn": 1}])


def test_ground_truth_policy_scores_one_and_a_silent_policy_zero():
    gt = score(run_ground_truth(limit=3))
    assert gt.overall == 1.0 and gt.entries == 12
    silent = score(run_policy(lambda history: "Sure.", categories=["multi_turn_base"], limit=3))
    assert silent.overall == 0.0 and silent.categories["multi_turn_base"].failures == {"multi_turn:empty_turn_model_response": 3}


def test_policy_sees_the_conversation():
    seen = []

    def policy(history):
        seen.append([m.role for m in history])
        return "I cannot help."

    run_policy(policy, categories=["multi_turn_base"], limit=1)
    assert seen[0] == ["system", "user"] and seen[1] == ["system", "user", "assistant", "user"]


def _record(task_id: str) -> dict:
    env = BFCLEnv(category=data.category_of(task_id))
    actions = env.reference_actions(task_id)
    turns, current = [], []
    for action in actions:
        current.append(action)
        if action == END_TURN:
            turns.append(current)
            current = []
    return {"id": task_id, "result": turns}


def test_replay_bfcl_result_records():
    good = _record("multi_turn_miss_func_2")
    short = {"id": "multi_turn_base_1", "result": _record("multi_turn_base_1")["result"][:-1]}
    raw = {"id": "multi_turn_base_0", "result": [["[" + ", ".join(t) + "]", "done"] if t else ["done"] for t in data.get_entry("multi_turn_base_0")["ground_truth"]]}
    looping = {"id": "multi_turn_base_2", "result": [["[ls()]"] * 21]}
    results = {r.task_id: r for r in replay_results([good, short, raw, looping])}
    assert results["multi_turn_miss_func_2"].valid
    assert not results["multi_turn_base_1"].valid
    assert results["multi_turn_base_0"].failure["check"] == "multi_turn:execution_response_mismatch"  # sort('x') loses its arg
    assert results["multi_turn_base_2"].failure["check"] == "multi_turn:force_terminated"


def test_write_report_and_cli(tmp_path):
    results = run_ground_truth(categories=["multi_turn_base"], limit=2)
    json_path, md_path = write_report(score(results), tmp_path / "r", results)
    payload = json.loads(json_path.read_text())
    assert payload["categories"]["multi_turn_base"]["correct"] == 2 and len(payload["results"]) == 2
    assert "| multi_turn_base" in md_path.read_text()

    results_file = tmp_path / "BFCL_v4_multi_turn_base_result.json"
    results_file.write_text("\n".join(json.dumps(_record(f"multi_turn_base_{i}")) for i in range(3)))
    assert main(["--results", str(tmp_path), "--categories", "multi_turn_base", "--out", str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "bfcl_scores.json").read_text())
    assert cli["categories"]["multi_turn_base"] == {"category": "multi_turn_base", "entries": 3, "correct": 3, "accuracy": 1.0, "failures": {}}
