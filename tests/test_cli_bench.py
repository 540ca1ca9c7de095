"""`trace-gym bench --sim` and `trace-gym envs`: the done-when on a small fast config."""

from __future__ import annotations

import json
import math

import pytest

from trace_gym import cli
from trace_gym.cli import SimBenchConfig, bench_checks, run_sim_bench

SMALL = dict(seeds=2, steps=3, warmup_steps=1, pool_size=1024, candidates=128, root_budget=128)
SMALL_FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]


@pytest.fixture(scope="module")
def results():
    return run_sim_bench(SimBenchConfig(**SMALL))


def test_done_when_holds_on_the_small_config(results):
    eff = {name: s["effective_ratio"] for name, s in results["strategies"].items()}
    assert eff["trace"] >= 2 * eff["uniform"]
    for ablation in ("trace_root_only", "trace_prefix_only"):
        assert eff["uniform"] < eff[ablation] < eff["trace"]
    assert eff["random_tree"] < eff["trace"]
    assert math.isfinite(eff["trace_learned"])
    assert [c["status"] for c in results["checks"]] == ["PASS"] * 6
    # uniform groups of 8 sit near the calibrated 27 %
    assert eff["uniform"] == pytest.approx(0.27, abs=0.08)


def test_equal_nominal_budget_and_exact_units(results):
    budget = SMALL["root_budget"] * 2  # M (1 + N/2) with N = 2
    assert results["nominal_budget"] == budget
    s = results["strategies"]
    for name, entry in s.items():
        assert entry["nominal_cost"] == budget, name
        assert entry["env_steps"] > 0 and entry["generated_tokens"] > 0 and entry["prefill_tokens"] > 0
        assert entry["allocator_ms"] >= 0 and len(entry["per_seed"]) == SMALL["seeds"]
    assert (s["uniform"]["rollouts"], s["uniform"]["continuations"]) == (budget, 0)
    assert (s["trace"]["rollouts"], s["trace"]["continuations"]) == (128, 256)
    assert s["uniform"]["distinct_prompts"] == budget / 8
    assert s["trace"]["prompt_spearman"] == pytest.approx(1.0)
    assert s["trace"]["prefix_spearman"] == pytest.approx(1.0)
    assert 0 < s["trace_learned"]["prefix_spearman"] <= 1
    assert "1" in s["trace_learned"]["per_seed"][0]["prefix_spearman_by_depth"]
    # contrast pairs below the root exist only for tree strategies
    assert set(s["uniform"]["contrast_pairs_by_depth"]) == {"0"}
    assert any(int(d) > 0 for d in s["trace"]["contrast_pairs_by_depth"])


def test_root_allocation_demo_follows_the_method_page(results):
    demo = results["root_allocation_demo"]
    assert demo["values"] == [0.99, 0.9, 0.5, 0.5, 0.15, 0.02]
    alloc = dict(zip(demo["budgets"], demo["allocations"]))
    assert all(sum(m) == b for b, m in alloc.items())
    assert alloc[4] == [0, 0, 2, 2, 0, 0]  # tight budget: only the 0.5 prompts
    assert all(m[0] == 0 for m in alloc.values())  # 0.99 never worth it in this range
    assert alloc[64][2] <= 7 and alloc[64][1] > alloc[64][2]  # 0.5s saturate; 0.9 takes more
    assert alloc[32][5] == 0 and alloc[64][5] > 0  # 0.02 only near the top of the range


def test_checks_fail_and_skip_when_they_should():
    fake = {
        "nominal_budget": 10.0,
        "strategies": {
            "uniform": {"effective_ratio": 0.3, "nominal_cost": 10.0},
            "trace": {"effective_ratio": 0.5, "nominal_cost": 9.0},
        },
    }
    status = {c["name"]: c["status"] for c in bench_checks(fake)}
    assert status["trace effective ratio >= 2x uniform"] == "FAIL"
    assert status["trace_learned reported"] == "SKIP"
    assert status["equal nominal budget"] == "FAIL"


def test_cli_bench_writes_json_and_plots(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    rc = cli.main(["bench", "--sim", *SMALL_FLAGS, "--seeds=1", "--strategies=uniform,trace",
                   "--json", str(out_json), "--out", str(tmp_path / "plots"), "--strict"])  # fmt: skip
    printed = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert set(data["strategies"]) == {"uniform", "trace"}
    assert isinstance(data["strategies"]["trace"]["effective_ratio"], float)
    assert data["strategies"]["trace"]["nominal_cost"] == 256.0
    assert data["config"]["seeds"] == 1
    assert "| trace " in printed and "PASS: trace effective ratio >= 2x uniform" in printed
    assert "SKIP: trace_root_only between uniform and trace" in printed
    assert "Root allocation demo" in printed
    for name in ("effective_ratio.png", "contrast_pairs_by_depth.png", "root_allocation.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    assert rc == 0


def test_config_from_yaml_and_flags(tmp_path):
    path = tmp_path / "bench.yaml"
    path.write_text("seeds: 4\nroot_budget: 64\nstrategies: [uniform, pcl]\n")
    args = cli.build_parser(["bench"]).parse_args(["bench", "--sim", "--config", str(path), "--root-budget", "32"])
    cfg = cli.config_from_args(args)
    assert (cfg.seeds, cfg.root_budget, cfg.strategies) == (4, 32, ("uniform", "pcl"))
    assert cfg.nominal_budget == 64
    path.write_text("sedes: 4\n")
    with pytest.raises(ValueError, match="unknown bench config keys \\['sedes'\\]"):
        cli.config_from_args(cli.build_parser(["bench"]).parse_args(["bench", "--config", str(path)]))
    with pytest.raises(ValueError, match="warmup_steps"):
        SimBenchConfig(steps=2, warmup_steps=2)
    with pytest.raises(ValueError, match="unknown strategies \\['nope'\\]"):
        run_sim_bench(SimBenchConfig(**SMALL, strategies=("nope",)))


def test_adding_a_strategy_is_one_entry(monkeypatch):
    from baselines import UniformRootAllocator
    from trace_gym import strategies
    from trace_gym.allocation import TracePrefixAllocator

    entry = strategies.Strategy(UniformRootAllocator(4), TracePrefixAllocator(), 2, description="mine")
    monkeypatch.setitem(strategies.STRATEGIES, "my_tree", entry)
    res = run_sim_bench(SimBenchConfig(**{**SMALL, "seeds": 1, "steps": 2}, strategies=("my_tree",)))
    assert res["strategies"]["my_tree"]["nominal_cost"] == 256
    assert res["strategies"]["my_tree"]["description"] == "mine"


def test_bench_without_sim_and_envs(capsys):
    assert cli.main(["bench"]) == 2
    assert "--sim" in capsys.readouterr().err
    assert cli.main(["envs"]) == 0
    assert "trace_gym/GuessNumber-v0" in capsys.readouterr().out.split()


def test_shipped_yaml_matches_the_defaults():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "configs" / "bench_sim.yaml"
    args = cli.build_parser(["bench"]).parse_args(["bench", "--sim", "--config", str(path)])
    assert cli.config_from_args(args) == SimBenchConfig()


def test_noisy_predictor_mode_runs():
    res = run_sim_bench(SimBenchConfig(**{**SMALL, "seeds": 1, "steps": 2}, predictor="noisy",
                                       noisy_spearman=0.7, strategies=("pcl", "trace")))  # fmt: skip
    assert 0.4 < res["strategies"]["trace"]["prompt_spearman"] < 0.95
