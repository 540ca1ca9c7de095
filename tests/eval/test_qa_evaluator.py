"""evaluators/qa: per-dataset and average tables, prediction files, and policies run through the env."""

from __future__ import annotations

import json

import pytest

from environments.wiki_qa.data import offline_tasks
from evaluators.qa import SUITES, QARecord, load_predictions, markdown, run_policy, score, score_records
from evaluators.qa.__main__ import main


def test_dataset_and_average_scores_by_hand():
    results = {
        "hotpotqa": [{"id": "1", "prediction": "Paris", "golden_answers": ["Paris"]},
                     {"id": "2", "prediction": "Paris France", "golden_answers": ["Paris"]}],
        "2wiki": [{"id": "3", "prediction": None, "golden_answers": ["yes"]}],
    }
    s = score(results)
    hp = s.datasets["hotpotqa"]
    assert (hp.n, hp.em, hp.answered) == (2, 0.5, 1.0) and hp.f1 == pytest.approx((1 + 2 / 3) / 2)
    assert s.datasets["2wiki"].em == 0.0 and s.datasets["2wiki"].answered == 0.0
    assert s.average_em == pytest.approx(0.25) and s.average_f1 == pytest.approx((1 + 2 / 3) / 4)
    assert not s.complete
    table = markdown(s)
    assert "| hotpotqa | 2 | 50.0 | 83.3 | 100 % |" in table and "average (2 datasets)" in table


def test_all_four_suites_make_a_complete_average():
    assert list(SUITES) == ["hotpotqa", "2wiki", "musique", "bamboogle"]
    results = {name: [QARecord("x", "a", ("a",)), QARecord("y", "b", ("c",))] for name in SUITES}
    s = score(results)
    assert s.complete and s.average_em == 0.5 and "**average**" in markdown(s)
    assert all(suite.env_id == "trace_gym/WikiQA-v0" for suite in SUITES.values())


def test_records_and_errors():
    assert QARecord.coerce({"task_id": "t", "prediction": "x", "golden_answers": "x"}) == QARecord("t", "x", ("x",))
    with pytest.raises(ValueError, match="no golden_answers"):
        score_records("d", [{"id": "q", "prediction": "x"}])
    with pytest.raises(ValueError, match="no records"):
        score_records("d", [])


def test_flashrag_prediction_files_and_the_command_line(tmp_path, capsys):
    path = tmp_path / "bamboogle.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "b0", "pred": "Sadi Carnot", "golden_answers": ["Sadi Carnot", "Marie François Sadi Carnot"]},
        {"id": "b1", "pred": "the Queen", "golden_answers": ["Queen Victoria"]},
    ]))
    records = load_predictions(path)
    assert records[0] == QARecord("b0", "Sadi Carnot", ("Sadi Carnot", "Marie François Sadi Carnot"))
    assert main([f"bamboogle={path}", "--out", str(tmp_path / "report")]) == 0
    printed = capsys.readouterr().out
    assert "| bamboogle | 2 | 50.0 | 83.3 | 100 % |" in printed  # F1: (1 + 2/3) / 2; "queen" vs "queen victoria"
    saved = json.loads((tmp_path / "report" / "qa_scores.json").read_text())
    assert saved["datasets"]["bamboogle"]["em"] == 0.5


def test_a_policy_run_through_the_env_is_scored():
    tasks = offline_tasks(4, seed=2, scale=0.03)

    def oracle(messages):  # follows the hop queries, then answers the gold answer
        task = next(t for t in tasks if messages[-1].content.endswith(t.prompt) or
                    any(m.content.endswith(t.prompt) for m in messages))
        searches = sum(1 for m in messages if m.role == "assistant")
        hops = task.metadata["hop_queries"]
        return f"<search>{hops[searches]}</search>" if searches < len(hops) else f"<answer>{task.answer[0]}</answer>"

    records = run_policy(oracle, tasks, searcher="offline", offline_scale=0.03)
    assert [r.prediction for r in records] == [t.answer[0] for t in tasks]
    assert score_records("synthetic", records).em == 1.0
    silent = run_policy(lambda messages: "hmm", tasks[:2], searcher="offline", offline_scale=0.03, max_turns=2)
    assert [r.prediction for r in silent] == [None, None] and score_records("s", silent).em == 0.0
