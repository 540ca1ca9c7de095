"""``bench --bank`` with the embedding cache (trace_gym/predictor/embeddings.py): the same results with
and without it, whether the cache is empty or full, kept under the trace_gym cache folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from bank_fixtures import write_synthetic_bank

from trace_gym.predictor import embeddings
from trace_gym.bench.bank import run_bank_bench
from trace_gym.bench.config import BankBenchConfig
from trace_gym.strategies import shaped_strategies

#: Result keys that are timings, and the cache's own report: all that may differ between the runs.
NOT_COMPARED = {"seconds", "allocator_ms", "allocator_ms_ci", "embedding_cache"}


def _compared(value):
    if isinstance(value, dict):
        return {k: _compared(v) for k, v in value.items() if k not in NOT_COMPARED}
    if isinstance(value, list):
        return [_compared(v) for v in value]
    return value


def test_a_bank_bench_gives_the_same_results_with_and_without_the_embedding_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    successes = np.random.default_rng(3).integers(0, 9, size=24)
    path = write_synthetic_bank(tmp_path / "bank" / "b.jsonl.gz", successes, roots=8, continuations=4, turns=4,
                                cap=2)

    def bench(cache: bool) -> dict:
        embeddings.clear_caches()  # each run starts from what a fresh process has
        cfg = BankBenchConfig(bank=str(path), predictor="embedding", seeds=1, steps=2, candidates=8, root_budget=4,
                              warmup_prompts=4, strategies=("uniform", "trace"),
                              embedding_cache=cache)
        return run_bank_bench(cfg, shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                                                     continuations_per_root=cfg.continuations_per_root))

    off, cold, warm = bench(False), bench(True), bench(True)
    assert off["embedding_cache"] is None
    computed = cold["embedding_cache"]["calls_computed"]
    assert computed > 0 and cold["embedding_cache"]["calls_read"] == 0
    assert warm["embedding_cache"] | {"folder": ""} == {"folder": "", "calls_read": computed, "calls_computed": 0,
                                                         "files_rejected": 0}
    assert _compared(cold) == _compared(off) and _compared(warm) == _compared(off)
    assert off["strategies"]["trace"]["per_rep"][0]["by_step"][0]["value_spread"] > 0  # the predictor's values reached the results
    folder = Path(cold["embedding_cache"]["folder"])
    assert folder.is_relative_to(tmp_path / "cache" / "embeddings") and list(folder.rglob("*.npy"))
    assert sorted(p.name for p in (tmp_path / "bank").iterdir()) == ["b.jsonl.gz"]  # nothing beside the bank
