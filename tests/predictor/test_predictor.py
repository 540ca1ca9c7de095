"""Success predictors: online learning from soft targets, validation, Spearman by depth."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from trace_gym.predictor.critic import prompt_head_history_tail
from trace_gym.predictor.kinds import ConstantPredictor, Context, EmbeddingPredictor
from trace_gym.report import spearman, spearman_by_depth


@pytest.fixture(scope="module")
def embedding_predictor():
    return EmbeddingPredictor(steps_per_update=30, seed=0)


def _tasks(n: int, seed: int):
    """Two kinds of prompts with very different true success rates."""
    rng = np.random.default_rng(seed)
    contexts, truth = [], []
    for i in range(n):
        a, b = rng.integers(1, 99, size=2)
        if i % 2 == 0:
            contexts.append(Context(f"What is {a} + {b}?"))
            truth.append(0.85)
        else:
            contexts.append(Context(f"Find all real x with x^{a % 7 + 3} - {b}x + {a} = 0 and sum their cubes."))
            truth.append(0.1)
    return contexts, np.array(truth)


def test_embedding_predictor_learns_a_success_signal_from_binary_outcomes(embedding_predictor):
    contexts, truth = _tasks(160, seed=0)
    rng = np.random.default_rng(1)
    before = embedding_predictor.predict(contexts[120:])
    assert np.allclose(before, 0.5, atol=0.05)  # prior 0.5
    for _ in range(4):  # noisy 0/1 outcomes, as tree leaves would give
        outcomes = (rng.random(120) < truth[:120]).astype(float)
        metrics = embedding_predictor.update(contexts[:120], outcomes)
    assert metrics["n"] == 120 and np.isfinite(metrics["loss"])
    after = embedding_predictor.predict(contexts[120:])
    rho = spearman(after, truth[120:])
    assert rho > 0.8
    easy, hard = after[truth[120:] > 0.5].mean(), after[truth[120:] < 0.5].mean()
    assert easy > 0.6 and hard < 0.35


def test_history_and_depth_change_the_prediction(embedding_predictor):
    p = embedding_predictor.predict([Context("What is 2 + 2?"),
                                     Context("What is 2 + 2?", "assistant: 4\nuser: correct", depth=1)])
    assert p.shape == (2,) and p[0] != p[1]


def test_update_validates_targets_and_weights(embedding_predictor):
    ctx = [Context("a"), Context("b")]
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        embedding_predictor.update(ctx, [0.5, 1.5])
    with pytest.raises(ValueError, match="shape"):
        embedding_predictor.update(ctx, [0.5])
    with pytest.raises(ValueError, match="weights"):
        embedding_predictor.update(ctx, [0.5, 0.5], weights=[1.0, -1.0])
    with pytest.raises(ValueError, match="value"):
        ConstantPredictor(1.5)


def test_spearman_by_depth_matches_hand_computed_ranks():
    pred = [0.1, 0.2, 0.3, 0.9, 0.8, 0.7, 0.5]
    emp = [0.0, 0.5, 1.0, 0.0, 0.5, 1.0, 0.3]
    depth = [0, 0, 0, 1, 1, 1, 2]
    out = spearman_by_depth(pred, emp, depth)
    assert out[0] == pytest.approx(1.0)  # same order
    assert out[1] == pytest.approx(-1.0)  # reversed order
    assert np.isnan(out[2])  # one anchor: undefined
    # overall: ranks of pred 1..7 vs emp ranks, with scipy's tie rule
    from scipy.stats import spearmanr

    assert spearman(pred, emp) == pytest.approx(spearmanr(pred, emp).statistic)


def test_lm_critic_learns_to_rank_prompts(tmp_path_factory):
    """The paper's predictor shape: a causal LM + scalar head (tiny random LM here)."""
    from trace_gym.models import pull_model, tiny_random_model
    from trace_gym.predictor.critic import LMCriticPredictor

    path = tiny_random_model(tmp_path_factory.mktemp("critic") / "m", tokenizer_from=pull_model("smollm2-135m",
                                                                                                 progress=False))
    critic = LMCriticPredictor(str(path), train_backbone=False, lr=3e-2, batch_size=48, seed=0)
    contexts, truth = _tasks(64, seed=3)
    assert np.allclose(critic.predict(contexts[:4]), 0.5, atol=1e-6)  # zero-initialised head at the prior
    rng = np.random.default_rng(0)
    for _ in range(40):
        critic.update(contexts[:48], (rng.random(48) < truth[:48]).astype(float))
    held_out = critic.predict(contexts[48:])
    assert spearman(held_out, truth[48:]) > 0.6


