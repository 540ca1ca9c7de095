"""The BFCL family's single-call tier (issue 45): one user turn whose ground truth is one
call, the function's schema in the prompt, graded by the env's real turn checks."""

from __future__ import annotations

import pytest

pytest.importorskip("bfcl_eval")

from environments.bfcl import data  # noqa: E402
from environments.bfcl.checker import EMPTY_TURN, RESPONSE_MISMATCH, STATE_MISMATCH  # noqa: E402
from environments.bfcl.env import END_TURN, FEW_SHOT_DEMO, BFCLEnv  # noqa: E402


def graded(task_id: str, actions: list[str]) -> tuple[float, dict]:
    """The reward and the last info of ``actions`` played on the single-call task ``task_id``."""
    env = BFCLEnv()
    env.reset(options={"task_id": task_id})
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return reward, info
    raise AssertionError(f"{task_id}: {actions} did not end the episode")


# Hand-checked: each gold call against the entry's first turn, and a wrong one beside it.
@pytest.mark.parametrize("task_id, gold, wrong, check", [
    # result: the working directory is private state, so a cd into a folder that does not
    # exist fails on its result (an error instead of the new directory), not on the state
    ("multi_turn_base_9/single_call/f1", "[cd(folder='Documentation')]", "[cd(folder='Docs')]", RESPONSE_MISMATCH),
    # state: the file must exist afterwards, under the asked name
    ("multi_turn_base_15/single_call/f1", "[touch(file_name='DataSet1.csv')]", "[touch(file_name='DataSet.csv')]",
     STATE_MISMATCH),
    # result: the working directory's name is not its listing (ls() would pass here: the
    # folder holds no hidden file, so its listing equals ls(a=True)'s)
    ("multi_turn_base_1/single_call/f1", "[ls(a=True)]", "[pwd()]", RESPONSE_MISMATCH),
    # result: another symbol's quote is not the asked one
    ("multi_turn_base_100/single_call/f1", "[get_stock_info(symbol='NVDA')]", "[get_stock_info(symbol='AAPL')]",
     RESPONSE_MISMATCH),
    # result: the conversion of another amount
    ("multi_turn_base_53/single_call/f1", "[gallon_to_liter(gallon=30.0)]", "[gallon_to_liter(gallon=3.0)]",
     RESPONSE_MISMATCH),
])
def test_gold_call_scores_one_and_a_wrong_call_zero(task_id, gold, wrong, check):
    reward, info = graded(task_id, [gold, END_TURN])
    assert reward == 1.0 and info["turn_check"]["passed"]
    reward, info = graded(task_id, [wrong, END_TURN])
    assert reward == 0.0 and info["failure"]["check"] == check
    reward, info = graded(task_id, ["I cannot do that."])  # no call at all ends the turn unanswered
    assert reward == 0.0 and info["failure"]["check"] == EMPTY_TURN


def test_every_single_call_task_replays_its_ground_truth_to_one():
    env = BFCLEnv()
    tasks = data.single_call_tasks("multi_turn_base", "all")
    assert len(tasks) == 98 and len(data.single_call_tasks("multi_turn_base", "train")) == 79
    for task in tasks:
        env.reset(options={"task": task})
        actions = env.reference_actions(task)
        assert len(actions) == 2  # the call, then the reply that ends the turn
        for action in actions:
            _, reward, terminated, _, _ = env.step(action)
        assert terminated and reward == 1.0, task.id


def test_only_first_turns_of_one_call_become_tasks():
    entry = data.load_task("multi_turn_base_0")  # its first turn needs two calls
    assert len(entry.answer[0]) > 1 and data.single_call_task(entry) is None
    task = data.single_call_task(data.load_task("multi_turn_base_9"))
    assert task.id == "multi_turn_base_9/single_call/f1" and task.answer == [["cd(folder='Documentation')"]]
    assert len(task.metadata["question"]) == 1 and task.metadata["split"] == "train"
    assert data.load_task(task.id) == task


