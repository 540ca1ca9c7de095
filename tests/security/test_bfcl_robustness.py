"""BFCL under hostile output (issue 11): no response raises, no response grows the state,
a snapshot or an observation without bound, every observation is UTF-8 and tokenizes."""

from __future__ import annotations

import json
import pickle

import pytest

pytest.importorskip("bfcl_eval")

from environments.bfcl.env import MAX_NAME_CHARS, BFCLEnv  # noqa: E402
from environments.bfcl.parsing import MAX_CALLS_PER_RESPONSE, MAX_FOLDED_CHARS, MAX_NESTING  # noqa: E402

TASK = "multi_turn_base_0"  # GorillaFileSystem (echo, cat, ...) among its classes


def readable(tokenizer, obs) -> str:
    text = "\n".join(m.content + (m.name or "") for m in obs)
    text.encode("utf-8")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                *({"role": m.role, "content": m.content} for m in obs)]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return text


def fresh(action_format: str = "python", **kwargs) -> BFCLEnv:
    env = BFCLEnv(action_format=action_format, **kwargs)
    env.reset(options={"task_id": TASK})
    return env


def tool_call(name, arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def nested_json(depth: int, kind: str = "dict") -> str:
    """JSON text nested ``depth`` levels (built as text: ``json.dumps`` itself recurses)."""
    opening, closing = ('{"x": ', "}") if kind == "dict" else ("[", "]")
    return opening * depth + '"a"' + closing * depth


def tool_call_text(name: str, arguments_json: str, as_string: bool) -> str:
    arguments = json.dumps(arguments_json) if as_string else arguments_json
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, arguments)


@pytest.mark.parametrize("terms", [1000, 2000])
def test_long_arithmetic_chain_is_a_readable_decode_error(tokenizer, terms):
    env = fresh()
    action = "[cd(folder=" + "+".join(["1"] * terms) + ")]"
    assert 1000 < len(action) < 5000
    obs, _, _, _, info = env.step(action)
    assert info["turn_end"] and "nested more than" in info["decode_error"]
    readable(tokenizer, obs)


@pytest.mark.parametrize("depth", [400, 980])
@pytest.mark.parametrize("kind", ["dict", "list"])
@pytest.mark.parametrize("as_string", [False, True])
def test_deeply_nested_tool_call_arguments_are_a_readable_decode_error(tokenizer, depth, kind, as_string):
    env = fresh("tool_call")
    action = tool_call_text("cd", '{"folder": ' + nested_json(depth, kind) + "}", as_string)
    assert len(action) < 12_000
    obs, _, _, _, info = env.step(action)
    # too deep for the env's bound, or (near the interpreter's own limit) for JSON itself
    assert info["turn_end"] and "exec" not in info
    assert "nested more than" in info.get("decode_error", "nested more than") or "not JSON" in info["decode_error"]
    readable(tokenizer, obs)


def test_nesting_within_the_limit_still_decodes():
    env = fresh("tool_call")
    obs, _, _, _, info = env.step(tool_call_text("cd", '{"folder": ' + nested_json(MAX_NESTING - 8) + "}", False))
    assert "decode_error" not in info and len(obs) == 1


@pytest.mark.parametrize("action", [
    "[echo(content=" + "+".join(["'a'*65536"] * 1024) + ", file_name='big.txt')]",  # the 12 KB action
    "[echo(content=" + "+".join(["('a'*65536+'a'*65536)"] * 8) + ", file_name='big.txt')]",
    "[echo(content='a'*(65536*1024), file_name='big.txt')]",
    "[" + ", ".join(f"echo(content='a'*65000, file_name='f{i}.txt')" for i in range(100)) + "]",
])
def test_folded_values_are_capped(tokenizer, action):
    env = fresh()
    before = pickle.dumps(env._instances)
    obs, _, _, _, info = env.step(action)
    assert len(action) < 15000
    assert info.get("decode_error"), info
    assert pickle.dumps(env._instances) == before  # nothing ran
    assert len(pickle.dumps(env.snapshot())) < 100_000 and len(readable(tokenizer, obs)) < 100_000


def test_a_folded_value_within_the_limit_runs():
    env = fresh()
    obs, _, _, _, info = env.step(f"[echo(content='ab'*{MAX_FOLDED_CHARS // 2}, file_name='ok.txt')]")
    assert "decode_error" not in info and not obs[0].content.startswith("Error")


def test_state_growth_is_capped_and_the_step_undone(tokenizer):
    env = fresh(max_state_bytes=1 << 20)
    step = ", ".join(f"touch(file_name='f{{n}}_{i}.txt'), echo(content='a'*60000, file_name='f{{n}}_{i}.txt')"
                     for i in range(4))
    undone = None
    for n in range(12):  # 12 x 240 KB would be 2.9 MB
        before = pickle.dumps(env._instances)
        obs, _, _, _, info = env.step("[" + step.format(n=n) + "]")
        readable(tokenizer, obs)
        if "state_too_large" in info:
            undone = n
            assert pickle.dumps(env._instances) == before
            assert all("undone" in m.content for m in obs)
            break
    assert undone is not None and undone >= 2
    assert len(pickle.dumps(env.snapshot())) < (1 << 20) + 100_000
    obs, *_ = env.step("[ls()]")  # the episode goes on
    assert "f0_0.txt" in obs[0].content


def test_observation_size_is_capped(tokenizer):
    env = fresh(max_observation_chars=100_000)
    env.step("[touch(file_name='big.txt'), echo(content='b'*60000, file_name='big.txt')]")
    obs, _, _, _, info = env.step("[" + ", ".join(["cat(file_name='big.txt')"] * 100) + "]")
    assert len(obs) == 100 and sum(len(m.content) for m in obs) <= 100_000 + 100 * 80
    assert "characters omitted" in obs[0].content and obs[0].content.startswith('{"file_content": "bbb')
    readable(tokenizer, obs)


def test_long_call_text_is_cut_in_the_tool_name(tokenizer):
    env = fresh()
    obs, *_ = env.step("[echo(content='c'*60000, file_name='c.txt')]")
    assert len(obs[0].name) <= MAX_NAME_CHARS and obs[0].name.startswith("echo(content='ccc")
    readable(tokenizer, obs)


def test_too_many_calls_is_a_readable_decode_error(tokenizer):
    env = fresh()
    obs, _, _, _, info = env.step("[" + ", ".join(["pwd()"] * (MAX_CALLS_PER_RESPONSE + 1)) + "]")
    assert info["turn_end"] and "calls, over the limit" in info["decode_error"]
    readable(tokenizer, obs)


@pytest.mark.parametrize("action_format,action", [
    ("python", "[echo(content='x\\ud800y', file_name='s.txt'), cat(file_name='s.txt')]"),
    ("python", "[mkdir(dir_name='\\udcff'), cd(folder='\\udcff'), ls()]"),
    ("python", "[cd(folder='\\ud83d')]"),
    ("tool_call", tool_call("echo", {"content": "\ud800", "file_name": "t.txt"})
     + "\n" + tool_call("cat", {"file_name": "t.txt"})),
    ("tool_call", tool_call("cd", {"folder": "\udfff"})),
])
def test_lone_surrogates_in_arguments_give_valid_utf8(tokenizer, action_format, action):
    env = fresh(action_format)
    obs, *_ = env.step(action)
    text = readable(tokenizer, obs)
    assert "\\ud" in text or "\\udcff" in text or "\\udfff" in text
    pickle.dumps(env.snapshot())  # the state itself may hold the surrogate; snapshots still work
