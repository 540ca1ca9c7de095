"""No answer is paid for two golds that differ: every hedge, graded against both golds.

A hedge is an answer a policy writes when it is unsure which of two answers is right,
so that it is paid whichever the gold is: a percent sign when unsure of the scale
(``5\\%`` for 5 or 0.05), both names in a short answer ("Paris London"), the words two
names share ("John"), several option letters in any layout (``\\boxed{A B}``,
``(A)(B)``). Each is graded here by the real grader of its family (the sandboxed
math-verify worker, the WikiQA env's F1 reward, the choice grader) against each of the
two golds it hedges between: it may succeed against at most one. The legitimate
answers next to them still succeed.
"""

from __future__ import annotations

import re

import pytest

from environments.math_python.choice import ChoiceGrader
from environments.math_python.grading import Grader, normalize_answer
from environments.wiki_qa.env import WikiQAEnv
from environments.wiki_qa.metrics import best_f1
from trace_gym.tree import SUCCESS_THRESHOLD

# --------------------------------------------------------------------------- math


@pytest.fixture(scope="module")
def grader():
    g = Grader()  # the real one: math-verify in the sandboxed worker
    yield g
    g.close()


#: (hedge, the gold it is read as, the other gold): a percent reads as its number (the MATH convention)
PERCENT_HEDGES = [
    ("5\\%", "5", "0.05"), ("5%", "5", "\\frac{1}{20}"), ("3 \\%", "3", "0.03"), ("30\\%", "30", "0.3"),
    ("50\\%", "50", "\\frac{1}{2}"), ("2.5\\%", "2.5", "0.025"), ("5\\,\\%", "5", "0.05"),
    ("5 \\text{ percent}", "5", "0.05"), ("12 pct", "12", "0.12"), ("100\\%", "100", "1"),
    ("5\\text{\\%}", "5", "0.05"), ("\\frac{1}{2}\\%", "\\frac{1}{2}", "0.005"),
]
#: answers that name two values at once, for pairs of golds that differ
COMBINED = ["A \\text{ or } B", "A, B", "\\{A, B\\}", "A \\lor B", "x = A, x = B", "A \\text{ and } B", "A (B)",
            "[A, B]", "A = B", "A | B", "A; B"]
GOLD_PAIRS = [("5", "0.05"), ("2", "-2"), ("\\frac{1}{2}", "2")]


def paid(grader: Grader, answer: str, gold: str) -> bool:
    result = grader.grade(f"So the answer is $\\boxed{{{answer}}}$.", gold)
    assert not result.infra_error, result
    return result.correct


@pytest.mark.parametrize(("hedge", "unit_gold", "fraction_gold"), PERCENT_HEDGES)
def test_a_percent_is_paid_for_one_scale_only(grader, hedge, unit_gold, fraction_gold):
    assert paid(grader, hedge, unit_gold)
    assert not paid(grader, hedge, fraction_gold)


def test_every_combined_math_hedge_is_paid_for_at_most_one_gold(grader):
    for first, second in GOLD_PAIRS:
        for template in COMBINED:
            for a, b in ((first, second), (second, first)):
                answer = template.replace("A", "\0").replace("B", b).replace("\0", a)
                golds_paid = [gold for gold in (first, second) if paid(grader, answer, gold)]
                assert len(golds_paid) <= 1, (answer, golds_paid)


@pytest.mark.parametrize(("gold", "answer", "right"), [
    ("5\\%", "5", True), ("5\\%", "5\\%", True), ("5\\%", "5 \\%", True), ("5\\%", "0.05", False),
    ("25", "25\\%", True), ("0.25", "25\\%", False), ("0.25", "\\frac{1}{4}", True), ("12.5\\%", "12.5", True),
])
def test_legitimate_percent_answers_are_still_paid(grader, gold, answer, right):
    assert paid(grader, answer, gold) == right


def test_percent_signs_are_dropped_in_linear_time():
    assert normalize_answer("5 \\text{ percent }") == "5" and normalize_answer("\\{5\\%, 10\\%\\}") == "\\{5, 10\\}"
    assert normalize_answer(" " * 10**6 + "%") == ""  # one pass, no backtracking over the run


# --------------------------------------------------------------------------- QA F1