def test_functions_knob_sets_the_schemas_in_the_prompt():
    env = BFCLEnv()
    obs, info = env.reset(options={"task_id": "multi_turn_base_9/single_call/f1"})
    assert [t["function"]["name"] for t in info["tool_schemas"]] == ["cd"]
    assert '"name": "cd"' in obs[0].content and '"name": "mkdir"' not in obs[0].content
    everything = [d["name"] for d in data.function_docs(data.get_entry("multi_turn_base_9"))[0]]
    four = data.load_task("multi_turn_base_9/single_call/f4").metadata["functions"]
    assert len(four) == 4 and "cd" in four and four == [n for n in everything if n in four]  # doc order
    assert data.load_task("multi_turn_base_9/single_call/f4").metadata["functions"] == four  # a fixed draw
    assert data.load_task("multi_turn_base_9/single_call/f0").metadata["functions"] == everything


def test_sample_tasks_draws_the_tier():
    tasks = data.sample_tasks(5, seed=1, tier="single_call", functions=2)
    assert len({t.id for t in tasks}) == 5 and all(t.id.endswith("/single_call/f2") for t in tasks)
    assert tasks == data.sample_tasks(5, seed=1, tier="single_call", functions=2)
    assert all(t.metadata["split"] == "train" for t in tasks)


@pytest.mark.parametrize("call, message", [
    (lambda: data.sample_tasks(2, tier="single_turn"), "tier must be one of"),
    (lambda: data.sample_tasks(80, tier="single_call"), r"n must be in \[0, 79\]"),
    (lambda: data.single_call_task(data.load_task("multi_turn_base_9"), -1), "functions must be >= 0"),
])
def test_bad_tier_arguments_name_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("task_id", ["multi_turn_base_0/single_call/f1",  # first turn: two calls
                                     "multi_turn_base_9/turn0", "multi_turn_base_9/single_call/fx"])
def test_unknown_single_call_ids_are_refused(task_id):
    with pytest.raises(KeyError, match="unknown BFCL task id"):
        data.load_task(task_id)


def test_few_shot_demonstrates_a_call_and_a_reply():
    env = BFCLEnv(few_shot=True)
    obs, _ = env.reset(options={"task_id": "multi_turn_base_9/single_call/f1"})
    assert [m.role for m in obs] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert tuple(obs[1:5]) == FEW_SHOT_DEMO and obs[5].content.startswith("I remember")
    with pytest.raises(ValueError, match="few_shot=True demonstrates the python format"):
        BFCLEnv(few_shot=True, action_format="tool_call")


def test_the_env_names_its_difficulty_knobs():
    from trace_gym.env.contract import env_difficulty_knobs
    from trace_gym.registry import resolve_env

    knobs = env_difficulty_knobs(resolve_env("bfcl").make_env)
    assert {"tier", "functions", "few_shot"} <= set(knobs)


@pytest.mark.parametrize("few_shot", [False, True])
def test_check_env_on_single_call_tasks(few_shot):
    import gymnasium

    import trace_gym  # noqa: F401  (registers trace_gym/BFCL-v0)
    from trace_gym.env.checks import check_env

    env = gymnasium.make("trace_gym/BFCL-v0", few_shot=few_shot)
    report = check_env(env, data.single_call_tasks("multi_turn_base", "all", functions=3)[::10])
    assert report.passed["snapshot_pickle_process"] > 0 and not report.skipped


def test_call_examples_demonstrate_every_shown_function_from_its_schema():
    env = BFCLEnv(call_examples=True)
    obs, _ = env.reset(options={"task_id": "multi_turn_base_9/single_call/f4"})
    shown = data.load_task("multi_turn_base_9/single_call/f4").metadata["functions"]
    demo = obs[1:-1]
    assert [m.role for m in demo] == ["user", "assistant"] * len(shown)
    assert [m.content for m in demo[1::2]] == ["[cd(folder='example')]", "[diff(file_name1='example', "
                                               "file_name2='example')]", "[mkdir(dir_name='example')]",
                                               "[rmdir(dir_name='example')]"]
    assert demo[0].content == "Example: call cd with folder='example'." and obs[-1].content.startswith("I remember")
    # the values are the types' examples, never the task's: the demonstrated call fails the turn
    obs, _ = env.reset(options={"task_id": "multi_turn_base_53/single_call/f1"})
    assert obs[2].content == "[gallon_to_liter(gallon=1.0)]"
    env.step(obs[2].content)
    assert env.step(END_TURN)[1] == 0.0
    assert data.example_call({"name": "get_watchlist", "parameters": {"type": "dict", "properties": {}}}) == \
        ("get_watchlist", {})
    with pytest.raises(ValueError, match="call_examples=True demonstrates the python format"):
        BFCLEnv(call_examples=True, action_format="tool_call")
