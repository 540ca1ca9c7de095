"""Hostile input, round 3 (issue 22), for BFCL, WikiQA and the math task loaders.

Three classes of failure, each with cases of its own besides the issue's payloads:

1. parsers that catch too little: integers Python cannot write as text, JSON nested
   past the interpreter's stack, all measured *before* parsing;
2. text UTF-8 cannot encode (lone surrogates) in queries, answers, passages and task
   fields;
3. state that grows without bound: BFCL backends nested deeper than ``pickle`` can go.

Each case ends in a readable observation (UTF-8, no exception), a bounded state and an
env that keeps working. The retrieval server's cases are in ``test_retrieval_server.py``.
"""

from __future__ import annotations

import json
import pickle
import time

import pytest

from retrieval_index.protocol import QueryRejected
from trace_gym.utils.textsafe import (
    UNCLOSED,
    JSONRefused,
    clean_text,
    drop_unencodable,
    first_unencodable,
    json_problem,
    loads_bounded,
)


def utf8(obs) -> str:
    text = "\n".join(m.content + (m.name or "") for m in obs)
    text.encode("utf-8")  # raises on a lone surrogate
    return text


# --- the bounded JSON loader (hand-made inputs, hand-counted depths) ------------------


@pytest.mark.parametrize("text,depth", [("1", 0), ("[]", 1), ('{"a": [1, {"b": []}]}', 4), ('["[[[[", "]"]', 1),
                                        ('[[], [[]], [[[]]]]', 4), ('{"a": "\\"[[["}', 1)])
def test_json_problem_counts_bracket_depth_outside_strings(text, depth):
    assert json_problem(text, max_depth=depth) is None
    if depth:
        assert json_problem(text, max_depth=depth - 1) == f"is nested more than {depth - 1} levels deep"
    assert loads_bounded(text, max_depth=depth) == json.loads(text)


def test_loads_bounded_refuses_before_parsing_and_names_why():
    started = time.perf_counter()
    cases = {
        "[" * 100_000 + "]" * 100_000: "nested more than 32",  # json.loads: RecursionError
        "[" * 100_000: "never close",  # json.loads recurses into every bracket before failing
        '{"n": ' + "9" * 5000 + "}": "more than 100 digits",  # json.loads: ValueError (int-to-str limit)
        '{"n": ' + "1" * 101 + "}": "more than 100 digits",  # parseable, still over the bound
        '["a", "b' + "\\" * 1001: "never close",  # an unterminated string full of escapes: linear
        b"\xff\xfe[]": "not UTF-8",
        "{queries: [": "not valid JSON",
    }
    for text, why in cases.items():
        with pytest.raises(JSONRefused, match=why):
            loads_bounded(text)
    assert time.perf_counter() - started < 2.0
    assert loads_bounded('{"q": "' + "9" * 5000 + '", "x": 1e999}') == {"q": "9" * 5000, "x": float("inf")}
    assert json_problem('[1, 2') == UNCLOSED and json_problem('}}[]') is None


def test_surrogate_helpers():
    assert first_unencodable("ab\ud800c") == 2 and first_unencodable("abc é 😀") is None
    assert clean_text("a\udfffb") == "a\\udfffb" and drop_unencodable("a\ud800b\udc00") == "ab"
    assert clean_text("plain") == "plain"


# --- BFCL -----------------------------------------------------------------------------

from environments.bfcl.env import MAX_STATE_DEPTH, BFCLEnv, state_depth  # noqa: E402
from environments.bfcl.parsing import MAX_INT_BITS, decode  # noqa: E402

try:
    import bfcl_eval  # noqa: F401  (the backends the env runs)
except ImportError:
    bfcl_eval = None
needs_bfcl = pytest.mark.skipif(bfcl_eval is None, reason="bfcl-eval is not installed")

TASK = "multi_turn_base_0"  # TwitterAPI + GorillaFileSystem


