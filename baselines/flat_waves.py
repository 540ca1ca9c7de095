"""What the published-method arms (the zoo) share: flat waves of whole groups over a step view.

Every arm of the zoo is a :class:`~trace_gym.allocation.waves.WaveStrategy` that asks for root
rollouts only (none of the methods branches from prefixes). These helpers read a
:class:`~trace_gym.allocation.waves.StepView` in the methods' own terms (groups rolled out, mixed,
all-pass, all-fail), turn counts into a :class:`~trace_gym.allocation.waves.Wave`, check the knobs,
and keep the arms' memories bounded.

Units: a view's budgets are in units (a root costs :data:`~trace_gym.budget.ROOT_UNITS` = 2);
the methods count rollouts, so :func:`step_roots` and :func:`roots_left` convert.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterable

import numpy as np

from trace_gym.allocation.waves import MAX_HISTORY, StepView, Wave
from trace_gym.budget import ROOT_UNITS

#: Most prompts an arm's own per-prompt memory keeps (the least recently touched go first).
MAX_REMEMBERED = MAX_HISTORY


def step_roots(view: StepView) -> int:
    """Root rollouts the step's whole budget buys (``budget // 2``)."""
    return view.budget // ROOT_UNITS


def roots_left(view: StepView) -> int:
    """Root rollouts the budget not yet spent or reserved still buys."""
    return max(0, view.remaining) // ROOT_UNITS


def group_wave(candidates: Iterable[int], size: int) -> Wave | None:
    """A wave of ``size`` roots for each of ``candidates`` (``None`` when there are none)."""
    roots = {int(i): int(size) for i in candidates}
    return Wave(roots=roots) if roots and size > 0 else None


def counts_wave(counts: np.ndarray) -> Wave | None:
    """A wave of ``counts[i]`` roots per candidate (``None`` when all are 0)."""
    roots = {int(i): int(k) for i, k in enumerate(np.asarray(counts).tolist()) if k > 0}
    return Wave(roots=roots) if roots else None


def rolled_out(view: StepView) -> np.ndarray:
    """Candidates given root rollouts this step, bool (n,)."""
    return np.asarray(view.roots) > 0


def mixed(view: StepView) -> np.ndarray:
    """Candidates whose returned roots hold a success and a failure, bool (n,)."""
    return (np.asarray(view.successes) > 0) & (np.asarray(view.failures) > 0)


def all_pass(view: StepView) -> np.ndarray:
    """Candidates whose returned roots all succeeded (at least one back), bool (n,)."""
    return (np.asarray(view.successes) > 0) & (np.asarray(view.failures) == 0)


def all_fail(view: StepView) -> np.ndarray:
    """Candidates whose returned roots all failed (at least one back), bool (n,)."""
    return (np.asarray(view.successes) == 0) & (np.asarray(view.failures) > 0)


def history_posterior(view: StepView, prior: tuple[float, float] = (1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's Beta posterior: the predictor's (``view.alpha``, ``view.beta``) where it
    keeps one, else the prior plus the prompt's root outcomes over earlier steps (the view's
    history), which is the same posterior as a Beta predictor that never forgets."""
    if view.alpha is not None and view.beta is not None:
        return np.asarray(view.alpha, dtype=float), np.asarray(view.beta, dtype=float)
    return (prior[0] + np.asarray(view.past_successes, dtype=float),
            prior[1] + np.asarray(view.past_failures, dtype=float))


def spread(counts: np.ndarray, extra: int, order: Iterable[int], cap: int) -> int:
    """Add ``extra`` rollouts one at a time, round-robin over ``order``, never lifting a count
    past ``cap`` (so an even split, the first ``extra mod k`` getting one more); changes
    ``counts`` in place and returns what found no room."""
    order = [int(i) for i in order]
    while extra > 0:
        room = [i for i in order if counts[i] < cap]
        if not room:
            break
        for i in room:
            if extra == 0:
                break
            counts[i] += 1
            extra -= 1
    return extra


def check_int(name: str, value: Any, low: int, allow_none: bool = False) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an integer >= ``low`` (or ``None`` when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{' or None' if allow_none else ''}, got {value!r}")


def check_real(name: str, value: Any, low: float, high: float, *, open_low: bool = False) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a finite number in ``[low, high]``
    (``(low, high]`` with ``open_low``)."""
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool) \
        and np.isfinite(value) and (value > low if open_low else value >= low) and value <= high
    if not ok:
        raise ValueError(f"{name} must be a number in {'(' if open_low else '['}{low:g}, {high:g}], got {value!r}")


def remember(memory: "OrderedDict[Hashable, Any]", key: Hashable, value: Any, capacity: int = MAX_REMEMBERED) -> None:
    """Store ``value`` under ``key`` as the most recent entry; past ``capacity`` the least
    recently stored entries are forgotten."""
    memory.pop(key, None)
    memory[key] = value
    while len(memory) > capacity:
        memory.popitem(last=False)
