"""Per-prompt predictors the zoo's arms bring: a decayed Beta posterior (MoPPS, CERO) and a
windowed success rate (Knapsack RL).

Both learn only from each prompt's own root outcomes
(:meth:`~trace_gym.predictor.kinds.ObservesOutcomes.observe_outcomes`, called by the step's
learning half after every step); their ``update`` (the regression on tree targets) does
nothing. A prompt is keyed by :func:`~trace_gym.predictor.memory.prompt_key` of its
context (a hash of the prompt text) unless another ``key_of`` is given (the simulator's
states carry a task index, not a text). Memory is bounded: past ``capacity`` prompts the
least recently observed is forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from baselines.flat_waves import MAX_REMEMBERED, check_int, check_real, remember
from trace_gym.predictor.memory import prompt_key


def _outcomes(contexts: Sequence[Any], successes: Sequence[float],
              trials: Sequence[float]) -> list[tuple[float, float]]:
    """``(successes, trials)`` pairs, checked: finite, ``0 <= s <= t`` (``ValueError`` naming the bad pair)."""
    s, t = np.asarray(successes, dtype=float).reshape(-1), np.asarray(trials, dtype=float).reshape(-1)
    if not len(contexts) == len(s) == len(t):
        raise ValueError(f"outcome lengths differ: {len(contexts)} contexts, {len(s)} successes, {len(t)} trials")
    bad = ~(np.isfinite(s) & np.isfinite(t) & (s >= 0) & (s <= t))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"outcomes need finite 0 <= successes <= trials; entry {i} has {float(s[i])!r} "
                         f"of {float(t[i])!r}")
    return list(zip(s.tolist(), t.tolist()))


def _check_key_of(key_of: Any) -> Callable[[Any], Hashable]:
    if not callable(key_of):
        raise ValueError(f"key_of must be a callable from a context to a prompt key, got {type(key_of).__name__}")
    return key_of


class BetaPosteriorPredictor:
    """MoPPS' per-prompt Beta posterior of the success rate (Qu et al., arXiv:2507.04632).

    Each prompt starts at Beta(``prior_alpha``, ``prior_beta``); observing ``s`` successes
    of ``t`` root rollouts moves it to
    ``alpha <- decay * alpha + (1 - decay) * prior_alpha + s`` and
    ``beta <- decay * beta + (1 - decay) * prior_beta + (t - s)``: with ``decay`` (lambda)
    < 1 old evidence fades toward the prior, and only prompts rolled out are updated (as in
    MoPPS). ``predict`` is the posterior mean ``alpha / (alpha + beta)``; ``posterior`` the
    ``(alpha, beta)`` arrays (what the step driver puts into a view's ``alpha`` / ``beta``).
    With ``decay = 1`` the posterior is the prior plus every outcome seen: CERO's Beta state
    with its forgetting rho = 1.

    Args:
        prior_alpha, prior_beta: the prior (MoPPS: (1, 1)), each > 0.
        decay: lambda in (0, 1]; MoPPS: 1.0 in its MATH scripts (the config default), 0.5 for
            Countdown and Geometry3k. Default 1.0: a bench replays one fixed policy, whose rates
            do not drift.
        capacity: the most prompts remembered (>= 1).
        key_of: context -> prompt key (default :func:`~trace_gym.predictor.memory.prompt_key`).
    """

    def __init__(self, prior_alpha: float = 1.0, prior_beta: float = 1.0, decay: float = 1.0,
                 capacity: int = MAX_REMEMBERED, key_of: Callable[[Any], Hashable] = prompt_key):
        check_real("prior_alpha", prior_alpha, 0.0, float("inf"), open_low=True)
        check_real("prior_beta", prior_beta, 0.0, float("inf"), open_low=True)
        check_real("decay", decay, 0.0, 1.0, open_low=True)
        check_int("capacity", capacity, 1)
        self.prior = (float(prior_alpha), float(prior_beta))
        self.decay, self.capacity, self.key_of = float(decay), int(capacity), _check_key_of(key_of)
        self._beta: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()

    def posterior(self, contexts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """``(alpha, beta)``, shape (n,) each: the prompts' posteriors (the prior for one never seen)."""
        ab = np.array([self._beta.get(self.key_of(c), self.prior) for c in contexts], dtype=float).reshape(-1, 2)
        return ab[:, 0].copy(), ab[:, 1].copy()

    def predict(self, contexts: Sequence[Any]) -> np.ndarray:
        """Posterior mean success per prompt, shape (n,)."""
        a, b = self.posterior(contexts)
        return a / (a + b)

    def update(self, contexts: Sequence[Any], targets: Sequence[float], weights: Sequence[float] | None = None) -> dict:
        """Nothing: this predictor learns from root outcomes alone (:meth:`observe_outcomes`)."""
        return {}

    def observe_outcomes(self, contexts: Sequence[Any], successes: Sequence[float], trials: Sequence[float]) -> None:
        """The decayed update of each prompt's posterior (class docstring), in order."""
        a0, b0 = self.prior
        lam = self.decay
        for context, (s, t) in zip(contexts, _outcomes(contexts, successes, trials)):
            key = self.key_of(context)
            a, b = self._beta.get(key, self.prior)
            remember(self._beta, key, (lam * a + (1 - lam) * a0 + s, lam * b + (1 - lam) * b0 + (t - s)),
                     self.capacity)

    def state_dict(self) -> dict[str, Any]:
        return {"prior": self.prior, "decay": self.decay, "capacity": self.capacity,
                "entries": [(k, a, b) for k, (a, b) in self._beta.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prior = tuple(float(x) for x in state["prior"])
        self.decay, self.capacity = float(state["decay"]), int(state["capacity"])
        self._beta = OrderedDict((k, (float(a), float(b))) for k, a, b in state["entries"])


class RunningRatePredictor:
    """Knapsack RL's per-prompt success-rate estimate (Li et al., arXiv:2509.25849).

    A prompt's rate is its success rate over its latest visits (steps it was rolled out in),
    newest first, until they hold at least ``window`` rollouts (L; all of them when fewer):
    the last visit alone when it had L or more, else the most recent visits together (the
    paper's code: the last epoch's rollouts, or the most recent L rollouts when that epoch
    had fewer). Whole visits are kept (which rollout of a visit came first is not known).
    A prompt never seen is predicted at the rate of every rollout observed so far over all
    prompts (0.5 before any): Knapsack RL itself gives such a prompt the uniform group
    whatever its estimate (it reads the evidence count, not this value).

    Args:
        window: L, rollouts the estimate covers at least (Knapsack RL: 16), >= 1.
        capacity: the most prompts remembered (>= 1).
        key_of: context -> prompt key (default :func:`~trace_gym.predictor.memory.prompt_key`).
    """

    def __init__(self, window: int = 16, capacity: int = MAX_REMEMBERED,
                 key_of: Callable[[Any], Hashable] = prompt_key):
        check_int("window", window, 1)
        check_int("capacity", capacity, 1)
        self.window, self.capacity, self.key_of = int(window), int(capacity), _check_key_of(key_of)
        self._visits: OrderedDict[Hashable, list[tuple[float, float]]] = OrderedDict()  # newest visit last
        self._total = (0.0, 0.0)  # successes, trials over every prompt

    def counts(self, contexts: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """``(successes, trials)`` over each prompt's kept visits, shape (n,) each (0 for one never seen)."""
        st = np.array([[sum(v[0] for v in self._visits.get(self.key_of(c), ())),
                        sum(v[1] for v in self._visits.get(self.key_of(c), ()))] for c in contexts],
                      dtype=float).reshape(-1, 2)
        return st[:, 0].copy(), st[:, 1].copy()

    def predict(self, contexts: Sequence[Any]) -> np.ndarray:
        """Windowed success rate per prompt, shape (n,) (the pooled rate for one never seen)."""
        s, t = self.counts(contexts)
        pooled = self._total[0] / self._total[1] if self._total[1] > 0 else 0.5
        return np.where(t > 0, s / np.maximum(t, 1e-12), pooled)

    def update(self, contexts: Sequence[Any], targets: Sequence[float], weights: Sequence[float] | None = None) -> dict:
        """Nothing: this predictor learns from root outcomes alone (:meth:`observe_outcomes`)."""
        return {}

    def observe_outcomes(self, contexts: Sequence[Any], successes: Sequence[float], trials: Sequence[float]) -> None:
        """One visit per entry: appended to the prompt's visits, the oldest dropped once the
        newer ones hold ``window`` rollouts."""
        for context, (s, t) in zip(contexts, _outcomes(contexts, successes, trials)):
            if t <= 0:
                continue
            key = self.key_of(context)
            visits = [*self._visits.get(key, []), (s, t)]
            while len(visits) > 1 and sum(v[1] for v in visits[1:]) >= self.window:
                visits.pop(0)
            remember(self._visits, key, visits, self.capacity)
            self._total = (self._total[0] + s, self._total[1] + t)

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window, "capacity": self.capacity, "total": self._total,
                "entries": [(k, [list(v) for v in visits]) for k, visits in self._visits.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window, self.capacity = int(state["window"]), int(state["capacity"])
        self._total = tuple(float(x) for x in state["total"])
        self._visits = OrderedDict((k, [(float(s), float(t)) for s, t in v]) for k, v in state["entries"])
