"""A predictor that learns like one: a replay buffer (its level does not follow the last
batch), per-prompt Beta-binomial evidence, and state that a checkpoint carries through the
SuccessPredictor Protocol (a run resumed after step k predicts exactly as an uninterrupted one)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_gym.predictor.kinds import Context, EmbeddingPredictor, PREDICTORS, PredictorKind
from trace_gym.predictor.memory import PromptEvidence, ReplayBuffer, blend_evidence, prompt_key

# ---------------------------------------------------------------------- the pieces, by hand


def test_replay_buffer_weights_by_recency_and_bounds_its_size():
    buf = ReplayBuffer(half_life=2.0, capacity=5)
    buf.add(["a", "b"], np.array([1.0, 0.0]), np.array([1.0, 2.0]))
    buf.add(["c"], np.array([0.5]), np.array([1.0]))
    items, y, w = buf.samples()
    # a and b are one update old: 0.5 ** (1 / 2) of their weight; c is new
    assert items == ["a", "b", "c"] and y.tolist() == [1.0, 0.0, 0.5]
    assert w == pytest.approx([2 ** -0.5, 2 * 2 ** -0.5, 1.0])
    buf.add(["d", "e", "f"], np.zeros(3), np.ones(3))  # 6 samples > capacity 5: the oldest goes
    assert buf.samples()[0] == ["b", "c", "d", "e", "f"] and len(buf) == 5
    for _ in range(14):  # 2 * log2(100) = 13.3 updates: a sample's weight is below 1 %, it is dropped
        buf.add([], np.zeros(0), np.zeros(0))
    assert len(buf) == 0
    with pytest.raises(ValueError, match="half_life"):
        ReplayBuffer(half_life=0)


def test_replay_buffer_state_round_trips():
    buf = ReplayBuffer(half_life=3.0, capacity=10)
    buf.add(np.eye(3, dtype=np.float32), np.array([1.0, 0.0, 1.0]), np.ones(3))
    buf.add(np.ones((1, 3), np.float32), np.array([0.0]), np.ones(1))
    twin = ReplayBuffer()
    twin.load_state_dict(buf.state_dict())
    for a, b in zip(buf.samples(), twin.samples()):
        assert np.array_equal(a, b)


def test_evidence_discounts_and_blends_as_a_beta_posterior_by_hand():
    ev = PromptEvidence(discount=0.5, strength=2.0)
    ev.observe(["p"], [3], [4])
    assert ev.counts(["p", "q"]) == (pytest.approx([3, 0]), pytest.approx([4, 0]))
    ev.tick()  # one update later: half the evidence
    s, n = ev.counts(["p"])
    assert (s[0], n[0]) == (1.5, 2.0)
    # (2 * 0.2 + 1.5) / (2 + 2) = 0.475; an unseen prompt keeps the head's value
    assert ev.blend(["p", "q"], np.array([0.2, 0.2])) == pytest.approx([0.475, 0.2])
    assert blend_evidence(np.array([0.5]), np.array([0.0]), np.array([0.0]), 4.0) == pytest.approx([0.5])
    with pytest.raises(ValueError, match="successes <= trials"):
        ev.observe(["p"], [3], [2])


# ---------------------------------------------------------------------- the embedding predictor
A_PROMPTS = [f"Compute {i} + {i + 3} and give the sum." for i in range(12)]
B_PROMPTS = [f"Name the capital city of country number {i}." for i in range(12)]


def contexts(prompts):
    return [Context(p) for p in prompts]


@pytest.fixture(scope="module")
def predictor_factory():
    EmbeddingPredictor(seed=0)  # load MiniLM once
    return lambda **kw: EmbeddingPredictor(**{"seed": 0, **kw})


def test_the_level_does_not_follow_the_last_batch(predictor_factory):
    # batch A: arithmetic prompts that succeed 80 % of the time; then a batch B of other prompts that
    # all failed. With memory the predictor still knows A; without it (the old head: one batch) it
    # drags A's level down toward B's.
    targets_a = np.full(len(A_PROMPTS), 0.8)
    remembered, forgetful = predictor_factory(), predictor_factory(replay_capacity=1)
    for p in (remembered, forgetful):
        for _ in range(3):
            p.update(contexts(A_PROMPTS), targets_a)
        p.update(contexts(B_PROMPTS), np.zeros(len(B_PROMPTS)))
    assert np.abs(remembered.predict(contexts(A_PROMPTS)) - 0.8).max() < 0.1
    assert remembered.predict(contexts(B_PROMPTS)).max() < 0.25
    assert np.abs(forgetful.predict(contexts(A_PROMPTS)) - 0.8).max() > 0.1  # the planted no-memory variant fails


def test_a_prompts_own_outcomes_move_its_prediction_toward_its_rate(predictor_factory):
    p = predictor_factory(evidence_strength=4.0)
    p.update(contexts(A_PROMPTS), np.full(len(A_PROMPTS), 0.5))
    head = p.predict(contexts(A_PROMPTS[:2]))
    p.observe_outcomes(contexts(A_PROMPTS[:1]), [8], [8])  # prompt 0: 8 of 8 succeeded
    after = p.predict(contexts(A_PROMPTS[:2]))
    assert after[0] == pytest.approx((4 * head[0] + 8) / 12) and after[0] > head[0] + 0.25
    assert after[1] == pytest.approx(head[1])  # another prompt: untouched
    # prefixes (depth > 0) read the head alone
    prefix = Context(A_PROMPTS[0], "turn one", 1)
    assert p.predict([prefix]) == pytest.approx(p.predict_head([prefix]))


def test_state_dict_restores_every_prediction(predictor_factory):
    p = predictor_factory()
    p.update(contexts(A_PROMPTS), np.linspace(0, 1, len(A_PROMPTS)))
    p.observe_outcomes(contexts(A_PROMPTS[:3]), [1, 2, 3], [4, 4, 4])
    twin = predictor_factory(seed=5)
    twin.load_state_dict(p.state_dict())
    probe = contexts(A_PROMPTS + B_PROMPTS)
    assert np.array_equal(p.predict(probe), twin.predict(probe))
    p.update(contexts(B_PROMPTS), np.zeros(len(B_PROMPTS)))  # and they keep learning alike
    twin.update(contexts(B_PROMPTS), np.zeros(len(B_PROMPTS)))
    assert np.allclose(p.predict(probe), twin.predict(probe), atol=1e-6)


# ---------------------------------------------------------------------- resume through the Protocol
class MemoPredictor:
    """A throwaway predictor kind whose whole state lives outside any ``head``: a table of
    each prompt's running mean target, and how many updates it has seen."""

    calls: list = []

    def __init__(self, seed: int = 0):
        self.table: dict[str, tuple[float, int]] = {}
        self.updates = 0

    def predict(self, ctx):
        values = np.array([self.table[c.prompt][0] if c.prompt in self.table else 0.5 for c in ctx])
        MemoPredictor.calls.append((self.updates, [c.prompt for c in ctx], values.tolist()))
        return values

    def update(self, ctx, targets, weights=None):
        for c, t in zip(ctx, targets):
            mean, n = self.table.get(c.prompt, (0.0, 0))
            self.table[c.prompt] = ((mean * n + float(t)) / (n + 1), n + 1)
        self.updates += 1
        return {"n": float(len(ctx))}

    def state_dict(self):
        return {"table": dict(self.table), "updates": self.updates}

    def load_state_dict(self, state):
        self.table, self.updates = dict(state["table"]), state["updates"]


