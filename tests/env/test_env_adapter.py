"""The snapshot strategies of trace_gym.env.adapter on envs written as other ecosystems
write them: copy and replay pass check_env, a non-deterministic env is refused under
replay naming the turn, global randomness stays private per instance, foreign failures
become truncated turns, and replayed steps are counted."""

from __future__ import annotations

import functools
import random

import pytest

from foreign_envs import HotColdAdapter, HotColdEpisode, UrandomAdapter, hot_cold_tasks
from trace_gym.env.contract import EnvCheckError
from trace_gym.env.checks import check_env
from trace_gym.env.contract import ReplayDivergence
from trace_gym.env.adapter import ForeignEnv, query_kwargs
from trace_gym.types import Message

# random guesses reach deep turns of a 20-number game; "7" repeats make hints matter
ACTIONS = ["5", "guess 12", "7", "hmm", "15", "3", "18", "9"]


@pytest.mark.parametrize("strategy", ["copy", "replay"])
def test_foreign_env_passes_check_env_with_each_strategy(strategy):
    make = functools.partial(HotColdAdapter, snapshot=strategy)
    report = check_env(make(), hot_cold_tasks(3), actions=lambda task: ACTIONS, make_env=make,
                       branch_actions=["1", "2"], gymnasium_checks=False)
    assert report.snapshot_strategy == strategy
    assert report.passed["snapshot_roundtrip"] >= 6 and report.passed["branch_isolation"] >= 6
    assert report.passed["snapshot_pickle_process"] >= 6
    assert ("replay_deterministic" in report.passed) == (strategy == "replay")


def test_non_deterministic_env_is_refused_under_replay_naming_the_turn():
    make = functools.partial(UrandomAdapter, snapshot="replay")
    with pytest.raises(EnvCheckError) as err:
        check_env(make(), hot_cold_tasks(4), actions=lambda task: ["1", "2", "3", "4", "6", "8", "10", "11"] * 3,
                  make_env=make, gymnasium_checks=False, max_steps=5)
    assert err.value.check == "replay_deterministic"
    assert "not deterministic under replay" in str(err.value) and "turn " in str(err.value)


class _ThirdEpisodeLiesEpisode(HotColdEpisode):
    """Deterministic for the first two episodes of each task, then its first reply changes:
    check_env records (episode 1), replays to the last snapshot (2), then replays again to
    play the episode's final turn by hand (3), so only that second replay can catch it."""

    def begin(self, task, seed):
        self.begun = getattr(self, "begun", {})
        self.begun[task.id] = self.begun.get(task.id, 0) + 1
        self.task_id = task.id
        return super().begin(task, seed)

    def act(self, action):
        obs, reward, terminated, truncated, info = super().act(action)
        if self.begun[self.task_id] >= 3 and self.game.turn == 1:
            obs = [Message("user", "something else")]
        return obs, reward, terminated, truncated, info


class _ThirdEpisodeLies(HotColdAdapter):
    episode_class = _ThirdEpisodeLiesEpisode


def test_a_divergence_on_the_second_replay_of_a_finished_episode_is_an_env_check_error():
    make = functools.partial(_ThirdEpisodeLies, snapshot="replay")
    with pytest.raises(EnvCheckError) as err:
        check_env(make(), hot_cold_tasks(1), actions=lambda task: ["0"] * 8, make_env=make,
                  gymnasium_checks=False, max_steps=8)
    assert err.value.check == "replay_deterministic" and "turn 1" in str(err.value)


def test_restore_of_a_diverging_replay_raises_naming_the_turn():
    env = UrandomAdapter(snapshot="replay")
    env.reset(options={"task": hot_cold_tasks(1)[0]})
    for _ in range(40):  # 40 coin flips: a divergence is all but certain (2^-40 otherwise)
        env.step("1")
        snap = env.snapshot()
        try:
            for _ in range(3):
                env.restore(snap)
        except ReplayDivergence as exc:
            assert exc.turn >= 1
            return
        if env._done:
            env.reset(options={"task": hot_cold_tasks(1)[0]})
    pytest.fail("urandom hints never diverged under replay")


def test_global_rng_is_private_per_instance():
    task = hot_cold_tasks(1, seed=5)[0]

    def play_alone():
        env = HotColdAdapter()
        env.reset(options={"task": task})
        return [env.step(a)[0][0].content for a in ["3", "6", "9", "12"]]

    alone = play_alone()
    a, b = HotColdAdapter(), HotColdAdapter()
    a.reset(options={"task": task})
    b.reset(options={"task": hot_cold_tasks(1, seed=9)[0]})
    outside = random.getstate()
    interleaved = []
    for action in ["3", "6", "9", "12"]:
        interleaved.append(a.step(action)[0][0].content)
        b.step(action)
        random.random()  # the process's own draws do not reach the env either
    assert interleaved == alone
    random.setstate(outside)
    before = random.getstate()
    a.step("1")
    assert random.getstate() == before  # and the env's draws do not reach the process


def test_foreign_exception_becomes_a_truncated_turn_with_env_error():
    env = HotColdAdapter()
    env.reset(options={"task": hot_cold_tasks(1)[0]})
    obs, reward, terminated, truncated, info = env.step("boom")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "KeyError" in info["env_error"] and "KeyError" in obs[0].content
    assert env.step("3")[4] == {"error": "episode_over"}


def test_replay_steps_count_the_reexecuted_actions():
    replay, copy = HotColdAdapter(snapshot="replay"), HotColdAdapter(snapshot="copy")
    for env in (replay, copy):
        env.reset(options={"task": hot_cold_tasks(1)[0]})
        env.step("hmm")
        env.step("hmm")
    assert replay.replay_steps(replay.snapshot()) == 2 and copy.replay_steps(copy.snapshot()) == 0


def test_max_turns_truncates_and_bad_strategy_is_one_line():
    env = HotColdAdapter(max_turns=2)
    env.reset(options={"task": hot_cold_tasks(1)[0]})
    assert env.step("hmm")[3] is False and env.step("hmm")[3] is True
    with pytest.raises(ValueError, match=r"snapshot='nativ'.*supports \['copy', 'replay'\]"):
        HotColdAdapter(snapshot="nativ")


def test_query_kwargs_reads_yaml_scalars_and_names_a_bad_part():
    assert query_kwargs("size=10&name=chain_sum&flag=true&xs=[1,2]&empty=") == {
        "size": 10, "name": "chain_sum", "flag": True, "xs": [1, 2], "empty": ""}
    assert query_kwargs("") == {}
    with pytest.raises(ValueError, match="'size'"):
        query_kwargs("size")


def test_a_failed_begin_leaves_no_episode_to_step():
    class Unreachable(HotColdEpisode):
        def begin(self, task, seed):
            raise ConnectionError("server down")

    env = ForeignEnv(Unreachable())
    with pytest.raises(ConnectionError):
        env.reset(options={"task": hot_cold_tasks(1)[0]})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("3")
