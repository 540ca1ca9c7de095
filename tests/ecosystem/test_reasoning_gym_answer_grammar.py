"""Answers to reasoning-gym scorers that evaluate text are checked against an allow-list
grammar before scoring (environments.ecosystems.answer_grammar): the red-team's reward
hacks score 0 through the real sandboxed scorer, every gold answer still scores 1.0."""

from __future__ import annotations

import pytest

from environments.ecosystems.answer_grammar import (ARITHMETIC, LITERAL, MAX_CHARS, SYMPY, grammar_of,
                                                    refusal)
from environments.ecosystems.reasoning_gym import ReasoningGymEpisode, load_tasks

P24 = {"numbers": [1, 3, 5, 9]}
COUNTDOWN = {"numbers": [66, 34, 98, 54, 6], "target": 164}


# --- the grammar, host-side ---------------------------------------------------------------------


def test_which_datasets_get_which_grammar():
    assert grammar_of("puzzle24", True) == grammar_of("countdown", True) == ARITHMETIC
    assert grammar_of("simple_integration", True) == grammar_of("polynomial_multiplication", True) == SYMPY
    assert grammar_of("spiral_matrix", True) == grammar_of("some_future_eval_dataset", True) == LITERAL
    assert grammar_of("chain_sum", False) is None  # a scorer that does not evaluate text
    assert grammar_of("codeio", True) is None and grammar_of("propositional_logic", True) is None
    assert refusal("codeio", '{"ok": true}', {}) is None
    assert refusal("chain_sum", "__import__('os')", {}, evaluates=False) is None
    assert refusal("spiral_matrix", None, {}) is None


@pytest.mark.parametrize("answer", [
    "1 2 3\n4 5 6", "_ Q _ _\n_ _ _ Q", "[[1, 2], [3, 4]]", "['_', 'Q']", "(1, -2.5, 3e2, 0x1f)", "{'a': [1]}",
    "{1, 2}", "True", "None", "-4", "not python at all (", "'a' + 'b'", "[1] * 3", "\u00e9t\u00e9 \u00e0 1 2",
])
def test_literal_grammar_accepts(answer):
    assert refusal("spiral_matrix", answer, {}) is None


@pytest.mark.parametrize("answer, rule", [
    ("oracle_answer", "the name 'oracle_answer'"),
    ("oracle_answer.split()", "a call to split"),
    ("[r.split() for r in valid_solutions[0].splitlines()]", "a comprehension"),
    ("valid_solutions[0]", "a subscript"),
    ("[x.real for x in [1]]", "a comprehension"),
    ("(lambda: 1)()", "a call"),
    ("[(lambda: 1)]", "a lambda"),
    ("f'{1}'", "an f-string"),
    ("[*()]", "a starred item"),
    ("[(y := 1)]", "an assignment (:=)"),
    ("(1).real", "an attribute (.real)"),
    ("[2 ** 1000000]", "a Pow node"),
    ("\u00a0 \tlen('')", "a call to len"),
    ("\uff45\uff56\uff41\uff4c('valid'+'_solutions')", "NFKC"),  # fullwidth eval
    ("[" * 100_000 + "]" * 100_000, f"longer than {MAX_CHARS}"),
    ("-" * 9000 + "1", "could not be checked"),
])
def test_literal_grammar_refuses(answer, rule):
    why = refusal("n_queens", answer, {})
    assert why is not None and why.startswith("answer refused: ") and rule in why, why
    assert "n_queens answers may use only literals" in why


def test_plain_text_of_string_insertion_passes_other_names_do_not():
    assert refusal("string_insertion", "DACEDDCDCEBEBCBAE", {}) is None
    assert "the name 'oracle_answer'" in refusal("string_insertion", "oracle_answer", {})
    assert "the name 'ABCF'" in refusal("string_insertion", "ABCF", {})
    assert refusal("binary_matrix", "ABC", {}) is not None  # the plain form is string_insertion's alone


@pytest.mark.parametrize("answer", ["9*3 - 5 + 1", "(9 - 5) * 3 * 1", "-(1 - 9) * 3 / 5", " 9 * 3 - 5 + 1 ",
                                    "(9*3\n - 5 + 1)"])
def test_arithmetic_grammar_accepts_expressions_over_the_puzzles_numbers(answer):
    assert refusal("puzzle24", answer, P24) is None


