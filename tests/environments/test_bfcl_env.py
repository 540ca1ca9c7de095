"""BFCLEnv behaviour: turns, grading, miss_func reveals, step limit, formats, snapshots."""

from __future__ import annotations

import pickle

import gymnasium
import pytest

pytest.importorskip("bfcl_eval")

import trace_gym  # noqa: E402,F401  (registers trace_gym/BFCL-v0)
from environments.bfcl import data  # noqa: E402
from environments.bfcl.checker import EMPTY_TURN, FORCE_TERMINATED, RESPONSE_MISMATCH, STATE_MISMATCH  # noqa: E402
from environments.bfcl.env import END_TURN, BFCLEnv  # noqa: E402
from trace_gym.env.checks import check_env  # noqa: E402
from trace_gym.types import Message  # noqa: E402


def play(env, actions):
    out = []
    for action in actions:
        out.append(env.step(action))
        if out[-1][2] or out[-1][3]:
            break
    return out


def fs_state(env):
    return pickle.dumps(env.unwrapped._instances["GorillaFileSystem"].root)


def cwd_files(env):
    return set(env.unwrapped._instances["GorillaFileSystem"]._current_dir.contents)


def test_make_and_first_observation():
    env = gymnasium.make("trace_gym/BFCL-v0", category="multi_turn_base")
    obs, info = env.reset(options={"task_id": "multi_turn_base_0"})
    assert [m.role for m in obs] == ["system", "user"]
    assert "[func_name1(params_name1=params_value1" in obs[0].content and '"name": "mkdir"' in obs[0].content
    assert obs[1].content.startswith("Move 'final_report.pdf'")
    assert info["task_id"] == "multi_turn_base_0" and info["num_turns"] == 4
    assert "tools" not in info  # the system message lists them; trace_gym.agent.loop would render info["tools"] again
    assert {t["function"]["name"] for t in info["tool_schemas"]} >= {"cd", "mkdir", "post_tweet"}
    assert all(t["function"]["parameters"]["type"] == "object" for t in info["tool_schemas"])


def test_reset_accepts_task_object_and_draws_without_one():
    env = BFCLEnv(category="multi_turn_miss_param", split="eval")
    task = data.load_task("multi_turn_miss_param_3")
    _, info = env.reset(options={"task": task})
    assert info["task_id"] == task.id
    _, info = env.reset(seed=3)
    assert data.split_of(info["task_id"]) == "eval" and info["category"] == "multi_turn_miss_param"


def test_tool_messages_and_turn_end():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    obs, reward, terminated, truncated, info = env.step("[cd(folder='document'), mkdir(dir_name='temp')]")
    assert [m.role for m in obs] == ["tool", "tool"]
    assert obs[0] == Message("tool", '{"current_working_directory": "document"}', name="cd(folder='document')")
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, _, _, _, info = env.step("Done, the directory exists now.")
    assert obs[0].role == "user" and obs[0].content.startswith("Perform a detailed search")
    assert info["turn_end"] and info["turn_check"]["check"] == STATE_MISMATCH  # mv was never called


def test_ground_truth_replay_scores_one_in_both_formats():
    for fmt in ("python", "tool_call"):
        env = BFCLEnv(category="multi_turn_miss_func", action_format=fmt)
        env.reset(options={"task_id": "multi_turn_miss_func_0"})
        steps = play(env, env.reference_actions("multi_turn_miss_func_0"))
        assert steps[-1][1] == 1.0 and steps[-1][2], (fmt, steps[-1][4].get("failure"))
        assert steps[-1][4]["valid"] and steps[-1][4]["reward_components"]["all_turns_passed"] == 1.0


def test_tool_call_format_system_prompt_and_parsing():
    env = BFCLEnv(action_format="tool_call")
    obs, _ = env.reset(options={"task_id": "multi_turn_base_1"})
    assert obs[0].content.startswith("# Tools") and "<tool_call>" in obs[0].content
    obs, *_ = env.step('<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>')
    assert obs[0].role == "tool" and obs[0].name == "ls(a=True)" and "current_directory_content" in obs[0].content
    obs, *_, info = env.step("[ls(a=True)]")  # python syntax is plain text in this format: turn ends
    assert info["turn_end"] and obs[0].role == "user"


