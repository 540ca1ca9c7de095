"""CERO as a wave strategy: a primal-dual scheduler that paces a run-level rollout budget over steps.

Paper: Yiming Zong, Yige Wang, Jiashuo Jiang, "Cross-Epoch Adaptive Rollout Optimization for
RL Post-Training", arXiv:2606.05606 (the full text read is titled "CERO: Where and When to
Allocate Rollouts for RL Post-Training", by Zong, Wang, Xing Hu, Jiang, Zuo-Jun Max Shen:
the same method, Algorithm 1; no code was found).

Rule. One unit is one group of G roots here (the paper's unit is g = 4 responses with at
most N_max = 2 units per prompt per round, so one 8-response group; every quantity below is
in groups, which leaves the algorithm unchanged: the paper's exposures, rates and budgets all
scale by the same factor). Each step is a round k of K, one wave:

- per prompt: a Beta(a, b) success posterior (the predictor's ``view.alpha`` / ``view.beta``,
  the arm's own predictor ``beta_posterior`` with decay 1 = CERO's forgetting rho = 1; else
  prior plus the run's history) and a dual slope theta (init 4 q(a0, b0) with
  q(a, b) = a b / ((a + b)(a + b + 1)), the posterior expected Bernoulli variance); one price
  nu (init ``price``) and the run's budget left (init ``run_groups`` = B);
- the prompts with theta - nu > 0 in descending order (ties in pool order) each get one
  group until C groups are proposed (N~); those executed are the same, cut to the budget left;
- after the round, with R = B / M (groups per prompt over the run), c_bar = lambda / R,
  B_bar = B / K, G_B = max(B_bar, C - B_bar), gamma = 1 / sqrt(K), Z = K, for each prompt of
  the pool: c = 4 lambda q(a', b') / R on its updated posterior, theta' = c_bar theta,
  z* = 0 if c = 0 or theta' >= c, Z if theta' <= c exp(-c Z), else ln(c / theta') / c;
  theta <- clip01(theta - gamma (N~ - z* / K)); and nu <- clip01(nu - gamma (B_bar - sum N~) / G_B);
  the budget left falls by the groups executed; at 0 the run's rollouts are over.

Knobs and their scaling. Paper (Appendix G): g = 4, N_max = 2, C = 132 units (66 groups) per
round, B = 64,000 units over K = 500 rounds (B_bar = 128, so B_bar / C = 128 / 132), prior
Beta(1, 1), lambda = rho = 1, nu1 = 0.5, gamma = 1 / sqrt(500), the whole prompt set (M about
8,500) scored every round. Defaults here: G = 8 (the bench's ``group_size`` reaches it),
C = R // G groups for a step of R root rollouts (4 at the bench's R = 32), K = ``rounds`` =
100, B = (128 / 132) C K, M = the candidate pool's size (the prompts a round can score),
lambda = 1, nu1 = 0.5, gamma = 1 / sqrt(K).

Departures: the paper scores and updates every prompt of the dataset every round; here a
round sees the step's candidate pool, so only its prompts' slopes move (a prompt's slope is
kept across steps by id, bounded memory); ties in the ranking follow the pool's order (the
paper: a fixed seeded permutation; the bench's pool is already a random draw). CERO leaves
budget unspent by design (B_bar < C, and rounds priced out); once B is spent every later
step stops before rolling out.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from baselines.flat_waves import (
    MAX_REMEMBERED, check_int, check_real, group_wave, history_posterior, remember, roots_left, step_roots,
)
from trace_gym.allocation.waves import StepView, Wave

#: The paper's per-round pace of the run budget against the round's capacity (B_bar / C).
PACE = 128 / 132


def expected_variance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """q(a, b) = a b / ((a + b)(a + b + 1)): the Beta posterior's expected Bernoulli variance, in [0, 1/4]."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a * b / ((a + b) * (a + b + 1))