@pytest.mark.parametrize("dataset, answer, rule", [
    ("puzzle24", "6*4*1*1", "it uses the numbers [1, 1, 4, 6], the puzzle's are [1, 3, 5, 9]"),
    ("puzzle24", "9*3 - 5", "it uses the numbers [3, 5, 9]"),
    ("puzzle24", "factorial(4)*1*1*1", "the character 'f'"),
    ("puzzle24", "4!*1*1*1", "the character '!'"),
    ("puzzle24", "(9 - 3) ** 1 * 5 - 1", "a Pow node"),
    ("puzzle24", "9 // 3 * 5 + 1", "a FloorDiv node"),
    ("puzzle24", "9*3 - 5 + 1.0", "the character '.'"),
    ("puzzle24", "+9*3 - 5 + 1", "a UAdd node"),
    ("puzzle24", "9*3 -- 5 + 01", "not a Python expression"),
    ("puzzle24", "9*3\uff0d5+1", "the character"),
    ("countdown", "66*34*98*54*6*len('') + ord('\u00a4')", "the character 'l'"),
    ("countdown", "66 + 98 + 0", "more than the puzzle's"),
    ("countdown", "66 + 66 + 32", "more than the puzzle's"),
    ("countdown", "", "not a Python expression"),
])
def test_arithmetic_grammar_refuses(dataset, answer, rule):
    why = refusal(dataset, answer, P24 if dataset == "puzzle24" else COUNTDOWN)
    assert why is not None and rule in why, why
    assert f"{dataset} answers may use only integer literals, + - * /, unary minus and parentheses" in why


def test_countdown_takes_a_sub_multiset_puzzle24_the_exact_one():
    assert refusal("countdown", "6*(98 - 54) - 34 - 66", COUNTDOWN) is None
    assert refusal("countdown", "98 + 66", COUNTDOWN) is None  # fewer numbers: the scorer's own rule then applies
    assert refusal("puzzle24", "1*3*5 + 9", P24) is None
    assert "no numbers" in refusal("puzzle24", "1*3*5 + 9", {})


@pytest.mark.parametrize("answer", [
    "-5*X**9 - 2*X**6/3 + 4*X**3 + C", "-exp(x)*sin(x) + exp(x)*cos(x) + C", "-4*(-2*x - 8)**(3/2)/3 + C",
    "log(Abs(x)) + atan(x) + sqrt(x) + E**x + pi*I - oo", "x_1**2.5 + ln(x)", "-896*x**3 + 2240*x**2 + 3584*x",
])
def test_sympy_grammar_accepts(answer):
    assert refusal("intermediate_integration", answer, {}) is None


@pytest.mark.parametrize("answer, rule", [
    ("Integral(-2*exp(x)*sin(x), x)", "a call to Integral"),
    ("integrate(x**2, x)", "a call to integrate"),
    ("expand((x + 1)*(x + 2))", "a call to expand"),
    ("diff(x**3, x)/3", "a call to diff"),
    ("simplify(x) + factor(x)", "a call to simplify"),
    ("Derivative(x, x)", "a call to Derivative"),
    ("Subs(x, x, 1) + Sum(x, (x, 1, 2))", "a call to Subs"),
    ("x.diff(x)", "a call to diff"),
    ("sin(x=1)", "keyword"),
    ("sin(*x)", "starred"),
    ("'x' + 1", "the constant 'x'"),
    ("x[0]", "a subscript"),
    ("x.args", "an attribute (.args)"),
    ("x ^ 2", "a BitXor node"),
    ("x!", "not a Python expression"),
    ("__x + 1", "the name '__x'"),
    ("x\u00b2", "NFKC"),
    ("\u00e9 + 1", "the character"),
    ("(x < 1) + 1", "a Compare node"),
    ("True*x", "the constant True"),
    ("1j*x", "the constant 1j"),
])
def test_sympy_grammar_refuses(answer, rule):
    why = refusal("simple_integration", answer, {})
    assert why is not None and rule in why, why
    assert "simple_integration answers may use only numbers, symbol names, + - * / **, and calls to Abs" in why


# --- through the real sandboxed scorer -----------------------------------------------------------


@pytest.fixture(scope="module")
def act():
    """``act(dataset, answer, seed=0) -> (reward, info)`` on task ``seed`` of ``dataset``;
    ``answer`` may be a function of the entry. One sandbox kernel serves the module."""
    from environments.ecosystems.sandboxed_scoring import shared_scorer

    def run(dataset, answer, seed=0, ungated=False):
        task = load_tasks(1, seed=seed, dataset=dataset)[0]
        episode = ReasoningGymEpisode(dataset)
        episode.begin(task, 0)
        text = answer(episode.current.entry) if callable(answer) else answer
        if ungated:  # what the scorer alone gives it, no grammar in front
            return shared_scorer().score(dataset, {}, text, task.metadata["entry"])
        _, reward, _, _, info = episode.act(f"<answer>{text}</answer>")
        return reward, info

    yield run
    shared_scorer().close()


