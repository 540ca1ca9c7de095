"""A learned predictor read where it is used: step by step, inside a bench (issue 45, item 4).

What a value-reading selector (PCL, TRACE's root stage) meets is the predictor *in the bench*:
warmed on the held-out slice, then learning from each step's rollouts. :func:`arm_samples` runs one
arm of a bench source (bank or simulator alike) and keeps, per measured step, its predictor's prompt
predictions on the step's candidates (made before it trained on them) with their truth. Read on the
uniform arm, whose rollouts do not depend on the predictor, two runs that differ only in the
predictor meet the same candidates and outcomes (common random numbers), and an offset added to the
predictions afterwards is what the run would have predicted with it.

The calibrated simulator chooses among its start-of-step fits by it and then solves its level and
feature on it (``in_bench`` of :func:`trace_gym.bench.sim_calibration.bank_fit`,
:mod:`trace_gym.bench.in_bench_fit`). What the uniform arm cannot show is how a predictor learns from
the prompts PCL buys: the bank's embedding predictor picked worse after learning from them than from
the uniform arm's on the math bank (fit 8, docs/benchmarking.md), the simulated one does not.

:func:`arm_prefix_spearman` reads the prefix predictor so, on an arm that picks its prefixes without it
(random tree): the bench's own ``prefix_spearman`` per repetition.

The truth is each candidate's success rate and the probability that a group of G is mixed: fresh
draws in the simulator (:func:`~trace_gym.predictor.quality.mixed_probability`), on a bank a
group drawn without replacement from its recorded roots, as the bank bench draws one
(:func:`~trace_gym.predictor.quality.drawn_group_mixed`).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from trace_gym.bench.sim_fit import StartSample


def arm_runs(source: Any, strategy: Any, arm: str) -> Iterator[tuple[Any, Any, list[Any]]]:
    """Per repetition of ``source`` (a :class:`~trace_gym.bench.loop.BenchSource`), ``strategy`` run as the
    arm ``arm`` over every step, as the bench runs it: ``(repetition, arm, measured step results)``."""
    from trace_gym.step.strategy_boundary import StrategyPlay

    target = source.arms({arm: strategy})[arm]
    for r in range(source.repetitions):
        rep = source.repetition(r)
        predictor, rng = rep.predictor(target), rep.rng(target)
        play = StrategyPlay.start(arm, target.strategy)
        measured = []
        for step in range(source.steps):
            counted = step >= source.warmup_steps
            play.step = step
            result = rep.step(target, rep.candidates(step), predictor, source.nominal_budget, rng, measured=counted,
                              play=play)
            if counted:
                measured.append(result)
        yield rep, target, measured


def arm_samples(source: Any, strategy: Any, *, arm: str = "uniform") -> list[StartSample]:
    """Per repetition and measured step of ``source`` (a :class:`~trace_gym.bench.loop.BenchSource`),
    ``strategy`` run as the arm ``arm``: its predictor's prompt logits on the step's candidates and
    their truth (:class:`~trace_gym.bench.sim_fit.StartSample`; the logit of each value, clipped to
    [1e-9, 1 - 1e-9]). Shapes per sample: (candidates,)."""
    from trace_gym.bench.loop import truth_values
    from trace_gym.predictor.quality import drawn_group_mixed

    group_size = int(source.config.group_size)
    out: list[StartSample] = []
    for _, _, steps in arm_runs(source, strategy, arm):
        for result in steps:
            truth = result.extras["truth"]
            records = result.extras.get("records")
            if records is not None:  # a bank: a group drawn from the recorded roots
                wins = np.array([sum(r.outcomes()) for r in records], dtype=int)
                trials = np.array([len(r.outcomes()) for r in records], dtype=int)
                mixed = drawn_group_mixed(wins, trials, group_size)
            else:
                mixed = np.asarray(truth[1], dtype=float)
            values = np.clip(np.asarray(truth_values(result), dtype=float), 1e-9, 1 - 1e-9)
            out.append(StartSample(np.log(values) - np.log1p(-values), np.asarray(truth[0], dtype=float), mixed))
    return out


def arm_prefix_spearman(source: Any, strategy: Any, *, arm: str = "random_tree",
                        key: str = "prefix_spearman") -> float:
    """The prefix predictor read where TRACE's second stage reads it: ``strategy`` run as the arm ``arm`` of
    ``source``, the mean over repetitions of the bench's own ``key`` (``prefix_spearman`` over every prefix, or
    ``prefix_spearman_within`` within a depth: :func:`trace_gym.report.spearman_within`; the source's
    ``measure``: on a bank against each prefix's recorded continuations, in a simulator calibrated to one
    against as many fresh ones). Read on an arm that picks its prefixes without the predictor (random
    tree), it is what the predictor knows of the prefixes a strategy may choose among, not of the ones it
    chose. NaN where no repetition scored two prefixes."""
    values = [rep.measure(target, steps)[key] for rep, target, steps in arm_runs(source, strategy, arm)]
    finite = [float(v) for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")
