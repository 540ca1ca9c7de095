"""A training step's ``metrics.jsonl`` line and its one-line summary (``docs/training.md``
lists every field); pure functions of the step's batch, update and timings."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np


def _finite(value: Any) -> Any:
    """NaN / inf -> None, recursively, so metrics lines are strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def is_timing_key(key: str) -> bool:
    """Whether a ``metrics.jsonl`` key holds wall-clock time, the one kind of field that differs
    between two runs of one config and seed in deterministic mode: a key named ``seconds`` or
    ending in ``_seconds`` (``seconds`` by phase, ``step_seconds``, an evaluation's ``seconds``).

    >>> [k for k in ("seconds", "step_seconds", "policy/loss", "seconds_left") if is_timing_key(k)]
    ['seconds', 'step_seconds']
    """
    return key == "seconds" or key.endswith("_seconds")


def without_timings(record: Any) -> Any:
    """``record`` without its timing keys (:func:`is_timing_key`), at every depth."""
    if isinstance(record, dict):
        return {k: without_timings(v) for k, v in record.items() if not is_timing_key(k)}
    if isinstance(record, list):
        return [without_timings(v) for v in record]
    return record


def step_record(step: int, batch: Any, update: Mapping[str, float], predictor_stats: Mapping[str, Any],
                sync_seconds: float, evaluation: Mapping[str, Any] | None, seconds: float,
                token_trees: Sequence[Any], eval_seconds: float = 0.0,
                cpu_threads: int | None = None) -> dict[str, Any]:
    """One ``metrics.jsonl`` line (see ``docs/training.md`` for every field); ``cpu_threads``:
    the process's CPU thread count (omitted when ``None``)."""
    from trace_gym import report

    trees, led = batch.trees, batch.ledger
    leaves = [leaf for t in trees for leaf in t.leaves()]
    chosen = np.flatnonzero(batch.root_counts)
    prompt_rho = report.spearman(batch.values[chosen], [t.targets(outcomes=True).get(0, math.nan) for t in trees]) \
        if len(trees) > 2 else math.nan
    pred, emp = [], []
    for ti, node, value in batch.prefix_predictions:
        target = trees[ti].targets(outcomes=True).get(node)
        if target is not None:
            pred.append(value)
            emp.append(target)
    cached = sum(int(n.info.get("cached_tokens") or 0) for t in trees for n in t.nodes[1:])
    phases = dict(led.seconds)
    phases["policy_update"] = float(update.get("seconds", 0.0))
    phases["weight_sync"] = float(sync_seconds)
    if evaluation is not None:
        phases["eval"] = float(eval_seconds)
    nonzero = sum(1 for tt in token_trees for n in tt.nodes if any(a != 0.0 for _, a in n.terms))
    record: dict[str, Any] = {
        "step": step,
        "reward": float(np.mean([leaf.reward for leaf in leaves])) if leaves else math.nan,
        "accuracy": float(np.mean([leaf.success for leaf in leaves])) if leaves else math.nan,
        "effective_ratio": report.effective_ratio(trees),
        "contrast_pairs_by_depth": {str(d): c for d, c in report.contrast_pairs_by_depth(trees).items()},
        "prompts": len(trees),
        "rollouts": led.rollouts,
        "continuations": led.continuations,
        "nominal_budget": led.nominal,
        "generated_tokens": led.generated_tokens,
        "prefill_tokens_uncached": led.prefill_tokens,
        "prefill_tokens_cached": cached,
        "env_steps": led.env_steps,
        "episode_errors": led.errors,
        "unspent_continuations": led.unspent_continuations,
        "fallback_first": bool(batch.fallback_first),
        "prefixes_seen": int(batch.prefixes_seen),
        "truncations": dict(batch.extras.get("truncations") or {}),
        "predictor_spearman_prompt": prompt_rho,
        "predictor_spearman_prefix": report.spearman(pred, emp) if len(pred) > 2 else math.nan,
        "predictor_loss": float(predictor_stats.get("loss", math.nan)) if predictor_stats else math.nan,
        "nodes_with_advantage": nonzero,
        "seconds": phases,
        "step_seconds": seconds,
    }
    if cpu_threads is not None:
        record["cpu_threads"] = int(cpu_threads)
    record.update({f"policy/{k}": v for k, v in update.items() if k != "seconds"})
    if evaluation is not None:
        record["eval"] = {k: v for k, v in evaluation.items() if isinstance(v, (int, float, str))}
    return _finite(record)


def summary_line(record: Mapping[str, Any], steps: int) -> str:
    """The one-line per-step summary printed under the progress bar."""
    s = record["seconds"]
    predictor = s.get("predictor_scoring", 0.0) + s.get("predictor_update", 0.0)
    num = lambda key: math.nan if record.get(key) is None else record[key]  # noqa: E731
    line = (f"step {record['step']}/{steps} | reward {num('reward'):.3f} | effective {num('effective_ratio'):.2f} "
            f"| {record['rollouts']}+{record['continuations']}/2 = {record['nominal_budget']:g} nominal, "
            f"{record['generated_tokens']} gen tok | gen {s.get('generation', 0):.0f}s env {s.get('environment', 0):.0f}s "
            f"pred {predictor:.1f}s update {s['policy_update']:.0f}s sync {s['weight_sync']:.1f}s")
    if "eval" in record:
        line += f" | eval acc {record['eval'].get('accuracy') or math.nan:.3f}"
    return line