def _meta(key):
    return lambda entry: entry["metadata"][key]


HACKS = [  # (dataset, answer, what refuses it); each scored 0.1 to 1.0 before the grammar
    ("puzzle24", "6*4*1*1", "the puzzle's are [1, 3, 5, 9]"),
    ("puzzle24", "factorial(4)*1*1*1", "the character 'f'"),
    ("countdown", "66*34*98*54*6*len('') + ord('\u00a4')", "the character 'l'"),
    ("simple_integration", lambda e: f"Integral({e['metadata']['integrand']}, {e['metadata']['variable']})",
     "a call to Integral"),
    ("simple_integration", lambda e: f"integrate({e['metadata']['integrand']}, {e['metadata']['variable']})",
     "a call to integrate"),
    ("intermediate_integration", "Integral(-2*exp(x)*sin(x), x)", "a call to Integral"),
    ("polynomial_multiplication", lambda e: f"expand({e['metadata']['polynomial_expr']})", "a call to expand"),
    ("n_queens", "[r.split() for r in valid_solutions[0].splitlines()]", "a comprehension"),
    ("n_queens", "\uff45\uff56\uff41\uff4c('[r.split() for r in valid'+'_solutions[0].splitlines()]')", "NFKC"),
    ("spiral_matrix", "oracle_answer.split()", "a call to split"),
    ("binary_matrix", "[[int(c) for c in r.split()] for r in oracle_answer.splitlines()]", "a comprehension"),
    ("string_insertion", "list(oracle_answer)", "a call to list"),
]


@pytest.mark.parametrize("dataset, answer, rule", HACKS, ids=[f"{h[0]}-{i}" for i, h in enumerate(HACKS)])
def test_the_red_teams_hacks_score_zero(act, dataset, answer, rule):
    before, error = act(dataset, answer, ungated=True)
    assert before >= 0.1 and error is None  # the hack pays when the scorer sees it
    reward, info = act(dataset, answer)
    assert reward == 0.0 and info["env_error"].startswith("answer refused: ") and rule in info["env_error"]


GOLD = ["puzzle24", "countdown", "simple_integration", "intermediate_integration", "polynomial_multiplication",
        "n_queens", "spiral_matrix", "binary_matrix", "string_insertion"]


@pytest.mark.parametrize("dataset", GOLD)
def test_gold_answers_still_score_full_marks(act, dataset):
    for seed in (0, 1):
        reward, info = act(dataset, lambda entry: entry["answer"], seed=seed)
        assert reward == 1.0 and "env_error" not in info, (dataset, seed, info)


def test_the_datasets_other_answer_formats_keep_their_partial_credit(act):
    reward, info = act("spiral_matrix", lambda e: repr([int(v) for v in e["answer"].split()]))
    assert reward == 0.1 and "env_error" not in info
    reward, info = act("n_queens", lambda e: repr([row.split() for row in e["answer"].splitlines()]))
    assert reward == 0.5 and "env_error" not in info


def test_unsolved_answers_fail_in_the_scorer_itself(act):
    """No rule of ours is needed here: the scorer already says 0."""
    # the question's product written as-is: polynomial_multiplication compares sympy expressions structurally
    reward, info = act("polynomial_multiplication", _meta("polynomial_expr"))
    assert reward == 0.0 and "env_error" not in info
    reward, info = act("polynomial_multiplication", lambda e: e["metadata"]["polynomial_expr"].replace("*(", "*1*("))
    assert reward == 0.0
    # the integrand itself is no antiderivative
    for dataset in ("simple_integration", "intermediate_integration"):
        reward, info = act(dataset, _meta("integrand"))
        assert reward == 0.0 and "env_error" not in info


def test_an_answer_inside_the_grammar_that_stalls_sympy_still_costs_one_timeout():
    """``1e999999`` is a float to the grammar; sympy then runs past the score's deadline."""
    import time

    episode = ReasoningGymEpisode("simple_integration", score_timeout_s=2.0)
    episode.begin(load_tasks(1, dataset="simple_integration")[0], 0)
    t0 = time.monotonic()
    _, reward, terminated, _, info = episode.act("<answer>1e999999 + x</answer>")
    assert reward == 0.0 and terminated and "ran past 2 s" in info["env_error"] and time.monotonic() - t0 < 2.0 + 10
