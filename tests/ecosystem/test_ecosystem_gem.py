"""GEM envs through the one resolver (``--env gem:<id>``): two games pass check_env with
the copy strategy and one with replay, an episode is GEM's own episode for the task's
seed, GEM's global randomness stays private, importing GEM leaves the root logger alone,
and bad ids, kwargs and kwarg values fail in one line with did-you-mean. Offline: only
GEM's in-process games are made."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trace_gym.api import resolve_env
from trace_gym.env.checks import check_env

ROOT = Path(__file__).resolve().parents[2]

GUESS = "gem:game:GuessTheNumber-v0-easy"  # 1..10 within 4 turns
MASTERMIND = "gem:game:Mastermind-v0-easy"  # a 2-digit code of 1..6 within 10 turns

# distinct in-range guesses (several turns; a lucky one may win), then an unparsable one
GUESS_ACTIONS = ["I guess \\boxed{5}", "\\boxed{3}", "\\boxed{8}", "\\boxed{1}"]
# valid codes, a wrong-length code and a repeat: hints, invalid moves and peg rewards
MASTERMIND_ACTIONS = ["\\boxed{1 2}", "\\boxed{3 4}", "\\boxed{1 2 3}", "\\boxed{5 6}", "\\boxed{2 1}",
                      "\\boxed{3 4}", "\\boxed{4 3}", "\\boxed{6 5}"]


def _checked(name: str, actions: list[str], env_kwargs: dict | None = None, **kwargs):
    fam = resolve_env(name, env_kwargs)
    tasks = fam.load_tasks(3, seed=0)
    report = check_env(fam.make_env(), tasks, make_env=fam.make_env, actions=lambda task: actions,
                       branch_actions=["\\boxed{2}", "\\boxed{6 1}", "no guess"], **kwargs)
    return tasks, report


def test_guess_the_number_passes_check_env_with_the_copy_strategy():
    tasks, report = _checked(GUESS, GUESS_ACTIONS, gymnasium_checks=True)
    assert report.snapshot_strategy == "copy"
    assert report.passed["gymnasium_api"] == 1
    # 3 tasks, a snapshot after reset and after every turn that did not end the episode
    assert report.passed["snapshot_roundtrip"] >= 6 and report.passed["branch_isolation"] >= 6
    assert report.passed["snapshot_pickle_process"] == report.passed["snapshot_roundtrip"]
    assert [t.id for t in tasks] == [f"{GUESS[4:]}/seed{s}" for s in range(3)]
    assert all(t.prompt.startswith("You are playing Guess The Number") for t in tasks)


def test_mastermind_passes_check_env_through_many_turns():
    _tasks, report = _checked(MASTERMIND, MASTERMIND_ACTIONS, gymnasium_checks=False)
    assert report.snapshot_strategy == "copy"
    # no 2-digit code is found by these guesses before turn 3, so each task gives >= 4 snapshots
    assert report.passed["snapshot_roundtrip"] >= 12 and report.passed["branch_isolation"] >= 12
    assert report.passed["snapshot_pickle_process"] == report.passed["snapshot_roundtrip"]


def test_the_replay_strategy_passes_check_env():
    _tasks, report = _checked("gem:game:GuessTheNumber-v0-hard", ["\\boxed{%d}" % g for g in (25, 12, 37, 6, 18)],
                              {"snapshot": "replay"}, gymnasium_checks=False)
    assert report.snapshot_strategy == "replay"
    assert report.passed["replay_deterministic"] == 3
    assert report.passed["snapshot_roundtrip"] >= 9 and report.passed["snapshot_pickle_process"] >= 9


def _play_gem_directly(gem_id: str, seed: int, actions: list[str]) -> list[tuple]:
    """GEM as its users run it: make, reset(seed), step; each observation joined with its
    ``info["suffix"]`` by GEM's own wrapper helper (the process RNG restored after)."""
    import gem
    from gem.wrappers.observation_wrapper import maybe_add_new_line

    def text(obs, info):
        return maybe_add_new_line(obs) + info["suffix"] if "suffix" in info else obs

    saved = random.getstate(), np.random.get_state()
    try:
        env = gem.make(gem_id)
        obs, info = env.reset(seed=seed)
        out = [text(obs, info)]
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
            out.append((text(obs, info), reward, terminated, truncated))
            if terminated or truncated:
                break
        return out
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


