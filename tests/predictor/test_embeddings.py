"""The frozen encoder's embeddings, kept on disk per encode call (trace_gym/predictor/embeddings.py):
exactly what the encoder returns, bounded, and a damaged or half-written file computed again."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from trace_gym.predictor import embeddings
from trace_gym.predictor.embeddings import EmbeddingStore, bank_store, call_key, encoder_identity, use_store
from trace_gym.predictor.kinds import EmbeddingPredictor

OPTIONS = dict(batch_size=64, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
#: Texts of unequal lengths: in one call the short ones are padded to the longest.
TEXTS = ["guess: 3", "user: Too low. You have 2 guesses left.\nassistant: guess: 7\nuser: Too high." * 2,
         "The secret is between 1 and 10.", "assistant: guess: 5\nuser: Correct!" * 4]


@pytest.fixture(scope="module")
def encoder():
    predictor = EmbeddingPredictor()
    return predictor.encoder, predictor._encoder_key


def _direct(encoder, texts, **options):
    return np.asarray(encoder[0].encode(list(texts), **{**OPTIONS, **options}), dtype=np.float32)


def test_the_store_returns_exactly_what_the_encoder_returns(encoder, tmp_path):
    first = EmbeddingStore(tmp_path)
    computed = first.encode(*encoder, list(TEXTS), **OPTIONS)
    assert (first.hits, first.misses) == (0, 1)
    again = EmbeddingStore(tmp_path)  # another process's store over the same folder
    read = again.encode(*encoder, list(TEXTS), **OPTIONS)
    assert (again.hits, again.misses, again.rejected) == (1, 0, 0)
    direct = _direct(encoder, TEXTS)
    assert read.dtype == np.float32 and read.tobytes() == computed.tobytes() == direct.tobytes()
    assert not list(tmp_path.rglob(".tmp-*"))  # written under a temporary name, then renamed


def test_a_call_is_keyed_by_its_exact_texts_in_order_and_its_options(encoder, tmp_path):
    """A text's vector depends in its last bits on the other texts of its call, so the store
    never hands out a vector computed beside other texts: a call is one key."""
    alone = _direct(encoder, TEXTS[:1])[0]
    beside = _direct(encoder, TEXTS)[0]
    identity = encoder_identity(encoder[1])
    keys = {call_key(identity, texts, options) for texts, options in (
        (TEXTS, OPTIONS), (TEXTS[:1], OPTIONS), (TEXTS[::-1], OPTIONS), (TEXTS, {**OPTIONS, "batch_size": 2}),
        (TEXTS, {**OPTIONS, "normalize_embeddings": False}), (["ab", "c"], OPTIONS), (["a", "bc"], OPTIONS))}
    assert len(keys) == 7
    store = EmbeddingStore(tmp_path)
    store.encode(*encoder, list(TEXTS), **OPTIONS)
    got = store.encode(*encoder, TEXTS[:1], **OPTIONS)
    assert store.misses == 2 and got[0].tobytes() == alone.tobytes()
    assert np.allclose(alone, beside, atol=1e-6)  # the same text, whichever call: equal to rounding


@pytest.mark.parametrize("damage", ["flip a byte", "cut short", "empty", "another format", "wrong rows"])
def test_a_damaged_or_half_written_file_is_computed_again(encoder, tmp_path, damage):
    store = EmbeddingStore(tmp_path)
    store.encode(*encoder, list(TEXTS), **OPTIONS)
    (path,) = tmp_path.rglob("*.npy")
    data = path.read_bytes()
    if damage == "flip a byte":
        data = data[:-7] + bytes([data[-7] ^ 1]) + data[-6:]
    elif damage == "cut short":  # what a writer that is not done yet would leave behind
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = b""
    elif damage == "another format":
        data = b"\x93NUMPY" + data[30:]
    else:  # a whole file, of another call's rows (a key collision is the one way to get here)
        other = EmbeddingStore(tmp_path / "other")
        other.encode(*encoder, TEXTS[:2], **OPTIONS)
        data = next((tmp_path / "other").rglob("*.npy")).read_bytes()
    path.write_bytes(data)
    again = EmbeddingStore(tmp_path)
    got = again.encode(*encoder, list(TEXTS), **OPTIONS)
    assert (again.hits, again.misses, again.rejected) == (0, 1, 1)
    assert got.tobytes() == _direct(encoder, TEXTS).tobytes()
    third = EmbeddingStore(tmp_path)  # the file was written again, whole
    assert third.encode(*encoder, list(TEXTS), **OPTIONS).tobytes() == got.tobytes() and third.hits == 1


def test_the_store_is_bounded_and_survives_a_folder_it_cannot_write(encoder, tmp_path, caplog):
    store = EmbeddingStore(tmp_path / "s", max_bytes=4096)  # one call's vectors are 4 x 384 x 4 bytes
    with caplog.at_level(logging.WARNING, logger="trace_gym.predictor.embeddings"):
        for n in (4, 3, 2):
            assert store.encode(*encoder, TEXTS[:n], **OPTIONS).tobytes() == _direct(encoder, TEXTS[:n]).tobytes()
    assert not list((tmp_path / "s").rglob("*.npy"))
    assert sum("new embeddings are not kept" in r.getMessage() for r in caplog.records) == 1
    (tmp_path / "file").write_text("not a folder")
    blocked = EmbeddingStore(tmp_path / "file" / "store")
    assert blocked.encode(*encoder, TEXTS[:2], **OPTIONS).tobytes() == _direct(encoder, TEXTS[:2]).tobytes()
    assert blocked.misses == 1


def test_the_predictor_embeds_through_the_store_in_use_with_the_same_features(encoder, tmp_path):
    from trace_gym.predictor.kinds import Context

    predictor = EmbeddingPredictor()
    contexts = [Context(TEXTS[2], TEXTS[1], 2), Context(TEXTS[2]), Context(TEXTS[0], TEXTS[3], 9)]
    embeddings.clear_caches()
    plain = predictor.features(contexts)
    for _ in range(2):  # the first computes and keeps, the second reads
        embeddings.clear_caches()
        with use_store(EmbeddingStore(tmp_path)) as store:
            assert predictor.features(contexts).tobytes() == plain.tobytes()
    assert store.hits == 2 and store.misses == 0  # prompts and history ends: one call each


def test_history_ends_are_tokenised_once_per_process(encoder):
    predictor = EmbeddingPredictor()
    histories = [TEXTS[3] * 60, TEXTS[1], "", TEXTS[1] * 80]  # two longer than the encoder reads
    embeddings.clear_caches()
    first = predictor.recent_history(histories)
    tokenizer, calls = predictor.encoder.tokenizer, []
    real = type(tokenizer).__call__
    type(tokenizer).__call__ = lambda self, *a, **k: calls.append(a) or real(self, *a, **k)
    try:
        again = predictor.recent_history(histories)
    finally:
        type(tokenizer).__call__ = real
    assert again == first and calls == []
    assert len(first[0]) < len(histories[0]) and first[1] == TEXTS[1] and first[2] == ""


def test_a_banks_store_lives_under_the_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    store = bank_store("ab" * 32)
    assert store.folder == tmp_path / "cache" / "embeddings" / ("ab" * 8)
    assert store.bounded == tmp_path / "cache" / "embeddings"
