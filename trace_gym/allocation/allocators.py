"""Rollout allocation: the strategy seams, and TRACE's own allocators that fill them.

:class:`RootAllocator` (Stage 1: split a root budget over a prompt pool),
:class:`PrefixAllocator` (Stage 2: split one prompt's continuation budget over its
prefixes) and :class:`GroupSized` (the one knob of fixed-group allocators) are the
Protocols a strategy implements; :class:`TraceRootAllocator` and
:class:`TracePrefixAllocator` implement them with the exact solvers.

The math lives beside this module, and every name of it is re-exported here (so
``from trace_gym.allocation.allocators import solve_root`` keeps working):

- :mod:`trace_gym.allocation.solvers`: the exact solvers :func:`solve_root` and
  :func:`solve_prefix` (fast threshold method), the objectives :func:`root_utility` /
  :func:`prefix_utility`, :func:`repeat_probability`, input validation, and in its
  docstring the optimality argument and the tie rule;
- :mod:`trace_gym.allocation.dp`: :func:`solve_root_dp`, the reference dynamic program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from trace_gym.allocation.dp import _max_useful_rollouts, _solve_root_dp, solve_root_dp  # noqa: F401  (re-exported)
from trace_gym.allocation.solvers import (  # noqa: F401  (re-exported)
    _nonneg_int, prefix_utility, probabilities_1d, repeat_probability, root_utility, solve_prefix, solve_root,
)

__all__ = [
    "RootAllocator",
    "PrefixAllocator",
    "TraceRootAllocator",
    "TracePrefixAllocator",
    "solve_root",
    "solve_root_dp",
    "solve_prefix",
    "root_utility",
    "prefix_utility",
    "repeat_probability",
    "probabilities_1d",
]


# ------------------------------------------------------------------ strategy seams


@runtime_checkable
class RootAllocator(Protocol):
    """Stage-1 strategy: split a root budget over a candidate prompt pool.

    ``allocate(values, budget, rng)``: values are predicted success probabilities, shape
    (n,); returns int64 counts, shape (n,), each 0 or >= 2, summing to ``budget``. ``rng``
    is the only randomness a strategy may use.
    """

    def allocate(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray: ...


@runtime_checkable
class GroupSized(Protocol):
    """A root allocator with a fixed group size G (GRPO, PCL, ...): the one knob a bench's
    ``group_size`` turns. Any allocator that declares it is reshaped; others are left
    alone, and the bench says which strategies the knob reached."""

    group_size: int

    def with_group_size(self, group_size: int) -> "GroupSized": ...


@runtime_checkable
class PrefixAllocator(Protocol):
    """Stage-2 strategy: split one prompt's continuation budget over its visited prefixes.

    ``allocate(repeat_probabilities, budget, rng)``: repeat probabilities q, shape (n,); returns
    int64 continuation counts >= 0, shape (n,), summing to ``budget``.
    """

    def allocate(self, repeat_probabilities: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray: ...


@dataclass(frozen=True)
class TraceRootAllocator:
    """TRACE Stage 1: :func:`solve_root` (deterministic; ``rng`` is unused).

    Attributes:
        max_per_prompt: optional cap on rollouts per prompt (None: no cap).
    """

    max_per_prompt: int | None = None

    def __post_init__(self) -> None:
        if self.max_per_prompt is not None:
            _nonneg_int(self.max_per_prompt, "max_per_prompt")

    def allocate(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        return solve_root(values, budget, self.max_per_prompt)


@dataclass(frozen=True)
class TracePrefixAllocator:
    """TRACE Stage 2: :func:`solve_prefix` (deterministic; ``rng`` is unused).

    Attributes:
        max_per_prefix: optional cap on continuations per prefix (None: no cap).
    """

    max_per_prefix: int | None = None

    def __post_init__(self) -> None:
        if self.max_per_prefix is not None:
            _nonneg_int(self.max_per_prefix, "max_per_prefix")

    def allocate(self, repeat_probabilities: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        return solve_prefix(repeat_probabilities, budget, self.max_per_prefix)