@pytest.mark.parametrize("name, actions", [(MASTERMIND, MASTERMIND_ACTIONS), (GUESS, GUESS_ACTIONS)])
def test_an_episode_is_gems_own_episode_for_the_tasks_seed(name, actions):
    fam = resolve_env(name)
    task = fam.load_tasks(1, seed=7)[0]
    env = fam.make_env().unwrapped
    obs, _ = env.reset(options={"task": task})
    ours = [obs[0].content]
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        ours.append((obs[0].content, reward, terminated, truncated))
        if terminated or truncated:
            break
    assert ours == _play_gem_directly(name[4:], 7, actions)
    assert task.prompt == ours[0] and task.metadata == {"seed": 7}
    assert len(ours) >= 3


def test_gem_global_randomness_stays_private():
    fam = resolve_env(GUESS)
    tasks = fam.load_tasks(2, seed=3)

    def play(env, task):
        env.reset(options={"task": task})
        return [env.step(a)[0][0].content for a in GUESS_ACTIONS[:3]]

    alone = play(fam.make_env().unwrapped, tasks[0])
    random.seed(1234)
    np.random.seed(1234)
    outside = random.getstate(), np.random.get_state()[1].copy()
    a, b = fam.make_env().unwrapped, fam.make_env().unwrapped
    a.reset(options={"task": tasks[0]})
    b.reset(options={"task": tasks[1]})
    interleaved = []
    for action in GUESS_ACTIONS[:3]:
        interleaved.append(a.step(action)[0][0].content)
        b.step(action)
        a.restore(a.snapshot())
    assert interleaved == alone  # a sibling env's draws do not reach this one
    assert random.getstate() == outside[0]  # and none of them reached the process
    assert (np.random.get_state()[1] == outside[1]).all()


def test_gem_kwargs_from_the_query_reach_gem():
    fam = resolve_env(GUESS + "?max_number=20&max_turns=6")
    task = fam.load_tasks(1)[0]
    assert "between 1 and 20 (inclusive) within 6 turns" in task.prompt
    assert dict(fam.env_kwargs) == {"gem_id": GUESS[4:], "gem_kwargs": {"max_number": 20, "max_turns": 6}}


def test_a_format_error_is_gems_minus_a_tenth_and_ends_the_episode():
    fam = resolve_env(GUESS)
    env = fam.make_env().unwrapped
    env.reset(options={"task": fam.load_tasks(1)[0]})
    obs, reward, terminated, truncated, info = env.step("five")
    assert (reward, terminated, truncated) == (-0.1, True, False)
    assert "did not provide a valid guess" in obs[0].content and "env_error" not in info


def test_a_task_id_resets_to_its_seed_and_a_foreign_id_is_refused():
    fam = resolve_env(GUESS)
    env = fam.make_env().unwrapped
    obs, info = env.reset(options={"task": f"{GUESS[4:]}/seed5"})
    assert info["task_id"] == f"{GUESS[4:]}/seed5" and obs[0].content == fam.load_tasks(1, seed=5)[0].prompt
    with pytest.raises(ValueError, match="is not one of game:GuessTheNumber-v0-easy's"):
        env.reset(options={"task": "game:Mastermind-v0-easy/seed5"})


