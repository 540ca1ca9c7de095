"""Exact TRACE rollout allocation: Stage 1 (root) and Stage 2 (prefix expansion).

Stage 1 (root). Prompt i has predicted success v_i; write w_i = 1 - v_i. m rollouts
form a mixed group with probability u_i(m) = 1 - v_i^m - w_i^m. Choose m_i in
{0, 2, 3, ...} (at most ``max_per_prompt``) with sum_i m_i = M maximising sum_i u_i(m_i).

Stage 2 (prefix). Prefix j has repeat probability q_j; k continuations flip the
observed reward with probability 1 - q_j^k. Choose k_j >= 0 (at most ``max_per_prefix``)
with sum_j k_j = budget maximising sum_j (1 - q_j^k_j).

Why the root problem is "almost concave". The marginal gain of the (m+1)-th rollout is

    g(m) = u(m+1) - u(m) = v^m (1 - v) + w^m (1 - w) = v w (v^(m-1) + w^(m-1)),

so g(0) = 0, g(1) = 2vw, g(2) = vw (v + w) = vw, and for every m >= 1

    g(m) - g(m+1) = v w (v^(m-1) w + w^(m-1) v) >= 0,

with equality only when vw = 0 (v in {0, 1}, where u is identically 0). The only
non-concavity is the step 0 -> 1 (gain 0) -> 2 (gain 2vw). Split the unavoidable
first chunk of 2 into two *units* of vw each; the per-unit gains of a prompt are then

    h(1) = h(2) = h(3) = vw >= h(4) = g(3) >= h(5) = g(4) >= ...     (nonincreasing)

This describes a concave relaxation ũ >= u that equals u everywhere except at m = 1
(ũ(1) = vw, u(1) = 0).

The fast exact method (:func:`solve_root`).
1. Threshold. Let λ be the M-th largest unit gain over all prompts (units capped at
   c = min(max_per_prompt, M)). Every relaxed optimum takes all units with gain > λ
   (``above_i`` per prompt) and r = M - sum(above) of the units equal to λ. λ is found
   by bisection on the float bit pattern with a closed-form per-prompt count (the
   crossing of v^t + w^t with λ/vw lies within one unit of log(λ/vw)/log(max(v, w)),
   since max^t <= v^t + w^t <= max^t (1 + (min/max)^2) and 1 + (min/max)^2 <= 1/max), then
   an exact selection among the few units left in the bracket.
2. Level λ. Prompts with units at λ are either "extra" (already started, above >= 3:
   any number of their λ-units may be taken) or "starters" (above = 0 and vw = λ, or
   v in {0, 1} when caps leave λ = 0: they may take 0 or >= 2 units, never 1). If r can
   be split that way, the relaxed optimum is feasible, hence optimal for u (u = ũ off
   m = 1). That fails only if r = 1 and no extra unit is at λ.
3. Parity repair (that case only). Let R be the relaxed optimum and
   δ_i(m) = [ũ_i(above_i) - λ above_i] - [ũ_i(m) - λ m] >= 0, convex in m, nonincreasing
   then nondecreasing around above_i. Any allocation summing to M is worth
   R - sum_i δ_i(m_i), and sum_i (m_i - above_i) = 1. If a started prompt k gains a unit,
   the loss is >= δ_k(above_k + 1) = λ - h_k(above_k + 1) ("add"). Otherwise every
   increase is by a prompt with above = 0, by at least 2, so a started prompt k loses a
   unit: loss >= δ_k(above_k - 1) = h_k(above_k) - λ ("drop"; starting a starter with 2
   costs nothing). Both single moves are feasible, so the better of the two is optimal.

Tie rule (both solvers, documented contract). Among optimal allocations the result is
the lexicographically greatest vector (m_0, m_1, ...): rollouts of equal marginal value go
to lower-index prompts first. The fast paths implement it exactly for their computed
gains; the reference DP applies it to its float sums. Same input -> same output, always.
Permuting the input permutes the output whenever the optimum is unique; with ties, the
rule follows the new indices.

Floating point. Gains are computed as vw (exp(t log max) + exp(t log min)) from
min(v, 1 - v) (exact in binary) with log1p, so tiny v keeps its relative accuracy; terms
below e^-700 are flushed to 0. Ties are decided on these floats, so gains equal in exact
arithmetic but computed from different v can split at the last ulp. Outputs are always
feasible; objective values match the DP to ~1e-15 relative.

The reference dynamic program the fast solvers are tested against is
:mod:`trace_gym.allocation.dp`; the strategy seams these solvers fill (``RootAllocator``,
``PrefixAllocator``, ``TraceRootAllocator``, ...) are in :mod:`trace_gym.allocation.allocators`,
which re-exports every public name of this module.
"""

