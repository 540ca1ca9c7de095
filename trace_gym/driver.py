"""The one step driver: roots where the strategy says, then per-prompt prefix expansion.

:func:`run_step` is the rollout half of a training step (trace-method.md, "One
training step", steps 1-3), for simulated and real rollouts alike:

1. score the candidate pool with the predictor (``predictor_scoring`` phase);
2. allocate root rollouts with the strategy's root allocator and split the
   continuation budget over the chosen prompts (:mod:`trace_gym.planning`);
3. start every chosen prompt's root rollouts; *as soon as one prompt's roots have all
   returned*, score its visited prefixes and plan its continuations
   (:func:`trace_gym.planning.plan_expansion`, single-turn fallback included), and
   start them at once, while other prompts' rollouts are still running.

Every decision is made here or in :mod:`trace_gym.planning`; how a branch is run
(a model in an env, or the simulator's martingale) is a :class:`BranchRunner`'s
business: :class:`trace_gym.rollout.AgentBranchRunner` for real rollouts,
:class:`trace_gym.sim.SimBranchRunner` for the simulator. So a simulated number and a
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
from typing import Any, Hashable, Protocol, Sequence, runtime_checkable

import numpy as np

from trace_gym.budget import BudgetLedger
from trace_gym.planning import ExpansionPlan, allocate_roots, continuation_budgets, plan_expansion
from trace_gym.predictor import SuccessPredictor
from trace_gym.strategy import Strategy
from trace_gym.tree import ROOT, RolloutTree


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
        ledger: nominal and exact costs of this step.
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
) -> StepResult:
    """Build the rollout trees of one step at ``nominal_budget`` trajectory-equivalents.

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
        for i, p in prompts.items():
            runner.start_roots(i, p.roots_out, ledger)
        ledger.add_rollouts(int(m.sum()))
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
    return step


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
        plan = plan_expansion(p.tree, prefix_values, p.continuation_budget, strategy.prefix_allocator, p.rng)
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
