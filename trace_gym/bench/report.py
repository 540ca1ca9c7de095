"""The printed and plotted report of ``trace-gym bench`` (:mod:`trace_gym.bench.loop`).

In print order: the title and what the budget, predictor and warm-up were (the mode's
own ``intro`` and columns, :mod:`trace_gym.bench.modes`),
the verdict, the strategy table (headline metrics first), the paired differences
(every strategy against the baseline and the method, with the reason when two rows are
identical), the per-step curve, the predictor's quality where it is used, warnings,
checks, and each mode's extra sections (prefix Spearman by depth, the predictor-target
study, the root-allocation demo). PNG plots: :func:`write_bench_plots`.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from trace_gym.bench.checks import HEADLINE, Check, interval_text
from trace_gym.bench.modes import bench_mode
from trace_gym.step.learning import brief_repeats
from trace_gym.bench.rank import plot_ranking, ranking_section
from trace_gym.predictor.quality import QUALITY_KEYS

_COLUMNS: list[tuple[str, str]] = [
    ("effective ratio", "effective_ratio"),
    ("mixed/step", "mixed_prompts"),
    ("mixed/1k tok", "mixed_per_1k_tokens"),
    ("pairs/step", "contrast_pairs"),
    ("pairs/1k tok", "pairs_per_1k_tokens"),
    ("pairs/env step", "pairs_per_env_step"),
    ("prompts", "distinct_prompts"),
    ("roots/prompt", "rollouts_per_prompt"),
    ("nominal", "nominal_cost"),
    ("gen tokens", "generated_tokens"),
    ("prefill tokens", "prefill_tokens"),
    ("env steps", "env_steps"),
    ("alloc ms", "allocator_ms"),
    ("waves/step", "waves_per_step"),
]
_PERCENT = ("predictor_share", "exhausted_share")
_QUALITY_LABELS = {"prompt_spearman": "Spearman", "mixed_auc": "AUC mixed", "brier": "Brier",
                   "level_error": "level error"}


def applies_to(results: Mapping[str, Any]) -> str:
    """Which strategies the group-size knob reached, for a mode's description."""
    names = results.get("group_sized", [])
    return f"applied to {', '.join(names)}" if names else "applies to no strategy run here"


def interval_note(results: Mapping[str, Any]) -> str:
    """What the effective ratio's interval is, for a mode's description."""
    if results["config"]["seeds"] > 1:
        return ("mean ± 95 % CI over repetitions, cut to [0, 1] ('± 0 (all n equal)': every repetition gave the "
                "same value, no spread to estimate an interval from)")
    return "one repetition: no confidence interval (repeat with more seeds to tell strategies apart)"


def budget_note(results: Mapping[str, Any]) -> str:
    """What was equalised across strategies, for a mode's description."""
    cfg = results["config"]
    if cfg.get("budget_unit") == "tokens":
        return (f"{'the recorded' if results['mode'] == 'bank' else 'exact'} generated tokens (matched to "
                f"{results.get('roles', {}).get('baseline', 'uniform')}'s per step)")
    return f"{results['nominal_budget']:g} trajectory-equivalents = M (1 + N/2)"


def strategy_table(results: Mapping[str, Any]) -> str:
    """One row per arm: the headline metrics (the effective ratio with its interval) and the mode's columns."""
    from trace_gym.report import markdown_table, pm

    columns = _COLUMNS + list(bench_mode(results["mode"]).columns)
    rows = []
    for name, r in results["strategies"].items():
        cells: list[Any] = [name, r["predictor"], pm(r["effective_ratio"], r["effective_ratio_ci"],
                                                     n=r.get("repetitions"), low=0.0, high=1.0)]
        for _, key in columns[1:]:
            value = r.get(key, math.nan)
            cells.append(f"{100 * value:.1f} %" if key in _PERCENT else value)
        cells.insert(11, f"{r['rollouts']:.0f} + {r['continuations']:.0f}/2")
        rows.append(cells)
    headers = ["strategy", "predictor", *[c for c, _ in columns]]
    headers.insert(11, "rollouts + cont./2")
    return markdown_table(headers, rows)


