"""Grading through the env's reward: 70+ equivalent / non-equivalent answer pairs, the
extraction rules, and the grader worker's timeout."""

from __future__ import annotations

import pytest

from environments.math_python.env import MathPythonEnv
from environments.math_python.grading import Grader, extract_boxed_answer, normalize_answer
from trace_gym.types import Task

CASES = [
    # fractions
    ("\\frac{1}{2}", "0.5", True), ("\\frac{1}{2}", "1/2", True), ("\\frac{1}{2}", "\\dfrac{1}{2}", True),
    ("\\frac{1}{2}", "\\frac{2}{4}", True), ("\\frac{1}{2}", "0.51", False), ("\\frac{3}{4}", "\\frac{4}{3}", False),
    ("-\\frac{1}{9}", "- \\frac{1}{9}", True), ("\\frac{11}{6}", "\\tfrac{11}{6}", True), ("\\frac{7}{3}", "2\\frac{1}{3}", True),
    # radicals
    ("2\\sqrt{3}", "\\sqrt{12}", True), ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True), ("2\\sqrt{3}", "3.4641", False),
    ("\\sqrt{2}", "\\sqrt{3}", False), ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True), ("3\\sqrt{2}", "\\sqrt{18}", True),
    ("\\sqrt[3]{8}", "2", True), ("1+\\sqrt{5}", "\\sqrt{5}+1", True),
    # decimals
    ("0.25", "\\frac14", True), ("204", "204.0", True), ("3.14", "3.140", True),
    ("0.3", "0.33", False), ("2.5", "\\frac{5}{2}", True), ("0.125", "1/8", True),
    # percent is a unit, not a scale (the MATH convention: test_grader_hedges.py)
    ("0.25", "25\\%", False), ("25", "25\\%", True), ("25\\%", "25", True), ("25\\%", "0.25", False),
    ("12.5\\%", "12.5 \\text{ percent}", True), ("5\\%", "5\\,\\%", True),
    # intervals
    ("[1, 3)", "[1,3)", True), ("(1,3]", "[1,3)", False), ("(-\\infty, 2]", "(-\\infty,2]", True),
    ("(-\\infty, 2]", "(-\\infty, 2)", False), ("[0,1]\\cup[2,3]", "[0,1] \\cup [2,3]", True),
    # sets
    ("\\{1,2,3\\}", "\\{3,2,1\\}", True), ("\\{1,2\\}", "\\{1,3\\}", False), ("\\{-1, 1\\}", "\\{1, -1\\}", True),
    # tuples
    ("(3,-1)", "(3, -1)", True), ("(3,-1)", "(-1,3)", False), ("(1,2,3)", "(1, 2, 3)", True), ("(1,2,3)", "(1,2,4)", False),
    # text and units
    ("\\text{(A)}", "A", True), ("\\text{(B)}", "\\text{(C)}", False), ("10\\text{ cm}", "10", True), ("10", "10 \\text{ cm}", True),
    ("5", "5^\\circ", True), ("90^\\circ", "90", True), ("\\text{even}", "\\text{even}", True), ("\\text{Even}", "\\text{odd}", False),
    ("\\$18.90", "18.90", True), ("18.90", "\\$18.90", True), ("12", "12\\text{ dollars}", True), ("12", "13\\text{ dollars}", False),
    # negative numbers
    ("-3", "-3", True), ("-3", "3", False), ("-\\frac{1}{2}", "-0.5", True), ("-2", "- 2", True), ("-7", "7", False),
    # scientific notation
    ("1.2\\times10^{3}", "1200", True), ("1200", "1.2e3", True), ("3\\times 10^{-2}", "0.03", True), ("0.003", "3e-3", True),
    ("6.02\\times10^{23}", "6.02 \\times 10^{23}", True), ("1.2\\times10^{3}", "1.2\\times10^{4}", False), ("1200", "1.3e3", False),
    # LaTeX spacing
    ("\\frac{1}{2}", "\\frac {1} {2}", True), ("x^2+2x+1", "x^{2} + 2x + 1", True), ("2\\pi", "2 \\pi", True),
    ("\\sqrt{2}", "\\sqrt {2}", True), ("1000", "1,000", True), ("1000", "1\\,000", True), ("\\frac{1}{2}", "\\frac{1}{2}\\,", True),
    # equations, symbols, expressions
    ("x=3", "3", True), ("\\pi", "3.14159", False), ("x^2+2x+1", "(x+1)^2", True), ("204", "205", False), ("1,2", "2,1", True),
    ("2\\pi", "\\pi \\cdot 2", True), ("e^{2}", "e^2", True),
]


@pytest.fixture(scope="module")
def env():
    e = MathPythonEnv([Task(id="t", prompt="q", answer="0")], prestart_kernel=False)
    yield e
    e.close()


