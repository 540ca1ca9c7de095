"""The calibrated simulator's predictor chosen where it is read: in the bench (issue 45, item 4).

:func:`trace_gym.bench.sim_calibration.bank_fit` fits the simulated predictor at the start of the first
step (:mod:`trace_gym.bench.sim_fit`). What PCL and TRACE meet is the predictor in the bench, warmed and
then learning from each step's rollouts, so two choices are made again there, each on an arm whose
rollouts do not read the predictor (:mod:`trace_gym.bench.in_bench`). The first rule is the third tried,
each read against the banks' rows before the next (docs/benchmarking.md, "Fit version 11"):

- :func:`prompt_in_bench`, on the uniform arm: of the start-of-step fits (per type visibility in a world
  of task types; per feature Spearman in a world of one type whose bank predictor ranks prompts at all),
  the one whose in-bench prompt predictions read most like the bank bench's (:func:`choose_in_bench`);
  then its level shift solved so that its in-bench level error is the bank bench's, and its feature
  solved again at that level so that its in-bench picks are the bank's. A bank predictor that reads
  every prompt alike (the guessing bank: one prompt text, its prompt Spearman undefined) has no
  feature to match; only the level is solved there.
- :func:`prefix_in_bench`, on the random tree arm (which picks its prefixes at random): the
  ``signal_noise`` (what the prefix predictor sees of a prefix's value) whose in-bench prefix Spearman
  within a depth (:data:`PREFIX_MEASURE`), read against as many fresh continuations as the bank recorded,
  is nearest the bank bench's own reading of the same arm. That is what TRACE's second stage reads. Left
  at its default (4), the simulated prefix predictor read the QA bank's prefixes at 0.45 against the
  bank's 0.18, and the guessing bank's at 0.14 against 0.24 (fit 14, over every depth). Since fit 15 the
  simulated predictor sees a prefix's turn, as the bank's reads it in the prefix's text, and learns each
  turn's level from its own intercept; the signal noise is then what it knows of a prefix beside its turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from trace_gym.allocation.strategy import Strategy

#: Repetitions of a simulated arm read in the bench per candidate.
IN_BENCH_SIM_SEEDS = 30
#: In-bench selection precisions within this of the bank's are as good (:func:`choose_in_bench`): about the
#: reading's spread over 30 simulated repetitions of 3 steps.
IN_BENCH_TOLERANCE = 0.015
#: The signal noises :func:`prefix_in_bench` tries (logit units), least informative first (a tie: the noisier).
SIGNAL_GRID = (64.0, 16.0, 8.0, 4.0, 2.0, 1.0, 0.5)
#: How far from the chosen feature Spearman :func:`prompt_in_bench` solves it again at the bank's level: the
#: grid's values within this of it (a local correction; on the five banks the whole grid's nearest lies within).
RESOLVE_SPAN = 0.1
#: The resolution of the feature the re-solve interpolates between two grid readings (:func:`_resolve_feature`).
RESOLVE_STEP = 0.005
#: The bench's reading :func:`prefix_in_bench` matches: the prefix Spearman within a depth
#: (:func:`trace_gym.report.spearman_within`). Over every depth (fit 14) the reading also credits the predictor for
#: each depth's level, which the simulated one, seeing the turn, learns from its intercepts: on the guessing bank
#: no signal noise read below 0.45 where the bank's predictor reads 0.25 (0.098 within a depth).
PREFIX_MEASURE = "prefix_spearman_within"
#: Repetitions of the bank bench's random tree arm read for :func:`prefix_in_bench`: at the bench's default 10
#: the QA bank's reading spans about +-0.13, at 30 about +-0.075.
PREFIX_BANK_SEEDS = 30
#: Repetitions of the bank bench's and of the simulated bench's reference arm that :func:`prompt_in_bench` reads
#: when it solves the feature again for the bank's picks. At 10 and 30 the QA bank's picks read 0.195 and the
#: simulator's at feature 0.65 0.196; at 30 and 90, 0.203 and 0.216: the readings' spread was the size of
#: the gap the re-solve closes, and PCL moved with it (0.221 against the bank's 0.197 +- 0.019).
RESOLVE_BANK_SEEDS = 30
RESOLVE_SIM_SEEDS = 90


def choose_in_bench(bank: Mapping[str, float], readings: Sequence[Mapping[str, float]],
                    tolerance: float = IN_BENCH_TOLERANCE) -> int:
    """Index of the reading that reads most like ``bank`` in the bench: of those whose
    ``selection_precision`` lies within ``tolerance`` of the bank's, the nearest over Brier, mixed AUC
    and prompt Spearman (the sum of absolute gaps, over the measures the bank's reading defines; a tie:
    the first). Selection first: it is what PCL and TRACE's root stage read. Where none picks within
    ``tolerance``, the picks separate no candidate from the rest, and the nearest over all four (picks
    included, the same sum) is taken: on the shape bank under fit 10 the nearest picks (0.018 off) came
    with a Brier of 0.197 against the bank's 0.114, while the type-alone predictor, 0.034 off on picks,
    read the bank's Brier, AUC and Spearman."""
    from trace_gym.bench.sim_fit import closest

    precision = [float(r["selection_precision"]) for r in readings]
    gaps = np.abs(np.asarray(precision) - float(bank["selection_precision"]))
    keep = np.flatnonzero(gaps <= tolerance + 1e-12)
    measures = ("brier", "mixed_auc", "prompt_spearman")
    if not keep.size:
        keep, measures = np.arange(len(readings)), ("selection_precision", *measures)
    measures = tuple(m for m in measures if np.isfinite(float(bank[m])))
    rest = [sum(abs(float(readings[i][m]) - float(bank[m])) for m in measures) for i in keep]
    return int(keep[closest(rest, 0.0)])


