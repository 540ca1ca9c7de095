"""reasoning-gym datasets through the one resolver (``--env reasoning_gym:<dataset>?config``):
two datasets pass check_env (one single-turn, one with several attempts), rewards are the
dataset's own score_answer, hostile actions and failing scorers score 0 without raising,
tasks carry their entries through JSON exactly, and bad names, config and kwargs fail in
one line with did-you-mean. Offline and CPU-only."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trace_gym.api import resolve_env
from trace_gym.env.checks import check_env
from trace_gym.types import Task

ROOT = Path(__file__).resolve().parents[2]
CHAIN = "reasoning_gym:chain_sum?min_terms=2&max_terms=3"


def _dataset(name: str, n: int, seed: int = 0, **config):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=n, **config)


def _play(fam, task: Task, actions: list[str]) -> list[tuple]:
    env = fam.make_env().unwrapped
    env.reset(options={"task": task})
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return out


def test_chain_sum_passes_check_env_single_turn():
    fam = resolve_env(CHAIN)
    tasks = fam.load_tasks(3, seed=0)
    report = check_env(fam.make_env(), tasks, make_env=fam.make_env,
                       actions=lambda task: [f"<think>adding</think><answer>{task.answer}</answer>"],
                       gymnasium_checks=True)
    assert report.snapshot_strategy == "copy"
    assert report.passed["gymnasium_api"] == 1
    # one turn: the snapshot after reset is the one each task has
    assert report.passed["snapshot_roundtrip"] == report.passed["branch_isolation"] == 3
    assert report.passed["snapshot_pickle_process"] == 3
    for task, entry in zip(tasks, _dataset("chain_sum", 3, min_terms=2, max_terms=3)):
        assert (task.prompt, task.answer) == (entry["question"], entry["answer"])


@pytest.mark.parametrize("strategy", ["copy", "replay"])
def test_basic_arithmetic_with_attempts_passes_check_env_over_several_turns(strategy):
    fam = resolve_env("reasoning_gym:basic_arithmetic", {"max_attempts": 3, "snapshot": strategy})
    tasks = fam.load_tasks(3, seed=1)
    report = check_env(fam.make_env(), tasks, make_env=fam.make_env,
                       actions=lambda task: ["<answer>0.5</answer>", "no tag", f"<answer>{task.answer}</answer>"],
                       branch_actions=["<answer>7</answer>"], gymnasium_checks=False)
    assert report.snapshot_strategy == strategy
    # two wrong answers earn feedback: snapshots after reset, attempt 1 and attempt 2
    assert report.passed["snapshot_roundtrip"] == report.passed["branch_isolation"] == 9
    assert report.passed["snapshot_pickle_process"] == 9
    assert ("replay_deterministic" in report.passed) == (strategy == "replay")


def test_rewards_are_the_datasets_own_score_answer():
    fam = resolve_env(CHAIN)
    tasks = fam.load_tasks(3, seed=4)
    data = _dataset("chain_sum", 3, seed=4, min_terms=2, max_terms=3)
    for task, entry in zip(tasks, data):
        gold = entry["answer"]
        for answer, expected in ((gold, 1.0), ("nope", 0.0), (f"= {gold}", None), (f"{gold}.00", 1.0)):
            ((obs, reward, terminated, truncated, info),) = _play(fam, task, [f"so <answer> {answer} </answer>"])
            own = data.score_answer(answer, entry)
            assert reward == own and info["score"] == own and (terminated, truncated, obs) == (True, False, [])
            if expected is not None:
                assert own == expected
        # partial credit: the oracle inside a longer answer scores len(oracle) / len(answer)
        assert data.score_answer(f"= {gold}", entry) == pytest.approx(len(gold) / (len(gold) + 2))
        ((_, reward, *_),) = _play(fam, task, ["no answer tag"])
        assert reward == data.score_answer(None, entry) == 0.0


HOSTILE = [
    "<answer> " * 11_112,  # 100 kB of unclosed tags: quadratic for the tag regex unbounded
    "x" * 100_000 + "<answer>1</ans",
    "<answer>\x00\x00</answer>" + "\x00" * 100_000,
    "</answer>" * 5000 + "<answer><answer>",
    "<answer>\ud800</answer>",
]


@pytest.mark.parametrize("action", HOSTILE, ids=["unclosed", "cut-tag", "nul", "closers", "surrogate"])
def test_a_hostile_action_scores_zero_without_raising(action):
    fam = resolve_env(CHAIN)
    task = fam.load_tasks(1)[0]
    t0 = time.perf_counter()
    ((_, reward, terminated, truncated, info),) = _play(fam, task, [action])
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert time.perf_counter() - t0 < 10  # the 8 kB tail: ~0.2 s; the whole 100 kB: minutes


def test_only_the_tail_of_an_action_is_scanned_for_the_answer():
    from environments.ecosystems.reasoning_gym import MAX_SCAN_CHARS

    fam = resolve_env(CHAIN)
    task = fam.load_tasks(1)[0]
    tagged = f"<answer>{task.answer}</answer>"
    inside = tagged + " " * (MAX_SCAN_CHARS - len(tagged))
    assert _play(fam, task, [inside])[0][1] == 1.0
    assert _play(fam, task, [inside + " "])[0][1] == 0.0  # one character more: the tag is cut


def test_a_scorer_that_raises_scores_zero_and_the_episode_goes_on():
    data = _dataset("prime_factorization", 1)
    with pytest.raises(ValueError):  # reasoning-gym's own scorer, on a non-integer answer
        data.score_answer("two times x", data[0])
    fam = resolve_env("reasoning_gym:prime_factorization", {"max_attempts": 2})
    task = fam.load_tasks(1)[0]
    first, second = _play(fam, task, ["<answer>two times x</answer>", f"<answer>{task.answer}</answer>"])
    obs, reward, terminated, truncated, info = first
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "score_answer failed: ValueError" in info["env_error"] and "try again (1 attempt(s) left)" in obs[0].content
    assert second[1:4] == (1.0, True, False) and "env_error" not in second[4]


def test_a_scorer_that_evals_exit_does_not_end_the_process():
    data = _dataset("spiral_matrix", 1)
    with pytest.raises(SystemExit):  # its scorer eval()s the answer
        data.score_answer("exit()", data[0])
    fam = resolve_env("reasoning_gym:spiral_matrix")
    ((_, reward, terminated, truncated, info),) = _play(fam, fam.load_tasks(1)[0], ["<answer>exit()</answer>"])
    assert (reward, terminated, truncated) == (0.0, True, False) and "holds 'exit'" in info["env_error"]
    # and were it scored, it would end only the sandbox's scoring child
    from environments.ecosystems.sandboxed_scoring import SandboxedScorer
    from environments.ecosystems.reasoning_gym import to_json

    scorer = SandboxedScorer()
    try:
        score, error = scorer.score("spiral_matrix", {}, "exit()", to_json(data[0]))
        assert score == 0.0 and "SystemExit" in error
        assert scorer.score("spiral_matrix", {}, data[0]["answer"], to_json(data[0])) == (1.0, None)
    finally:
        scorer.close()


def test_attempts_feedback_and_the_last_answers_score():
    fam = resolve_env(CHAIN, {"max_attempts": 3, "system_prompt": "simple"})
    task = fam.load_tasks(1)[0]
    env = fam.make_env().unwrapped
    obs, _ = env.reset(options={"task": task})
    assert [m.role for m in obs] == ["system", "user"] and "<answer>" in obs[0].content
    wrong = _play(fam, task, ["<answer>1</answer>", "<answer>2</answer>", f"<answer>x{task.answer}</answer>"])
    assert [(r, te) for _, r, te, _, _ in wrong] == [(0.0, False), (0.0, False), (wrong[2][4]["score"], True)]
    assert 0 < wrong[2][1] < 1  # the last answer's own (partial) score
    assert [i["attempt"] for *_, i in wrong] == [1, 2, 3]
    right = _play(fam, task, ["<answer>1</answer>", f"<answer>{task.answer}</answer>"])
    assert [(r, te) for _, r, te, _, _ in right] == [(0.0, False), (1.0, True)]


def test_tasks_carry_their_entry_through_json_exactly():
    fam = resolve_env("reasoning_gym:arc_agi")
    task = fam.load_tasks(1, seed=2)[0]
    data = _dataset("arc_agi", 1, seed=2)
    entry = data[0]
    plain = json.loads(json.dumps(entry))  # tuples become lists: the scorer then disagrees
    assert data.score_answer(entry["answer"], plain) < 1.0 == data.score_answer(entry["answer"], entry)
    again = Task.from_dict(json.loads(json.dumps(task.to_dict())))
    assert pickle.loads(pickle.dumps(again)) == again
    ((_, reward, *_),) = _play(fam, again, [f"<answer>{entry['answer']}</answer>"])
    assert reward == 1.0
    assert task.metadata["dataset"] == "arc_agi" and task.metadata["index"] == 0


def test_loading_tasks_leaves_the_process_rng_alone():
    np.random.seed(99)
    before = np.random.get_state()[1].copy()
    resolve_env("reasoning_gym:pool_matrix").load_tasks(3)  # its generator calls np.random.seed
    assert (np.random.get_state()[1] == before).all()


def test_a_task_of_another_dataset_or_config_is_refused_at_reset():
    env = resolve_env("reasoning_gym:chain_sum").make_env().unwrapped
    with pytest.raises(ValueError, match="not a reasoning-gym 'chain_sum' task"):
        env.reset(options={"task": resolve_env("reasoning_gym:basic_arithmetic").load_tasks(1)[0]})
    with pytest.raises(ValueError, match="was made with config"):
        env.reset(options={"task": resolve_env(CHAIN).load_tasks(1)[0]})


def test_available_lists_the_datasets_and_the_import_is_lazy_and_keeps_the_rng():
    from reasoning_gym.factory import DATASETS

    from environments.ecosystems import reasoning_gym as adapter

    ids = adapter.available()
    assert len(ids) == len(DATASETS) and {"reasoning_gym:chain_sum", "reasoning_gym:basic_arithmetic"} <= set(ids)
    code = ("import random, sys, environments.ecosystems.reasoning_gym\n"
            "lazy, state = 'reasoning_gym' not in sys.modules, random.getstate()\n"
            "from trace_gym.registry import resolve_env\n"
            "resolve_env('reasoning_gym:chain_sum').load_tasks(2)\n"  # imports reasoning_gym, which draws
            "print(lazy, 'reasoning_gym' in sys.modules, random.getstate() == state)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr[-2000:]


@pytest.mark.parametrize("name, env_kwargs, expected", [
    ("reasoning_gym:chain_summ", None, r"not a reasoning-gym dataset; did you mean chain_sum"),
    ("reasoning_gym:chain_sum?min_term=2", None, r"unknown option\(s\) \['min_term'\]; did you mean min_terms"),
    ("reasoning_gym:chain_sum?seed=3", None, r"unknown option\(s\) \['seed'\]"),  # the loader's
    ("reasoning_gym:chain_sum", {"max_attempt": 2},
     r"env kwargs: unknown option\(s\) \['max_attempt'\]; did you mean max_attempts"),
    ("reasoning_gym:chain_sum?min_terms=4&max_terms=2", None, r"refused this config \(AssertionError: max_terms must"),
])
def test_bad_names_config_and_kwargs_are_one_line_with_did_you_mean(name, env_kwargs, expected):
    with pytest.raises(ValueError, match=expected) as err:
        resolve_env(name, env_kwargs)
    assert "\n" not in str(err.value)


def test_bad_adapter_option_values_are_one_line():
    with pytest.raises(ValueError, match=r"system_prompt 'defualt' is not one of .*; did you mean default"):
        resolve_env("reasoning_gym:chain_sum", {"system_prompt": "defualt"}).make_env()
    with pytest.raises(ValueError, match="max_attempts must be a positive int, got 0"):
        resolve_env("reasoning_gym:chain_sum", {"max_attempts": 0}).make_env()
