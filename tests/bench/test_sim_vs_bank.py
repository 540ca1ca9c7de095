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
    assert "PASS" in svb.table("b", out, ["cmd"]).splitlines()[-1]


def test_a_simulator_whose_trace_is_uniform_fails_naming_the_rows(svb):
    bank, sim = results(UNIFORM, TRACE), results(UNIFORM, UNIFORM, times=3)
    out = svb.agreement(bank, sim)
    assert not out["passed"]
    assert out["failed"] == ["trace effective ratio", "trace mixed prompts/step", "trace - uniform effective ratio",
                             "trace - uniform mixed prompts/step"]
    assert out["headline"][1] == "trace and uniform cannot be told apart on both headline metrics"
    last = svb.table("b", out, ["cmd"]).splitlines()[-1]
    assert last.startswith("FAIL: trace effective ratio; ")


def test_a_bad_argument_is_one_line(svb, capsys):
    assert svb.main(["no_such_bank"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'no_such_bank'" in err[0]
    assert svb.main(["--sim-seeds", "1", "math_python_smollm2"]) == 2
    assert "--sim-seeds must be >= 2" in capsys.readouterr().err