#: (hedge, gold one, gold two): more words than either gold, or fewer than both
QA_HEDGES = [
    ("Paris London", "Paris", "London"), ("Paris or London", "Paris", "London"),
    ("London, Paris", "Paris", "London"), ("Jane Austen Charlotte Bronte", "Jane Austen", "Charlotte Bronte"),
    ("John", "John Smith", "John Brown"), ("New York", "New York City", "New York State"),
    ("New York City State", "New York City", "New York State"), ("1912 1913", "1912", "1913"),
]


@pytest.fixture(scope="module")
def qa_env():
    env = WikiQAEnv(reward="f1", searcher="offline", offline_scale=0.03)
    yield env
    env.close()


def answer_with(env: WikiQAEnv, answer: str, golds: list[str]) -> tuple[float, dict]:
    """(reward, info) of one episode that answers ``answer`` at once."""
    env.reset(seed=0, options={"task": {"id": "hedge", "question": "Which one?", "golden_answers": golds}})
    _, reward, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    assert terminated
    return reward, info


@pytest.mark.parametrize(("hedge", "gold_one", "gold_two"), QA_HEDGES)
def test_an_f1_hedge_succeeds_against_neither_gold(qa_env, hedge, gold_one, gold_two):
    for gold in (gold_one, gold_two):
        reward, _ = answer_with(qa_env, hedge, [gold])
        assert 0 < reward < SUCCESS_THRESHOLD, (hedge, gold, reward)
        assert reward == pytest.approx(best_f1(hedge, [gold]) / 2)  # still graded by overlap


def test_the_f1_reward_pays_whole_answers_and_reports_the_official_f1(qa_env):
    golds = ["Paris", "City of Paris"]
    for answer, reward in [("Paris", 1.0), ("the city of Paris", 1.0), ("Paris, city of", 1.0),
                           ("Paris London", 1 / 3), ("City", 0.25), ("Rome", 0.0)]:
        got, info = answer_with(qa_env, answer, golds)
        assert got == pytest.approx(reward), (answer, got, info)
    _, info = answer_with(qa_env, "Paris London", golds)
    assert info["f1"] == pytest.approx(2 / 3) and info["reward_components"] == {"em": 0.0, "f1": pytest.approx(2 / 3)}


# --------------------------------------------------------------------------- multiple choice

#: several letters, each a layout the old reading took as its first letter
CHOICE_HEDGES = [
    "\\boxed{A B}", "\\boxed{(A)(B)}", "\\boxed{A|B}", "\\boxed{A vs B}", "\\boxed{\\text{A}\\text{B}}",
    "The answer is (A) (B)", "\\boxed{A \\quad B}", "\\boxed{A \\lor B}", "Answer: A or maybe B",
    "\\boxed{A\\,B}", "Answer: A - B", "\\boxed{A \\text{ or option } B}", "answer: A nor B", "\\boxed{A. B.}",
    "\\boxed{A versus B}", "The answer is A / B", "\\boxed{\\textbf{A} \\textbf{B}}",
]


@pytest.mark.parametrize("hedge", CHOICE_HEDGES)
def test_a_choice_hedge_is_several_letters_and_paid_for_no_gold(hedge):
    grader = ChoiceGrader("ABCD")
    for gold in "AB":
        result = grader.grade(hedge, gold)
        assert (result.correct, result.reason) == (False, "several_letters"), (hedge, gold, result)
    flipped = re.sub(r"\b[AB]\b", lambda m: "B" if m.group() == "A" else "A", hedge)
    assert grader.grade(flipped, "A").reason == "several_letters"


@pytest.mark.parametrize(("response", "letter"), [
    ("Answer: C. B is wrong because it ignores friction.", "C"), ("\\boxed{C. Vitamin A}", "C"),
    ("The answer is C, because D fails", "C"), ("\\boxed{C) 42 kg}", "C"), ("The answer is (C) $\\frac{1}{2}$", "C"),
    ("\\boxed{B \\text{ (the second option)}}", "B"), ("The answer is D. A and B are both too large.", "D"),
])
def test_a_letter_followed_by_its_option_text_is_still_one_letter(response, letter):
    result = ChoiceGrader("ABCD").grade(response, letter)
    assert (result.correct, result.reason) == (True, "correct"), (response, result)
