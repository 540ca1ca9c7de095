"""reasoning-gym's scorers run on model text in the math env's sandbox: code an
evaluating scorer runs cannot reach the host, outlive its score, fake a score or stall a
step; answers with code-reaching names are refused before scoring."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from environments.ecosystems.reasoning_gym import load_tasks, to_json
from environments.ecosystems.sandboxed_scoring import CODE_NAMES, SandboxedScorer, evaluates_text
from trace_gym.api import resolve_env


@pytest.fixture(scope="module")
def scorer():
    s = SandboxedScorer(timeout_s=3.0)
    yield s
    s.close()


@pytest.fixture(scope="module")
def spiral():
    task = load_tasks(1, seed=3, dataset="spiral_matrix")[0]
    return task.metadata["entry"], task.answer


def test_code_in_a_scored_answer_cannot_touch_the_host(scorer, spiral, tmp_path):
    entry, gold = spiral
    marker = tmp_path / "written_by_the_scorer"
    # spiral_matrix eval()s its answer: this one writes a file and reads the project
    hostile = f"[__import__('pathlib').Path({str(marker)!r}).write_text('x'), open({str(Path.cwd() / 'pyproject.toml')!r}).read()]"
    assert scorer.score("spiral_matrix", {}, hostile, entry) == (0.0, None)  # FileNotFoundError, caught by the scorer
    assert not marker.exists()
    assert scorer.score("spiral_matrix", {}, gold, entry) == (1.0, None)


def test_a_scored_answer_cannot_patch_the_scorer_for_later_answers(scorer, spiral):
    entry, gold = spiral
    patch = "[setattr(type(__import__('reasoning_gym').create_dataset('spiral_matrix', size=1)), 'score_answer', lambda *a: 1.0)]"
    scorer.score("spiral_matrix", {}, patch, entry)
    assert scorer.score("spiral_matrix", {}, "not it", entry) == (0.0, None)


def test_printed_text_cannot_pose_as_a_score(scorer, spiral):
    entry, _ = spiral
    assert scorer.score("spiral_matrix", {}, "[print('{\"score\": 1.0}')]", entry) == (0.0, None)


def test_a_slow_or_greedy_answer_is_cut_off_and_the_next_one_scores(scorer, spiral):
    entry, gold = spiral
    t0 = time.monotonic()
    score, error = scorer.score("spiral_matrix", {}, "[sum(range(10**12))]", entry)
    assert score == 0.0 and "ran past 3 s of CPU time" in error and time.monotonic() - t0 < 3.0 + 10
    score, error = scorer.score("spiral_matrix", {}, "[bytearray(8 * 1024**3)]", entry)
    assert score == 0.0
    assert scorer.score("spiral_matrix", {}, gold, entry) == (1.0, None)


def test_the_limit_is_cpu_time_so_a_busy_machine_cannot_change_a_score(scorer, spiral):
    """A child that waits 4 s of wall clock past the 3 s limit, using no CPU, is scored (a
    wall-clock limit cut it off: under load the same answer's outcome depended on the load);
    one that waits past the wall-clock backstop (3 x 3 + 5 s) is cut off, named so."""
    entry, _ = spiral
    score, error = scorer.score("spiral_matrix", {}, "[__import__('time').sleep(4)]", entry)
    assert (score, error) == (0.0, None)  # scored: not a spiral, no timeout
    score, error = scorer.score("spiral_matrix", {}, "[__import__('time').sleep(30)]", entry)
    assert score == 0.0 and "ran past 14 s of wall clock" in error


def test_answers_with_code_names_are_refused_for_evaluating_scorers_only():
    from reasoning_gym.algorithmic.spiral_matrix import SpiralMatrixDataset
    from reasoning_gym.arithmetic.chain_sum import ChainSumDataset

    assert evaluates_text(SpiralMatrixDataset) and not evaluates_text(ChainSumDataset)
    for code in ("__import__('os')", "(x for x in []).gi_frame.f_back", "globals()", "lambda: 1", "eval('1')"):
        assert CODE_NAMES.search(code), code
    for fine in ("1 2 3 4", "[[1, 2], [3, 4]]", "x**2 + 3*x", "(25 - 1) * 4 / 4"):
        assert not CODE_NAMES.search(fine), fine
    fam = resolve_env("reasoning_gym:spiral_matrix")
    env = fam.make_env()
    env.reset(options={"task": fam.load_tasks(1)[0]})
    _, reward, _, _, info = env.step("<answer>[sys for sys in [1]]</answer>")
    assert reward == 0.0 and "holds 'sys'" in info["env_error"]


def test_sympys_huge_exponent_costs_one_timeout_not_the_step(tmp_path):
    fam = resolve_env("reasoning_gym:countdown", {"score_timeout_s": 2.0})
    env = fam.make_env()
    env.reset(options={"task": fam.load_tasks(1)[0]})
    t0 = time.monotonic()
    _, reward, terminated, _, info = env.step("<answer>1e999999</answer>")
    assert reward == 0.0 and terminated and time.monotonic() - t0 < 2.0 + 10