from __future__ import annotations

import numbers
from typing import Callable

import numpy as np

__all__ = [
    "solve_root",
    "solve_prefix",
    "root_utility",
    "prefix_utility",
    "repeat_probability",
    "probabilities_1d",
]

# --------------------------------------------------------------------------- helpers


def root_utility(v, m) -> np.ndarray:
    """V_root = 1 - v^m - (1 - v)^m: probability that m rollouts mix success and failure.

    Args:
        v: predicted success probability in [0, 1], any shape (broadcast against m).
        m: rollout counts, non-negative integers, any shape.
    Returns:
        float array of the broadcast shape; exactly 0 where m is 0 or 1. Computed with
        log1p/expm1 on min(v, 1 - v) so that tiny probabilities keep relative accuracy.
    """
    s = np.minimum(_probabilities(v, "v"), 1.0 - np.asarray(v, dtype=float))  # exact
    m = _counts(m, "m")
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        u = -np.expm1(m * np.log1p(-s)) - s**m
    return np.where(m < 2, 0.0, u)


def prefix_utility(q, k) -> np.ndarray:
    """V_pref = 1 - q^k: probability that k continuations flip the observed reward.

    Args:
        q: repeat probability in [0, 1], any shape (broadcast against k).
        k: continuation counts, non-negative integers, any shape.
    Returns:
        float array of the broadcast shape (0 where k is 0).
    """
    q = _probabilities(q, "q")
    k = _counts(k, "k")
    with np.errstate(divide="ignore", invalid="ignore"):
        u = -np.expm1(k * np.log(q))
    return np.where(k == 0, 0.0, u)


def repeat_probability(reward, value) -> np.ndarray:
    """q = r V + (1 - r)(1 - V): chance one fresh continuation repeats the observed reward.

    Args:
        reward: observed reward r in [0, 1] (binary in RLVR), any shape.
        value: predicted success Ṽ(H) of the prefix in [0, 1], broadcast against reward.
    """
    r = _probabilities(reward, "reward")
    v = _probabilities(value, "value")
    return r * v + (1.0 - r) * (1.0 - v)


# ------------------------------------------------------------------------ validation


