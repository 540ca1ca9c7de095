"""Budget accounting: nominal trajectory-equivalents and exact units.

Nominal units follow the paper: a full rollout from the prompt costs 1, a continuation
from the middle of a trajectory costs 1/2 (:data:`CONTINUATION_COST`), so a shape with
M root rollouts and N continuations per root costs M (1 + N / 2). Strategies are
compared at equal nominal cost; the exact units (generated tokens, prefill tokens,
environment steps, wall-clock seconds per phase) are recorded beside it so a reader
can see what the nominal convention hides.

Usage::

    ledger = BudgetLedger()
    with ledger.phase("generation"):
        ...                                # seconds land in ledger.seconds["generation"]
    ledger.add_rollouts(8)                 # 8 full rollouts
    ledger.add_continuations(16)           # 16 continuations
    ledger.add_tokens(generated=1200, prefill=300)
    ledger.add_env_steps(40)
    ledger.nominal                         # 8 + 16 / 2 = 16.0
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

#: Nominal cost of one full rollout from the prompt (trajectory-equivalents).
ROLLOUT_COST = 1.0
#: Nominal cost of one continuation from a saved mid-trajectory prefix.
CONTINUATION_COST = 0.5
#: Whole budget units of one root rollout, a continuation costing 1 (a wave strategy's
#: budgets are counted in these: ``ROLLOUT_COST / CONTINUATION_COST``).
ROOT_UNITS = 2


def budget_units(nominal_budget: float) -> int:
    """``floor(2 B)``: the whole units of a nominal budget B (root = 2, continuation = 1)."""
    if not (isinstance(nominal_budget, (int, float)) and math.isfinite(nominal_budget) and nominal_budget >= 0):
        raise ValueError(f"nominal budget must be a finite number >= 0, got {nominal_budget!r}")
    return int(math.floor(ROOT_UNITS * nominal_budget + 1e-9))


def nominal_cost(root_rollouts: float, continuations_per_root: float = 0.0) -> float:
    """Nominal cost M (1 + N / 2) of M root rollouts with N continuations each.

    >>> nominal_cost(1024, 2)
    2048.0
    """
    if root_rollouts < 0 or continuations_per_root < 0:
        raise ValueError(
            f"root_rollouts and continuations_per_root must be >= 0, got "
            f"{root_rollouts!r}, {continuations_per_root!r}"
        )
    return root_rollouts * ROLLOUT_COST + root_rollouts * continuations_per_root * CONTINUATION_COST


#: Phases timed on other threads, overlapping the main thread's phases.
OVERLAPPING_PHASES = frozenset({"environment_busy"})

#: The integer counters of a ledger (summed by :meth:`BudgetLedger.include`).
_COUNTS = ("rollouts", "continuations", "generated_tokens", "prefill_tokens", "env_steps", "replayed_env_steps",
           "errors", "unspent_continuations", "recovered_episodes", "redone_env_steps", "reissued_completions",
           "exhausted")


def _nonneg(name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


@dataclass
class BudgetLedger:
    """What a batch (or a run) spent.

    Attributes:
        rollouts: full rollouts started from a prompt (nominal 1 each).
        continuations: rollouts continued from a saved prefix (nominal 1/2 each).
        generated_tokens: tokens sampled by the policy (all rollouts).
        prefill_tokens: context tokens the engine had to process before sampling
            (prompt plus, for continuations, the replayed prefix), not counting
            tokens the engine reported as served from its prefix cache.
        env_steps: ``env.step`` calls, plus the steps a ``restore`` re-executes in a
            replay-snapshot env (``trace_gym.env.contract.ReplayCost``).
        replayed_env_steps: the part of ``env_steps`` that restores re-executed.
        errors: episodes ended by an error rather than by the env or a limit (an env
            that raised in reset, restore, step, snapshot or close; a prompt over the
            token limit). Each such episode's error is also on the episode and in the
            rollout batch.
        unspent_continuations: continuation units a plan left unspent (the
            single-turn fallback buys one root rollout per two; an odd budget leaves
            one), so ``nominal`` falls short of the budget by half of this, visibly.
        recovered_episodes: episodes whose env actor died (a distributed run,
            :mod:`trace_gym.train.distributed`) and that were restored from their last snapshot
            on another actor and went on.
        redone_env_steps: env steps executed a second time because of that: the step
            lost with the actor plus the steps its restore re-executed. Not in
            ``env_steps``, which counts each step of the trajectories once.
        reissued_completions: completions requested again because the rollout worker
            generating them died; their tokens are in ``generated_tokens`` once.
        exhausted: branches (root rollouts or continuations) a rollout bank refused
            because it holds no unused recorded rollout for them (:mod:`trace_gym.banks`);
            they are counted in ``rollouts`` / ``continuations`` as decided, but nothing
            ran and no outcome exists.
        seconds: wall-clock seconds per phase name (``generation``, ``environment``,
            ``allocation``, ``predictor_scoring``, ``predictor_update``, ...), plus
            ``environment_busy``: env work summed over the agent runner's threads, which
            overlaps the other phases (see :class:`trace_gym.agent.loop.AgentRunner`).
        clock: the time source for :meth:`phase` (seconds; injectable for tests).
    """

    rollouts: int = 0
    continuations: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    env_steps: int = 0
    replayed_env_steps: int = 0
    errors: int = 0
    unspent_continuations: int = 0
    recovered_episodes: int = 0
    redone_env_steps: int = 0
    reissued_completions: int = 0
    exhausted: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False, compare=False)

    # ------------------------------------------------------------------ recording
    def add_rollouts(self, n: int = 1) -> None:
        _nonneg("rollouts", n)
        self.rollouts += int(n)

    def add_continuations(self, n: int = 1) -> None:
        _nonneg("continuations", n)
        self.continuations += int(n)

    def add_tokens(self, generated: int = 0, prefill: int = 0) -> None:
        _nonneg("generated tokens", generated)
        _nonneg("prefill tokens", prefill)
        self.generated_tokens += int(generated)
        self.prefill_tokens += int(prefill)

    def add_env_steps(self, n: int = 1) -> None:
        _nonneg("env steps", n)
        self.env_steps += int(n)

    def add_replayed_env_steps(self, n: int = 1) -> None:
        """Steps a restore re-executed: counted in ``env_steps`` and apart."""
        _nonneg("replayed env steps", n)
        self.env_steps += int(n)
        self.replayed_env_steps += int(n)

    def add_errors(self, n: int = 1) -> None:
        _nonneg("errors", n)
        self.errors += int(n)

    def add_unspent_continuations(self, n: int = 1) -> None:
        _nonneg("unspent continuations", n)
        self.unspent_continuations += int(n)

    def add_recovered(self, episodes: int = 0, env_steps: int = 0) -> None:
        """Work re-done after an env actor died: ``episodes`` moved, ``env_steps`` re-run."""
        _nonneg("recovered episodes", episodes)
        _nonneg("redone env steps", env_steps)
        self.recovered_episodes += int(episodes)
        self.redone_env_steps += int(env_steps)

    def add_reissued_completions(self, n: int = 1) -> None:
        """Completions requested again after a rollout worker died mid-generation."""
        _nonneg("reissued completions", n)
        self.reissued_completions += int(n)

    def add_exhausted(self, n: int = 1) -> None:
        """Branches a rollout bank refused (nothing recorded left to replay)."""
        _nonneg("exhausted", n)
        self.exhausted += int(n)

    def add_seconds(self, phase: str, seconds: float) -> None:
        _nonneg(f"seconds for phase {phase!r}", seconds)
        self.seconds[phase] = self.seconds.get(phase, 0.0) + float(seconds)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` block and add the seconds to ``seconds[name]``.

        Nested phases each record their own full duration (an outer phase includes
        its inner ones).
        """
        start = self.clock()
        try:
            yield
        finally:
            self.add_seconds(name, self.clock() - start)

    # ------------------------------------------------------------------ reading
    @property
    def nominal(self) -> float:
        """Trajectory-equivalents: rollouts + continuations / 2."""
        return self.rollouts * ROLLOUT_COST + self.continuations * CONTINUATION_COST

    @property
    def total_seconds(self) -> float:
        """Seconds over all phases except :data:`OVERLAPPING_PHASES` (which overlap the
        others); nested phases are counted in each."""
        return sum(v for k, v in self.seconds.items() if k not in OVERLAPPING_PHASES)

    def merge(self, *others: "BudgetLedger") -> "BudgetLedger":
        """A new ledger holding the sums of this one and ``others`` (none is modified)."""
        out = BudgetLedger(clock=self.clock)
        for led in (self, *others):
            out.include(led)
        return out

    def include(self, other: "BudgetLedger") -> None:
        """Add ``other``'s counts and seconds to this ledger, in place."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v

    def __add__(self, other: "BudgetLedger") -> "BudgetLedger":
        return self.merge(other)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-friendly), with the derived ``nominal`` cost."""
        return {
            "nominal": self.nominal,
            "rollouts": self.rollouts,
            "continuations": self.continuations,
            "generated_tokens": self.generated_tokens,
            "prefill_tokens": self.prefill_tokens,
            "env_steps": self.env_steps,
            "replayed_env_steps": self.replayed_env_steps,
            "errors": self.errors,
            "unspent_continuations": self.unspent_continuations,
            "recovered_episodes": self.recovered_episodes,
            "redone_env_steps": self.redone_env_steps,
            "reissued_completions": self.reissued_completions,
            "exhausted": self.exhausted,
            "seconds": dict(sorted(self.seconds.items())),
        }
