"""Rollout-allocation strategies and the one table that names them.

A :class:`Strategy` is a root allocator + a prefix allocator + a budget shape:

- the root allocator (``trace_gym.allocation.RootAllocator``) turns predicted prompt
  success values into rollouts per candidate (0 or >= 2);
- the prefix allocator (``PrefixAllocator``), or ``None`` for a flat strategy, turns
  the repeat probabilities of a prompt's visited prefixes into continuations per
  prefix;
- the shape: N = ``continuations_per_root`` continuations per root rollout.

At a nominal budget B (trajectory-equivalents, see :mod:`trace_gym.budget`), a strategy
with shape N spends M = B / (1 + N / 2) root rollouts and M N continuations. So flat
strategies (uniform, pcl; N = 0) spend the whole budget on roots, M' = M (1 + N / 2),
and tree strategies spend M roots plus M N continuations: equal nominal cost. Each
prompt's continuation budget is proportional to its root rollouts (N m_i); see
:func:`trace_gym.planning.continuation_budgets`.

This module is part of the face (with ``cli.py`` and ``registry.py``): it is the one
place that maps names to allocators and so imports ``baselines/``; the rest of the core
receives a ``Strategy`` as an object and never imports this table.

Adding a strategy is one entry in :data:`STRATEGIES`::

    STRATEGIES["my_tree"] = Strategy(
        root_allocator=MyRootAllocator(),          # .allocate(values, budget, rng)
        prefix_allocator=TracePrefixAllocator(),   # .allocate(repeat_probs, budget, rng)
        continuations_per_root=2,
        description="my roots, TRACE prefixes",
    )

after which ``trace-gym bench --sim`` benchmarks it beside the others (see
``docs/strategies.md``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from baselines.pcl import PCLRootAllocator
from baselines.random_tree import RandomPrefixAllocator
from baselines.uniform import UniformRootAllocator
from trace_gym.allocation import (
    PrefixAllocator,
    RootAllocator,
    TracePrefixAllocator,
    TraceRootAllocator,
)

#: GRPO's group size in the paper's setups (and the baselines' default).
DEFAULT_GROUP_SIZE = 8
#: Continuations per root rollout for tree strategies: the paper's best shape (M, 2).
DEFAULT_CONTINUATIONS_PER_ROOT = 2


@dataclass(frozen=True)
class Strategy:
    """Root allocator + prefix allocator + budget shape.

    Attributes:
        root_allocator: chooses m_i rollouts per candidate prompt.
        prefix_allocator: chooses k continuations per visited prefix; ``None`` for a
            flat strategy (no expansion).
        continuations_per_root: N, continuations per root rollout (0 iff flat).
        description: one line for tables and docs.
    """

    root_allocator: RootAllocator
    prefix_allocator: PrefixAllocator | None = None
    continuations_per_root: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        n = self.continuations_per_root
        if not (isinstance(n, (int, float)) and math.isfinite(n) and n >= 0):
            raise ValueError(f"continuations_per_root must be a finite number >= 0, got {n!r}")
        if (self.prefix_allocator is None) != (n == 0):
            raise ValueError(
                "a strategy expands iff it has a prefix allocator: got prefix_allocator="
                f"{self.prefix_allocator!r} with continuations_per_root={n!r}"
            )

    @property
    def expands(self) -> bool:
        """Whether the strategy spends budget on continuations."""
        return self.prefix_allocator is not None

    def budget_split(self, nominal_budget: float) -> tuple[int, int]:
        """(root rollouts M, continuations C) spent at ``nominal_budget``.

        M = floor(B / (1 + N / 2)); C = floor(2 (B - M)), so M + C / 2 <= B, with
        equality whenever B = M (1 + N / 2) for an integer M N.
        """
        if not (math.isfinite(nominal_budget) and nominal_budget >= 0):
            raise ValueError(f"nominal budget must be a finite number >= 0, got {nominal_budget!r}")
        roots = int(math.floor(nominal_budget / (1.0 + self.continuations_per_root / 2.0) + 1e-9))
        continuations = int(math.floor(2.0 * (nominal_budget - roots) + 1e-9)) if self.expands else 0
        return roots, continuations

    def with_continuations(self, continuations_per_root: float) -> "Strategy":
        """The same strategy at another tree shape N; a flat strategy is returned as is,
        and N = 0 makes an expanding strategy flat (its root allocator alone)."""
        if not self.expands:
            return self
        if continuations_per_root == 0:  # no continuations: the root allocator alone, flat
            return dataclasses.replace(self, prefix_allocator=None, continuations_per_root=0)
        return dataclasses.replace(self, continuations_per_root=continuations_per_root)


#: Every strategy by name. A user's new strategy is one entry (see the module doc).
STRATEGIES: dict[str, Strategy] = {
    "uniform": Strategy(
        UniformRootAllocator(DEFAULT_GROUP_SIZE),
        description="GRPO: fixed group size on the first prompts of the pool, no expansion",
    ),
    "pcl": Strategy(
        PCLRootAllocator(DEFAULT_GROUP_SIZE),
        description="PCL: prompts predicted closest to 0.5, fixed group size, no expansion",
    ),
    "random_tree": Strategy(
        UniformRootAllocator(DEFAULT_GROUP_SIZE),
        RandomPrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="TreePO-style: GRPO roots, continuations at uniformly random prefixes",
    ),
    "trace": Strategy(
        TraceRootAllocator(),
        TracePrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="TRACE: exact root allocation + exact prefix expansion",
    ),
    "trace_root_only": Strategy(
        TraceRootAllocator(),
        RandomPrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="ablation: TRACE roots, random prefixes",
    ),
    "trace_prefix_only": Strategy(
        UniformRootAllocator(DEFAULT_GROUP_SIZE),
        TracePrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="ablation: GRPO roots, TRACE prefix expansion",
    ),
}


def get_strategy(name: str) -> Strategy:
    """Look a strategy up by name, with the known names in the error."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; known: {sorted(STRATEGIES)}") from None


def shaped_strategies(names: Sequence[str], *, group_size: int, continuations_per_root: float,
                      extra: Mapping[str, Strategy] | None = None) -> dict[str, Strategy]:
    """The named strategies reshaped for one benchmark: the fixed group size G of the
    flat baselines' root allocators and the tree shape N of expanding strategies.

    Args:
        names: strategy names (``STRATEGIES`` keys or ``extra`` keys); empty means all.
        group_size: G for ``UniformRootAllocator`` / ``PCLRootAllocator``.
        continuations_per_root: N for strategies that expand.
        extra: additional named strategies (e.g. a variant with another predictor).
    """
    table = {**STRATEGIES, **(extra or {})}
    names = list(names) or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; known: {sorted(table)}")
    out = {}
    for name in names:
        s = table[name].with_continuations(continuations_per_root)
        if isinstance(s.root_allocator, (UniformRootAllocator, PCLRootAllocator)):
            s = dataclasses.replace(s, root_allocator=type(s.root_allocator)(group_size))
        out[name] = s
    return out
