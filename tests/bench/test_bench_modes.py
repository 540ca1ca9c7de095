"""Bench modes are one table: a mode registered through it gets its flag, its keys, its run and its
report from the command line, with no edit to the command."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from dataclasses import dataclass, field

import pytest

from trace_gym import cli
from trace_gym.bench.modes import BENCH_SOURCES, BenchMode, bench_mode, register_bench_mode
from trace_gym.config import doc
from trace_gym.bench.config import SimBenchConfig


@dataclass(frozen=True)
class CoinBenchConfig(SimBenchConfig):
    """A throwaway mode: the simulator under another name, with one key of its own."""

    coin: str = field(default="", metadata=doc("a label the throwaway mode writes into its results"))


def _run(cfg, strategies, *, progress=False, say=None, out_dir=None):
    from trace_gym.bench.sim import run_sim_bench

    results = run_sim_bench(SimBenchConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(SimBenchConfig)}),
                            strategies)
    results["mode"] = "coin"
    results["config"]["coin"] = cfg.coin
    return results


def _intro(results):
    return [f"## Coin bench ({results['config']['coin']})", ""]


@pytest.fixture
def coin_mode(monkeypatch):
    module = types.ModuleType("coin_bench_mode")
    module.MODE = BenchMode("coin", CoinBenchConfig, _run, _intro, "a throwaway mode", value="coin", metavar="LABEL",
                            columns=(("Spearman prefix", "prefix_spearman"),), verdict_label="coins")
    monkeypatch.setitem(sys.modules, "coin_bench_mode", module)
    monkeypatch.setattr("trace_gym.bench.modes.BENCH_SOURCES", dict(BENCH_SOURCES))
    register_bench_mode("coin", "coin_bench_mode:MODE")
    return module.MODE


def test_a_mode_registered_through_the_table_runs_from_the_command_line(coin_mode, tmp_path, capsys):
    out = tmp_path / "coin.json"
    rc = cli.main(["bench", "--coin", "heads", "seeds=1", "steps=2", "pool_size=256", "candidates=64",
                   "root_budget=32", "strategies=uniform,trace", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert printed.startswith("## Coin bench (heads)") and "**Verdict (coins):**" in printed
    assert "Spearman prefix" in printed and "| trace " in printed
    assert json.loads(out.read_text())["config"]["coin"] == "heads"
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["bench"].format_help()
    assert "--coin LABEL" in help_text and "a throwaway mode" in help_text


def test_the_table_refuses_a_taken_name_and_a_target_that_is_not_a_mode(monkeypatch):
    monkeypatch.setattr("trace_gym.bench.modes.BENCH_SOURCES", dict(BENCH_SOURCES))
    with pytest.raises(ValueError, match="bench mode 'sim' is taken"):
        register_bench_mode("sim", "elsewhere:MODE")
    register_bench_mode("fake", "trace_gym.bench.sim:MODE")  # a BenchMode, but named "sim"
    with pytest.raises(ValueError, match="is not a BenchMode named 'fake'"):
        bench_mode("fake")
    with pytest.raises(ValueError, match="unknown bench mode 'nope'"):
        bench_mode("nope")


def test_a_config_that_names_its_bank_is_a_bank_bench_and_a_bank_override_wins(tmp_path, capsys):
    import json

    from trace_gym import cli

    cfg = tmp_path / "zoo.yaml"
    cfg.write_text("bank: math_python_smollm2\nseeds: 1\nsteps: 1\ncandidates: 16\nroot_budget: 8\n"
                   "strategies: [uniform]\npredictor: constant\nwarmup_prompts: 16\noracle_upper_bound: false\n")
    for extra, bank in (([], "math_python_smollm2"), (["bank=guess_number_smollm2"], "guess_number_smollm2")):
        out = tmp_path / f"{bank}.json"
        assert cli.main(["bench", "--config", str(cfg), *extra, "--json", str(out)]) == 0
        assert json.loads(out.read_text())["bank"]["path"].endswith(f"{bank}.jsonl.gz")
    cfg.write_text("seeds: 1\n")  # no bank named, no mode flag: one line naming the choices
    assert cli.main(["bench", "--config", str(cfg)]) == 2
    assert "give exactly one of --sim, --env" in capsys.readouterr().err
