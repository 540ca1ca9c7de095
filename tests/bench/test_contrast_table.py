"""benchmarks/contrast_table.py (issue 45, item 1): a knob table's row read from a bank with
known outcomes, and the BFCL first-action classes decoded as the env decodes actions."""

from __future__ import annotations

import pytest

from bank_fixtures import write_synthetic_bank
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def ct():
    with benchmark_script("contrast_table") as module:
        yield module


def test_a_row_counts_successes_and_mixed_groups_of_a_known_bank(ct, tmp_path):
    bank = write_synthetic_bank(tmp_path / "b.jsonl.gz", [0, 4, 8, 1], roots=8, continuations=0)
    row = ct.row(bank)
    assert (row["prompts"], row["episodes"], row["successes"]) == (4, 32, 13)
    assert row["success_rate"] == pytest.approx(13 / 32)
    # groups of 8 drawn from 8 roots: the whole group, mixed for 4/8 and 1/8 only
    assert row["mixed_share"] == pytest.approx(0.5)
    lo, hi = row["mixed_ci"]
    assert 0 < lo < 0.5 < hi < 1
    assert row["complete"] and row["first_calls"] == {}
    table = ct.markdown({"known": row, "empty": {**row, "prompts": 0}})
    assert "| `known` | 4 x 8 | 40.6 % [" in table and "50.0 % [" in table
    assert "Started, no prompt written (not tabulated): `empty`." in table


def test_first_calls_tells_no_call_the_right_function_and_another_apart(ct):
    task = {"answer": [["cd(folder='docs')"]]}
    leaves = [{"turns": [{"action": text}]} for text in (
        "Sure, I can help with that.",          # prose: no call
        "[cd(folder='document')]",              # the right function, wrong argument
        "[ls(a=True)]",                         # another function
        "[ls(), cd(folder='docs')]",            # the right one among others
        "[cd(folder=",                          # unparsable: no call
    )]
    assert ct.first_calls(task, leaves) == ["no call", "right function", "other function", "right function",
                                            "no call"]
