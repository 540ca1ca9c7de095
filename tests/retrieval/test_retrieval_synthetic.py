"""The SYNTHETIC offline world: deterministic, >= 20,000 passages, and questions that need two hops."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from retrieval_index.offline import offline_files, offline_questions
from retrieval_index.protocol import split_contents
from retrieval_index.synthetic import (
    GENERATOR_VERSION,
    QUESTION_TYPES,
    SINGLE_HOP_TYPES,
    generate_world,
    read_questions,
)

BRIDGE_TYPES = {"birth_country", "director_birthplace", "director_birth_year", "founder_university",
                "company_country", "university_city"}


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0, scale=1.0)


def test_full_world_has_at_least_20000_passages_and_is_deterministic(world):
    assert len(world.passages) >= 20_000
    assert generate_world(seed=0, scale=1.0).passages == world.passages
    assert generate_world(seed=1, scale=1.0).passages != world.passages
    assert [q["id"] for q in world.questions] == [q["id"] for q in generate_world(0, 1.0).questions]
    ids = [pid for pid, _ in world.passages]
    assert len(set(ids)) == len(ids)


def test_every_question_is_labelled_synthetic_and_every_type_is_present(world):
    counts = Counter(q["metadata"]["type"] for q in world.questions)
    assert set(counts) == set(QUESTION_TYPES) and min(counts.values()) == 250
    assert all(q["metadata"]["synthetic"] and q["id"].startswith("synthetic/") for q in world.questions)
    assert "synthetic" in world.name and f"v{GENERATOR_VERSION}" in world.name


def test_entity_titles_are_unique_per_entity(world):
    by_title: dict[str, set[str]] = {}
    for _, contents in world.passages:
        title, text = split_contents(contents)
        by_title.setdefault(title, set()).add(text.split(" ")[0])
    assert len(by_title) > 10_000
    yes_no = [q for q in world.questions if q["metadata"]["type"] == "same_director"]
    assert {q["golden_answers"][0] for q in yes_no} == {"yes", "no"}


def test_bridge_questions_need_the_second_passage(world):
    """The answer is in the hop-2 passage and not in hop 1; the bridge entity links them and is not in the question."""
    passages = dict(world.passages)
    for q in world.questions:
        meta = q["metadata"]
        hop1, hop2 = (passages[g] for g in meta["gold_ids"])
        if meta["type"] in BRIDGE_TYPES:
            bridge = meta["bridge"]
            assert bridge in hop1 and bridge not in q["question"], q
            assert split_contents(hop2)[0].strip('"') == bridge or bridge in hop2
            assert any(re.search(rf"\b{re.escape(a)}\b", hop2) for a in q["golden_answers"]), q
            assert not any(re.search(rf"\b{re.escape(a)}\b", hop1) for a in q["golden_answers"]), q
        else:  # comparisons: both named in the question, each passage holds one fact
            for g in meta["gold_ids"]:
                assert split_contents(passages[g])[0].strip('"') in q["question"]


def test_single_hop_questions_are_a_separate_set_answered_by_one_passage(world):
    passages = dict(world.passages)
    assert Counter(q["metadata"]["type"] for q in world.single_hop_questions) == {t: 250 for t in SINGLE_HOP_TYPES}
    for q in world.single_hop_questions:
        (gold,) = q["metadata"]["gold_ids"]
        assert q["golden_answers"][0] in passages[gold]
    assert not {q["id"] for q in world.single_hop_questions} & {q["id"] for q in world.questions}


def test_small_worlds_keep_every_question_type():
    small = generate_world(seed=0, scale=0.03)
    assert 500 < len(small.passages) < 1000
    assert set(q["metadata"]["type"] for q in small.questions) == set(QUESTION_TYPES)


def test_offline_files_are_written_once_into_a_folder(tmp_path):
    corpus, questions = offline_files(0, 0.03, root=tmp_path)
    mtime = corpus.stat().st_mtime_ns
    assert offline_files(0, 0.03, root=tmp_path) == (corpus, questions) and corpus.stat().st_mtime_ns == mtime
    assert read_questions(questions) == offline_questions(0, 0.03, root=tmp_path)
    assert sum(1 for _ in open(corpus)) == len(generate_world(0, 0.03).passages)
