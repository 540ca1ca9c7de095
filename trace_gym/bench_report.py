"""The printed and plotted report of ``trace-gym bench`` (:mod:`trace_gym.bench`):
one markdown table per mode, warnings, checks, the predictor-target study, the
root-allocation demo, and PNG plots."""

from __future__ import annotations

import math
from typing import Any, Mapping


_COLUMNS: list[tuple[str, str]] = [
    ("effective ratio", "effective_ratio"),
    ("pairs/step", "contrast_pairs"),
    ("pairs/1k tok", "pairs_per_1k_tokens"),
    ("pairs/env step", "pairs_per_env_step"),
    ("mixed/1k tok", "mixed_per_1k_tokens"),
    ("prompts", "distinct_prompts"),
    ("roots/prompt", "rollouts_per_prompt"),
    ("nominal", "nominal_cost"),
    ("gen tokens", "generated_tokens"),
    ("prefill tokens", "prefill_tokens"),
    ("env steps", "env_steps"),
    ("alloc ms", "allocator_ms"),
    ("Spearman prompt", "prompt_spearman"),
]
_SIM_COLUMNS = _COLUMNS + [("Spearman prefix", "prefix_spearman")]
_ENV_COLUMNS = _COLUMNS + [("replayed steps", "replayed_env_steps"), ("errors", "episode_errors"),
                           ("unspent cont.", "unspent_continuations"),
                           ("gen s", "generation_seconds"), ("env s", "environment_seconds"),
                           ("predictor share", "predictor_share"), ("mean reward", "mean_reward")]
_BANK_COLUMNS = _COLUMNS + [("Spearman prefix", "prefix_spearman"), ("exhausted", "exhausted_share"),
                            ("left-out prefixes", "left_out_prefixes"), ("errors", "episode_errors"),
                            ("mean reward", "mean_reward")]


def _applies(results: Mapping[str, Any]) -> str:
    names = results.get("group_sized", [])
    return f"applied to {', '.join(names)}" if names else "applies to no strategy run here"


