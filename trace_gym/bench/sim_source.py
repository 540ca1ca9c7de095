"""``trace-gym bench --sim``: the simulator as a :class:`~trace_gym.bench.loop.BenchSource`.

Each repetition (seed) draws a task pool from the calibrated world and one candidate
pool per step; every arm runs the one step driver with a
:class:`~trace_gym.sim.simulator.SimBranchRunner` over them. Besides the shared metrics, a row
holds the prompt-level Spearman of the predictor against the true success p and, on
every visited prefix (scored before the predictor trains on it), against the true
value V_t, overall and by depth. The results add the root-allocation demo and the
predictor-target study (recursive mean vs fresh continuations, oracle-driven).
"""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from trace_gym.allocation.allocators import solve_root
from trace_gym.bench.loop import Arm, arms_with_oracle
from trace_gym.bench.config import SimBenchConfig
from trace_gym.step.driver import run_step
from trace_gym.predictor.kinds import make_predictor
from trace_gym.allocation.strategy import Strategy
from trace_gym.bench.sim_fit import RecordedShape


def sim_world(cfg: SimBenchConfig) -> Any:
    """The simulated world of ``cfg``, its task feature noise calibrated to ``feature_spearman``."""
    from trace_gym.sim import simulator as sim
    from trace_gym.sim.predictors import noise_for_spearman
    from trace_gym.sim.prior import TYPE_KEYS

    base = dict(target_mixed=cfg.target_mixed, mean_success=cfg.mean_success, group_size=cfg.group_size,
                step_concentration=cfg.step_concentration, min_turns=cfg.min_turns, max_turns=cfg.max_turns,
                turn_shares=tuple(cfg.turn_shares), success_turn_shares=tuple(cfg.success_turn_shares),
                success_turn_tilt=cfg.success_turn_tilt,
                type_visibility=cfg.type_visibility, signal_noise=cfg.signal_noise,
                prefix_sees_turn=cfg.prefix_sees_turn, prompts_alike=cfg.prompts_alike,
                **{k: tuple(getattr(cfg, k)) for k in TYPE_KEYS})
    prior = sim.SimWorld(**base).difficulty()
    return sim.SimWorld(**base, feature_noise=noise_for_spearman(cfg.feature_spearman, prior))


def sim_task(state: Any) -> int:
    """The key of a simulated prompt: its task index (a per-prompt predictor's ``key_of``)."""
    return int(state.task)