def _probabilities(x, name: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be numbers in [0, 1], got {x!r:.80}") from e
    bad = ~np.isfinite(a) | (a < 0.0) | (a > 1.0)
    if bad.any():
        i = np.argwhere(bad)[0]
        where = f"{name}[{', '.join(map(str, i))}]" if a.ndim else name
        bad_value = float(a[tuple(i)])
        raise ValueError(f"{where} = {bad_value!r} is not a probability; expected a finite value in [0, 1]")
    return a


def probabilities_1d(x, name: str) -> np.ndarray:
    """``x`` as a 1-d float array of probabilities, or a ``ValueError`` naming ``name``,
    the bad entry and its value (shared by the solvers and :mod:`trace_gym.allocation.planning`)."""
    a = _probabilities(x, name)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    return a


def _counts(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"{name} must be non-negative integers, got {x!r:.80}")
    if (a < 0).any() or (a != np.round(a)).any():
        raise ValueError(f"{name} must be non-negative integers, got {x!r:.80}")
    return a


def _nonneg_int(x, name: str) -> int:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise ValueError(f"{name} must be a non-negative int, got {x!r} ({type(x).__name__})")
    if x < 0:
        raise ValueError(f"{name} must be a non-negative int, got {x!r}")
    return int(x)


def _root_problem(values, budget, max_per_prompt) -> tuple[np.ndarray, int, int]:
    """Validate a root problem; return (v, budget, c) with c the effective per-prompt cap."""
    v = probabilities_1d(values, "values")
    budget = _nonneg_int(budget, "budget")
    cap = None if max_per_prompt is None else _nonneg_int(max_per_prompt, "max_per_prompt")
    n = len(v)
    if budget == 0:
        return v, 0, 0
    if budget == 1:
        raise ValueError("budget = 1 is infeasible: a prompt gets 0 or >= 2 rollouts")
    if n == 0:
        raise ValueError(f"budget = {budget} but values is empty; expected at least one prompt")
    if cap is not None and cap < 2:
        raise ValueError(f"max_per_prompt = {cap} < 2 allows no group; expected >= 2 for budget {budget}")
    c = budget if cap is None else min(cap, budget)
    # Reachable totals with k started prompts: [2k, k c]; consecutive ranges touch for c >= 3.
    if budget > n * c or (c == 2 and budget % 2):
        expected = f"an even budget <= {2 * n}" if c == 2 else f"a budget <= {n * c}"
        raise ValueError(
            f"budget = {budget} is infeasible for {n} prompts with max_per_prompt = {cap}; "
            f"expected {expected}"
        )
    return v, budget, c


# ------------------------------------------------------------ threshold (both stages)

_CountFn = Callable[[float], np.ndarray]
_UnitFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _threshold(count_ge: _CountFn, unit_gain: _UnitFn, top: float, n: int, budget: int):
    """λ = the ``budget``-th largest unit gain over all items (units nonincreasing per item).

    Args:
        count_ge: x -> int64[n], units of each item with gain >= x (x >= 0).
        unit_gain: (items, k) -> gains of the k-th unit (1-based) of those items.
        top: an upper bound on every unit gain.
    Returns:
        (λ, above, at_least): int64[n] counts of units with gain > λ and >= λ;
        sum(above) < budget <= sum(at_least).
    """
    hi = np.nextafter(top, np.inf)
    ge_hi = np.zeros(n, np.int64)  # invariant: sum(ge_hi) < budget <= sum(ge_lo)
    step = 10
    tiny = float(np.nextafter(0.0, 1.0))
    while True:  # descent by 2^-10, 2^-20, 2^-40, ... (at least ``tiny``) to a lower end
        x = max(float(np.ldexp(top, -step)), tiny)
        step *= 2
        ge = count_ge(x)
        if ge.sum() >= budget:
            lo, ge_lo = x, ge
            break
        hi, ge_hi = x, ge
        if x == tiny:  # positive gains run out: λ = 0
            lo, ge_lo = 0.0, count_ge(0.0)
            break
    small, tied = 4 * n + 256, 64 * n + 1024  # bracket sizes worth materialising
    bits = lambda f: int(np.float64(f).view(np.int64))  # monotone on floats >= 0
    stalled, width = 0, int(ge_lo.sum() - ge_hi.sum())
    while True:  # bisection in bit space (≈ log scale) until few units remain in [lo, hi)
        lo_b, hi_b = bits(lo), bits(hi)
        if width <= small or hi_b - lo_b <= 1 or (stalled >= 3 and width <= tied):
            break  # (a bracket that stopped shrinking is one heavily tied gain)
        mid = float(np.int64((lo_b + hi_b) // 2).view(np.float64))
        ge = count_ge(mid)
        if ge.sum() >= budget:
            lo, ge_lo = mid, ge
        else:
            hi, ge_hi = mid, ge
        new_width = int(ge_lo.sum() - ge_hi.sum())
        stalled = stalled + 1 if new_width == width else 0
        width = new_width
    if width > tied:  # lo, hi adjacent floats: every bracket unit equals lo
        return lo, ge_hi, ge_lo
    d = ge_lo - ge_hi  # units with gain in [lo, hi): materialise them and select exactly
    items = np.repeat(np.arange(n), d)
    starts = np.cumsum(d) - d
    k = ge_hi[items] + 1 + np.arange(items.size) - starts[items]
    gains = unit_gain(items, k)
    r = budget - int(ge_hi.sum())
    lam = float(-np.partition(-gains, r - 1)[r - 1])
    above = ge_hi + np.bincount(items[gains > lam], minlength=n)
    at_least = ge_hi + np.bincount(items[gains >= lam], minlength=n)
    return lam, above, at_least


def _window_count(x, idx, est, lo_t, hi_t, gain_at):
    """Units t in [lo_t, hi_t] with gain >= x for items ``idx``, given an estimate ``est`` of
    the last passing t that is exact to within one unit: t <= est - 2 surely pass and
    t >= est + 3 surely fail, so only four units per item are evaluated."""
    base = np.clip(est - 2, lo_t - 1, hi_t)
    t = base[:, None] + np.arange(1, 5)
    ok = (t <= hi_t) & (gain_at(idx[:, None], np.minimum(t, hi_t)) >= x)
    return base - (lo_t - 1) + ok.sum(axis=1)


def _exp(z: np.ndarray) -> np.ndarray:
    """exp(z), flushed to exactly 0 below e^-700 (x86 exp is ~20x slower when it underflows)."""
    return np.where(z < -700.0, 0.0, np.exp(np.maximum(z, -700.0)))


def _fill_by_index(slots: np.ndarray, r: int) -> np.ndarray:
    """Take r units from per-item slot counts, lower index first."""
    return np.clip(r - (np.cumsum(slots) - slots), 0, slots)


# ------------------------------------------------------------------ Stage 1: root


def _root_gains(v: np.ndarray):
    """Per-prompt (a = vw, log max(v, w), log min(v, w)) for the unit gains, shape (n,)."""
    s = np.minimum(v, 1.0 - v)  # exact in binary for both branches
    with np.errstate(divide="ignore"):
        return s * (1.0 - s), np.log1p(-s), np.log(s)


def _root_unit_gain(a, lp, ls, k):
    """Gain of rollout number k (1-based): vw for k <= 3, vw (v^(k-2) + w^(k-2)) after."""
    return np.where(k <= 3, a, _root_tail_gain(a, lp, ls, np.maximum(k - 2, 2)))


def _root_tail_gain(a, lp, ls, t):
    """Gain of rollout number t + 2 for t >= 2: vw (max^t + min^t), at most vw."""
    t = t.astype(float)
    with np.errstate(under="ignore"):
        return np.minimum(a * (np.exp(t * lp) + _exp(t * ls)), a)


def _root_count_ge(x: float, a, lp, ls, c: int) -> np.ndarray:
    """Rollouts of each prompt with unit gain >= x (x >= 0), shape (n,)."""
    if x <= 0.0:
        return np.full(len(a), c, np.int64)
    idx = np.flatnonzero(a >= x)  # a > 0 here, so 0 < min(v, w) and log max(v, w) < 0
    count = np.zeros(len(a), np.int64)
    count[idx] = min(c, 3)
    if c > 3 and idx.size:
        est = np.floor(np.minimum(np.log(x / a[idx]) / lp[idx], c)).astype(np.int64)  # max^t >= x/a
        gain_at = lambda i, t: _root_tail_gain(a[i], lp[i], ls[i], t)
        count[idx] += _window_count(x, idx, est, 2, c - 2, gain_at)
    return count


def solve_root(values, budget, max_per_prompt=None) -> np.ndarray:
    """Exact Stage-1 allocation: m_i in {0, 2, 3, ...} maximising sum_i V_root(v_i, m_i).

    Args:
        values: predicted success probabilities v_i in [0, 1], shape (n,).
        budget: root rollouts M (int >= 0, not 1); sum(m) == M.
        max_per_prompt: optional cap on m_i (int >= 2 when budget > 0).
    Returns:
        int64 array m, shape (n,): lexicographically greatest optimal allocation (see the
        module docstring for the method, its proof and the tie rule).
    Raises:
        ValueError naming the bad value: non-probabilities, bad budget/cap, infeasible.
    """
    v, budget, c = _root_problem(values, budget, max_per_prompt)
    n = len(v)
    if budget == 0:
        return np.zeros(n, np.int64)
    a, lp, ls = _root_gains(v)
    gain = lambda items, k: _root_unit_gain(a[items], lp[items], ls[items], k)
    count_ge = lambda x: _root_count_ge(x, a, lp, ls, c)
    lam, above, at_least = _threshold(count_ge, gain, float(a.max()), n, budget)
    r = budget - int(above.sum())
    level = np.flatnonzero(at_least > above)  # prompts with units at gain λ
    slots = (at_least - above)[level]
    starter = above[level] == 0  # λ = vw: may take 0 or >= 2 of these units, never 1
    take = _fill_by_index(slots, r)
    p = int(np.flatnonzero(take)[-1])
    if starter[p] and take[p] == 1:
        later = np.flatnonzero(~starter[p + 1 :])
        earlier = np.flatnonzero(~starter[:p] | (take[:p] >= 3))
        if later.size:  # lexicographically best: the next extra prompt takes the unit
            take[p], take[p + 1 + later[0]] = 0, 1
        elif earlier.size:  # else the last reducible earlier prompt gives one back
            take[earlier[-1]] -= 1
            take[p] = 2
        else:  # r = 1 and no extra unit at λ: the relaxed optimum is infeasible
            return _parity_repair(above, int(level[np.flatnonzero(starter)[0]]), lam, c, gain)
    m = above.copy()
    m[level] += take
    return m


def _parity_repair(above, starter: int, lam: float, c: int, gain) -> np.ndarray:
    """Best of: drop the cheapest last unit of a started prompt and start ``starter`` with 2
    (gain 2λ - h), or add the best next unit (< λ) to a started prompt. Proof: module doc."""
    started = np.flatnonzero(above >= 3)  # nonempty: sum(above) = budget - 1 >= 1
    last = gain(started, above[started])
    drop = int(started[np.flatnonzero(last == last.min())[-1]])
    m_drop = above.copy()
    m_drop[starter], m_drop[drop] = 2, above[drop] - 1
    growable = started[above[started] < c]
    if growable.size == 0:
        return m_drop
    nxt = gain(growable, above[growable] + 1)
    m_add = above.copy()
    m_add[growable[int(np.argmax(nxt))]] += 1
    value_drop, value_add = 2.0 * lam - float(last.min()), float(nxt.max())
    if value_drop != value_add:
        return m_drop if value_drop > value_add else m_add
    diff = m_drop - m_add
    return m_drop if diff[np.flatnonzero(diff)[0]] > 0 else m_add


# -------------------------------------------------------------- Stage 2: prefixes


def _prefix_unit_gain(b, lq, k):
    """Gain of continuation number k (1-based): (1 - q) q^(k-1)."""
    return np.where(k <= 1, b, _prefix_tail_gain(b, lq, np.maximum(k - 1, 1)))


def _prefix_tail_gain(b, lq, t):
    """Gain of continuation number t + 1 for t >= 1: (1 - q) q^t (q^t flushed below e^-700)."""
    with np.errstate(invalid="ignore"):
        return np.minimum(b * _exp(t.astype(float) * lq), b)


def _prefix_count_ge(x: float, b, lq, c: int) -> np.ndarray:
    """Continuations of each prefix with unit gain >= x (x >= 0), shape (n,)."""
    if x <= 0.0:
        return np.full(len(b), c, np.int64)
    idx = np.flatnonzero(b >= x)  # q < 1 here
    count = np.zeros(len(b), np.int64)
    count[idx] = 1
    if c > 1 and idx.size:
        with np.errstate(divide="ignore", invalid="ignore"):  # q = 0: log q = -inf, est = 0
            est = np.floor(np.minimum(np.log(x / b[idx]) / lq[idx], c)).astype(np.int64)
        gain_at = lambda i, t: _prefix_tail_gain(b[i], lq[i], t)
        count[idx] += _window_count(x, idx, est, 1, c - 1, gain_at)
    return count


def solve_prefix(repeat_probabilities, budget, max_per_prefix=None) -> np.ndarray:
    """Exact Stage-2 allocation: k_j >= 0 maximising sum_j V_pref = sum_j (1 - q_j^k_j).

    1 - q^k is concave in k (marginal gains q^k (1 - q) nonincreasing), so taking the
    ``budget`` largest marginal gains is exact; equal gains go to lower indices first
    (the lexicographically greatest optimal allocation).

    Args:
        repeat_probabilities: q_j in [0, 1], shape (n,) (see :func:`repeat_probability`).
        budget: continuations to spend (int >= 0); sum(k) == budget.
        max_per_prefix: optional cap on k_j (int >= 0).
    Returns:
        int64 array k, shape (n,).
    """
    q = probabilities_1d(repeat_probabilities, "repeat_probabilities")
    budget = _nonneg_int(budget, "budget")
    cap = None if max_per_prefix is None else _nonneg_int(max_per_prefix, "max_per_prefix")
    n = len(q)
    if budget == 0:
        return np.zeros(n, np.int64)
    if n == 0:
        raise ValueError(f"budget = {budget} but repeat_probabilities is empty; expected at least one prefix")
    c = budget if cap is None else min(cap, budget)
    if budget > n * c:
        raise ValueError(
            f"budget = {budget} is infeasible for {n} prefixes with max_per_prefix = {cap}; "
            f"expected a budget <= {n * c}"
        )
    b = 1.0 - q
    with np.errstate(divide="ignore"):
        lq = np.log(q)
    gain = lambda items, k: _prefix_unit_gain(b[items], lq[items], k)
    _, above, at_least = _threshold(lambda x: _prefix_count_ge(x, b, lq, c), gain, float(b.max()), n, budget)
    return above + _fill_by_index(at_least - above, budget - int(above.sum()))
