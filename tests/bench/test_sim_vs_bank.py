"""benchmarks/sim_vs_bank.py's check (issue 45, item 4), on hand-made bench results: a simulator
that agrees passes; one whose TRACE is uniform's fails on the rows and the verdict words."""

from __future__ import annotations

import math

import pytest

from trace_gym import report
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def svb():
    with benchmark_script("sim_vs_bank") as module:
        yield module


def row(ratios, mixed) -> dict:
    reps = [{"effective_ratio": e, "mixed_prompts": m, "mixed_per_1k_tokens": 1.0} for e, m in zip(ratios, mixed)]
    out = {"per_rep": reps, "repetitions": len(reps), "upper_bound": False, "predictor": "p"}
    for key in ("effective_ratio", "mixed_prompts", "mixed_per_1k_tokens"):
        out[key], out[key + "_ci"], _ = report.mean_ci([r[key] for r in reps])
    return out


UNIFORM = ([0.4, 0.5, 0.45, 0.5, 0.4], [3, 4, 3.5, 4, 3])
TRACE = ([0.7, 0.85, 0.7, 0.8, 0.75], [4, 5, 4.5, 5.5, 4])  # 0.31 and 1.1 above uniform, every repetition


def results(uniform, trace, times: int = 1) -> dict:
    return {"strategies": {"uniform": row(uniform[0] * times, uniform[1] * times),
                           "trace": row(trace[0] * times, trace[1] * times)}}


def verdict_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(("PASS", "FAIL")))


def test_inside_is_the_banks_interval_ends_included(svb):
    assert svb.inside({"x": 0.5, "x_ci": 0.1}, "x", 0.6) and not svb.inside({"x": 0.5, "x_ci": 0.1}, "x", 0.61)
    no_interval = {"x": 0.5, "x_ci": math.nan}
    assert svb.inside(no_interval, "x", 0.5) and not svb.inside(no_interval, "x", 0.51)


def test_first_repetitions_reaverages_the_headline_metrics(svb):
    cut = svb.first_repetitions(results(UNIFORM, TRACE, times=3), 2)["strategies"]["trace"]
    assert cut["repetitions"] == 2 and cut["effective_ratio"] == pytest.approx(0.775)
    assert cut["mixed_prompts"] == pytest.approx(4.5) and len(cut["per_rep"]) == 2


def test_a_simulator_that_agrees_passes(svb):
    bank, sim = results(UNIFORM, TRACE), results(UNIFORM, TRACE, times=3)  # 15 repetitions, the same means
    out = svb.agreement(bank, sim)
    assert out["passed"] and out["failed"] == [] and out["sim_judged_on"] == 5
    assert [(p["pair"], p["bank"], p["sim"]) for p in out["pairs"]] == [
        ("trace - uniform", "shown above", "shown above")] * 2
    assert out["headline"] == ("trace beats uniform on both headline metrics",) * 2
    assert verdict_line(svb.table("b", out, ["cmd"])) == "PASS"


def test_a_simulator_whose_trace_is_uniform_fails_naming_the_rows(svb):
    bank, sim = results(UNIFORM, TRACE, times=2), results(UNIFORM, UNIFORM, times=3)  # 10 bank repetitions
    out = svb.agreement(bank, sim)
    assert not out["passed"]
    assert out["failed"] == ["trace effective ratio", "trace mixed prompts/step", "trace - uniform effective ratio",
                             "trace - uniform mixed prompts/step"]
    assert out["headline"][1] == "trace and uniform cannot be told apart on both headline metrics"
    text = svb.table("b", out, ["cmd"])
    assert verdict_line(text).startswith("FAIL: trace effective ratio; ")
    assert text.splitlines()[-1] == ("Two-sample (beside the check, not deciding it): apart beyond both intervals "
                                     "combined: trace effective ratio; trace mixed prompts/step")


def blocky(flat_blocks) -> dict:
    """Results whose TRACE is uniform's in the blocks of 5 marked True and above it in the others."""
    chosen = [UNIFORM if flat else TRACE for flat in flat_blocks]
    k = len(flat_blocks)
    return {"strategies": {"uniform": row(UNIFORM[0] * k, UNIFORM[1] * k),
                           "trace": row(sum((b[0] for b in chosen), []), sum((b[1] for b in chosen), []))}}


def test_the_simulators_word_is_the_one_most_of_its_blocks_say(svb):
    """Three blocks of 5 repetitions: in the first TRACE is uniform's (not shown), in the other two it is
    above every repetition: the word is 'shown above', the first block's printed beside it; with two
    blocks of uniform the word is 'not shown' and the check fails."""
    bank = results(UNIFORM, TRACE)
    out = svb.agreement(bank, blocky([True, False, False]))
    words = {p["metric"]: p for p in out["pairs"]}["effective ratio"]
    assert words["blocks"] == ["not shown", "shown above", "shown above"] and words["sim"] == "shown above"
    assert words["first"] == "not shown" and out["sim_blocks"] == 3
    assert "| not shown, shown above, shown above |" in svb.table("b", out, ["cmd"])
    out = svb.agreement(bank, blocky([True, False, True]))
    assert {p["metric"]: p["sim"] for p in out["pairs"]}["effective ratio"] == "not shown"
    assert "trace - uniform effective ratio" in out["failed"]


