"""Hostile model output: readable errors, no execution, no state change, bounded time."""

from __future__ import annotations

import os
import pickle
import time

import pytest

pytest.importorskip("bfcl_eval")

from environments.bfcl.env import BFCLEnv  # noqa: E402
from environments.bfcl.parsing import decode  # noqa: E402

CANARY = "trace_gym_bfcl_canary"


def _touch(path: str) -> str:
    return f"__import__('os').system('touch {path}')"


def hostile_python(canary: str) -> dict[str, str]:
    t = _touch(canary)
    return {
        "import_system": f"[{t}]",
        "import_in_argument": f"[ls(a={t})]",
        "import_in_arithmetic": f"[cd(folder='a' + str({t}))]",
        "import_in_fstring": f"[cd(folder=f'{{{t}}}')]",
        "import_in_dict_value": f"[edit_ticket(ticket_id=1, updates={{'a': {t}}})]",
        "nested_call_with_keywords": f"[cd(folder=system(command='touch {canary}'))]",
        "open_builtin": f"[open(file='{canary}', mode='w')]",
        "exec_builtin": f"[exec(source=\"open('{canary}', 'w')\")]",
        "eval_builtin": f"[eval(source=\"{t}\")]",
        "lambda_call": f"[ls(a=(lambda: {t})())]",
        "lambda_value": f"[ls(a=lambda: {t})]",
        "list_comprehension": f"[ls(a=[{t} for _ in range(1)])]",
        "generator": f"[ls(a=({t} for _ in range(1)))]",
        "walrus": f"[ls(a=(x := {t}))]",
        "subclasses_chain": "[().__class__.__bases__[0].__subclasses__()]",
        "dunder_globals": "[ls.__globals__['os'].system(command='true')]",
        "attribute_chain": "[GorillaFileSystem.rm(file_name='final_report.pdf')]",
        "self_attribute": "[self.rm(file_name='final_report.pdf')]",
        "getattr_builtin": "[getattr(o=ls, name='__globals__')]",
        "private_method": "[_load_scenario(scenario={}, long_context=False)]",
        "dunder_method": "[__init__()]",
        "kwargs_unpack": "[rm(**{'file_name': 'final_report.pdf'})]",
        "blocked_name": "[kill(pid=1)]",
        "not_involved_class": "[place_order(order_type='Buy', symbol='AAPL', price=1.0, amount=1)]",
        "unknown_function": "[format_disk(drive='C')]",
        "huge_string_10mb": "[echo(content='" + "A" * (10 * 1024 * 1024) + "', file_name='x.txt')]",
        "huge_repeat": "[echo(content='A' * 10**9, file_name='x.txt')]",
        "huge_power": "[cd(folder=10 ** 10 ** 10)]",
        "format_bomb": "[cd(folder='%999999999d' % 1)]",
        "deep_brackets": "[ls(a=" + "[" * 5000 + "]" * 5000 + ")]",
        "deep_unary": "[ls(a=" + "-" * 5000 + "1)]",
        "unbalanced": "[" * 100000,
        "null_bytes": "[ls(a=True)]\x00",
        "decorator_like": "[@ls]",
        "semicolon_statement": "ls(); import os",
    }


def hostile_tool_calls(canary: str) -> dict[str, str]:
    def block(body: str) -> str:
        return f"<tool_call>\n{body}\n</tool_call>"

    return {
        "import_name": block('{"name": "__import__", "arguments": {"name": "os"}}'),
        "dotted_name": block('{"name": "os.system", "arguments": {"command": "touch %s"}}' % canary),
        "code_in_key": block('{"name": "ls", "arguments": {"a=__import__(\'os\').system(\'touch %s\'),b": 1}}' % canary),
        "code_in_name": block('{"name": "ls(); __import__(\'os\').system(\'touch %s\')#", "arguments": {}}' % canary),
        "string_item": block('"__import__(\'os\').system(\'touch %s\')"' % canary),
        "deep_json": block("[" * 100000 + "]" * 100000),
        "infinite_float": block('{"name": "cd", "arguments": {"folder": Infinity}}'),
        "private_method": block('{"name": "_load_scenario", "arguments": {"scenario": {}}}'),
        "huge": block('{"name": "cd", "arguments": {"folder": "%s"}}' % ("x" * (10 * 1024 * 1024))),
    }


def _state(env) -> bytes:
    return pickle.dumps(env.unwrapped._instances)


def _assert_refused(env, action, canary, name):
    before = _state(env)
    start = time.perf_counter()
    obs, reward, terminated, truncated, info = env.step(action)
    elapsed = time.perf_counter() - start
    assert not os.path.exists(canary), f"{name}: executed code"
    assert _state(env) == before, f"{name}: backend state changed"
    assert elapsed < 5.0, f"{name}: took {elapsed:.1f} s"
    tool_errors = [m.content for m in obs if m.role == "tool"]
    if tool_errors:
        assert all(e.startswith("Error") for e in tool_errors), (name, tool_errors)
        assert all(x["refused"] or x["result"].startswith("Error during execution") for x in info["exec"]), name
    else:  # no decodable call: the turn ends, and info says why
        assert info.get("turn_end"), name
        assert info.get("decode_error"), name
    return obs, info


@pytest.mark.parametrize("name", sorted(hostile_python("x")))
def test_hostile_python_actions(name, tmp_path):
    canary = str(tmp_path / CANARY)
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    _assert_refused(env, hostile_python(canary)[name], canary, name)


@pytest.mark.parametrize("name", sorted(hostile_tool_calls("x")))
def test_hostile_tool_call_actions(name, tmp_path):
    canary = str(tmp_path / CANARY)
    env = BFCLEnv(action_format="tool_call")
    env.reset(options={"task_id": "multi_turn_base_0"})
    _assert_refused(env, hostile_tool_calls(canary)[name], canary, name)


def test_error_messages_are_readable():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    obs, *_ = env.step("[GorillaFileSystem.rm(file_name='a'), place_order(symbol='A'), kill(pid=1), cd(folder=ls(a=True))]")
    texts = [m.content for m in obs]
    assert "only plain function names can be called" in texts[0]
    assert texts[1] == "Error during execution: name 'place_order' is not defined"
    assert texts[2] == "Error during execution: Function call kill is not allowed."
    assert "is not a literal value" in texts[3]
    _, _, _, _, info = env.step("[ls(a=lambda: 1)]")
    assert info["turn_end"] and "Lambda" in info["decode_error"]
    _, _, _, _, info = env.step("x" * 70000)
    assert "over the 65536 limit" in info["decode_error"]


def test_math_resource_guards():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_15"})
    assert "MathAPI" in env.unwrapped._table.values()
    start = time.perf_counter()
    obs, *_ = env.step("[power(base=10, exponent=100000000), square_root(number=2, precision=1000000000), logarithm(value=10, base=2, precision=100000000)]")
    assert time.perf_counter() - start < 2.0
    assert all("above the env's limit" in m.content for m in obs)


def test_valid_calls_alongside_refused_ones_still_run():
    env = BFCLEnv()
    env.reset(options={"task_id": "multi_turn_base_0"})
    obs, *_ = env.step("[os.system(command='x'), cd(folder='document')]")
    assert obs[0].content.startswith("Error") and obs[1].content == '{"current_working_directory": "document"}'


def test_decode_never_raises_on_odd_types():
    for action in (None, 12, b"[ls()]", ["[ls()]"]):
        decoded = decode(action)
        assert not decoded.has_calls and decoded.error
