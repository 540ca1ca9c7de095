"""Dense index build: kill + resume gives an identical index, manifest, index types, published artifacts."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from retrieval_index.build import build_dense_index, load_manifest, shard_path  # noqa: E402
from retrieval_index.corpus import Corpus, write_jsonl  # noqa: E402
from retrieval_index.dense import DenseSearcher  # noqa: E402
from retrieval_index.encoders import Encoder  # noqa: E402
from retrieval_index.synthetic import generate_world  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N_PASSAGES, SHARD = 240, 24  # 10 shards


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    world = generate_world(seed=3, scale=0.03)
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    write_jsonl(path, world.passages[:N_PASSAGES])
    return path


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder(device="cpu", batch_size=16)


@pytest.fixture(scope="module")
def full_build(corpus, encoder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full")
    build_dense_index(corpus, out, shard_size=SHARD, batch_size=16, progress=False, encoder=encoder)
    return out


def test_killed_build_resumes_from_finished_shards_and_matches_an_uninterrupted_build(corpus, encoder, full_build,
                                                                                     tmp_path):
    out = tmp_path / "resumed"
    code = ("import sys; from retrieval_index.build import build_dense_index; "
            f"build_dense_index(sys.argv[1], sys.argv[2], shard_size={SHARD}, batch_size=16, progress=False, "
            "device='cpu')")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(corpus), str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    try:
        while not shard_path(out, 2).exists():  # three shards finished: kill it mid-way
            assert proc.poll() is None, f"the build exited early: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "the build made no progress"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    finished = sorted(p.name for p in (out / "embeddings").glob("shard_*.npy"))
    assert 3 <= len(finished) < N_PASSAGES // SHARD, finished
    assert not (out / "manifest.json").exists()

    manifest = build_dense_index(corpus, out, shard_size=SHARD, batch_size=16, progress=False, encoder=encoder)
    build = manifest["build"]
    assert build["shards_reused"] == len(finished)  # finished shards were not encoded again
    assert build["shards_encoded"] == N_PASSAGES // SHARD - len(finished)
    for i in range(N_PASSAGES // SHARD):
        assert shard_path(out, i).read_bytes() == shard_path(full_build, i).read_bytes(), f"shard {i} differs"
    assert (out / "index.faiss").read_bytes() == (full_build / "index.faiss").read_bytes()


def test_manifest_records_model_pooling_dims_count_and_corpus_checksum(corpus, full_build):
    m = load_manifest(full_build)
    assert m["model"] == "all-MiniLM-L6-v2" and m["pooling"] == "mean" and m["normalize"] is True
    assert m["dims"] == 384 and m["count"] == N_PASSAGES
    assert m["corpus"]["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert m["index"]["factory"] == "Flat" and m["index"]["metric"] == "inner_product"
    assert faiss.read_index(str(full_build / "index.faiss")).ntotal == N_PASSAGES


def test_a_folder_built_with_other_settings_is_refused_by_name(corpus, encoder, full_build):
    with pytest.raises(ValueError, match="shard_size"):
        build_dense_index(corpus, full_build, shard_size=SHARD + 1, progress=False, encoder=encoder)


def test_flat_search_equals_brute_force_over_the_shards(full_build, encoder):
    searcher = DenseSearcher.load(full_build, encoder=encoder)
    vectors = np.concatenate([np.load(shard_path(full_build, i)) for i in range(N_PASSAGES // SHARD)])
    corpus = Corpus(load_manifest(full_build)["corpus"]["path"])
    queries = ["Where was the painter born?", corpus[7][1].split("\n")[0], "a public university founded in 1800"]
    hits = searcher.search(queries, 5)
    scores = encoder.encode_queries(queries) @ vectors.T
    for q, row in enumerate(scores):
        best = np.argsort(-row, kind="stable")[:5]
        assert [h.id for h in hits[q]] == [corpus[int(i)][0] for i in best]
        np.testing.assert_allclose([h.score for h in hits[q]], row[best], rtol=1e-5, atol=1e-5)
    assert hits[1][0].contents == corpus[7][1] or hits[1][0].title == corpus[7][1].split("\n")[0]


@pytest.mark.parametrize("index_type,fp16,factory", [("HNSW", False, "HNSW32"), ("Flat", True, "SQfp16"),
                                                     ("IVF-PQ", False, "IVF6,PQ64x2")])
def test_other_index_types_reuse_the_shards_and_find_the_exact_neighbours(corpus, encoder, full_build, tmp_path,
                                                                         index_type, fp16, factory):
    out = tmp_path / index_type
    out.mkdir()
    (out / "embeddings").symlink_to(full_build / "embeddings", target_is_directory=True)
    m = build_dense_index(corpus, out, shard_size=SHARD, index_type=index_type, fp16=fp16, progress=False,
                          encoder=encoder)
    assert m["build"]["shards_encoded"] == 0 and m["index"]["factory"] == factory
    exact = DenseSearcher.load(full_build, encoder=encoder)
    approx = DenseSearcher.load(out, encoder=encoder, nprobe=64, ef_search=128)
    queries = [Corpus(corpus)[i][1] for i in range(0, N_PASSAGES, 12)]  # each passage finds itself first
    top_exact = [h[0].id for h in exact.search(queries, 1)]
    top_approx = [h[0].id for h in approx.search(queries, 1)]
    agree = np.mean([a == b for a, b in zip(top_exact, top_approx)])
    assert agree >= (1.0 if index_type != "IVF-PQ" else 0.8), (index_type, agree)


def test_published_artifacts_are_served_as_they_are(corpus, encoder, full_build, tmp_path):
    """Search-R1's layout: e5_Flat.index (an IndexFlatIP) + wiki-18.jsonl, row i = line i."""
    index = faiss.IndexFlatIP(encoder.dim)
    for i in range(N_PASSAGES // SHARD):
        index.add(np.load(shard_path(full_build, i)))
    faiss.write_index(index, str(tmp_path / "e5_Flat.index"))
    (tmp_path / "wiki-18.jsonl").write_bytes(corpus.read_bytes())
    published = DenseSearcher.from_files(tmp_path / "e5_Flat.index", tmp_path / "wiki-18.jsonl",
                                         model="all-MiniLM-L6-v2")
    built = DenseSearcher.load(full_build, encoder=encoder)
    queries = ["Which company was founded by an engineer?", "a city on a river"]
    assert [[h.id for h in hits] for hits in published.search(queries, 3)] == \
        [[h.id for h in hits] for hits in built.search(queries, 3)]
    assert published.info()["format"] == "published" and published.info()["count"] == N_PASSAGES


def test_mismatched_published_artifacts_are_refused_with_both_numbers(corpus, encoder, tmp_path):
    faiss.write_index(faiss.IndexFlatIP(768), str(tmp_path / "e5.index"))
    with pytest.raises(ValueError, match="768.*384"):
        DenseSearcher.from_files(tmp_path / "e5.index", corpus, model="all-MiniLM-L6-v2")
    small = faiss.IndexFlatIP(384)
    small.add(np.zeros((3, 384), dtype=np.float32))
    faiss.write_index(small, str(tmp_path / "small.index"))
    with pytest.raises(ValueError, match=f"3 vectors.*{N_PASSAGES} passages"):
        DenseSearcher.from_files(tmp_path / "small.index", corpus, model="all-MiniLM-L6-v2")


def test_changed_corpus_is_detected(corpus, encoder, full_build, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    manifest = json.loads((full_build / "manifest.json").read_text())
    changed = tmp_path / "changed.jsonl"
    changed.write_bytes(corpus.read_bytes().replace(b"born", b"borN", 1))
    manifest["corpus"]["path"] = str(changed)
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "index.faiss").write_bytes((full_build / "index.faiss").read_bytes())
    with pytest.raises(ValueError, match="changed since the index was built"):
        DenseSearcher.load(out, encoder=encoder)
