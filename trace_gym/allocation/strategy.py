"""A rollout-allocation strategy: root allocator + prefix allocator + budget shape.

The core type the step driver (:mod:`trace_gym.step.driver`) and :func:`trace_gym.agent.rollout.collect`
are typed with. Which allocators make up the named strategies (uniform, pcl,
random_tree, trace, ablations) is the face's business: the one table
``trace_gym.strategies.STRATEGIES``, which the core never imports.

- the root allocator (:class:`~trace_gym.allocation.allocators.RootAllocator`) turns predicted
  prompt success values into rollouts per candidate (0 or >= 2);
- the prefix allocator (:class:`~trace_gym.allocation.allocators.PrefixAllocator`), or ``None``
  for a flat strategy, turns the repeat probabilities of a prompt's visited prefixes
  into continuations per prefix;
- the shape: N = ``continuations_per_root`` continuations per root rollout.

At a nominal budget B (trajectory-equivalents, see :mod:`trace_gym.budget`), a strategy
with shape N spends M = B / (1 + N / 2) root rollouts and M N continuations. So flat
strategies (N = 0) spend the whole budget on roots, M' = M (1 + N / 2), and tree
strategies spend M roots plus M N continuations: equal nominal cost. Each prompt's
continuation budget is proportional to its root rollouts (N m_i); see
:func:`trace_gym.allocation.planning.continuation_budgets`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from trace_gym.allocation.allocators import GroupSized, PrefixAllocator, RootAllocator


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


def group_sized(strategies: Mapping[str, Any]) -> list[str]:
    """The strategies a ``group_size`` knob reaches: those whose root allocator declares
    one (:class:`~trace_gym.allocation.allocators.GroupSized`), and wave strategies that declare one themselves."""
    return [name for name, s in strategies.items()
            if isinstance(getattr(s, "root_allocator", s), GroupSized)]
