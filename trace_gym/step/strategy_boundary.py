"""The boundary every call into a strategy's code crosses: a strategy is user code inside the step.

:class:`StrategyBoundary` runs each call (a wave strategy's ``plan`` / ``plan_prompt``,
which for a one-shot strategy calls its root and prefix allocators) through the one
boundary of foreign code (:class:`~trace_gym.env.boundary.ForeignBoundary`): on a helper
thread, within a deadline (``timeout_s``), every exception and exit (``SystemExit``
included) caught, process state put back, and the process-global random generators
(``random``, ``numpy.random``) swapped for a private state, so a strategy that draws from
them is seen (its only randomness is the rng it is given). Its answer is normalised
*inside* the call (so a hostile mapping or number type runs under the deadline too): a
:class:`~trace_gym.allocation.waves.Wave` of plain Python ints, every count an integral finite number
in ``[0, budget]``, candidates and prefixes that exist, summed as Python ints. Whatever goes
wrong is one :class:`StrategyViolation` naming the strategy: the step stops and its arm
gets no verdict.

What a strategy reads is a copy (:class:`~trace_gym.allocation.waves.StepView`: frozen, read-only
arrays), so writing into it fails and is named, and nothing in it leads to outcomes not yet
paid for. A strategy can still look around the process (the call stack of other threads,
the garbage collector); :class:`CallLog` records every call (the view, the rng state before
it, the answer) so the bench can replay them in a fresh process and refuse a verdict to a
strategy whose answers were not a function of what it was given and its rng
(:mod:`trace_gym.step.strategy_replay`).
"""

from __future__ import annotations

import copy
import math
import numbers
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from trace_gym.env.boundary import ForeignBoundary, ForeignEnvError, PrivateRandom, error_text
from trace_gym.env.process_state import seeded_rng_state
from trace_gym.allocation.waves import StepView, Wave
from trace_gym.budget import ROOT_UNITS

#: Seconds one call into a strategy may take, by default.
DEFAULT_STRATEGY_TIMEOUT_S = 30.0
#: The private global-RNG state a strategy's calls start from (any draw changes it).
_SENTINEL = seeded_rng_state(20_260_000)


class StrategyViolation(RuntimeError):
    """A strategy broke the rules of the step (one line naming it); its arm gets no verdict."""


class BadAnswer(ValueError):
    """A strategy's answer that is not a valid wave (naming the field and the value)."""


@dataclass(frozen=True)
class Asked:
    """A strategy's answer, checked: plain Python ints (see :func:`normalise_wave`).

    Attributes:
        roots: ``{candidate: count}`` (counts >= 1).
        continuations: ``{(candidate, node): count}`` (counts >= 1).
        reserve: ``{candidate: units}`` (units >= 1).
    """

    roots: dict[int, int] = field(default_factory=dict)
    continuations: dict[tuple[int, int], int] = field(default_factory=dict)
    reserve: dict[int, int] = field(default_factory=dict)

    @property
    def cost(self) -> int:
        """Units this answer spends or reserves (root 2, continuation 1, reserve 1 per unit)."""
        return ROOT_UNITS * sum(self.roots.values()) + sum(self.continuations.values()) + sum(self.reserve.values())

    @property
    def empty(self) -> bool:
        return not (self.roots or self.continuations or self.reserve)


STOP = Asked()


def count(value: Any, what: str, limit: int) -> int:
    """``value`` as a Python int when it is an integral, finite number in ``[0, limit]``
    (an int, a numpy integer, or a float with no fractional part; never a bool), else
    ``ValueError`` naming ``what`` and the value."""
    if isinstance(value, (bool, np.bool_)):
        raise BadAnswer(f"{what} is {value!r}, a bool; expected a count")
    if isinstance(value, numbers.Integral):
        n = operator.index(value)
    elif isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
        n = int(float(value))
    else:
        raise BadAnswer(f"{what} is {_shown(value)}; expected an integral, finite count")
    if not 0 <= n <= limit:
        raise BadAnswer(f"{what} is {_shown(n)}; expected a count in [0, {limit}]")
    return n


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, (int, float, str, bool, np.generic)) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _items(value: Any, what: str, limit: int) -> list[tuple[Any, Any]]:
    """The ``(key, value)`` pairs of a mapping, or ``(index, value)`` of a sequence; at most ``limit``."""
    if isinstance(value, Mapping):
        if len(value) > limit:
            raise BadAnswer(f"{what} names {len(value)} entries; at most {limit} exist")
        return list(value.items())
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != limit:
            raise BadAnswer(f"{what} has {len(value)} entries; expected one per candidate ({limit})")
        return list(enumerate(list(value)))
    raise BadAnswer(f"{what} is {_shown(value)}; expected a mapping or a sequence of counts")