@dataclass
class SimRepetition:
    """One seed: a task pool, its held-out warm-up tasks (the first ``warmup_prompts``: the pool is
    drawn i.i.d.), the candidate draws of every step (from the other tasks), and the warm predictor
    of each kind (built once, copied to every arm)."""

    cfg: SimBenchConfig
    world: Any
    seed: int
    source: Any = None  # the SimSource: its recorded shape, and where the warm-up's numbers go

    def __post_init__(self) -> None:
        from trace_gym.sim import simulator as sim

        self.label = f"seed {self.seed}"
        self.pool = sim.make_pool(self.world, self.cfg.pool_size, np.random.default_rng([self.seed, 0]))
        held = warmup_count(self.cfg)
        self.draws = [held + np.random.default_rng([self.seed, 1, step]).choice(self.cfg.pool_size - held,
                                                                                 self.cfg.candidates, replace=False)
                      for step in range(self.cfg.steps)]
        self._templates: dict[str, Any] = {}
        self._batches: list | None = None
        self.common: dict[str, Any] = {}  # with common_draws: each arm's place in the common streams

    def candidates(self, step: int) -> list[int]:
        return self.draws[step].tolist()

    def predictor(self, arm: Arm) -> Any:
        import inspect

        from trace_gym.predictor.kinds import PREDICTORS

        if self.cfg.common_draws:  # every arm draws the same branches for the same requests (as a bank's)
            from trace_gym.sim.draws import CommonDraws

            self.common[arm.name] = CommonDraws(self.seed)
        if arm.predictor in self._templates:
            return copy.deepcopy(self._templates[arm.predictor])  # each arm gets a pristine copy
        # the user's predictor_kwargs configure the configured kind; an arm's own kind (the oracle
        # upper bound, a strategy's predictor) is built as declared
        kwargs = dict(self.cfg.predictor_kwargs) if arm.predictor == self.cfg.predictor else {}
        if arm.predictor == self.cfg.predictor and self.cfg.predictor_level_shift:
            kwargs["level_shift"] = self.cfg.predictor_level_shift
        takes = inspect.signature(PREDICTORS[arm.predictor].factory()).parameters
        if "key_of" in takes:  # a per-prompt kind (an arm's own: MoPPS's posterior, Knapsack's rates): by task
            kwargs["key_of"] = sim_task
        if self.world.prefix_sees_turn and "turn_slots" in takes:
            kwargs["turn_slots"] = self.world.max_turns - 1  # a prefix's turns: 1 .. max_turns - 1
        template = make_predictor(arm.predictor, kwargs, features=self.pool.features, world=self.world,
                                  spearman=self.cfg.noisy_spearman, seed=self.seed)
        if warmup_count(self.cfg):  # as bench --bank: held-out tasks' full trees, before step 0, charged to no arm
            from trace_gym.banks.warmup import learn_from_batches
            from trace_gym.bench.sim_fit import warmup_batches

            if self._batches is None:
                shape = self.source.recorded_shape if self.source is not None else RecordedShape()
                self._batches = warmup_batches(self.pool, self.world, range(warmup_count(self.cfg)), shape, self.seed)
            stats = learn_from_batches(template, self._batches, self.cfg.prefix_share)
            if arm.predictor == self.cfg.predictor and self.source is not None and not self.source.warmups:
                self.source.warmups.append(stats)
        self._templates[arm.predictor] = template
        return copy.deepcopy(template)

    def rng(self, arm: Arm) -> np.random.Generator:
        return np.random.default_rng([self.seed, 2, zlib.crc32(arm.name.encode())])

    def step(self, arm: Arm, candidates: Sequence[int], predictor: Any, budget: float,
             rng: np.random.Generator, *, measured: bool, play: Any) -> Any:
        from trace_gym.predictor.quality import mixed_probability
        from trace_gym.sim.simulator import SimBranchRunner

        runner = SimBranchRunner(self.pool, self.world, rng, self.cfg.prefixes_per_root or None,
                                 self.common.get(arm.name))
        result = run_step(candidates, play.strategy, predictor, runner, budget, rng, prefix_share=self.cfg.prefix_share,
                          score_prefixes=measured, mixed_rule=self.cfg.mixed(), **play.kwargs())
        rates = self.pool.success[np.asarray(candidates, dtype=np.int64)]
        result.extras["truth"] = (rates, mixed_probability(rates, self.cfg.group_size))
        return result

    def measure(self, arm: Arm, steps: Sequence[Any]) -> dict[str, Any]:
        """The prefix predictor's Spearman over the arm's scored prefixes, against their true values
        (``prefix_spearman_true``) and, as the headline ``prefix_spearman``, against what the bench it stands
        for reads: without ``calibrate_from`` the true values; with it, as the bank bench scores a prefix, the
        success rate of K fresh continuations (K: the bank's continuations per recorded prefix), drawn from
        the arm's own stream (the true value would credit the simulated predictor with a precision no
        bank's truth has)."""
        from trace_gym import report

        prefix = [(s.learning.prefix_predictions, [c for c, d in zip(s.learning.contexts, s.learning.depths) if d > 0])
                  for s in steps]
        pp = np.concatenate([p for p, _ in prefix])
        values = np.array([c.value for _, ctx in prefix for c in ctx], dtype=float)
        pd = np.array([c.turn for _, ctx in prefix for c in ctx], dtype=int)
        pt = values
        if self.cfg.calibrate_from and self.source is not None:
            k = self.source.recorded_shape.continuations
            pt = np.random.default_rng([self.seed, 4, zlib.crc32(arm.name.encode())]).binomial(k, values) / k
        return {"prefix_spearman": report.spearman(pp, pt), "prefix_spearman_true": report.spearman(pp, values),
                "prefix_spearman_within": report.spearman_within(pp, pt, pd),
                "prefix_spearman_by_depth": {str(d): r for d, r in report.spearman_by_depth(pp, pt, pd).items()}}

    def after_arm(self, arm: Arm, steps: Sequence[Any]) -> None:
        pass

    def arm_state(self, arm: Arm) -> Any:
        return self.common.get(arm.name)  # with common_draws, its place in the common streams; else None

    def set_arm_state(self, arm: Arm, state: Any) -> None:
        if state is not None:
            self.common[arm.name] = state