def reward_for(env: MathPythonEnv, gold, response: str) -> tuple[float, dict]:
    env.reset(seed=0, options={"task": {"id": "grading", "question": "Solve it.", "answer": gold}})
    obs, reward, terminated, truncated, info = env.step(response)
    assert terminated and not truncated and info["exec"] is None
    return reward, info["grading"]


@pytest.mark.parametrize(("gold", "candidate", "equivalent"), CASES, ids=[f"{g}|{c}" for g, c, _ in CASES])
def test_equivalence_through_the_env_reward(env, gold, candidate, equivalent):
    reward, grading = reward_for(env, gold, f"I computed it. The answer is $\\boxed{{{candidate}}}$.")
    assert reward == (1.0 if equivalent else 0.0), grading
    assert grading["extracted"] == candidate.strip()


@pytest.mark.parametrize(("response", "gold", "reward"), [
    ("First \\boxed{1}, but on reflection \\boxed{2}.", "2", 1.0),  # the last box wins
    ("First \\boxed{2}, but on reflection \\boxed{1}.", "2", 0.0),
    ("The answer is 2.", "2", 0.0),  # no box, no answer
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),  # nested braces
    ("\\fbox{4}", "4", 1.0),
    ("so \\boxed 7.", "7", 1.0),
    ("\\boxed{3", "3", 0.0),  # unbalanced: not an answer
    ("Answer: \\boxed{x = 5}", "5", 1.0),  # an equation's right-hand side is its value
    ("\\boxed{5}", "x = 5", 1.0),
    ("\\boxed{x = 6}", "5", 0.0),
    ("\\boxed{1/2}", ["$\\frac{1}{2}$"], 1.0),  # OlympiadBench-style list gold with $...$
    ("\\boxed{3, 5}", ["3", "5"], 1.0),  # multi-part gold
    ("\\boxed{" + "9" * 2000 + "}", "9", 0.0),  # too long to parse
])
def test_extraction_rules_through_the_env_reward(env, response, gold, reward):
    got, grading = reward_for(env, gold, response)
    assert got == reward, grading


def test_no_answer_reason(env):
    _, grading = reward_for(env, "2", "I give up.")
    assert grading == {"correct": False, "extracted": None, "gold": "2", "reason": "no_boxed_answer",
                       "infra_error": False, "attempts": 1}


def test_code_is_never_graded(env):
    env.reset(seed=0, options={"task": Task(id="g", prompt="q", answer="4")})
    obs, reward, terminated, truncated, info = env.step("```python\nprint(2 + 2)\n```\n\\boxed{4}")
    assert reward == 0.0 and not terminated and "grading" not in info


def test_extract_boxed_answer():
    assert extract_boxed_answer("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert extract_boxed_answer("\\boxed{ {a}{b} }") == "{a}{b}"
    assert extract_boxed_answer("nothing") is None


def _boxed_by_walking(text):
    """The reference: from each box's brace, walk forward counting depth (quadratic)."""
    from environments.math_python.grading import _BOX

    answer = None
    for m in _BOX.finditer(text):
        if m.group(2) is not None:
            answer = m.group(2).rstrip(".,;:")
            continue
        depth, i = 1, m.end(1)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            answer = text[m.end(1): i - 1]
    return None if answer is None else answer.strip()


def test_extract_boxed_answer_matches_the_walking_reference_on_random_text():
    import random

    rng = random.Random(0)
    pieces = ["\\boxed{", "\\fbox {", "\\boxed 7.", "{", "}", "}", "1", " ", "x", "$"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        assert extract_boxed_answer(text) == _boxed_by_walking(text), text


@pytest.mark.timeout(30)  # the walk took 43 s on this input (64 KB, the env's response cap): now one pass
def test_extract_boxed_answer_of_unclosed_boxes_at_the_response_cap():
    assert extract_boxed_answer("\\boxed{" * (65536 // 7)) is None
    assert extract_boxed_answer("\\fbox{" * (65536 // 6) + "\\boxed{2}") == "2"
    n = 4600
    assert extract_boxed_answer("\\boxed{" * n + "1" + "}" * n) == "1"  # the innermost box is the last one


def test_normalize_answer():
    assert normalize_answer("$\\frac12$") == "\\frac12"
    assert normalize_answer("\\(x\\)") == "x"
    assert normalize_answer(["$3$"]) == "3"
    assert normalize_answer(["1", "2"]) == "1, 2"
    assert normalize_answer("1{,}000") == "1000"
    assert normalize_answer("2.5E-7") == "2.5\\times10^{-7}"
    assert normalize_answer("The gold is \\boxed{7}") == "7"
    assert normalize_answer(12) == "12"


def test_a_grading_timeout_kills_and_replaces_the_worker():
    grader = Grader(timeout_s=0.5)
    try:
        slow = grader.grade("\\boxed{9^{9^{9^{9}}}}", "1")
        assert not slow.correct and slow.reason in ("timeout", "not_equivalent")
        assert grader.grade("\\boxed{2}", "2").correct  # a fresh worker answers
    finally:
        grader.close()