def test_template_tool_prompt():
    env = BFCLEnv(action_format="tool_call", tool_prompt="template")
    obs, info = env.reset(options={"task_id": "multi_turn_base_0"})
    assert [m.role for m in obs] == ["user"] and {t["function"]["name"] for t in info["tools"]} >= {"cd", "ls"}
    check_env(gymnasium.make("trace_gym/BFCL-v0", action_format="tool_call", tool_prompt="template"), _subset("multi_turn_base")[:3])
    with pytest.raises(ValueError, match="tool_call"):
        BFCLEnv(tool_prompt="template")
    with pytest.raises(ValueError, match="tool_prompt"):
        BFCLEnv(action_format="tool_call", tool_prompt="user")


def test_miss_func_reveals_docs_on_holdout_turn():
    entry = data.get_entry("multi_turn_miss_func_0")
    (turn, names), = entry["missed_function"].items()
    env = BFCLEnv(category="multi_turn_miss_func")
    obs, info = env.reset(options={"task_id": entry["id"]})
    assert all(f'"name": "{n}"' not in obs[0].content for n in names)
    assert all(t["function"]["name"] not in names for t in info["tool_schemas"])
    actions = iter(env.reference_actions(entry["id"]))
    ended = 0
    while ended < int(turn):  # play the turns before the holdout turn
        obs, _, _, _, info = env.step(next(actions))
        ended += bool(info.get("turn_end"))
    assert "I have updated some more functions you can choose from" in obs[0].content
    assert all(f"'name': '{n}'" in obs[0].content for n in names)
    assert info["revealed_functions"] == names
    assert {t["function"]["name"] for t in info["tool_schemas"]} >= set(names)


def test_miss_param_turn_without_calls_passes_but_calls_still_change_state():
    entry = data.get_entry("multi_turn_miss_param_0")
    empty = [i for i, t in enumerate(entry["ground_truth"]) if not t]
    assert empty
    env = BFCLEnv(category="multi_turn_miss_param")
    env.reset(options={"task_id": entry["id"]})
    steps = play(env, env.reference_actions(entry["id"]))
    checks = steps[-1][4]["turn_checks"]
    assert all(checks[i]["passed"] and checks[i]["check"] is None for i in empty)
    assert steps[-1][1] == 1.0


def test_turn_without_calls_fails_with_empty_turn():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    steps = play(env, [END_TURN] * 10)
    assert len(steps) == 4 and steps[-1][1] == 0.0 and steps[-1][2]
    assert steps[-1][4]["failure"]["check"] == EMPTY_TURN and steps[-1][4]["failure"]["turn"] == 0
    assert steps[-1][0] == []


def test_missing_result_fails_response_check():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    acts = env.reference_actions("multi_turn_base_0")
    acts[2] = "[cd(folder='temp')]"  # state right, but grep's result never produced
    steps = play(env, acts)
    assert steps[-1][1] == 0.0
    assert steps[-1][4]["failure"]["check"] == RESPONSE_MISMATCH and steps[-1][4]["failure"]["turn"] == 1


def test_force_terminated_past_step_limit():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_1"})
    steps = play(env, ["[ls()]"] * 25)
    assert len(steps) == 21
    assert all(not s[2] for s in steps[:20])
    obs, reward, terminated, truncated, info = steps[-1]
    assert (obs, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["force_terminated"] and info["failure"]["check"] == FORCE_TERMINATED
    assert env.step("[ls()]")[4]["error"] == "episode_over"


def test_hand_made_task_dict_and_bad_tasks():
    entry = data.get_entry("multi_turn_base_3")
    task = data.entry_to_task(entry).to_dict()
    task["id"] = "my_variant"
    env = BFCLEnv()
    _, info = env.reset(options={"task": task})
    assert info["task_id"] == "my_variant" and info["category"] == "multi_turn_base"
    assert play(env, env.reference_actions(data.load_task("multi_turn_base_3")))[-1][1] == 1.0
    bad = dict(task, metadata={k: v for k, v in task["metadata"].items() if k != "initial_config"})
    with pytest.raises(ValueError, match="initial_config"):
        env.reset(options={"task": bad})
    with pytest.raises(ValueError, match="answer"):
        env.reset(options={"task": dict(task, answer=[["ls()"]])})


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        BFCLEnv().step("[ls()]")


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="category"):
        BFCLEnv(category="multi_turn_composite")
    with pytest.raises(ValueError, match="action_format"):
        BFCLEnv(action_format="xml")
    with pytest.raises(ValueError, match="split"):
        BFCLEnv(split="dev")


