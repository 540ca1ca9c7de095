"""WikiQA env: check_env, scripted trajectories, hostile actions, the result cache in snapshots."""

from __future__ import annotations

import pickle

import gymnasium
import pytest

import trace_gym  # noqa: F401  (registers ids)
from environments.wiki_qa.actions import (
    INVALID_ACTION,
    INVALID_TOOL_ACTION,
    QUERY_EMPTY,
    clean_query,
    parse_action,
)
from environments.wiki_qa.data import offline_tasks
from environments.wiki_qa.env import WikiQAEnv, format_passages
from trace_gym.env.checks import check_env

SCALE = 0.03  # the small synthetic world (631 passages), its index built once into the cache
KW = {"searcher": "offline", "offline_scale": SCALE}


@pytest.fixture(scope="module")
def tasks():
    return offline_tasks(6, seed=1, scale=SCALE)


@pytest.fixture
def env():
    e = WikiQAEnv(**KW)
    yield e
    e.close()


def by_type(tasks, qtype):
    return next(t for t in offline_tasks(None, scale=SCALE) if t.metadata["type"] == qtype)


def test_passes_check_env_with_the_tag_protocol(tasks):
    report = check_env(gymnasium.make("trace_gym/WikiQA-v0", **KW), tasks[:3])
    assert not report.skipped
    assert report.passed["snapshot_pickle_process"] == report.passed["snapshot_roundtrip"] >= 3 * 4


def test_passes_check_env_with_the_tool_call_protocol(tasks):
    report = check_env(gymnasium.make("trace_gym/WikiQA-v0", protocol="tool_call", **KW), tasks[3:5],
                       gymnasium_checks=False)
    assert report.passed["branch_isolation"] >= 2 * 4


def test_two_searches_then_the_right_answer_earns_1(env):
    task = by_type(None, "director_birthplace")
    hop1, hop2 = task.metadata["hop_queries"]
    obs, info = env.reset(seed=0, options={"task": task})
    assert obs[0].role == "system" and obs[-1].content == f"Question: {task.prompt}"
    obs, reward, term, trunc, info = env.step(f"<think>who directed it?</think>\n<search> {hop1} </search>")
    assert (reward, term, trunc) == (0.0, False, False) and info["action"] == "search"
    text = obs[0].content
    assert text.startswith("<information>Doc 1(Title: ") and text.endswith("</information>")
    assert text.count("\nDoc ") == 2 and task.metadata["gold_ids"][0] in info["doc_ids"]
    assert task.metadata["bridge"] in text  # the director's name comes back
    obs, reward, term, trunc, info = env.step(f"<search>{hop2}</search>")
    assert task.metadata["gold_ids"][1] in info["doc_ids"] and task.answer[0] in obs[0].content
    obs, reward, term, trunc, info = env.step(f"<answer> {task.answer[0]} </answer>")
    assert (obs, reward, term, trunc) == ([], 1.0, True, False)
    assert info["em"] == 1.0 and info["f1"] == 1.0 and info["searches"] == 2


def test_a_wrong_answer_earns_0_and_aliases_count(env):
    task = by_type(None, "birth_country")
    env.reset(seed=0, options={"task": task})
    assert env.step("<answer> Atlantis </answer>")[1] == 0.0
    env.reset(seed=0, options={"task": task})
    assert env.step(f"<answer>{task.answer[1]}</answer>")[1] == 1.0  # the official name is an alias
    yes_no = by_type(None, "same_director")
    env.reset(seed=0, options={"task": yes_no})
    wrong = "no" if yes_no.answer == ["yes"] else "yes"
    _, reward, _, _, info = env.step(f"<answer>{wrong}</answer>")
    assert reward == 0.0 and info["f1"] == 0.0


def test_an_action_without_a_tag_gets_the_fixed_invalid_action_message(env, tasks):
    env.reset(seed=0, options={"task": tasks[0]})
    for action in ("I will now search.", "<search>unclosed", "<Search>wrong case</Search>", "", "<answer></search>"):
        obs, reward, term, trunc, info = env.step(action)
        assert obs[0].content == INVALID_ACTION and info["error"] == "no_action"
        assert (reward, term) == (0.0, False)
        if trunc:
            break


def test_a_10_mb_action_and_a_control_character_query_get_clear_observations_and_the_episode_continues(env, tasks):
    task = tasks[0]
    env.reset(seed=0, options={"task": task})
    obs, reward, term, trunc, info = env.step("<search>" + "x" * 10_000_000 + "</search>")
    assert "10000017 characters" in obs[0].content and "limit is 65536" in obs[0].content
    assert (term, trunc, info["error"]) == (False, False, "action_too_long")
    obs, _, term, trunc, info = env.step("<search>\x00\x01\x1b\x7f\u200b\x07</search>")
    assert obs[0].content == QUERY_EMPTY and info["error"] == "empty_query" and not (term or trunc)
    obs, _, term, trunc, info = env.step(f"<search>{'q' * 600}</search>")
    assert "600 characters" in obs[0].content and info["error"] == "query_too_long"
    obs, reward, term, trunc, info = env.step(f"<answer>{task.answer[0]}</answer>")
    assert (reward, term) == (1.0, True)  # the fourth turn still answers


