"""verifiers envs through environments/ecosystems/verifiers.py: real classic envs (a
SingleTurnEnv with an exact-match rubric, a MultiTurnEnv with env_response feedback and an
async reward, a ToolEnv) from tests/fixtures/ecosystem_envs_verifiers, resolved as
``verifiers:<module>``, pass check_env under replay; rewards are the rubric's own and arrive
on the last step; async rubrics of episodes on different threads overlap; hostile actions,
bad names and bad keyword arguments are handled in one line. Offline, no model client."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("verifiers")

from registry_fixtures import registries_restored  # noqa: E402
from trace_gym.api import resolve_env  # noqa: E402
from trace_gym.env.checks import check_env  # noqa: E402
from trace_gym.types import Task  # noqa: E402

QA = "verifiers:ecosystem_envs_verifiers.exact_qa"
VAULT = "verifiers:ecosystem_envs_verifiers.vault_hints"
TOOL = "verifiers:ecosystem_envs_verifiers.tool_calc"
# guesses that reach the vault env's 5-turn limit on most codes (a miss, no tag, more misses)
VAULT_ACTIONS = ["<code>10</code>", "no idea", "<code>5</code>", "<code>15</code>", "<code>13</code>", "<code>4</code>"]
HOSTILE = ("<answer>" + "x\x00" * 25_000 + "<code>" * 5_000 + "<tool_call>{" * 3_000 + "</answer")


@pytest.fixture(scope="module", autouse=True)
def _restore_registries():
    with registries_restored(lambda name, module: name.startswith("ecosystem_envs_verifiers")):
        yield


def _task_with_answer(env, answer):
    return next(t for t in env.episode.default_tasks() if t.answer == answer)


@pytest.mark.parametrize("name, actions, snapshots", [(QA, ["<answer>8</answer>"], 3), (VAULT, VAULT_ACTIONS, 12)])
def test_env_passes_check_env_through_the_resolver(name, actions, snapshots):
    fam = resolve_env(name)
    report = check_env(fam.make_env(), fam.load_tasks(3, seed=0), make_env=fam.make_env,
                       actions=lambda task: actions, branch_actions=["<code>1</code>", "<answer>2</answer>"])
    assert report.snapshot_strategy == "replay"
    for check in ("snapshot_roundtrip", "branch_isolation", "snapshot_pickle_process"):
        assert report.passed[check] >= snapshots, check  # 3 tasks, one snapshot per turn reached
    assert report.passed["replay_deterministic"] == 3


def _rubric_score(vf_env, row, action):
    """The env's rubric scoring a one-reply rollout by itself (as run_rollout would)."""
    import verifiers as vf

    state = vf.State(input=dict(row))
    state["completion"] = [vf.AssistantMessage(content=action)]
    state["trajectory"] = [{}]
    asyncio.run(vf_env.rubric.score_rollout(state))
    return state["reward"]


@pytest.mark.parametrize("answer, expected, exact", [("<answer>8</answer>", 1.2, 1.0), ("<answer>6</answer>", 0.2, 0.0),
                                                     ("8", None, 0.0)])
def test_single_turn_reward_is_the_rubrics_score(answer, expected, exact):
    fam = resolve_env(QA)
    env = fam.make_env().unwrapped
    task = _task_with_answer(env, "8")
    obs, _ = env.reset(options={"task": task})
    assert [m.role for m in obs] == ["system", "user"] and obs[1].content == "How many legs has a spider?"
    _, reward, terminated, truncated, info = env.step(answer)
    # exact match (weight 1.0) + the XMLParser's format reward (weight 0.2), by hand and by the rubric
    if expected is not None:
        assert reward == pytest.approx(expected)
    assert info["metrics"]["exact_match"] == exact
    assert reward == pytest.approx(_rubric_score(env.episode.vf_env, task.metadata["row"], answer))
    assert (terminated, truncated, info["stop_condition"]) == (True, False, "max_turns_reached")
    assert task.source == "exact-qa"  # the row's plain-string task label


