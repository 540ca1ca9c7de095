"""Common random numbers across a simulated bench's arms, as a bank bench pairs its arms.

A bank bench hands every arm of one repetition the same recorded rollouts for the same requests
(:class:`trace_gym.banks.replay.BankDraws`: prompt i's n-th root, prefix (root j, depth t)'s k-th
continuation). Two arms that run the same prompt then share its outcomes, and the paired difference of
their headline metrics is read with that correlation: on the guessing bank the per-repetition
effective ratios of TRACE and uniform correlate at 0.59. A simulator that draws each arm's rollouts from
the arm's own stream correlates them at about 0, and its paired intervals are wider for the same means
(docs/benchmarking.md, "Common draws").

:class:`CommonDraws` gives each branch its own random stream, keyed by the repetition's seed, the task,
and the branch's place in the task's history: a root by its ordinal among the task's roots in this
arm, a continuation by its prefix (the branch it leaves, the depth) and its ordinal among that prefix's
continuations. The same request in two arms then draws the same numbers, and so the same outcome,
tokens and signals (what a branch does given its stream is :func:`trace_gym.sim.simulator.simulate_branches`'s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

#: The first word of every common stream's seed (apart from the simulator's other streams).
STREAM = 7


@dataclass
class CommonDraws:
    """One arm's place in the common streams of one repetition (the ``seed``): how many roots of each
    task, and how many continuations of each prefix, it has drawn. Deep-copied with the arm's state
    (a token-matched step's tries restart from it)."""

    seed: int
    roots: dict[int, int] = field(default_factory=dict)
    continuations: dict[tuple, int] = field(default_factory=dict)

    def root(self, task: int) -> tuple[tuple, np.random.Generator]:
        """The next root of ``task``: its key (``("r", n)``) and its stream."""
        n = self.roots.get(task, 0)
        self.roots[task] = n + 1
        key = ("r", n)
        return key, np.random.default_rng([self.seed, STREAM, task, *_words(key)])

    def continuation(self, task: int, branch: tuple, depth: int) -> tuple[tuple, np.random.Generator]:
        """The next continuation of the prefix at ``depth`` of the branch keyed ``branch``: its key and stream."""
        prefix = (branch, depth)
        k = self.continuations.get((task, prefix), 0)
        self.continuations[(task, prefix)] = k + 1
        key = ("c", prefix, k)
        return key, np.random.default_rng([self.seed, STREAM, task, *_words(key)])


def _words(key: Hashable) -> list[int]:
    """A branch key as non-negative integers for a seed sequence (nested tuples flattened, each level
    bracketed so that two keys differ in their words where they differ at all)."""
    if isinstance(key, tuple):
        out = [1]
        for part in key:
            out += _words(part)
        return out + [2]
    if key == "r":
        return [3]
    if key == "c":
        return [4]
    return [5, int(key)]
