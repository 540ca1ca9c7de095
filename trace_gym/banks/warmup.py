"""The bank bench's predictor warm-up: recorded outcomes of held-out prompts, before step 0.

A predictor that starts a bench cold predicts 0.5 for every prompt, and a bench that
measures its first steps measures that cold start, not the strategy (training runs
hundreds of steps on a predictor that has seen every one of them). So every
predictor-driven arm of ``bench --bank`` starts from the same predictor, trained on a
documented slice of the bank that no measured pool ever draws from:

- :func:`held_out_prompts`: ``warmup_prompts`` prompt indices, a permutation seeded by
  the bench's ``seed`` alone (the same slice for every repetition and every arm);
- :func:`warm_up`: their recorded rollouts replayed as full trees (every recorded root,
  every recorded continuation of every recorded prefix), fed through the step's own
  learning half (:func:`trace_gym.step.learning.update_predictor`: the same targets, the same
  prefix share, each prompt's root outcomes as its evidence) in batches of ``batch``
  prompts, one predictor update per batch, as if they were earlier training steps. The
  samples are the prompts and the prefixes of their root rollouts (targets: recursive
  means over every recorded continuation below them); nodes inside continuations give
  no sample of their own, which keeps the warm-up to about one embedded history per
  recorded prefix (on the guessing-game bank 1,600 instead of 5,200).

The warm-up is charged to no arm: it is the history a predictor brings to a step.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from trace_gym.banks.format import Bank
from trace_gym.banks.replay import BankBranchRunner, BankDraws
from trace_gym.budget import BudgetLedger
from trace_gym.step.driver import StepResult
from trace_gym.step.learning import update_predictor

#: Held-out prompts per predictor update of the warm-up (about one bench step's trees).
WARMUP_BATCH = 16


def held_out_prompts(n_prompts: int, count: int, seed: int) -> list[int]:
    """The warm-up slice: ``count`` of ``n_prompts`` prompt indices, seeded by ``seed``, sorted.

    Raises:
        ValueError: ``count`` is negative or leaves no prompt to measure.
    """
    if not 0 <= count < n_prompts:
        raise ValueError(f"warmup_prompts must lie in [0, {n_prompts}) for a bank of {n_prompts} prompts, "
                         f"got {count!r}")
    return sorted(np.random.default_rng([seed, 3]).permutation(n_prompts)[:count].tolist())


def full_trees(bank: Bank, indices: Sequence[int], seed: int) -> tuple[BankBranchRunner, StepResult]:
    """Every recorded rollout of the prompts ``indices`` as one step's trees (keys 0..n-1)."""
    runner, ledger = BankBranchRunner(BankDraws(seed)), BudgetLedger()
    trees = []
    for key, index in enumerate(indices):
        record = bank.prompt(index)
        tree = runner.new_tree(key, record)
        runner.start_roots(key, len(record.roots), ledger)
        for node_id, _ in tree.expansion_candidates():
            where = tree.nodes[node_id].info["bank"]
            prefix = record.prefix(where["root"], tree.nodes[node_id].depth)
            if prefix and prefix["continuations"]:
                runner.start_continuations(key, node_id, len(prefix["continuations"]), ledger)
        trees.append(tree)
    runner.advance(ledger)
    n = len(indices)
    step = StepResult(np.full(n, 0.5), np.zeros(n, np.int64), np.zeros(n, np.int64), trees,
                      np.arange(n, dtype=np.int64), ledger=ledger)
    return runner, step


def warmup_batches(bank: Bank, indices: Sequence[int], seed: int,
                   batch: int = WARMUP_BATCH) -> list[tuple[BankBranchRunner, StepResult]]:
    """The warm-up's trees, ``batch`` prompts at a time (:func:`full_trees`). :func:`warm_up`
    only reads them, so a bench builds them once for every repetition and predictor kind."""
    return [full_trees(bank, indices[lo:lo + batch], seed) for lo in range(0, len(indices), batch)]


def warm_up(predictor: Any, bank: Bank, indices: Sequence[int], *, seed: int, prefix_share: float,
            batch: int = WARMUP_BATCH, batches: Sequence[tuple[BankBranchRunner, StepResult]] | None = None,
            ) -> dict[str, Any]:
    """Train ``predictor`` on the recorded rollouts of ``indices`` (see the module docstring);
    ``batches``: :func:`warmup_batches` of the same arguments, built before.

    Returns what it read: ``{"prompts", "roots", "continuations", "updates", "samples", "seconds"}``.
    """
    batches = warmup_batches(bank, indices, seed, batch) if batches is None else batches
    return learn_from_batches(predictor, batches, prefix_share)


