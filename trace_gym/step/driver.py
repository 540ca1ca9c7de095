"""The one step driver: a strategy's waves over a branch runner, then the predictor's update.

:func:`run_step` is the step every consumer shares (trace-method.md, "One training
step", steps 1-4): training, the simulated bench and the real-rollout bench call it and
differ only in the :class:`BranchRunner` and the predictor they pass. Its rollout half:

1. score the candidate pool with the predictor (``predictor_scoring`` phase; a predictor
   that keeps per-prompt Beta evidence also gives its posterior);
2. ask the strategy (:mod:`trace_gym.allocation.waves`) for a wave, through its boundary
   (:mod:`trace_gym.step.strategy_boundary`: deadline, every error and exit caught, the answer
   checked), refuse a wave that would spend past the step's budget, and start it; *as soon
   as one prompt's branches of the wave are back* and it holds a reserve, ask the
   strategy's ``plan_prompt`` for that prompt alone and start that at once, while other
   prompts' rollouts are still running; when the wave's every branch is back, the next
   wave, until the strategy stops (or :data:`MAX_WAVES`).

A one-shot :class:`~trace_gym.allocation.strategy.Strategy` runs as :class:`~trace_gym.allocation.waves.OneShot`:
one wave of roots from its root allocator, and each prompt's continuations planned as
soon as its roots are back (:func:`trace_gym.allocation.planning.plan_expansion`), as trace-method.md
describes. Its learning half (:mod:`trace_gym.step.learning`), once every branch is back: the
predictor's regression on the trees' recursive-mean targets, and the no-contrast warning.

How a branch is run (a model in an env, the simulator's martingale, a recorded bank) is a
:class:`BranchRunner`'s business: :class:`trace_gym.agent.rollout.AgentBranchRunner`,
:class:`trace_gym.sim.simulator.SimBranchRunner`, :class:`trace_gym.banks.replay.BankBranchRunner`.
Each call records into its own :class:`~trace_gym.budget.BudgetLedger`: the nominal units
it decided on and, from the runner, the exact ones (tokens, env steps, seconds per phase),
and the step's *waves*: the longest chain of generation rounds one prompt went through
(each a round of generation latency).

Randomness: ``rng`` is what the strategy plans its waves with; after each wave, one child
generator per prompt the wave touched is drawn from it (in candidate order) for that
prompt's own plans, so the decisions do not depend on the order in which prompts'
rollouts happen to return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol, Sequence, runtime_checkable

import numpy as np

from trace_gym.budget import ROOT_UNITS, BudgetLedger, budget_units
from trace_gym.step.learning import PREFIX_SHARE, Learning, update_predictor
from trace_gym.allocation.planning import ExpansionPlan
from trace_gym.predictor.kinds import SuccessPredictor
from trace_gym.step.strategy_boundary import Asked, StrategyBoundary, StrategyViolation
from trace_gym.step.mixed import THRESHOLD, MixedRule
from trace_gym.tree import SUCCESS_THRESHOLD, RolloutTree
from trace_gym.allocation.waves import NEVER, HistoryBook, OneShot, PrefixView, StepView, frozen, is_wave_strategy

#: Most waves one step may take (a strategy still asking after that is stopped and named).
MAX_WAVES = 64



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
    ``difficulty_knobs`` attribute: the env's :class:`~trace_gym.env.contract.DifficultyKnobs`,
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
        root_counts: root rollouts started per candidate over the step, int64 (n_candidates,).
        continuation_budgets: units reserved per candidate for its own plans (a one-shot
            strategy: its continuation budget), int64 (n_candidates,).
        trees: one tree per chosen candidate (given a root rollout), in the order they were chosen.
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
        waves: the longest chain of generation rounds one prompt went through (a one-shot
            flat strategy: 1; with continuations: 2).
        progress: ``(generated tokens, mixed trees)`` of the step so far, after each wave
            (what a budget-to-target metric reads).
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
    waves: int = 0
    progress: list[tuple[int, int]] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)


def forecast_fallback_first(previous: StepResult | None) -> bool:
    """Whether the next step should plan the single-turn fallback before its first round:
    the previous step had trees and not one visited prefix (every root rollout ended
    after its first turn, as on a task the policy answers at once). A miss costs one
    step's prefixes (their budget buys fresh roots instead) and switches it off, since
    that step then saw prefixes."""
    return previous is not None and bool(previous.trees) and previous.prefixes_seen == 0


def run_step(
    candidates: Sequence[Any],
    strategy: Any,
    predictor: SuccessPredictor,
    runner: BranchRunner,
    nominal_budget: float,
    rng: np.random.Generator,
    *,
    learn: bool = True,
    prefix_share: float = PREFIX_SHARE,
    score_prefixes: bool = False,
    fallback_first: bool = False,
    history: HistoryBook | None = None,
    step_index: int = 0,
    boundary: StrategyBoundary | None = None,
    mixed_rule: MixedRule = THRESHOLD,
) -> StepResult:
    """One step: the strategy's waves at ``nominal_budget`` trajectory-equivalents, then
    (``learn``) the predictor's update on the trees.

    Args:
        candidates: the candidate pool, as the runner knows them (``Task`` for real
            rollouts, task indices for the simulator, bank prompts).
        strategy: a one-shot :class:`~trace_gym.allocation.strategy.Strategy` or a
            :class:`~trace_gym.allocation.waves.WaveStrategy`.
        predictor: scores what ``runner.prompt_context`` / ``node_context`` return.
        runner: runs the branches.
        nominal_budget: B; the step spends at most ``floor(2 B)`` units (root 2,
            continuation 1); what it leaves is recorded in ``ledger.unspent_continuations``.
        rng: the strategy's randomness (see the module docstring).
        learn: run the learning half once the trees are finished.
        prefix_share: share of the predictor's batch weight on prefix samples.
        score_prefixes: also record the predictor's values on the prefix samples before
            it trains on them (``Learning.prefix_predictions``; the benches' prefix Spearman).
        fallback_first: the caller forecasts that no prefix will exist
            (:func:`forecast_fallback_first`; implied by a ``single_turn`` runner): views say
            ``single_turn`` and a one-shot strategy buys its fallback roots in the first round.
        history: the run's prompt histories (what views show of earlier steps; this step's
            root outcomes are added at its end); ``None``: none kept.
        step_index: the step's index in the run (what views and histories record).
        boundary: the strategy's boundary (``None``: one with the default deadline).
        mixed_rule: what counts a tree as mixed in ``progress`` (:mod:`trace_gym.step.mixed`; a
            bench's ``mixed_rule``).

    Raises:
        StrategyViolation: the strategy broke a rule (one line naming it); every live
            branch is cancelled first.

    On any exception every live branch is cancelled, releasing its env, before it
    propagates. An env failure is not an exception here: its branch comes back with
    ``error`` set.
    """
    waves = OneShot(strategy) if not is_wave_strategy(strategy) else strategy
    if boundary is None:
        boundary = StrategyBoundary(getattr(strategy, "description", "") or type(strategy).__name__)
    ledger = BudgetLedger()
    contexts = [runner.prompt_context(c) for c in candidates]
    with ledger.phase("predictor_scoring"):
        values = np.asarray(predictor.predict(contexts), dtype=float)
        posterior = predictor.posterior(contexts) if callable(getattr(predictor, "posterior", None)) else None
    run = _StepRun(candidates, waves, boundary, predictor, runner, ledger, values, posterior, contexts,
                   budget_units(nominal_budget), nominal_budget, history or HistoryBook(), step_index,
                   bool(fallback_first or getattr(runner, "single_turn", False)), mixed_rule)
    try:
        run.all_waves(rng)
    except BaseException:
        runner.cancel()
        raise
    step = run.result()
    if history is not None:
        for key, tree in zip(step.tree_candidates.tolist(), step.trees):
            s, t = tree.root_outcomes()
            history.record(run.ids[key], step_index, s, t)
    if learn:
        step.learning = update_predictor(step, predictor, runner, prefix_share, score_prefixes)
    return step


def prompt_id(runner: Any, candidate: Any, context: Any) -> str:
    """A candidate's stable id: the runner's ``prompt_id`` where it has one, else a hash of
    the prompt text the predictor reads, else the candidate's own text."""
    if callable(getattr(runner, "prompt_id", None)):
        return str(runner.prompt_id(candidate))
    if isinstance(getattr(context, "prompt", None), str):
        from trace_gym.predictor.memory import prompt_key

        return prompt_key(context)
    return str(candidate)


class _StepRun:
    """One step's waves (:func:`run_step`): the state the driver keeps while they run."""

    def __init__(self, candidates, waves, boundary, predictor, runner, ledger, values, posterior, contexts,
                 budget, nominal_budget, history, step_index, single_turn, mixed_rule=THRESHOLD):
        self.candidates, self.waves, self.boundary = candidates, waves, boundary
        self.predictor, self.runner, self.ledger = predictor, runner, ledger
        self.values, self.budget, self.nominal_budget, self.step_index = values, budget, nominal_budget, step_index
        self.single_turn, self.mixed_rule = single_turn, mixed_rule
        n = len(candidates)
        self.ids = tuple(prompt_id(runner, c, x) for c, x in zip(candidates, contexts))
        past = [history.get(i) for i in self.ids] if history.entries else [NEVER] * n
        self.history = {f: frozen([getattr(h, f) for h in past], np.int64)
                        for f in ("chosen", "successes", "failures", "pure_streak", "streak_kind")}
        self.alpha = self.beta = None
        if posterior is not None:
            self.alpha, self.beta = (frozen(np.asarray(x, dtype=float), float) for x in posterior)
        self.frozen_values = frozen(values, float)
        self.spent = 0
        self.roots = np.zeros(n, dtype=np.int64)
        self.reserved_total = np.zeros(n, dtype=np.int64)
        self.out = np.zeros(n, dtype=np.int64)  # branches started and not yet back, per candidate
        self.depth = np.zeros(n, dtype=np.int64)  # generation rounds per candidate
        self.reserve = np.zeros(n, dtype=np.int64)
        self.local_rng: dict[int, np.random.Generator] = {}
        self.trees: dict[int, RolloutTree] = {}
        self.prefix_values: dict[tuple[int, int], float] = {}
        # as the running wave started: ({candidate: (successes, failures, prefixes)}, roots, spent, reserves)
        self.at_start: tuple = ({}, self.roots.copy(), 0, np.zeros(n, dtype=np.int64))
        self.spent_by = np.zeros(n, dtype=np.int64)  # units each candidate's own plans spent in this wave
        self.errors: list[dict[str, Any]] = []
        self.prefix_predictions: list[tuple[int, int, float]] = []
        self.progress: list[tuple[int, int]] = []
        self.wave = 0

    # -- views
    def _outcomes(self, key: int, scored: bool) -> tuple[int, int, tuple[PrefixView, ...]]:
        """One chosen candidate's returns: root successes, failures and its visited prefixes."""
        tree = self.trees[key]
        s, t = tree.root_outcomes()
        cands = tree.expansion_candidates()
        if scored:
            self._score(key, [node for node, _ in cands if (key, node) not in self.prefix_values])
        conts: dict[int, list[bool]] = {}
        for b in tree.branches:
            if b.is_continuation:
                leaf = tree.branch_leaf(b.id)
                conts.setdefault(b.anchor, []).append(leaf is not None and tree.nodes[leaf].success)
        prefixes = tuple(PrefixView(key, node, tree.nodes[node].depth, int(r >= SUCCESS_THRESHOLD),
                                    self.prefix_values.get((key, node)) if scored else None,
                                    len(conts.get(node, ())), sum(conts.get(node, ())))
                         for node, r in cands)
        return s, t - s, prefixes

    def _score(self, key: int, nodes: list[int]) -> None:
        if not nodes:
            return
        with self.ledger.phase("predictor_scoring"):
            got = np.asarray(self.predictor.predict([self.runner.node_context(key, n) for n in nodes]), dtype=float)
        index = list(self.trees).index(key)
        for node, v in zip(nodes, got.tolist()):
            self.prefix_values[(key, node)] = float(v)
            self.prefix_predictions.append((index, node, float(v)))

    def view(self, own: int | None = None) -> StepView:
        """The view before a wave (``own`` None), or for ``own``'s plan inside the wave: the
        state as the wave started, with that candidate's own entries as they are now (so a
        prompt's plan does not depend on which other prompts happened to finish first)."""
        shown, roots, spent, reserve = self.at_start
        if own is not None:
            shown = {**shown, own: self._outcomes(own, bool(getattr(self.waves, "prefix_values", False)))} \
                if own in self.trees else shown
            roots, reserve = roots.copy(), reserve.copy()
            roots[own], reserve[own] = self.roots[own], self.reserve[own]
            spent += int(self.spent_by[own])
        n = len(self.candidates)
        succ, fail = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        prefixes: list[PrefixView] = []
        for key in sorted(shown):
            s, f, p = shown[key]
            succ[key], fail[key] = s, f
            prefixes.extend(p)
        h = self.history
        return StepView(self.step_index, self.wave, self.budget, spent, float(self.nominal_budget), self.ids,
                        self.frozen_values, self.alpha, self.beta, h["chosen"], h["successes"], h["failures"],
                        h["pure_streak"], h["streak_kind"], frozen(roots, np.int64), frozen(succ, np.int64),
                        frozen(fail, np.int64), tuple(prefixes),
                        float(getattr(getattr(self.waves, "strategy", None), "continuations_per_root", 0.0)),
                        self.single_turn, None if own is None else frozen(reserve, np.int64))

    # -- waves
    def all_waves(self, rng: np.random.Generator) -> None:
        global_values = getattr(self.waves, "prefix_values", False) is True
        while True:
            shown = {key: self._outcomes(key, global_values) for key in self.trees}
            self.at_start = (shown, self.roots.copy(), self.spent, np.zeros(len(self.candidates), dtype=np.int64))
            self.spent_by = np.zeros(len(self.candidates), dtype=np.int64)
            if self.wave >= MAX_WAVES:
                raise StrategyViolation(f"strategy {self.boundary.name!r} did not stop within {MAX_WAVES} waves")
            with self.ledger.phase("allocation"):
                asked = self.boundary.plan(self.waves.plan, self.view(), rng)
            if asked.empty:
                return
            self._charge(asked.cost, self.budget - self.spent, "wave")
            self.spent += asked.cost - sum(asked.reserve.values())
            touched = sorted(set(asked.roots) | {k for k, _ in asked.continuations} | set(asked.reserve))
            seeds = rng.integers(2**63, size=len(touched)).tolist()
            self.local_rng = {k: np.random.default_rng(s) for k, s in zip(touched, seeds)}
            for k, units in asked.reserve.items():
                self.reserve[k] += units
                self.reserved_total[k] += units
            self.at_start = (shown, self.at_start[1], self.spent, self.reserve.copy())
            round_ = int(self.depth.max()) + 1
            self._start(asked, round_)
            for k in touched:
                if self.out[k] == 0:
                    self._local(k)
            while self.runner.live:
                for result in self.runner.advance(self.ledger):
                    self._returned(result)
            self.reserve[:] = 0  # what the wave's reserves left goes back to the step's budget
            self.progress.append((self.ledger.generated_tokens,
                                  sum(self.mixed_rule.tree(t) for t in self.trees.values() if t.leaves())))
            self.wave += 1

    def _charge(self, cost: int, left: int, what: str) -> None:
        if cost > left:
            raise StrategyViolation(f"strategy {self.boundary.name!r}: its {what} would spend {cost} units, "
                                    f"{left} left of the step's {self.budget} (a root costs {ROOT_UNITS}, a "
                                    "continuation 1)")

    def _start(self, asked: Asked, round_: int) -> None:
        for key in sorted(asked.roots):
            k = asked.roots[key]
            if key not in self.trees:
                self.trees[key] = self.runner.new_tree(key, self.candidates[key])
            self.roots[key] += k
            self.out[key] += k
            self.depth[key] = max(self.depth[key], round_)
            self.runner.start_roots(key, k, self.ledger)
            self.ledger.add_rollouts(k)
        for (key, node), k in sorted(asked.continuations.items()):
            self.out[key] += k
            self.depth[key] = max(self.depth[key], round_)
            self.runner.start_continuations(key, node, k, self.ledger)
            self.ledger.add_continuations(k)

    def _returned(self, result: BranchResult) -> None:
        key = result.key
        if result.error is not None:
            self.errors.append({"candidate": key, "anchor": result.anchor, "leaf": result.leaf, "error": result.error})
        self.out[key] -= 1
        if self.out[key] == 0 and self.reserve[key] > 0:
            self._local(key)

    def _local(self, key: int) -> None:
        """A prompt's own plan, now that its branches of the wave are back (within its reserve)."""
        plan_prompt = getattr(self.waves, "plan_prompt", None)
        if self.reserve[key] <= 0 or not callable(plan_prompt):
            return
        view = self.view(own=key)
        with self.ledger.phase("allocation"):
            asked = self.boundary.plan(plan_prompt, view, self.local_rng[key], candidate=key)
        if asked.empty:
            self.reserve[key] = 0
            return
        self._charge(asked.cost, int(self.reserve[key]), f"plan for candidate {key}")
        self.reserve[key] -= asked.cost
        self.spent += asked.cost
        self.spent_by[key] += asked.cost
        self._start(asked, int(self.depth[key]) + 1)
        if self.out[key] == 0:
            self._local(key)

    def result(self) -> StepResult:
        keys = list(self.trees)
        plans = list(getattr(self.waves, "plans", []))
        self.ledger.add_unspent_continuations(self.budget - self.spent)
        step = StepResult(self.values, self.roots.copy(), self.reserved_total.copy(), [self.trees[k] for k in keys],
                          np.asarray(keys, dtype=np.int64), plans=plans, prefix_predictions=self.prefix_predictions,
                          errors=self.errors, ledger=self.ledger, fallback_first=self.single_turn,
                          waves=int(self.depth.max()) if len(self.depth) else 0, progress=self.progress)
        step.prefixes_seen = sum(len(t.expansion_candidates()) for t in step.trees)
        return step
