"""Which predictor target is closer to the true value, on the simulator (``target_error_study``).

The recursive mean and the fresh-continuation mean (:data:`trace_gym.tree.TARGET_ESTIMATORS`) differ
at the prefixes a strategy expanded; the simulator knows every node's true value V, so each
estimator's error can be measured there (docs/strategies.md, "Predictor targets").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trace_gym.allocation.strategy import Strategy
from trace_gym.predictor.kinds import SuccessPredictor
from trace_gym.sim.simulator import SimBranchRunner, SimWorld, make_pool
from trace_gym.step.driver import run_step
from trace_gym.tree import ROOT, TARGET_ESTIMATORS, RolloutTree


def _expanded_nodes(tree: RolloutTree) -> dict[int, float]:
    """Expanded node id -> the observed reward of the root rollout whose prefix it is."""
    out: dict[int, float] = {}
    for b in tree.branches:
        if b.is_continuation and b.anchor not in out:
            trigger_leaf = tree.branch_leaf(tree.nodes[b.anchor].branch)
            out[b.anchor] = float(tree.nodes[trigger_leaf].reward)
    return out


def target_error_study(
    strategy: Strategy,
    predictor: SuccessPredictor,
    world: SimWorld = SimWorld(),
    *,
    pool_size: int = 2000,
    candidates: int = 256,
    nominal_budget: float = 512,
    steps: int = 3,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Which predictor target is closer to the true V: recursive mean or fresh continuations.

    Runs ``steps`` simulated steps of ``strategy`` driven by ``predictor`` (the caller's;
    with the oracle, expansion follows the method exactly) and compares each estimator's target with
    the true value V (``SimState.value``) of the same node, in three groups: ``prompt``
    (depth 0), ``prefix`` (every inner node at depth >= 1) and ``expanded`` (the
    prefixes that received continuations, where the two estimators differ most).

    Returns ``{group: {estimator: {"n", "bias", "rmse", "bias_toward_observed"},
    "lower_error": estimator}}``: ``bias`` is the mean of target - V, ``rmse`` its root
    mean square, ``bias_toward_observed`` (expanded group only) the mean of
    (target - V) signed toward the outcome that triggered the expansion (> 0: the
    target leans toward the observed outcome), and ``lower_error`` the estimator with
    the lower rmse.
    """
    rng = np.random.default_rng([seed, 9])
    pool = make_pool(world, pool_size, rng)
    errors: dict[str, dict[str, list[float]]] = {g: {e: [] for e in TARGET_ESTIMATORS}
                                                 for g in ("prompt", "prefix", "expanded")}
    toward: dict[str, list[float]] = {e: [] for e in TARGET_ESTIMATORS}
    for _ in range(steps):
        cands = rng.choice(len(pool), size=min(candidates, len(pool)), replace=False)
        step = run_step(cands.tolist(), strategy, predictor, SimBranchRunner(pool, world, rng), nominal_budget, rng,
                        learn=False)
        for tree in step.trees:
            expanded = _expanded_nodes(tree)
            for est in TARGET_ESTIMATORS:
                for node_id, target in tree.targets(est).items():
                    node = tree.nodes[node_id]
                    if node.terminal:
                        continue
                    err = target - node.snapshot.value
                    errors["prompt" if node_id == ROOT else "prefix"][est].append(err)
                    if node_id in expanded:
                        errors["expanded"][est].append(err)
                        toward[est].append(err if expanded[node_id] >= 0.5 else -err)
    out: dict[str, dict[str, Any]] = {}
    for group, by_est in errors.items():
        row: dict[str, Any] = {}
        for est, errs in by_est.items():
            e = np.asarray(errs, dtype=float)
            row[est] = {"n": int(e.size), "bias": float(e.mean()) if e.size else float("nan"),
                        "rmse": float(np.sqrt(np.mean(e**2))) if e.size else float("nan")}
            if group == "expanded":
                row[est]["bias_toward_observed"] = float(np.mean(toward[est])) if toward[est] else float("nan")
        row["lower_error"] = min(TARGET_ESTIMATORS, key=lambda est: row[est]["rmse"])
        out[group] = row
    return out
