"""Strategies that act in waves: what a strategy sees before each wave, and what it returns.

A step is a sequence of *waves*. Before each wave a :class:`WaveStrategy` sees a
:class:`StepView` of every candidate prompt: its id, the predictor's value and (where the
predictor keeps one) its Beta posterior, the prompt's history over earlier steps of the
run (:class:`PromptHistory`), and what earlier waves of this step returned (root
successes and failures per prompt, and each visited prefix with the outcome it lies on
and its continuations so far). It returns the next :class:`Wave` (roots per prompt,
continuations per visited prefix, and optionally a *reserve*: budget units a prompt's own
:meth:`~WaveStrategy.plan_prompt` may spend as soon as that prompt's branches of the wave
are back, without waiting for the wave's slowest prompt), or ``None`` to stop.

Budget units: a root rollout costs :data:`~trace_gym.budget.ROOT_UNITS` = 2 units, a continuation 1 (the
nominal convention of full rollout = 1, mid-trajectory continuation = 1/2), so a nominal
budget B is ``floor(2 B)`` units. The driver (:func:`trace_gym.step.driver.run_step`), not the
strategy, keeps the comparison fair: a strategy sees only what it paid for, every count it
returns is checked (:mod:`trace_gym.step.strategy_boundary`) and a wave that would spend past
the budget is refused.

Decisions made *inside* a wave (``plan_prompt``) see the view as it was when the wave
started, with only their own prompt's returns added, and draw from their own random
generator (one child of the step's, per prompt the wave touched, drawn in candidate
order): so they do not depend on the order in which prompts happen to finish.

The one-shot strategies (a root allocator, a prefix allocator and a shape:
:class:`~trace_gym.allocation.strategy.Strategy`) are the simple case: :class:`OneShot` runs one as
a wave strategy with the decisions of trace-method.md, step for step (one wave of roots,
each prompt's continuations planned by ``plan_prompt`` as soon as its roots are back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from trace_gym.allocation.planning import (
    ExpansionPlan, allocate_roots, continuation_budgets, plan_expansion, single_turn_fallback,
)
from trace_gym.allocation.strategy import Strategy

#: Most prompts a :class:`HistoryBook` remembers (the least recently chosen go first).
MAX_HISTORY = 1 << 20


def frozen(values: Any, dtype: Any) -> np.ndarray:
    """A read-only copy of ``values`` as a 1-d array of ``dtype`` (what a view hands out)."""
    out = np.array(values, dtype=dtype, copy=True).reshape(-1)
    out.setflags(write=False)
    return out


# ---------------------------------------------------------------------- history across steps
@dataclass(frozen=True)
class PromptHistory:
    """One prompt's record over the earlier steps of a run (root rollouts only).

    Attributes:
        chosen: steps in which the prompt got root rollouts.
        successes, failures: its root outcomes over those steps.
        pure_streak: how many of its latest chosen steps in a row ended with a pure root
            group of one kind (all succeeded, or all failed); 0 after a mixed group.
        streak_kind: +1 when that run is of all-success groups, -1 of all-failure ones, 0 none.
        last_step: the step it was last chosen in (-1: never).
    """

    chosen: int = 0
    successes: int = 0
    failures: int = 0
    pure_streak: int = 0
    streak_kind: int = 0
    last_step: int = -1


NEVER = PromptHistory()


@dataclass
class HistoryBook:
    """The :class:`PromptHistory` of every prompt a run has chosen, by prompt id (bounded:
    past :data:`MAX_HISTORY` prompts the least recently chosen is forgotten)."""

    entries: dict[str, PromptHistory] = field(default_factory=dict)
    capacity: int = MAX_HISTORY

    def get(self, prompt_id: str) -> PromptHistory:
        return self.entries.get(prompt_id, NEVER)

    def record(self, prompt_id: str, step: int, successes: int, trials: int) -> None:
        """A step's root outcomes of one prompt (``trials`` >= 1 roots, ``successes`` of them)."""
        if trials <= 0:
            return
        old = self.entries.pop(prompt_id, NEVER)  # re-inserted last: the dict's order is recency
        kind = 1 if successes == trials else (-1 if successes == 0 else 0)
        streak = (old.pure_streak + 1 if kind == old.streak_kind else 1) if kind else 0
        self.entries[prompt_id] = PromptHistory(old.chosen + 1, old.successes + successes,
                                                old.failures + trials - successes, streak, kind, step)
        while len(self.entries) > self.capacity:
            del self.entries[next(iter(self.entries))]

    def state_dict(self) -> dict[str, Any]:
        return {"entries": {k: list(vars(v).values()) for k, v in self.entries.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.entries = {str(k): PromptHistory(*(int(x) for x in v)) for k, v in state["entries"].items()}


# ---------------------------------------------------------------------- what a strategy sees
@dataclass(frozen=True)
class PrefixView:
    """A visited prefix of a chosen prompt's tree this step (an expansion candidate).

    Attributes:
        candidate: the prompt's index in the step's candidate pool.
        node: the prefix's node id in that prompt's tree (what a :class:`Wave` names).
        depth: completed turns in the prefix (>= 1).
        outcome: the observed outcome of the rollout it lies on (1 success, 0 failure).
        value: the predictor's value of the prefix, when the strategy asks for prefix values
            (``prefix_values = True``), else ``None``.
        continuations: continuations started from it so far this step.
        continuation_successes: how many of those that came back succeeded.
    """

    candidate: int
    node: int
    depth: int
    outcome: int
    value: float | None = None
    continuations: int = 0
    continuation_successes: int = 0


@dataclass(frozen=True)
class StepView:
    """Everything a strategy may read before a wave (read-only copies; arrays are (n,) over
    the candidate pool).

    Attributes:
        step: the step's index in the run (0-based).
        wave: the wave about to be planned (0 for the first).
        budget: the step's budget in units (root 2, continuation 1); ``spent``: units of the
            branches started so far.
        nominal_budget: the step's budget B in trajectory-equivalents.
        ids: each candidate's prompt id (stable across steps).
        values: the predictor's success values in [0, 1].
        alpha, beta: the predictor's per-prompt Beta posterior (``None`` where it keeps none).
        chosen, past_successes, past_failures, pure_streak, streak_kind: the
            :class:`PromptHistory` fields, one array each.
        roots, successes, failures: this step so far: root rollouts started, and how many of
            those that came back succeeded / failed.
        prefixes: the visited prefixes of this step's trees (in candidate order, then tree order).
        continuations_per_root: the shape N of the strategy's budget (0 when it has none).
        single_turn: no branch can outlive its first turn here (or the caller forecast it).
        reserves: each candidate's reserve left in the running wave (``None`` between waves).
    """

    step: int
    wave: int
    budget: int
    spent: int
    nominal_budget: float
    ids: tuple[str, ...]
    values: np.ndarray
    alpha: np.ndarray | None
    beta: np.ndarray | None
    chosen: np.ndarray
    past_successes: np.ndarray
    past_failures: np.ndarray
    pure_streak: np.ndarray
    streak_kind: np.ndarray
    roots: np.ndarray
    successes: np.ndarray
    failures: np.ndarray
    prefixes: tuple[PrefixView, ...] = ()
    continuations_per_root: float = 0.0
    single_turn: bool = False
    reserves: np.ndarray | None = None

    @property
    def reserved(self) -> int:
        """Units held by prompts' reserves (while a wave runs)."""
        return 0 if self.reserves is None else int(sum(int(x) for x in self.reserves))

    @property
    def remaining(self) -> int:
        """Units not yet spent or reserved."""
        return self.budget - self.spent - self.reserved

    @property
    def n(self) -> int:
        """Candidates in the pool."""
        return len(self.ids)

    def prefixes_of(self, candidate: int) -> tuple[PrefixView, ...]:
        """The visited prefixes of one candidate's tree."""
        return tuple(p for p in self.prefixes if p.candidate == candidate)


@dataclass(frozen=True)
class Wave:
    """What a strategy asks for next.

    Attributes:
        roots: new root rollouts per candidate: a mapping ``{candidate: count}`` or a
            sequence of n counts.
        continuations: ``{(candidate, prefix node): count}`` continuations from visited prefixes.
        reserve: ``{candidate: units}`` the prompt's ``plan_prompt`` may spend once its
            branches of this wave are back (unspent units return to the step's budget when
            the wave ends).
    """

    roots: Mapping[int, int] | Sequence[int] = field(default_factory=dict)
    continuations: Mapping[tuple[int, int], int] = field(default_factory=dict)
    reserve: Mapping[int, int] = field(default_factory=dict)


@runtime_checkable
class WaveStrategy(Protocol):
    """A strategy that acts in waves (see the module docstring).

    ``plan(view, rng)`` returns the next wave or ``None`` to end the step. Optional:

    - ``plan_prompt(view, candidate, rng)``: called when every branch of ``candidate``
      started so far is back and it holds a reserve; returns a wave for that candidate only,
      within its reserve, or ``None`` (its reserve goes back to the step's budget);
    - ``prefix_values``: ``True`` when the views should carry the predictor's values on
      visited prefixes (scored once per prefix, when first shown);
    - ``description``: one line for tables; ``predictor``: the predictor kind the arm is
      driven by when the user names none.

    ``rng`` is the only randomness a strategy may use: the bench replays its calls and
    gives no verdict to a strategy whose answers differ.
    """

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None: ...


def is_wave_strategy(strategy: Any) -> bool:
    """A wave strategy (has ``plan``), as opposed to a one-shot :class:`~trace_gym.allocation.strategy.Strategy`."""
    return not isinstance(strategy, Strategy) and callable(getattr(strategy, "plan", None))


# ---------------------------------------------------------------------- the one-shot case
class OneShot:
    """A one-shot :class:`~trace_gym.allocation.strategy.Strategy` as a wave strategy.

    Wave 0: root rollouts by the root allocator, and each chosen prompt's continuation
    budget (proportional to its roots) as its reserve; with ``single_turn``, the
    single-turn fallback's extra roots join this wave instead. ``plan_prompt``: as soon as
    a prompt's roots are back, its expansion plan (:func:`~trace_gym.allocation.planning.plan_expansion`:
    its visited prefixes, their predicted values and the observed outcomes; the split or
    the single-turn fallback where they apply). The plans are kept in :attr:`plans` (the
    step driver's record).
    """

    def __init__(self, strategy: Strategy):
        self.strategy = strategy
        self.description = strategy.description
        self.prefix_values = strategy.expands
        self.plans: list[tuple[int, ExpansionPlan]] = []
        self._step = -1
        self._pending: set[int] = set()

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        if view.wave > 0:
            return None
        self._step, self.plans, self._pending = view.step, [], set()
        s = self.strategy
        root_budget, cont_budget = s.budget_split(view.nominal_budget)
        m = allocate_roots(view.values, root_budget, s.root_allocator, rng)
        c = continuation_budgets(m, cont_budget) if s.expands else np.zeros(len(m), dtype=np.int64)
        roots = {i: int(k) for i, k in enumerate(m.tolist()) if k}
        reserve = {}
        for i in roots:
            if not c[i]:
                continue
            if view.single_turn:  # no prefix can exist: the fallback roots join the first round
                plan = single_turn_fallback(int(c[i]))
                self.plans.append((i, plan))
                roots[i] += plan.extra_roots
            else:
                reserve[i] = int(c[i])
                self._pending.add(i)
        return Wave(roots=roots, reserve=reserve)

    def plan_prompt(self, view: StepView, candidate: int, rng: np.random.Generator) -> Wave | None:
        if candidate not in self._pending:
            return None
        self._pending.discard(candidate)
        budget = int(view.reserves[candidate]) if view.reserves is not None else 0
        prefixes = view.prefixes_of(candidate)
        values = np.array([p.value for p in prefixes], dtype=float)
        tree = _PrefixesAsTree(prefixes, int(view.successes[candidate]),
                               int(view.successes[candidate] + view.failures[candidate]))
        plan = plan_expansion(tree, values, budget, self.strategy.prefix_allocator, rng,
                              root_value=float(view.values[candidate]))
        self.plans.append((candidate, plan))
        return Wave(roots={candidate: plan.extra_roots} if plan.extra_roots else {},
                    continuations={(candidate, node): k for node, k in plan.continuations})


class _PrefixesAsTree:
    """What :func:`~trace_gym.allocation.planning.plan_expansion` reads of a tree, from a view's prefixes."""

    def __init__(self, prefixes: Sequence[PrefixView], successes: int, trials: int):
        self._cands = [(p.node, float(p.outcome)) for p in prefixes]
        self._outcomes = (successes, trials)

    def expansion_candidates(self) -> list[tuple[int, float]]:
        return list(self._cands)

    def root_outcomes(self) -> tuple[int, int]:
        return self._outcomes