def fresh(action_format: str = "python", task: str = TASK, **kwargs) -> BFCLEnv:
    env = BFCLEnv(action_format=action_format, max_steps_per_turn=200, **kwargs)
    env.reset(options={"task_id": task})
    return env


def still_works(env: BFCLEnv, action_format: str = "python") -> None:
    pickle.loads(pickle.dumps(env.snapshot()))
    follow = "[pwd()]" if action_format == "python" else '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>'
    obs, *_ = env.step(follow)
    assert "current_working_directory" in obs[0].content, obs


def tool_call(arguments_json: str, name: str = "cd") -> str:
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, arguments_json)


BIG_INTS_PYTHON = {
    "hex_4000_digits": "[cd(folder=0x" + "f" * 4000 + ")]",  # the payload: repr() raised ValueError
    "binary_5000_digits": "[cd(folder=0b" + "1" * 5000 + ")]",
    "octal_2000_digits": "[cd(folder=0o" + "7" * 2000 + ")]",
    "decimal_4000_digits": "[cd(folder=" + "9" * 4000 + ")]",  # parseable (under 4,300), 13,000 bits
    "negated_hex": "[cd(folder=-0x" + "f" * 2000 + ")]",
    "inside_a_list": "[sort(file_name=['a', 0x" + "e" * 3000 + "])]",
    "as_a_dict_key": "[echo(content={0x" + "a" * 3000 + ": 1}, file_name='x')]",
    "in_a_subscript": "[cd(folder=x[0x" + "1" * 3000 + "])]",  # rendered by ast.unparse
    "in_a_nested_call": "[cd(folder=ls(a=0x" + "2" * 3000 + "))]",
    "in_an_attribute_call": "[os.system(command=0x" + "3" * 3000 + ")]",
    "just_over_the_bound": f"[cd(folder={2 ** MAX_INT_BITS})]",
}


@needs_bfcl
@pytest.mark.parametrize("name", sorted(BIG_INTS_PYTHON))
def test_python_integers_past_the_bound_are_a_readable_decode_error(name):
    env = fresh()
    before = pickle.dumps(env._instances)
    obs, _, _, _, info = env.step(BIG_INTS_PYTHON[name])
    assert info["turn_end"] and f"more than {MAX_INT_BITS} bits" in info["decode_error"], info
    assert pickle.dumps(env._instances) == before
    utf8(obs)
    still_works(env)


@needs_bfcl
def test_an_integer_within_the_bound_still_runs():
    env = fresh()
    obs, _, _, _, info = env.step(f"[cd(folder={2 ** MAX_INT_BITS - 1})]")
    assert "decode_error" not in info and obs[0].role == "tool"


BIG_JSON = {
    "number_5000_digits": (tool_call('{"folder": ' + "9" * 5000 + "}"), "more than 1234 digits"),  # the issue's
    "number_2000_digits": (tool_call('{"folder": ' + "8" * 2000 + "}"), "more than 1234 digits"),  # parseable
    "in_string_arguments": (tool_call(json.dumps('{"folder": ' + "7" * 5000 + "}")), "more than 1234 digits"),
    "just_over_the_bits": (tool_call('{"folder": %d}' % 2 ** MAX_INT_BITS), f"more than {MAX_INT_BITS} bits"),
    "deep_and_closed": (tool_call('{"folder": ' + "[" * 20_000 + "]" * 20_000 + "}"), "nested more than"),
    "deep_in_string_arguments": (tool_call(json.dumps("[" * 20_000 + "]" * 20_000)), "nested more than"),
}


@needs_bfcl
@pytest.mark.parametrize("name", sorted(BIG_JSON))
def test_tool_call_json_past_the_bounds_is_a_readable_decode_error(name):
    action, why = BIG_JSON[name]
    env = fresh("tool_call")
    obs, _, _, _, info = env.step(action)
    assert info["turn_end"] and why in info["decode_error"], info
    utf8(obs)
    still_works(env, "tool_call")


