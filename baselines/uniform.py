"""Uniform (GRPO) root allocation: a fixed number of prompts, a fixed group size.

GRPO samples a batch of prompts and gives each the same group size G. Here the
candidate pool is already a random draw from the data, so ``UniformRootAllocator``
takes the *first* ``budget // G`` candidates in pool order and gives each G rollouts;
it ignores the predicted values (and the rng), exactly as GRPO has no predictor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def fixed_groups(order: np.ndarray, budget: int, group_size: int, n_candidates: int) -> np.ndarray:
    """Give ``group_size`` rollouts to candidates in ``order`` until ``budget`` is spent.

    ``budget = q * G + r``: the first q candidates in ``order`` get G each; a
    remainder r >= 2 becomes one more, smaller group of r; a remainder of 1 goes to
    the last full group (G + 1), since a single rollout cannot contrast. The result
    sums to ``budget`` exactly.

    Args:
        order: candidate indices in priority order, shape (n_candidates,).
        budget: root rollouts to spend (int >= 0, != 1).
        group_size: G >= 2.
        n_candidates: pool size.

    Returns:
        int64 array (n_candidates,) of rollouts per candidate.
    """
    if group_size < 2 or int(group_size) != group_size:
        raise ValueError(f"group_size must be an integer >= 2, got {group_size!r}")
    if budget < 0 or int(budget) != budget or budget == 1:
        raise ValueError(f"root budget must be an integer 0 or >= 2, got {budget!r}")
    q, r = divmod(int(budget), int(group_size))
    groups = [group_size] * q
    if r >= 2:
        groups.append(r)
    elif r == 1:
        groups[-1] += 1
    if len(groups) > n_candidates:
        raise ValueError(
            f"root budget {budget} at group size {group_size} needs {len(groups)} prompts, "
            f"but the candidate pool has only {n_candidates}"
        )
    counts = np.zeros(n_candidates, dtype=np.int64)
    counts[np.asarray(order[: len(groups)], dtype=np.int64)] = groups
    return counts


@dataclass(frozen=True)
class UniformRootAllocator:
    """GRPO groups: the first ``budget // group_size`` candidates get ``group_size`` each."""

    group_size: int = 8

    def with_group_size(self, group_size: int) -> "UniformRootAllocator":
        """The same allocator with another group size (``trace_gym.allocation.allocators.GroupSized``)."""
        return type(self)(group_size)

    def allocate(self, values: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        return fixed_groups(np.arange(len(values)), budget, self.group_size, len(values))