def paired_section(results: Mapping[str, Any]) -> list[str]:
    """The paired differences, one row per pair, one column per headline metric."""
    from trace_gym.report import markdown_table

    table = results.get("paired") or []
    if not table:
        return []
    words = {1: "shown above", -1: "shown below", 0: "not shown"}

    def cell(p: Mapping[str, Any] | None) -> str:
        return "no contrast" if p is None else f"{interval_text(p)}: {words[p['shown']]}"

    rows = [[f"{e['a']} - {e['b']}", *[cell(e[m.key]) for m in HEADLINE]] for e in table]
    lines = ["### Paired differences (a - b over repetitions; 'shown' when the 95 % interval excludes 0)", "",
             markdown_table(["pair", *[m.label for m in HEADLINE]], rows)]
    same = [e["identical"] for e in table if e["identical"]]
    return lines + ([""] + [f"- {s}" for s in same] if same else [])


def step_section(results: Mapping[str, Any]) -> list[str]:
    """Per step, each arm's effective ratio and mixed prompts (means over repetitions)."""
    from trace_gym.report import markdown_table

    curves = {n: r.get("by_step", []) for n, r in results["strategies"].items()}
    steps = max((len(c) for c in curves.values()), default=0)
    if steps == 0:
        return []
    label = lambda p: f"step {p['step']}" + ("" if p["measured"] else " (not measured)")  # noqa: E731
    first = next(c for c in curves.values() if c)
    headers = ["strategy", *[label(p) for p in first]]
    rows = [[n, *[f"{p['effective_ratio']:.3f} / {p['mixed_prompts']:.2f}" for p in c]] for n, c in curves.items()
            if len(c) == steps]
    return ["### Per-step curve (effective ratio / mixed prompts per step, mean over repetitions)", "",
            markdown_table(headers, rows)]


def quality_section(results: Mapping[str, Any]) -> list[str]:
    """Each arm's predictor where it is used: pooled over the measured steps, and per step (AUC)."""
    from trace_gym.report import markdown_table

    s = results["strategies"]
    if not any("mixed_auc" in r for r in s.values()):
        return []
    steps = max((len(r.get("by_step", [])) for r in s.values()), default=0)
    headers = ["strategy", *[_QUALITY_LABELS[k] for k in QUALITY_KEYS], *[f"AUC step {i}" for i in range(steps)]]
    rows = [[n, *[r.get(k, math.nan) for k in QUALITY_KEYS],
             *[p.get("mixed_auc", math.nan) for p in r.get("by_step", [])]]
            for n, r in s.items() if len(r.get("by_step", [])) == steps]
    return ["### Predictor quality where it is used (each arm's own predictor, on its candidates before it "
            "trained on them; pooled over the measured steps, then the mixed-vs-pure AUC per step)", "",
            "Spearman: prompt level; AUC mixed: of -|v - 0.5| separating prompts whose group is mixed from pure "
            "ones (0.5: no information); Brier: against the outcomes (floor: the mean p (1 - p)); level error: "
            "mean predicted minus mean true rate.", "", markdown_table(headers, rows)]


def results_json(results: Mapping[str, Any]) -> str:
    """``results`` (of a bench, a sweep or a pairing) as the JSON ``--json`` writes: each
    :class:`~trace_gym.bench.checks.Check` as ``{"name", "status", "detail"}``."""
    def record(obj: Any) -> Any:
        if isinstance(obj, Check):
            return obj.to_json()
        raise TypeError(f"a bench result holds a {type(obj).__name__}, which JSON cannot hold: {obj!r}")

    return json.dumps(results, indent=2, default=record)


