"""PCL-style predictive prompt selection: keep the prompts predicted closest to 0.5.

The candidates whose predicted success v_i is nearest 0.5 (|v_i - 0.5| ascending,
ties by pool order) each get the same fixed group size, as many as the budget buys.
It filters prompts like TRACE's root stage does, but with one fixed group size
instead of an optimised m_i per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from baselines.uniform import fixed_groups


@dataclass(frozen=True)
class PCLRootAllocator:
    """``budget // group_size`` prompts with predicted success closest to 0.5."""

    group_size: int = 8

    def with_group_size(self, group_size: int) -> "PCLRootAllocator":
        """The same allocator with another group size (``trace_gym.allocation.allocators.GroupSized``)."""
        return type(self)(group_size)

    def allocate(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        if values.ndim != 1 or np.isnan(values).any() or (values < 0).any() or (values > 1).any():
            raise ValueError(f"values must be a 1-d array in [0, 1] without NaN, got {values!r:.200}")
        order = np.argsort(np.abs(values - 0.5), kind="stable")
        return fixed_groups(order, budget, self.group_size, len(values))
