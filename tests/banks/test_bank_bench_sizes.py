"""``bench --bank`` on a bank smaller than its defaults assume (issue 41): with no size given
the bench is sized to the bank, in one line saying so; a size given that the bank cannot hold
is one line naming the largest that fit, and those do fit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from bank_fixtures import write_synthetic_bank

from baselines.uniform import fixed_groups
from trace_gym.bench.bank import largest_root_budget
from trace_gym.budget import nominal_cost
from trace_gym.cli import main

BENCH = ["predictor=constant", "seeds=1", "steps=1", "oracle_upper_bound=false"]


@pytest.fixture(scope="module")
def small_bank(tmp_path_factory):
    """Five prompts (one of them the default warm-up slice: a quarter, rounded down), R = 4."""
    return write_synthetic_bank(tmp_path_factory.mktemp("small") / "small.jsonl.gz", [1, 2, 3, 0, 4], roots=4,
                                continuations=2)


def bench(bank, tmp_path, capsys, *keys: str) -> tuple[int, list[str], dict | None]:
    out = tmp_path / "b.json"
    code = main(["bench", "--bank", str(bank), *BENCH, *keys, "--json", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "done, effective" not in line]
    return code, err, json.loads(out.read_text()) if code == 0 else None


def test_no_size_given_sizes_the_bench_to_a_small_bank(small_bank, tmp_path, capsys):
    code, err, results = bench(small_bank, tmp_path, capsys)
    assert code == 0, err
    said = [line for line in err if "sized to the bank" in line]
    assert len(said) == 1 and "has 5 prompts, warmup_prompts=1 of them held out" in said[0]
    assert "candidates=4, root_budget=8" in said[0]
    assert results["config"]["candidates"] == 4 and results["config"]["root_budget"] == 8
    assert results["bank"]["prompts"] == 5 and "uniform" in results["strategies"]


def test_sizes_given_that_do_not_fit_name_the_largest_that_fit(small_bank, tmp_path, capsys):
    code, err, _ = bench(small_bank, tmp_path, capsys, "candidates=64")
    assert code == 2 and len(err) == 1, err
    assert "candidates 64 exceed the 4 prompts left" in err[0] and "candidates=4, root_budget=8" in err[0]
    code, err, _ = bench(small_bank, tmp_path, capsys, "candidates=4", "root_budget=9")
    assert code == 2 and len(err) == 1, err  # refused before the bench starts, not by uniform mid-run
    assert "root_budget 9 (nominal budget 18) needs up to 5 groups of 4 per step for pcl, uniform" in err[0]
    assert "root_budget=8 fits these candidates" in err[0]
    code, err, results = bench(small_bank, tmp_path, capsys, "candidates=4", "root_budget=8")  # what it named
    assert code == 0 and not [line for line in err if "sized" in line], err
    # a size given stays as given; only the one left unset is sized
    code, err, results = bench(small_bank, tmp_path, capsys, "candidates=2")
    assert code == 0 and results["config"]["candidates"] == 2 and results["config"]["root_budget"] == 4
    (said,) = [line for line in err if "sized to the bank" in line]
    assert said.endswith("held out): root_budget=4 (set candidates= and root_budget= to choose)"), said


def test_largest_root_budget_against_fixed_groups_by_brute_force():
    for candidates in range(1, 7):
        for group_size in range(2, 6):
            for n in range(0, 4):
                fits = [m for m in range(2, 80) if _fits(m, n, group_size, candidates)]
                assert largest_root_budget(candidates, group_size, n) == (max(fits) if fits else 1)
                assert fits == list(range(2, 2 + len(fits)))  # fitting is monotone in M


def _fits(m: int, n: int, group_size: int, candidates: int) -> bool:
    try:
        fixed_groups(np.arange(candidates), math.floor(nominal_cost(m, n) + 1e-9), group_size, candidates)
    except ValueError:
        return False
    return True
