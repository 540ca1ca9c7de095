"""MoPPS as a wave strategy: Thompson-sample each prompt's Beta posterior, keep those nearest 0.5.

Paper: Yun Qu, Qi (Cheems) Wang, Yixiu Mao, Vincent Tao Hu, Xiangyang Ji (Björn Ommer in
later versions), "Can Prompt Difficulty be Online Predicted for Accelerating RL Finetuning
of Reasoning Models?", arXiv:2507.04632 (Model Predictive Prompt Selection; rule as in
the authors' code, thu-rllab/MoPPS).

Rule, one wave per step: draw gamma_i ~ Beta(alpha_i, beta_i) for every candidate (one
draw each, in pool order, from the step's rng), give G roots to each of the B candidates
with the smallest (gamma_i - target)^2 (MoPPS' "topk"; ties in pool order), and stop. The
posterior is the predictor's (``view.alpha`` / ``view.beta``): the arm's own predictor,
:class:`~baselines.predictors.BetaPosteriorPredictor` (kind ``beta_posterior``), keeps
MoPPS' decayed Beta per prompt and updates it with the step's root outcomes. Under a
predictor that keeps no posterior the arm reads Beta(1 + past successes, 1 + past
failures) from the run's history (the same posterior with decay 1).

Knobs and their scaling. The paper's scripts: target 0.5, prior Beta(1, 1), G = 8,
B = 256 prompts from a candidate set 8 or 16 times larger (``ts_ratio``), decay 1.0 (MATH)
or 0.5 (Countdown, Geometry3k), no dynamic-sampling filter. Defaults here: G = 8 (the
bench's ``group_size`` reaches it) and B = R // G for a step of R root rollouts, so the
whole budget buys one group each: at the bench's R = 32 on a 64-prompt pool, B = 4
(candidate ratio 16, as the MATH scripts) or, at G = 4, B = 8 (ratio 8). The decay is the
predictor's knob (default 1.0).

Departures: none in the rule; the candidate pool is the bench's (its size sets the ratio).
"""

from __future__ import annotations

import numpy as np

from baselines.flat_waves import check_int, check_real, group_wave, history_posterior, roots_left, step_roots
from trace_gym.allocation.waves import StepView, Wave


def closest_to_target(samples: np.ndarray, count: int, target: float = 0.5) -> np.ndarray:
    """The ``count`` indices whose ``samples`` lie nearest ``target`` (squared distance; ties
    in index order), in that order."""
    order = np.argsort((np.asarray(samples, dtype=float) - target) ** 2, kind="stable")
    return order[: max(0, count)]


class MoPPS:
    """MoPPS (module docstring): B Thompson samples nearest 0.5, G roots each, one wave.

    Args:
        group_size: G (>= 2).
        prompts: B per step (``None``: R // G).
        target: gamma*, the success rate sought (0.5).
    """

    description = "MoPPS: Thompson samples of each prompt's Beta posterior, the B nearest 0.5 get G each"
    predictor = "beta_posterior"

    def __init__(self, group_size: int = 8, prompts: int | None = None, target: float = 0.5):
        check_int("group_size", group_size, 2)
        check_int("prompts", prompts, 1, allow_none=True)
        check_real("target", target, 0.0, 1.0)
        self.group_size, self.prompts, self.target = int(group_size), prompts, float(target)

    def with_group_size(self, group_size: int) -> "MoPPS":
        """The same arm at group size G (:class:`~trace_gym.allocation.allocators.GroupSized`)."""
        return type(self)(group_size, self.prompts, self.target)

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        if view.wave > 0:
            return None
        alpha, beta = history_posterior(view)
        samples = rng.beta(alpha, beta) if view.n else np.zeros(0)
        count = min(self.prompts or step_roots(view) // self.group_size, roots_left(view) // self.group_size)
        return group_wave(closest_to_target(samples, count, self.target), self.group_size)
