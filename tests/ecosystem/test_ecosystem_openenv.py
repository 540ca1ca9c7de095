"""The OpenEnv adapter (environments/ecosystems/openenv.py) on real OpenEnv servers: two
small envs written on OpenEnv's own classes (tests/fixtures/ecosystem_envs_openenv), served by
uvicorn on loopback, pass check_env through the resolver (replay snapshots, the
cross-process check starting its own server); a killed server ends only its own episode,
a slow one truncates within the read timeout, a dropped connection resumes on a new
session, close() stops the server process (or keeps it for the next instance when asked),
and bad ids, options, URLs and server commands fail in one line."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from environments.ecosystems import openenv as adapter  # noqa: E402
from environments.ecosystems import openenv_server as servers  # noqa: E402
from registry_fixtures import registries_restored  # noqa: E402
from trace_gym.api import resolve_env  # noqa: E402
from trace_gym.env.checks import check_env  # noqa: E402
from trace_gym.types import Message  # noqa: E402
from trace_gym.utils.pythonpath import source_folders_path  # noqa: E402

GUESS_APP = "ecosystem_envs_openenv.guess:app"
COUNTER_APP = "ecosystem_envs_openenv.counter:app"
GUESS_ACTIONS = ["10", "5", "15", "no idea", "3", "18", "12", "7"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module", autouse=True)
def _restore_registries():
    with registries_restored(lambda name, module: name == "toy" or name.startswith("toy.")):
        yield


@pytest.fixture(scope="module")
def counter_url():
    """A counter server started by the test itself (the ``openenv:<URL>`` form)."""
    port = servers.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", COUNTER_APP, "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], env={**os.environ, "PYTHONPATH": source_folders_path()},
                            start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    local = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        try:
            local.open(f"{url}/health", timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the counter server did not start"
            time.sleep(0.05)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)


def test_guess_env_passes_check_env_on_one_shared_server():
    fam = resolve_env("openenv:guess", env_kwargs={"server_cmd": GUESS_APP, "sessions_per_server": 3})
    env, other = fam.make_env(), fam.make_env()
    tasks = fam.load_tasks(3, seed=0)
    assert [t.id for t in tasks] == ["guess/seed0", "guess/seed1", "guess/seed2"]
    other.reset(options={"task": tasks[0]})
    report = check_env(env, tasks, make_env=fam.make_env, actions=lambda task: GUESS_ACTIONS)
    assert report.snapshot_strategy == "replay" and report.skipped == {}
    assert report.passed["replay_deterministic"] == 3 and report.passed["snapshot_pickle_process"] >= 6
    assert report.passed["snapshot_roundtrip"] >= 6 and report.passed["branch_isolation"] >= 6
    # env, check_env's second instance and `other` held one session each on one server,
    # which lives while `other` does and plays on; a right guess terminates with reward 1
    pid = other.unwrapped.server_pid
    assert pid is not None and not gone(pid) and servers.live_servers() == [pid]
    obs, _ = other.reset(options={"task": tasks[1]})
    assert obs == [Message("user", "Guess a number in 1..20. You have 6 tries.")]
    secret = next(n for n in range(1, 21) if "Correct" in _replayed_guess(other, tasks[1], n))
    other.reset(options={"task": tasks[1]})
    assert other.step(str(secret))[1:4] == (1.0, True, False)
    other.close()
    assert gone(pid) and servers.live_servers() == []


def _replayed_guess(env, task, n: int) -> str:
    env.reset(options={"task": task})
    return env.step(f"is it {n}?")[0][0].content


def test_counter_env_at_a_url_passes_check_env(counter_url):
    fam = resolve_env(f"openenv:{counter_url}?action_parser=ecosystem_envs_openenv.counter:parse_action",
                      task_kwargs={"reset_kwargs": {"limit": 5}})
    env = fam.make_env()
    tasks = fam.load_tasks(3, seed=4)
    assert tasks[0].id == f"{counter_url}/seed4" and tasks[0].metadata["reset_kwargs"] == {"limit": 5}
    report = check_env(env, tasks, make_env=fam.make_env, actions=lambda task: [f" w{i} " for i in range(7)])
    assert report.snapshot_strategy == "replay" and report.passed["snapshot_pickle_process"] == 15
    env = fam.make_env()
    obs, info = env.reset(options={"task": tasks[1]})
    assert obs[0].content == "counter ready (seed 5, limit 5)" and info["openenv_url"] == counter_url
    steps = [env.step(f"  hi {i}\n") for i in range(5)]
    assert [s[0][0].content for s in steps] == [f"hi {i}" for i in range(5)]  # the parser stripped it
    assert [s[1] for s in steps] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert [s[2] for s in steps] == [False] * 4 + [True]  # the server's done is terminated
    env.close()


def test_killed_server_truncates_only_its_own_episode(counter_url, caplog):
    fam = resolve_env("openenv:counter", env_kwargs={"server_cmd": COUNTER_APP, "action_field": "text",
                                                     "keep_servers": True})
    task = fam.load_tasks(1)[0]
    a = fam.make_env()  # starts a server of its own
    b = resolve_env(f"openenv:{counter_url}?action_field=text").make_env()  # another server
    a.reset(options={"task": task})
    b.reset(options={"task": task})
    pid = a.unwrapped.server_pid
    assert a.step("one")[0][0].content == "one" and b.step("one")[0][0].content == "one"
    os.kill(pid, signal.SIGKILL)
    obs, reward, terminated, truncated, info = a.step("two")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert f"(pid {pid}) exited with code -9 mid-episode" in info["env_error"]
    assert "could not process" in obs[0].content and "exited with code -9" in obs[0].content
    obs, reward, terminated, truncated, info = b.step("two")  # the other episode goes on
    assert (obs[0].content, truncated, info) == ("two", False, {}) and reward == pytest.approx(0.2)
    b.close()
    with caplog.at_level(logging.WARNING, logger=adapter.__name__):
        obs, _ = a.reset(options={"task": task})  # a new episode gets a new server, said so
    assert obs[0].content.startswith("counter ready") and a.unwrapped.server_pid not in (None, pid)
    assert f"(pid {pid}) exited with code -9; starting a new one" in caplog.text
    assert a.step("three")[0][0].content == "three"
    pid = a.unwrapped.server_pid
    a.close()  # kept: the next instance of this process needs no boot
    assert servers.live_servers() == [pid]
    c = fam.make_env()
    t0 = time.monotonic()
    c.reset(options={"task": task})
    assert c.unwrapped.server_pid == pid and time.monotonic() - t0 < 1.0
    c.close()
    assert servers.stop_servers() == [pid] and gone(pid) and servers.live_servers() == []


def test_slow_step_truncates_within_the_read_timeout(counter_url):
    env = resolve_env(f"openenv:{counter_url}?action_field=text&read_timeout=1").make_env()
    env.reset(seed=3)
    t0 = time.monotonic()
    obs, reward, terminated, truncated, info = env.step("sleep 2.5")
    assert time.monotonic() - t0 < 3.0
    assert truncated and not terminated and "read_timeout=1 s" in info["env_error"]
    assert "read_timeout" in obs[0].content
    obs, _ = env.reset(seed=3)  # a new session: the slow one is never reused
    assert env.step("after")[0][0].content == "after"
    env.close()


def test_dropped_connection_resumes_the_episode_on_a_new_session(counter_url):
    from ecosystem_envs_openenv.relay import Relay

    relay = Relay(int(counter_url.rsplit(":", 1)[1]))
    env = resolve_env(f"openenv:http://127.0.0.1:{relay.port}?action_field=text").make_env()
    env.reset(seed=1)
    assert [env.step(w)[0][0].content for w in ("a", "b")] == ["a", "b"]
    assert relay.cut() == 2  # the websocket, both ends; the server lives on
    obs, reward, terminated, truncated, info = env.step("c")
    assert (obs[0].content, truncated, info) == ("c", False, {"env_reconnects": 1})
    assert reward == pytest.approx(0.3)  # the third step of the same episode, replayed onto a new session
    env.close()
    relay.close()


def test_env_failures_and_rejected_actions_truncate_naming_the_cause(counter_url):
    env = resolve_env(f"openenv:{counter_url}?action_field=text").make_env()
    env.reset(seed=0)
    info = env.step("crash")[4]
    assert "crashed on purpose" in info["env_error"] and "EXECUTION_ERROR" in info["env_error"]
    env.close()
    env = resolve_env(f"openenv:{counter_url}?action_field=msg").make_env()
    env.reset(seed=0)
    obs, _, _, truncated, info = env.step("hello")
    assert truncated and "fields ['metadata', 'text'], required ['text']" in info["env_error"]
    assert "action_field=" in info["env_error"] and "\n" not in info["env_error"]
    env.close()


def test_unreachable_url_and_bad_options_are_one_line_errors():
    url = f"http://127.0.0.1:{servers.free_port()}"
    env = resolve_env(f"openenv:{url}?retries=1").make_env()
    import openenv.core.generic_client  # noqa: F401  (its import takes seconds; the retries are timed)

    t0 = time.monotonic()
    with pytest.raises(servers.OpenEnvError) as err:
        env.reset(seed=0)
    assert time.monotonic() - t0 < 3.0
    assert f"cannot reach the OpenEnv server at {url}" in str(err.value) and "after 2 attempts" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(RuntimeError, match="reset"):
        env.unwrapped.step("anything")  # no episode began
    env.close()
    env = resolve_env("openenv:broken", env_kwargs={"server_cmd": "nosuch_module:app"}).make_env()
    with pytest.raises(servers.OpenEnvError, match=r"exited with code \d+ before answering GET /health \(its log "
                                                   r"ends: .*Could not import module \"nosuch_module\""):
        env.reset(seed=0)
    never = ["{python}", "-c", "import time; time.sleep(30)", "{port}"]
    env = resolve_env("openenv:mute", env_kwargs={"server_cmd": never, "start_timeout": 0.5}).make_env()
    with pytest.raises(servers.OpenEnvError, match=r"did not answer GET http://127.0.0.1:\d+/health within "
                                                   r"start_timeout=0.5 s"):
        env.reset(seed=0)
    assert servers.live_servers() == []  # both stopped
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['server_cmnd'\]; did you mean server_cmd"):
        resolve_env("openenv:guess", env_kwargs={"server_cmnd": GUESS_APP})
    with pytest.raises(ValueError, match=r"tasks: unknown option\(s\) \['reset_kwarg'\]; did you mean reset_kwargs"):
        resolve_env("openenv:guess", env_kwargs={"server_cmd": GUESS_APP}, task_kwargs={"reset_kwarg": {}})
    with pytest.raises(ValueError, match=r"supports \['replay'\]"):
        resolve_env(f"openenv:{url}?snapshot=copy")
    with pytest.raises(ValueError, match=r"server_cmd= is for openenv:<name>"):
        resolve_env(f"openenv:{url}", env_kwargs={"server_cmd": GUESS_APP})
    with pytest.raises(ValueError, match=r"\{port\} placeholder"):
        resolve_env("openenv:guess", env_kwargs={"server_cmd": "python serve.py"})
    with pytest.raises(ValueError, match="no installed OpenEnv env package is named 'nosuch'"):
        resolve_env("openenv:nosuch")
    with pytest.raises(ValueError, match="action_parser='nosuch_module:f' cannot be loaded"):
        resolve_env(f"openenv:{url}?action_parser=nosuch_module:f")


def test_text_json_mapping_commands_and_tasks():
    assert adapter.render_observation({"text": "hi", "attempts_left": 3}) == "hi"  # the only string field
    assert adapter.render_observation({"a": "x", "b": "y"}) == '{"a": "x", "b": "y"}'  # ambiguous: JSON
    assert adapter.render_observation({"n": [1, 2]}, "n") == "[1, 2]"
    with pytest.raises(ValueError, match=r"observation_field='z' is not in the observation; it has \['a'\]"):
        adapter.render_observation({"a": 1}, "z")
    assert adapter.action_payload("x", "code") == {"code": "x"}
    assert adapter.action_payload(" x ", "code", lambda t: {"cmd": t.strip()}) == {"cmd": "x"}
    with pytest.raises(TypeError, match="must return a dict"):
        adapter.action_payload("x", "code", lambda t: t)
    assert adapter.server_command("pkg.server.app:app", 9) == [
        sys.executable, "-m", "uvicorn", "pkg.server.app:app", "--host", "127.0.0.1", "--port", "9",
        "--log-level", "warning"]
    assert adapter.server_command(["docker", "run", "-p", "{port}:8000", "img"], 9) == [
        "docker", "run", "-p", "9:8000", "img"]
    assert adapter.server_command("{python} -m srv --port={port} --json '{}'", 9) == [
        sys.executable, "-m", "srv", "--port=9", "--json", "{}"]
    tasks = adapter.load_tasks(2, seed=7, name="echo", reset_kwargs={"level": 2})
    assert [(t.id, dict(t.metadata)) for t in tasks] == [("echo/seed7", {"seed": 7, "reset_kwargs": {"level": 2}}),
                                                          ("echo/seed8", {"seed": 8, "reset_kwargs": {"level": 2}})]
    with pytest.raises(ValueError, match="without 'seed'"):
        adapter.load_tasks(1, name="echo", reset_kwargs={"seed": 1})


def test_installed_env_packages_are_found_with_their_server_app(tmp_path):
    """An env package laid out as ``openenv init`` makes it, installed as pip would (a
    dist-info folder on the path): OpenEnv's discovery finds it, its manifest names the app."""
    (tmp_path / "openenv_toy-0.1.0.dist-info").mkdir()
    (tmp_path / "openenv_toy-0.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: openenv-toy\nVersion: 0.1.0\n")
    (tmp_path / "toy" / "server").mkdir(parents=True)
    (tmp_path / "toy" / "__init__.py").write_text("")
    (tmp_path / "toy" / "openenv.yaml").write_text("spec_version: 1\nname: toy\napp: server.app:app\nport: 8000\n")
    assert "toy" not in adapter.available()
    sys.path.insert(0, str(tmp_path))
    try:
        assert "toy" in adapter.available()
        fam = resolve_env("openenv:toy")
        assert fam.env_kwargs["server_cmd"] == "toy.server.app:app" and fam.env_id == "trace_gym/openenv.toy"
        with pytest.raises(ValueError, match=r"no installed OpenEnv env package is named 'tyo'.*did you mean toy"):
            resolve_env("openenv:tyo")
    finally:
        sys.path.remove(str(tmp_path))
        adapter.available()  # discovery rewrites its file cache without the toy


def test_listing_installed_packages_does_not_import_the_server_stack():
    """`trace-gym envs` lists OpenEnv packages through OpenEnv's discovery module loaded alone:
    importing it as openenv.auto's submodule ran the package's __init__ (gradio, 5-12 s)."""
    code = ("import sys; from environments.ecosystems import openenv as a; found = a.available(); "
            "print(sorted(m for m in ('gradio', 'openenv.core', 'openenv.auto') if m in sys.modules), "
            "isinstance(found, list))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2],
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "[] True", out.stdout