def target_exposure(c: np.ndarray, theta: np.ndarray, cap: float) -> np.ndarray:
    """z*: the cumulative exposure at which the utility's marginal slope c exp(-c z) meets theta,
    clipped to [0, ``cap``] (0 where c = 0 or theta >= c)."""
    c, theta = np.asarray(c, dtype=float), np.asarray(theta, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        inner = np.log(c / theta) / c
    out = np.where(theta <= c * np.exp(-c * cap), cap, inner)
    return np.where((c <= 0) | (theta >= c), 0.0, out)


class CERO:
    """CERO (module docstring): a dual-priced, budget-paced choice of prompts per step.

    Args:
        group_size: G, roots per chosen prompt (>= 2).
        groups_per_round: C (``None``: R // G).
        rounds: K, the run's rounds the budget is paced over (100).
        run_groups: B, groups over the run (``None``: (128 / 132) C K, fixed at the first step).
        dataset_size: M (``None``: the candidate pool's size).
        utility_scale: lambda (1).
        price: nu1, the initial price (0.5).
        prior: the Beta prior (1, 1).
        capacity: the most prompts whose slope is remembered.
    """

    description = "CERO: primal-dual prices pick prompts and pace a run-level budget (one G-group per prompt)"
    predictor = "beta_posterior"

    def __init__(self, group_size: int = 8, groups_per_round: int | None = None, rounds: int = 100,
                 run_groups: float | None = None, dataset_size: int | None = None, utility_scale: float = 1.0,
                 price: float = 0.5, prior: tuple[float, float] = (1.0, 1.0), capacity: int = MAX_REMEMBERED):
        check_int("group_size", group_size, 2)
        check_int("groups_per_round", groups_per_round, 1, allow_none=True)
        check_int("rounds", rounds, 1)
        if run_groups is not None:
            check_real("run_groups", run_groups, 0.0, math.inf, open_low=True)
        check_int("dataset_size", dataset_size, 1, allow_none=True)
        check_real("utility_scale", utility_scale, 0.0, math.inf, open_low=True)
        check_real("price", price, 0.0, 1.0)
        for name, value in zip(("prior[0]", "prior[1]"), prior):
            check_real(name, value, 0.0, math.inf, open_low=True)
        check_int("capacity", capacity, 1)
        self.group_size, self.groups_per_round, self.rounds = int(group_size), groups_per_round, int(rounds)
        self.run_groups, self.dataset_size, self.utility_scale = run_groups, dataset_size, float(utility_scale)
        self.prior, self.capacity = (float(prior[0]), float(prior[1])), int(capacity)
        self.price = float(price)
        self.total: float | None = None  # B, groups over the run; set at the first step
        self.budget_left: float | None = None  # groups of B not yet executed
        self.theta: OrderedDict[str, float] = OrderedDict()  # prompt id -> dual slope
        self._round: tuple | None = None  # (a, b, theta, proposed, executed) of the running step

    def with_group_size(self, group_size: int) -> "CERO":
        """The same arm at group size G (:class:`~trace_gym.allocation.allocators.GroupSized`); its state starts afresh."""
        return type(self)(group_size, self.groups_per_round, self.rounds, self.run_groups, self.dataset_size,
                          self.utility_scale, self.price, self.prior, self.capacity)

    def capacity_per_round(self, view: StepView) -> int:
        """C, groups per round."""
        return self.groups_per_round or step_roots(view) // self.group_size

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        c_round = self.capacity_per_round(view)
        if self.total is None:
            self.total = float(self.run_groups if self.run_groups is not None else PACE * c_round * self.rounds)
            self.budget_left = self.total
        if view.wave > 0:
            return self._end(view, c_round)
        if self.budget_left <= 0:
            return None
        a, b = history_posterior(view, self.prior)
        start = 4 * float(expected_variance(*self.prior))
        theta = np.array([self.theta.get(i, start) for i in view.ids], dtype=float)
        order = [int(i) for i in np.argsort(-(theta - self.price), kind="stable") if theta[i] - self.price > 0]
        proposed = order[:c_round]
        affordable = min(c_round, int(math.floor(self.budget_left + 1e-9)), roots_left(view) // self.group_size)
        executed = proposed[:affordable]
        self._round = (a, b, theta, proposed, executed)
        wave = group_wave(executed, self.group_size)
        return wave if wave is not None else self._end(view, c_round)

    def _end(self, view: StepView, c_round: int) -> None:
        """The round's dual update (module docstring) on the outcomes it returned."""
        if self._round is None:
            return None
        a, b, theta, proposed, executed = self._round
        self._round = None
        k = self.rounds
        per_prompt = self.total / (self.dataset_size or view.n)  # R
        pace = self.total / k  # B_bar
        gamma = 1 / math.sqrt(k)
        q = expected_variance(a + np.asarray(view.successes), b + np.asarray(view.failures))
        c = 4 * self.utility_scale * q / per_prompt
        z = target_exposure(c, (self.utility_scale / per_prompt) * theta, float(k))
        chosen = np.zeros(view.n)
        chosen[proposed] = 1.0
        theta = np.clip(theta - gamma * (chosen - z / k), 0.0, 1.0)
        for i, value in zip(view.ids, theta.tolist()):
            remember(self.theta, i, value, self.capacity)
        self.price = float(np.clip(self.price - gamma * (pace - chosen.sum()) / max(pace, c_round - pace), 0.0, 1.0))
        self.budget_left -= len(executed)
        return None