@dataclass
class SimSource:
    """The simulator as a bench source (see the module docstring).

    Attributes:
        config: the bench config.
        recorded_shape: how each warm-up task is grown (a bank's R, K and prefix cap; with
            ``calibrate_from``, that bank's).
    """

    config: SimBenchConfig
    recorded_shape: RecordedShape = RecordedShape()
    mode: str = "sim"

    def __post_init__(self) -> None:
        self.warmups: list[dict[str, Any]] = []
        cfg = self.config
        self.world = sim_world(cfg)
        self.repetitions, self.steps, self.warmup_steps = cfg.seeds, cfg.steps, cfg.warmup_steps
        self.budget_unit, self.nominal_budget = cfg.budget_unit, cfg.nominal_budget

    def arms(self, strategies: Mapping[str, Strategy]) -> dict[str, Arm]:
        cfg = self.config
        return arms_with_oracle(strategies, cfg.predictor, "oracle" if cfg.oracle_upper_bound else None)

    def repetition(self, rep: int) -> SimRepetition:
        return SimRepetition(self.config, self.world, rep, self)

    def warmup_summary(self) -> dict[str, Any]:
        """What every learned predictor saw before its first measured step, and one line saying it."""
        cfg, held = self.config, warmup_count(self.config)
        steps = (f"the first {cfg.warmup_steps} step(s) of every arm are run (the predictor trains on them) but not "
                 "measured") if cfg.warmup_steps else ""
        if not held:
            text = "every learned predictor starts cold" + (f"; {steps}" if steps else " at step 0")
            return {"prompts": 0, "steps": cfg.warmup_steps, "description": text}
        w = self.warmups[0] if self.warmups else {}
        text = (f"every learned predictor first trained on {held} held-out simulated tasks grown as a bank records a "
                f"prompt ({self.recorded_shape.describe()}"
                + (f": {w['roots']} roots, {w['continuations']} continuations; {w['updates']} updates" if w else "")
                + "), as bench --bank warms up; the same warm predictor for every arm, charged to no arm"
                + (f"; then {steps}" if steps else ""))
        return {**w, "prompts": held, "steps": cfg.warmup_steps, "description": text}

    def results(self, strategies: Mapping[str, Strategy]) -> dict[str, Any]:
        from trace_gym.sim.targets import target_error_study

        cfg = self.config
        out: dict[str, Any] = {"root_allocation_demo": {
            "values": list(cfg.demo_values), "budgets": list(cfg.demo_budgets),
            "allocations": [solve_root(np.array(cfg.demo_values), b).tolist() for b in cfg.demo_budgets]},
            "warmup": self.warmup_summary()}
        if "trace" in strategies:  # which predictor target is closer to the true V (oracle-driven expansion)
            out["target_estimators"] = target_error_study(
                strategies["trace"], make_predictor("oracle"), world=self.world, nominal_budget=self.nominal_budget,
                candidates=cfg.candidates)
        return out


def warmup_count(cfg: SimBenchConfig) -> int:
    """The held-out warm-up tasks of ``cfg``: ``warmup_prompts``, 0 when unset."""
    return cfg.warmup_prompts or 0
