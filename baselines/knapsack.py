"""Knapsack RL as a wave strategy: split a batch's rollouts by an exact knapsack over estimated rates.

Paper: Ziniu Li, Congliang Chen, Tianyun Yang, Tian Ding, Ruoyu Sun, Ge Zhang, Wenhao
Huang, Zhi-Quan Luo, "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget
Allocation", arXiv:2509.25849 (rule as in the authors' code, liziniu/KnapsackRL).

Rule, one wave per step, over the batch: the first B candidates of the pool (Knapsack RL
does not pick prompts; it splits N = B n rollouts over its dataloader's batch), each with
an estimated rate p (the predictor's value) and its evidence (root rollouts over earlier
steps, from the run's history):

1. base: n to a prompt with fewer than ``min_evidence`` rollouts seen; ``n_neg`` to p = 0;
   ``n_pos`` to p = 1; ``n_min`` to 0 < p < 1 (the set E); rem = N - sum(base);
2. E empty: rem goes evenly to the p = 0 prompts (the first ``rem mod k`` one more); with none,
   every prompt gets n (uniform);
3. else need = sum over E of int(min(n_max, ln(1 - a) / ln(max(p, 1 - p)))) (the rollouts for
   P(mixed) >= a); when need < rem the surplus rem - need goes evenly to the p = 0 prompts
   (with none, to every prompt outside E) and rem = need;
4. an exact knapsack gives each prompt of E k in 0..n_max - n_min extra rollouts, sum k = rem,
   maximising the sum of value(k): 0 for k = 0, else
   ``(1 - p^N - (1 - p)^N) * p * (1 - p)^2`` with N = n_min + k (P(the group is mixed) times
   the paper's information gain p (1 - p)^2). Ties go to fewer extra rollouts for later
   prompts of the batch.

The rate comes from the arm's own predictor, :class:`~baselines.predictors.RunningRatePredictor`
(kind ``running_rate``: each prompt's rate over its latest visits holding L rollouts).

Knobs and their scaling. The paper's 7B script: n = 8, B = 256 (N = 2048), n_min = n_neg =
n_pos = 2, n_max = 128, a = 0.9, L = 16, ``min_buffer`` = 8 (= n). Defaults here: n = G = 8
(the bench's ``group_size`` reaches it), B = R // n for a step of R root rollouts (N = B n),
n_min = n_neg = n_pos = 2, a = 0.9, ``min_evidence`` = n, and n_max = 16 (the deep bank holds
32 roots per prompt; the paper's 128 against n = 8 rarely binds, 16 here often does): at the
bench's R = 32, B = 4 prompts at n = 8, or 8 at n = 4.

Departures: the paper's code reads but never refreshes its per-prompt rates; here the
predictor observes every step's root outcomes. Budget that neither the knapsack nor the
even splits can place under n_max goes round-robin to the batch's prompts with room (E
first); what none can take stays unspent. A prompt seen before counts its rollouts over all
earlier steps as its evidence (the run's history), the paper its buffer's length (at most L).
"""

from __future__ import annotations

import math

import numpy as np

from baselines.flat_waves import check_int, check_real, counts_wave, roots_left, spread, step_roots
from trace_gym.allocation.waves import StepView, Wave


def mixed_value(p: float, total: int) -> float:
    """Knapsack RL's value of a group of ``total`` rollouts at rate ``p``:
    ``(1 - p^N - (1 - p)^N) * p * (1 - p)^2``."""
    return (1.0 - p ** total - (1.0 - p) ** total) * p * (1.0 - p) ** 2


def knapsack_extras(rates: np.ndarray, budget: int, base: int, most: int) -> np.ndarray:
    """The exact knapsack of step 4 (module docstring): extra rollouts k_i in 0..``most`` per
    rate, summing to ``min(budget, len(rates) * most)``, maximising the sum of
    ``mixed_value(p_i, base + k_i)`` (0 for k_i = 0). Ties: the later rate takes fewer.
    Shapes: ``rates`` (m,) -> int64 (m,)."""
    m = len(rates)
    budget = min(int(budget), m * most)
    best = np.full((m + 1, budget + 1), -np.inf)
    best[0, 0] = 0.0
    pick = np.zeros((m + 1, budget + 1), dtype=np.int64)
    for i, p in enumerate(np.asarray(rates, dtype=float).tolist(), start=1):
        value = [0.0] + [mixed_value(p, base + k) for k in range(1, most + 1)]
        for b in range(budget + 1):
            for k in range(min(most, b) + 1):  # ascending, strict >: the smallest k among ties
                got = best[i - 1, b - k] + value[k]
                if got > best[i, b] + 1e-15:
                    best[i, b], pick[i, b] = got, k
    out, b = np.zeros(m, dtype=np.int64), budget
    for i in range(m, 0, -1):
        out[i - 1] = pick[i, b]
        b -= out[i - 1]
    return out


