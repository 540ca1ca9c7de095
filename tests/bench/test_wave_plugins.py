"""docs/strategies.md's two wave strategies (Thompson sampling, pilot-commit), written from
the page into a scratch folder and run as --plugin modules on the shipped math bank: each
gets paired verdicts against uniform and TRACE, and its replay agrees (no violation)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "strategies.md"
FILE_BLOCK = re.compile(r"^```python\n# file: (\S+)\n(.*?)^```", re.S | re.M)


def test_the_two_plugins_of_the_tutorial_get_paired_verdicts(tmp_path):
    blocks = {name: body for name, body in FILE_BLOCK.findall(DOCS.read_text())}
    for name in ("thompson_plugin.py", "my_pilot_commit.py"):
        assert len(blocks[name].splitlines()) <= 40, name  # the "in at most 40 lines each"
        (tmp_path / name).write_text(blocks[name])
    out = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "bench", "--bank", "math_python_smollm2", "--plugin",
         "thompson_plugin", "--plugin", "my_pilot_commit", "--strategies", "uniform,trace,thompson,my_pilot_commit",
         "seeds=3", "steps=2", "candidates=32", "root_budget=8", "warmup_prompts=16", "predictor=constant",
         "oracle_upper_bound=false", "--json", str(tmp_path / "out.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "out.json").read_text())
    assert results["violations"] == {}
    pairs = {(p["a"], p["b"]) for p in results["paired"]}
    for mine in ("thompson", "my_pilot_commit"):
        assert {(mine, "uniform"), (mine, "trace")} <= pairs
        entry = next(p for p in results["paired"] if p["a"] == mine and p["b"] == "uniform")
        assert entry["effective_ratio"]["n"] == 3 and entry["effective_ratio"]["low"] <= entry["effective_ratio"]["high"]
    assert {"thompson", "my_pilot_commit"} <= {e["arm"] for e in results["ranking"]["rows"]}
    assert 1.0 < results["strategies"]["my_pilot_commit"]["waves_per_step"] <= 2.0  # a commit wave where a pilot was mixed
