"""Tree rollouts: roots where the strategy says, then per-prompt prefix expansion.

One call to :func:`collect` is the rollout half of a training step (trace-method.md,
"One training step", steps 1-3):

1. score the candidate pool with the predictor (``predictor_scoring`` phase);
2. allocate root rollouts with the strategy's root allocator (:mod:`trace_gym.planning`);
3. run all root rollouts batched together; *as soon as one prompt's roots have all
   finished*, score its visited prefixes, allocate its continuation budget with the
   prefix allocator, restore the snapshots into fresh envs and continue from the
   cached token prefix; those continuations join the running batch at once. A prompt
   whose roots all ended after a single turn has no prefix to continue from; its
   continuation budget becomes ``budget // 2`` more root rollouts (a continuation from
   the root *is* a fresh rollout), so every strategy spends the same nominal budget.

Trees, the ledger (nominal and exact costs) and the predictor's view of every anchor
come back in a :class:`RolloutBatch`. :func:`predictor_samples` turns finished trees
into the predictor's regression set (recursive-mean targets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from trace_gym.agent import AgentRunner, Episode
from trace_gym.budget import BudgetLedger
from trace_gym.planning import allocate_roots, continuation_budgets, plan_expansion
from trace_gym.predictor import Context, SuccessPredictor
from trace_gym.tree import ROOT, RolloutTree
from trace_gym.types import Task


def history_text(tree: RolloutTree, node_id: int) -> str:
    """The serialised interaction from the prompt down to ``node_id`` (predictor input).

    One line block per turn: ``assistant: <action>`` then the observation messages as
    ``<role>: <content>``. The prompt itself is not included (it is ``Context.prompt``).
    """
    parts = []
    for i in tree.path(node_id)[1:]:
        node = tree.nodes[i]
        parts.append(f"assistant: {node.text}")
        parts.extend(f"{m['role']}: {m['content']}" for m in node.info.get("observation", ()))
    return "\n".join(parts)


def node_context(tree: RolloutTree, node_id: int, prompt: str) -> Context:
    """The predictor's :class:`Context` for one anchor of ``tree``."""
    return Context(prompt, history_text(tree, node_id), tree.nodes[node_id].depth)


@dataclass
class _PromptState:
    task: Task
    roots_left: int
    continuation_budget: int
    seed: int = 0
    tree: RolloutTree | None = None
    # tree node id -> (episode that produced it, number of that episode's turns up to it)
    origin: dict[int, tuple[Episode, int]] = field(default_factory=dict)


@dataclass
class RolloutBatch:
    """What :func:`collect` returns.

    Attributes:
        tasks: the candidate pool, in order.
        values: predicted success per candidate, shape (n_candidates,).
        root_counts: m_i root rollouts per candidate.
        continuation_budgets: continuations allotted per candidate.
        trees: one finished tree per chosen candidate (in candidate order).
        prefix_predictions: ``(tree index, node id, predicted value)`` for every prefix
            scored during expansion.
        ledger: nominal and exact costs of this batch.
    """

    tasks: list[Task]
    values: np.ndarray
    root_counts: np.ndarray
    continuation_budgets: np.ndarray
    trees: list[RolloutTree]
    prefix_predictions: list[tuple[int, int, float]]
    ledger: BudgetLedger


def collect(
    tasks: Sequence[Task],
    strategy: Any,
    predictor: SuccessPredictor,
    runner: AgentRunner,
    nominal_budget: float,
    rng: np.random.Generator,
    *,
    seed: int = 0,
) -> RolloutBatch:
    """Build rollout trees for one step at ``nominal_budget`` trajectory-equivalents.

    Args:
        tasks: candidate pool.
        strategy: a :class:`~trace_gym.strategies.Strategy` (root allocator, prefix
            allocator, ``budget_split``).
        predictor: scores prompts and prefixes.
        runner: the agent loop (engine + env factory); its ledger receives exact costs.
        nominal_budget: B; the strategy spends M roots + C continuations with
            M + C / 2 <= B.
        rng: randomness for stochastic allocators.
        seed: base env seed; root rollout j of candidate i resets with
            ``seed + 1000 * i + j``.
    """
    ledger = runner.ledger
    roots, continuations = strategy.budget_split(nominal_budget)
    with ledger.phase("predictor_scoring"):
        values = np.asarray(predictor.predict([Context(t.prompt) for t in tasks]), dtype=float)
    with ledger.phase("allocation"):
        m = allocate_roots(values, roots, strategy.root_allocator, rng)
        c = continuation_budgets(m, continuations) if strategy.expands else np.zeros(len(tasks), np.int64)
    states = {i: _PromptState(tasks[i], int(m[i]), int(c[i]), seed) for i in np.flatnonzero(m)}
    prefix_predictions: list[tuple[int, int, float]] = []
    order = {i: k for k, i in enumerate(states)}

    episodes = []
    try:
        for i, st in states.items():
            for j in range(st.roots_left):
                episodes.append(runner.start(st.task, seed=seed + 1000 * int(i) + j, group=(i, ROOT)))
    except BaseException:
        for ep in episodes:  # a later start failed (e.g. a prompt over the token limit)
            ep.env.close()
        raise
    ledger.add_rollouts(len(episodes))

    def on_finish(ep: Episode) -> list[Episode]:
        i, anchor = ep.group
        st = states[i]
        if st.tree is None:
            st.tree = RolloutTree(st.task.id, ep.prompt_ids, text=st.task.prompt)
        _append_episode(st, ep, anchor)
        if anchor != ROOT:
            return []
        st.roots_left -= 1
        if st.roots_left or not st.continuation_budget:
            return []
        return _expand(st, order[i], i, strategy, predictor, runner, rng, prefix_predictions)

    runner.run(episodes, on_finish)
    trees = [states[i].tree for i in states]
    return RolloutBatch(list(tasks), values, m, c, trees, prefix_predictions, ledger)