def _sim_cfg(found: Mapping[str, Any], shape: Any, bank_cfg: Any, group_size: int, path: str) -> Any:
    """The simulated bench of ``shape`` with ``found``'s world and predictor, as its in-bench readings run it
    (:data:`IN_BENCH_SIM_SEEDS` repetitions, no oracle arm; ``calibrate_from`` names the bank so that a
    prefix is scored as the bank bench scores one, and nothing is fitted again). No level shift: a reading
    adds it to the prompt logits afterwards (:func:`trace_gym.bench.sim_fit.mean_quality`), and a prefix's
    prediction never carries it."""
    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.bench.sim_fit import SIM_WORLD_KEYS

    world = {k: found[k] for k in SIM_WORLD_KEYS if k in found}
    return SimBenchConfig(**world, group_size=group_size, candidates=shape.candidates or bank_cfg.candidates,
                          root_budget=shape.root_budget or bank_cfg.root_budget,
                          continuations_per_root=shape.continuations_per_root, steps=bank_cfg.steps,
                          warmup_steps=bank_cfg.warmup_steps, pool_size=shape.pool_size,
                          warmup_prompts=found["warmup_prompts"], seeds=IN_BENCH_SIM_SEEDS,
                          oracle_upper_bound=False, feature_spearman=found["feature_spearman"], calibrate_from=path)


def _candidates(found: Mapping[str, Any], bank_q: Mapping[str, float]) -> list[dict[str, Any]]:
    """The start-of-step fits to read in the bench: per visibility with task types; per feature Spearman
    (each with its level-matching shift) in a world of one type whose bank predictor ranks prompts; none
    where the bank's predictor reads every prompt alike."""
    fit = found["predictor_fit"]
    if found.get("type_shares"):
        return fit.get("visibility_grid") or []
    if not np.isfinite(float(bank_q["prompt_spearman"])):
        return []
    for row in fit.get("grid") or []:
        row.setdefault("predictor_level_shift", row.get("shift"))
    return fit.get("grid") or []


