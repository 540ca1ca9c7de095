"""`trace-gym bench --env wiki_qa --policy smollm2-135m` at the smallest settings. Slow: real rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_runs_every_strategy_on_the_offline_questions(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "trace_gym.cli", "bench", "--env", "wiki_qa", "--policy", "smollm2-135m",
           "--engine", "hf", "--candidates", "4", "--root-budget", "4", "--continuations-per-root", "1",
           "--group-size", "2", "--warmup-budget", "0", "--max-turns", "2", "--max-turn-tokens", "48",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    from trace_gym.strategies import STRATEGIES

    assert set(results["strategies"]) == set(STRATEGIES)
    costs = {name: r["nominal_cost"] for name, r in results["strategies"].items()}
    assert max(costs.values()) - min(costs.values()) < 1e-9, costs  # one nominal budget
    assert all(r["env_steps"] > 0 for r in results["strategies"].values())
