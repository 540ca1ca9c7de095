"""The simulator's predictor, warmed up and fitted as the bank bench's is (issue 45).

A bank bench starts every learned predictor warm: trained on the recorded rollouts of a
held-out slice of the bank (:mod:`trace_gym.banks.warmup`), then measured on the other
prompts. The simulator does the same here, so that a simulator calibrated to a bank and
the bank measure one thing:

- :func:`warmup_batches`: held-out simulated tasks, each grown as a bank records a prompt
  (:class:`RecordedShape`, the bank's manifest: R roots, K continuations at each prefix
  :func:`trace_gym.banks.record.prefix_depths` keeps), fed through the bank warm-up's own
  learning loop (:func:`trace_gym.banks.warmup.learn_from_batches`).
- :func:`start_samples`: the warmed simulated predictor on other tasks, against its bench's
  truth (p, and P(a fresh group of G is mixed)), as
  :func:`trace_gym.banks.warmup.steady_state_quality` measures the bank's predictor against
  the bank's (the empirical rate over the recorded roots, and P(a group of G drawn from them
  without replacement, as the bank bench draws it, is mixed)): the two truths are defined
  alike, what a selector meets being the group its bench draws.
- :func:`fit_predictor`: the simulator's two predictor knobs, ``feature_spearman`` (how much
  the task feature says about p) on a grid and, for each, ``predictor_level_shift`` (an
  offset in logit added to prompt predictions, :class:`~trace_gym.sim.predictors.LearnedPredictor`)
  solved so the level error matches the bank's (:func:`shift_for_level`); then the grid point
  whose *selection precision* is nearest the bank's (:func:`closest`): the mean P(mixed) of
  the prompts nearest 0.5 in a bench's pool, the prompts PCL buys and TRACE's root stage
  starts from (:func:`~trace_gym.predictor.quality.selection_precision`). Not the AUC: on the
  math bank a simulated predictor with the bank predictor's AUC (0.75) picked prompts mixed
  0.60 of the time where the bank's picked 0.75, and PCL fell to 0.58 against the bank's 0.73;
  the bank predictor's values are bimodal (most near 0 or 1, the few in between mostly mixed),
  which one AUC does not carry. Every grid point reads the same simulated banks (common random
  numbers: the same p, turns, warm-up trees and noise draws), so the objective changes only
  with the knobs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from trace_gym.banks.warmup import WARMUP_BATCH, learn_from_batches
from trace_gym.budget import BudgetLedger
from trace_gym.step.driver import StepResult
from trace_gym.sim.prior import TYPE_KEYS
from trace_gym.sim.simulator import SimBranchRunner, SimWorld, TaskPool, make_pool, root_state, sigmoid

#: Feature Spearman values :func:`fit_predictor` tries first; then ten steps across one step each
#: side of the best (0.01 apart for this grid).
SPEARMAN_GRID = tuple(np.round(np.linspace(0.0, 1.0, 21), 2).tolist())
#: Simulated banks, and scored tasks in each, of every grid point of a fit (:func:`fit_predictor`).
FIT_SEEDS, FIT_SCORED = 4, 1024
#: Fits within this of the best are as good (about the simulated measure's noise over 4 simulated
#: banks of 1,024 tasks); :func:`closest` takes the least informative of them.
FIT_TOLERANCE = 0.01


@dataclass(frozen=True)
class RecordedShape:
    """How a bank recorded each prompt, which the simulator's warm-up copies.

    Attributes:
        roots: R, root rollouts per prompt.
        continuations: K, continuations per recorded prefix.
        prefixes_per_root: the per-root prefix cap (``None``: every prefix).
    """

    roots: int = 8
    continuations: int = 4
    prefixes_per_root: int | None = None

    @classmethod
    def of_manifest(cls, manifest: Mapping[str, Any]) -> "RecordedShape":
        """The shape of a bank's manifest (``roots``, ``continuations``, ``max_prefixes_per_root``; 0 or
        null: no cap)."""
        cap = manifest.get("max_prefixes_per_root") or None
        return cls(int(manifest["roots"]), int(manifest["continuations"]), cap)

    def describe(self) -> str:
        cap = f", at most {self.prefixes_per_root} prefix(es) per root" if self.prefixes_per_root else ""
        return f"R = {self.roots} roots each, K = {self.continuations} continuations per prefix{cap}"


def warmup_batches(pool: TaskPool, world: SimWorld, tasks: Sequence[int], shape: RecordedShape, seed: int,
                   batch: int = WARMUP_BATCH) -> list[tuple[SimBranchRunner, StepResult]]:
    """The warm-up's trees of the simulated ``tasks``, ``batch`` at a time, each grown to ``shape``
    (every root, then K continuations at each kept prefix of every root), as
    :func:`trace_gym.banks.warmup.warmup_batches` replays a bank's. Seeded by ``seed`` alone."""
    from trace_gym.banks.record import prefix_depths

    rng = np.random.default_rng([seed, 3])
    out = []
    for lo in range(0, len(tasks), batch):
        chunk = list(tasks[lo:lo + batch])
        runner, ledger = SimBranchRunner(pool, world, rng), BudgetLedger()
        trees = [runner.new_tree(key, task) for key, task in enumerate(chunk)]
        for key in range(len(chunk)):
            runner.start_roots(key, shape.roots, ledger)
        runner.advance(ledger)
        for key, tree in enumerate(trees):
            for branch in list(tree.branches):
                nodes = tree.branch_nodes(branch.id)  # its turns, depth 1 .. T
                for depth in prefix_depths(len(nodes), shape.prefixes_per_root):
                    runner.start_continuations(key, nodes[depth - 1], shape.continuations, ledger)
        runner.advance(ledger)
        n = len(chunk)
        out.append((runner, StepResult(np.full(n, 0.5), np.zeros(n, np.int64), np.zeros(n, np.int64), trees,
                                       np.arange(n, dtype=np.int64), ledger=ledger)))
    return out