# ---------------------------------------------------------------------- what the predictors read
def _tool_history(turns: int, last_result: str) -> str:
    """A history of tool-call turns, serialised as :func:`trace_gym.agent.rollout.history_text` does."""
    lines = []
    for t in range(turns):
        call = {"name": "search", "arguments": {"query": f"capital of country {t}", "top_k": 3}}
        result = {"results": [last_result if t == turns - 1 else f"city_{t}"], "score": 0.5}
        lines += [f"assistant: {json.dumps(call)}", f"tool: {json.dumps(result)}"]
    return "\n".join(lines)


LONG_A, LONG_B = _tool_history(30, "Paris"), _tool_history(30, "Rouen")  # same length, differ only at the end


def test_prompt_head_history_tail_by_hand():
    prompt, sep, history = list(range(10)), [-1], list(range(100, 110))
    # room 11: the prompt keeps its first 5 (half), the history its last 6
    assert prompt_head_history_tail(prompt, sep, history, 12) == [0, 1, 2, 3, 4, -1, 104, 105, 106, 107, 108, 109]
    # a short history leaves the prompt more: room 7, history 2, prompt 5 of 10
    assert prompt_head_history_tail(prompt, sep, [100, 101], 8) == [0, 1, 2, 3, 4, -1, 100, 101]
    # a short prompt leaves the history more: room 7, prompt 2, history its last 5
    assert prompt_head_history_tail([0, 1], sep, history, 8) == [0, 1, -1, 105, 106, 107, 108, 109]
    assert prompt_head_history_tail(prompt, sep, history, 21) == prompt + sep + history  # it all fits
    assert prompt_head_history_tail(prompt, [], [], 4) == [0, 1, 2, 3]  # no history: the prompt's head
    with pytest.raises(ValueError, match="budget must hold the separator.*got 2"):
        prompt_head_history_tail(prompt, sep, history, 2)


def test_embedding_predictor_reads_the_latest_turn_of_a_long_history(embedding_predictor):
    p, tokenizer = embedding_predictor, embedding_predictor.encoder.tokenizer
    full = tokenizer(LONG_A, add_special_tokens=False, verbose=False)["input_ids"]
    assert len(full) > 3 * p.encoder.max_seq_length  # far longer than the encoder reads
    # the old input (the last 1,500 characters, of which MiniLM reads the first 256 pieces)
    # embedded the pair identically
    old = p.encoder.encode([LONG_A[-1500:], LONG_B[-1500:]], normalize_embeddings=True)
    assert np.allclose(old[0], old[1])
    recent = p.recent_history([LONG_A])[0]
    kept = tokenizer(recent, add_special_tokens=False)["input_ids"]
    assert LONG_A.endswith(recent) and recent.endswith('"Paris"], "score": 0.5}')
    assert p.history_pieces - 10 < len(kept) <= p.history_pieces == p.encoder.max_seq_length - 2
    assert kept == full[-len(kept):]  # exactly the history's own last pieces
    x = p.features([Context("Find the capital.", LONG_A, 30), Context("Find the capital.", LONG_B, 30)])
    dim = p.encoder.get_embedding_dimension()
    assert np.allclose(x[0, :dim], x[1, :dim]) and not np.allclose(x[0, dim:2 * dim], x[1, dim:2 * dim])
    assert p.predict([Context("q", LONG_A, 30), Context("q", LONG_B, 30)]).shape == (2,)


def test_embedding_predictor_embeds_the_prompt_apart_from_a_long_history(embedding_predictor):
    p = embedding_predictor
    x = p.features([Context("Find the capital of country 29.", LONG_A, 30),
                    Context("Name the river through country 29.", LONG_A, 30)])
    dim = p.encoder.get_embedding_dimension()
    assert not np.allclose(x[0, :dim], x[1, :dim]) and np.allclose(x[0, dim:2 * dim], x[1, dim:2 * dim])


def test_embedding_predictor_embeds_short_contexts_as_before(embedding_predictor):
    p = embedding_predictor
    contexts = [Context("What is 2 + 2?", "assistant: 4\nuser: correct", 1), Context("Sum 3 and 5."),
                Context("Find the capital.", _tool_history(2, "Paris"), 2)]
    assert p.recent_history([c.history for c in contexts]) == [c.history for c in contexts]
    x = p.features(contexts)
    dim = p.encoder.get_embedding_dimension()
    prompts = p.encoder.encode([c.prompt for c in contexts], normalize_embeddings=True)
    histories = p.encoder.encode([c.history[-1500:] for c in contexts], normalize_embeddings=True)  # the old input
    np.testing.assert_allclose(x[:, :dim], prompts, atol=1e-6)
    np.testing.assert_allclose(x[:, dim:2 * dim], histories, atol=1e-6)