def normalise_wave(wave: Any, view: StepView, only: int | None = None) -> Asked:
    """A strategy's answer as an :class:`Asked` (``None`` or an empty wave: :data:`STOP`).

    Checks (``ValueError`` naming the field and the value): a :class:`~trace_gym.allocation.waves.Wave`;
    candidates are ints in ``[0, n)`` (``only``: that candidate alone, and no reserve, as a
    prompt's own plan); continuations name visited prefixes of the view; every count is a
    count in ``[0, budget]`` (:func:`count`)."""
    if wave is None:
        return STOP
    if not isinstance(wave, Wave):
        raise BadAnswer(f"returned {_shown(wave)}; expected a Wave or None")
    n, cap = view.n, view.budget
    visited = {(p.candidate, p.node) for p in view.prefixes}

    def candidate(key: Any, what: str) -> int:
        i = count(key, what, n - 1) if n else None
        if i is None or (only is not None and i != only):
            raise BadAnswer(f"{what} names candidate {_shown(key)}" + (f"; this plan is for candidate {only} only"
                                                                        if only is not None else ""))
        return i

    roots: dict[int, int] = {}
    for key, value in _items(wave.roots, "roots", n):
        i = candidate(key, "roots")
        k = count(value, f"roots[{i}]", cap)
        if k:
            roots[i] = roots.get(i, 0) + k
    continuations: dict[tuple[int, int], int] = {}
    for key, value in _items(wave.continuations, "continuations", max(len(visited), 1)):
        if not (isinstance(key, tuple) and len(key) == 2):
            raise BadAnswer(f"continuations key {_shown(key)}; expected (candidate, prefix node)")
        i, node = candidate(key[0], "continuations"), count(key[1], "continuations' prefix node", 1 << 62)
        if (i, node) not in visited:
            raise BadAnswer(f"continuations name node {node} of candidate {i}, not a visited prefix of this step")
        k = count(value, f"continuations[{i}, {node}]", cap)
        if k:
            continuations[(i, node)] = continuations.get((i, node), 0) + k
    reserve: dict[int, int] = {}
    if only is not None and wave.reserve:
        raise BadAnswer("a prompt's own plan cannot reserve budget")
    for key, value in _items(wave.reserve, "reserve", n):
        i = candidate(key, "reserve")
        k = count(value, f"reserve[{i}]", cap)
        if k:
            reserve[i] = reserve.get(i, 0) + k
    return Asked(roots, continuations, reserve)


@dataclass
class CallLog:
    """Every call of one strategy, for its replay: ``(kind, args, rng state before, answer)``."""

    calls: list[tuple[str, tuple, dict, Asked]] = field(default_factory=list)