def knapsack_counts(rates: np.ndarray, known: np.ndarray, n: int, *, n_min: int = 2, n_neg: int = 2,
                    n_pos: int = 2, n_max: int = 16, confidence: float = 0.9) -> np.ndarray:
    """Knapsack RL's rollouts per prompt of a batch (module docstring, steps 1-4), spending
    ``N = len(rates) * n`` at most ``n_max`` each.

    Args:
        rates: estimated success rates in [0, 1], shape (B,).
        known: whether each prompt has enough evidence, bool (B,).
        n: the uniform group size.
    Returns:
        int64 (B,).
    """
    p = np.asarray(rates, dtype=float)
    known = np.asarray(known, dtype=bool)
    zero, one = known & (p <= 0.0), known & (p >= 1.0)
    effective = known & ~zero & ~one
    counts = np.where(~known, n, np.where(zero, n_neg, np.where(one, n_pos, n_min))).astype(np.int64)
    rem = len(p) * n - int(counts.sum())
    if not effective.any():
        if rem > 0 and zero.any():
            rem = spread(counts, rem, np.flatnonzero(zero), n_max)
        elif rem > 0:
            counts[:] = n
            rem = 0
        spread(counts, rem, range(len(p)), n_max)
        return counts
    e = np.flatnonzero(effective)
    need = sum(int(min(n_max, math.log(1 - confidence) / math.log(max(x, 1 - x)))) for x in p[e])
    if need < rem:
        others = np.flatnonzero(zero) if zero.any() else np.flatnonzero(~effective)
        if len(others):
            rem = need + spread(counts, rem - need, others, n_max)
    extra = knapsack_extras(p[e], rem, n_min, n_max - n_min)
    counts[e] += extra
    left = spread(counts, rem - int(extra.sum()), e, n_max)
    spread(counts, left, range(len(p)), n_max)
    return counts


class KnapsackRL:
    """Knapsack RL (module docstring): one wave over the pool's first B prompts.

    Args:
        group_size: n, the uniform group size (>= 2).
        prompts: B, the batch (``None``: R // n).
        n_min, n_neg, n_pos: the least rollouts for 0 < p < 1, p = 0, p = 1 (2 each, >= 1).
        n_max: the most rollouts per prompt (16; >= n_min, n_neg, n_pos and n).
        confidence: a, the P(mixed) a prompt's cost aims at (0.9).
        min_evidence: rollouts seen before a prompt's rate is used (``None``: n).
    """

    description = "Knapsack RL: the batch's rollouts split by an exact knapsack over each prompt's recent rate"
    predictor = "running_rate"

    def __init__(self, group_size: int = 8, prompts: int | None = None, n_min: int = 2, n_neg: int = 2,
                 n_pos: int = 2, n_max: int = 16, confidence: float = 0.9, min_evidence: int | None = None):
        check_int("group_size", group_size, 2)
        check_int("prompts", prompts, 1, allow_none=True)
        for name, value in (("n_min", n_min), ("n_neg", n_neg), ("n_pos", n_pos)):
            check_int(name, value, 1)
        check_int("n_max", n_max, max(n_min, n_neg, n_pos, group_size))
        check_real("confidence", confidence, 0.0, 1.0, open_low=True)
        if confidence >= 1.0:
            raise ValueError(f"confidence must be below 1, got {confidence!r}")
        check_int("min_evidence", min_evidence, 0, allow_none=True)
        self.group_size, self.prompts = int(group_size), prompts
        self.n_min, self.n_neg, self.n_pos, self.n_max = int(n_min), int(n_neg), int(n_pos), int(n_max)
        self.confidence, self.min_evidence = float(confidence), min_evidence

    def with_group_size(self, group_size: int) -> "KnapsackRL":
        """The same arm at uniform group size n (:class:`~trace_gym.allocation.allocators.GroupSized`)."""
        return type(self)(group_size, self.prompts, self.n_min, self.n_neg, self.n_pos,
                          max(self.n_max, group_size), self.confidence, self.min_evidence)

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        if view.wave > 0:
            return None
        n = self.group_size
        batch = min(self.prompts or step_roots(view) // n, roots_left(view) // n, view.n)
        evidence = (np.asarray(view.past_successes) + np.asarray(view.past_failures))[:batch]
        known = evidence >= (n if self.min_evidence is None else self.min_evidence)
        rates = np.clip(np.asarray(view.values, dtype=float)[:batch], 0.0, 1.0)
        counts = np.zeros(view.n, dtype=np.int64)
        counts[:batch] = knapsack_counts(rates, known, n, n_min=self.n_min, n_neg=self.n_neg, n_pos=self.n_pos,
                                         n_max=self.n_max, confidence=self.confidence)
        return counts_wave(counts)
