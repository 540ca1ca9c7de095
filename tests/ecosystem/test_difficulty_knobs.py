"""An env names its own difficulty knobs (``trace_gym.env.contract.DifficultyKnobs``), and the
no-contrast warning and the bench's NO VERDICT line name them: a GEM game's ``few_shot``
reaches a user who never read docs/ecosystem.md."""

from __future__ import annotations

import functools

import pytest

from trace_gym.step.learning import brief_repeats, reward_warning
from trace_gym.env.contract import env_difficulty_knobs
from trace_gym.tree import ROOT, RolloutTree


def _failed_tree(reward: float = -0.1) -> RolloutTree:
    tree = RolloutTree("t", (1, 2))
    for _ in range(2):
        tree.add_turn(ROOT, branch=tree.start_branch(ROOT), policy_token_ids=(3,), reward=reward, terminal=True)
    return tree


class _KnobbedEnv:
    difficulty_knobs = {"levels": "env kwarg levels=1 makes it easy"}


class _BadKnobsEnv:
    difficulty_knobs = ["levels"]


def test_an_env_class_declares_its_knobs_and_the_warning_names_them():
    assert env_difficulty_knobs(functools.partial(_KnobbedEnv)) == {"levels": "env kwarg levels=1 makes it easy"}
    assert env_difficulty_knobs(lambda: _KnobbedEnv()) == {}  # a factory that cannot be told: no knobs, no error
    with pytest.raises(ValueError, match=r"_BadKnobsEnv.difficulty_knobs must map setting names"):
        env_difficulty_knobs(_BadKnobsEnv)
    warning = reward_warning([_failed_tree()], env_difficulty_knobs(_KnobbedEnv))
    assert warning.endswith("; this env's difficulty knobs: levels: env kwarg levels=1 makes it easy")
    assert "this env's difficulty knobs" not in reward_warning([_failed_tree()])


def test_the_gem_and_reasoning_gym_adapters_declare_few_shot():
    from trace_gym.registry import resolve_env

    gem = env_difficulty_knobs(resolve_env("gem:game:GuessTheNumber-v0-easy").make_env)
    assert "few_shot" in gem and "boxed" in gem["few_shot"] and "make kwargs" in gem
    assert {"few_shot", "max_attempts"} <= set(env_difficulty_knobs(resolve_env("reasoning_gym:chain_sum").make_env))


def test_a_gem_bench_without_contrast_names_few_shot_in_its_warnings_and_verdict(tiny_engine):
    from trace_gym.bench.env import run_env_bench
    from trace_gym.bench.config import EnvBenchConfig
    from trace_gym.registry import resolve_env
    from trace_gym.strategies import shaped_strategies

    # a tiny random model never writes GEM's \boxed{} action: every episode ends at -0.1
    env = "gem:game:GuessTheNumber-v0-easy"
    cfg = EnvBenchConfig(env=env, candidates=2, root_budget=2, continuations_per_root=1, group_size=2,
                         warmup_budget=0, max_turns=2, max_turn_tokens=4, max_episode_tokens=1024,
                         predictor="constant", strategies=("uniform", "trace"))
    table = shaped_strategies(cfg.strategies, group_size=2, continuations_per_root=1)
    res = run_env_bench(cfg, table, resolve_env(env), engine=tiny_engine)
    assert len(res["warnings"]) == 2 and all("difficulty knobs: few_shot: env kwarg" in w for w in res["warnings"])
    assert res["verdict"].startswith("NO VERDICT: no contrast") and "few_shot" in res["verdict"]
    from trace_gym.bench.report import format_bench

    report = format_bench(res)  # the results keep every warning whole; the report says the advice once
    assert report.count("difficulty knobs: few_shot") == 2, report  # one warning, one verdict
    assert "trace: every one of the" in report and "what to change: as above" in report


def test_repeated_advice_is_said_once_and_different_advice_whole():
    knobs = env_difficulty_knobs(_KnobbedEnv)
    failed = reward_warning([_failed_tree()], knobs)
    won = reward_warning([_failed_tree(reward=1.0)], knobs)
    lines = [failed.at("step 1"), failed.at("step 2"), won.at("step 3"), failed.at("step 4"), "an unrelated line"]
    brief = brief_repeats(lines)
    assert brief[0] == lines[0] and brief[2] == lines[2] and brief[4] == lines[4]
    for i in (1, 3):
        assert brief[i] == (f"step {i + 1}: every one of the 2 rollouts failed (reward -0.1, below the success "
                            "threshold 0.5): no prompt is mixed, so there is no contrast to find and a "
                            "group-relative update learns nothing; what to change: as above")
    other = reward_warning([_failed_tree()], {"levels": "another text"})
    assert brief_repeats([failed, other])[1] == other  # other knobs: other advice, whole


def test_the_advice_is_carried_with_the_warning_not_read_back_from_its_text():
    import copy
    import json
    import pickle

    failed = reward_warning([_failed_tree()], env_difficulty_knobs(_KnobbedEnv)).at("step 1")
    lookalike = "a plugin's own line; make the tasks " + failed.advice  # the same words, not a warning of ours
    assert brief_repeats([failed, lookalike]) == [failed, lookalike]
    for kept in (pickle.loads(pickle.dumps(failed)), copy.deepcopy(failed)):
        assert (kept, kept.head, kept.advice) == (failed, failed.head, failed.advice)
    assert json.loads(json.dumps({"warnings": [failed]})) == {"warnings": [str(failed)]}
    assert failed.head.startswith("step 1: every one of") and str(failed) == f"{failed.head}; make the tasks {failed.advice}"
