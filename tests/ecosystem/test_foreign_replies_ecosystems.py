"""Hostile replies through the real ecosystem packages and their adapters: a GEM game
registered with ``gem.register``, a skyrl-gym env registered with ``skyrl_gym.register``, a
verifiers env module, and an OpenEnv websocket peer that answers with whatever a test plants.
Each class of issue 36's foreign replies in several variants: unencodable and oversized text,
flags that are not booleans, BaseExceptions, a hung call beside a healthy env of the same
ecosystem, process state changed by a step, and OpenEnv replies that are not JSON objects
within the bounds (one-line ``OpenEnvError``). Offline."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from trace_gym.types import Message, Task


def utf8(obs) -> str:
    text = "\n".join(m.content for m in obs)
    text.encode("utf-8")  # raises on a lone surrogate
    return text


# --- GEM --------------------------------------------------------------------------------------

RELEASE = threading.Event()  # what a hung GEM step waits for


def _gem_step(plan: str):
    if plan == "surrogate":
        return "you said \ud800", 0.0, False, False, {"suffix": "next \udc00"}
    if plan == "huge":
        return "g" * 50_000_000, 0.0, False, False, {}
    if plan == "flag_str":
        return "ok", 0.0, "False", False, {}
    if plan == "flag_int":
        return "ok", 0.0, False, 0, {}
    if plan == "reward_str":
        return "ok", "1.0", True, False, {}
    if plan == "exit":
        sys.exit(3)
    if plan == "interrupt":
        raise KeyboardInterrupt
    if plan == "state":
        os.chdir("/")
        sys.setrecursionlimit(300)
        os.environ["TRACE_GYM_GEM_PLANTED"] = "1"
        return "moved", 0.0, False, False, {}
    if plan == "hang":
        RELEASE.wait(60)
        return "late", 0.0, False, False, {}
    raise AssertionError(plan)


@pytest.fixture(scope="module")
def gem_ids():
    pytest.importorskip("gem")
    from gem.core import Env
    from gem.envs.registration import ENV_REGISTRY, register

    class PlantedGame(Env):
        def __init__(self, plan: str = "surrogate", **_):
            super().__init__()
            self.plan = plan

        def reset(self, seed=None):
            super().reset(seed)
            if self.plan == "reset_surrogate":
                return "welcome \udfff", {}
            if self.plan == "reset_exit":
                sys.exit(3)
            return "Guess a number.", {}

        def step(self, action):
            return _gem_step(self.plan)

    plans = ("surrogate", "huge", "flag_str", "flag_int", "reward_str", "exit", "interrupt", "state", "hang",
             "reset_surrogate", "reset_exit")
    ids = {plan: f"trace_gym_test:Planted-{plan}" for plan in plans}
    for plan, gem_id in ids.items():
        register(gem_id, PlantedGame, plan=plan)
    yield ids
    RELEASE.set()
    for gem_id in ids.values():
        ENV_REGISTRY.pop(gem_id, None)


def _gem(gem_ids, plan, **kwargs):
    from environments.ecosystems.gem import GemEnv

    env = GemEnv(gem_ids[plan], **kwargs)
    obs, _info = env.reset(options={"task": Task(id=f"{gem_ids[plan]}/seed0", prompt="", metadata={"seed": 0})})
    return env, obs


def test_gem_text_is_cleaned_and_bounded(gem_ids):
    _env, obs = _gem(gem_ids, "reset_surrogate")
    assert "\\udfff" in utf8(obs)
    env, _obs = _gem(gem_ids, "surrogate")
    obs, _reward, _terminated, truncated, info = env.step("\\boxed{5}")
    assert "\\ud800" in utf8(obs) and "\\udc00" in obs[0].content and not truncated and "env_error" not in info
    env, _obs = _gem(gem_ids, "huge", max_observation_chars=8192)
    obs, *_rest, info = env.step("\\boxed{5}")
    assert len(obs[0].content) <= 8192 and "observation truncated" in obs[0].content and info["obs_truncated"]


@pytest.mark.parametrize("plan,names", [("flag_str", "terminated='False'"), ("flag_int", "truncated=0"),
                                        ("reward_str", "reward='1.0'")])
def test_gem_values_outside_the_contract_truncate_naming_the_value(gem_ids, plan, names):
    env, _obs = _gem(gem_ids, plan)
    obs, reward, terminated, truncated, info = env.step("\\boxed{5}")
    assert (reward, terminated, truncated) == (0.0, False, True) and names in info["env_error"]


@pytest.mark.parametrize("plan,name", [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")])
def test_gem_base_exceptions_end_the_episode(gem_ids, plan, name):
    env, _obs = _gem(gem_ids, plan)
    _obs, _reward, _terminated, truncated, info = env.step("\\boxed{5}")
    assert truncated and name in info["env_error"]


def test_gem_exit_in_reset_is_one_error(gem_ids):
    from trace_gym.env.boundary import ForeignEnvError

    with pytest.raises(ForeignEnvError, match="reset raised SystemExit: 3"):
        _gem(gem_ids, "reset_exit")


def test_gem_step_that_changes_process_state_leaves_none_behind(gem_ids, monkeypatch):
    cwd, limit = os.getcwd(), sys.getrecursionlimit()
    env, _obs = _gem(gem_ids, "state")
    assert env.step("\\boxed{5}")[0][0].content == "moved"
    assert (os.getcwd(), sys.getrecursionlimit(), os.environ.get("TRACE_GYM_GEM_PLANTED")) == (cwd, limit, None)


@pytest.mark.timeout(180)
def test_a_hung_gem_step_leaves_other_gem_envs_playing(gem_ids):
    from environments.ecosystems.gem import GemEnv

    guess = "game:GuessTheNumber-v0-easy"
    task = Task(id=f"{guess}/seed4", prompt="", metadata={"seed": 4})
    actions = ["\\boxed{2}", "\\boxed{4}", "\\boxed{6}"]

    def play():
        env = GemEnv(guess)
        env.reset(options={"task": task})
        return [env.step(a)[:4] for a in actions]

    alone = play()
    hung, _obs = _gem(gem_ids, "hang", call_timeout_s=2.0)
    with ThreadPoolExecutor(1) as pool:
        t0 = time.monotonic()
        stuck = pool.submit(hung.step, "\\boxed{5}")
        time.sleep(0.2)
        beside = play()  # needs the RNG lock the hung step took
        took = time.monotonic() - t0
        result = stuck.result(timeout=120)
    assert beside == alone and took < 40 and not RELEASE.is_set()
    assert result[3] and "gave no reply within call_timeout_s=2 s" in result[4]["env_error"]


# --- skyrl-gym ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def skyrl_class():
    skyrl_gym = pytest.importorskip("skyrl_gym")
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

    class PlantedSkyRL(BaseTextEnv):
        def __init__(self, env_config=None, extras={}):  # noqa: B006  (skyrl's own signature)
            super().__init__()
            self.plan = extras["plan"]

        def step(self, action):
            if self.plan == "exit":
                raise SystemExit(2)
            if self.plan == "surrogate":
                return BaseTextEnvStepOutput(observations=[{"role": "user", "content": "x\ud800"}], reward=0.0,
                                             done=False, metadata={})
            done = {"done_str": "False", "done_none": None, "done_list": [True]}[self.plan]
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=done, metadata={})

    name = "trace_gym_test_planted"
    skyrl_gym.register(id=name, entry_point=PlantedSkyRL)
    yield name
    skyrl_gym.registry.pop(name, None)


@pytest.mark.parametrize("plan,expect", [("done_str", "terminated='False'"), ("done_none", "terminated=None"),
                                         ("done_list", "terminated=[True]"), ("exit", "SystemExit: 2"),
                                         ("surrogate", None)])
def test_skyrl_replies_cross_the_boundary(skyrl_class, plan, expect):
    from environments.ecosystems.skyrl import SkyRLEnv

    env = SkyRLEnv(skyrl_class)
    env.reset(options={"task": Task(id="p/0", prompt="q", metadata={"prompt": [{"role": "user", "content": "q"}],
                                                                   "env_class": skyrl_class,
                                                                   "extras": {"plan": plan}})})
    obs, reward, terminated, truncated, info = env.step("a")
    if expect is None:
        assert "\\ud800" in utf8(obs) and not truncated
    else:
        assert (reward, terminated, truncated) == (0.0, False, True) and expect in info["env_error"]


# --- verifiers ------------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_verifiers_env_that_exits_ends_its_episode_and_not_the_shared_loop():
    pytest.importorskip("verifiers")
    from trace_gym.api import resolve_env

    fam = resolve_env("verifiers:ecosystem_envs_verifiers.vault_hints", env_kwargs={"step_timeout": 60})
    tasks = fam.load_tasks(2, seed=0)
    exiting, healthy = fam.make_env(), fam.make_env()
    exiting.reset(options={"task": tasks[0]})
    healthy.reset(options={"task": tasks[1]})
    # the vault env's env_response reads the guess; a planted guess_of raises SystemExit in it. Patch the
    # globals the loaded env's methods read (an earlier test may have imported the module afresh since)
    scope = type(exiting.unwrapped.episode.vf_env).env_response.__globals__
    original = scope["guess_of"]

    def guess_of(message):
        if "<exit/>" in (message.content or ""):
            raise SystemExit(4)
        return original(message)

    scope["guess_of"] = guess_of
    try:
        t0 = time.monotonic()
        out = exiting.step("<exit/>")
        after = healthy.step("<code>10</code>")  # the loop the exit ran on still serves others
        took = time.monotonic() - t0
    finally:
        scope["guess_of"] = original
    assert out[3] and "SystemExit" in out[4]["env_error"]
    assert after[0][0].content in ("higher", "lower") and "env_error" not in after[4] and took < 50


# --- OpenEnv ----------------------------------------------------------------------------------------


class PlantedPeer:
    """A websocket peer at ``ws://127.0.0.1:<port>`` that answers each reset and step of
    OpenEnv's client with the raw text ``answers[kind]()`` (OpenEnv's server, as a hostile one)."""

    def __init__(self, answers):
        from websockets.sync.server import serve

        self.answers = answers
        self.server = serve(self._serve, "127.0.0.1", 0, max_size=None)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _serve(self, ws):
        for message in ws:
            kind = json.loads(message).get("type")
            if kind == "close":
                return
            ws.send(self.answers[kind]())

    def close(self):
        self.server.shutdown()


def _answer(observation, reward=0.0, done=False) -> str:
    return json.dumps({"type": "observation", "data": {"observation": observation, "reward": reward, "done": done}})


OK_RESET = lambda: _answer({"text": "ready"})  # noqa: E731

BAD_RESETS = {
    "not_json": lambda: "this is {not json",
    "deep": lambda: "[" * 100_000 + "]" * 100_000,
    "deep_inside": lambda: '{"type": "observation", "data": {"observation": ' + "[" * 5_000 + "]" * 5_000 + "}}",
    "long_number": lambda: '{"data": {"observation": {"n": ' + "9" * 5_000 + "}}}",
    "array": lambda: "[1, 2, 3]",
    "data_not_object": lambda: '{"type": "observation", "data": "text"}',
    "observation_not_object": lambda: _answer([1, 2]),
}


@pytest.fixture(scope="module")
def openenv_client():
    pytest.importorskip("openenv")
    pytest.importorskip("websockets")
    from environments.ecosystems.openenv_session import _client_class

    _client_class()  # OpenEnv's import (seconds) once for the module


@pytest.mark.parametrize("name", sorted(BAD_RESETS))
def test_an_openenv_reset_reply_it_cannot_read_is_one_openenv_error(openenv_client, name):
    from environments.ecosystems.openenv import OpenEnvAdapter
    from environments.ecosystems.openenv_server import OpenEnvError

    peer = PlantedPeer({"reset": BAD_RESETS[name]})
    env = OpenEnvAdapter(peer.url, retries=0)
    try:
        with pytest.raises(OpenEnvError) as err:
            env.reset(options={"task": Task(id="x/seed0", prompt="", metadata={"seed": 0})})
        message = str(err.value)
        assert "\n" not in message and peer.url in message and "answered reset with a reply that" in message
    finally:
        env.close()
        peer.close()


STEPS = {
    "done_str": (lambda: _answer({"text": "t"}, 0.0, "false"), "terminated='false'"),
    "done_int": (lambda: _answer({"text": "t"}, 0.0, 1), "terminated=1"),
    "reward_str": (lambda: _answer({"text": "t"}, "1", True), "reward='1'"),
    "surrogate": (lambda: _answer({"text": "a\ud800b"}), None),
    "eight_mb": (lambda: _answer({"text": "z" * 8_000_000}), None),
    "deep_step": (lambda: "{" * 70 + "}" * 70, "answered the step with a reply that is nested more than 64"),
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_openenv_step_replies_cross_the_boundary(openenv_client, name):
    from environments.ecosystems.openenv import OpenEnvAdapter

    answer, expect = STEPS[name]
    peer = PlantedPeer({"reset": OK_RESET, "step": answer})
    env = OpenEnvAdapter(peer.url, retries=0, max_observation_chars=4096)
    try:
        obs, _info = env.reset(options={"task": Task(id="x/seed0", prompt="", metadata={"seed": 0})})
        assert obs == [Message("user", "ready")]
        obs, reward, terminated, truncated, info = env.step("hello")
        if expect is None:
            assert len(utf8(obs)) <= 4096 and not truncated and "env_error" not in info
        else:
            assert (reward, terminated, truncated) == (0.0, False, True) and expect in info["env_error"]
    finally:
        env.close()
        peer.close()


def test_the_boundary_knobs_are_env_kwargs_of_the_adapters(gem_ids):
    from trace_gym.api import resolve_env

    env = resolve_env("gem:game:GuessTheNumber-v0-easy?max_number=20",
                      {"call_timeout_s": 7, "max_observation_chars": 1024}).make_env().unwrapped
    assert (env.boundary.call_timeout_s, env.boundary.max_observation_chars) == (7.0, 1024)
    with pytest.raises(ValueError, match="call_timeout_s must be a positive number of seconds, got 'soon'"):
        resolve_env("gem:game:GuessTheNumber-v0-easy", {"call_timeout_s": "soon"}).make_env()
    pytest.importorskip("openenv")
    from environments.ecosystems.openenv import OpenEnvAdapter

    assert OpenEnvAdapter("http://127.0.0.1:9", read_timeout=500.0).boundary.call_timeout_s > 1000  # its own first
