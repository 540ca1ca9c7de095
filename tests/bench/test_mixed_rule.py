"""What "mixed" means for continuous rewards (issue 45, item 3): the success line and the
reward spread agree on 0/1 rewards, differ on a planted continuous group, and a bench counts
by the rule it was given, everywhere (effective ratio, mixed per step, the predictor truth)."""

from __future__ import annotations

import json
import math

import pytest
from bank_fixtures import synthetic_record

from trace_gym.bench.loop import tree_metrics
from trace_gym.budget import BudgetLedger
from trace_gym.cli import main
from trace_gym.step.mixed import MixedRule
from trace_gym.tree import RolloutTree

THRESHOLD, SPREAD = MixedRule("threshold"), MixedRule("spread", 0.0)


def tree_of(rewards) -> RolloutTree:
    """A one-turn tree whose root rollouts end with ``rewards``."""
    tree = RolloutTree("t")
    for r in rewards:
        tree.add_turn(0, branch=tree.start_branch(0), reward=r, terminal=True)
    return tree


@pytest.mark.parametrize("rewards, mixed", [([1, 0, 0, 1], True), ([0, 0, 0], False), ([1, 1], False),
                                            ([1, 0, 0, 0, 0, 0, 0, 0], True), ([1], False)])
def test_both_rules_agree_on_binary_groups(rewards, mixed):
    for rule in (THRESHOLD, SPREAD, MixedRule("spread", 0.5), MixedRule("spread", 0.99)):
        assert rule.group(rewards) is mixed, (rule, rewards)
        assert rule.tree(tree_of(rewards)) is mixed


def test_the_rules_differ_on_a_planted_continuous_group():
    # F1 0.2 and 0.4: two failures by the success line, a spread of 0.2
    assert not THRESHOLD.group([0.2, 0.4]) and SPREAD.group([0.2, 0.4]) and MixedRule("spread", 0.1).group([0.2, 0.4])
    assert not MixedRule("spread", 0.2).group([0.2, 0.4])  # the spread must *exceed* the line
    # 0.45 and 0.55: a success and a failure, but a spread of only 0.1
    assert THRESHOLD.group([0.45, 0.55]) and not MixedRule("spread", 0.25).group([0.45, 0.55])
    assert not SPREAD.group([0.3, 0.3, 0.3])  # all equal: pure by both (zero std)


def test_the_spread_is_the_range_so_group_size_does_not_move_the_line():
    """One success among n has range 1 at every n; its std (0.5, 0.33, 0.17 at n = 2, 8, 32) would
    cross a std line of 0.3 as the group grows."""
    for n in (2, 8, 32):
        assert MixedRule("spread", 0.3).group([1.0] + [0.0] * (n - 1))


def test_bench_metrics_count_by_the_rule():
    trees = [tree_of([0.2, 0.4]), tree_of([0.45, 0.55]), tree_of([0.0, 0.0]), tree_of([1.0, 0.0])]
    ledger = BudgetLedger()
    by_line = tree_metrics(trees, ledger, steps=2, mixed_rule=THRESHOLD)
    by_spread = tree_metrics(trees, ledger, steps=2, mixed_rule=MixedRule("spread", 0.15))
    assert by_line["effective_ratio"] == 0.5 and by_line["mixed_prompts"] == 1.0  # trees 2 and 4, over 2 steps
    assert by_spread["effective_ratio"] == 0.5 and by_spread["mixed_prompts"] == 1.0  # trees 1 and 4
    assert tree_metrics(trees, ledger, 2, MixedRule("spread", 0.0))["effective_ratio"] == 0.75


def continuous_bank(path, prompts: int = 12):
    """A bank whose every prompt's 8 one-turn roots end with F1 0.10, 0.15, ..., 0.45: all below
    the success line (pure by it) and all different (mixed by any spread below 0.05)."""
    from trace_gym.banks.writer import BankWriter

    manifest = {"policy": "synthetic", "policy_path": None, "weights_sha256": None, "env_id": "synthetic",
                "env_kwargs": {}, "seed": 0, "prompts": prompts, "roots": 8, "continuations": 0,
                "max_prefixes_per_root": None, "sampling": {}, "agent": {}, "command": ["synthetic"],
                "created_at": 0.0}
    writer = BankWriter(path, manifest)
    writer.start_run(["synthetic"])
    for i in range(prompts):
        record = synthetic_record(i, 0, roots=8, continuations=0, turns=1)
        for j, root in enumerate(record["roots"]):
            root["reward"] = 0.10 + 0.05 * j
        writer.add(record | {"run": 0, "written_at": 0.0})
    writer.finish()
    return path


@pytest.mark.parametrize("keys, rule, ratio", [
    ((), THRESHOLD, 0.0), (("mixed_rule=spread",), SPREAD, 1.0),
    (("mixed_rule=spread", "mixed_spread=0.049"), MixedRule("spread", 0.049), 1.0),
    (("mixed_rule=spread", "mixed_spread=0.4"), MixedRule("spread", 0.4), 0.0)])
def test_a_bank_bench_counts_mixed_groups_by_its_rule(tmp_path, capsys, keys, rule, ratio):
    """Groups of 4 of the 8 roots: range >= 0.05 (two different F1s) and <= 0.35, never a success."""
    from trace_gym.banks import open_bank
    from trace_gym.bench.bank import bank_truth

    bank = continuous_bank(tmp_path / "f1.jsonl.gz")
    out = tmp_path / "b.json"
    code = main(["bench", "--bank", str(bank), "predictor=constant", "seeds=1", "steps=1", "warmup_prompts=0",
                 "oracle_upper_bound=false", "candidates=8", "root_budget=8", "continuations_per_root=0",
                 "group_size=4", "strategies=uniform", "mixed_groups_target=2", *keys, "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    row = json.loads(out.read_text())["strategies"]["uniform"]
    assert row["effective_ratio"] == ratio and row["mixed_prompts"] == 2 * ratio  # 8 roots: two groups of 4
    assert row["by_step"][0]["effective_ratio"] == ratio
    assert math.isnan(row["tokens_to_target"]) is (ratio == 0)  # the driver's per-wave count, by the same rule
    assert ("no prompt is mixed" in err) is (ratio == 0)  # the no-contrast warning only when the rule finds none
    _, truth = bank_truth(list(open_bank(bank)), rule)  # the predictor-quality truth: all 8 roots (range 0.35)
    assert truth.tolist() == [float(rule.rule == "spread" and rule.spread < 0.35)] * 12


@pytest.mark.parametrize("key, named", [("mixed_rule=median", "'median'"), ("mixed_spread=-0.1", "-0.1"),
                                        ("mixed_spread=nan", "nan"), ("mixed_spread=0.2", "mixed_rule=spread")])
def test_a_bad_mixed_rule_is_one_line(capsys, key, named):
    code = main(["bench", "--sim", key, "seeds=1", "steps=2"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and named in err[0] and "mixed_" in err[0], err