def format_bench(results: Mapping[str, Any]) -> str:
    """The printed report (markdown), in the order of the module docstring."""
    mode = bench_mode(results["mode"])
    lines = mode.intro(results)
    warmup = results.get("warmup")
    if isinstance(warmup, Mapping) and warmup.get("description"):
        lines += ["", f"Warm-up: {warmup['description']}."]
    lines += _calibration(results)
    if results.get("deterministic"):  # how the repetitions ran (deterministic=false: no line)
        lines += ["", f"Run in {results['deterministic']} (each repetition a function of its seed)."]
    if results.get("verdict"):
        lines += ["", f"**Verdict ({mode.verdict_label}):** {results['verdict']}"]
    for name, why in (results.get("violations") or {}).items():
        lines += ["", f"**NO VERDICT for {name}:** {why}"]
    lines += ["", strategy_table(results), ""]
    for section in (paired_section, ranking_section, step_section, quality_section):
        part = section(results)
        lines += part + ([""] if part else [])
    if results.get("warnings"):
        lines += ["### Warnings", "", *[f"- {w}" for w in brief_repeats(results["warnings"])], ""]
    lines += ["### Checks", ""]
    lines += [c.line() for c in results["checks"]]
    for section in (_depth_section, _continuation_section, _truncations, _target_study, _root_demo):
        lines += section(results)
    return "\n".join(lines)


def _calibration(results: Mapping[str, Any]) -> list[str]:
    calibration = results.get("calibration")
    if not calibration:
        return []
    def num(v: Any) -> str:
        if isinstance(v, (list, tuple)):  # per-episode length shares
            return "(" + ", ".join(f"{x:.3g}" for x in v) + ")"
        return "unset" if v is None else f"{v:.4g}"

    used = ", ".join(f"{k} {num(v)} (was {num(calibration['before'][k])})" for k, v in calibration["values"].items())
    fit = calibration["fitted"]
    kept = "".join(f"; {k} {v!r} kept (set by you)" for k, v in calibration.get("kept", {}).items())
    clipped = " (clipped at its bound)" if fit.get("clipped") else ""
    prior = f"Beta({fit['a']:.3g}, {fit['b']:.3g}){clipped}"
    if fit.get("kinds"):  # one Beta per task kind; the single Beta is what the counts give without them
        prior = f"one Beta per task kind ({len(fit['kinds'])} kinds; all together {prior})"
    return ["", f"Calibrated from the bank {calibration['bank']}: {used}{kept}; fitted prior "
            f"{prior}, per-turn variance ratio r = "
            f"{fit['r'] if fit['r'] is None else round(fit['r'], 4)} (trace_gym/sim/calibrate.py; "
            f"{calibration.get('spearman_note', 'feature_spearman is the learned predictor measured Spearman')})."]


def _depth_section(results: Mapping[str, Any]) -> list[str]:
    from trace_gym.report import markdown_table

    if results["mode"] != "bank":
        return []
    depths = sorted({d for r in results["strategies"].values() for row in r["per_rep"]
                     for d in row.get("prefix_spearman_by_depth", {})}, key=int)
    if not depths:
        return []

    def by_depth(r: Mapping[str, Any], d: str) -> float:
        values = [row["prefix_spearman_by_depth"].get(d, math.nan) for row in r["per_rep"]]
        values = [v for v in values if not math.isnan(v)]
        return sum(values) / len(values) if values else math.nan

    return ["", "### Predictor Spearman against the bank's empirical rates, by prefix depth "
            "(mean over repetitions; prefixes scored before the predictor trained on them)", "",
            markdown_table(["strategy", "prompt", *[f"depth {d}" for d in depths]],
                           [[n, r.get("prompt_spearman", math.nan), *[by_depth(r, d) for d in depths]]
                            for n, r in results["strategies"].items()])]


