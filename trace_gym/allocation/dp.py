"""Reference exact dynamic program for TRACE Stage 1 (root allocation).

:func:`solve_root_dp` solves the same problem as the fast threshold method
:func:`trace_gym.allocation.solvers.solve_root` (same contract, same tie rule), by a plain
DP over prompts: slow (O(B * sum_i M_i) time) but simple, so the fast solver is tested
and benchmarked against it. Re-exported by :mod:`trace_gym.allocation.allocators`.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trace_gym.allocation.solvers import _root_problem, root_utility

__all__ = ["solve_root_dp"]


def solve_root_dp(values, budget, max_per_prompt=None) -> np.ndarray:
    """Reference exact DP for Stage 1 (same contract and tie rule as
    :func:`~trace_gym.allocation.solvers.solve_root`).

    S_i(b) = best value of prompts i..n-1 using exactly b rollouts;
    S_i(b) = max_{m in {0} ∪ [2, M_i]} u_i(m) + S_{i+1}(b - m). Rebuilding forwards from
    prompt 0 and taking the largest maximising m gives the lexicographically greatest
    optimum (ties decided on float sums). Cost O(B * sum_i M_i) time, O(n B) memory,
    vectorised over b.

    M_i = min(c, bound_i) where bound_i is an exchange bound (:func:`_max_useful_rollouts`):
    with m_i >= 4 at most (B - m_i) / 2 other prompts are started, so one of the
    (B - m_i) // 2 + 1 others with the largest u(2) is not; moving 2 rollouts from i to it
    must not help: u_i(m_i) - u_i(m_i - 2) >= its u(2). Larger m_i are never optimal.
    """
    return _solve_root_dp(values, budget, max_per_prompt, prune=True)


def _solve_root_dp(values, budget, max_per_prompt=None, prune: bool = True) -> np.ndarray:
    v, budget, c = _root_problem(values, budget, max_per_prompt)
    n = len(v)
    if budget == 0:
        return np.zeros(n, np.int64)
    bound = _max_useful_rollouts(v, budget, c) if prune else np.full(n, c)
    choice = np.zeros((n, budget + 1), np.min_scalar_type(int(bound.max())))
    best = np.full(budget + 1, -np.inf)
    best[0] = 0.0
    for i in range(n - 1, -1, -1):
        M = int(bound[i])
        u = root_utility(v[i], np.arange(M + 1))
        u[1] = -np.inf  # one rollout is not allowed
        window = sliding_window_view(np.concatenate([np.full(M, -np.inf), best]), M + 1)
        new = np.empty_like(best)  # window[b, j] = best[b - (M - j)], i.e. m = M - j
        rows = max(1, (1 << 22) // (M + 1))
        for b0 in range(0, budget + 1, rows):
            cand = window[b0 : b0 + rows] + u[::-1]
            j = np.argmax(cand, axis=1)  # first maximum = largest m
            new[b0 : b0 + rows] = cand[np.arange(len(j)), j]
            choice[i, b0 : b0 + rows] = M - j
        best = new
    if not np.isfinite(best[budget]):  # unreachable after _root_problem's feasibility check
        raise RuntimeError(f"DP found no allocation of budget {budget}; feasibility check is wrong")
    m = np.zeros(n, np.int64)
    b = budget
    for i in range(n):
        m[i] = choice[i, b]
        b -= m[i]
    return m


def _max_useful_rollouts(v: np.ndarray, budget: int, c: int) -> np.ndarray:
    """Per-prompt upper bound on m_i in any optimal allocation (see :func:`solve_root_dp`)."""
    s = np.minimum(v, 1.0 - v)
    p = 1.0 - s
    u2 = np.sort(2.0 * s * p)[::-1]  # u(2) of all prompts, descending
    n = len(v)

    def feasible(m):  # m >= 4 not excluded by the exchange argument
        k = (budget - m) // 2 + 1  # (k+1)-th largest overall <= k-th largest among others
        theta = np.where(k < n, u2[np.minimum(k, n - 1)], 0.0)
        with np.errstate(under="ignore"):
            drop2 = p ** (m - 2) * s * (1 + p) + s ** (m - 2) * p * (1 + s)  # u(m) - u(m-2)
        return (m <= 3) | (drop2 >= theta * (1 - 1e-9))

    lo, hi = np.full(n, min(3, c)), np.full(n, c)
    while (lo < hi).any():  # largest feasible m; feasibility is monotone in m
        mid = (lo + hi + 1) // 2
        ok = feasible(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid - 1)
    return lo