@needs_bfcl
def test_unclosed_tool_call_json_is_skipped_like_any_block_that_is_not_json():
    env = fresh("tool_call")
    unclosed = "<tool_call>\n" + "[" * 30_000 + "\n</tool_call>"  # json.loads would recurse into every bracket
    obs, *_ , info = env.step(unclosed + "\n" + tool_call('{"folder": "document"}'))
    assert "decode_error" not in info and obs[0].content == '{"current_working_directory": "document"}'


def test_decode_never_raises_on_text_that_breaks_the_python_parser():
    started = time.perf_counter()
    for text in ("[cd(folder=" + "(" * 300 + ")" * 300 + ")]", "[" + "lambda:" * 3000 + "1]", "[\x00\ud800]",
                 "[cd(folder='" + "\\N{" * 1000 + "')]", "[f(**{" * 500 + "]", "[cd(folder=1" + "e9" * 3000 + ")]",
                 "[cd(folder=" + "not " * 5000 + "1)]", "[cd(folder=" + "1 if 1 else " * 2000 + "1)]"):
        decoded = decode(text)
        assert not decoded.has_calls and decoded.error and first_unencodable(decoded.error) is None, text[:40]
    assert time.perf_counter() - started < 5.0


def test_state_depth_by_hand():
    assert state_depth([], 10) == 1
    assert state_depth({"a": [1, {"b": ()}]}, 10) == 4  # dict > list > dict > tuple
    loop: list = []
    loop.append(loop)
    assert state_depth(loop, 10) == 1  # a cycle is followed once, as pickle memoises it
    shared = [[[]]]
    assert state_depth([shared, shared], 10) == 4
    chain: list = []
    for _ in range(5000):
        chain = [chain]
    assert state_depth(chain, 100) == 101  # stops at the limit, never recurses


@needs_bfcl
def test_mkdir_cd_pairs_stop_at_the_depth_bound_and_the_env_stays_usable():
    env = fresh()
    pairs = "[" + ", ".join(["mkdir(dir_name='d'), cd(folder='d')"] * 60) + "]"  # the shape
    for _ in range(4):  # was: RecursionError at ~190 levels, then every snapshot() and step() raised
        before = pickle.dumps(env._instances)
        obs, _, _, _, info = env.step(pairs)
        assert info["state_too_deep"] > MAX_STATE_DEPTH and all("levels deep" in m.content for m in obs)
        assert pickle.dumps(env._instances) == before  # undone, every call of it
    undone = None
    for n in range(60):  # one level per response: the bound is reached, and holds
        obs, _, _, _, info = env.step("[mkdir(dir_name='d'), cd(folder='d')]")
        if "state_too_deep" in info:
            undone = n
            break
    assert undone is not None and undone >= 10  # a model can still nest folders a fair way
    assert state_depth(env._instances, 10 * MAX_STATE_DEPTH) <= MAX_STATE_DEPTH
    snap = env.snapshot()
    still_works(env)
    env.restore(snap)
    obs, *_ = env.step("[cd(folder='..'), ls()]")
    assert obs[1].content == '{"current_directory_content": ["d"]}'


@needs_bfcl
def test_nested_values_stored_by_other_backends_are_bounded_too():
    deep = "[" * 55 + "'x'" + "]" * 55  # within the decoding bound, deeper than the state may be
    env = fresh(task="multi_turn_base_4")  # TwitterAPI, authenticated: post_tweet stores its tags
    obs, _, _, _, info = env.step(f"[post_tweet(content='c', tags={deep})]")
    assert "state_too_deep" in info and "undone" in obs[0].content
    obs, _, _, _, info = env.step("[post_tweet(content='c', tags=" + "[" * 20 + "'x'" + "]" * 20 + ")]")
    assert "state_too_deep" not in info and '"content": "c"' in obs[0].content
    env = fresh(task="multi_turn_base_2")  # TicketAPI: edit_ticket stores its values
    env.step("[ticket_login(username='u', password='p'), create_ticket(title='t', description='d')]")
    obs, _, _, _, info = env.step(f"[edit_ticket(ticket_id=1, updates={{'description': {deep}}})]")
    assert "state_too_deep" in info
    obs, *_ = env.step("[get_ticket(ticket_id=1)]")
    assert '"description": "d"' in obs[0].content  # the nested value was undone
    still_works(env)


