"""Success predictors over simulator states (:class:`trace_gym.sim.simulator.SimState`).

- :class:`OraclePredictor`: the true V_t (an upper bound, never a headline).
- :class:`NoisyOraclePredictor`: sigmoid(logit V_t + sigma eps), with sigma calibrated
  so the prompt-level Spearman correlation with p is a chosen value.
- :class:`LearnedPredictor`: online logistic regression on features a model could
  see, trained between steps on ``RolloutTree.targets()``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from trace_gym.sim.simulator import SimState, SimWorld, logit, sigmoid


@dataclass
class OraclePredictor:
    """The true value V_t of every state."""

    def predict(self, contexts: Sequence[SimState]) -> np.ndarray:
        return np.array([c.value for c in contexts], dtype=float)

    def update(self, contexts, targets, weights=None) -> dict[str, float]:
        return {"n": float(len(contexts))}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@functools.lru_cache(maxsize=512)  # a fit asks the same (target, prior) once per simulated bank and grid point
def noise_for_spearman(
    target: float, prior: tuple, n_samples: int = 20000, seed: int = 0
) -> float:
    """sigma such that Spearman(p, logit p + sigma eps) = ``target`` for p drawn from ``prior``: a Beta
    (a, b), or task types ((share, a, b), ...) (:func:`trace_gym.sim.prior.components_of`; hashable).

    Spearman is rank-based, so only the distribution of logit p matters. Estimated on
    ``n_samples`` common random numbers and solved by bisection (the correlation falls
    monotonically in sigma); the sampling error is about 1 / sqrt(n_samples). A target of 0
    is infinite noise (:func:`trace_gym.sim.make_pool` then gives a feature of pure noise).
    """
    if not 0 <= target <= 1:
        raise ValueError(f"target Spearman correlation must lie in [0, 1], got {target!r}")
    if target == 1:
        return 0.0
    if target == 0:
        return float("inf")
    from scipy import stats

    from trace_gym.sim.prior import components_of, draw

    rng = np.random.default_rng(seed)
    z = logit(draw(components_of(prior), n_samples, rng)[0])
    eps = rng.standard_normal(n_samples)
    rz = stats.rankdata(z)

    def rho(sigma: float) -> float:
        return float(np.corrcoef(rz, stats.rankdata(z + sigma * eps))[0, 1])

    lo, hi = 0.0, 1.0
    while rho(hi) > target:
        hi *= 2
        if hi > 1e6:
            raise ValueError(f"cannot reach Spearman {target} (too low for this prior)")
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rho(mid) > target else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass
class NoisyOraclePredictor:
    """sigmoid(logit V_t + sigma eps), eps ~ N(0, 1) fresh per call.

    Build with :meth:`with_spearman` to choose the prompt-level rank correlation.
    """

    sigma: float
    rng: np.random.Generator

    @classmethod
    def with_spearman(cls, spearman: float, world: SimWorld, seed: int = 0) -> "NoisyOraclePredictor":
        return cls(noise_for_spearman(spearman, world.difficulty()), np.random.default_rng(seed))

    def predict(self, contexts: Sequence[SimState]) -> np.ndarray:
        v = np.array([c.value for c in contexts], dtype=float)
        return sigmoid(logit(v) + self.sigma * self.rng.standard_normal(len(v)))

    def update(self, contexts, targets, weights=None) -> dict[str, float]:
        return {"n": float(len(contexts))}

    def state_dict(self) -> dict:
        return {"sigma": self.sigma, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.sigma = float(state["sigma"])
        self.rng.bit_generator.state = state["rng"]


#: The L2 penalty on :class:`LearnedPredictor`'s intercepts: none but a numerical floor (a slot no example
#: has reached keeps its weight).
INTERCEPT_L2 = 1e-8
#: Halvings of a Newton step before :class:`LearnedPredictor` gives up on it.
MAX_HALVINGS = 30


@dataclass
class LearnedPredictor:
    """Online logistic regression on what a model could observe.

    Features per state, with separate weights for prompts (t = 0) and prefixes
    (t > 0): [1{t=0}, 1{t=0} f, 1{t>0}, 1{t>0} f, 1{t>0} signal], f the task features; with
    ``turn_slots`` = k > 0 the one prefix intercept 1{t>0} becomes k, 1{t=1} .. 1{t>=k} (a prefix's turn,
    which a model reading its text sees; :attr:`~trace_gym.sim.simulator.SimWorld.prefix_sees_turn`).
    Each ``update`` fits the last ``memory`` examples seen, its own batch last (the sim's
    policy is stationary, so old targets stay valid): ``newton_steps`` Newton (IRLS)
    steps, warm-started from the previous weights, on the weighted cross-entropy against
    the soft targets (minimised by the true success probability), with L2 penalty
    ``l2``; a step that raises that objective is halved until it does not (a pure Newton step
    overshot where a kind of task never succeeds and the design is near-separable: the weights
    ran to logits of +-30 in two of four simulated warm-ups). ``memory = 0`` keeps no replay
    memory: each update fits its own batch alone (a batch longer than ``memory > 0`` keeps its
    last ``memory`` examples). Before the first update every prediction is 0.5. ``level_shift``
    (logit units) is added to every *prompt* prediction (t = 0) after that: an offset in level of
    the kind a real predictor carries, which the simulator calibrated to a bank sets from the bank predictor's measured
    level error (:mod:`trace_gym.bench.sim_fit`); it never enters the regression.

    Raises:
        ValueError: ``memory`` that is not an integer >= 0, ``newton_steps`` not >= 1,
            ``l2`` not a finite number >= 0 (one line naming the value).
    """

    features: np.ndarray  # (n_tasks, feature_dim), from the pool
    newton_steps: int = 3
    l2: float = 1e-3
    memory: int = 50_000
    level_shift: float = 0.0
    turn_slots: int = 0
    weights: np.ndarray | None = None
    _x: np.ndarray | None = None
    _y: np.ndarray | None = None
    _w: np.ndarray | None = None

    def __post_init__(self) -> None:
        if isinstance(self.memory, bool) or not isinstance(self.memory, (int, np.integer)) or self.memory < 0:
            raise ValueError(f"learned predictor: memory must be an integer >= 0 (examples kept; 0: none), "
                             f"got {self.memory!r}")
        if isinstance(self.newton_steps, bool) or not isinstance(self.newton_steps, (int, np.integer)) \
                or self.newton_steps < 1:
            raise ValueError(f"learned predictor: newton_steps must be an integer >= 1, got {self.newton_steps!r}")
        if isinstance(self.l2, bool) or not isinstance(self.l2, (int, float)) or not 0 <= self.l2 < float("inf"):
            raise ValueError(f"learned predictor: l2 must be a finite number >= 0, got {self.l2!r}")
        if isinstance(self.turn_slots, bool) or not isinstance(self.turn_slots, (int, np.integer)) \
                or self.turn_slots < 0:
            raise ValueError(f"learned predictor: turn_slots must be an integer >= 0 (0: one prefix intercept), "
                             f"got {self.turn_slots!r}")

    def _phi(self, contexts: Sequence[SimState]) -> np.ndarray:
        n = len(contexts)
        task = np.fromiter((c.task for c in contexts), dtype=np.int64, count=n)
        sig = np.fromiter((c.signal for c in contexts), dtype=float, count=n)
        turn = np.fromiter((c.turn for c in contexts), dtype=np.int64, count=n)
        deep = (turn > 0).astype(float)[:, None]
        f = self.features[task]
        at = deep
        if self.turn_slots:  # one intercept per prefix turn, the last slot for every later turn
            at = (np.minimum(turn, self.turn_slots)[:, None] == np.arange(1, self.turn_slots + 1)[None, :]) * deep
        return np.hstack([1 - deep, (1 - deep) * f, at, deep * f, deep * sig[:, None]])

    def predict(self, contexts: Sequence[SimState]) -> np.ndarray:
        if self.weights is None:
            return np.full(len(contexts), 0.5)
        return sigmoid(self.logits(contexts))

    def logits(self, contexts: Sequence[SimState]) -> np.ndarray:
        """The logit of every prediction (after the first update), ``level_shift`` added at prompts."""
        z = np.clip(self._phi(contexts) @ self.weights, -30, 30)
        if self.level_shift:
            z = z + self.level_shift * np.fromiter((c.turn == 0 for c in contexts), dtype=float, count=len(contexts))
        return z

    def update(self, contexts, targets, weights=None) -> dict[str, float]:
        if len(contexts) == 0:
            return {"n": 0.0}
        x = self._phi(contexts)
        y = np.asarray(targets, dtype=float)
        if y.shape != (len(x),) or (y < 0).any() or (y > 1).any():
            raise ValueError(f"targets must be {len(x)} values in [0, 1], got shape {y.shape}")
        w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
        if self.memory:  # the last `memory` examples, this batch's last ([-0:] would keep them all)
            if self._x is not None:
                x, y, w = np.vstack([self._x, x]), np.concatenate([self._y, y]), np.concatenate([self._w, w])
            x, y, w = x[-self.memory:], y[-self.memory:], w[-self.memory:]
            self._x, self._y, self._w = x, y, w
        w = w / w.sum()
        if self.weights is None:
            self.weights = np.zeros(x.shape[1])
        penalty = self._penalty(x.shape[1])
        objective = self._objective(x, y, w, self.weights, penalty)
        for _ in range(self.newton_steps):
            pred = sigmoid(np.clip(x @ self.weights, -30, 30))
            grad = x.T @ (w * (pred - y)) + penalty * self.weights
            hess = (x * (w * pred * (1 - pred))[:, None]).T @ x + np.diag(penalty)
            step = np.linalg.solve(hess, grad)
            for _ in range(MAX_HALVINGS):  # damped: a step that raises the objective is halved
                trial = self.weights - step
                value = self._objective(x, y, w, trial, penalty)
                if value <= objective:
                    break
                step = step / 2
            else:
                break  # no step lowers it: the weights stay
            self.weights, objective = trial, value
        pred = np.clip(sigmoid(np.clip(x @ self.weights, -30, 30)), 1e-9, 1 - 1e-9)
        loss = float(-(w * (y * np.log(pred) + (1 - y) * np.log(1 - pred))).sum())
        return {"n": float(len(y)), "loss": loss}

    @staticmethod
    def _objective(x: np.ndarray, y: np.ndarray, w: np.ndarray, weights: np.ndarray, penalty: np.ndarray) -> float:
        """The weighted cross-entropy plus the L2 penalty (``penalty`` per weight, :meth:`_penalty`) at ``weights``
        (what each Newton step lowers)."""
        z = x @ weights
        return float((w * (np.logaddexp(0, z) - y * z)).sum() + 0.5 * weights @ (penalty * weights))

    def _penalty(self, n_columns: int) -> np.ndarray:
        """The L2 penalty of each of the ``n_columns`` weights: ``l2``, and :data:`INTERCEPT_L2` on the intercepts
        (the prompt's and each prefix slot's), which set the levels: a penalty there pulls a level whose
        examples carry little weight (the prefixes' ``prefix_share``) towards 0.5."""
        penalty = np.full(n_columns, float(self.l2))
        dim = self.features.shape[1]
        penalty[0] = penalty[1 + dim:1 + dim + max(self.turn_slots, 1)] = INTERCEPT_L2
        return penalty

    def state_dict(self) -> dict:
        """The weights and the replay memory (the features are the pool's, not state)."""
        return {k: None if v is None else v.copy() for k, v in
                (("weights", self.weights), ("x", self._x), ("y", self._y), ("w", self._w))}

    def load_state_dict(self, state: dict) -> None:
        self.weights, self._x, self._y, self._w = (state[k] for k in ("weights", "x", "y", "w"))
