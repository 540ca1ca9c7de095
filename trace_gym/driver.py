"""The one step driver: roots where the strategy says, per-prompt prefix expansion, then
the predictor's update on the finished trees.

:func:`run_step` is the step every consumer shares (trace-method.md, "One training
step", steps 1-4): training, the simulated bench and the real-rollout bench call it and
differ only in the :class:`BranchRunner` and the predictor they pass. Its rollout half:

1. score the candidate pool with the predictor (``predictor_scoring`` phase);
2. allocate root rollouts with the strategy's root allocator and split the
   continuation budget over the chosen prompts (:mod:`trace_gym.planning`);
3. start every chosen prompt's root rollouts; *as soon as one prompt's roots have all
   returned*, score its visited prefixes and plan its continuations
   (:func:`trace_gym.planning.plan_expansion`, single-turn fallback included), and
   start them at once, while other prompts' rollouts are still running.

Its learning half (:func:`update_predictor`), once every branch is back:

4. the predictor's regression set from the trees' recursive-mean targets
   (:func:`predictor_samples`, contexts through the runner's ``prompt_context`` /
   ``node_context``), prefix samples weighted to hold ``prefix_share`` of the batch
   (:func:`prefix_weight_for_share`), one ``predictor.update`` (``predictor_update``
   phase), and the no-contrast warning when every leaf has the same outcome
   (:func:`reward_warning`).

Every decision is made here or in :mod:`trace_gym.planning`; how a branch is run
(a model in an env, or the simulator's martingale) is a :class:`BranchRunner`'s
business: :class:`trace_gym.rollout.AgentBranchRunner` for real rollouts,
:class:`trace_gym.sim.SimBranchRunner` for the simulator,
:class:`trace_gym.banks.replay.BankBranchRunner` for a recorded rollout bank. So a simulated number and a
real number mean the same thing. Each call records into its own
:class:`~trace_gym.budget.BudgetLedger`: the nominal units it decided on (roots,
continuations, unspent units) and, from the runner, the exact ones (tokens, env steps,
seconds per phase).

Randomness: ``rng`` is used for the root allocation, then seeds one child generator
per chosen prompt (one draw each, so all state stays in ``rng``'s bit generator) for
that prompt's expansion: the decisions do not depend on the order in which prompts'
rollouts happen to return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from trace_gym.budget import BudgetLedger
from trace_gym.planning import ExpansionPlan, allocate_roots, continuation_budgets, plan_expansion, single_turn_fallback
from trace_gym.predictor import ObservesOutcomes, SuccessPredictor
from trace_gym.strategy import Strategy
from trace_gym.tree import ROOT, SUCCESS_THRESHOLD, RolloutTree

#: Default share of the predictor's batch weight on prefix samples (the paper: about 6 %).
PREFIX_SHARE = 0.06


@dataclass(frozen=True)
class BranchResult:
    """One branch (root rollout or continuation) that came back.

    Attributes:
        key: the tree it belongs to (the driver uses the candidate index).
        anchor: the node it started from (``ROOT`` for a root rollout).
        leaf: the leaf it appended to the tree, or ``None`` when it ended before its
            first turn (an env that failed to reset or restore).
        error: what went wrong, when it ended on an error (the leaf, if any, is a
            truncated failure), else ``None``.
    """

    key: Hashable
    anchor: int
    leaf: int | None
    error: str | None = None


@runtime_checkable
class BranchRunner(Protocol):
    """What the step driver needs from a rollout backend.

    The runner owns how branches run; it decides nothing about which to run. Trees are
    made by the runner (``new_tree``) and grow only through it: every branch that comes
    back from ``advance`` has been appended to its tree (one node per turn, reward at
    the leaf). Exact costs go to the ledger passed to ``advance``.

    Optional: a ``single_turn`` attribute, ``True`` when no branch can outlive its first
    turn (``max_turns == 1``, or an env that says so): :func:`run_step` then plans the
    single-turn fallback before the first round, so all of a prompt's roots generate in
    it instead of the fallback roots waiting for a second, narrower round (the same as
    ``run_step(..., fallback_first=True)``, which a caller passes on a forecast). And a
    ``difficulty_knobs`` attribute: the env's :class:`~trace_gym.env.DifficultyKnobs`,
    named by the no-contrast warning (:func:`reward_warning`).
    """

    def prompt_context(self, candidate: Any) -> Any:
        """What the predictor reads for a candidate prompt."""
        ...

    def node_context(self, key: Hashable, node_id: int) -> Any:
        """What the predictor reads for a node of tree ``key``."""
        ...

    def new_tree(self, key: Hashable, candidate: Any) -> RolloutTree:
        """The (empty) tree of a chosen candidate, known from now on as ``key``."""
        ...

    def start_roots(self, key: Hashable, count: int, ledger: BudgetLedger) -> None:
        """Start ``count`` root rollouts of tree ``key``."""
        ...

    def start_continuations(self, key: Hashable, node_id: int, count: int, ledger: BudgetLedger) -> None:
        """Start ``count`` continuations from node ``node_id`` of tree ``key``."""
        ...

    def advance(self, ledger: BudgetLedger) -> list[BranchResult]:
        """Make progress; return the branches that ended since the last call."""
        ...

    @property
    def live(self) -> int:
        """Branches started and not yet returned."""
        ...

    def cancel(self) -> None:
        """Drop every live branch and release what it holds (envs); never raises."""
        ...


@dataclass
class StepResult:
    """What :func:`run_step` returns.

    Attributes:
        values: predicted success per candidate, shape (n_candidates,).
        root_counts: m_i root rollouts allocated per candidate, int64 (n_candidates,).
        continuation_budgets: continuations allotted per candidate, int64 (n_candidates,).
        trees: one tree per chosen candidate (m_i > 0), in candidate order.
        tree_candidates: the candidate index of each tree, int64 (n_trees,).
        plans: ``(candidate index, ExpansionPlan)`` per prompt that had a continuation
            budget, in the order the plans were made.
        prefix_predictions: ``(tree index, node id, predicted value)`` for every prefix
            scored during expansion.
        errors: one dict per branch that ended on an error: ``{"candidate", "anchor",
            "leaf", "error"}`` (``leaf`` is ``None`` when it ended before its first turn).
        fallback_first: whether the single-turn fallback was planned before the first round.
        prefixes_seen: visited prefixes over the finished trees (``expansion_candidates``):
            0 means every root rollout ended after one turn, the forecast behind
            :func:`forecast_fallback_first`; with ``fallback_first`` and a positive count
            the forecast missed (those prefixes went unexpanded, the budget bought roots).
        ledger: nominal and exact costs of this step.
        learning: the predictor update of the step (``None`` when ``learn=False``).
        extras: what a runner or bench source adds (a bank's draw sizes, the candidates'
            true rates for the predictor-quality measures as ``extras["truth"]``, ...).
    """

    values: np.ndarray
    root_counts: np.ndarray
    continuation_budgets: np.ndarray
    trees: list[RolloutTree]
    tree_candidates: np.ndarray
    plans: list[tuple[int, ExpansionPlan]] = field(default_factory=list)
    prefix_predictions: list[tuple[int, int, float]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    ledger: BudgetLedger = field(default_factory=BudgetLedger)
    learning: Learning | None = None
    fallback_first: bool = False
    prefixes_seen: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


def forecast_fallback_first(previous: StepResult | None) -> bool:
    """Whether the next step should plan the single-turn fallback before its first round:
    the previous step had trees and not one visited prefix (every root rollout ended
    after its first turn, as on a task the policy answers at once). A miss costs one
    step's prefixes (their budget buys fresh roots instead) and switches it off, since
    that step then saw prefixes."""
    return previous is not None and bool(previous.trees) and previous.prefixes_seen == 0


@dataclass
class Learning:
    """The learning half of a step (:func:`update_predictor`).

    Attributes:
        contexts: the regression set, what the predictor read (n samples).
        targets: recursive-mean targets in [0, 1], shape (n,).
        weights: 1 for prompt samples, the prefix weight for prefix samples, shape (n,).
        tree_index, node_ids, depths: where each sample sits, int64 (n,).
        prefix_weight: the weight of each prefix sample.
        prefix_predictions: with ``score_prefixes``, the predictor's values on the prefix
            samples (``depths > 0``, in sample order) *before* the update, else ``None``.
        stats: what ``predictor.update`` returned (``loss``, ``n``, ...).
        warning: the no-contrast warning (:func:`reward_warning`), or ``None``.
    """

    contexts: list[Any]
    targets: np.ndarray
    weights: np.ndarray
    tree_index: np.ndarray
    node_ids: np.ndarray
    depths: np.ndarray
    prefix_weight: float
    prefix_predictions: np.ndarray | None
    stats: dict[str, Any]
    warning: str | None


@dataclass
class _Prompt:
    tree: RolloutTree
    tree_index: int
    roots_out: int  # root rollouts started and not yet back
    continuation_budget: int  # still to plan
    rng: np.random.Generator


def run_step(
    candidates: Sequence[Any],
    strategy: Strategy,
    predictor: SuccessPredictor,
    runner: BranchRunner,
    nominal_budget: float,
    rng: np.random.Generator,
    *,
    learn: bool = True,
    prefix_share: float = PREFIX_SHARE,
    score_prefixes: bool = False,
    fallback_first: bool = False,
) -> StepResult:
    """One step: the rollout trees at ``nominal_budget`` trajectory-equivalents, then
    (``learn``) the predictor's update on them.

    Args:
        candidates: the candidate pool, as the runner knows them (``Task`` for real
            rollouts, task indices for the simulator).
        strategy: root allocator, prefix allocator and budget shape.
        predictor: scores what ``runner.prompt_context`` / ``node_context`` return.
        runner: runs the branches.
        nominal_budget: B; the strategy spends M roots + C continuations with
            M + C / 2 <= B (an odd continuation budget in the single-turn fallback
            leaves one unit unspent, recorded in ``ledger.unspent_continuations``).
        rng: randomness for stochastic allocators (see the module docstring).
        learn: run the learning half (:func:`update_predictor`) once the trees are finished.
        prefix_share: share of the predictor's batch weight on prefix samples.
        score_prefixes: also record the predictor's values on the prefix samples before
            it trains on them (``Learning.prefix_predictions``; the benches' prefix Spearman).
        fallback_first: plan every prompt's single-turn fallback before the first round
            (:func:`forecast_fallback_first`; implied by a ``single_turn`` runner).

    On any exception (a predictor or allocator error, an engine failure) every live
    branch is cancelled, releasing its env, before the exception propagates. An env
    failure is not an exception here: its branch comes back with ``error`` set.
    """
    ledger = BudgetLedger()
    root_budget, cont_budget = strategy.budget_split(nominal_budget)
    with ledger.phase("predictor_scoring"):
        values = np.asarray(predictor.predict([runner.prompt_context(c) for c in candidates]), dtype=float)
    with ledger.phase("allocation"):
        m = allocate_roots(values, root_budget, strategy.root_allocator, rng)
        c = continuation_budgets(m, cont_budget) if strategy.expands else np.zeros(len(m), dtype=np.int64)
    chosen = np.flatnonzero(m)
    step = StepResult(values, m, c, [], chosen.astype(np.int64), ledger=ledger)
    child_rngs = [np.random.default_rng(s) for s in rng.integers(2**63, size=len(chosen)).tolist()]
    prompts: dict[int, _Prompt] = {}
    try:
        for n, (i, prompt_rng) in enumerate(zip(chosen.tolist(), child_rngs)):
            prompts[i] = _Prompt(runner.new_tree(i, candidates[i]), n, int(m[i]), int(c[i]), prompt_rng)
            step.trees.append(prompts[i].tree)
        # no prefix can exist (or none is forecast): the fallback roots join the first round
        step.fallback_first = bool(fallback_first or getattr(runner, "single_turn", False))
        if step.fallback_first:
            for i, p in prompts.items():
                if p.continuation_budget > 0:
                    _plan_single_turn(i, p, step)
        for i, p in prompts.items():
            runner.start_roots(i, p.roots_out, ledger)
        ledger.add_rollouts(int(m.sum()) + sum(plan.extra_roots for _, plan in step.plans))
        while runner.live:
            for result in runner.advance(ledger):
                p = prompts[result.key]
                if result.error is not None:
                    step.errors.append({"candidate": result.key, "anchor": result.anchor, "leaf": result.leaf,
                                        "error": result.error})
                if result.anchor == ROOT:
                    p.roots_out -= 1
                if p.roots_out == 0 and p.continuation_budget > 0:
                    _expand(result.key, p, strategy, predictor, runner, step)
    except BaseException:
        runner.cancel()
        raise
    step.prefixes_seen = sum(len(t.expansion_candidates()) for t in step.trees)
    if learn:
        step.learning = update_predictor(step, predictor, runner, prefix_share, score_prefixes)
    return step


def _plan_single_turn(key: int, p: _Prompt, step: StepResult) -> None:
    """A prompt of a single-turn runner: its :func:`~trace_gym.planning.single_turn_fallback`
    is known before any rollout, so its extra roots start with its first ones (not in a
    second, narrower round once those are back)."""
    with step.ledger.phase("allocation"):
        plan = single_turn_fallback(p.continuation_budget)
    p.continuation_budget = 0
    p.roots_out += plan.extra_roots
    step.plans.append((key, plan))
    step.ledger.add_unspent_continuations(plan.unspent_continuations)


def _expand(key: int, p: _Prompt, strategy: Strategy, predictor: SuccessPredictor, runner: BranchRunner,
            step: StepResult) -> None:
    """Plan and start one prompt's continuations, now that its roots are back."""
    ledger = step.ledger
    candidates = p.tree.expansion_candidates()
    prefix_values = np.zeros(0)
    if candidates:
        with ledger.phase("predictor_scoring"):
            prefix_values = np.asarray(predictor.predict([runner.node_context(key, n) for n, _ in candidates]),
                                       dtype=float)
        step.prefix_predictions.extend((p.tree_index, n, float(v)) for (n, _), v in zip(candidates, prefix_values))
    with ledger.phase("allocation"):
        plan = plan_expansion(p.tree, prefix_values, p.continuation_budget, strategy.prefix_allocator, p.rng,
                              root_value=float(step.values[key]))
    p.continuation_budget = 0
    step.plans.append((key, plan))
    for node_id, k in plan.continuations:
        runner.start_continuations(key, node_id, k, ledger)
    ledger.add_continuations(plan.spent_continuations)
    if plan.extra_roots:
        p.roots_out += plan.extra_roots
        runner.start_roots(key, plan.extra_roots, ledger)
        ledger.add_rollouts(plan.extra_roots)
    ledger.add_unspent_continuations(plan.unspent_continuations)


# ---------------------------------------------------------------------- the learning half
def predictor_samples(
    trees: Sequence[RolloutTree], context: Callable[[int, int], Any], *, estimator: str = "recursive",
    root_rollouts_only: bool = False,
) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
    """The predictor's regression set from finished trees.

    Every non-terminal node with a target (the root, depth 0, and every visited prefix)
    gives one sample: ``context(tree index, node id)`` and its target from
    ``tree.targets(estimator, outcomes=True)`` (the recursive mean by default). With
    ``root_rollouts_only``, nodes inside continuations give none (their anchors' targets
    still average over them).

    Returns:
        ``(contexts, targets (n,), tree index (n,), node id (n,))``, trees in order and
        nodes by id within a tree.
    """
    contexts, targets, where = [], [], []
    for t, tree in enumerate(trees):
        for node_id, target in sorted(tree.targets(estimator, outcomes=True).items()):  # a success probability
            node = tree.nodes[node_id]
            if not node.terminal and not (root_rollouts_only and node.is_continuation):
                contexts.append(context(t, node_id))
                targets.append(target)
                where.append((t, node_id))
    index = np.asarray(where, dtype=np.int64).reshape(-1, 2)
    return contexts, np.asarray(targets, dtype=float), index[:, 0], index[:, 1]


def prefix_weight_for_share(n_prompt: int, n_prefix: int, share: float) -> float:
    """Weight of each prefix sample so that prefix samples hold ``share`` of a batch's
    total weight, prompt samples weighing 1 each (the paper's batches: about 6 % prefix)."""
    if not 0 <= share < 1:
        raise ValueError(f"prefix share must lie in [0, 1), got {share!r}")
    if n_prefix == 0 or n_prompt == 0:
        return 1.0
    return share / (1 - share) * n_prompt / n_prefix


def knob_hint(knobs: Mapping[str, str] | None) -> str:
    """The tail of a no-contrast message naming the env's own difficulty knobs
    (:class:`~trace_gym.env.DifficultyKnobs`); ``""`` when it declares none."""
    if not knobs:
        return ""
    return "; this env's difficulty knobs: " + "; ".join(f"{name}: {text}" for name, text in knobs.items())


def reward_warning(trees: Sequence[RolloutTree], knobs: Mapping[str, str] | None = None) -> str | None:
    """A one-line warning when every finished leaf has the same outcome (all 0 or all 1):
    then no prompt is mixed and no strategy can find contrast; a group-relative update
    learns nothing. It ends with the env's own difficulty ``knobs`` (:func:`knob_hint`).
    ``None`` otherwise (or with no leaves)."""
    rewards = [leaf.reward for t in trees for leaf in t.leaves() if leaf.reward is not None]
    if not rewards:
        return None
    wins = sum(r >= SUCCESS_THRESHOLD for r in rewards)
    if 0 < wins < len(rewards):
        return None
    low, high = min(rewards), max(rewards)
    seen = f"reward {low:g}" if low == high else f"rewards {low:g} to {high:g}"
    outcome = (f"failed ({seen}, below the success threshold {SUCCESS_THRESHOLD:g})" if wins == 0
               else f"succeeded ({seen})")
    return (f"every one of the {len(rewards)} rollouts {outcome}: no prompt is mixed, so there is no "
            f"contrast to find and a group-relative update learns nothing{_ADVICE}"
            + ("easier, the policy stronger or the turn/token limits larger" if wins == 0 else "harder")
            + knob_hint(knobs))


#: where a no-contrast warning's advice (what to change, the env's knobs) starts
_ADVICE = "; make the tasks "


def brief_repeats(warnings: Sequence[str]) -> list[str]:
    """``warnings`` (of :func:`reward_warning`, each maybe prefixed with where it arose)
    with the advice of every repeat cut to "as above": the first one with a given advice
    keeps it whole, so a run whose every arm or step found no contrast says the advice once."""
    seen: set[str] = set()
    out = []
    for line in warnings:
        head, sep, advice = line.partition(_ADVICE)
        if sep and advice in seen:
            out.append(f"{head}; what to change: as above")
        else:
            seen.add(advice)
            out.append(line)
    return out


def update_predictor(step: StepResult, predictor: SuccessPredictor, runner: BranchRunner, prefix_share: float,
                     score_prefixes: bool = False, root_rollouts_only: bool = False) -> Learning:
    """Step 4: regress the predictor on the step's trees (see the module docstring;
    ``root_rollouts_only``: :func:`predictor_samples`)."""
    keys = step.tree_candidates.tolist()
    contexts, targets, tree_index, node_ids = predictor_samples(
        step.trees, lambda t, node: runner.node_context(keys[t], node), root_rollouts_only=root_rollouts_only)
    depths = np.array([step.trees[t].nodes[n].depth for t, n in zip(tree_index, node_ids)], dtype=np.int64)
    prefix = depths > 0
    weight = prefix_weight_for_share(int((~prefix).sum()), int(prefix.sum()), prefix_share)
    weights = np.where(prefix, weight, 1.0)
    scored = None
    if score_prefixes:  # before the update: what the predictor knew when it allocated
        chosen = [c for c, p in zip(contexts, prefix) if p]
        scored = np.asarray(predictor.predict(chosen), dtype=float) if chosen else np.zeros(0)
    with step.ledger.phase("predictor_update"):
        stats = predictor.update(contexts, targets, weights) if contexts else {}
        if isinstance(predictor, ObservesOutcomes) and step.trees:  # each prompt's own evidence
            outcomes = np.array([t.root_outcomes() for t in step.trees], dtype=float).reshape(-1, 2)
            predictor.observe_outcomes([runner.node_context(k, ROOT) for k in keys], outcomes[:, 0], outcomes[:, 1])
    return Learning(contexts, targets, weights, tree_index, node_ids, depths, weight, scored, dict(stats or {}),
                    reward_warning(step.trees, getattr(runner, "difficulty_knobs", None)))