def test_the_banks_word_is_the_one_most_of_its_blocks_say_too(svb):
    """The bank's word is read as the simulator's: a bank of three blocks of 5 whose first block shows
    nothing and whose other two show TRACE above says 'shown above', and a simulator saying so matches;
    the block size is the check's (here 5), not the bank's whole run."""
    out = svb.agreement(blocky([True, False, False]), blocky([False] * 9), block=5)
    words = {p["metric"]: p for p in out["pairs"]}["effective ratio"]
    assert words["bank_blocks"] == ["not shown", "shown above", "shown above"] and words["bank"] == "shown above"
    assert words["same"] and out["bank_blocks"] == 3 and out["sim_blocks"] == 9 and out["passed"]
    out = svb.agreement(blocky([True, True, False]), blocky([False] * 9), block=5)
    assert {p["metric"]: p["bank"] for p in out["pairs"]}["effective ratio"] == "not shown"
    assert "trace - uniform effective ratio" in out["failed"]


def test_a_split_word_matches_nothing_not_even_a_split(svb):
    bank = {"strategies": {"uniform": row(UNIFORM[0] * 2, UNIFORM[1] * 2),
                           "trace": row(UNIFORM[0] + TRACE[0], UNIFORM[1] + TRACE[1])}}  # not shown, shown above
    out = svb.agreement(bank, bank, block=5)
    assert {p["metric"]: (p["bank"], p["sim"], p["same"]) for p in out["pairs"]}["effective ratio"] == (
        "split", "split", False)
    assert not out["passed"]


def test_a_word_no_majority_says_is_split(svb):
    assert svb.modal_word(["shown above", "not shown", "shown below"]) == "split"
    assert svb.modal_word(["shown above", "shown above"]) == "shown above"
    assert svb.modal_word(["shown above", "not shown"]) == "split"  # a tie is no majority
    assert [len(b["strategies"]["trace"]["per_rep"]) for b in svb.blocks(results(UNIFORM, TRACE, times=3), 5)] == \
        [5, 5, 5]


def test_a_bad_argument_is_one_line(svb, capsys):
    assert svb.main(["no_such_bank"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'no_such_bank'" in err[0]
    assert svb.main(["--sim-seeds", "1", "math_python_smollm2"]) == 2
    assert "--sim-seeds must be >= 2" in capsys.readouterr().err
    assert svb.main(["--bank-seeds", "1", "math_python_smollm2"]) == 2
    assert "--bank-seeds must be >= 2" in capsys.readouterr().err
    assert svb.main(["--self", "--plant", "cold", "math_python_smollm2"]) == 2
    assert "give one" in capsys.readouterr().err


def test_within_combined_adds_the_half_widths_in_quadrature(svb):
    bank, sim = {"x": 0.5, "x_ci": 0.06}, {"x": 0.6, "x_ci": 0.08}  # sqrt(0.06^2 + 0.08^2) = 0.1
    assert svb.within_combined(bank, sim, "x") and not svb.inside(bank, "x", 0.6)
    assert not svb.within_combined(bank, {"x": 0.601, "x_ci": 0.08}, "x")
    assert not svb.within_combined({"x": 0.5, "x_ci": math.nan}, {"x": 0.51, "x_ci": math.nan}, "x")


def test_a_mean_just_outside_the_banks_95_interval_passes_at_the_familywise_level(svb):
    bank = results(UNIFORM, TRACE)
    # 0.065 apart: past the bank's 95 % half-width 0.062, within the two combined (0.067) and the 98.75 % one
    shifted = ([x + 0.065 for x in UNIFORM[0]] * 3, UNIFORM[1] * 3)
    sim = {"strategies": {"uniform": row(*shifted), "trace": row(TRACE[0] * 3, TRACE[1] * 3)}}
    out = svb.agreement(bank, sim)
    assert out["outside_95"] == ["uniform effective ratio"] and out["apart"] == [] and out["passed"]
    assert out["row_level"] == pytest.approx(1 - 0.05 / 4)
    assert "At 95 % a row (the issue's rule, beside the check): outside: uniform effective ratio" in svb.table(
        "b", out, ["cmd"])


def test_the_familywise_half_width_is_students_t_at_the_bonferroni_level(svb):
    from scipy import stats

    reps = TRACE[0]
    sd = (sum((x - sum(reps) / 5) ** 2 for x in reps) / 4) ** 0.5
    by_hand = stats.t.ppf(1 - 0.05 / 16, 4) * sd / 5 ** 0.5  # 8 rows: each two-sided at 1 - 0.05 / 8
    assert svb.familywise_half(row(*TRACE), "effective_ratio", 8) == pytest.approx(by_hand)
    assert svb.familywise_half(row(*TRACE), "effective_ratio", 1) == pytest.approx(row(*TRACE)["effective_ratio_ci"])


def test_a_perfect_simulator_fails_a_third_of_runs_at_95_a_row_and_few_at_the_familywise_level(svb):
    """The rule's own false-alarm rate: banks of 30 repetitions drawn around known means, a simulator
    at exactly those means. At 95 % a row, some row of 8 misses in about 1 - 0.95^8 = 34 % of runs."""
    import numpy as np

    rng = np.random.default_rng(0)
    runs, fail_95, fail_fw = 300, 0, 0
    for _ in range(runs):
        any_95 = any_fw = False
        for mean in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
            draws = rng.normal(mean, 0.1, 30)
            bank = row(list(draws), list(draws))
            any_95 |= not svb.inside(bank, "effective_ratio", mean)
            any_fw |= not svb.inside_familywise(bank, "effective_ratio", mean, 8)
        fail_95 += any_95
        fail_fw += any_fw
    assert 0.25 < fail_95 / runs < 0.45 and fail_fw / runs < 0.09


def test_self_runs_the_bank_bench_at_other_seeds(svb):
    args = svb.self_args(["bench", "--bank", "b", "seeds=10", "strategies=uniform"], 30)
    assert args == ["bench", "--bank", "b", "strategies=uniform", "seeds=30", f"seed={svb.SELF_SEED}"]
