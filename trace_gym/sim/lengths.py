"""Per-episode lengths in the simulator: each branch draws its own end turn (issue 45).

The simulator's default gives a task one length T_i, shared by every episode of it. A
bank's roots of one prompt mix lengths, and the length goes with the outcome (math bank:
a failed root ends after 1.3 turns on average, a successful one after 2.0; guessing bank:
every failed root runs its 4 turns, a successful one ends when it guesses). This model
draws the length L of each episode from a histogram of its outcome y:

    P(L = l | y = 0) = f_l (``turn_shares``),   P(L = l | y = 1) = s_l (``success_turn_shares``),

over l = min_turns..max_turns. The value path V_t (the beta-splitting martingale of
:mod:`trace_gym.sim.simulator`) runs to the horizon H = max_turns and y ~ Bernoulli(V_{H-1}),
as in a task of H turns; the episode is then cut at L with reward y.

Because L depends on y, reaching turn t says something about y. A node at turn t therefore
stores as its value what is known there, P(y = 1 | V_t, L > t):

    W_t = V_t S_1(t) / (V_t S_1(t) + (1 - V_t) S_0(t)),   S_y(t) = P(L > t | y)

(:meth:`LengthModel.value`), and a branch from it draws its future given that history
(:func:`episode_paths`): y ~ Bernoulli(W_t), then the value path given y (the beta step
tilted by the outcome: V_{u+1} ~ Beta(kappa V_u + y, kappa (1 - V_u) + 1 - y), exact for the
martingale conditioned on its end), then L from y's histogram restricted to L > t and
renormalised. So the root's own outcome and every continuation from the node have the same
mean, W_t: restoring a snapshot and resampling, as a real env does. With the two histograms
equal, W_t = V_t.

When a task's difficulty moves its successes between turns (guessing bank: a prompt the model
solves often solves it on its first guess, one it rarely solves spreads its few successes over
the four turns), one histogram for all tasks ties a late continuation's chance to its prompt's
p too tightly. ``tilt`` gamma lets the successful lengths depend on the task's p:

    P(L = l | y = 1, p) ∝ s_l exp(-gamma (l - min_turns) (logit p - logit pivot)),

so at p = pivot (the prior's mean) the histogram is s, and gamma > 0 moves an easier task's
successes earlier. p is the task's, fixed for all its episodes (:meth:`LengthModel.at`), so W_t
above stays exact. gamma = 0: the one histogram.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


def check_turn_shares(shares: Sequence[float], min_turns: int, max_turns: int, name: str = "turn_shares") -> None:
    """``ValueError`` naming ``name`` and the value unless ``shares`` is empty or one finite share
    >= 0 per episode length ``min_turns..max_turns``, not all 0."""
    if len(shares) == 0:
        return
    want = max_turns - min_turns + 1
    try:
        values = [float(x) for x in shares]
    except (TypeError, ValueError):
        values = []
    if len(values) != want or any(not np.isfinite(x) or x < 0 for x in values) or sum(values) <= 0:
        raise ValueError(f"{name} must be {want} shares >= 0, one per episode length {min_turns}..{max_turns}, not "
                         f"all 0, got {tuple(shares)!r}")


def check_lengths(turn_shares: Sequence[float], success_turn_shares: Sequence[float], min_turns: int,
                  max_turns: int) -> None:
    """``ValueError`` in one line naming the bad value unless both share lists pass
    :func:`check_turn_shares` and ``success_turn_shares`` comes with ``turn_shares``."""
    check_turn_shares(turn_shares, min_turns, max_turns)
    check_turn_shares(success_turn_shares, min_turns, max_turns, "success_turn_shares")
    if len(success_turn_shares) and not len(turn_shares):
        raise ValueError(f"success_turn_shares {tuple(success_turn_shares)!r} needs turn_shares (the failed "
                         "episodes' lengths) too")


def check_tilt(tilt: float, pivot: float = 0.5) -> None:
    """``ValueError`` naming the value unless ``tilt`` is finite and ``pivot`` lies in (0, 1)."""
    if not isinstance(tilt, (int, float)) or not np.isfinite(tilt):
        raise ValueError(f"success_turn_tilt must be a finite number, got {tilt!r}")
    if not 0 < pivot < 1:
        raise ValueError(f"the tilt's pivot (mean_success) must lie in (0, 1), got {pivot!r}")


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


@dataclass(frozen=True)
class LengthModel:
    """Episode lengths by outcome: ``failure[i]``, ``success[i]`` = P(L = min_turns + i | y = 0, 1),
    each normalised to sum 1. Shapes (max_turns - min_turns + 1,). ``tilt`` (gamma) and ``pivot``: the
    successful lengths of a task of success probability p are :meth:`success_shares` (p); ``success`` is
    the histogram at p = ``pivot``, and the one every method reads (a task's own model: :meth:`at`)."""

    min_turns: int
    failure: np.ndarray
    success: np.ndarray
    tilt: float = 0.0
    pivot: float = 0.5

    @classmethod
    def of(cls, min_turns: int, max_turns: int, turn_shares: Sequence[float],
           success_turn_shares: Sequence[float] = (), tilt: float = 0.0, pivot: float = 0.5) -> "LengthModel":
        """The model of ``turn_shares`` (failed episodes' lengths; every episode's when
        ``success_turn_shares`` is empty) and ``success_turn_shares`` (successful ones', at p = ``pivot``
        when ``tilt`` is not 0)."""
        check_lengths(turn_shares, success_turn_shares, min_turns, max_turns)
        check_tilt(tilt, pivot)
        fail = np.asarray(turn_shares, dtype=float)
        win = np.asarray(success_turn_shares, dtype=float) if len(success_turn_shares) else fail
        return cls(int(min_turns), fail / fail.sum(), win / win.sum(), float(tilt), float(pivot))

    def success_shares(self, p: np.ndarray | float) -> np.ndarray:
        """P(L = min_turns + i | y = 1) of tasks of success probability ``p``: shape (n, lengths) for
        ``p`` of n values. A length of share 0 stays 0; with ``tilt`` 0 every row is ``success``."""
        p = np.atleast_1d(np.asarray(p, dtype=float))
        steps = np.arange(len(self.success))
        log_w = -self.tilt * steps[None, :] * (_logit(p) - _logit(self.pivot))[:, None]
        log_w -= log_w.max(axis=1, keepdims=True)  # exp never overflows; the rows are normalised below
        w = self.success[None, :] * np.exp(log_w)
        return w / w.sum(axis=1, keepdims=True)

    def at(self, p: float) -> "LengthModel":
        """The lengths of one task of success probability ``p``: its successful lengths fixed at
        :meth:`success_shares` (p) (tilt 0). The model itself where ``tilt`` is 0."""
        if self.tilt == 0:
            return self
        return LengthModel(self.min_turns, self.failure, self.success_shares(p)[0], 0.0, self.pivot)

    @property
    def max_turns(self) -> int:
        return self.min_turns + len(self.failure) - 1

    def survival(self, t: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """(S_0(t), S_1(t)) = P(L > t | y = 0, 1), elementwise over turns ``t``."""
        t = np.asarray(t)
        lengths = self.min_turns + np.arange(len(self.failure))
        longer = lengths[None, :] > t.reshape(-1, 1)  # (len(t), lengths)
        return (longer @ self.failure).reshape(t.shape), (longer @ self.success).reshape(t.shape)

    def value(self, latent: np.ndarray | float, t: np.ndarray | int) -> np.ndarray:
        """W_t = P(y = 1 | V_t = ``latent``, L > t), elementwise (broadcast); the latent value where
        no episode of either outcome runs past t (a node that cannot be reached)."""
        v = np.asarray(latent, dtype=float)
        return reached_value(v, *self.survival(np.broadcast_to(np.asarray(t), v.shape)))

    def draw(self, outcome: np.ndarray, after: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One length per branch: L ~ the histogram of ``outcome`` (0 or 1) restricted to L > ``after``
        (renormalised; where no mass remains, L = the smallest allowed, max(after + 1, min_turns)).
        Shapes (n,) in, (n,) out."""
        y, after = np.asarray(outcome, dtype=float), np.asarray(after, dtype=int)
        lengths = self.min_turns + np.arange(len(self.failure))
        shares = np.where(y[:, None] > 0.5, self.success[None, :], self.failure[None, :])
        shares = shares * (lengths[None, :] > after[:, None])
        mass = shares.sum(axis=1)
        cum = np.cumsum(shares, axis=1)
        u = rng.random(len(y)) * mass
        pick = np.minimum((u[:, None] >= cum).sum(axis=1), len(lengths) - 1)
        return np.where(mass > 0, lengths[pick], np.maximum(after + 1, self.min_turns))


def reached_value(latent: np.ndarray, s0: np.ndarray | float, s1: np.ndarray | float) -> np.ndarray:
    """W = V S_1 / (V S_1 + (1 - V) S_0) elementwise (``latent`` V, survivals ``s0``, ``s1`` of each
    outcome past the node's turn); V where neither outcome runs past it."""
    v = np.asarray(latent, dtype=float)
    num, den = v * s1, v * s1 + (1 - v) * s0
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), v)


def episode_paths(latent: np.ndarray, value: np.ndarray, start: np.ndarray, kappa: float, model: LengthModel,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The turns of branches that start at nodes of turns ``start`` with latent values V = ``latent``
    and values W = ``value`` (shapes (n,)), to the horizon H = ``model.max_turns``.

    Returns ``(latents, values, ends)``: rows are the turns t0 + 1 .. H (t0 = min(start)), so
    ``latents`` and ``values`` have shape (H - t0, n); a branch's rows after its start and up to
    its end turn ``ends[j]`` (> start[j]) are its turns, the one at its end holding its reward y in
    both arrays; rows outside a branch's turns hold y (and are never read).
    """
    n, t0, horizon = len(start), int(start.min()), model.max_turns
    y = (rng.random(n) < value).astype(float)
    rows = horizon - t0
    latents = np.empty((rows, n))
    v = np.asarray(latent, dtype=float).copy()
    for row in range(rows - 1):  # turns t0 + 1 .. H - 1: the value path, given its end y
        t = t0 + 1 + row
        step = (start < t) & (kappa * v > 0.0) & (kappa * (1 - v) > 0.0)  # a value whose a or b underflows: settled
        if step.any():
            up, a, b = y[step] > 0.5, kappa * v[step], kappa * (1 - v[step])
            v[step] = rng.beta(a + up, b + ~up)  # + 1 on one side only: (b + 1) - 1 would round a tiny b to 0
        latents[row] = v
    latents[rows - 1] = y
    ends = model.draw(y, start, rng)
    turns = (t0 + 1 + np.arange(rows))[:, None]
    values = np.where(turns < ends[None, :], model.value(latents, np.broadcast_to(turns, latents.shape)), y[None, :])
    latents = np.where(turns < ends[None, :], latents, y[None, :])
    return latents, values, ends


def length_shares(turns: Sequence[int], min_turns: int, max_turns: int) -> tuple[float, ...]:
    """The share of each episode length ``min_turns..max_turns`` among ``turns`` (empty: ``()``)."""
    t = np.clip(np.asarray(turns, dtype=int), min_turns, max_turns)
    if t.size == 0:
        return ()
    counts = np.bincount(t - min_turns, minlength=max_turns - min_turns + 1)
    return tuple(float(c / counts.sum()) for c in counts)