@dataclass(frozen=True)
class StartSample:
    """One simulated bank at the start of its first step: the warmed predictor's prompt logits
    (before any level shift) on the scored tasks, and their truth (p, and the probability that a
    fresh group of G is mixed). Shapes (n,)."""

    logits: np.ndarray
    rates: np.ndarray
    mixed: np.ndarray

    def level_error(self, shift: float) -> float:
        """Mean prediction at ``shift`` minus mean rate (the ``level_error`` of :meth:`quality`, alone)."""
        return float(sigmoid(self.logits + shift).mean() - self.rates.mean())

    def quality(self, shift: float, selection: tuple[int, int] | None = None) -> dict[str, float]:
        """:func:`~trace_gym.predictor.quality.predictor_quality` of the predictions at ``shift``, and with
        ``selection`` = (pool, picks) their ``selection_precision``."""
        from trace_gym.predictor.quality import predictor_quality, selection_precision

        values = sigmoid(self.logits + shift)
        out = predictor_quality(values, self.rates, self.mixed)
        if selection is not None:
            out["selection_precision"] = selection_precision(values, self.mixed, pool=selection[0],
                                                             picks=selection[1])
        return out


def start_samples(world: SimWorld, shape: RecordedShape, *, warmup_prompts: int, scored: int, seeds: int,
                  prefix_share: float, spearmans: Sequence[float]) -> dict[float, list[StartSample]]:
    """Per feature Spearman of ``spearmans``: ``seeds`` simulated banks of ``warmup_prompts`` held-out
    and ``scored`` measured tasks, the learned predictor warmed on the first and scored on the
    second (:class:`StartSample`). Common random numbers: only the feature's noise level differs."""
    from trace_gym.predictor.quality import mixed_probability
    from trace_gym.sim.predictors import LearnedPredictor, noise_for_spearman

    out: dict[float, list[StartSample]] = {s: [] for s in spearmans}
    prior = world.difficulty()
    for seed in range(seeds):
        base = make_pool(world, warmup_prompts + scored, np.random.default_rng([seed, 0]))
        batches = warmup_batches(base, world, range(warmup_prompts), shape, seed)  # trees read p and turns only
        rest = np.arange(warmup_prompts, len(base))
        rates = base.success[rest]  # the simulator's truth, as its bench reads it
        mixed = mixed_probability(rates, world.group_size)
        contexts = [root_state(base, int(t), world) for t in rest]
        for s in spearmans:
            noisy = dataclasses.replace(world, feature_noise=noise_for_spearman(s, prior))
            pool = make_pool(noisy, len(base), np.random.default_rng([seed, 0]))  # same p, turns, draws
            predictor = LearnedPredictor(pool.features)
            learn_from_batches(predictor, batches, prefix_share)
            logits = predictor.logits(contexts) if predictor.weights is not None else np.zeros(len(rest))
            out[s].append(StartSample(logits, rates, mixed))
    return out