def prompt_in_bench(bank: Any, path: str, group_size: int, shape: Any, found: dict[str, Any],
                    reference: Strategy) -> dict[str, Any]:
    """Both predictors read in the bench (:mod:`trace_gym.bench.in_bench`): ``reference`` (a strategy that
    does not read its predictor) run as one arm of the bank bench of ``shape`` and of the simulated bench,
    its predictor's mean quality over the measured steps of each, PCL's picks out of each bench's
    candidates. Of the start-of-step fits (:func:`_candidates`), each read at its own shift, it chooses
    the one whose reading is nearest the bank's (:func:`choose_in_bench`) and sets it in ``found``
    (``feature_spearman``, with types ``type_visibility``). Then, whatever the world, the level: the
    chosen predictor's ``predictor_level_shift`` becomes the one that gives it the bank's in-bench level
    error (:func:`~trace_gym.bench.sim_fit.shift_for_level` on its own in-bench predictions: the shift
    never enters the regression and the uniform arm does not read it, so one run serves every shift),
    and where the chosen predictor reads a feature, the feature's Spearman is solved again at that level
    on it, the values of :data:`~trace_gym.bench.sim_fit.SPEARMAN_GRID` within :data:`RESOLVE_SPAN` of it and
    the feature between two readings that bracket the bank's picks (:func:`_resolve_feature`), so that its
    in-bench picks are the bank's (the nearest; a tie: the weaker feature): a shift that
    moves the level moves the picks too. That re-solve reads both arms again on more repetitions
    (:data:`RESOLVE_BANK_SEEDS`, :data:`RESOLVE_SIM_SEEDS`), the level matched to the finer reading, and
    returns that reading as ``"bank"``.
    The start-of-step shift drifted in the bench (QA bank: +0.024 against the bank's -0.016), and
    TRACE's root stage, which reads the level, bought 5.2 prompts a step where the bank's bought 4.3.
    Choosing among candidates each at its own in-bench shift was tried first and moved the choice (math
    bank: a predictor 0.015 above the bank's picks, PCL 0.696 against 0.663). Read at the start of the first step a
    predictor that sees the type matched the math bank's on all four measures, but it went on learning
    in the bench where the bank's embedding predictor does not (picks 0.723 against 0.680), and put
    TRACE at 0.774 against the bank's 0.646 +- 0.054; fitted at the start on the QA bank, the simulated
    predictor ranked prompts at 0.455 in the bench against the bank's 0.238 and put PCL at 0.218 against
    0.197 +- 0.013."""
    from trace_gym.bench.config import BankBenchConfig
    from trace_gym.bench.in_bench import arm_samples
    from trace_gym.bench.sim_fit import RecordedShape, mean_quality, pcl_picks, shift_for_level
    from trace_gym.bench.sim_source import SimSource
    from trace_gym.predictor.quality import QUALITY_KEYS

    bank_cfg, bank_q = _bank_reading(bank, path, group_size, shape, found, reference, BankBenchConfig().seeds)
    sim_cfg = _sim_cfg(found, shape, bank_cfg, group_size, path)
    sim_picks = pcl_picks(sim_cfg.root_budget, sim_cfg.continuations_per_root, group_size)
    recorded = RecordedShape(**found["recorded_shape"])
    typed = bool(found.get("type_shares"))

    def read(knobs: Mapping[str, Any], bank_q: Mapping[str, float] = bank_q,
             seeds: int = IN_BENCH_SIM_SEEDS) -> tuple[dict[str, float], dict[str, float]]:
        """The candidate's in-bench quality at its own (start-of-step) shift, and at the shift that gives
        it ``bank_q``'s in-bench level error (with that shift as ``predictor_level_shift``), over ``seeds``
        repetitions."""
        cfg = dataclasses.replace(sim_cfg, feature_spearman=knobs["feature_spearman"], seeds=seeds,
                                  **({"type_visibility": knobs["type_visibility"]} if typed else {}))
        steps = arm_samples(SimSource(cfg, recorded), reference)
        shift = shift_for_level(steps, float(bank_q["level_error"]))
        picks = (sim_cfg.candidates, sim_picks)
        return (mean_quality(steps, knobs["predictor_level_shift"], selection=picks),
                mean_quality(steps, shift, selection=picks) | {"predictor_level_shift": shift})

    rows = _candidates(found, bank_q)
    repetitions, sim_repetitions = bank_cfg.seeds, IN_BENCH_SIM_SEEDS
    pairs = [read(row) for row in rows] if rows else [read(found)]
    readings = [at_start for at_start, _ in pairs]
    best = choose_in_bench(bank_q, readings) if rows else 0
    matched = pairs[best][1]
    found["predictor_level_shift"] = matched["predictor_level_shift"]
    if rows:
        row = rows[best]
        keys = ("type_visibility", "feature_spearman")[0 if typed else 1:]
        for k in keys:
            found[k] = row[k]
        reached = {k: row[k] for k in (*QUALITY_KEYS, "selection_precision")}
        found["predictor_fit"] |= {k: row[k] for k in keys} | {"chosen_in_bench": True, "reached": reached}
        for candidate, reading in zip(rows, readings):
            candidate["in_bench"] = reading
        if float(found["feature_spearman"]) > 0:  # at the bank's level, the feature whose picks are the bank's
            _, bank_q = _bank_reading(bank, path, group_size, shape, found, reference, RESOLVE_BANK_SEEDS)
            matched = _resolve_feature(read, row, found, bank_q)
            repetitions, sim_repetitions = RESOLVE_BANK_SEEDS, RESOLVE_SIM_SEEDS
    found["predictor_fit"] |= {"predictor_level_shift": found["predictor_level_shift"]}
    return {"bank": bank_q, "simulated": matched, "at_start_shift": readings[best], "chosen_from": len(rows),
            "steps": bank_cfg.steps - bank_cfg.warmup_steps, "repetitions": repetitions,
            "sim_repetitions": sim_repetitions, "sim_selection": [sim_cfg.candidates, sim_picks]}


