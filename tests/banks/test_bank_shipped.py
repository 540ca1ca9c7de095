"""The shipped rollout banks: listed, intact, recorded as their configs say, and large
enough for the default bank bench (no strategy runs out of recorded outcomes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trace_gym import cli
from trace_gym.banks import bank_stats, list_banks, open_bank
from trace_gym.commands.bank import SHIPPED

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_BANKS = ("math_python_smollm2", "guess_number_smollm2", "wiki_qa_smollm2", "math_python_smollm2_deep",
                 "math_python_smollm2_shape")
#: Banks closed before their planned count (`bank close`), and the prompts each must still hold: the
#: zoo's deep bank 192, the budget-shape bank 64 (benchmarks/budget_shape.py sizes its bench to 69).
CLOSED_EARLY_MIN = {"math_python_smollm2_deep": 192, "math_python_smollm2_shape": 64}


def test_bank_list_shows_the_shipped_banks_complete(capsys):
    assert cli.main(["bank", "list"]) == 0
    printed = capsys.readouterr().out
    for name in SHIPPED_BANKS:
        assert f"{name}.jsonl.gz" in printed
    rows = {Path(r["path"]).name: r for r in list_banks(SHIPPED)}
    assert all(rows[f"{n}.jsonl.gz"]["complete"] for n in SHIPPED_BANKS)


@pytest.mark.parametrize("name", SHIPPED_BANKS)
def test_a_shipped_bank_is_intact_and_matches_its_recording_config(name):
    path = SHIPPED / f"{name}.jsonl.gz"
    assert path.stat().st_size < 20 * 2**20  # at most 20 MB each
    bank = open_bank(path)  # verifies the checksum
    cfg = yaml.safe_load((ROOT / "configs" / "banks" / f"{name}.yaml").read_text())
    manifest = bank.manifest
    footer = bank.scan.footer
    if footer.get("closed_early"):  # recorded until its time ran out (`bank close`): the planned count is kept
        assert footer["tasks"] == cfg["prompts"] > len(bank) >= CLOSED_EARLY_MIN[name]
    else:
        assert len(bank) == cfg["prompts"] >= 128
    assert (manifest["roots"], manifest["continuations"]) == (cfg["roots"], cfg["continuations"])
    assert manifest["roots"] >= 8 and manifest["continuations"] >= 4
    assert manifest["policy"] == "smollm2-135m" and manifest["weights_sha256"]
    stats = bank_stats(path, verify=False)
    # mixed outcomes: at least the share a bank needs (issue 45: 10 % of groups of 8)
    assert 0 < stats["success_rate"]["mean"] < 1 and stats["success_rate"]["mixed"] >= 0.10
    assert stats["prefixes"] > 0 and stats["continuations"] > 0  # it visits prefixes


#: The bench shape the main job runs on each shipped bank (the Makefile's demo): the guessing
#: game's 4-turn roots ask for more than K = 4 continuations at a prefix with N = 2; the QA bank's 96
#: measured prompts hold 3 steps of 32 candidates without drawing a prompt twice (64 run out).
DEMO_SHAPE = {"math_python_smollm2": [], "guess_number_smollm2": ["continuations_per_root=1"],
              "wiki_qa_smollm2": ["candidates=32"], "math_python_smollm2_deep": ["--config", str(ROOT / "configs" / "bench_zoo.yaml")],
              "math_python_smollm2_shape": ["warmup_prompts=15", "candidates=18", "steps=3", "root_budget=8",
                                            "continuations_per_root=6", "strategies=random_tree,trace"]}


# the guess and QA banks replay MiniLM over new histories (~30 s): behind -m slow; make demo runs the guess bank
@pytest.mark.parametrize("name", [SHIPPED_BANKS[0], *(pytest.param(n, marks=pytest.mark.slow) for n in SHIPPED_BANKS[1:])])
def test_the_demo_bank_bench_fits_in_each_shipped_bank(name, tmp_path, capsys):
    import json

    out = tmp_path / "r.json"
    assert cli.main(["bench", "--bank", name, "seeds=2", *DEMO_SHAPE[name], "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    guard = next(c for c in results["checks"] if c["name"].startswith("bank large enough"))
    assert guard["status"] == "PASS", guard["detail"]
    assert not results["verdict"].startswith("NO VERDICT")
    assert "**Verdict (real rollouts):**" in capsys.readouterr().out


def test_bank_list_names_each_bank_once_with_its_recording_time(capsys):
    assert cli.main(["bank", "list", str(SHIPPED), str(SHIPPED.relative_to(ROOT))]) == 0
    printed, listed = capsys.readouterr().out, list_banks(SHIPPED)
    for name in SHIPPED_BANKS:
        lines = [line for line in printed.splitlines() if f"{name}.jsonl.gz" in line]
        row = next(r for r in listed if Path(r["path"]).name == f"{name}.jsonl.gz")
        cells = [cell.strip() for cell in lines[0].split("|")] if len(lines) == 1 else []
        assert f"{row['seconds'] / 60:.0f} min ({row['runs']} run(s))" in cells, lines


@pytest.mark.slow  # the zoo bench as docs/strategies.md runs it (10 repetitions: fewer leave random tree
# too few repetitions that reach the tokens-to-target mark for an interval): about two minutes
def test_the_zoo_bench_ranks_every_arm_on_the_deep_bank_and_none_runs_out(tmp_path):
    import json

    from trace_gym.strategies import STRATEGIES

    out = tmp_path / "zoo.json"
    assert cli.main(["bench", "--config", str(ROOT / "configs" / "bench_zoo.yaml"), "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["config"]["epochs"] == 2 and Path(results["bank"]["path"]).name == "math_python_smollm2_deep.jsonl.gz"
    assert results["violations"] == {}
    for name in STRATEGIES:  # no arm refused a rollout for exhaustion, every arm ranked
        assert results["strategies"][name]["exhausted_share"] == 0.0, name
    ranked = {e["arm"] for e in results["ranking"]["rows"]}
    assert ranked == set(STRATEGIES)
    for pair in results["ranking"]["paired"]:  # paired intervals on both headline metrics and budget-to-target
        assert pair["b"] in ("uniform", "trace")
        for key in ("effective_ratio", "mixed_prompts", "tokens_to_target"):
            assert pair[key] is not None and pair[key]["low"] <= pair[key]["high"], (pair["a"], pair["b"], key)
    assert {p["a"] for p in results["ranking"]["paired"]} | {"uniform"} == set(STRATEGIES)
