"""benchmarks/bench_bfcl_env.py runs and writes its JSON (smoke test, 2 entries per category)."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import benchmark_script

pytest.importorskip("bfcl_eval")


def test_benchmark_smoke(tmp_path, capsys):
    with benchmark_script("bench_bfcl_env") as bench:
        assert bench.main(["--entries", "2", "--json", str(tmp_path / "b.json")]) == 0
    out = json.loads((tmp_path / "b.json").read_text())
    assert set(out["results"]) == {"multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param"}
    assert all(r["step_ms"]["n"] > 0 and r["restore_ms"]["median"] >= 0 for r in out["results"].values())
    assert "| multi_turn_base" in capsys.readouterr().out
