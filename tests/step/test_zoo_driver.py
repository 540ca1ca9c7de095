"""The zoo's arms through the one step driver on the simulator: within budget, spending it
(or stopping for the method's own reason), deterministic for a given rng, and through the
strategy boundary for several steps with the run's history."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from baselines.predictors import BetaPosteriorPredictor, RunningRatePredictor
from trace_gym.sim import simulator as sim
from trace_gym.step.driver import run_step
from trace_gym.predictor.kinds import ConstantPredictor
from trace_gym.strategies import STRATEGIES
from trace_gym.step.strategy_boundary import StrategyBoundary
from trace_gym.allocation.waves import HistoryBook, is_wave_strategy

WORLD = sim.SimWorld()
ZOO = ["dapo", "greso", "mopps", "knapsack", "pilot_commit", "ar3po", "cero"]
#: The bench's scale: nominal 32 (64 units, 32 roots) over a pool of 64 candidates.
BUDGET, POOL = 32, 64


def task_of(state: sim.SimState) -> int:
    """The simulator's prompt key (its states carry a task index, not a prompt text)."""
    return state.task


def predictor_for(arm) -> object:
    """The arm's own predictor kind, keyed for the simulator."""
    return {"constant": ConstantPredictor, "beta_posterior": lambda: BetaPosteriorPredictor(key_of=task_of),
            "running_rate": lambda: RunningRatePredictor(key_of=task_of)}[arm.predictor]()


def run(name: str, steps: int, seed: int = 0, boundary: bool = False):
    """``steps`` steps of arm ``name`` over one candidate pool (so history matters); the arm
    as it was after each step, the steps' results and the final history."""
    arm, pool = copy.deepcopy(STRATEGIES[name]), sim.make_pool(WORLD, 200, np.random.default_rng(seed))
    runner, predictor, history = sim.SimBranchRunner(pool, WORLD, np.random.default_rng(seed + 1)), \
        predictor_for(arm), HistoryBook()
    rng, arms, out = np.random.default_rng(seed + 2), [], []
    for step in range(steps):
        out.append(run_step(list(range(POOL)), arm, predictor, runner, BUDGET, rng, history=history,
                            step_index=step, boundary=StrategyBoundary(name) if boundary else None))
        arms.append(copy.deepcopy(arm))
    return arms, out, history


def spent_units(step) -> int:
    return 2 * int(step.root_counts.sum())


@pytest.mark.parametrize("name", ZOO)
def test_each_arm_stays_within_budget_and_is_deterministic(name):
    arms, steps, _ = run(name, 3)
    again = run(name, 3)[1]
    assert is_wave_strategy(arms[0])
    for a, b in zip(steps, again):
        assert spent_units(a) <= 2 * BUDGET and a.ledger.nominal <= BUDGET
        assert a.ledger.continuations == 0  # flat: no method here branches from a prefix
        assert a.root_counts.max() <= 16  # a deep bank holds 32 roots per prompt
        assert np.array_equal(a.root_counts, b.root_counts)
        assert [t.root_outcomes() for t in a.trees] == [t.root_outcomes() for t in b.trees]


def test_arms_that_buy_one_wave_spend_the_whole_budget():
    for name in ("mopps", "knapsack"):
        for step in run(name, 3)[1]:
            assert spent_units(step) == 2 * BUDGET and step.waves == 1, name


def test_arms_that_stop_early_say_why():
    for arm, step in zip(*run("dapo", 4)[:2]):  # the budget is spent, or B_train = 1 group is mixed
        assert spent_units(step) == 2 * BUDGET or len(arm.trained) == 1
    for arm, step in zip(*run("greso", 4)[:2]):  # or its wave-size estimate marked the last wave final
        assert spent_units(step) == 2 * BUDGET or len(arm.trained) == 2 or arm.final
    for step in run("ar3po", 4)[1]:  # each of B = 4 prompts stopped on a success or after 4 rounds of 2
        assert len(step.trees) == 4
        for tree in step.trees:
            s, t = tree.root_outcomes()
            assert t % 2 == 0 and t <= 8 and (s > 0 or t == 8)
    for arm, step in zip(*run("pilot_commit", 4)[:2]):  # B = 2 committed, or no room for a pilot and its commit
        groups = sorted(int(x) for x in step.root_counts if x)
        assert groups.count(8) == len(arm.committed) <= 2 and set(groups) <= {4, 8}
        assert spent_units(step) == 2 * BUDGET or len(arm.committed) == 2 or 2 * BUDGET - spent_units(step) < 16


@pytest.mark.parametrize("name", ZOO)
def test_every_arm_crosses_the_boundary_for_several_steps_with_history(name):
    arms, steps, history = run(name, 5, seed=3, boundary=True)
    arm = arms[-1]
    assert len(history.entries) > 0
    assert all(spent_units(s) <= 2 * BUDGET for s in steps)
    seen = {"greso": lambda: arm.p_easy != 0.5 or arm.p_hard != 0.5,
            "knapsack": lambda: any(len(set(s.root_counts[s.root_counts > 0].tolist())) > 1 for s in steps[1:]),
            "pilot_commit": lambda: len(arm.evicted) > 0,
            "cero": lambda: len(set(arm.theta.values())) > 1,
            "mopps": lambda: len({tuple(np.flatnonzero(s.root_counts)) for s in steps}) > 1}
    if name in seen:
        assert seen[name](), f"{name} never acted on what earlier steps returned"


def test_the_cli_knows_the_zoos_predictor_kinds_in_a_fresh_process():
    """The face registers them (trace_gym/strategies.py); the CLI imports it before it reads a config."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "trace_gym.cli", "predictors"], cwd=root, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "beta_posterior" in out.stdout and "running_rate" in out.stdout
