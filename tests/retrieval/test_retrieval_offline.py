"""The full offline build (20,940 SYNTHETIC passages) with its recall@3 report. Slow: minutes of encoding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_full_offline_build_and_recall_at_3():
    """`trace-gym index build --synthetic --kind both --recall 3`: progress bar, then the recall table."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "trace_gym.cli", "index", "build", "--synthetic", "--kind", "both",
                           "--recall", "3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith(("| dense |", "| bm25 |"))}
    assert rows["dense"][0] == rows["bm25"][0] == "2000"
    for name, (n, hop_recall, hop1, hop2, hop2_from_question, all_from_question) in rows.items():
        assert float(hop_recall) >= 0.9, (name, hop_recall)
        assert float(hop2_from_question) < 0.5, (name, hop2_from_question)  # the second passage needs a second search
