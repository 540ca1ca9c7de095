"""BFCL data loading, the 80/20 split, function docs and prompts."""

from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("bfcl_eval")

from environments.bfcl import data  # noqa: E402


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_entries_and_split(category):
    entries = data.load_entries(category)
    assert len(entries) == 200 and len({e["id"] for e in entries}) == 200
    assert all(len(e["ground_truth"]) == len(e["question"]) for e in entries)
    train, evals = data.load_tasks(category, "train"), data.load_tasks(category, "eval")
    assert (len(train), len(evals)) == (160, 40)
    assert {t.id for t in train}.isdisjoint(t.id for t in evals)
    assert {data.scenario_index(t.id) for t in evals} == set(data.eval_indices())


def test_split_is_the_documented_hash_rule_and_shared_across_categories():
    ranked = sorted(range(200), key=lambda i: hashlib.sha256(f"bfcl-multi-turn/{i}".encode()).hexdigest())
    assert data.eval_indices() == frozenset(ranked[:40])
    for i in range(200):
        assert len({data.split_of(f"{c}_{i}") for c in data.CATEGORIES}) == 1


def test_task_fields():
    task = data.load_task("multi_turn_long_context_7")
    assert task.source == "bfcl" and task.metadata["category"] == "multi_turn_long_context"
    assert task.answer == data.get_entry(task.id)["ground_truth"]
    assert task.prompt == task.metadata["question"][0][0]["content"]
    assert data.task_entry(task)["initial_config"] == data.get_entry(task.id)["initial_config"]


def test_unknown_ids_and_categories():
    with pytest.raises(KeyError, match="unknown BFCL entry"):
        data.load_task("multi_turn_base_999")
    with pytest.raises(ValueError, match="category"):
        data.load_task("multi_turn_composite_1")
    with pytest.raises(ValueError, match="split"):
        data.load_tasks("multi_turn_base", "dev")


def test_miss_func_docs_are_held_out_until_their_turn():
    entry = data.get_entry("multi_turn_miss_func_0")
    shown, revealed = data.function_docs(entry)
    held = [n for names in entry["missed_function"].values() for n in names]
    assert held and all(d["name"] not in held for d in shown)
    assert [d["name"] for t in revealed.values() for d in t] == held
    full, none = data.function_docs(data.get_entry("multi_turn_base_0"))
    assert not none and len(full) == len(shown) + len(held)


def test_openai_tools_use_json_schema_types():
    docs, _ = data.function_docs(data.get_entry("multi_turn_base_15"))
    tools = data.openai_tools(docs)
    types = {p.get("type") for t in tools for p in t["function"]["parameters"]["properties"].values()}
    assert types <= {"string", "integer", "number", "boolean", "array", "object"}
    assert all(t["type"] == "function" and "response" not in t["function"] for t in tools)


def test_holdout_prompt_is_bfcl_text():
    docs = [{"name": "sort"}]
    assert data.holdout_user_prompt(docs) == "[{'name': 'sort'}]\nI have updated some more functions you can choose from. What about now?"
