"""The simulator calibrated to a rollout bank (``bench --sim calibrate_from=BANK``).

:func:`calibrated` sets a simulated bench's knobs from a bank: the difficulty prior, per-turn
concentration and episode lengths (:mod:`trace_gym.sim.calibrate`), and the learned predictor's two
knobs fitted where the bench the simulator runs selects (:class:`FitShape`, :func:`bank_fit`,
:mod:`trace_gym.bench.sim_fit`); the fit is cached by the bank's checksum and the shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from trace_gym.allocation.strategy import Strategy
from trace_gym.bench.config import SimBenchConfig
from trace_gym.bench.sim_fit import LENGTH_SHARES, SIM_WORLD_KEYS, RecordedShape, pcl_picks
from trace_gym.predictor.kinds import make_predictor


def calibrated(cfg: SimBenchConfig, references: Mapping[str, Strategy] | None = None
               ) -> tuple[SimBenchConfig, dict[str, Any]]:
    """``cfg`` with the simulator's knobs set from the bank ``cfg.calibrate_from``
    (:func:`bank_fit`), and what was used: ``{"bank", "values", "fitted", "before", "kept",
    "learned_spearman", "bank_quality", "predictor_fit", "recorded_shape", "in_bench", "prefix_in_bench",
    "cached"}`` (the in-bench readings where ``references`` holds the strategies they run, else None:
    :func:`bank_fit`). A knob set away from its default in ``cfg`` is yours and is kept (``kept``)."""
    from trace_gym.sim.calibrate import sim_overrides

    found, cached = bank_fit(cfg.calibrate_from, cfg.group_size, FitShape.of_sim(cfg), references)
    defaults = SimBenchConfig()
    fitted = sim_overrides(found) | {"common_draws": True}  # the bank bench's arms share their draws
    kept = {k: getattr(cfg, k) for k in fitted if getattr(cfg, k) != getattr(defaults, k)}
    values = {k: v for k, v in fitted.items() if k not in kept}
    if {"min_turns", "max_turns"} & set(kept):  # the bank's length shares are of the bank's range, not yours
        values = {k: v for k, v in values.items() if k not in LENGTH_SHARES}
    before = {k: getattr(cfg, k) for k in values}
    fit = found["predictor_fit"]
    return dataclasses.replace(cfg, **values), {
        "bank": cfg.calibrate_from, "values": values, "kept": kept, "fitted": found["fitted"], "before": before,
        "learned_spearman": found.get("learned_spearman"), "cached": cached, "bank_quality": found["bank_quality"],
        "predictor_fit": {k: v for k, v in fit.items() if k != "grid"}, "recorded_shape": found["recorded_shape"],
        "in_bench": found.get("in_bench"), "prefix_in_bench": found.get("prefix_in_bench"),
        "spearman_note": _fit_note(found)}


def _fit_note(found: Mapping[str, Any]) -> str:
    """One sentence: what the simulated predictor was fitted to, how near it came, and both read in the bench."""
    bank, sim = found["bank_quality"], found["predictor_fit"]["reached"]
    pool, picks = found["selection"]
    cut = found.get("selection_note")
    out = (f"feature_spearman and predictor_level_shift are fitted so that the learned predictor, warmed up on "
           f"{found['warmup_prompts']} held-out simulated tasks as bench --bank warms its own, starts the first "
           f"step picking as well as the bank bench's predictor (mean P(mixed) of the {picks} prompts nearest 0.5 "
           f"in pools of {pool}: bank {bank['selection_precision']:.3f}, simulated {sim['selection_precision']:.3f}) "
           f"at the same level error (bank {bank['level_error']:+.3f}, simulated {sim['level_error']:+.3f}); "
           f"mixed-vs-pure AUC bank {bank['mixed_auc']:.3f}, simulated {sim['mixed_auc']:.3f}")
    if found.get("type_shares"):
        names = found["fitted"].get("kinds") or [""] * len(found["type_shares"])
        kinds = ", ".join(f"{name} {100 * w:.0f} % of mean {m:.3f} (a + b = {c:.3g})" for name, w, m, c in
                          zip(names, found["type_shares"], found["type_means"], found["type_concentrations"]))
        out += (f"; one task type per kind of the bank's task ids (trace_gym/sim/prior.py): {kinds}, each task's "
                f"type seen by the predictor with probability "
                f"{found['type_visibility']:g}, the visibility whose predictor reads most like the bank's "
                + ("in the bench (its picks first, then Brier, AUC and Spearman)"
                   if found["predictor_fit"].get("chosen_in_bench") else
                   "at the start of the first step (selection, Brier, AUC and Spearman; run uniform among the "
                   "strategies to choose it in the bench)")
                + f" (at the start: Brier bank {bank['brier']:.3f}, simulated {sim['brier']:.3f}; Spearman "
                f"{bank['prompt_spearman']:.3f}, {sim['prompt_spearman']:.3f})")
    steps = found.get("in_bench")
    if steps:
        b, s = steps["bank"], steps["simulated"]
        out += (f". In the bench (the uniform arm's {steps['steps']} measured step(s), {steps['repetitions']} bank "
                f"and {steps['sim_repetitions']} simulated repetitions; the level shift, "
                f"{found['predictor_level_shift']:+.3f}, solved there" + (", the feature chosen there" if
                                                                        steps.get("chosen_from") else "")
                + f"): picks {b['selection_precision']:.3f} bank, {s['selection_precision']:.3f} simulated; level "
                f"error {b['level_error']:+.3f}, {s['level_error']:+.3f}; Brier {b['brier']:.3f}, {s['brier']:.3f}; "
                f"AUC {b['mixed_auc']:.3f}, {s['mixed_auc']:.3f}")
    prefix = found.get("prefix_in_bench")
    if prefix:
        within = " within a depth" if prefix.get("measure") == "prefix_spearman_within" else ""
        out += (f"; the prefix predictor on the random tree arm: Spearman{within} {prefix['bank']:.3f} bank, "
                f"{prefix['simulated'].get(str(prefix['signal_noise']), float('nan')):.3f} simulated at signal_noise "
                f"{prefix['signal_noise']:g}, the noise of {len(prefix['simulated'])} read nearest the bank's")
    return out + (f"; {cut}" if cut else "") + " (trace_gym/bench/sim_fit.py)"


#: Bump when what :func:`bank_fit` computes changes (it is part of the cache entry's name). 4 and 5
#: were an experiment's (per-task length histograms, reverted); 6: per-episode lengths by outcome; 7: the bank
#: predictor's quality averaged over the bench's per-repetition warm-up slices; 8: fitted at the simulated bench's
#: own shape (its warm-up slice, candidates and PCL's picks), not the bank bench's defaults; the in-bench reading;
#: 9: task types, one per kind of the bank's task ids (trace_gym/sim/prior.py), their visibility fitted;
#: 10: each type's own kappa, from its kind's continuations (trace_gym.sim.calibrate.type_kappas); 11: the level
#: shift and the feature solved in the bench, a world of one type choosing its feature there too, and the prefix
#: predictor's signal_noise chosen there (trace_gym.bench.in_bench_fit); 12: successful lengths that move with the
#: prompt's p where the roots pay for it (trace_gym.sim.calibrate.success_tilt); 13: the feature re-solved on
#: finer in-bench readings (trace_gym.bench.in_bench_fit.RESOLVE_BANK_SEEDS, RESOLVE_SIM_SEEDS); 14: the re-solve
#: also reads the chosen feature itself and the feature between the two readings that bracket the bank's picks
#: (trace_gym.bench.in_bench_fit.bracketed), not the grid's points alone; 15: the learned predictor sees a prefix's
#: turn (prefix_sees_turn), as the bank's reads it in the prefix's text, its intercepts (each turn's level) carry no
#: L2 penalty (trace_gym.sim.predictors.INTERCEPT_L2), and its signal noise is matched on the prefix Spearman within
#: a depth (trace_gym.bench.in_bench_fit.PREFIX_MEASURE); 16: a bank whose predictor reads every prompt alike (its
#: prompt Spearman undefined) gives the simulated predictor no task feature (prompts_alike).
FIT_VERSION = 16


@dataclass(frozen=True)
class FitShape:
    """The bench a bank's calibration is fitted for: the simulated bench's shape (``calibrate_from``
    passes its own; ``None`` fields take the bank bench's defaults for the bank's size).

    The simulated predictor is matched to the bank bench's predictor where a step selects: with the
    warm-up slice this bench holds out and PCL's picks out of this bench's candidates. Fitted at 8
    picks of 64 while the bench picks 8 of 32 (the QA bank's bench) or 8 of 18 (the shape bank's), the
    simulated predictor matched the bank's there and out-picked it in the bench (issue 45). The bank
    bench of this shape is also run, on its uniform arm, to read both predictors in the bench beside
    the fit (:mod:`trace_gym.bench.in_bench`; not fitted: see docs/benchmarking.md).

    Attributes:
        warmup_prompts: the held-out warm-up slice (prompts).
        candidates: candidate prompts per step.
        root_budget: M, the nominal root budget per step (trajectory-equivalents).
        continuations_per_root: N.
        steps: allocation steps per repetition.
        warmup_steps: the first steps, run (the predictor trains on them) but not measured.
        pool_size: simulated tasks in the simulated bench's dataset.
    """

    warmup_prompts: int | None = None
    candidates: int | None = None
    root_budget: int | None = None
    continuations_per_root: int = 2
    steps: int = 3
    warmup_steps: int = 0
    pool_size: int = 4096

    @classmethod
    def of_sim(cls, cfg: SimBenchConfig) -> "FitShape":
        """The shape ``cfg`` runs (its warm-up slice as the user set it; unset: the bank bench's)."""
        return cls(cfg.warmup_prompts, cfg.candidates, cfg.root_budget, cfg.continuations_per_root, cfg.steps,
                   cfg.warmup_steps, cfg.pool_size)

    def bank_bench(self, path: str, n_prompts: int, group_size: int, seeds: int) -> tuple[Any, str | None]:
        """The bank bench this shape runs on a bank of ``n_prompts`` (a
        :class:`~trace_gym.bench.config.BankBenchConfig`, ``seeds`` repetitions, no oracle arm) and a note
        where it had to be cut to the bank: candidates past the warm-up at most the prompts left (M cut
        by the same share, so PCL's picks keep theirs), and steps at most one pass over them (a prompt
        visited again draws the roots left, which a bank of 8 runs out of).

        Raises:
            ValueError: a warm-up slice that leaves no prompt to measure (naming both sizes).
        """
        from trace_gym.bench.bank import bank_sizes, warmup_size
        from trace_gym.bench.config import BankBenchConfig

        base = BankBenchConfig(bank=path, seeds=seeds, group_size=group_size, oracle_upper_bound=False,
                               continuations_per_root=self.continuations_per_root)
        warm = self.warmup_prompts if self.warmup_prompts is not None else warmup_size(base, n_prompts)
        measurable = n_prompts - warm
        if measurable < 1:
            raise ValueError(f"calibrate_from: warmup_prompts={warm} leaves none of the bank's {n_prompts} prompts "
                             "to measure; lower warmup_prompts")
        cut = []
        candidates, root_budget = self.candidates, self.root_budget
        if candidates is not None and candidates > measurable:
            if root_budget is not None:
                root_budget = max(2, round(root_budget * measurable / candidates))
            cut.append(f"{candidates} candidates to the {measurable} prompts past its {warm}-prompt warm-up"
                       + (f" (M {self.root_budget} to {root_budget})" if root_budget != self.root_budget else ""))
            candidates = measurable
        cfg = dataclasses.replace(base, warmup_prompts=warm, candidates=candidates, root_budget=root_budget)
        candidates, root_budget, _ = bank_sizes(cfg, n_prompts, warm)
        steps = min(self.steps, max(1, measurable // candidates))
        warmup_steps = min(self.warmup_steps, steps - 1)
        if steps != self.steps:
            cut.append(f"{self.steps} steps to {steps} ({warmup_steps} not measured)")
        cfg = dataclasses.replace(cfg, candidates=candidates, root_budget=root_budget, steps=steps,
                                  warmup_steps=warmup_steps)
        return cfg, (f"the bank bench cut to the bank: {'; '.join(cut)}" if cut else None)


def bank_fit(path: str, group_size: int, shape: FitShape = FitShape(),
             references: Mapping[str, Strategy] | None = None) -> tuple[dict[str, Any], bool]:
    """The calibration of a bank for a simulated bench of ``shape``, and whether it came from the cache.

    :func:`trace_gym.sim.calibrate.calibration_from_stats` of its counts (difficulty prior, per-turn
    concentration, episode lengths) with the roots' lengths by outcome (:func:`lengths_by_outcome`) and
    kappa refitted under them (:func:`trace_gym.sim.calibrate.with_lengths`); the bank bench of ``shape``
    (:meth:`FitShape.bank_bench`: its warm-up slice, else the bank bench's default; its candidates and
    PCL's picks, cut to the bank); the bank bench's predictor at the start of its first step
    (:func:`trace_gym.banks.warmup.mean_steady_state_quality` of the embedding predictor, averaged over
    the bench's per-repetition warm-up slices, read through the bank's embedding store); the simulated
    predictor fitted to it (:func:`trace_gym.bench.sim_fit.fit_predictor`: ``feature_spearman``,
    ``predictor_level_shift``); given ``references`` with the uniform strategy (which does not read its
    predictor), both predictors read in the bench on its arm, the candidate chosen and its level and
    feature solved there (``in_bench``, :func:`~trace_gym.bench.in_bench_fit.prompt_in_bench`); with the
    random tree strategy (which picks its prefixes without it), the prefix predictor's ``signal_noise``
    chosen in the bench (``prefix_in_bench``, :func:`~trace_gym.bench.in_bench_fit.prefix_in_bench`);
    each added to a cached entry that lacks it. Cached in
    ``$TRACE_GYM_CACHE/calibrations/<bank sha256>-G<group>-<shape>-v<FIT_VERSION>.json``, keyed by the
    bank's checksum and the shape, so a calibrated simulator run costs seconds after the first. A
    damaged cache entry is a miss."""
    import json
    import os

    from trace_gym.banks import open_bank
    from trace_gym.models import cache_root
    from trace_gym.utils.textsafe import JSONRefused, loads_record

    bank = open_bank(path)
    key = "-".join(f"{k}{'' if v is None else v}" for k, v in dataclasses.asdict(shape).items())
    entry = cache_root() / "calibrations" / f"{bank.scan.sha256}-G{group_size}-{key}-v{FIT_VERSION}.json"
    try:
        found = loads_record(entry.read_bytes(), max_bytes=4 << 20)
    except (OSError, JSONRefused):
        found = None
    if not (isinstance(found, dict) and found.get("version") == FIT_VERSION and "predictor_fit" in found):
        found = None
    cached = found is not None
    references = references or {}
    need_prompt = "uniform" in references and not (cached and "in_bench" in found)
    need_prefix = "random_tree" in references and (need_prompt or not (cached and "prefix_in_bench" in found))
    if cached and not (need_prompt or need_prefix):
        return found, True
    if found is None:
        found = _fit_bank(bank, path, group_size, shape) | {"version": FIT_VERSION}
    from trace_gym.bench.in_bench_fit import prefix_in_bench, prompt_in_bench

    if need_prompt:
        found["in_bench"] = prompt_in_bench(bank, path, group_size, shape, found, references["uniform"])
    if need_prefix:  # after the feature is chosen: a prefix's prediction reads it too
        found["prefix_in_bench"] = prefix_in_bench(bank, path, group_size, shape, found, references["random_tree"])
        found["signal_noise"] = found["prefix_in_bench"]["signal_noise"]
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(found))
    os.replace(tmp, entry)
    return found, cached


def _fit_bank(bank: Any, path: str, group_size: int, shape: FitShape) -> dict[str, Any]:
    """:func:`bank_fit`'s computation (no cache, no in-bench reading)."""

    from trace_gym.sim import simulator as sim
    from trace_gym.banks.stats import bank_stats
    from trace_gym.banks.record import prefix_depths
    from trace_gym.banks.warmup import mean_steady_state_quality
    from trace_gym.sim.calibrate import calibration_from_stats, with_lengths
    from trace_gym.predictor.embeddings import bank_store, use_store
    from trace_gym.bench.config import BankBenchConfig
    from trace_gym.bench.sim_fit import fit_visibility

    defaults = BankBenchConfig()
    bank_cfg, note = shape.bank_bench(path, len(bank), group_size, seeds=defaults.seeds)
    warm = bank_cfg.warmup_prompts
    selection = (bank_cfg.candidates, pcl_selection(bank_cfg, len(bank), warm, group_size)[1])
    with use_store(bank_store(bank.scan.sha256)):  # the vectors the bank bench embeds (and keeps) itself
        quality = mean_steady_state_quality(lambda: make_predictor("embedding", seed=0), bank, warm,
                                            seed=defaults.seed, repetitions=defaults.seeds,
                                            prefix_share=defaults.prefix_share, group_size=group_size,
                                            selection=selection)
    stats = bank_stats(path) | {"predictor": {"prompt": quality["prompt_spearman"]}}
    found = calibration_from_stats(stats, group_size=group_size)
    recorded = RecordedShape.of_manifest(bank.manifest)
    if "min_turns" in found:  # each episode's length by its outcome, and kappa refitted under them
        lo, hi = found["min_turns"], found["max_turns"]
        kept = {n: prefix_depths(n, recorded.prefixes_per_root) for n in range(lo, hi + 1)}
        counts = root_length_counts(bank, lo, hi)  # one pass over the bank serves the histograms and the tilt
        found = with_lengths(found, stats, shares_of_counts(counts), kept, counts)
    # as the bank bench reads: a prefix's turns in its text; prompts of one text alike (prompt Spearman undefined)
    found = found | {"prefix_sees_turn": True, "prompts_alike": not np.isfinite(float(quality["prompt_spearman"]))}
    world = {k: found[k] for k in SIM_WORLD_KEYS if k in found}
    fit = fit_visibility(sim.SimWorld(group_size=group_size, **world), recorded, quality, warmup_prompts=warm,
                         prefix_share=defaults.prefix_share, selection=selection)
    if fit["type_visibility"] is not None:
        found = found | {"type_visibility": fit["type_visibility"]}
    return found | {"selection": list(selection), "selection_note": note, "feature_spearman": fit["feature_spearman"],
                    "predictor_level_shift": fit["predictor_level_shift"], "warmup_prompts": warm,
                    "recorded_shape": dataclasses.asdict(recorded), "bank_quality": quality, "predictor_fit": fit,
                    "learned_spearman": quality["prompt_spearman"]}


def lengths_by_outcome(bank: Any, min_turns: int, max_turns: int) -> dict[str, tuple[float, ...]]:
    """The lengths of a bank's failed and of its successful roots, as shares of each length
    ``min_turns..max_turns`` (``turn_shares``, ``success_turn_shares``: the simulator's per-episode
    lengths, :mod:`trace_gym.sim.lengths`); an outcome no root had takes the other's lengths."""
    return shares_of_counts(root_length_counts(bank, min_turns, max_turns))


def shares_of_counts(counts: np.ndarray) -> dict[str, tuple[float, ...]]:
    """:func:`lengths_by_outcome` of :func:`root_length_counts`' array (``{}`` where no root has a turn)."""
    fail, win = np.asarray(counts, dtype=float).sum(axis=0)
    if not fail.sum() and not win.sum():
        return {}
    fail, win = (fail if fail.sum() else win), (win if win.sum() else fail)
    return {"turn_shares": tuple(float(x) for x in fail / fail.sum()),
            "success_turn_shares": tuple(float(x) for x in win / win.sum())}


def root_length_counts(bank: Any, min_turns: int, max_turns: int) -> np.ndarray:
    """Each prompt's roots by outcome and length: shape (prompts, 2, lengths), [i, y, l] the roots of
    prompt i with outcome y (0 failed, 1 successful) and ``min_turns + l`` turns (lengths clipped to
    the range; a root of no turn is left out, as in :func:`lengths_by_outcome`)."""
    out = np.zeros((len(bank), 2, max_turns - min_turns + 1))
    for i, record in enumerate(bank):
        for root in record.roots:
            if root["turns"]:
                out[i, int(bool(root["success"])), min(max(len(root["turns"]), min_turns), max_turns) - min_turns] += 1
    return out


def pcl_selection(cfg: Any, n_prompts: int, held_out: int, group_size: int) -> tuple[int, int]:
    """``(pool, picks)`` of a bank bench with ``cfg``'s shape: its candidates per step, and the fixed
    groups of ``group_size`` PCL buys at its nominal budget (:func:`trace_gym.bench.bank.bank_sizes`)."""
    from trace_gym.bench.bank import bank_sizes

    candidates, root_budget, _ = bank_sizes(cfg, n_prompts, held_out)
    return candidates, pcl_picks(root_budget, cfg.continuations_per_root, group_size)