class StatelessMemo(MemoPredictor):
    """The planted bug: a kind whose checkpoint carries nothing (what name-based saving did)."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _train(run_dir, steps, tiny_model_path, kind):
    from trace_gym.commands.train import resolve_train_setup
    from trace_gym.config import load_config
    from trace_gym.train.config import TrainConfig
    from trace_gym.train.loop import train

    cfg = load_config(TrainConfig, None, {"run_dir": str(run_dir), "policy": str(tiny_model_path), "env": "guess_number",
                                   "predictor": kind, "steps": str(steps), "candidates": "4", "root_budget": "2",
                                   "max_turns": "2", "max_turn_tokens": "4", "max_episode_tokens": "256",
                                   "progress": "false", "engine": "hf", "strategy": "trace"})
    train(cfg, resolve_train_setup(cfg))


def _step3_calls(calls):
    return [(prompts, values) for updates, prompts, values in calls if updates == 2]


@pytest.mark.parametrize("kind, resumes", [("memo", True), ("stateless_memo", False)])
def test_a_run_resumed_after_step_k_predicts_as_an_uninterrupted_one(tmp_path, tiny_model_path, monkeypatch,
                                                                      kind, resumes):  # noqa: F811
    monkeypatch.setitem(PREDICTORS, "memo", PredictorKind(f"{__name__}:MemoPredictor", "text", "test"))
    monkeypatch.setitem(PREDICTORS, "stateless_memo", PredictorKind(f"{__name__}:StatelessMemo", "text", "test"))
    MemoPredictor.calls = []
    _train(tmp_path / "whole", 3, tiny_model_path, kind)
    whole = _step3_calls(MemoPredictor.calls)
    _train(tmp_path / "cut", 2, tiny_model_path, kind)  # stops after step 2 (its last complete checkpoint)
    MemoPredictor.calls = []
    _train(tmp_path / "cut", 3, tiny_model_path, kind)  # resumes from it for step 3
    resumed = _step3_calls(MemoPredictor.calls)
    assert whole and (resumed == whole) == resumes


def test_a_predictor_without_state_is_refused_before_step_one():
    from trace_gym.runs.checkpoint import predictor_state, require_predictor_state

    class Bare:
        def predict(self, ctx):
            return np.zeros(len(ctx))

        def update(self, ctx, targets, weights=None):
            return {}

    with pytest.raises(TypeError, match="Bare has no state_dict or load_state_dict"):
        require_predictor_state(Bare())
    with pytest.raises(TypeError):
        predictor_state(Bare())
    assert math.isfinite(len(prompt_key(Context("x"))))