def test_root_logger_and_process_rng_are_untouched_by_importing_gem_and_making_an_env():
    probe = (
        "import json, logging, random, sys\n"
        "root, state = logging.getLogger(), random.getstate()\n"
        "import environments.ecosystems.gem as adapter\n"
        "cheap = 'gem' not in sys.modules\n"
        "from trace_gym.registry import resolve_env\n"
        f"fam = resolve_env({GUESS!r})\n"
        "env = fam.make_env(); env.reset(options={'task': fam.load_tasks(1)[0]}); env.step('\\\\boxed{3}')\n"
        "print(json.dumps([cheap, 'gem' in sys.modules, len(root.handlers), root.level, len(adapter.available()),\n"
        "                  random.getstate() == state]))\n"
    )
    control = ("import logging, random; state = random.getstate(); import gem\n"
               "print(len(logging.getLogger().handlers), logging.getLogger().level, random.getstate() == state)")
    run = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
           for code in (probe, control)]
    assert run[0].returncode == 0, run[0].stderr[-2000:]
    cheap, imported, handlers, level, n_ids, same_rng = json.loads(run[0].stdout.strip().splitlines()[-1])
    assert cheap and imported  # the adapter imports gem lazily, and gem was imported by the end
    assert (handlers, level, same_rng) == (0, logging.WARNING, True) and n_ids > 100
    # what `import gem` alone does: a handler at INFO, and a draw from the process's RNG
    assert run[1].stdout.split() == ["1", str(logging.INFO), "False"]


def test_available_lists_every_id_of_gems_registry():
    from gem.envs.registration import ENV_REGISTRY

    from environments.ecosystems import gem as adapter

    ids = adapter.available()
    assert len(ids) == len(ENV_REGISTRY) and all(i.startswith("gem:") for i in ids)
    assert {GUESS, MASTERMIND, "gem:game:Wordle-v0-easy", "gem:math:GSM8K"} <= set(ids)


@pytest.mark.parametrize("name, env_kwargs, expected", [
    ("gem:game:GuessTheNumbr-v0-easy", None, r"not an id in GEM's registry; did you mean game:GuessTheNumber-v0-easy"),
    (GUESS + "?max_numbr=20", None, r"unknown option\(s\) \['max_numbr'\]; did you mean max_number"),
    (GUESS + "?seed=3", None, r"unknown option\(s\) \['seed'\]"),  # a task's seed, not a make kwarg
    (GUESS, {"snapshott": "replay"}, r"env kwargs: unknown option\(s\) \['snapshott'\]; did you mean snapshot"),
])
def test_bad_ids_and_kwargs_are_one_line_with_did_you_mean(name, env_kwargs, expected):
    with pytest.raises(ValueError, match=expected) as err:
        resolve_env(name, env_kwargs)
    assert "\n" not in str(err.value)


def test_an_env_gem_cannot_make_fails_at_make_time_in_one_line():
    fam = resolve_env(GUESS + "?max_number=ten")  # GEM's constructor raises a TypeError on it
    with pytest.raises(ValueError, match=r"GEM could not make this env \(TypeError: ") as err:
        fam.make_env()
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="snapshot='native'"):
        resolve_env(GUESS, {"snapshot": "native"}).make_env()


def test_few_shot_prepends_one_demonstrated_turn_and_keeps_the_contract():
    from trace_gym.api import check_env, resolve_env

    fam = resolve_env("gem:game:Mastermind-v0-easy", {"few_shot": True})
    plain = resolve_env("gem:game:Mastermind-v0-easy")
    task = fam.load_tasks(1, seed=2)[0]
    env, bare = fam.make_env(), plain.make_env()
    obs, _ = env.reset(options={"task": task})
    obs_plain, _ = bare.reset(options={"task": task})
    assert [m.role for m in obs] == ["user", "assistant", "user", "user"] and obs[3:] == obs_plain
    assert obs[1].content.startswith("\\boxed{") and "peg" in obs[2].content  # GEM's own answer to the demo
    assert env.step("\\boxed{1 2}")[:4] == bare.step("\\boxed{1 2}")[:4]  # same dynamics and reward
    report = check_env(fam.make_env(), fam.load_tasks(2), make_env=fam.make_env,
                       actions=lambda t: ["\\boxed{1 2}", "\\boxed{3 4}"])
    assert report.passed["snapshot_pickle_process"] >= 4
