"""TreePO-style random branching: continuations start at uniformly random prefixes.

The random-tree strategy uses uniform (GRPO) root groups and spends the continuation
budget by drawing each continuation's branch point uniformly at random among the
prompt's visited prefixes (with replacement), ignoring predictions and outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RandomPrefixAllocator:
    """k ~ Multinomial(budget, uniform over prefixes)."""

    def allocate(self, repeat_probabilities: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
        n = len(repeat_probabilities)
        if budget < 0 or int(budget) != budget:
            raise ValueError(f"continuation budget must be an integer >= 0, got {budget!r}")
        if n == 0:
            if budget:
                raise ValueError(f"continuation budget {budget} but no prefixes to spend it on")
            return np.zeros(0, dtype=np.int64)
        return rng.multinomial(int(budget), np.full(n, 1.0 / n)).astype(np.int64)