@needs_bfcl
def test_a_directory_copied_into_itself_is_a_cycle_the_env_survives():
    env = fresh()
    obs, *_ = env.step("[mkdir(dir_name='d'), cp(source='d', destination='d'), du(human_readable=True), "
                       "find(path='.', name='x'), mv(source='d', destination='d')]")
    assert obs[1].content == '{"result": "\'d\' copied to \'d/d\'"}'
    assert obs[2].content.startswith("Error during execution")  # du recurses for ever: a readable error
    utf8(obs)
    still_works(env)
    _, _, _, _, info = env.step("I am done.")  # the turn check compares the cyclic tree with the truth
    assert info["turn_check"]["check"] == "multi_turn:instance_state_mismatch"


# --- WikiQA ---------------------------------------------------------------------------

from environments.wiki_qa.actions import MAX_TOOL_CALL_DEPTH, QUERY_EMPTY, parse_action  # noqa: E402
from environments.wiki_qa.data import offline_tasks, row_to_task  # noqa: E402
from environments.wiki_qa.env import WikiQAEnv, format_passages  # noqa: E402

SCALE = 0.03  # the small synthetic world, its indexes built once into the cache
KW = {"searcher": "offline", "offline_scale": SCALE}


@pytest.fixture(scope="module")
def qa_task():
    return offline_tasks(1, seed=1, scale=SCALE)[0]


def search_call(arguments_json: str) -> str:
    return '<tool_call>{"name": "search", "arguments": %s}</tool_call>' % arguments_json


WIKI_BAD_JSON = {
    "deep_brackets": "<tool_call>" + "[" * 30_000 + "]" * 30_000 + "</tool_call>",  # was RecursionError
    "deep_objects": "<tool_call>" + '{"a": ' * 8000 + "1" + "}" * 8000 + "</tool_call>",
    "number_5000_digits": search_call('{"query": ' + "9" * 5000 + "}"),  # was ValueError
    "number_in_string_arguments": search_call(json.dumps('{"query": ' + "9" * 5000 + "}")),
    "deep_string_arguments": search_call(json.dumps("[" * 10_000 + "]" * 10_000)),
    "unclosed": "<tool_call>" + "{" * 30_000 + "</tool_call>",
    "just_too_deep": search_call("[" * MAX_TOOL_CALL_DEPTH + "]" * MAX_TOOL_CALL_DEPTH),
    "surrogate_name": '<tool_call>{"name": "se\\udc80rch", "arguments": {}}</tool_call>',
}


@pytest.mark.parametrize("name", sorted(WIKI_BAD_JSON))
def test_tool_calls_past_the_bounds_are_an_invalid_action_observation(name, qa_task):
    env = WikiQAEnv(protocol="tool_call", **KW)
    env.reset(seed=0, options={"task": qa_task})
    started = time.perf_counter()
    obs, reward, term, trunc, info = env.step(WIKI_BAD_JSON[name])
    assert time.perf_counter() - started < 2.0
    assert info["error"] == "bad_tool_call" and obs[0].content.startswith("Invalid tool call: ")
    assert (reward, term) == (0.0, False)
    utf8(obs)
    obs, *_ = env.step(search_call('{"query": "a public university"}'))  # the episode goes on
    assert obs[0].content.startswith("Doc 1(Title: ")