def _append_episode(st: _PromptState, ep: Episode, anchor: int) -> None:
    tree = st.tree
    branch = tree.start_branch(anchor)
    parent = anchor
    inherited = len(ep.turns) - len(ep.own_turns)
    own = ep.own_turns
    for n, turn in enumerate(own):
        last = n == len(own) - 1
        info = {"observation": [m.to_dict() for m in turn.obs_messages], "finish_reason": turn.finish_reason}
        if turn.truncation:
            info["truncation"] = turn.truncation
        if turn.cached_tokens is not None:
            info["cached_tokens"] = turn.cached_tokens
        parent = tree.add_turn(
            parent, branch=branch, policy_token_ids=turn.action_ids, observation_token_ids=turn.obs_ids,
            logprobs=turn.action_logprobs, text=turn.action_text, snapshot=turn.snapshot,
            reward=ep.reward if last else None, terminal=last, info=info,
        )
        st.origin[parent] = (ep, inherited + n + 1)


def _expand(st: _PromptState, tree_index: int, i: int, strategy: Any, predictor: SuccessPredictor,
            runner: AgentRunner, rng: np.random.Generator, log: list) -> list[Episode]:
    tree, ledger = st.tree, runner.ledger
    candidates = tree.expansion_candidates()
    if not candidates:
        # Every root rollout ended after one turn: there is no saved prefix to continue
        # from. A "continuation from the root" is a fresh rollout, so the budget flows
        # back to this prompt as root rollouts at the nominal rate (2 continuations = 1).
        extra = st.continuation_budget // 2
        st.continuation_budget = 0
        st.roots_left = extra
        base = 1000 * int(i) + len(tree.branches)
        new = [runner.start(st.task, seed=st.seed + base + j, group=(i, ROOT)) for j in range(extra)]
        ledger.add_rollouts(len(new))
        return new
    with ledger.phase("predictor_scoring"):
        values = np.asarray(predictor.predict([node_context(tree, n, st.task.prompt) for n, _ in candidates]))
    log.extend((tree_index, n, float(v)) for (n, _), v in zip(candidates, values))
    with ledger.phase("allocation"):
        plan = plan_expansion(tree, values, st.continuation_budget, strategy.prefix_allocator, rng)
    new: list[Episode] = []
    for node_id, k in plan:
        ep, turns = st.origin[node_id]
        new.extend(runner.branch(ep, turns, k, group=(i, node_id)))
    ledger.add_continuations(len(new))
    return new


def predictor_samples(
    trees: Sequence[RolloutTree], prompts: Sequence[str], *, prefix_weight: float = 1.0,
) -> tuple[list[Context], np.ndarray, np.ndarray]:
    """The predictor's regression set from finished trees.

    Every root (depth 0) and every non-leaf prefix with a target contributes one
    sample: its :class:`Context` and its recursive-mean target (``tree.targets()``).
    Prompt samples weigh 1, prefix samples ``prefix_weight`` (the paper's batches were
    about 94 % prompt samples).

    Returns:
        ``(contexts, targets (n,), weights (n,))``.
    """
    if prefix_weight < 0:
        raise ValueError(f"prefix_weight must be >= 0, got {prefix_weight}")
    contexts, targets, weights = [], [], []
    for tree, prompt in zip(trees, prompts, strict=True):
        for node_id, target in sorted(tree.targets().items()):
            node = tree.nodes[node_id]
            if node.terminal:
                continue
            contexts.append(node_context(tree, node_id, prompt))
            targets.append(target)
            weights.append(1.0 if node_id == ROOT else prefix_weight)
    return contexts, np.asarray(targets, float), np.asarray(weights, float)


def update_predictor(predictor: SuccessPredictor, batch: RolloutBatch, *, prefix_weight: float = 1.0) -> dict:
    """Step 4 of a training step: regress the predictor on ``batch``'s finished trees
    (recursive-mean targets), timed in the ledger's ``predictor_update`` phase."""
    prompts = {t.id: t.prompt for t in batch.tasks}
    with batch.ledger.phase("predictor_update"):
        return predictor.update(*predictor_samples(batch.trees, [prompts[t.task_id] for t in batch.trees],
                                                   prefix_weight=prefix_weight))