def test_multi_turn_feedback_and_the_async_reward_on_the_last_step():
    fam = resolve_env(VAULT)
    env = fam.make_env().unwrapped
    env.reset(options={"task": _task_with_answer(env, "13")})
    steps = [env.step(a) for a in ["<code>10</code>", "hmm", "<code>15</code>", "<code>13</code>"]]
    assert [s[0][0].content for s in steps[:3]] == ["higher", "Write your guess as <code>N</code>.", "lower"]
    assert [s[1] for s in steps] == [0.0, 0.0, 0.0, pytest.approx(1 / 3)]  # 1 / (2 hints + 1), last step only
    assert steps[3][2:4] == (True, False) and steps[3][4]["stop_condition"] == "vault_open"
    env.reset(options={"task": _task_with_answer(env, "13")})
    last = [env.step("<code>1</code>") for _ in range(5)][-1]
    assert last[1:4] == (0.0, True, False) and last[4]["stop_condition"] == "max_turns_reached"


def test_async_rubrics_of_episodes_on_two_threads_overlap():
    delay = 1.0
    fam = resolve_env(VAULT + f"?score_delay={delay}")
    envs = [fam.make_env().unwrapped for _ in range(2)]  # made on the main thread, stepped on others
    tasks = [_task_with_answer(envs[0], "13"), _task_with_answer(envs[0], "4")]
    results, barrier = {}, threading.Barrier(2)

    def play(k):
        envs[k].reset(options={"task": tasks[k]})
        envs[k].step("<code>7</code>")
        barrier.wait()
        start = time.perf_counter()
        results[k] = (envs[k].step(f"<code>{tasks[k].answer}</code>"), time.perf_counter() - start)

    threads = [threading.Thread(target=play, args=(k,)) for k in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    assert all(results[k][0][1] == pytest.approx(0.5) for k in range(2))  # one hint each: 1 / 2
    assert all(results[k][1] >= delay for k in range(2))  # each final step awaited its rubric
    assert elapsed < 1.8 * delay, f"two {delay} s rubrics took {elapsed:.2f} s: they ran one after the other"


def test_tool_env_reads_hermes_tool_calls_and_shows_tool_messages():
    fam = resolve_env(TOOL)
    env = fam.make_env().unwrapped
    _, info = env.reset(options={"task": _task_with_answer(env, "408")})
    assert [t["name"] for t in info["tool_defs"]] == ["multiply"]
    obs, reward, terminated, _, _ = env.step('Let me. <tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}'
                                             '</tool_call>')
    assert [(m.role, m.content) for m in obs] == [("tool", "408")] and obs[0].tool_call_id and not terminated
    obs, *_ = env.step('<tool_call>{"name": "multiply", "arguments": {"a": 1}}</tool_call><tool_call>{oops</tool_call>')
    assert len(obs) == 1 and "missing 1 required positional argument" in obs[0].content  # the env's own error text
    _, reward, terminated, truncated, info = env.step("<answer>408</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False) and info["stop_condition"] == "no_tools_called"
    assert info["metrics"]["multiply_calls"] == 2.0


def test_our_max_turns_truncates_and_the_rollout_is_still_scored():
    fam = resolve_env(VAULT, env_kwargs={"max_turns": 2})
    env = fam.make_env().unwrapped
    env.reset(options={"task": _task_with_answer(env, "13")})
    assert env.step("<code>3</code>")[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step("<code>19</code>")
    assert (terminated, truncated, reward) == (False, True, 0.0)
    assert [m.content for m in obs] == ["lower"]  # the env's reply to the last action
    assert info["metrics"]["num_turns"] == 2.0  # the rubric ran


@pytest.mark.parametrize("name", [QA, VAULT, TOOL])
def test_hostile_actions_do_not_raise(name):
    fam = resolve_env(name)
    env = fam.make_env().unwrapped
    task = fam.load_tasks(1, seed=0)[0]
    env.reset(options={"task": task})
    start = time.perf_counter()
    obs, reward, terminated, truncated, info = env.step(HOSTILE)
    assert time.perf_counter() - start < 5.0
    assert isinstance(reward, float) and isinstance(obs, list)
    env.reset(options={"task": task})  # the adapter is still usable
    assert env.step("<answer>1</answer>")[1] >= 0.0


def test_an_env_that_raises_becomes_a_truncated_step_with_env_error():
    env = resolve_env(VAULT).make_env().unwrapped
    obs, _ = env.reset(options={"task": Task(id="hand/1", prompt="Open the vault.", answer="not a number")})
    assert [(m.role, m.content) for m in obs] == [("user", "Open the vault.")]
    obs, reward, terminated, truncated, info = env.step("<code>3</code>")
    assert (reward, terminated, truncated) == (0.0, False, True) and "ValueError" in info["env_error"]


def test_a_rollout_that_fails_before_the_first_reply_is_reported_on_reset_and_ends_truncated():
    env = resolve_env(VAULT + "?offline=true").make_env().unwrapped
    obs, info = env.reset(options={"task": env.episode.default_tasks()[0]})
    assert obs[-1].content.startswith("Open vault") and "the vault service is offline" in info["env_error"]
    _, reward, terminated, truncated, info = env.step("<code>3</code>")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["stop_condition"] == "has_error" and "offline" in info["env_error"]


def test_loading_keeps_the_hosts_signal_handlers_and_needs_the_main_thread():
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    saved = signal.signal(signal.SIGTERM, handler)
    try:
        resolve_env(QA + "?num_examples=2").make_env()  # a new load_environment call
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, saved)
    failure = []
    thread = threading.Thread(target=lambda: failure.append(_error_of(resolve_env(QA + "?num_examples=3").make_env)))
    thread.start()
    thread.join()
    assert "make the first env of this id on the main thread" in failure[0]


def _error_of(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return ""


def test_unknown_module_and_keyword_arguments_are_one_line_with_did_you_mean():
    with pytest.raises(ValueError, match=r"did you mean ecosystem_envs_verifiers\.exact_qa") as err:
        resolve_env("verifiers:ecosystem_envs_verifiers.exact_qaa")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"num_exampels.*did you mean num_examples") as err:
        resolve_env(QA + "?num_exampels=2")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"max_turn'.*did you mean max_turns"):
        resolve_env(QA, env_kwargs={"max_turn": 2})
    with pytest.raises(ValueError, match=r"no load_environment"):
        resolve_env("verifiers:ecosystem_envs_verifiers")


def test_available_lists_installed_hub_packages(tmp_path, monkeypatch):
    from environments.ecosystems import verifiers as adapter

    (tmp_path / "vf_toy_env.py").write_text("def load_environment(**kwargs):\n    raise NotImplementedError\n")
    info = tmp_path / "vf_toy_env-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vf-toy-env\nVersion: 0.1.0\n"
                                   "Requires-Dist: verifiers>=0.1.14\n")
    (info / "top_level.txt").write_text("vf_toy_env\n")
    before = adapter.available()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(adapter.available()) - set(before) == {"verifiers:vf_toy_env"}