def test_snapshot_branches_are_isolated_from_each_other_and_the_parent():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    acts = env.reference_actions("multi_turn_base_0")
    play(env, acts[:3])  # mid-entry: turn 0 done, turn 1 partly done
    parent = env.snapshot()
    blob = pickle.dumps(parent)
    parent_fs = fs_state(env)

    assert "final_report.pdf" in cwd_files(env)  # cwd is document/temp

    env.restore(parent)  # branch A: the ground truth
    a = play(env, acts[3:])
    a_fs = fs_state(env)

    env.restore(parent)  # branch B: destroy the report, then give up
    b = play(env, ["[rm(file_name='final_report.pdf')]", "ok"] + [END_TURN] * 6)
    b_fs = fs_state(env)

    env.restore(parent)  # the parent is untouched by both branches
    assert fs_state(env) == parent_fs and pickle.dumps(parent) == blob
    assert "final_report.pdf" in cwd_files(env)
    assert a[-1][1] == 1.0 and b[-1][1] == 0.0 and a_fs != b_fs
    assert b[0][0][0].content.startswith('{"result": "\'final_report.pdf\' removed')

    other = BFCLEnv()  # a fresh instance restored from the same snapshot replays branch A exactly
    other.reset(seed=1)
    other.restore(parent)
    assert [s[:4] for s in play(other, acts[3:])] == [s[:4] for s in a]
    env.restore(parent)
    assert [s[:4] for s in play(env, acts[3:])] == [s[:4] for s in a]


def test_restore_rejects_foreign_snapshot():
    from trace_gym.env.contract import Snapshot

    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    with pytest.raises(ValueError, match="cannot restore"):
        env.restore(Snapshot("GuessNumberEnv", "state", 0, b""))


def test_process_precision_is_restored_after_math_calls():
    import decimal

    import mpmath

    env = BFCLEnv()
    entry = next(e for e in data.load_entries("multi_turn_base") if "MathAPI" in e["involved_classes"])
    env.reset(options={"task_id": entry["id"]})
    dps, prec = mpmath.mp.dps, decimal.getcontext().prec
    obs, *_ = env.step("[logarithm(value=10, base=3, precision=7), square_root(number=2, precision=40)]")
    assert obs[0].content == "{'result': mpf('2.095903277')}" and "1.41421356237309504880168872420969807857" in obs[1].content
    assert (mpmath.mp.dps, decimal.getcontext().prec) == (dps, prec)


def _subset(category):
    return [t for t in data.load_tasks(category) if data.scenario_index(t.id) % 5 == 0]


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_check_env_subset(category):
    """check_env on every 5th entry (40 per category); all 800 run under -m slow."""
    env = gymnasium.make("trace_gym/BFCL-v0", category=category)
    report = check_env(env, _subset(category))
    assert report.passed["snapshot_pickle_process"] > 0 and not report.skipped


@pytest.mark.slow  # ~45 s per category; test_check_env_subset runs the same kit on every 5th entry
@pytest.mark.parametrize("category", data.CATEGORIES)
def test_check_env_all_entries(category):
    env = gymnasium.make("trace_gym/BFCL-v0", category=category)
    report = check_env(env, data.load_tasks(category))
    assert report.passed["message_schema"] == 200 and not report.skipped


def test_check_env_tool_call_format():
    env = gymnasium.make("trace_gym/BFCL-v0", category="multi_turn_miss_func", action_format="tool_call")
    check_env(env, _subset("multi_turn_miss_func")[:8])


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_ground_truth_replay_scores_one_on_every_entry(category):
    """Env-only (no bfcl-eval decoder needed); the official cross-check is in test_bfcl_agreement."""
    env = BFCLEnv(category=category)
    failed = []
    for task in env.tasks:
        env.reset(options={"task": task})
        steps = play(env, env.reference_actions(task))
        if steps[-1][1] != 1.0:
            failed.append((task.id, steps[-1][4].get("failure")))
    assert not failed, failed[:3]