def test_parse_action_never_raises_on_tool_call_text():
    for block in ("", "null", "[]", '"x"', "1e999999", '{"name": 1}', '{"name": "search", "arguments": [1]}',
                  '{"name": "search", "arguments": "' + "\\u" * 10 + '"}', "\ud800", '{"name": "answer"}'):
        action = parse_action(f"<tool_call>{block}</tool_call>", "tool_call")
        assert action.kind == "invalid" and first_unencodable(action.text) is None, block


SURROGATE_TURNS = {
    "tags_raw": ("tags", "<search>Velmora\ud800 city</search>"),  # the payload, raw
    "tags_several": ("tags", "<search>\udfffa\ud83d public\udc00 university\ud800</search>"),
    "tool_call_json_escape": ("tool_call", search_call('{"query": "a public\\ud800 university"}')),
    "tool_call_string_arguments": ("tool_call", search_call(json.dumps('{"query": "a river\\udfff"}'))),
}


@pytest.mark.parametrize("name", sorted(SURROGATE_TURNS))
@pytest.mark.parametrize("searcher", ["offline", "offline:bm25"])
def test_a_lone_surrogate_in_a_query_is_removed_before_searching(name, searcher, qa_task):
    protocol, action = SURROGATE_TURNS[name]
    env = WikiQAEnv(protocol=protocol, searcher=searcher, offline_scale=SCALE)
    env.reset(seed=0, options={"task": qa_task})
    obs, _, _, _, info = env.step(action)  # was: TypeError (dense) / UnicodeEncodeError (BM25) out of step
    assert info["action"] == "search" and first_unencodable(info["query"]) is None
    assert len(info["doc_ids"]) == 3
    utf8(obs)


def test_a_query_of_surrogates_alone_is_empty_and_an_answer_loses_them(qa_task):
    env = WikiQAEnv(**KW)
    env.reset(seed=0, options={"task": qa_task})
    obs, _, _, _, info = env.step("<search>\ud800\udc00 \udfff</search>")
    assert obs[0].content == QUERY_EMPTY and info["error"] == "empty_query"
    obs, reward, term, _, info = env.step(f"<answer>{qa_task.answer[0]}\ud800</answer>")
    assert term and reward == 1.0 and info["prediction"] == qa_task.answer[0]


def test_the_http_searcher_gets_a_cleaned_query_and_a_refused_one_is_an_observation(qa_task):
    from retrieval_index.dense import DenseSearcher
    from retrieval_index.offline import offline_index
    from retrieval_index.server import ServerLimits, running_server

    searcher = DenseSearcher.load(offline_index("dense", 0, SCALE, progress=False))
    with pytest.raises(QueryRejected, match="lone surrogate"):  # in process: a ValueError that names it
        searcher.search(["ok", "bad\ud800"], 1)
    with running_server(searcher, limits=ServerLimits(max_query_chars=40)) as url:
        env = WikiQAEnv(searcher=url, offline_scale=SCALE)
        env.reset(seed=0, options={"task": qa_task})
        obs, _, _, _, info = env.step("<search>a public\ud800 university</search>")  # was UnicodeEncodeError
        assert info["action"] == "search" and len(info["doc_ids"]) == 3
        obs, _, term, _, info = env.step("<search>" + "where is it " * 5 + "</search>")  # the server's limit: 40
        assert info["error"] == "query_refused" and "query_too_long" in obs[0].content and not term
        utf8(obs)
        obs, *_ = env.step("<search>a river</search>")
        assert obs[0].content.startswith("<information>Doc 1")