def mean_quality(samples: Sequence[StartSample], shift: float,
                 selection: tuple[int, int] | None = None) -> dict[str, float]:
    """Each quality measure's mean over ``samples`` at ``shift`` (:meth:`StartSample.quality`)."""
    rows = [s.quality(shift, selection) for s in samples]
    return {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}


def shift_for_level(samples: Sequence[StartSample], level: float, bound: float = 20.0) -> float:
    """The logit shift at which the mean level error over ``samples`` is ``level`` (bisection: the
    level rises monotonically with the shift); the nearer bound, ``-bound`` or ``bound``, when it
    cannot be reached."""
    lo, hi = -bound, bound
    gap = lambda c: float(np.mean([s.level_error(c) for s in samples])) - level  # noqa: E731
    if gap(lo) >= 0:
        return lo
    if gap(hi) <= 0:
        return hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def closest(values: Sequence[float], target: float, tolerance: float = 0.0) -> int:
    """Index of the first value within ``tolerance`` of the nearest one to ``target``: the grid runs
    from the least informative feature up, so among fits as good as the best (to the measure's own
    noise) it takes the weaker predictor, never one that only noise put ahead. Where no value is a
    number (a predictor that never trained reads NaN on every measure), the first."""
    gaps = np.abs(np.asarray(values, dtype=float) - target)
    if np.isnan(gaps).all():  # nothing measured (a cold predictor's constant values): the least informative
        return 0
    return int(np.flatnonzero(gaps <= np.nanmin(gaps) + tolerance)[0])


def fit_predictor(world: SimWorld, shape: RecordedShape, target: Mapping[str, float], *, warmup_prompts: int,
                  prefix_share: float, selection: tuple[int, int], match: str = "selection_precision",
                  seeds: int = FIT_SEEDS, scored: int = FIT_SCORED, grid: Sequence[float] = SPEARMAN_GRID,
                  tolerance: float = FIT_TOLERANCE) -> dict[str, Any]:
    """``feature_spearman`` and ``predictor_level_shift`` at which the warmed simulated predictor's
    ``match`` measure and level error equal ``target``'s (a bank's
    :func:`~trace_gym.banks.warmup.steady_state_quality` with the same ``selection``; see the module
    docstring): ``grid`` first, then ten steps across one step of ``grid`` each side of its best;
    of fits within ``tolerance`` of the best, the least informative (:func:`closest`).

    Returns ``{"feature_spearman", "predictor_level_shift", "match", "reached": the simulated measures
    at them, "grid": [{"feature_spearman", "shift", "mixed_auc", "level_error", ...}, ...]}``.
    """
    kw = dict(warmup_prompts=warmup_prompts, scored=scored, seeds=seeds, prefix_share=prefix_share)
    rows = _grid_rows(world, shape, target, grid, selection, kw)
    best = rows[closest([r[match] for r in rows], float(target[match]), tolerance)]
    step = float(np.diff(sorted(grid)).min()) if len(grid) > 1 else 0.0
    around = np.linspace(best["feature_spearman"] - step, best["feature_spearman"] + step, 11)
    fine = sorted({round(float(x), 3) for x in around if 0 <= x <= 1} - {float(g) for g in grid})
    rows += _grid_rows(world, shape, target, fine, selection, kw)
    rows.sort(key=lambda r: r["feature_spearman"])
    best = rows[closest([r[match] for r in rows], float(target[match]), tolerance)]
    return {"feature_spearman": best["feature_spearman"], "predictor_level_shift": best["shift"], "match": match,
            "reached": {k: v for k, v in best.items() if k not in ("feature_spearman", "shift")}, "grid": rows}


def _grid_rows(world: SimWorld, shape: RecordedShape, target: Mapping[str, float], spearmans: Sequence[float],
               selection: tuple[int, int], kw: Mapping[str, Any]) -> list[dict[str, float]]:
    """Per feature Spearman: the level-matching shift and the mean quality there."""
    samples = start_samples(world, shape, spearmans=spearmans, **kw)
    rows = []
    for s in spearmans:
        shift = shift_for_level(samples[s], float(target["level_error"]))
        rows.append({"feature_spearman": float(s), "shift": shift} | mean_quality(samples[s], shift, selection))
    return rows


#: Type visibilities :func:`fit_visibility` tries (a world of task types only), least visible first.
VISIBILITY_GRID = (0.0, 0.5, 0.8, 0.9, 1.0)
#: What :func:`fit_visibility` reads of each fitted predictor: the bank bench's four quality measures.
VISIBILITY_MEASURES = ("selection_precision", "brier", "mixed_auc", "prompt_spearman")


