"""GRESO as a wave strategy: skip prompts whose recent groups were all pure, then DAPO-style waves.

Paper: Haizhong Zheng, Yang Zhou, Brian R. Bartoldson, Bhavya Kailkhura, Fan Lai, Jiawei
Zhao, Beidi Chen, "Act Only When It Pays: Efficient Reinforcement Learning for LLM Reasoning
via Selective Rollouts", arXiv:2506.02177 (rule as in the authors' code, Infini-AI-Lab/GRESO).

Rule:

1. Before the step's first wave, walk the pool in order and skip each prompt at random: a
   prompt whose latest z >= 1 chosen steps in a row ended with all-pass groups is skipped
   with probability ``1 - max(p_easy ** z, keep_floor)``, all-fail groups
   ``1 - max(p_hard ** z, keep_floor)``; a prompt never chosen, or whose last group was
   mixed, is kept (the view's ``pure_streak`` and ``streak_kind``). One uniform draw per
   prompt of the pool, in pool order, from the step's rng.
2. Waves on the survivors, in pool order, G roots each: the first wave takes
   ``sampling_groups`` (S) prompts; while fewer than ``train_groups`` (B_train) groups are
   mixed and the last wave was not marked final, the next wave takes
   ``W = max(min(est, S), min_wave_groups)`` prompts with
   ``est = int((B_train - kept) / max(1 - zvr, eps) * safety)``, zvr the share of pure
   groups in the latest wave; the wave is the final one when ``est <= S``.
3. After the step (once any prompt of the pool had been chosen before: the code adapts from
   its second epoch on), each exploration probability moves by ``p_step`` within
   ``p_bounds``: ``p_easy`` down when the step's all-pass groups were at least
   ``target_pure / 3`` of its groups, else up; ``p_hard`` likewise against
   ``2 target_pure / 3`` (the code: hard prompts are more likely to change).

Knobs and their scaling. The paper's scripts: p_easy = p_hard = 0.5 at the start, p_step =
0.01 within [0.05, 0.95], keep_floor = 0.01, target_pure = 0.25, safety = 1.25, G = 8,
B_train = 256, S = 384 (1.5 B_train), min_wave_groups = 64 (B_train / 4). Defaults here
keep those, with B_train = max(1, R // (2 G)) for a step of R root rollouts (the trained
groups hold half the budget), S = ceil(1.5 B_train) and min_wave_groups =
max(1, B_train // 4): at the bench's R = 32 and G = 8, B_train = 2, S = 3 (24 roots),
min 1; at G = 4, B_train = 4, S = 6. With few steps the 0.01 drift barely moves; p_step is
a knob.

Departures: a step's budget is fixed here, so a wave takes only whole groups the budget
left still buys; the budget left when the groups are collected stays unspent; GRESO drops
pure and surplus groups from the training batch, here every paid rollout stays in the
trees (:attr:`GRESO.trained` names the groups it would train on). "A visit" is a step in
which the prompt was chosen (the run's history), not an epoch.
"""

from __future__ import annotations

import math

import numpy as np

from baselines.flat_waves import (
    all_fail, all_pass, check_int, check_real, group_wave, mixed, rolled_out, roots_left, step_roots,
)
from trace_gym.allocation.waves import StepView, Wave

#: Smallest 1 - zvr used when every group of the latest wave was pure.
EPS = 1e-6


def skip_probabilities(pure_streak: np.ndarray, streak_kind: np.ndarray, p_easy: float, p_hard: float,
                       keep_floor: float) -> np.ndarray:
    """GRESO's probability of skipping each prompt, shape (n,): 0 without a pure streak, else
    ``1 - max(p ** z, keep_floor)`` with p = ``p_easy`` for an all-pass streak of length z and
    ``p_hard`` for an all-fail one."""
    z = np.asarray(pure_streak, dtype=float)
    kind = np.asarray(streak_kind)
    p = np.where(kind > 0, p_easy, p_hard)
    skip = 1.0 - np.maximum(p ** z, keep_floor)
    return np.where((z > 0) & (kind != 0), skip, 0.0)


