"""FlashRAG-format loaders on small local files, and the offline synthetic task set."""

from __future__ import annotations

import json

import pytest

from environments.wiki_qa.data import DATASETS, MULTI_HOP, canonical_name, load_tasks, offline_tasks, row_to_task

ROWS = {
    "hotpotqa": [
        {"id": "5a8b57f25542995d1e6f1371", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
         "golden_answers": ["yes"], "metadata": {"type": "comparison", "level": "hard"}},
        {"id": "5a8c7595554299585d9e36b6", "question": "What government position was held by the woman who "
         "portrayed Corliss Archer in the film Kiss and Tell?", "golden_answers": ["Chief of Protocol"],
         "metadata": {"type": "bridge"}},
    ],
    "2wiki": [{"id": "a1", "question": "Who was born first, A or B?", "golden_answers": ["A", "Alpha"],
               "metadata": {"type": "comparison"}}],
    "musique": [{"id": "2hop__1", "question": "Q?", "golden_answers": ["1996"], "metadata": {"answerable": True}}],
    "bamboogle": [{"id": "b0", "question": "Who was president when the Eiffel Tower was built?",
                   "golden_answers": ["Sadi Carnot", "Marie François Sadi Carnot"]}],
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name", ["hotpotqa", "2wiki", "musique", "bamboogle"])
def test_each_multi_hop_dataset_loads_from_a_local_jsonl_file(tmp_path, name):
    rows = ROWS[name]
    tasks = load_tasks(name, path=str(write_jsonl(tmp_path / f"{name}.jsonl", rows)))
    assert [t.id for t in tasks] == [f"{name}/{r['id']}" for r in rows]
    assert [t.prompt for t in tasks] == [r["question"] for r in rows]
    assert [t.answer for t in tasks] == [r["golden_answers"] for r in rows]
    assert all(t.source == name for t in tasks)
    assert dict(tasks[0].metadata) == rows[0].get("metadata", {})


def test_a_flashrag_folder_json_and_parquet(tmp_path):
    folder = tmp_path / "hotpotqa"
    folder.mkdir()
    write_jsonl(folder / "dev.jsonl", ROWS["hotpotqa"])
    assert len(load_tasks("hotpotqa", path=str(folder))) == 2  # dev is HotpotQA's evaluation split
    assert len(load_tasks("hotpotqa", path=str(folder), split="dev", limit=1)) == 1
    with pytest.raises(FileNotFoundError, match="test.jsonl"):
        load_tasks("bamboogle", path=str(folder))
    (tmp_path / "b.json").write_text(json.dumps(ROWS["bamboogle"]))
    assert load_tasks("bamboogle", path=str(tmp_path / "b.json"))[0].answer == ROWS["bamboogle"][0]["golden_answers"]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(ROWS["2wiki"]), tmp_path / "w.parquet")
    assert load_tasks("2wiki", path=str(tmp_path / "w.parquet"))[0].answer == ["A", "Alpha"]


def test_hub_ids_and_names():
    assert DATASETS["2wiki"].config == "2wikimultihopqa" and DATASETS["bamboogle"].split == "test"
    assert DATASETS["hotpotqa"].hub_id == "RUC-NLPIR/FlashRAG_datasets" and DATASETS["musique"].split == "dev"
    assert set(MULTI_HOP) == {"hotpotqa", "2wiki", "musique", "bamboogle"}
    assert canonical_name("2WikiMultihopQA") == "2wiki" and canonical_name("HotpotQA") == "hotpotqa"
    with pytest.raises(ValueError, match="unknown QA dataset 'squad'"):
        canonical_name("squad")


@pytest.mark.parametrize("row,problem", [
    ({"id": 1, "golden_answers": ["x"]}, "needs a non-empty 'question'"),
    ({"id": 1, "question": "q?", "golden_answers": []}, "needs 'golden_answers'"),
    ({"id": 1, "question": "q?"}, "needs 'golden_answers'"),
    ({"id": 1, "question": "q?", "golden_answers": [{"a": 1}]}, "needs 'golden_answers'"),
])
def test_bad_rows_are_named(row, problem):
    with pytest.raises(ValueError, match=problem) as err:
        row_to_task(row, "hotpotqa", 7)
    assert "row 7" in str(err.value)


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(ROWS["musique"][0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"x.jsonl:2"):
        load_tasks("musique", path=str(path))


def test_a_single_string_answer_is_one_alias():
    assert row_to_task({"question": "q", "golden_answers": "Paris"}, "nq").answer == ["Paris"]


def test_offline_tasks_are_synthetic_seeded_and_typed():
    a, b = offline_tasks(10, seed=3, scale=0.03), offline_tasks(10, seed=3, scale=0.03)
    assert [t.id for t in a] == [t.id for t in b] != [t.id for t in offline_tasks(10, seed=4, scale=0.03)]
    assert all(t.source == "synthetic" and t.metadata["synthetic"] and len(t.metadata["gold_ids"]) == 2 for t in a)
    only = offline_tasks(None, scale=0.03, types=["same_director"])
    assert only and {t.answer[0] for t in only} <= {"yes", "no"}
    with pytest.raises(ValueError, match="asked for 10000"):
        offline_tasks(10_000, scale=0.03)
    assert [t.id for t in load_tasks("synthetic", scale=0.03, limit=3)] == [t.id for t in offline_tasks(3, None, scale=0.03)]


def test_offline_tasks_mix_single_hop_questions_when_asked():
    mixed = offline_tasks(8, seed=0, scale=0.03, single_hop_share=0.5)
    kinds = [len(t.metadata["gold_ids"]) for t in mixed]
    assert kinds == [2, 1] * 4  # alternating two-hop and single-hop
    assert {t.metadata["type"] for t in mixed if len(t.metadata["gold_ids"]) == 1} <= {"birthplace", "director",
                                                                                        "headquarters"}
    assert len(offline_tasks(None, scale=0.03, single_hop_share=0.5)) == 64 + 24
    with pytest.raises(ValueError, match="single_hop_share"):
        offline_tasks(4, scale=0.03, single_hop_share=1.5)