def _bank_reading(bank: Any, path: str, group_size: int, shape: Any, found: Mapping[str, Any],
                  reference: Strategy, seeds: int) -> tuple[Any, dict[str, float]]:
    """The bank bench of ``shape`` at ``seeds`` repetitions, and its ``reference`` arm's mean in-bench
    quality (PCL's picks out of the bank's candidates, ``found["selection"]``)."""
    from trace_gym.bench.bank import BankSource
    from trace_gym.bench.in_bench import arm_samples
    from trace_gym.bench.sim_fit import mean_quality
    from trace_gym.predictor.embeddings import bank_store, use_store

    bank_cfg, _ = shape.bank_bench(path, len(bank), group_size, seeds=seeds)
    with use_store(bank_store(bank.scan.sha256)):
        steps = arm_samples(BankSource(bank_cfg), reference)
    return bank_cfg, mean_quality(steps, 0.0, selection=tuple(found["selection"]))


def bracketed(xs: Sequence[float], ys: Sequence[float], target: float) -> float | None:
    """The ``x`` at which the line through two neighbouring points of ``(xs, ys)`` (``xs`` ascending) meets
    ``target``: the first neighbouring pair whose ``ys`` lie on either side of it (one end may equal it).
    ``None`` where no pair brackets ``target`` (it lies outside every reading) or a pair reads flat."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if min(y0, y1) <= target <= max(y0, y1) and y0 != y1:
            return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))
    return None


def _resolve_feature(read: Any, row: Mapping[str, Any], found: dict[str, Any],
                     bank_q: Mapping[str, float]) -> dict[str, float]:
    """:func:`prompt_in_bench`'s re-solve: the chosen feature and each grid feature within :data:`RESOLVE_SPAN`
    of it, read by ``read`` at ``bank_q``'s level on :data:`RESOLVE_SIM_SEEDS` repetitions; then, where two
    neighbouring readings bracket the bank's picks, the feature at which the line between them meets them
    (:func:`bracketed`, to :data:`RESOLVE_STEP`), read too. The grid's step alone was too coarse where picks
    climb steeply: on the deep bank the chosen 0.94 became 0.95, whose picks read 0.757 against the bank's 0.746
    (0.90: 0.653), and PCL and TRACE came out above the bank's at 180 repetitions. Of all read, the one whose
    picks are nearest ``bank_q``'s (a tie: the weaker feature) is set in ``found`` with its shift. Returns its
    reading."""
    from trace_gym.bench.sim_fit import SPEARMAN_GRID, closest

    own = float(found["feature_spearman"])
    near = sorted({own, *(float(x) for x in SPEARMAN_GRID if abs(x - own) <= RESOLVE_SPAN + 1e-9)})
    scan = {x: read({**row, "feature_spearman": x}, bank_q, RESOLVE_SIM_SEEDS)[1] for x in near}
    target = float(bank_q["selection_precision"])
    between = bracketed(near, [scan[x]["selection_precision"] for x in near], target)
    if between is not None and (x := round(round(between / RESOLVE_STEP) * RESOLVE_STEP, 6)) not in scan:
        scan[x] = read({**row, "feature_spearman": x}, bank_q, RESOLVE_SIM_SEEDS)[1]
    xs = sorted(scan)
    i = closest([scan[x]["selection_precision"] for x in xs], target)
    found["feature_spearman"], found["predictor_level_shift"] = xs[i], scan[xs[i]]["predictor_level_shift"]
    found["predictor_fit"] |= {"feature_spearman": xs[i],
                               "picks_scan": {f"{x:g}": scan[x]["selection_precision"] for x in xs}}
    return scan[xs[i]]


def prefix_in_bench(bank: Any, path: str, group_size: int, shape: Any, found: Mapping[str, Any],
                    tree: Strategy, grid: Sequence[float] | None = None) -> dict[str, Any]:
    """The prefix predictor read in the bench on the random tree arm (``tree``), bank and simulator alike
    (:func:`trace_gym.bench.in_bench.arm_prefix_spearman`, the measure :data:`PREFIX_MEASURE`; the bank at
    :data:`PREFIX_BANK_SEEDS` repetitions), and the ``signal_noise`` of ``grid`` (default :data:`SIGNAL_GRID`)
    whose simulated reading is nearest the bank's (:func:`trace_gym.bench.sim_fit.closest`: a tie goes to the
    noisier signal). Where either side's reading is undefined (no repetition scored two prefixes of differing
    truth: a world whose every prefix surely ends one way) the default stays. Returns ``{"measure", "bank",
    "simulated": {noise: reading}, "signal_noise", "repetitions", "sim_repetitions"}``."""
    from trace_gym.bench.bank import BankSource
    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.bench.in_bench import arm_prefix_spearman
    from trace_gym.bench.sim_fit import RecordedShape, closest
    from trace_gym.bench.sim_source import SimSource
    from trace_gym.predictor.embeddings import bank_store, use_store

    bank_cfg, _ = shape.bank_bench(path, len(bank), group_size, seeds=PREFIX_BANK_SEEDS)
    with use_store(bank_store(bank.scan.sha256)):
        bank_rho = arm_prefix_spearman(BankSource(bank_cfg), tree, key=PREFIX_MEASURE)
    sim_cfg = _sim_cfg(found, shape, bank_cfg, group_size, path)
    recorded = RecordedShape(**found["recorded_shape"])
    grid = SIGNAL_GRID if grid is None else grid
    readings = [arm_prefix_spearman(SimSource(dataclasses.replace(sim_cfg, signal_noise=float(s)), recorded), tree,
                                    key=PREFIX_MEASURE) for s in grid]
    defined = np.isfinite(bank_rho) and np.isfinite(readings).any()
    noise = float(grid[closest(readings, bank_rho)]) if defined else SimBenchConfig().signal_noise
    return {"measure": PREFIX_MEASURE, "bank": bank_rho, "simulated": {str(s): r for s, r in zip(grid, readings)},
            "signal_noise": noise, "repetitions": PREFIX_BANK_SEEDS, "sim_repetitions": IN_BENCH_SIM_SEEDS}
