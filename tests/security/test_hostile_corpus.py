"""The hostile-output corpus through both envs: every case ends in an observation that
encodes as UTF-8 and passes through SmolLM2's chat template, no case raises, the env
keeps working afterwards, and the host process is unharmed. Cases run concurrently,
as a batch of episodes does."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from hostile_corpus import Case, all_cases

from environments.math_python.env import MathPythonEnv
from environments.math_python.sandbox import KernelLimits
from trace_gym.types import Task

CASES = all_cases()
MATH = [c for c in CASES if c.env == "math"]
BFCL = [c for c in CASES if c.env != "math"]
#: 3 s of wall clock a cell: at 1.5 s a follow-up print(6 * 7) among 4 concurrent episodes timed out in a
#: clean-clone run beside a bank recording (the test takes as long either way: 30 s here)
LIMITS = KernelLimits(cell_timeout_s=3.0, memory_mb=512, max_processes=24, output_bytes=4096)
#: A response's wall clock: two cells' worth and one spare second, so a cell stopped at its limit leaves the
#: follow-up cell a whole cell's time for the kernel's restart (at 4 s a loaded clean-clone run left the
#: follow-up print(6 * 7) after the fork bomb 0.68 s, and it timed out)
STEP_S = 2 * LIMITS.cell_timeout_s + 1.0
TASK = Task(id="corpus", prompt="What is 2 + 3?", answer="5")
#: attacks whose background thread ends the interpreter 50 ms after their cell: on a loaded
#: machine the death can land in the next cell instead
LATE_DEATHS = {"math_code_background_exit"}
CANARY = "/tmp/trace_gym_bfcl_canary"


def test_the_corpus_is_big_and_covers_both_envs():
    assert len(CASES) >= 100 and len({c.name for c in CASES}) == len(CASES)
    assert len(MATH) >= 40 and len(BFCL) >= 60


def check_observation(tokenizer, case: Case, obs) -> str:
    assert isinstance(obs, list), case.name
    text = "\n".join(m.content + (m.name or "") for m in obs)
    text.encode("utf-8")  # raises on lone surrogates
    # the action as a model's tokenizer would have decoded it (never a lone surrogate)
    action = case.action[:2000].encode("utf-8", "backslashreplace").decode("utf-8")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": action}]
    messages += [{"role": m.role, "content": m.content} for m in obs]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert len(ids) > 0, case.name
    return text


def run_math(case: Case, tokenizer) -> str:
    env = MathPythonEnv([TASK], limits=LIMITS, step_timeout_s=STEP_S, max_turns=10, prestart_kernel=False)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(case.action)
        text = check_observation(tokenizer, case, obs)
        assert len(text) <= env.max_observation_chars + 200, case.name
        assert not info.get("infra_error"), (case.name, info.get("infra_error"))
        if case.name.startswith("math_code_"):  # its last cell is print(6 * 7), after whatever came first
            assert "42" in text.rsplit("```output", 1)[-1], (case.name, text[-500:])
        if terminated:
            assert reward in (0.0, 1.0)
            return case.name
        obs, *_ = env.step("```python\nprint(6 * 7)\n```")  # the env goes on working
        if case.name in LATE_DEATHS and "KernelDied" in obs[0].content:
            # the attack's thread ended the interpreter while this cell ran (under load it runs
            # late): that cell reports the death, and the restarted kernel takes the next one
            assert "exited with code 9" in obs[0].content, (case.name, obs[0].content[-300:])
            obs, *_ = env.step("```python\nprint(6 * 7)\n```")
        assert "42" in obs[0].content, (case.name, obs[0].content[-300:])
        return case.name
    finally:
        env.close()


def test_math_corpus(tokenizer):
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(lambda c: run_math(c, tokenizer), MATH))
    assert done == [c.name for c in MATH]
    assert os.getpid() > 0


def run_bfcl(case: Case, tokenizer) -> str:
    from environments.bfcl.env import BFCLEnv

    fmt = "tool_call" if case.env == "bfcl_tool_call" else "python"
    env = BFCLEnv(action_format=fmt)
    env.reset(options={"task_id": "multi_turn_base_0"})
    obs, reward, terminated, truncated, info = env.step(case.action)
    text = check_observation(tokenizer, case, obs)
    assert len(text) <= env.max_observation_chars + 200 * max(len(obs), 1), case.name
    env.snapshot()  # the state stays snapshottable
    if not terminated:
        follow = "[pwd()]" if fmt == "python" else '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>'
        obs, *_ = env.step(follow)
        assert "current_working_directory" in obs[0].content, (case.name, obs)
    return case.name


def test_bfcl_corpus(tokenizer):
    pytest.importorskip("bfcl_eval")
    if os.path.exists(CANARY):
        os.remove(CANARY)
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(lambda c: run_bfcl(c, tokenizer), BFCL))
    assert done == [c.name for c in BFCL]
    assert not os.path.exists(CANARY)  # nothing was executed
