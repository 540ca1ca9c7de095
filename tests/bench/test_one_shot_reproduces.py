"""The seven one-shot strategies give the numbers of the driver before waves, to the digit.

tests/data/one_shot_golden.json holds per-repetition rows recorded with the one-shot step
driver of commit 36217c5 (before strategies acted in waves), on both shipped banks: with the
constant predictor (fast: the default suite) and with the warm embedding predictor (a small
bench; marked slow, as is the full default bench against docs/benchmarking.md's tables).
Today's driver runs the same strategies as :class:`trace_gym.allocation.waves.OneShot` through the
strategy boundary and must give every row exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_gym.bench.bank import BankSource, run_bank_bench
from trace_gym.commands.bank import bank_path
from trace_gym.bench.config import BankBenchConfig
from trace_gym.strategies import STRATEGIES, shaped_strategies

GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "data" / "one_shot_golden.json").read_text())
ONE_SHOT = ["uniform", "pcl", "random_tree", "trace", "trace_adaptive", "trace_root_only", "trace_prefix_only"]


def _replay(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The golden rows were recorded when one warm-up slice served every repetition; the slice
    # is drawn per repetition since (trace_gym.bench.bank.BankSource.split). What this test pins
    # is the step driver, so every repetition takes repetition 0's slice, as then.
    first = BankSource.split
    monkeypatch.setattr(BankSource, "split", lambda self, rep: first(self, 0))
    tag, bank = key.split("/")
    golden = GOLDEN[key]
    cfg = BankBenchConfig(bank=bank_path(bank), strategies=tuple(ONE_SHOT), **golden["config"])
    strategies = shaped_strategies(ONE_SHOT, group_size=cfg.group_size,
                                   continuations_per_root=cfg.continuations_per_root)
    results = run_bank_bench(cfg, strategies)
    assert results["violations"] == {}
    assert set(results["strategies"]) == set(golden["strategies"])
    for name, rows in golden["strategies"].items():
        got = results["strategies"][name]["per_rep"]
        for rep, (want, have) in enumerate(zip(rows, got)):
            for k, v in want.items():
                assert have[k] == v, (key, name, rep, k)


def test_the_built_in_one_shot_strategies_are_the_ones_pinned():
    assert all(not hasattr(STRATEGIES[n], "plan") for n in ONE_SHOT)


@pytest.mark.parametrize("key", [k for k in GOLDEN if k.startswith("const/")])
def test_one_shot_strategies_reproduce_the_old_driver_on_both_banks(key, monkeypatch):
    _replay(key, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("key", [k for k in GOLDEN if k.startswith("small/")])
def test_one_shot_strategies_reproduce_the_old_driver_with_the_warm_embedding_predictor(key, monkeypatch):
    _replay(key, monkeypatch)