class GRESO:
    """GRESO selective rollouts (module docstring).

    Args:
        group_size: G (>= 2).
        train_groups: B_train (``None``: max(1, R // (2 G))).
        sampling_groups: S, the first wave's prompts (``None``: ceil(1.5 B_train)).
        min_wave_groups: the smallest later wave (``None``: max(1, B_train // 4)).
        p_initial: both exploration probabilities at the start (0.5).
        p_step: their change per step (0.01).
        p_bounds: their range ((0.05, 0.95)).
        keep_floor: the least keep probability (0.01).
        target_pure: the target share of pure groups (0.25).
        safety: the wave-size factor (1.25).
    """

    description = "GRESO: skip prompts with recent all-pass/all-fail streaks at random, then DAPO-style waves"
    predictor = "constant"  # reads no prediction

    def __init__(self, group_size: int = 8, train_groups: int | None = None, sampling_groups: int | None = None,
                 min_wave_groups: int | None = None, p_initial: float = 0.5, p_step: float = 0.01,
                 p_bounds: tuple[float, float] = (0.05, 0.95), keep_floor: float = 0.01,
                 target_pure: float = 0.25, safety: float = 1.25):
        check_int("group_size", group_size, 2)
        for name, value in (("train_groups", train_groups), ("sampling_groups", sampling_groups),
                            ("min_wave_groups", min_wave_groups)):
            check_int(name, value, 1, allow_none=True)
        low, high = p_bounds
        check_real("p_bounds[0]", low, 0.0, 1.0)
        check_real("p_bounds[1]", high, low, 1.0)
        check_real("p_initial", p_initial, low, high)
        for name, value in (("p_step", p_step), ("keep_floor", keep_floor), ("target_pure", target_pure)):
            check_real(name, value, 0.0, 1.0)
        check_real("safety", safety, 0.0, math.inf, open_low=True)
        self.group_size, self.train_groups = int(group_size), train_groups
        self.sampling_groups, self.min_wave_groups = sampling_groups, min_wave_groups
        self.p_initial, self.p_step, self.p_bounds = float(p_initial), float(p_step), (float(low), float(high))
        self.keep_floor, self.target_pure, self.safety = float(keep_floor), float(target_pure), float(safety)
        self.p_easy = self.p_hard = self.p_initial
        self.trained: tuple[int, ...] = ()  # candidates whose groups GRESO trains on, last step
        self.skipped: tuple[int, ...] = ()  # candidates skipped before the last step's first wave
        self.final = False  # the latest wave was marked the last one by the size estimate (est <= S)
        self._survivors: list[int] = []
        self._latest: list[int] = []

    def with_group_size(self, group_size: int) -> "GRESO":
        """The same arm at group size G (:class:`~trace_gym.allocation.allocators.GroupSized`)."""
        return type(self)(group_size, self.train_groups, self.sampling_groups, self.min_wave_groups, self.p_initial,
                          self.p_step, self.p_bounds, self.keep_floor, self.target_pure, self.safety)

    def sizes(self, view: StepView) -> tuple[int, int, int]:
        """``(B_train, S, min wave)`` for this step's budget."""
        b_train = self.train_groups or max(1, step_roots(view) // (2 * self.group_size))
        return (b_train, self.sampling_groups or math.ceil(1.5 * b_train),
                self.min_wave_groups or max(1, b_train // 4))

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        b_train, first, least = self.sizes(view)
        if view.wave == 0:
            skip = skip_probabilities(view.pure_streak, view.streak_kind, self.p_easy, self.p_hard, self.keep_floor)
            draws = rng.random(view.n)
            self.skipped = tuple(int(i) for i in np.flatnonzero(draws < skip))
            self._survivors = [int(i) for i in np.flatnonzero(draws >= skip)]
            self.final, size = False, first
        else:
            kept = int((mixed(view) & rolled_out(view)).sum())
            if kept >= b_train or self.final:
                return self._end(view, b_train)
            latest = np.asarray(self._latest)
            back = (all_pass(view) | all_fail(view) | mixed(view))[latest]
            zvr = float((all_pass(view) | all_fail(view))[latest].sum()) / max(1, int(back.sum()))
            est = int((b_train - kept) / max(1.0 - zvr, EPS) * self.safety)
            self.final = est <= first
            size = max(min(est, first), least)
        size = min(size, len(self._survivors), roots_left(view) // self.group_size)
        self._latest, self._survivors = self._survivors[:size], self._survivors[size:]
        wave = group_wave(self._latest, self.group_size)
        return wave if wave is not None else self._end(view, b_train)

    def _end(self, view: StepView, b_train: int) -> None:
        """The step is over: record what GRESO trains on, and adapt the exploration probabilities."""
        self.trained = tuple(int(i) for i in np.flatnonzero(mixed(view) & rolled_out(view))[:b_train])
        groups = int((all_pass(view) | all_fail(view) | mixed(view)).sum())
        if groups and (np.asarray(view.chosen) > 0).any():
            self.p_easy = self._moved(self.p_easy, all_pass(view).sum() / groups >= self.target_pure / 3)
            self.p_hard = self._moved(self.p_hard, all_fail(view).sum() / groups >= 2 * self.target_pure / 3)
        return None

    def _moved(self, p: float, too_many: bool) -> float:
        low, high = self.p_bounds
        return float(min(high, max(low, p - self.p_step if too_many else p + self.p_step)))
