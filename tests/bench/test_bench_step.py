"""benchmarks/bench_step.py's arms: equal nominal budgets, and its summed rates."""

from __future__ import annotations

import pytest
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def bench():
    with benchmark_script("bench_step") as module:
        yield module


@pytest.mark.parametrize("task,prompts", [("single", 4), ("multi", 16), ("multi", 4)])
def test_uniform_and_trace_spend_the_same_nominal_budget_of_four_rollouts_a_prompt(bench, monkeypatch, task, prompts):
    monkeypatch.setitem(bench.PROMPTS, task, prompts)
    uniform = bench.make_cfg(task, "uniform", "hf", 1e-7)
    trace = bench.make_cfg(task, "trace", "hf", 1e-7)
    assert uniform.nominal_budget == trace.nominal_budget == 4 * prompts
    assert uniform.nominal_budget / uniform.group_size == prompts  # uniform: P groups of 4
    assert trace.root_budget == 2 * prompts and trace.continuations_per_root == 2
    assert uniform.candidates == trace.candidates == prompts


def test_the_multi_turn_task_reads_the_reply_s_last_integer(bench):
    cfg = bench.make_cfg("multi", "uniform", "hf", 1e-7)
    assert cfg.env_kwargs == {"high": 8, "max_turns": 3, "guess_format": "number"}
    assert cfg.max_turns == 3


def test_rates_are_sums_over_rounds_not_means_of_ratios(bench):
    rows = [{"generated": 100, "generation_s": 1.0}, {"generated": 300, "generation_s": 3.0},
            {"generated": 0, "generation_s": 4.0}]
    assert bench.rate(rows, "generated", "generation_s") == pytest.approx(400 / 8)
    assert bench.rate([], "generated", "generation_s") != bench.rate([], "generated", "generation_s")  # nan