def test_embedding_predictors_window_does_not_change_what_is_embedded(embedding_predictor, monkeypatch):
    """``history_chars`` is a first window only: brute force over the whole history agrees."""
    p, tokenizer = embedding_predictor, embedding_predictor.encoder.tokenizer
    rng = np.random.default_rng(0)
    words = ["alpha", "naïve", "tokenization", "{", '"x":', "42,", "unbelievably", "中文", "\n", "  ", "Zürich"]
    histories = ["".join(rng.choice(words) + " " * int(rng.random() < 0.7) for _ in range(rng.integers(0, 500)))
                 for _ in range(40)] + [LONG_A, "x" * 3000, ""]
    recent = p.recent_history(histories)
    monkeypatch.setattr(p, "history_chars", 10**9)  # tokenise every history whole
    assert p.recent_history(histories) == recent
    for history, kept in zip(histories, recent):
        full = tokenizer(history, add_special_tokens=False, verbose=False)["input_ids"]
        ids = tokenizer(kept, add_special_tokens=False, verbose=False)["input_ids"]
        assert history.endswith(kept) and len(ids) <= p.history_pieces and ids == full[len(full) - len(ids):]
        assert kept == history or len(full) > p.history_pieces
    # a last word longer than the limit is cut inside it, to pieces that still fit
    monkeypatch.setattr(p, "history_pieces", 4)
    word = "unbelievablytokenizationnaivete"
    assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) > 4
    kept = p.recent_history([f"assistant: {word}"])[0]
    assert word.endswith(kept) and 0 < len(tokenizer(kept, add_special_tokens=False)["input_ids"]) <= 4


@pytest.fixture(scope="module")
def critic(tiny_model_path):  # noqa: F811
    from trace_gym.predictor.critic import LMCriticPredictor

    return LMCriticPredictor(str(tiny_model_path), seed=0)


def test_lm_critic_reads_the_latest_turn_of_a_long_history(critic):
    contexts = [Context("Find the capital.", LONG_A, 30), Context("Find the capital.", LONG_B, 30)]
    assert len(critic.tokenizer(contexts[0].text(), verbose=False)["input_ids"]) > 2 * critic.max_length
    a, b = critic.input_ids(contexts)
    assert len(a) == critic.max_length and len(b) == critic.max_length
    assert critic.tokenizer.decode(a).startswith("Find the capital.\n\n")
    assert critic.tokenizer.decode(a).endswith('{"results": ["Paris"], "score": 0.5}')
    x = critic.features(contexts)
    assert x.shape == (2, critic.backbone.config.hidden_size) and not np.allclose(x[0], x[1])


def test_lm_critic_keeps_the_prompt_of_a_long_history(critic):
    contexts = [Context("Find the capital of country 29.", LONG_A, 30),
                Context("Name the river through country 29.", LONG_A, 30)]
    # the old input (the whole text, left-truncated to max_length) lost the prompt: identical ids
    left = copy.deepcopy(critic.tokenizer)
    left.truncation_side = "left"
    old = left([c.text() for c in contexts], truncation=True, max_length=critic.max_length)["input_ids"]
    assert old[0] == old[1]
    a, b = critic.input_ids(contexts)
    assert a != b and a[-200:] == b[-200:] and len(a) <= critic.max_length >= len(b)
    cached = len(critic._features)
    x = critic.features(contexts)
    assert not np.allclose(x[0], x[1])
    assert len(critic._features) == cached + 2  # keyed by the ids read
    critic.features(contexts)
    assert len(critic._features) == cached + 2


def test_lm_critic_reads_short_contexts_as_before(critic):
    contexts = [Context("What is 2 + 2?", "assistant: 4\nuser: correct", 1), Context("Sum 3 and 5."),
                Context("Find the capital.", _tool_history(2, "Paris"), 2)]
    old = critic.tokenizer([c.text() for c in contexts], truncation=True, max_length=critic.max_length,
                           verbose=False)["input_ids"]
    assert critic.input_ids(contexts) == old
    # a long prompt alone keeps its head
    ids = critic.input_ids([Context(" ".join(f"word{i}" for i in range(2000)))])[0]
    assert len(ids) == critic.max_length and critic.tokenizer.decode(ids).startswith("word0 word1 word2")


def test_a_deep_copy_of_the_critic_shares_its_frozen_backbone_and_learns_apart(tiny_model_path):  # noqa: F811
    import copy

    from trace_gym.predictor.critic import LMCriticPredictor

    critic = LMCriticPredictor(str(tiny_model_path), seed=0, lr=1e-1)
    twin = copy.deepcopy(critic)
    assert twin.backbone is critic.backbone and twin._features is critic._features
    assert twin.head is not critic.head
    before = critic.predict([Context("q")])
    twin.update([Context("q")], [1.0])
    assert critic.predict([Context("q")]) == pytest.approx(before)  # the original's head is untouched
    assert twin.predict([Context("q")])[0] > before[0]
    trained = LMCriticPredictor(str(tiny_model_path), seed=0, train_backbone=True)
    assert copy.deepcopy(trained).backbone is not trained.backbone  # a trained backbone is the predictor's own
