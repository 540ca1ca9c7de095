"""CPU thread ownership (trace_gym.threads): each component runs on its own count and
gives the previous one back, also past vLLM's no-op ``torch.set_num_threads``."""

from __future__ import annotations

import pytest
import torch

from trace_gym.threads import default_threads, resolve_threads, torch_threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield before
    torch._C.set_num_threads(before)


def test_torch_threads_sets_and_restores_even_on_an_exception(restore_threads):
    torch._C.set_num_threads(1)
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1
    with pytest.raises(RuntimeError), torch_threads(2):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 1
    with torch_threads(None):  # None: leave the count alone
        assert torch.get_num_threads() == 1


def test_torch_threads_works_after_vllm_replaced_the_setter(monkeypatch, restore_threads):
    """vLLM's CPU worker replaces torch.set_num_threads with a warning no-op."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    torch._C.set_num_threads(1)
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


def test_default_threads_follow_omp_num_threads_else_the_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_threads() == 1 == resolve_threads(0) == resolve_threads(None)
    monkeypatch.delenv("OMP_NUM_THREADS")
    import os

    assert default_threads() == len(os.sched_getaffinity(0))
    assert resolve_threads(3) == 3
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="positive integer"):
            resolve_threads(bad, "trainer.cpu_threads")


def test_the_update_runs_on_the_trainers_count_and_gives_the_engines_back(tiny_model_path, restore_threads):  # noqa: F811
    from trace_gym.advantages import treerpo
    from trace_gym.batches import token_tree
    from trace_gym.trainer import PolicyTrainer, TrainerConfig
    from trace_gym.tree import ROOT, RolloutTree

    trainer = PolicyTrainer(tiny_model_path, TrainerConfig(cpu_threads=2), device="cpu")
    seen = []
    inner = trainer._step
    trainer._step = lambda trees: (seen.append(torch.get_num_threads()), inner(trees))[1]
    tree = RolloutTree("t", [5, 6, 7])
    for reward in (0.0, 1.0):
        tree.add_turn(ROOT, branch=tree.start_branch(ROOT), policy_token_ids=[8, 9], observation_token_ids=[],
                      logprobs=[-1.0, -1.0], reward=reward, terminal=True)
    torch._C.set_num_threads(1)  # a 1-thread serving engine's count
    out = trainer.step([token_tree(tree, treerpo(tree))])
    assert seen == [2] and torch.get_num_threads() == 1 and out["trained_tokens"] > 0 and out["seconds"] > 0
    with pytest.raises(ValueError, match="trainer.cpu_threads"):
        TrainerConfig(cpu_threads=-2)
