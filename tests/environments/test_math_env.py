"""MathPythonEnv: the contract (check_env), observation format, episode end, restarts."""

from __future__ import annotations

import gymnasium
import pytest
from math_actions import code

import trace_gym  # noqa: F401  (registers the ids)
from environments.math_python.env import MathPythonEnv, extract_code_blocks, kernel_seed
from environments.math_python.generated import generate_tasks
from environments.math_python.sandbox import KernelLimits
from trace_gym.env.checks import check_env
from trace_gym.types import Message, Task

TASK = Task(id="t1", prompt="What is 6 times 7?", answer="42")


@pytest.fixture(scope="module")
def env():
    e = MathPythonEnv([TASK], max_turns=3, limits=KernelLimits(cell_timeout_s=2.0))
    yield e
    e.close()


def test_registered_env_passes_check_env():
    env = gymnasium.make("trace_gym/MathPython-v0")
    report = check_env(env, env.unwrapped.tasks[:1])
    assert report.passed["snapshot_pickle_process"] >= 4 and not report.skipped
    assert report.passed["branch_isolation"] >= 4


def test_reset_gives_system_and_user_messages(env):
    obs, info = env.reset(seed=3, options={"task": TASK})
    assert [m.role for m in obs] == ["system", "user"]
    assert obs[1].content == TASK.prompt and "\\boxed{}" in obs[0].content
    assert info["task_id"] == "t1"


def test_task_can_be_a_dict_an_id_or_drawn_from_the_pool(env):
    obs, info = env.reset(options={"task": {"id": "d", "question": "Q?", "answer": "1"}})
    assert obs[1].content == "Q?" and info["task_id"] == "d"
    _, info = env.reset(options={"task": "t1"})
    assert info["task_id"] == "t1"
    _, info = env.reset(seed=0)
    assert info["task_id"] == "t1"
    with pytest.raises(KeyError):
        env.reset(options={"task": "missing"})


def test_cells_run_in_order_and_state_persists(env):
    env.reset(seed=0, options={"task": TASK})
    obs, reward, terminated, truncated, info = env.step(
        "Let me set up.\n" + code("a = 6") + "\nthen\n" + code("b = a * 7\nprint(b)"))
    assert obs == [Message("user", "```output\n(no output)\n```\n\n```output\n42\n```")]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["exec"]["status"] == "ok" and len(info["exec"]["cells"]) == 2
    assert {"status", "timed_out", "oom", "elapsed"} <= set(info["exec"])
    obs, *_ = env.step(code("print(a + b)"))
    assert obs[0].content == "```output\n48\n```"
    obs, reward, terminated, truncated, info = env.step("So the answer is \\boxed{42}.")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["grading"]["correct"] and obs[0].content == "Final answer received."
    obs, reward, terminated, _, info = env.step(code("print(1)"))
    assert terminated and reward == 0.0 and info["error"] == "episode_over"


def test_errors_are_observations(env):
    env.reset(seed=0, options={"task": TASK})
    obs, _, _, _, info = env.step(code("print('before')\nundefined_name"))
    text = obs[0].content
    assert text.startswith("```output\nbefore\nTraceback") and "NameError" in text
    assert info["exec"]["status"] == "error"


def test_max_turns_truncates(env):
    env.reset(seed=0, options={"task": TASK})
    results = [env.step(code(f"print({i})")) for i in range(3)]
    assert [r[3] for r in results] == [False, False, True] and all(r[1] == 0.0 for r in results)
    assert env.step("\\boxed{42}")[4]["error"] == "episode_over"


def test_timeout_restarts_the_kernel_and_the_next_cell_runs_there(env):
    env.reset(seed=0, options={"task": TASK})
    env.step(code("kept = 1"))
    obs, _, _, _, info = env.step(code("while True:\n    pass") + "\n" + code("print('next')\nprint(kept)"))
    first, second = obs[0].content.split("\n\n")
    assert "TimeoutError" in first and "ran longer than 2 s" in first and "restarted" in first
    assert second.startswith("```output\nnext\n") and "NameError" in second  # a new session, as announced
    assert info["exec"]["kernel_restarted"] and info["exec"]["cells"][1]["status"] == "error"
    assert info["exec"]["status"] == "timeout" and info["exec"]["timed_out"]
    obs, *_ = env.step(code("print(kept)"))
    assert "NameError" in obs[0].content


def test_observation_templates_are_configurable():
    env = MathPythonEnv([TASK], observation_role="tool", output_template="<out>{output}</out>",
                        empty_output="", system_prompt="SYS", prompt_template="Q: {question}", prestart_kernel=False)
    try:
        obs, _ = env.reset(seed=0)
        assert obs == [Message("system", "SYS"), Message("user", "Q: What is 6 times 7?")]
        obs, *_ = env.step(code("x = 1") + code("print('hi')"))
        assert obs == [Message("tool", "<out></out>\n\n<out>hi</out>")]
    finally:
        env.close()
    with pytest.raises(ValueError, match="output_template"):
        MathPythonEnv([TASK], output_template="no field")
    with pytest.raises(ValueError, match="observation_role"):
        MathPythonEnv([TASK], observation_role="assistant")


def test_extract_code_blocks():
    text = "a\n```python\nx = 1\n```\nb\n```py\ny = 2\n```\n```\nnot python\n```\n```python3 \nz = 3\n```\n```python\nopen"
    assert extract_code_blocks(text) == ["x = 1\n", "y = 2\n", "z = 3\n"]
    assert extract_code_blocks("no code") == []


def test_kernel_seed_depends_on_episode_and_generation():
    assert kernel_seed(1, 0) == kernel_seed(1, 0)
    assert len({kernel_seed(1, 0), kernel_seed(1, 1), kernel_seed(2, 0)}) == 3


def test_default_pool_is_generated_easy_tasks():
    env = gymnasium.make("trace_gym/MathPython-v0").unwrapped
    try:
        assert len(env.tasks) == 64 and {t.metadata["difficulty"] for t in env.tasks} == {0, 1, 2}
        assert env.tasks == generate_tasks(64, difficulty=(0, 1, 2), seed=0)
    finally:
        env.close()