def format_bench(results: Mapping[str, Any]) -> str:
    """The printed report (markdown): strategy table, checks, and for the simulator the
    root-allocation demo."""
    from trace_gym.report import markdown_table, pm

    cfg = results["config"]
    sim_mode, bank_mode = results["mode"] == "sim", results["mode"] == "bank"
    columns = _SIM_COLUMNS if sim_mode else _BANK_COLUMNS if bank_mode else _ENV_COLUMNS
    reps = cfg["seeds"]
    rows = []
    for name, r in results["strategies"].items():
        cells: list[Any] = [name, r["predictor"], pm(r["effective_ratio"], r["effective_ratio_ci"],
                                                     n=r.get("repetitions"))]
        for _, key in columns[1:]:
            value = r.get(key, math.nan)
            cells.append(f"{100 * value:.1f} %" if key in ("predictor_share", "exhausted_share") else value)
        cells.insert(9, f"{r['rollouts']:.0f} + {r['continuations']:.0f}/2")
        rows.append(cells)
    headers = ["strategy", "predictor", *[c for c, _ in columns]]
    headers.insert(9, "rollouts + cont./2")
    interval = ("mean ± 95 % CI over repetitions ('± 0 (all n equal)': every repetition gave the same value, "
                "no spread to estimate an interval from)" if reps > 1 else
                "one repetition: no confidence interval (repeat with more seeds to tell strategies apart)")
    unit = (f"{'the recorded' if bank_mode else 'exact'} generated tokens (matched to uniform's per step)"
            if cfg.get("budget_unit") == "tokens" else f"{results['nominal_budget']:g} trajectory-equivalents = M (1 + N/2)")
    measured = f"{reps} seeds x {cfg.get('steps', 1) - cfg.get('warmup_steps', 0)} measured steps"
    if sim_mode:
        title = f"## Simulated allocation benchmark ({measured}; {results['seconds']:.1f} s)"
        lines = [title, "", f"Budget per step: {unit}, M = {cfg['root_budget']}, N = {cfg['continuations_per_root']}; "
                 f"{cfg['candidates']} candidates per step; group size {cfg['group_size']} "
                 f"({_applies(results)}). Headline predictor: "
                 f"{cfg['predictor']} (task feature Spearman {cfg['feature_spearman']:g}, prefix share "
                 f"{100 * cfg['prefix_share']:.0f} %); rows marked 'upper bound' use the oracle. "
                 f"Per-step means; effective ratio: {interval}."]
    elif bank_mode:
        bank = results["bank"]
        title = (f"## Allocation benchmark on a rollout bank: {bank['env_id']} with {bank['policy'] or '?'} "
                 f"({measured}; {results['seconds']:.1f} s)")
        lines = [title, "", f"Bank {bank['path']}: {bank['prompts']} prompts, R = {bank['roots']} recorded roots each, "
                 f"K = {bank['continuations']} continuations per recorded prefix (per-root cap "
                 f"{bank['max_prefixes_per_root'] or 'none'}); outcomes replayed without replacement, a request "
                 f"beyond them refused ('exhausted'). Budget per step: {unit}, M = {cfg['root_budget']}, "
                 f"N = {cfg['continuations_per_root']}; {cfg['candidates']} candidates per step; group size "
                 f"{cfg['group_size']} ({_applies(results)}). Headline predictor: {cfg['predictor']} (learned online "
                 f"on the recorded texts); rows marked 'upper bound' use the bank's empirical rates. Spearman: "
                 f"against the bank's empirical rates. Per-step means; effective ratio: {interval}."]
    else:
        title = (f"## Allocation benchmark on real rollouts: {cfg['env']} with {cfg['policy']} "
                 f"({results['engine']}; {reps} repetition(s); {results['seconds']:.0f} s)")
        lines = [title, "", f"Nominal budget per strategy: {results['nominal_budget']:g} trajectory-equivalents = "
                 f"M (1 + N/2) with M = {cfg['root_budget']}, N = {cfg['continuations_per_root']}; "
                 f"{cfg['candidates']} candidates; group size {cfg['group_size']} ({_applies(results)}); "
                 f"predictor: {cfg['predictor']} "
                 f"(warmed up on {cfg['warmup_budget']} rollouts of other tasks). Effective ratio: {interval}."]
    calibration = results.get("calibration")
    if calibration:
        used = ", ".join(f"{k} {v:.4g} (was {calibration['before'][k]:.4g})" for k, v in calibration["values"].items())
        fit = calibration["fitted"]
        kept = "".join(f"; {k} {v!r} kept (set by you)" for k, v in calibration.get("kept", {}).items())
        clipped = " (clipped at its bound)" if fit.get("clipped") else ""
        lines += ["", f"Calibrated from the bank {calibration['bank']}: {used}{kept}; fitted prior "
                  f"Beta({fit['a']:.3g}, {fit['b']:.3g}){clipped}, per-turn variance ratio r = "
                  f"{fit['r'] if fit['r'] is None else round(fit['r'], 4)} (trace_gym/calibrate.py; feature_spearman "
                  "is the learned predictor's measured Spearman, a lower bound of the knob)."]
    if results.get("verdict"):
        lines += ["", f"**Verdict ({'simulated' if sim_mode else 'real rollouts'}):** {results['verdict']}"]
    lines += ["", markdown_table(headers, rows), ""]
    if results.get("warnings"):
        lines += ["### Warnings", "", *[f"- {w}" for w in results["warnings"]], ""]
    lines += ["### Checks", ""]
    lines += [f"{c['status']}: {c['name']} ({c['detail']})" for c in results["checks"]]
    if bank_mode:
        depths = sorted({d for r in results["strategies"].values() for row in r["per_rep"]
                         for d in row.get("prefix_spearman_by_depth", {})}, key=int)
        if depths:
            def by_depth(r: Mapping[str, Any], d: str) -> float:
                values = [row["prefix_spearman_by_depth"].get(d, math.nan) for row in r["per_rep"]]
                values = [v for v in values if not math.isnan(v)]
                return sum(values) / len(values) if values else math.nan

            lines += ["", "### Predictor Spearman against the bank's empirical rates, by prefix depth "
                      "(mean over repetitions; prefixes scored before the predictor trained on them)", ""]
            lines.append(markdown_table(["strategy", "prompt", *[f"depth {d}" for d in depths]],
                                        [[n, r["prompt_spearman"], *[by_depth(r, d) for d in depths]]
                                         for n, r in results["strategies"].items()]))
    if not sim_mode:
        trunc: dict[str, int] = {}
        for r in results["strategies"].values():
            for row in r["per_rep"]:
                for k, v in row.get("truncations", {}).items():
                    trunc[k] = trunc.get(k, 0) + v
        if trunc:
            lines += ["", "Truncated turns/episodes (all strategies): "
                      + ", ".join(f"{k}: {v}" for k, v in sorted(trunc.items()))]
    study = results.get("target_estimators")
    if study:
        lines += ["", "### Predictor targets: recursive mean vs fresh continuations only (error against the true V)", ""]
        study_rows = [[group, est, r[est]["n"], r[est]["bias"], r[est]["rmse"],
                       r[est].get("bias_toward_observed", math.nan), "lower" if r["lower_error"] == est else ""]
                      for group, r in study.items() for est in ("recursive", "fresh")]
        lines.append(markdown_table(["nodes", "estimator", "n", "bias", "RMSE", "bias toward observed", ""],
                                    study_rows))
    demo = results.get("root_allocation_demo")
    if demo:
        lines += ["", "### Root allocation demo (TRACE solve_root, m_i per budget)", ""]
        demo_rows = [[b, *m, sum(m)] for b, m in zip(demo["budgets"], demo["allocations"])]
        lines.append(markdown_table(["budget", *[f"v={v:g}" for v in demo["values"]], "sum"], demo_rows))
    return "\n".join(lines)


def write_bench_plots(results: Mapping[str, Any], out_dir: str) -> list[str]:
    """effective_ratio.png, contrast_pairs_by_depth.png (and root_allocation.png for the
    simulator) in ``out_dir``."""
    from pathlib import Path

    from trace_gym import report

    out = Path(out_dir)
    s = results["strategies"]
    names = list(s)
    uniform = s.get("uniform", {}).get("effective_ratio")
    errors = [0.0 if math.isnan(s[n]["effective_ratio_ci"]) else s[n]["effective_ratio_ci"] for n in names]
    paths = [
        report.plot_bars(names, [s[n]["effective_ratio"] for n in names], errors, out / "effective_ratio.png",
                         ylabel="effective ratio", title="Effective ratio (95 % CI over repetitions)",
                         hline=(2 * uniform, "2 x uniform") if uniform is not None else None),
        report.plot_grouped({n: {int(d): v for d, v in s[n]["contrast_pairs_by_depth"].items()} for n in names},
                            out / "contrast_pairs_by_depth.png", xlabel="anchor depth",
                            ylabel="contrast pairs per step", title="Contrast pairs by anchor depth"),
    ]
    demo = results.get("root_allocation_demo")
    if demo:
        paths.append(report.plot_root_allocation(demo["values"], demo["budgets"], demo["allocations"],
                                                 out / "root_allocation.png"))
    return [str(p) for p in paths]
