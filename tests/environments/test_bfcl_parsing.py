"""Decoding model responses the way bfcl-eval does (values checked by hand)."""

from __future__ import annotations

import pytest

from environments.bfcl.parsing import decode, parse_ground_truth_call, render_action, strip_reasoning


def calls(text, fmt="python"):
    d = decode(text, fmt)
    return [(c.name, c.arguments, c.error) for c in d.calls], d.error


def test_plain_list_and_single_call():
    assert calls("[cd(folder='document'), ls(a=True)]")[0] == [("cd", {"folder": "document"}, None), ("ls", {"a": True}, None)]
    assert calls("cd(folder='x')")[0] == [("cd", {"folder": "x"}, None)]
    assert calls("```\n[ls()]\n```")[0] == [("ls", {}, None)]


def test_call_text_is_bfcl_rendering():
    d = decode("[mv(source = 'a.txt',destination=\"b\"), add(a=-3, b=2.50)]")
    assert [c.text for c in d.calls] == ["mv(source='a.txt', destination='b')", "add(a=-3, b=2.5)"]


def test_bfcl_quirks_are_mirrored():
    # positional arguments are dropped by bfcl-eval's decoder
    assert calls("[sort('report.pdf')]")[0] == [("sort", {}, None)]
    assert calls("[ls(*['a'])]")[0] == [("ls", {}, None)]
    # a bare name is a string
    assert calls("[cd(folder=document)]")[0] == [("cd", {"folder": "document"}, None)]
    # any unary operator in front of a number negates it
    assert calls("[f(a=+5, b=-2, c=~3)]")[0] == [("f", {"a": -5, "b": -2, "c": -3}, None)]
    # a subscript is its source text; ... is the string '...'
    assert calls("[f(a=x[0], b=...)]")[0] == [("f", {"a": "x[0]", "b": "..."}, None)]
    # dict keys are written as quoted strings, so non-string keys become strings
    assert calls("[f(d={1: 'a', 'k': [1, 2]})]")[0] == [("f", {"d": {"1": "a", "k": [1, 2]}}, None)]


def test_arithmetic_is_folded_without_eval():
    assert calls("[f(a=2*3+1, b='ab'+'c', c=7//2, d=2**10, e=1/4)]")[0] == [
        ("f", {"a": 7, "b": "abc", "c": 3, "d": 1024, "e": 0.25}, None)
    ]
    assert calls("[f(a=1/0)]")[0] == [] and "ZeroDivisionError" in calls("[f(a=1/0)]")[1]
    assert calls("[f(a=x+1)]")[0] == []  # bfcl-eval: NameError while decoding -> no calls


def test_refused_calls_keep_their_text_and_do_not_run():
    (name, args, error), = calls("[cd(folder=pwd())]")[0]
    assert name == "cd" and args == {} and "function call" in error
    (_, _, error), = calls("[cd(folder=ls(a=True))]")[0]
    assert "not a literal" in error
    (_, _, error), = calls("[f(d={'g': {'x': 1}})]")[0]  # bfcl-eval renders this as the call g(x=1)
    assert "not a literal" in error
    (_, _, error), = calls("[os.path.join(a='x')]")[0]
    assert "plain function names" in error
    (_, _, error), = calls("[f(**{'a': 1})]")[0]
    assert error


@pytest.mark.parametrize(
    "text",
    [
        "I created the folder for you.",
        "[]",
        "[ls(), 3]",
        "[ls(a=lambda: 1)]",
        "[ls(a=[i for i in range(3)])]",
        "[ls(a=f'{x}')]",
        "[f(d={})]",
        "[ls(a=not x)]",
        "[ls(a=x.y)]",
        "[ls(a={1, 2})]",
        "[ls(a=1 if x else 2)]",
        "ls(",
    ],
)
def test_no_decodable_call_ends_the_turn(text):
    d = decode(text)
    assert not d.has_calls
    assert (d.error is None) == (text == "[]")


def test_tool_call_format():
    text = (
        '<tool_call>\n{"name": "cd", "arguments": {"folder": "x"}}\n</tool_call>\n'
        '<tool_call>\nnot json\n</tool_call>\n'
        '<tool_call>\n{"name": "ls", "arguments": "{\\"a\\": true}"}\n</tool_call>'
    )
    d = decode(text, "tool_call")
    assert [(c.name, c.arguments, c.text) for c in d.calls] == [
        ("cd", {"folder": "x"}, "cd(folder='x')"),
        ("ls", {"a": True}, "ls(a=True)"),
    ]
    assert not decode("[cd(folder='x')]", "tool_call").has_calls
    assert decode('<tool_call>\n{"name": "cd"}\n</tool_call>', "tool_call").error  # no arguments
    assert decode('<tool_call>\n{"name": "cd", "arguments": [1]}\n</tool_call>', "tool_call").error
    assert not decode('<tool_call>{"name": "cd", "arguments": {}}</tool_call>', "tool_call").has_calls  # needs newlines


def test_reasoning_is_stripped():
    assert strip_reasoning("<think>\n[rm(file_name='a')]\n</think>\n\n[ls()]") == "[ls()]"
    assert [c.name for c in decode("<think>hmm [rm(file_name='a')]</think>\n[ls()]").calls] == ["ls"]


def test_render_action_round_trips():
    pairs = [("cd", {"folder": "a'b"}), ("edit_ticket", {"ticket_id": 1, "updates": {"priority": 2}}), ("f", {"x": -1.5, "y": [True, None]})]
    for fmt in ("python", "tool_call"):
        assert [(c.name, c.arguments) for c in decode(render_action(pairs, fmt), fmt).calls] == pairs
    with pytest.raises(ValueError, match="action_format"):
        render_action(pairs, "xml")


def test_parse_ground_truth_call():
    assert parse_ground_truth_call("sort('a.pdf')") == ("sort", ("a.pdf",), {})
    assert parse_ground_truth_call("f(1, b=-2, c={'k': [1]})") == ("f", (1,), {"b": -2, "c": {"k": [1]}})
    for bad in ("a.b()", "f(x)", "f(", "f(**d)"):
        with pytest.raises(ValueError):
            parse_ground_truth_call(bad)


def test_unknown_format_raises():
    with pytest.raises(ValueError, match="action_format"):
        decode("[ls()]", "json")
