"""The bank bench measures the steady state, fairly: every predictor-driven arm starts from one
predictor warmed up on a held-out slice of the bank (disjoint from every measured pool, the same
for every arm, printed), and every arm reports its per-step curve and its predictor's quality."""

from __future__ import annotations

import numpy as np
import pytest
from bank_fixtures import write_synthetic_bank

from trace_gym.banks import open_bank
from trace_gym.banks.warmup import held_out_prompts, warm_up
from trace_gym.bench.bank import BankSource, run_bank_bench
from trace_gym.bench.config import BankBenchConfig
from trace_gym.bench.report import format_bench
from trace_gym.predictor.kinds import ConstantPredictor, Context
from trace_gym.strategies import shaped_strategies


@pytest.fixture(scope="module")
def bank_path(tmp_path_factory):
    successes = np.random.default_rng(4).integers(0, 9, size=48)
    return write_synthetic_bank(tmp_path_factory.mktemp("b") / "b.jsonl.gz", successes, roots=8, continuations=4)


def test_the_warmup_slice_is_disjoint_from_every_measured_pool(bank_path):
    cfg = BankBenchConfig(bank=str(bank_path), seeds=4, steps=3, candidates=12, warmup_prompts=12, predictor="constant")
    source = BankSource(cfg)
    held = set(source.held_out)
    assert len(held) == 12 and held == set(held_out_prompts(48, 12, cfg.seed))
    assert len(BankSource(BankBenchConfig(bank=str(bank_path), candidates=12)).held_out) == 12  # default: a quarter
    slices = []
    for rep in range(cfg.seeds):
        repetition = source.repetition(rep)
        held = set(repetition.held_out)
        assert len(held) == 12 and held == set(held_out_prompts(48, 12, repetition.seed))
        assert all(not held & set(pool) for pool in repetition.pools)  # no measured pool draws a held-out prompt
        assert len({i for pool in repetition.pools for i in pool}) == 36  # one pass over the 36 measurable prompts
        slices.append(frozenset(held))
    assert len(set(slices)) == cfg.seeds  # a slice per repetition: the interval covers its choice
    assert held_out_prompts(48, 12, 1) != held_out_prompts(48, 12, 0)  # seeded by the bench's seed
    with pytest.raises(ValueError, match="warmup_prompts must lie in"):
        BankSource(BankBenchConfig(bank=str(bank_path), warmup_prompts=48, candidates=4))


class Recording(ConstantPredictor):
    """A constant predictor that records what it trained on (what a warm-up fed it)."""

    def __init__(self, seed: int = 0):
        super().__init__(0.5)
        self.seen: list[str] = []

    def update(self, contexts, targets, weights=None):
        self.seen += [c.prompt for c in contexts if c.depth == 0]
        return super().update(contexts, targets, weights)


def test_warm_up_reads_every_recorded_rollout_of_the_slice_and_nothing_else(bank_path):
    bank = open_bank(bank_path)
    predictor = Recording()
    stats = warm_up(predictor, bank, [3, 5, 7], seed=0, prefix_share=0.06, batch=2)
    assert stats["prompts"] == 3 and stats["updates"] == 2 and stats["roots"] == 3 * 8
    assert sorted(set(predictor.seen)) == sorted(bank.prompt(i).prompt for i in (3, 5, 7))
    assert stats["continuations"] > 0  # the recorded prefixes' continuations too


def test_every_arm_starts_from_the_same_warm_predictor_and_the_report_says_so(bank_path, monkeypatch):
    from trace_gym.bench import bank as bench_bank

    starts = []
    original = bench_bank.BankRepetition.predictor

    def spy(self, arm):
        state = original(self, arm)
        if arm.predictor != bench_bank.ORACLE:
            starts.append((self.rep, arm.name, state.predict_head(
                [Context(self.source.bank.prompt(i).prompt) for i in range(6)]).tolist()))
        return state

    monkeypatch.setattr(bench_bank.BankRepetition, "predictor", spy)
    cfg = BankBenchConfig(bank=str(bank_path), seeds=2, steps=2, candidates=12, root_budget=8, warmup_prompts=12,
                          strategies=("uniform", "pcl", "trace", "trace_adaptive"))
    res = run_bank_bench(cfg, shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                                                continuations_per_root=cfg.continuations_per_root))
    for rep in (0, 1):
        first = [values for r, _, values in starts if r == rep]
        assert len(first) == 4 and all(v == first[0] for v in first)  # identical for every arm
        assert first[0] != [0.5] * 6  # and warm: it learned from the held-out slice
    printed = format_bench(res)
    assert "Warm-up: every learned predictor first trained on 12 held-out prompts" in printed
    assert res["warmup"]["indices"] == sorted(res["warmup"]["indices"]) and len(res["warmup"]["indices"]) == 12
    # every arm: the per-step curve, the quality measures and both headline metrics
    for name, row in res["strategies"].items():
        assert len(row["by_step"]) == 2 and {"mixed_auc", "brier", "level_error", "prompt_spearman"} <= set(row)
        assert {"effective_ratio", "mixed_prompts", "mixed_per_1k_tokens"} <= set(row["by_step"][0])
    assert "Per-step curve" in printed and "Predictor quality where it is used" in printed
    assert "trace_adaptive - uniform" in printed


def test_the_calibration_target_averages_the_benchs_warm_up_slices(bank_path):
    from trace_gym.banks.warmup import mean_steady_state_quality, repetition_seed, steady_state_quality

    bank = open_bank(bank_path)
    source = BankSource(BankBenchConfig(bank=str(bank_path), seeds=3, candidates=12, warmup_prompts=12))
    assert [source.repetition(r).seed for r in range(3)] == [repetition_seed(0, r) for r in range(3)]
    kw = dict(prefix_share=0.06, group_size=4)
    each = [steady_state_quality(ConstantPredictor(0.3), bank, 12, seed=repetition_seed(0, r), **kw) for r in range(3)]
    mean = mean_steady_state_quality(lambda: ConstantPredictor(0.3), bank, 12, seed=0, repetitions=3, **kw)
    assert mean["slices"] == 3
    assert mean["level_error"] == pytest.approx(np.mean([e["level_error"] for e in each]))
    assert len({round(e["level_error"], 9) for e in each}) == 3  # each slice measures other prompts
