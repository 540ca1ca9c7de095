"""The QA family's easiest tier (issue 45): single-hop questions, whose answer one search
of the question returns, graded by the env's real reward."""

from __future__ import annotations

import pytest

from environments.wiki_qa.data import offline_tasks
from environments.wiki_qa.env import WikiQAEnv
from retrieval_index.synthetic import SINGLE_HOP_TYPES

SCALE = 0.03  # the small synthetic world of tests/envs/test_wiki_qa_env.py (its index is cached)


@pytest.fixture(scope="module")
def single_hop():
    tasks = offline_tasks(None, scale=SCALE, single_hop_share=1.0)
    return [t for t in tasks if t.metadata["type"] in SINGLE_HOP_TYPES]


def played(task, actions, reward="em"):
    env = WikiQAEnv(searcher="offline", offline_scale=SCALE, reward=reward)
    env.reset(seed=0, options={"task": task})
    steps = [env.step(a) for a in actions]
    env.close()
    return steps


# Hand-checked against the passage one search of the question returns first:
#   "Kothkrus Zeipend (born 1955) is a novelist. Kothkrus Zeipend was born in Haerkcol ..."
#   "The Endless Bridge of Lourkvem is a 2015 western film directed by Cunshand Thenhy. ..."
#   "Shoshou Labs is a railway company founded in 1953 by Groushia Leistei. Its headquarters are in Kaerlun."
# "The answer is <gold>" normalises to "answer is <gold>": token F1 2PR/(P+R) with P = 1/3
# (2/4 for the two-word director against his full name), R = 1: 0.5 (0.667), paid half.
@pytest.mark.parametrize("task_id, question, gold, wrong, sentence_f1_reward", [
    ("synthetic/birthplace/0", "In which city was Kothkrus Zeipend born?", "Haerkcol", "Kothkrus Zeipend", 0.25),
    ("synthetic/director/0", "Who directed The Endless Bridge of Lourkvem?", "Cunshand Thenhy", "Toumeim Brirlei",
     1 / 3),
    ("synthetic/headquarters/0", "In which city is Shoshou Labs headquartered?", "Kaerlun", "Groushia Leistei", 0.25),
])
@pytest.mark.parametrize("reward", ["em", "f1"])
def test_one_search_then_the_gold_scores_one_and_a_wrong_name_zero(single_hop, task_id, question, gold, wrong,
                                                                   sentence_f1_reward, reward):
    task = next(t for t in single_hop if t.id == task_id)
    assert task.prompt == question and task.answer[0] == gold
    (obs, *_), (_, r_gold, done, _, info) = played(task, [f"<search> {question} </search>", f"<answer> {gold} </answer>"],
                                                    reward)
    assert gold in obs[0].content.split("\n")[0]  # the first passage holds the answer
    assert done and r_gold == 1.0 and info["em"] == 1.0
    _, (_, r_wrong, _, _, info) = played(task, [f"<search> {question} </search>", f"<answer> {wrong} </answer>"], reward)
    assert r_wrong == 0.0 and info["f1"] == 0.0
    # a sentence around the gold earns partial credit under the F1 reward, below the success line
    _, (_, r_sentence, _, _, _) = played(task, [f"<search> {question} </search>",
                                               f"<answer> The answer is {gold} </answer>"], reward)
    assert r_sentence == (0.0 if reward == "em" else pytest.approx(sentence_f1_reward))


def test_searching_the_question_returns_the_gold_passage_for_every_single_hop_question(single_hop):
    assert {t.metadata["type"] for t in single_hop} == set(SINGLE_HOP_TYPES) and len(single_hop) == 24
    env = WikiQAEnv(searcher="offline", offline_scale=SCALE)
    for task in single_hop:
        env.reset(seed=0, options={"task": task})
        obs, _, _, _, info = env.step(f"<search> {task.prompt} </search>")
        assert task.metadata["gold_ids"][0] in info["doc_ids"], task.id
        assert any(gold in obs[0].content for gold in task.answer), task.id


def test_the_env_names_its_difficulty_knobs():
    from trace_gym.env.contract import env_difficulty_knobs
    from trace_gym.registry import resolve_env

    knobs = env_difficulty_knobs(resolve_env("wiki_qa").make_env)
    assert {"single_hop_share", "few_shot", "offline_scale", "max_turns"} <= set(knobs)