def test_task_fields_and_passages_with_surrogates_give_utf8_observations():
    task = row_to_task({"id": "q\ud800", "question": "Who founded \ud800Orvik?", "golden_answers": ["Mara\udfff"],
                        "metadata": {"hops": ["a\udc00"]}}, "custom")
    assert first_unencodable(task.prompt + task.id + task.answer[0] + task.metadata["hops"][0]) is None
    env = WikiQAEnv(tasks=[task], **KW)
    obs, _ = env.reset(seed=0)
    assert "\\ud800Orvik" in utf8(obs)
    from trace_gym.types import Task

    env = WikiQAEnv(tasks=[Task(id="t", prompt="Raw \udfff task", answer=["x"])], **KW)  # not through a loader
    with pytest.raises(ValueError, match="Task.prompt holds a character UTF-8 cannot encode at 4"):
        env.reset(seed=0)  # refused at reset, naming the field (loaders clean; a raw Task is the caller's)
    text = format_passages([("1", '"Ti\ud800tle"\nText \udfff here.', 1.0)])
    assert text == 'Doc 1(Title: "Ti\\ud800tle") Text \\udfff here.'


# --- MathPython task fields -----------------------------------------------------------


def test_a_math_task_file_with_surrogate_escapes_gives_a_utf8_first_observation(tmp_path):
    from environments.math_python.data import load_tasks
    from environments.math_python.env import MathPythonEnv

    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps({"problem": "What is 2 + 3?\ud800", "answer": "5\udfff", "unique_id": "p\udc80",
                                "subject": ["alg\ud83d"]}) + "\n")  # json.dumps writes \ud800 escapes
    tasks = load_tasks("math500", path=str(path))
    task = tasks[0]
    assert first_unencodable(task.prompt + task.answer + task.id + task.metadata["subject"][0]) is None
    env = MathPythonEnv(tasks, prestart_kernel=False)
    try:
        obs, _ = env.reset(seed=0)
        assert "2 + 3?\\ud800" in utf8(obs)
    finally:
        env.close()


# --- 6: tasks that would reward nonsense are refused at reset ------------------------------------------

from trace_gym.env.contract import validate_task  # noqa: E402
from trace_gym.types import Task  # noqa: E402


@pytest.mark.parametrize("answer", [None, "", "   ", [], {}])
def test_an_env_that_grades_refuses_a_task_without_an_answer(qa_task, answer):
    env = WikiQAEnv(**KW)
    bad = {**qa_task.to_dict(), "answer": answer}
    with pytest.raises(ValueError, match=r"Task.answer is .*cannot be scored"):
        env.reset(options={"task": bad})
    env.reset(options={"task": qa_task})  # and the env still resets to a good one
    env.close()


@pytest.mark.parametrize("field, value, message", [
    ("prompt", "who is \ud800?", "Task.prompt holds a character UTF-8 cannot encode at 7"),
    ("id", "q\udfff", "Task.id holds"),
    ("answer", "Paris\ud83d", "Task.answer holds"),
    ("answer", float("nan"), "Task.answer is not JSON data"),
    ("answer", {1, 2}, "Task.answer is not JSON data"),
])
def test_task_fields_that_cannot_be_shown_or_graded_are_named(field, value, message):
    task = Task(**{"id": "q1", "prompt": "p", "answer": "a", field: value})
    with pytest.raises(ValueError, match=message):
        validate_task(task, require_answer=True)
    assert validate_task(Task("q1", "p", answer=None)).answer is None  # an env that draws its own answer


def test_the_math_env_refuses_a_task_without_an_answer_instead_of_rewarding_none():
    from environments.math_python.env import MathPythonEnv

    env = MathPythonEnv()
    with pytest.raises(ValueError, match=r"Task.answer is None; this env grades against the answer"):
        env.reset(options={"task": {"id": "t", "prompt": "What is 1+1?", "answer": None}})
    with pytest.raises(ValueError, match=r"Task.prompt holds a character UTF-8 cannot encode"):
        env.reset(options={"task": {"id": "t", "prompt": "What is \udc80?", "answer": "2"}})
    obs, _ = env.reset(options={"task": {"id": "t", "prompt": "What is 1+1?", "answer": "2"}})
    assert env.step("\\boxed{2}")[1] == 1.0
    env.close()
