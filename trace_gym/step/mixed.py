"""What "mixed" means for a group of rollouts: the success line, or the reward spread.

A bench counts a prompt as *mixed* (its group carries a group-relative signal) by one of
two rules, its ``mixed_rule`` (:class:`~trace_gym.config_sections.BenchTarget`):

- ``threshold`` (the default; the paper's, for 0/1 rewards): the group holds a success and
  a failure, a success being a reward at or above
  :data:`~trace_gym.tree.SUCCESS_THRESHOLD` (0.5). This is :meth:`RolloutTree.is_mixed`.
  A continuous reward (QA's F1, BFCL's partial credit) is read as an outcome first: a
  group with F1 0.2 and 0.4 is pure (two failures), one with 0.45 and 0.55 is mixed.
- ``spread``: the group's reward range, max minus min, exceeds ``mixed_spread``
  (default 0: any two different rewards). This is the rule peers filter groups by for
  continuous rewards (OpenRLHF #1270 asks to drop groups whose reward standard deviation is
  zero, because GRPO's advantage (r - mean) / std is then zero for every member; DAPO's
  dynamic sampling drops all-equal groups).

Why the range and not the standard deviation: at the zero threshold the two agree
(std > 0 exactly when max > min), and above it the range is the one that does not depend on
the group's size. A group with one success among n rollouts has range 1 whatever n, but std
sqrt(n - 1) / n, which falls from 0.5 (n = 2) to 0.33 (n = 8) to 0.18 (n = 32); the
strategies of one bench grow groups and trees of different sizes at one budget, so a std
line would count the same contrast as mixed in a small group and as pure in a large one.
With 0/1 rewards the range is 0 or 1, so ``spread`` with any ``mixed_spread`` in [0, 1)
counts exactly the groups ``threshold`` counts.

The rule changes what a bench *counts* (effective ratio, mixed prompts per step, mixed per
1k tokens, tokens to target, the mixed-vs-pure truth of the predictor-quality measures),
never what a strategy optimises: the allocators still read predicted success probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from trace_gym.tree import SUCCESS_THRESHOLD

#: The rules a bench's ``mixed_rule`` takes.
MIXED_RULES = ("threshold", "spread")


@dataclass(frozen=True)
class MixedRule:
    """One of :data:`MIXED_RULES`, with the spread line (reward units) of ``spread``.

    Raises:
        ValueError: an unknown rule, a spread that is not a finite number >= 0, or a spread
            other than 0 with ``threshold`` (a key that would be silently ignored).
    """

    rule: str = "threshold"
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.rule not in MIXED_RULES:
            raise ValueError(f"mixed_rule must be one of {', '.join(MIXED_RULES)}, got {self.rule!r}")
        s = self.spread
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise ValueError(f"mixed_spread must be a finite number >= 0 (reward units), got {s!r}")
        if self.rule == "threshold" and s != 0:
            raise ValueError(f"mixed_spread={s!r} is read only with mixed_rule=spread (got mixed_rule=threshold)")

    def group(self, rewards: Iterable[float]) -> bool:
        """Whether a group with these finished rewards is mixed (False for fewer than two)."""
        r = [float(x) for x in rewards]
        if len(r) < 2:
            return False
        if self.rule == "spread":
            return max(r) - min(r) > self.spread
        wins = sum(x >= SUCCESS_THRESHOLD for x in r)
        return 0 < wins < len(r)

    def tree(self, tree: Any) -> bool:
        """Whether a :class:`~trace_gym.tree.RolloutTree` is mixed: :meth:`group` of its leaves' rewards."""
        return self.group(leaf.reward for leaf in tree.leaves() if leaf.reward is not None)

    def roots(self, tree: Any) -> bool:
        """Whether a tree's finished *root* rollouts alone are mixed (continuations left out: where
        they start depends on outcomes), the truth of the predictor-quality measures."""
        leaves = (tree.branch_leaf(b.id) for b in tree.branches if not b.is_continuation)
        return self.group(tree.nodes[leaf].reward for leaf in leaves
                          if leaf is not None and tree.nodes[leaf].reward is not None)

    def describe(self) -> str:
        """One phrase for reports: what counted as mixed."""
        if self.rule == "spread":
            return f"mixed: reward range max - min > {self.spread:g}"
        return f"mixed: a success and a failure (reward >= {SUCCESS_THRESHOLD:g} is a success)"


#: The default rule (the success line).
THRESHOLD = MixedRule()
