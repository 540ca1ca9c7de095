"""Tree rollouts on real rollouts: allocation, per-prompt expansion, ledger, targets."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from engine_fixtures import smollm2_path  # noqa: F401  (fixture)

import trace_gym  # noqa: F401
from environments.math_python.generated import generate_digit_sums
from trace_gym.agent import AgentConfig, AgentRunner
from trace_gym.predictor import ConstantPredictor
from trace_gym.rollout import collect, history_text, predictor_samples
from trace_gym.strategies import shaped_strategies
from trace_gym.types import SamplingParams


@pytest.fixture(scope="module")
def runner(smollm2_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine

    eng = HFEngine(smollm2_path, dtype="bfloat16")
    make_env = lambda: gymnasium.make("trace_gym/MathPython-v0", disable_env_checker=True, few_shot=True,  # noqa
                                      answer_extraction="boxed_or_last_number")
    r = AgentRunner(eng, eng.tokenizer, make_env, SamplingParams(temperature=1.0, seed=0),
                    AgentConfig(max_turn_tokens=48, max_episode_tokens=2048, max_turns=3))
    yield r
    r.close()
    eng.close()


class RankPredictor:
    """Scores prompts by a fixed preference (a real, deterministic predictor)."""

    def __init__(self, values):
        self.values = dict(values)

    def predict(self, contexts):
        return np.array([self.values.get(c.prompt, 0.5) if c.depth == 0 else 0.5 for c in contexts])

    def update(self, contexts, targets, weights=None):
        return {}


def test_trace_collect_spends_the_nominal_budget_on_trees(runner):
    from trace_gym.budget import BudgetLedger

    runner.ledger = BudgetLedger()
    tasks = generate_digit_sums(6, seed=4)
    strategies = shaped_strategies(["trace"], group_size=4, continuations_per_root=2)
    # prompts 1 and 4 predicted near 0.5: TRACE's root stage must pick exactly those
    pred = RankPredictor({tasks[1].prompt: 0.5, tasks[4].prompt: 0.45} | {
        t.prompt: 0.02 for i, t in enumerate(tasks) if i not in (1, 4)})
    batch = collect(tasks, strategies["trace"], pred, runner, nominal_budget=8, rng=np.random.default_rng(0))
    assert batch.root_counts.tolist() == [0, 2, 0, 0, 2, 0]
    assert batch.continuation_budgets.tolist() == [0, 4, 0, 0, 4, 0]
    assert [t.task_id for t in batch.trees] == [tasks[1].id, tasks[4].id]
    led = batch.ledger
    # every unit of budget spent: continuations where prefixes exist, extra roots otherwise
    assert led.nominal == pytest.approx(8.0)
    for tree in batch.trees:
        assert tree.is_complete()
        for b in tree.branches:
            if b.is_continuation:  # a continuation starts below the root, from a root rollout's prefix
                assert tree.nodes[b.anchor].depth >= 1
                assert not tree.nodes[tree.branches[tree.nodes[b.anchor].branch].anchor].is_continuation
        # the tree's token contexts are exactly what the episodes saw
        for leaf in tree.leaves():
            tokens, mask = tree.context(leaf.id)
            assert len(tokens) == len(mask) and sum(mask) == sum(
                len(tree.nodes[i].policy_token_ids) for i in tree.path(leaf.id))
    assert led.seconds["generation"] > 0 and led.env_steps >= 4
    if led.continuations:
        assert batch.prefix_predictions


def test_predictor_samples_use_recursive_targets(runner):
    tasks = generate_digit_sums(2, seed=8)
    strategies = shaped_strategies(["random_tree"], group_size=2, continuations_per_root=2)
    batch = collect(tasks, strategies["random_tree"], ConstantPredictor(0.5), runner, nominal_budget=4,
                    rng=np.random.default_rng(1))
    prompts = {t.id: t.prompt for t in tasks}
    contexts, targets, weights = predictor_samples(batch.trees, [prompts[t.task_id] for t in batch.trees],
                                                   prefix_weight=0.25)
    roots = [c for c in contexts if c.depth == 0]
    assert len(roots) == len(batch.trees)
    for tree in batch.trees:
        assert targets[[c.prompt for c in contexts].index(prompts[tree.task_id])] == tree.targets()[0]
    assert set(weights[[c.depth > 0 for c in contexts]]) <= {0.25}
    for c in contexts:
        if c.depth:
            assert c.history.startswith("assistant: ")
    tree = batch.trees[0]
    assert history_text(tree, 0) == ""

