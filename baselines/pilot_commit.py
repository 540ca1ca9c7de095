"""Pilot-Commit as a wave strategy: a few pilot rollouts per prompt, the rest only where the pilot is mixed.

Paper: Woojeong Kim, Ziyi Yang, Jing Nathan Yan, Jialu Liu, "Spend Your Rollouts Where It
Counts: Rollout Allocation for Group-Based RL Post-Training", arXiv:2605.26606 (rule as in
the authors' code, databricks/pilot-commit).

Rule, in waves:

1. each wave first *commits* up to B - (committed so far) prompts whose pilot passed and
   that are not yet committed, ``commit`` (n_c) more roots each, highest pilot standard
   deviation first (ties: the later pilot wave, then pool order; the code's "max variance"
   buffer order);
2. while committed prompts are still missing, it also *pilots* up to ``pilots_per_wave``
   (M) fresh prompts, ``pilot`` (n_p) roots each, in pool order, skipping prompts evicted
   in earlier steps; it pilots only as many as leave the budget for at least one more
   commit;
3. when a pilot is back with mean m: it passes when ``band[0] <= m <= band[1]`` (commit
   later); m below the band is deferred (a later step may pilot it again); and m >=
   ``solve`` evicts the prompt: it is never piloted again, from the next step on;
4. the step ends when B prompts are committed, nothing passed is left to commit and no
   pilot is affordable, or after ``max_waves`` waves.

A committed prompt's group is its n_p pilot roots plus its n_c commit roots (one tree).

Knobs and their scaling. The paper's scripts: n_p = 16, n_c = 48 (4B-14B; 32 + 96 at 1.5B),
B = 128, M = 3 B, pass band [0.125, 0.75], solve = 1.0, at most 10 waves, passed pilots
kept up to 4 steps. Defaults here: a committed group of G = 8 (the bench's ``group_size``
reaches it) split n_p = G/2 = 4, n_c = 4 (``pilot_share`` 0.5: with 8 rollouts the paper's
1 : 3 split leaves 2 pilots, which pass the band only at exactly 1 of 2; 4 pilots pass at
1 to 3 of 4), B = R // (3 n_p + n_c) for a step of R root rollouts and M = 3 B (the
paper's), so 3 B pilots and B commits fill the budget: at the bench's R = 32, B = 2, M = 6
(24 + 8 roots); at G = 4, n_p = n_c = 2, B = 4, M = 12.

Departures: the paper keeps passed pilots in a buffer across steps (up to 4) and commits
them later; a tree belongs to one step here, so a pilot that passed but was not committed
by the end of its step is dropped (its roots stay in the tree). The code pilots M fresh
prompts in every wave, also when the commits fill B (those feed its next step's buffer);
here a wave pilots only while commits are missing, and only as many as leave room for one
more commit. A step that runs out of waves short of B trains on what it committed (the code
raises an error); budget it cannot use stays unspent.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from baselines.flat_waves import MAX_REMEMBERED, check_int, check_real, remember, roots_left, step_roots
from trace_gym.allocation.waves import StepView, Wave


class PilotCommit:
    """Pilot-Commit (module docstring).

    Args:
        group_size: G = n_p + n_c, a committed prompt's roots (>= 2).
        pilot_share: n_p = max(1, round(G * pilot_share)) (0.5; the paper's 0.25), n_c = G - n_p >= 1.
        prompts: B, prompts committed per step (``None``: max(1, R // (3 n_p + n_c))).
        pilots_per_wave: M (``None``: 3 B).
        band: the pilot means that pass ((0.125, 0.75)).
        solve: a pilot mean that evicts its prompt (1.0).
        max_waves: most waves per step (10).
        capacity: the most evicted prompts remembered.
    """

    description = "Pilot-Commit: pilot rollouts per prompt, the rest of the group only where the pilot is mixed"
    predictor = "constant"  # reads no prediction

    def __init__(self, group_size: int = 8, pilot_share: float = 0.5, prompts: int | None = None,
                 pilots_per_wave: int | None = None, band: tuple[float, float] = (0.125, 0.75), solve: float = 1.0,
                 max_waves: int = 10, capacity: int = MAX_REMEMBERED):
        check_int("group_size", group_size, 2)
        check_real("pilot_share", pilot_share, 0.0, 1.0, open_low=True)
        check_int("prompts", prompts, 1, allow_none=True)
        check_int("pilots_per_wave", pilots_per_wave, 1, allow_none=True)
        check_real("band[0]", band[0], 0.0, 1.0)
        check_real("band[1]", band[1], band[0], 1.0)
        check_real("solve", solve, 0.0, 1.0)
        check_int("max_waves", max_waves, 1)
        check_int("capacity", capacity, 1)
        self.group_size, self.pilot_share = int(group_size), float(pilot_share)
        self.pilot = min(self.group_size - 1, max(1, round(self.group_size * self.pilot_share)))
        self.commit = self.group_size - self.pilot
        self.prompts, self.pilots_per_wave = prompts, pilots_per_wave
        self.band, self.solve, self.max_waves, self.capacity = (float(band[0]), float(band[1])), float(solve), \
            int(max_waves), int(capacity)
        self.evicted: OrderedDict[str, int] = OrderedDict()  # prompt id -> step evicted in
        self.committed: list[int] = []  # candidates committed this step, in order
        self._piloted: dict[int, int] = {}  # candidate -> wave it was piloted in

    def with_group_size(self, group_size: int) -> "PilotCommit":
        """The same arm at committed group size G (:class:`~trace_gym.allocation.allocators.GroupSized`)."""
        return type(self)(group_size, self.pilot_share, self.prompts, self.pilots_per_wave, self.band, self.solve,
                          self.max_waves, self.capacity)

    def sizes(self, view: StepView) -> tuple[int, int]:
        """``(B, M)`` for this step's budget."""
        b = self.prompts or max(1, step_roots(view) // (3 * self.pilot + self.commit))
        return b, self.pilots_per_wave or 3 * b

    def plan(self, view: StepView, rng: np.random.Generator) -> Wave | None:
        if view.wave == 0:
            self.committed, self._piloted = [], {}
        b, m = self.sizes(view)
        need = b - len(self.committed)
        if need <= 0 or view.wave >= self.max_waves:
            return self._end(view)
        commit = self._passed(view)[: min(need, roots_left(view) // self.commit)]
        left, need = roots_left(view) - self.commit * len(commit), need - len(commit)
        pilots: list[int] = []
        if need > 0:
            affordable = max(0, (left - self.commit) // self.pilot)  # room for a pilot's commit
            evicted = self.evicted
            fresh = (i for i in range(view.n) if i not in self._piloted and view.ids[i] not in evicted)
            pilots = [i for _, i in zip(range(min(m, affordable)), fresh)]
        if not commit and not pilots:
            return self._end(view)
        self.committed += commit
        self._piloted.update({i: view.wave for i in pilots})
        return Wave(roots={**{i: self.commit for i in commit}, **{i: self.pilot for i in pilots}})

    def _passed(self, view: StepView) -> list[int]:
        """Piloted, not yet committed candidates whose pilot mean lies in the band, in commit order."""
        out = []
        for i, wave in self._piloted.items():
            s, f = int(view.successes[i]), int(view.failures[i])
            if i in self.committed or s + f == 0 or not self.band[0] <= s / (s + f) <= self.band[1]:
                continue
            mean = s / (s + f)
            out.append((-np.sqrt(mean * (1 - mean)), -wave, i))
        return [i for _, _, i in sorted(out)]

    def _end(self, view: StepView) -> None:
        """The step is over: evict the prompts whose pilot solved them (effective from the next step)."""
        for i in self._piloted:
            s, f = int(view.successes[i]), int(view.failures[i])
            if i not in self.committed and s + f and s / (s + f) >= self.solve:
                remember(self.evicted, view.ids[i], view.step, self.capacity)
        return None
