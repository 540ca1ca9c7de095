"""Tree rollouts on real rollouts: allocation, per-prompt expansion, ledger, targets."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from planted_env import PlantedEnv, planted_tasks

import trace_gym  # noqa: F401
from environments.math_python.generated import generate_digit_sums
from baselines import UniformRootAllocator
from trace_gym.agent.loop import AgentConfig, AgentRunner
from trace_gym.allocation.allocators import TracePrefixAllocator
from trace_gym.predictor.kinds import ConstantPredictor
from trace_gym.agent.rollout import collect, history_text
from trace_gym.strategies import STRATEGIES, shaped_strategies
from trace_gym.allocation.strategy import Strategy
from trace_gym.types import SamplingParams


@pytest.fixture(scope="module")
def runner(smollm2_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine

    eng = HFEngine(smollm2_path, dtype="auto")
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
    tasks = generate_digit_sums(6, seed=4)
    strategies = shaped_strategies(["trace"], group_size=4, continuations_per_root=2)
    # prompts 1 and 4 predicted near 0.5: TRACE's root stage must pick exactly those
    pred = RankPredictor({tasks[1].prompt: 0.5, tasks[4].prompt: 0.45} | {
        t.prompt: 0.02 for i, t in enumerate(tasks) if i not in (1, 4)})
    batch = collect(tasks, strategies["trace"], pred, runner, nominal_budget=8, rng=np.random.default_rng(0))
    # roots started: the 2 allocated, plus the fallback's where a prompt left no prefix
    assert [bool(m) for m in batch.root_counts.tolist()] == [False, True, False, False, True, False]
    assert min(batch.root_counts[[1, 4]]) >= 2 and batch.root_counts.sum() == batch.ledger.rollouts
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
        # a trainer's view of each episode: ids, loss mask and sampling logprobs, aligned
        for leaf in tree.leaves():
            tokens, mask, logprobs = tree.path_tokens(leaf.id)
            assert (tokens, mask) == tree.context(leaf.id) and len(logprobs) == len(tokens)
            path = [tree.nodes[i] for i in tree.path(leaf.id)]
            assert tokens[: len(tree.root.observation_token_ids)] == list(tree.root.observation_token_ids)
            assert [t for t, m in zip(tokens, mask) if m] == [t for n in path for t in n.policy_token_ids]
            assert [lp for lp, m in zip(logprobs, mask) if m] == [lp for n in path for lp in n.logprobs]
            assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)
            assert all(lp <= 0.0 for lp in logprobs) and sum(mask) > 0
    assert led.seconds["generation"] > 0 and led.env_steps >= 4
    assert runner.ledger.rollouts == 0  # the batch has its own ledger; the runner keeps none of it
    if led.continuations:
        assert batch.prefix_predictions


# ---------------------------------------------------------------------- failures and fallbacks (tiny model)
@pytest.fixture
def planted_runner(tiny_engine):  # noqa: F811
    PlantedEnv.instances = []
    r = AgentRunner(tiny_engine, tiny_engine.tokenizer, PlantedEnv, SamplingParams(temperature=1.0, seed=2),
                    AgentConfig(max_turn_tokens=8, max_episode_tokens=1024, max_turns=3))
    yield r
    r.close()
    assert PlantedEnv.instances and all(env.closed for env in PlantedEnv.instances)  # no env leaks


def test_the_steps_learning_half_reads_real_contexts_and_recursive_targets(planted_runner):
    tasks = planted_tasks(None, None)
    strategies = shaped_strategies(["random_tree"], group_size=2, continuations_per_root=2)
    batch = collect(tasks, strategies["random_tree"], ConstantPredictor(0.5), planted_runner, nominal_budget=4,
                    rng=np.random.default_rng(1), prefix_share=0.2)
    prompts = {t.id: t.prompt for t in tasks}
    learning = batch.learning
    contexts, targets, weights = learning.contexts, learning.targets, learning.weights
    assert learning.stats["n"] == len(contexts)  # the predictor was updated on exactly these
    prefix_weight = learning.prefix_weight
    roots = [c for c in contexts if c.depth == 0]
    assert len(roots) == len(batch.trees)
    for tree in batch.trees:
        assert targets[[c.prompt for c in contexts].index(prompts[tree.task_id])] == tree.targets()[0]
    deep = np.array([c.depth > 0 for c in contexts])
    assert deep.any() and set(weights[deep]) == {prefix_weight} and set(weights[~deep]) == {1.0}
    assert weights[deep].sum() / weights.sum() == pytest.approx(0.2)
    for c in contexts:
        if c.depth:
            assert c.history.startswith("assistant: ")
    tree = batch.trees[0]
    assert history_text(tree, 0) == ""


def test_env_failures_are_recorded_and_the_batch_goes_on(planted_runner):
    tasks = planted_tasks(None, "step", "reset", None)
    uniform = Strategy(UniformRootAllocator(2))
    batch = collect(tasks, uniform, ConstantPredictor(0.5), planted_runner, 8, np.random.default_rng(0))
    assert batch.root_counts.tolist() == [2, 2, 2, 2] and len(batch.trees) == 4
    by_task = {}
    for e in batch.errors:
        by_task.setdefault(e["task_id"], []).append(e)
    assert set(by_task) == {tasks[1].id, tasks[2].id}
    assert all(e["error"] == "RuntimeError in env.step: planted step failure" and e["leaf"] is not None
               for e in by_task[tasks[1].id])
    assert all(e["error"] == "RuntimeError in env.reset: planted reset failure" and e["leaf"] is None
               for e in by_task[tasks[2].id])
    stepped = batch.trees[1]
    assert all(leaf.info["env_error"].endswith("planted step failure") and leaf.info["truncation"] == "env_error"
               and leaf.reward == 0.0 for leaf in stepped.leaves())
    assert not batch.trees[2].leaves()  # its roots never started
    assert all(len(t.leaves()) == 2 and "env_error" not in t.leaves()[0].info for t in (batch.trees[0], batch.trees[3]))
    assert batch.ledger.errors == 4 and batch.extras["truncations"]["env_error"] == 2
    assert batch.ledger.rollouts == 8


def test_a_failing_predictor_aborts_collect_with_every_env_closed(planted_runner):
    class FailsOnPrefixes:
        def predict(self, contexts):
            if any(c.depth for c in contexts):
                raise RuntimeError("predictor broke")
            return np.full(len(contexts), 0.5)

    tree = Strategy(UniformRootAllocator(2), TracePrefixAllocator(), 2)
    with pytest.raises(RuntimeError, match="predictor broke"):
        collect(planted_tasks(None, None, None, None), tree, FailsOnPrefixes(), planted_runner, 8,
                np.random.default_rng(0))
    assert planted_runner.live == 0


def test_single_turn_episodes_buy_roots_and_an_odd_unit_is_in_the_ledger(tiny_engine):  # noqa: F811
    """max_turns = 1: no prefix to continue from. m = (2, 3) with N = 1 gives continuation
    budgets (2, 3): one and one fallback root, and one unit left unspent, on the record."""
    PlantedEnv.instances = []
    runner = AgentRunner(tiny_engine, tiny_engine.tokenizer, PlantedEnv, SamplingParams(temperature=1.0, seed=2),
                         AgentConfig(max_turn_tokens=8, max_episode_tokens=1024, max_turns=1))

    class TwoAndThree:
        def allocate(self, values, budget, rng):
            return np.array([2, budget - 2, 0])

    try:
        batch = collect(planted_tasks(None, None, None), Strategy(TwoAndThree(), TracePrefixAllocator(), 1),
                        ConstantPredictor(0.5), runner, 7.5, np.random.default_rng(0))
    finally:
        runner.close()
    # a single-turn runner: the continuation budgets (2, 3) become fallback roots in the first wave, none reserved
    assert batch.continuation_budgets.tolist() == [0, 0, 0] and batch.root_counts.tolist() == [3, 4, 0]
    assert [(p.extra_roots, p.unspent_continuations) for _, p in batch.plans] in (
        [(1, 0), (1, 1)], [(1, 1), (1, 0)])
    led = batch.ledger
    assert (led.rollouts, led.continuations, led.unspent_continuations, led.nominal) == (7, 0, 1, 7.0)
    assert [len(t.leaves()) for t in batch.trees] == [3, 4]
    assert all(leaf.depth == 1 for t in batch.trees for leaf in t.leaves())
    assert all(env.closed for env in PlantedEnv.instances)