def test_control_characters_are_stripped_from_a_query_before_searching(env, tasks):
    env.reset(seed=0, options={"task": tasks[0]})
    _, _, _, _, info = env.step("<search>Where\x00 is\t\tthe\x1b university?\u200b</search>")
    assert info["query"] == "Where is the university?"
    assert clean_query("a\nb\r\nc\x0bd") == "a b c d"


def test_max_turns_truncates_with_reward_0(tasks):
    env = WikiQAEnv(max_turns=2, **KW)
    env.reset(seed=0, options={"task": tasks[0]})
    assert env.step("<search>a</search>")[3] is False
    obs, reward, term, trunc, _ = env.step("<search>b</search>")
    assert (reward, term, trunc) == (0.0, False, True) and obs[0].content.startswith("<information>")
    assert env.step("<answer>x</answer>")[0] == [] and env.step("x")[4]["error"] == "episode_over"


class UnusableSearcher:
    """A searcher that must not be called (the snapshot's cache has to answer)."""

    def search(self, queries, topk):
        raise AssertionError(f"searched {queries!r} although the snapshot's cache holds it")


def test_the_result_cache_is_part_of_the_snapshot(env, tasks):
    task = tasks[0]
    env.reset(seed=0, options={"task": task})
    first = env.step(f"<search>{task.prompt}</search>")
    snap = env.snapshot()
    other = WikiQAEnv(searcher=UnusableSearcher(), offline_scale=SCALE)  # "the index changed underneath"
    other.reset(seed=5)
    other.restore(pickle.loads(pickle.dumps(snap)))
    again = other.step(f"<search>   {task.prompt}  </search>")
    assert again[0] == first[0] and again[4]["cache_hit"] is True
    assert again[4]["doc_ids"] == first[4]["doc_ids"]


def test_tool_call_protocol(tasks):
    env = WikiQAEnv(protocol="tool_call", **KW)
    obs, info = env.reset(seed=0, options={"task": tasks[0]})
    assert [s["function"]["name"] for s in info["tool_schemas"]] == ["search", "answer"]
    obs, *_ = env.step('<tool_call>\n{"name": "search", "arguments": {"query": "a public university"}}\n</tool_call>')
    assert obs[0].role == "tool" and obs[0].name == "search" and obs[0].content.startswith("Doc 1(Title: ")
    obs, *_ = env.step('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"a river\\"}"}</tool_call>')
    assert obs[0].content.startswith("Doc 1(Title: ")  # OpenAI-style string arguments
    assert env.step("no call")[0][0].content == INVALID_TOOL_ACTION
    env.reset(seed=0, options={"task": tasks[0]})
    assert "not valid JSON" in env.step("<tool_call>{name: search}</tool_call>")[0][0].content
    assert "unknown tool 'browse'" in env.step('<tool_call>{"name": "browse", "arguments": {}}</tool_call>')[0][0].content
    assert 'needs a string argument "query"' in env.step(
        '<tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>')[0][0].content
    _, reward, term, _, _ = env.step(
        f'<tool_call>{{"name": "answer", "arguments": {{"answer": "{tasks[0].answer[0]}"}}}}</tool_call>')
    assert (reward, term) == (1.0, True)


def test_flashrag_rows_as_tasks_and_f1_reward(env):
    row = {"id": "q1", "question": "Who wrote it?", "golden_answers": ["Jane Austen", "Austen"]}
    env2 = WikiQAEnv(tasks=[row], reward="f1", **KW)
    obs, info = env2.reset(seed=0)
    assert info["task_id"] == "custom/q1" and obs[-1].content == "Question: Who wrote it?"
    # half the F1 against "Jane Austen": partial credit stays below the success line (metrics.f1_reward)
    assert env2.step("<answer>Jane</answer>")[1] == pytest.approx(2 * 0.5 * 1 / 1.5 / 2)
    env.reset(seed=0, options={"task": row})
    assert env.step("<answer>austen</answer>")[1] == 1.0


def test_search_r1_passage_format():
    hits = [("1", '"Paris"\nParis is the capital.', 1.0), ("2", '"Lyon"\nLyon is a city.\nIt has rivers.', 0.5)]
    assert format_passages(hits) == 'Doc 1(Title: "Paris") Paris is the capital.\n' \
        'Doc 2(Title: "Lyon") Lyon is a city.\nIt has rivers.'
    assert format_passages([]) == "No results."


def test_parse_action_takes_the_first_tag():
    assert parse_action("<answer>x</answer><search>y</search>").kind == "answer"
    assert parse_action("<search>y</search><answer>x</answer>").text == "y"
    assert parse_action(None).error == "no_action"
    with pytest.raises(ValueError, match="protocol"):
        parse_action("x", "xml")


def test_bad_configuration_is_named():
    for kwargs, name in (({"topk": 0}, "topk"), ({"max_turns": 0}, "max_turns"), ({"protocol": "json"}, "protocol"),
                         ({"reward": "acc"}, "reward"), ({"prompt_template": "Q"}, "prompt_template")):
        with pytest.raises(ValueError, match=name):
            WikiQAEnv(**kwargs, **KW)
    with pytest.raises(ValueError, match="unknown searcher spec"):
        env = WikiQAEnv(searcher="faiss:/nowhere", offline_scale=SCALE)
        env.reset(seed=0)
        env.step("<search>x</search>")
