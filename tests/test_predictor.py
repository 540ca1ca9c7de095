"""Success predictors: online learning from soft targets, validation, Spearman by depth."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.predictor import ConstantPredictor, Context, EmbeddingPredictor
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
    from trace_gym.predictor import LMCriticPredictor

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
