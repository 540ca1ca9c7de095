"""The boundary every foreign env call and reply crosses (trace_gym/env/boundary.py,
trace_gym/env/process_state.py), on a GEM-style game whose replies pass through planted code
(tests/fixtures/foreign_envs.py ``PlantedAdapter``), each class of hostile reply in several variants:

* text no tokenizer encodes (lone surrogates, in content, name and tool_call_id) is escaped,
  and oversized observations (one huge message, many messages, many large ones) are bounded
  with a visible note, in reset and step alike;
* flags that are not booleans and rewards that are not finite numbers end the episode as a
  truncated turn that names the value;
* BaseExceptions raised by foreign code (SystemExit, KeyboardInterrupt, GeneratorExit, a
  class of its own) end that episode only, through ``AgentRunner`` too; a KeyboardInterrupt
  delivered to the main thread (a real Ctrl-C) still stops the caller;
* a hung call (blocked, or a pure-Python loop) ends its episode at the deadline, in two envs
  at once, while another env that draws from the global RNGs too goes on;
* process state a foreign call changes (cwd, recursion limit, environment variables, ...)
  is put back after reset and step.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import random
import resource
import signal
import socket
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from foreign_envs import HotColdAdapter, PlantedAdapter, hot_cold_tasks
from trace_gym.env import process_state
from trace_gym.env.boundary import (
    MAX_OBSERVATION_MESSAGES, TRUNCATION_NOTE, ForeignBoundary, ForeignEnvError, ForeignReplyError,
)
from trace_gym.utils.textsafe import CUT_NOTE, cap_text
from trace_gym.types import Message

TASK = hot_cold_tasks(1, seed=3)[0]


def utf8(obs) -> str:
    text = "\n".join(m.content + (m.name or "") + (m.tool_call_id or "") for m in obs)
    text.encode("utf-8")  # raises on a lone surrogate
    return text


def started(env):
    env.reset(options={"task": TASK})
    return env


def replace_obs(messages):
    return lambda reply: (messages, *reply[1:])


# --- text ------------------------------------------------------------------------------

BAD_TEXTS = {
    "lone_high": "before \ud800 after",
    "lone_low": "\udc80 at the start",
    "reversed_pair": "a\udc00\ud800b",
    "only_surrogates": "\udfff" * 500,
}


@pytest.mark.parametrize("name", sorted(BAD_TEXTS))
def test_unencodable_text_is_escaped_in_reset_and_step(name):
    text = BAD_TEXTS[name]
    env = PlantedAdapter(on_reset=lambda obs, info: ([Message("user", text)], info),
                         on_step=replace_obs([Message("tool", text, name=text, tool_call_id=text)]))
    obs, _info = env.reset(options={"task": TASK})
    assert "\\ud" in utf8(obs)  # escaped visibly, not dropped
    obs, _reward, terminated, truncated, info = env.step("5")
    assert "\\ud" in utf8(obs) and "\\ud" in obs[0].name and "\\ud" in obs[0].tool_call_id
    assert "env_error" not in info  # a surrogate is text to clean, not an error


def test_an_exception_whose_message_holds_surrogates_or_whose_str_raises_is_readable():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    for exc in (ValueError("bad \ud800 value"), Unprintable()):
        def fail(reply, exc=exc):
            raise exc

        obs, _reward, _terminated, truncated, info = started(PlantedAdapter(on_step=fail)).step("5")
        assert truncated and type(exc).__name__ in info["env_error"]
        utf8(obs)
        info["env_error"].encode("utf-8")


BIG = {
    "one_huge_message": lambda: [Message("user", "a" * 50_000_000)],
    "many_messages": lambda: [Message("user", f"m{i}") for i in range(20_000)],
    "many_large_messages": lambda: [Message("user", "c" * 100_000) for _ in range(40)],
    "huge_with_surrogates": lambda: [Message("user", "\ud800x" * 2_000_000)],
}


@pytest.mark.parametrize("name", sorted(BIG))
def test_oversized_observations_are_bounded_with_a_visible_note(name):
    limit = 4096
    env = PlantedAdapter(on_reset=lambda obs, info: (BIG[name](), info), on_step=lambda reply: (BIG[name](), *reply[1:]),
                         max_observation_chars=limit)
    for obs, info in (env.reset(options={"task": TASK}), (lambda r: (r[0], r[4]))(env.step("5"))):
        text = utf8(obs)
        assert len(obs) <= MAX_OBSERVATION_MESSAGES
        # the shares of the bound, plus at most one minimum share per kept message
        assert sum(len(m.content) for m in obs) <= limit + 300 * len(obs)
        assert "truncated:" in text or "more messages omitted" in text
        assert info["obs_truncated"] is True


def test_the_default_bound_is_the_native_one_and_a_short_observation_is_untouched():
    env = started(PlantedAdapter(on_step=replace_obs([Message("user", "x" * 40_000)])))
    obs = env.step("5")[0]
    assert 32_000 < len(obs[0].content) <= 32_768 and "observation truncated: " in obs[0].content
    plain = started(HotColdAdapter()).step("hmm")
    assert plain[0] == [Message("user", "say a number")] and "obs_truncated" not in plain[4]


def test_cap_text_keeps_three_quarters_head_and_a_quarter_tail_around_the_note():
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    note = "[{omitted}]"  # 5 characters once filled with 3 digits
    out = cap_text(text, 105, note)
    # the note is sized by its longest form, "[1000]" (6): keep 99 = head 75 + tail 24, 901 omitted
    assert out == text[:75] + "[901]" + text[-24:]
    assert cap_text("short", 200) == "short" and cap_text("a\ud800", 200) == "a\\ud800"
    with pytest.raises(ValueError, match="max_chars must be at least"):
        cap_text(text, 10, CUT_NOTE)


# --- flags and rewards --------------------------------------------------------------------

BAD_VALUES = [("terminated", "False"), ("terminated", "false"), ("truncated", "0"), ("terminated", 1),
              ("truncated", None), ("terminated", [False]), ("reward", "1.0"), ("reward", True), ("reward", None),
              ("reward", float("nan")), ("reward", 1 + 2j), ("reward", 1e300), ("reward", 10**400), ("reward", -2e6)]
SLOTS = {"reward": 1, "terminated": 2, "truncated": 3}


@pytest.mark.parametrize("field,value", BAD_VALUES, ids=[f"{f}={v!r}" for f, v in BAD_VALUES])
def test_a_value_outside_the_contract_ends_the_episode_as_a_readable_truncated_turn(field, value):
    def plant(reply):
        reply = list(reply)
        reply[SLOTS[field]] = value
        return tuple(reply)

    env = started(PlantedAdapter(on_step=plant))
    obs, reward, terminated, truncated, info = env.step("5")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert field in info["env_error"] and "could not process" in obs[0].content
    assert env.step("6")[4] == {"error": "episode_over"}


def test_a_reward_at_the_bound_passes_and_one_past_it_names_the_bound():
    from trace_gym.env.boundary import MAX_ABS_REWARD

    assert started(PlantedAdapter(on_step=lambda r: (r[0], -MAX_ABS_REWARD, *r[2:]))).step("5")[1] == -MAX_ABS_REWARD
    info = started(PlantedAdapter(on_step=lambda r: (r[0], 1e300, *r[2:]))).step("5")[4]
    assert "reward=1e+300" in info["env_error"] and "within +-1e+06" in info["env_error"]


def _cyclic():
    d = {"a": 1}
    d["self"] = d
    return d


@pytest.mark.parametrize("info,says", [(_cyclic(), "Circular reference"), ({"blob": "x" * (1 << 21)}, "characters of JSON"),
                                       ({"deep": [[[[[[]]]]]] * 3, (1, 2): "tuple key", "obj": object()}, None)])
def test_a_step_info_with_a_cycle_or_over_the_size_bound_is_an_error_turn(info, says):
    _obs, reward, _terminated, truncated, got = started(PlantedAdapter(on_step=lambda r: (*r[:4], info))).step("5")
    if says is None:  # JSON-sizeable (values that are not JSON count as their type's name): passed on as given
        assert "env_error" not in got and got["obj"] is info["obj"]
    else:
        assert (reward, truncated) == (0.0, True) and "info" in got["env_error"] and says in got["env_error"]


def test_numpy_booleans_and_numbers_are_real_values():
    env = started(PlantedAdapter(on_step=lambda reply: (reply[0], np.float32(0.5), np.bool_(True), np.bool_(False),
                                                        reply[4])))
    _obs, reward, terminated, truncated, info = env.step("5")
    assert (reward, terminated, truncated) == (0.5, True, False) and type(terminated) is bool
    assert "env_error" not in info


def test_an_observation_that_is_not_a_list_of_messages_is_an_error_turn():
    for bad in ("plain text", [{"role": "user", "content": "x"}], None):
        info = started(PlantedAdapter(on_step=replace_obs(bad))).step("5")[4]
        assert "ForeignReplyError" in info["env_error"] and "Message" in info["env_error"]


# --- exceptions -----------------------------------------------------------------------------


class OwnBaseException(BaseException):
    pass


RAISED = {"SystemExit": lambda: SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt,
          "GeneratorExit": GeneratorExit, "OwnBaseException": lambda: OwnBaseException("mine")}


def _raiser(name):
    def plant(*_args):
        raise RAISED[name]()

    return plant


@pytest.mark.parametrize("name", sorted(RAISED))
def test_a_base_exception_in_a_foreign_step_ends_that_episode_only(name):
    env = started(PlantedAdapter(on_step=_raiser(name)))
    obs, reward, terminated, truncated, info = env.step("5")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert name in info["env_error"] and "ForeignEnvError" in info["env_error"]
    assert started(HotColdAdapter()).step("hmm")[4] == {}  # the next env is untouched


@pytest.mark.parametrize("name", sorted(RAISED))
def test_a_base_exception_in_a_foreign_reset_is_one_error(name):
    env = PlantedAdapter(on_reset=_raiser(name))
    with pytest.raises(ForeignEnvError, match=f"the env's reset raised {name}"):
        env.reset(options={"task": TASK})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("5")


@pytest.mark.timeout(120)
def test_a_sigint_to_the_process_still_stops_the_caller_and_frees_the_lock():
    assert threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT)
    try:
        _sigint_stops_the_caller()
    finally:
        signal.signal(signal.SIGINT, previous)


def _sigint_stops_the_caller() -> None:
    env = started(PlantedAdapter(on_step=lambda reply: (time.sleep(20), reply)[1], call_timeout_s=60))
    # Python's own Ctrl-C handler, as a user's process has it, set after the env started: in the
    # whole suite an earlier test's handler came back here once (no KeyboardInterrupt; not traced)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # what a Ctrl-C is
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        env.step("5")
    assert time.monotonic() - t0 < 15  # not after the foreign call's 20 s
    timer.join()
    # the interrupted call was given up: its lock and state are back, another env plays on
    assert started(HotColdAdapter()).step("hmm")[4] == {}


# --- deadlines ----------------------------------------------------------------------------------


def _play(env, actions):
    return [env.step(a)[0][0].content for a in actions]


@pytest.mark.timeout(180)
def test_hung_steps_in_two_envs_end_at_the_deadline_and_another_env_goes_on():
    actions = ["3", "6", "9", "12"]
    alone = _play(started(HotColdAdapter()), actions)
    release = threading.Event()
    hung = [started(PlantedAdapter(on_step=lambda reply: (release.wait(60), reply)[1], call_timeout_s=1.0))
            for _ in range(2)]
    healthy = started(HotColdAdapter())
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            steps = [pool.submit(env.step, "5") for env in hung]
            time.sleep(0.2)  # both hung steps are in flight
            played = _play(healthy, actions)
            still_hung = not release.is_set()
            results = [f.result(timeout=120) for f in steps]
        took = time.monotonic() - t0
    finally:
        release.set()
    assert still_hung and took < 45  # well before the hung calls would have returned (60 s)
    assert played == alone  # the private RNG of the healthy env was not disturbed
    for _obs, reward, terminated, truncated, info in results:
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert "gave no reply within call_timeout_s=1 s" in info["env_error"]


@pytest.mark.timeout(120)
def test_a_given_up_env_takes_no_call_until_its_helper_ends_and_closes_at_once():
    release = threading.Event()
    env = started(PlantedAdapter(on_step=lambda reply: (release.wait(60), reply)[1], call_timeout_s=0.5))
    assert "gave no reply" in env.step("5")[4]["env_error"]
    with pytest.raises(ForeignEnvError, match="given up and is still running"):
        env.reset(options={"task": TASK})
    t0 = time.monotonic()
    env.close()
    assert time.monotonic() - t0 < 5
    release.set()  # the helper wakes, meets the exception it was sent, and ends
    deadline = time.monotonic() + 30
    while env.boundary.stuck and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not env.boundary.stuck
    env.reset(options={"task": TASK})
    assert env.step("hmm")[4] == {}


@pytest.mark.timeout(120)
def test_a_busy_python_loop_is_stopped_and_a_hung_reset_is_one_error():
    def spin(*_args):
        while True:
            pass

    env = started(PlantedAdapter(on_step=spin, call_timeout_s=0.5))
    assert "gave no reply" in env.step("5")[4]["env_error"]
    assert not env.boundary.stuck  # the exception sent to the helper stopped the loop within the grace
    env.reset(options={"task": TASK})  # so the env takes the next call at once
    with pytest.raises(ForeignEnvError, match="reset gave no reply within call_timeout_s=0.5 s"):
        PlantedAdapter(on_reset=spin, call_timeout_s=0.5).reset(options={"task": TASK})


def test_the_boundary_options_are_checked_in_one_line():
    for bad in (0, -1, "5", True, float("inf")):
        with pytest.raises(ValueError, match="call_timeout_s must be a positive number"):
            ForeignBoundary(call_timeout_s=bad)
    for bad in (10, 511, 2.5e4, "4096"):
        with pytest.raises(ValueError, match="max_observation_chars must be an int >= 512"):
            ForeignBoundary(max_observation_chars=bad)
    assert isinstance(ForeignReplyError("x"), ValueError) and isinstance(ForeignEnvError("x"), Exception)


# --- process state ---------------------------------------------------------------------------


def _rlimit_fsize():
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (min(soft, hard, 10**12) - 1 if soft != 0 else 0, hard))


MUTATIONS = {
    "cwd": lambda tmp: os.chdir(tmp),
    "recursion_limit": lambda tmp: sys.setrecursionlimit(250),
    "env_var_added": lambda tmp: os.environ.__setitem__("TRACE_GYM_PLANTED", "1"),
    "env_var_removed": lambda tmp: os.environ.pop("TRACE_GYM_KEEP"),
    "int_digits": lambda tmp: sys.set_int_max_str_digits(640),
    "root_logger": lambda tmp: logging.basicConfig(level=logging.DEBUG, force=True),
    "warnings_as_errors": lambda tmp: warnings.simplefilter("error"),
    "stdout": lambda tmp: setattr(sys, "stdout", io.StringIO()),
    "umask": lambda tmp: os.umask(0o077),
    "gc_off": lambda tmp: gc.disable(),
    "socket_timeout": lambda tmp: socket.setdefaulttimeout(0.5),
    "excepthook": lambda tmp: setattr(sys, "excepthook", lambda *a: None),
    "cpu_timer": lambda tmp: signal.setitimer(signal.ITIMER_VIRTUAL, 1000.0),
    "file_size_limit": lambda tmp: _rlimit_fsize(),
}


@pytest.mark.parametrize("where", ["reset", "step"])
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_process_state_a_foreign_call_changes_is_put_back(name, where, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_GYM_KEEP", "kept")
    mutate = MUTATIONS[name]

    def on_reset(obs, info):
        mutate(tmp_path)
        return obs, info

    def on_step(reply):
        mutate(tmp_path)
        return reply

    env = PlantedAdapter(**({"on_reset": on_reset} if where == "reset" else {"on_step": on_step}))
    before, rng = process_state.capture(), (random.getstate(), np.random.get_state()[1].tobytes())
    env.reset(options={"task": TASK})
    env.step("5")
    after = process_state.capture()
    assert {k: v for k, v in after.items() if before.get(k) != v} == {}
    assert (random.getstate(), np.random.get_state()[1].tobytes()) == rng


# --- through the agent loop ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy():
    from bank_fixtures import ScriptedPolicy

    return ScriptedPolicy()


def test_the_agent_runner_survives_every_class_in_one_batch(policy):
    from trace_gym.agent.loop import AgentConfig, AgentRunner
    from trace_gym.types import SamplingParams

    plans = {
        0: {"on_reset": _raiser("SystemExit")},
        1: {"on_step": _raiser("KeyboardInterrupt")},
        2: {"on_step": replace_obs([Message("user", "bad \ud800 text " * 5_000)])},
        3: {"on_reset": lambda obs, info: ([Message("user", "\udcff" * 100_000)], info)},
        4: {"on_step": lambda reply: (reply[0], reply[1], "False", reply[3], reply[4])},
        5: {"on_step": _raiser("GeneratorExit")},
        6: {},
    }
    made = iter(range(len(plans)))

    def make_env():
        return PlantedAdapter(max_observation_chars=2000, **plans[next(made)])

    runner = AgentRunner(policy, policy.tokenizer, make_env, SamplingParams(temperature=0.0),
                         AgentConfig(max_turn_tokens=16, max_episode_tokens=4096, max_turns=3, env_workers=1))
    try:
        episodes = runner.start_many([(TASK, s) for s in range(len(plans))])
        finished = {ep.uid: ep for ep in runner.run(episodes)}
    finally:
        runner.close()
    eps = [finished[ep.uid] for ep in episodes]
    assert "SystemExit" in eps[0].error and not eps[0].turns
    assert "KeyboardInterrupt" in eps[1].turns[0].info["env_error"] and eps[1].turns[0].truncated
    assert "GeneratorExit" in eps[5].turns[0].info["env_error"]
    assert "terminated=" in eps[4].turns[0].info["env_error"]
    for ep in eps[2:4]:
        assert ep.error is None and ep.turns
        utf8(ep.messages)
    assert eps[6].error is None and eps[6].turns


# --- replay sees the whole observation ---------------------------------------------------------


def test_replay_catches_a_difference_in_the_middle_of_a_long_observation():
    from trace_gym.env.contract import ReplayDivergence

    calls = iter(range(10**6))

    def long_middle(reply):  # 60,000 characters, cut to 32,768 for the model: the middle differs per call
        return ([Message("user", "a" * 30000 + str(next(calls)) + "b" * 30000)], *reply[1:])

    env = started(PlantedAdapter(on_step=long_middle, snapshot="replay"))
    obs = env.step("5")[0]
    assert TRUNCATION_NOTE.split("{")[0] in obs[0].content  # the model saw a cut observation
    snap = env.snapshot()
    env.step("6")
    with pytest.raises(ReplayDivergence, match="turn 1.*seed its randomness from the episode seed, or use "
                                               "snapshot='copy'"):
        env.restore(snap)


def test_a_deterministic_long_observation_replays_and_replay_only_drivers_get_no_copy_advice():
    from trace_gym.env.contract import ReplayDivergence

    env = started(PlantedAdapter(on_step=lambda r: ([Message("user", "a" * 60000)], *r[1:]), snapshot="replay"))
    env.step("5")
    snap = env.snapshot()
    env.step("6")
    env.restore(snap)  # the same whole observation: no divergence
    assert "copy" not in str(ReplayDivergence(2, copy_possible=False))