def fit_visibility(world: SimWorld, shape: RecordedShape, target: Mapping[str, float], *,
                   grid: Sequence[float] = VISIBILITY_GRID, tolerance: float = FIT_TOLERANCE,
                   **kw: Any) -> dict[str, Any]:
    """:func:`fit_predictor` at each ``type_visibility`` of ``grid`` (and at each visibility above 0 the
    type alone: feature Spearman 0, the level shift solved), then the visibility whose fitted
    predictor is nearest ``target`` over :data:`VISIBILITY_MEASURES` (the sum of the absolute gaps; of
    those within ``tolerance`` of the nearest, the least visible). Selection precision and level error
    are matched at every visibility as well as the feature allows; what tells the visibilities apart
    is how the predictor gets there: seeing the type (the values cluster by kind, calibrated: a low
    Brier) or reading a noisy feature of p (ranks within kinds too: a higher Spearman and AUC). At the
    first step's start the math bank's embedding predictor reads like the type alone (Spearman 0.842,
    AUC 0.743, Brier 0.104 against the bank's 0.845, 0.747, 0.108), but that predictor went on
    learning in the bench where the bank's does not; so where a reference arm runs, the choice is
    made again in the bench (:func:`trace_gym.bench.in_bench_fit.choose_in_bench`), and this one
    stands only without it. A world without task types has nothing to fit: :func:`fit_predictor` alone,
    ``type_visibility`` None. Returns :func:`fit_predictor`'s result with ``type_visibility`` and
    ``visibility_grid`` (per visibility: its ``feature_spearman``, ``predictor_level_shift``, reached
    measures and ``distance``)."""
    if not world.type_shares:
        return fit_predictor(world, shape, target, **kw) | {"type_visibility": None, "visibility_grid": []}
    fits, seen = [], []
    for v in grid:
        typed = dataclasses.replace(world, type_visibility=float(v))
        fits.append(fit_predictor(typed, shape, target, **kw))
        seen.append(float(v))
        if v > 0 and fits[-1]["feature_spearman"] > 0:  # the type alone, no feature: what an embedding reads
            alone = _grid_rows(typed, shape, target, [0.0], kw["selection"], _sample_kw(kw))[0]
            fits.append({"feature_spearman": 0.0, "predictor_level_shift": alone["shift"],
                         "reached": {k: x for k, x in alone.items() if k not in ("feature_spearman", "shift")}})
            seen.append(float(v))
    gaps = [sum(abs(float(f["reached"][m]) - float(target[m])) for m in VISIBILITY_MEASURES) for f in fits]
    best = closest(gaps, 0.0, tolerance)
    rows = [{"type_visibility": v, "feature_spearman": f["feature_spearman"],
             "predictor_level_shift": f["predictor_level_shift"], "distance": d, **f["reached"]}
            for v, f, d in zip(seen, fits, gaps)]
    return fits[best] | {"type_visibility": seen[best], "visibility_grid": rows}


def _sample_kw(kw: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`start_samples` keywords among :func:`fit_predictor`'s (with its defaults)."""
    return {"warmup_prompts": kw["warmup_prompts"], "prefix_share": kw["prefix_share"],
            "scored": kw.get("scored", FIT_SCORED), "seeds": kw.get("seeds", FIT_SEEDS)}


#: The per-episode length keys a bank's roots set (:func:`trace_gym.bench.sim_calibration.lengths_by_outcome`).
LENGTH_SHARES = ("turn_shares", "success_turn_shares")
#: The simulated world's keys a calibration sets (:class:`~trace_gym.sim.simulator.SimWorld` fields).
SIM_WORLD_KEYS = ("target_mixed", "mean_success", "step_concentration", "min_turns", "max_turns", *LENGTH_SHARES,
                  "success_turn_tilt", *TYPE_KEYS, "type_visibility", "signal_noise", "prefix_sees_turn",
                  "prompts_alike")


def pcl_picks(root_budget: int, continuations_per_root: float, group_size: int) -> int:
    """The fixed groups of ``group_size`` PCL buys at the nominal budget of M = ``root_budget`` and N =
    ``continuations_per_root`` (at least one)."""
    import math

    from trace_gym.bench.bank import groups_needed
    from trace_gym.budget import nominal_cost

    return max(1, groups_needed(math.floor(nominal_cost(root_budget, continuations_per_root) + 1e-9), group_size))
