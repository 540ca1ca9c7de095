"""The ranked table's measures by hand, ranks with ties and missing values, pairing two bench
results after the fact, and the bank bench's epochs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from trace_gym.bench.loop import effective_samples, tokens_to_target
from trace_gym.bench.pair import merge_benches, pair_bench_files
from trace_gym.bench.rank import _ranks, ranking
from trace_gym.budget import BudgetLedger
from trace_gym.tree import ROOT, RolloutTree


def _step(progress, tokens):
    ledger = BudgetLedger()
    ledger.add_tokens(generated=tokens, prefill=0)
    return SimpleNamespace(progress=progress, ledger=ledger)


def test_tokens_to_target_counts_waves_then_steps():
    # step 1: after wave 1, 100 tokens and 1 mixed; after wave 2, 250 tokens and 3 mixed (the step's 300 in all)
    # step 2: 2 mixed after its one wave of 120 tokens. A target of 5 is reached in step 2: 300 + 120
    steps = [_step([(100, 1), (250, 3)], 300), _step([(120, 2)], 120)]
    assert tokens_to_target(steps, 3) == 250
    assert tokens_to_target(steps, 1) == 100
    assert tokens_to_target(steps, 5) == 420
    assert math.isnan(tokens_to_target(steps, 6))  # never collected: NaN, not the total


def test_effective_samples_counts_roots_as_one_and_continuations_as_half():
    tree = RolloutTree(task_id="t")
    leaves = []
    for reward in (1.0, 0.0, 0.0):  # three roots of two turns each
        b = tree.start_branch(ROOT)
        mid = tree.add_turn(ROOT, branch=b, text="a")
        leaves.append(tree.add_turn(mid, branch=b, text="b", reward=reward, terminal=True))
    first_prefix = tree.nodes[leaves[0]].parent
    for reward in (0.0, 1.0):  # two continuations from the first root's prefix
        b = tree.start_branch(first_prefix)
        tree.add_turn(first_prefix, branch=b, text="c", reward=reward, terminal=True)
    assert effective_samples(tree) == 3 + 2 / 2


def test_ranks_share_ties_and_put_missing_last():
    values = {"a": 0.5, "b": 0.7, "c": 0.5, "d": math.nan}
    assert _ranks(values, higher=True) == {"b": 1, "a": 2.5, "c": 2.5, "d": 4}
    assert _ranks({"a": 10.0, "b": 5.0, "c": math.nan}, higher=False) == {"b": 1, "a": 2, "c": 3}


def _row(values, predictor="learned"):
    keys = ("effective_ratio", "mixed_prompts", "tokens_to_target", "effective_samples_per_unit")
    per_rep = [{**{k: v[i] for k, v in zip(keys, values)}, "mixed_per_1k_tokens": values[1][i]}
               for i in range(len(values[0]))]
    mean = {k: sum(x[k] for x in per_rep) / len(per_rep) for k in (*keys, "mixed_per_1k_tokens")}
    return {**mean, **{k + "_ci": 0.0 for k in keys}, "per_rep": per_rep, "upper_bound": False,
            "predictor": predictor, "generated_tokens": 1000.0, "waves_per_step": 1.0, "nominal_cost": 16.0}


def _results(**rows):
    return {"mode": "bank", "config": {"seeds": 3, "seed": 0, "steps": 3, "mixed_groups_target": 8},
            "bank": {"sha256": "x"}, "nominal_budget": 16.0, "strategies": rows}


def test_ranking_pairs_every_arm_with_uniform_and_trace_and_drops_unreached_repetitions():
    results = _results(
        uniform=_row([[0.3, 0.32, 0.31], [3, 3, 3], [900, 1000, math.nan], [0.3, 0.32, 0.31]]),
        trace=_row([[0.6, 0.62, 0.61], [5, 5, 6], [500, 550, 600], [0.6, 0.6, 0.6]]),
        mine=_row([[0.5, 0.5, 0.52], [6, 6, 6], [400, 450, 500], [0.9, 0.9, 0.92]], "beta"),
    )
    rank = ranking(results)
    assert [e["arm"] for e in rank["rows"]] == ["mine", "trace", "uniform"]  # mean ranks 1.25, 1.75, 3
    by = {e["arm"]: e for e in rank["rows"]}
    assert by["mine"]["ranks"] == {"effective_ratio": 2, "mixed_prompts": 1, "tokens_to_target": 1,
                                   "effective_samples_per_unit": 1}
    pairs = {(p["a"], p["b"]): p for p in rank["paired"]}
    assert set(pairs) == {("trace", "uniform"), ("mine", "uniform"), ("mine", "trace")}
    reach = pairs[("mine", "uniform")]["tokens_to_target"]
    assert reach["dropped"] == 1 and reach["n"] == 2 and reach["difference"] == pytest.approx(-525.0)


def test_two_bench_results_pair_after_the_fact_and_different_draws_are_refused(tmp_path):
    a = _results(uniform=_row([[0.3, 0.32, 0.31], [3, 3, 3], [900, 1000, 950], [0.3, 0.32, 0.31]]))
    b = _results(mine=_row([[0.5, 0.5, 0.52], [6, 6, 6], [400, 450, 500], [0.9, 0.9, 0.92]]))
    for name, data in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    paired = pair_bench_files([tmp_path / "a.json", tmp_path / "b.json"])
    assert set(paired["strategies"]) == {"uniform", "mine"}
    assert {(p["a"], p["b"]) for p in paired["paired"]} == {("mine", "uniform")}
    other = {**b, "config": {**b["config"], "seeds": 5}}
    with pytest.raises(ValueError, match="drew different repetitions \\(seeds 3 vs 5\\)"):
        merge_benches([a, other], ["a", "b"])
    (tmp_path / "c.json").write_text(json.dumps(other))
    out = subprocess.run([sys.executable, "-m", "trace_gym.cli", "compare", str(tmp_path / "a.json"),
                          str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "drew different repetitions" in out.stderr and "Traceback" not in out.stderr


def test_epochs_revisit_every_measured_prompt():
    from trace_gym.bench.bank import BankSource
    from trace_gym.commands.bank import bank_path
    from trace_gym.bench.config import BankBenchConfig

    cfg = BankBenchConfig(bank=bank_path("math_python_smollm2"), epochs=2, candidates=64, root_budget=16)
    source = BankSource(cfg)
    assert len(source.measurable) == 192 and source.steps == math.ceil(2 * 192 / 64) == 6
    rep = source.repetition(0)
    seen = [i for step in range(source.steps) for i in rep.pools[step]]
    assert sorted(seen) == sorted(source.measurable * 2)  # each measured prompt exactly twice
    with pytest.raises(ValueError, match=r"epochs: expected an int in \[0, 1000\], got -1"):
        BankBenchConfig(epochs=-1)
