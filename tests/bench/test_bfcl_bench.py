"""benchmarks/bench_bfcl_env.py runs and writes its JSON (smoke test, 2 entries per category)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval")


def test_benchmark_smoke(tmp_path, capsys):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_bfcl_env.py"
    spec = importlib.util.spec_from_file_location("bench_bfcl_env", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--entries", "2", "--json", str(tmp_path / "b.json")]) == 0
    out = json.loads((tmp_path / "b.json").read_text())
    assert set(out["results"]) == {"multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param"}
    assert all(r["step_ms"]["n"] > 0 and r["restore_ms"]["median"] >= 0 for r in out["results"].values())
    assert "| multi_turn_base" in capsys.readouterr().out
