"""DAPO's dynamic sampling as a wave strategy: whole groups on fresh prompts until enough are mixed.

Paper: Qiying Yu et al. (ByteDance Seed, Tsinghua AIR, HKU), "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale", arXiv:2503.14476 (rule as in verl's DAPO recipe).

Rule, per step (no predictor, nothing kept across steps):

1. a wave gives G roots to each of the next ``generation_groups`` (B_gen) prompts of the
   pool not yet used this step, in pool order (DAPO scores nothing: its dataloader order),
   as many whole groups as the budget left still buys;
2. when its groups are back, the mixed ones (0 < successes < G: reward std > 0, the
   recipe's filter) join the kept list, in generation order;
3. repeat until ``train_groups`` (B_train) groups are kept, the pool or the budget runs out,
   or ``max_waves`` waves ran; DAPO then trains on the first B_train kept groups
   (:attr:`DAPODynamicSampling.trained`).

Knobs and their scaling. The recipe (Qwen2.5-32B): G = 16, B_train = 512 prompts,
B_gen = 3 x 512, ``max_num_gen_batches`` = 10; the same recipe at B_train = 256, G = 8 is the
MoPPS and Pilot-Commit papers' baseline. Defaults here: G = 8 (the bench's ``group_size``
reaches it), B_gen = 3 B_train (the recipe's ratio) and B_train = max(1, R // (4 G)) for a
step of R root rollouts, so the first wave spends 3/4 of the budget and the last quarter
refills: at the bench's R = 32 (nominal budget 32), G = 8 gives B_train = 1, B_gen = 3
(24 roots, then one more group); G = 4 gives B_train = 2, B_gen = 6 (24 roots, then two).

Departures from the paper: the budget per step is fixed here, so a wave takes only whole
groups the budget still buys, and a step that runs out (or hits ``max_waves``) short of
B_train trains on what it kept (verl raises an error). The budget a step leaves when it
has its groups early stays unspent (DAPO's saving). DAPO drops the surplus mixed groups of
its last wave and every pure group from the training batch; here every paid rollout stays
in the step's trees (:attr:`trained` says which groups DAPO would train on).
"""

from __future__ import annotations

import numpy as np

from baselines.flat_waves import check_int, group_wave, mixed, rolled_out, roots_left, step_roots
from trace_gym.allocation.waves import StepView, Wave


class DAPODynamicSampling:
    """DAPO dynamic sampling (module docstring): refill waves of G-groups until B_train are mixed.

    Args:
        group_size: G, roots per prompt (>= 2).
        train_groups: B_train, mixed groups to collect (``None``: max(1, R // (4 G))).
        generation_groups: B_gen, prompts per wave (``None``: 3 B_train).
        max_waves: most waves per step (the recipe's ``max_num_gen_batches``: 10).
    """

    description = "DAPO dynamic sampling: refill waves of G-groups on fresh prompts until B_train groups are mixed"
    predictor = "constant"  # reads no prediction

    def __init__(self, group_size: int = 8, train_groups: int | None = None, generation_groups: int | None = None,
                 max_waves: int = 10):
        check_int("group_size", group_size, 2)
        check_int("train_groups", train_groups, 1, allow_none=True)
        check_int("generation_groups", generation_groups, 1, allow_none=True)
        check_int("max_waves", max_waves, 1)
        self.group_size, self.train_groups, self.generation_groups = int(group_size), train_groups, generation_groups
        self.max_waves = int(max_waves)
        self.trained: tuple[int, ...] = ()  # candidates whose groups DAPO trains on, last step

    def with_group_size(self, group_size: int) -> "DAPODynamicSampling":
        """The same arm at group size G (:class:`~trace_gym.allocation.allocators.GroupSized`)."""
        return type(self)(group_size, self.train_groups, self.generation_groups, self.max_waves)

    def sizes(self, view: StepView) -> tuple[int, int]:
        """``(B_train, B_gen)`` for this step's budget."""
        b_train = self.train_groups or max(1, step_roots(view) // (4 * self.group_size))
        return b_train, self.generation_groups or 3 * b_train

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        b_train, b_gen = self.sizes(view)
        kept = np.flatnonzero(mixed(view) & rolled_out(view))  # pool order = generation order
        self.trained = tuple(int(i) for i in kept[:b_train])
        if len(kept) >= b_train or view.wave >= self.max_waves:
            return None
        fresh = np.flatnonzero(~rolled_out(view))[:b_gen]
        return group_wave(fresh[: roots_left(view) // self.group_size], self.group_size)
