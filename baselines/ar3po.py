"""AR3PO's adaptive rollout as a wave strategy: rounds of k roots per prompt until each has a success.

Paper: Yuheng Zhang, Wenlin Yao, Changlong Yu, Yao Liu, Qingyu Yin, Bing Yin, Hyokun Yun,
Lihong Li, "Improving Sampling Efficiency in RLVR through Adaptive Rollout and Response
Reuse", arXiv:2509.25808. No code was found and only the abstract and summaries could be
read: the round size, the number of rounds and how prompts are chosen are this project's
reconstruction, stated as such.

Rule (reconstruction): take the first B prompts of the pool (how AR3PO picks its batch is
not described; the pool is already a random draw). Round r (one wave) gives ``k`` roots to
every prompt still active; a prompt stays active while none of its roots succeeded, for at
most ``rounds`` (S_max) rounds; a prompt whose first round is all successes stops too
(a pure, cheap group: AR3PO does not try to fix that case).

Response reuse: AR3PO adds a correct response stored from an earlier step to the group of a
prompt that ended without one. A stored response cannot be replayed from a rollout bank or
added to a tree here, so reuse is not performed: :attr:`AR3PO.would_reuse` names the
prompts of the last step that ended all-failed while the run had seen them succeed before
(the run's history: the groups AR3PO would make mixed at no rollout cost).

Knobs and their scaling. Not recoverable from the sources read; the one figure reported is
about 5.7 sampled responses per prompt late in training (4.2 times fewer than DAPO).
Defaults here: k = 2, S_max = 4 (at most 8 = G, GRPO's usual group; the bench's
``group_size`` G sets S_max = G // k), B = R // (k S_max) for a step of R root rollouts,
so a batch that never succeeds still fits the budget: at the bench's R = 32, B = 4.

Departures: response reuse (above); a step spends less than its budget whenever prompts stop
early, which is the method's saving; the rest stays unspent.
"""

from __future__ import annotations

import numpy as np

from baselines.flat_waves import check_int, group_wave, roots_left, step_roots
from trace_gym.allocation.waves import StepView, Wave


class AR3PO:
    """AR3PO adaptive rollout (module docstring): k roots per round until a success, at most S_max rounds.

    Args:
        responses_per_round: k (>= 1; 2).
        rounds: S_max (>= 1; 4).
        prompts: B per step (``None``: R // (k S_max)).
    """

    description = "AR3PO (reconstructed): rounds of k roots per prompt until one succeeds, at most S_max rounds"
    predictor = "constant"  # reads no prediction

    def __init__(self, responses_per_round: int = 2, rounds: int = 4, prompts: int | None = None):
        check_int("responses_per_round", responses_per_round, 1)
        check_int("rounds", rounds, 1)
        check_int("prompts", prompts, 1, allow_none=True)
        self.responses_per_round, self.rounds, self.prompts = int(responses_per_round), int(rounds), prompts
        self.would_reuse: tuple[int, ...] = ()
        self._active: list[int] = []

    @property
    def group_size(self) -> int:
        """The most roots a prompt can get in a step: k S_max."""
        return self.responses_per_round * self.rounds

    def with_group_size(self, group_size: int) -> "AR3PO":
        """The same arm with S_max = max(1, G // k) (:class:`~trace_gym.allocation.allocators.GroupSized`)."""
        return type(self)(self.responses_per_round, max(1, int(group_size) // self.responses_per_round), self.prompts)

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        k = self.responses_per_round
        if view.wave == 0:
            self._active = list(range(min(self.prompts or step_roots(view) // self.group_size, view.n)))
        else:
            self._active = [i for i in self._active if view.successes[i] == 0]
        if view.wave >= self.rounds or not self._active:
            return self._end(view)
        self._active = self._active[: roots_left(view) // k]
        wave = group_wave(self._active, k)
        return wave if wave is not None else self._end(view)

    def _end(self, view: StepView) -> None:
        failed = (np.asarray(view.roots) > 0) & (np.asarray(view.successes) == 0)
        self.would_reuse = tuple(int(i) for i in np.flatnonzero(failed & (np.asarray(view.past_successes) > 0)))
        return None