class StrategyBoundary:
    """Calls into one strategy's code (see the module docstring).

    Args:
        name: the strategy as the user named it (every message names it).
        timeout_s: seconds one call may take.
        log: where calls are recorded for a replay (``None``: not recorded).
    """

    def __init__(self, name: str, timeout_s: float = DEFAULT_STRATEGY_TIMEOUT_S, log: CallLog | None = None):
        self.name, self.timeout_s, self.log = name, timeout_s, log
        self._foreign = ForeignBoundary(call_timeout_s=timeout_s, subject=f"strategy {name!r}")

    def plan(self, fn: Callable[..., Any], view: StepView, rng: np.random.Generator,
             candidate: int | None = None) -> Asked:
        """``fn(view, rng)`` (or ``fn(view, candidate, rng)``), normalised; :class:`StrategyViolation` on
        anything wrong."""
        args = (view, rng) if candidate is None else (view, candidate, rng)
        before = copy.deepcopy(rng.bit_generator.state) if self.log is not None else None
        private = PrivateRandom()
        private.state = _SENTINEL
        what = "plan" if candidate is None else "plan_prompt"
        try:
            asked = self._foreign.call(what, lambda *a: normalise_wave(fn(*a), view, candidate), *args,
                                       where=f"strategy {self.name!r}", rng=private)
        except ForeignEnvError as exc:
            raise StrategyViolation(str(exc)) from None
        except BadAnswer as exc:
            raise StrategyViolation(f"strategy {self.name!r}: its {what} returned a bad wave: {exc}") from None
        except Exception as exc:  # noqa: BLE001  (the strategy's own error: one line)
            raise StrategyViolation(f"strategy {self.name!r}: its {what} raised {_described(exc)}") from None
        if not _same_rng(private.state, _SENTINEL):
            raise StrategyViolation(f"strategy {self.name!r} drew from the process-global random generator "
                                    "(random / numpy.random) in its " + what + "; a strategy's only randomness "
                                    "is the rng it is given")
        if self.log is not None:
            self.log.calls.append((what, copy.deepcopy(args[:-1]), before, asked))
        return asked


def _described(exc: BaseException) -> str:
    text = error_text(exc)
    if isinstance(exc, ValueError) and "read-only" in str(exc):
        return f"{text} (it wrote into what it was given to read)"
    return text


def _same_rng(a: tuple, b: tuple) -> bool:
    """Whether two ``(random, numpy.random)`` states are equal."""
    (ra, na), (rb, nb) = a, b
    return ra == rb and na[0] == nb[0] and np.array_equal(na[1], nb[1]) and tuple(na[2:]) == tuple(nb[2:])


@dataclass
class StrategyPlay:
    """One arm's strategy over a run: its own copy of the strategy (its state across steps),
    the boundary its calls cross, the prompts' history, and the step about to run.

    Attributes:
        strategy: the arm's own copy (a stateful wave strategy keeps its state here).
        boundary: its :class:`StrategyBoundary` (with a :class:`CallLog` when its calls are
            to be replayed).
        history: the :class:`~trace_gym.allocation.waves.HistoryBook` its views read.
        step: the index of the next step.
        pristine: a copy of ``strategy`` as the run started (what a replay starts from).
    """

    strategy: Any
    boundary: StrategyBoundary
    history: Any
    step: int = 0
    pristine: Any = None

    @classmethod
    def start(cls, name: str, strategy: Any, *, record: bool = False,
              timeout_s: float = DEFAULT_STRATEGY_TIMEOUT_S) -> "StrategyPlay":
        """A fresh play of ``strategy`` (deep-copied, so runs never share its state; a one-shot
        :class:`~trace_gym.allocation.strategy.Strategy` as its :class:`~trace_gym.allocation.waves.OneShot`)."""
        from trace_gym.allocation.waves import HistoryBook, OneShot, is_wave_strategy

        own = copy.deepcopy(strategy) if is_wave_strategy(strategy) else OneShot(copy.deepcopy(strategy))
        return cls(own, StrategyBoundary(name, timeout_s, CallLog() if record else None), HistoryBook(),
                   pristine=copy.deepcopy(own) if record else None)

    def kwargs(self) -> dict[str, Any]:
        """What :func:`trace_gym.step.driver.run_step` takes of it."""
        return {"history": self.history, "step_index": self.step, "boundary": self.boundary}

    def fork(self) -> "StrategyPlay":
        """An independent copy (a try that may be thrown away: the token-budget mode)."""
        b = self.boundary
        log = copy.deepcopy(b.log) if b.log is not None else None
        return StrategyPlay(copy.deepcopy(self.strategy), StrategyBoundary(b.name, b.timeout_s, log),
                            copy.deepcopy(self.history), self.step, self.pristine)