def _continuation_section(results: Mapping[str, Any]) -> list[str]:
    """Where each strategy spent its continuations: per step, by the depth of the prefix they started from,
    with their successes (a strategy that continued nothing is left out)."""
    from trace_gym.report import markdown_table

    rows = {n: r for n, r in results["strategies"].items() if any(r.get("continuations_by_depth", {}).values())}
    depths = sorted({d for r in rows.values() for d in r["continuations_by_depth"]}, key=int)
    if not depths:
        return []

    def cell(r: Mapping[str, Any], d: str) -> str:
        n, wins = r["continuations_by_depth"].get(d, 0.0), r.get("continuation_wins_by_depth", {}).get(d, 0.0)
        return f"{n:.2f} ({wins:.2f})"

    return ["", "### Continuations by prefix depth (per step, mean over repetitions; their successes in brackets)",
            "", markdown_table(["strategy", *[f"depth {d}" for d in depths]],
                               [[n, *[cell(r, d) for d in depths]] for n, r in rows.items()])]


def _truncations(results: Mapping[str, Any]) -> list[str]:
    if results["mode"] == "sim":
        return []
    trunc: dict[str, int] = {}
    for r in results["strategies"].values():
        for row in r["per_rep"]:
            for k, v in row.get("truncations", {}).items():
                trunc[k] = trunc.get(k, 0) + v
    return ["", "Truncated turns/episodes (all strategies): "
            + ", ".join(f"{k}: {v}" for k, v in sorted(trunc.items()))] if trunc else []


def _target_study(results: Mapping[str, Any]) -> list[str]:
    from trace_gym.report import markdown_table

    study = results.get("target_estimators")
    if not study:
        return []
    rows = [[group, est, r[est]["n"], r[est]["bias"], r[est]["rmse"], r[est].get("bias_toward_observed", math.nan),
             "lower" if r["lower_error"] == est else ""] for group, r in study.items() for est in ("recursive", "fresh")]
    return ["", "### Predictor targets: recursive mean vs fresh continuations only (error against the true V)", "",
            markdown_table(["nodes", "estimator", "n", "bias", "RMSE", "bias toward observed", ""], rows)]


def _root_demo(results: Mapping[str, Any]) -> list[str]:
    from trace_gym.report import markdown_table

    demo = results.get("root_allocation_demo")
    if not demo:
        return []
    rows = [[b, *m, sum(m)] for b, m in zip(demo["budgets"], demo["allocations"])]
    return ["", "### Root allocation demo (TRACE solve_root, m_i per budget)", "",
            markdown_table(["budget", *[f"v={v:g}" for v in demo["values"]], "sum"], rows)]


def write_bench_plots(results: Mapping[str, Any], out_dir: str) -> list[str]:
    """effective_ratio.png, contrast_pairs_by_depth.png (and root_allocation.png for the
    simulator) in ``out_dir``."""
    from pathlib import Path

    from trace_gym import report

    out = Path(out_dir)
    s = results["strategies"]
    names = list(s)
    base = results.get("roles", {}).get("baseline", "uniform")
    reference = s.get(base, {}).get("effective_ratio")
    errors = [0.0 if math.isnan(s[n]["effective_ratio_ci"]) else s[n]["effective_ratio_ci"] for n in names]
    paths = [
        report.plot_bars(names, [s[n]["effective_ratio"] for n in names], errors, out / "effective_ratio.png",
                         ylabel="effective ratio", title="Effective ratio (95 % CI over repetitions)",
                         hline=(2 * reference, f"2 x {base}") if reference is not None else None),
        report.plot_grouped({n: {int(d): v for d, v in s[n]["contrast_pairs_by_depth"].items()} for n in names},
                            out / "contrast_pairs_by_depth.png", xlabel="anchor depth",
                            ylabel="contrast pairs per step", title="Contrast pairs by anchor depth"),
    ]
    paths += plot_ranking(results, out)
    demo = results.get("root_allocation_demo")
    if demo:
        paths.append(report.plot_root_allocation(demo["values"], demo["budgets"], demo["allocations"],
                                                 out / "root_allocation.png"))
    return [str(p) for p in paths]