def learn_from_batches(predictor: Any, batches: Sequence[tuple[Any, StepResult]], prefix_share: float,
                       ) -> dict[str, Any]:
    """The warm-up's learning: each batch's full trees through the step's own learning half
    (:func:`trace_gym.step.learning.update_predictor`, root rollouts' nodes only), one predictor update
    per batch. ``batches``: ``(runner, step)`` pairs, the runner the one that grew the step's
    trees (a bank's :class:`~trace_gym.banks.replay.BankBranchRunner`, or the simulator's:
    ``bench --sim`` warms up through this same function, :mod:`trace_gym.bench.sim_fit`).

    Returns what it read: ``{"prompts", "roots", "continuations", "updates", "samples", "seconds"}``.
    """
    start = time.perf_counter()
    stats = {"prompts": 0, "roots": 0, "continuations": 0, "updates": 0, "samples": 0}
    for runner, step in batches:
        learning = update_predictor(step, predictor, runner, prefix_share, root_rollouts_only=True)
        stats["prompts"] += len(step.trees)
        stats["roots"] += sum(1 for t in step.trees for b in t.branches if not b.is_continuation)
        stats["continuations"] += sum(1 for t in step.trees for b in t.branches if b.is_continuation)
        stats["updates"] += 1
        stats["samples"] += len(learning.targets)
    stats["seconds"] = time.perf_counter() - start
    return stats


def repetition_seed(seed: int, rep: int) -> int:
    """The seed of a bank bench's repetition ``rep`` from its base ``seed``: its draws and its warm-up
    slice (:func:`held_out_prompts`) follow it."""
    return seed + 7919 * rep


def mean_steady_state_quality(make: Callable[[], Any], bank: Bank, warmup_prompts: int, *, seed: int,
                              repetitions: int, prefix_share: float, group_size: int | None = None,
                              selection: tuple[int, int] | None = None) -> dict[str, float]:
    """:func:`steady_state_quality` averaged over the warm-up slices of a bank bench's first
    ``repetitions`` repetitions (:func:`repetition_seed`), a fresh predictor (``make()``) each: the
    predictor the bench's interval is over, not one slice's (which slice warms the predictor moves
    a bank's verdict: docs/benchmarking.md). Each measure is the mean over the slices (NaN ones
    left out); ``"slices"`` says how many."""
    rows = [steady_state_quality(make(), bank, warmup_prompts, seed=repetition_seed(seed, r), prefix_share=prefix_share,
                                 group_size=group_size, selection=selection) for r in range(repetitions)]
    return {k: float(np.nanmean([row[k] for row in rows])) for k in rows[0]} | {"slices": repetitions}


def steady_state_quality(predictor: Any, bank: Bank, warmup_prompts: int, *, seed: int, prefix_share: float,
                         group_size: int | None = None, selection: tuple[int, int] | None = None,
                         ) -> dict[str, float]:
    """What a bank bench's learned predictor knows as its first step starts: ``predictor`` (fresh)
    warmed up on the bench's held-out slice (:func:`held_out_prompts`, :func:`warm_up`), then
    scored on every other prompt against the bank's truth: each prompt's empirical rate over its
    recorded roots, and whether it is mixed: with ``group_size`` G, the probability that a group of G
    drawn from its recorded roots without replacement (as the bench draws them) is mixed
    (:func:`~trace_gym.predictor.quality.drawn_group_mixed`); without, whether all its roots
    were (as :func:`~trace_gym.bench.bank.bank_truth` reads them). Returns
    :func:`~trace_gym.predictor.quality.predictor_quality`'s ``{"prompt_spearman", "mixed_auc",
    "brier", "level_error"}`` and, with ``selection`` = (pool, picks), ``"selection_precision"``
    (:func:`~trace_gym.predictor.quality.selection_precision`): what the calibrated simulator's
    predictor is fitted to."""
    from trace_gym.predictor.kinds import Context
    from trace_gym.predictor.quality import drawn_group_mixed, predictor_quality, selection_precision

    held = held_out_prompts(len(bank), warmup_prompts, seed)
    warm_up(predictor, bank, held, seed=seed, prefix_share=prefix_share)
    skip = set(held)
    rest = [bank.prompt(i) for i in range(len(bank)) if i not in skip]
    values = predictor.predict([Context(r.prompt) for r in rest])
    rates = np.array([r.prompt_rate() for r in rest], dtype=float)
    wins = np.array([sum(r.outcomes()) for r in rest], dtype=int)
    trials = np.array([len(r.outcomes()) for r in rest], dtype=int)
    mixed = (drawn_group_mixed(wins, trials, group_size) if group_size else
             ((wins > 0) & (wins < trials)).astype(float))
    out = predictor_quality(values, rates, mixed)
    if selection is not None:
        out["selection_precision"] = selection_precision(values, mixed, pool=selection[0], picks=selection[1])
    return out