def test_importing_the_adapter_is_lazy_and_playing_keeps_the_process_rng():
    code = ("import logging, random, sys\n"
            "import environments.ecosystems.verifiers as m\n"
            "assert m.PACKAGE == 'verifiers' and 'verifiers' not in sys.modules and 'datasets' not in sys.modules\n"
            "state, handlers = random.getstate(), list(logging.getLogger().handlers)\n"
            "from trace_gym.api import resolve_env\n"
            "env = resolve_env('verifiers:ecosystem_envs_verifiers.vault_hints').make_env()\n"
            "env.reset(seed=1)\n"
            "env.step('<code>3</code>')\n"
            "print(random.getstate() == state, logging.getLogger().handlers == handlers)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1] / "fixtures")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True"]  # a bare `import verifiers` 0.1.14 draws from the global random


def test_hostile_tool_call_blocks_are_skipped_not_raised():
    from environments.ecosystems.verifiers_rollout import hermes_tool_calls

    hostile = ("<tool_call>" + "[" * 100_000 + "</tool_call>"
               "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": " + "9" * 5000 + "}}</tool_call>"
               "<tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>")
    assert [c["name"] for c in hermes_tool_calls(hostile, 0)] == ["ok"]


@pytest.mark.timeout(120)
def test_an_env_that_blocks_the_shared_loop_is_named_and_later_episodes_get_a_fresh_loop():
    """All verifiers episodes share one event loop; an env whose step blocks it (6 s here,
    past its 2 s step_timeout) once held up every verifiers env of the process after it."""
    blocking = resolve_env(f"{VAULT}?block_s=6", {"step_timeout": 2}).make_env()
    blocking.reset(seed=0)
    _obs, _reward, _terminated, truncated, info = blocking.step("<code>10</code>")
    assert truncated and "blocked the shared event loop" in info["env_error"], info
    healthy = resolve_env(VAULT, {"step_timeout": 2}).make_env()
    t0 = time.monotonic()
    healthy.reset(seed=0)  # on a fresh loop, while the old one is still blocked
    obs, _reward, _terminated, truncated, info = healthy.step("<code>10</code>")
    assert time.monotonic() - t0 < 2 and not truncated and obs[0].content in ("higher", "lower"), info
    blocking.close()
    healthy.close()
