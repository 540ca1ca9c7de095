"""`trace-gym index ...`: build (cached synthetic world, your own corpus), recall report, info, errors."""

from __future__ import annotations

import json

from retrieval_index.corpus import write_jsonl
from retrieval_index.offline import offline_index
from retrieval_index.synthetic import generate_world
from trace_gym.cli import main

SCALE = "0.03"


def test_build_synthetic_both_kinds_prints_recall_at_3(capsys):
    assert main(["index", "build", "--synthetic", "--scale", SCALE, "--kind", "both", "--recall", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"dense: {offline_index('dense', 0, float(SCALE))}" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| dense") or
            line.startswith("| bm25")}
    assert set(rows) == {"dense", "bm25"}
    hop1 = {name: float(line.split("|")[5]) for name, line in rows.items()}
    assert min(hop1.values()) >= 0.8
    assert "| birth_country |" in out and "hop 2 from the question alone" in out


def test_build_a_corpus_and_read_its_manifest(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    write_jsonl(corpus, generate_world(seed=9, scale=0.03).passages[:40])
    assert main(["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--shard-size", "16",
                 "--quiet"]) == 0
    assert "dense: 40 passages, 384 dims, Flat; 0 of 3 shards reused" in capsys.readouterr().out
    assert main(["index", "info", str(tmp_path / "idx")]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 40


def test_configuration_errors_exit_2_with_one_line(tmp_path, capsys):
    assert main(["index", "build", "--corpus", str(tmp_path / "c.jsonl")]) == 2
    assert "--out is required" in capsys.readouterr().err
    assert main(["index", "serve", "--faiss", str(tmp_path / "x.index")]) == 2
    assert "--faiss needs --corpus" in capsys.readouterr().err
