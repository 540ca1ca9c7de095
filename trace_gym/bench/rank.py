"""Every arm of a bench ranked, and paired against the baseline and against TRACE.

No arm is the hero here: each is ranked on four measures (:data:`RANKED`) and paired, by
its per-repetition differences, with ``uniform`` and with ``trace`` (whichever of them ran):

- the two headline metrics, the *effective ratio* (share of a step's prompts whose tree
  is mixed: what a fixed group size optimises) and *mixed prompts per step* (what TRACE's
  root objective maximises);
- *tokens to target*: the exact generated tokens until the arm has collected
  ``mixed_groups_target`` mixed groups (what Pilot-Commit and marin report: budget to a
  target; lower is better; counted at the end of each wave, NaN when never reached);
- *effective samples per unit*: the budget (roots 1, continuations 1/2) that sits in mixed
  trees, per unit spent. Of the measures the papers report, it alone credits more rollouts
  on a prompt that is already mixed (Knapsack RL's effective-gradient ratio; with a fixed
  group size it is CERO's effective-group rate): a mixed group counts once in the first
  three, whatever its size, so pilot-then-commit and knapsack budgets look like waste there.
  Its credit is linear (one mixed prompt soaking up the budget scores 1), which the mixed
  prompts per step expose, so the two are read together.

Beside them: waves per step (rounds of generation latency) and exact generated tokens.
:func:`ranking` builds the table (JSON-ready), :func:`ranking_section` prints it and
:func:`plot_ranking` draws ``ranking.png`` (each measure with its interval) and
``paired.png`` (each arm minus uniform and minus TRACE, with their intervals).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from trace_gym.bench.checks import METRICS, Metric, interval_text, paired

#: The measures every arm is ranked on: (metric, higher is better).
RANKED: tuple[tuple[Metric, bool], ...] = (
    (METRICS["effective_ratio"], True),
    (METRICS["mixed_prompts"], True),
    (Metric("tokens_to_target", "tokens to target", 0.0), False),
    (Metric("effective_samples_per_unit", "effective samples/unit", 0.0, 1.0), True),
)
#: The arms every arm is paired with, where they ran.
REFERENCES = ("uniform", "trace")


def _finite_rows(rows: Mapping[str, Any], a: str, b: str, key: str) -> tuple[dict[str, Any], int]:
    """Rows ``a`` and ``b`` cut to the repetitions where both have a finite ``key`` (the
    budget-to-target metric is NaN where the target was not reached); and how many were cut."""
    pairs = [(x, y) for x, y in zip(rows[a]["per_rep"], rows[b]["per_rep"])
             if math.isfinite(float(x.get(key, math.nan))) and math.isfinite(float(y.get(key, math.nan)))]
    cut = {n: {**rows[n], "per_rep": [p[i] for p in pairs],
               key: (sum(float(p[i][key]) for p in pairs) / len(pairs)) if pairs else math.nan}
           for i, n in enumerate((a, b))}
    return cut, len(rows[a]["per_rep"]) - len(pairs)


def paired_any(rows: Mapping[str, Any], a: str, b: str, metric: Metric) -> dict[str, Any] | None:
    """:func:`~trace_gym.bench.checks.paired` over the repetitions where both arms have a
    value (``dropped`` says how many had none); ``None`` when no repetition has both."""
    cut, dropped = _finite_rows(rows, a, b, metric.key)
    if not cut[a]["per_rep"]:
        return None
    return {**paired(cut, a, b, metric), "dropped": dropped}


def _ranks(values: Mapping[str, float], higher: bool) -> dict[str, float]:
    """1 for the best; ties share the mean of their places; NaN ranks last."""
    order = sorted(values, key=lambda n: (math.isnan(values[n]), -values[n] if higher else values[n]))
    ranks: dict[str, float] = {}
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for n in order[i:j + 1]:
            ranks[n] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def ranking(results: Mapping[str, Any]) -> dict[str, Any]:
    """Every headline arm's value and rank on each :data:`RANKED` measure, its mean rank, and
    its paired differences with each of :data:`REFERENCES` that ran (JSON-ready)."""
    from trace_gym.bench.checks import headline_rows

    rows = headline_rows(results)
    ranked = [(m, hi) for m, hi in RANKED if all(m.key in r for r in rows.values())]
    ranks = {m.key: _ranks({n: float(r.get(m.key, math.nan)) for n, r in rows.items()}, hi) for m, hi in ranked}
    table = []
    for name, row in rows.items():
        entry = {"arm": name, "predictor": row["predictor"], "waves_per_step": row.get("waves_per_step", math.nan),
                 "generated_tokens": row["generated_tokens"],
                 "values": {m.key: row.get(m.key, math.nan) for m, _ in ranked},
                 "cis": {m.key: row.get(m.key + "_ci", math.nan) for m, _ in ranked},
                 "ranks": {m.key: ranks[m.key][name] for m, _ in ranked}}
        entry["mean_rank"] = sum(entry["ranks"].values()) / max(len(ranked), 1)
        table.append(entry)
    table.sort(key=lambda e: (e["mean_rank"], e["arm"]))
    wanted = [(n, ref) for n in rows for ref in REFERENCES if ref in rows and ref != n]
    wanted = [(a, b) for a, b in wanted if not (a in REFERENCES and (b, a) in wanted and REFERENCES.index(a) < REFERENCES.index(b))]
    pairs = [{"a": a, "b": b, **{m.key: paired_any(rows, a, b, m) for m, _ in ranked}} for a, b in wanted]
    return {"metrics": [{"key": m.key, "label": m.label, "higher_is_better": hi} for m, hi in ranked],
            "target": results["config"].get("mixed_groups_target"), "rows": table, "paired": pairs}


def _cell(value: float, rank: float, digits: int = 3) -> str:
    if math.isnan(value):
        return "not reached"
    shown = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}f}"
    return f"{shown} (#{rank:g})"


def ranking_section(results: Mapping[str, Any], methods: Mapping[str, str] | None = None) -> list[str]:
    """The ranking and the paired table against uniform and TRACE, as markdown lines
    (``methods``: arm name -> what it stands for, a column beside the arm's name)."""
    from trace_gym.report import markdown_table

    rank = results.get("ranking")
    if not rank or not rank["rows"]:
        return []
    metrics = rank["metrics"]
    labels = [m["label"] + (f" ({rank['target']} mixed)" if m["key"] == "tokens_to_target" else "")
              for m in metrics]
    cited = [] if methods is None else ["method"]
    rows = [[e["arm"], *([methods.get(e["arm"], "")] if methods is not None else []), e["predictor"],
             *[_cell(e["values"][m["key"]], e["ranks"][m["key"]]) for m in metrics],
             f"{e['mean_rank']:.2f}", f"{e['waves_per_step']:.2f}", f"{e['generated_tokens']:,.0f}"] for e in rank["rows"]]
    lines = ["### Ranking (every arm; # = rank on that measure, 1 best; no arm is the method here)", "",
             markdown_table(["arm", *cited, "predictor", *labels, "mean rank", "waves/step", "gen tokens/step"], rows),
             ""]
    if rank["paired"]:
        def cell(p: Mapping[str, Any] | None) -> str:
            if p is None:
                return "no repetition has both"
            note = f"; {p['dropped']} repetition(s) without it dropped" if p.get("dropped") else ""
            return {1: "above: ", -1: "below: ", 0: ""}[p["shown"]] + interval_text(p).split(" (95 %")[0] + note

        body = [[f"{p['a']} - {p['b']}", *[cell(p.get(m["key"])) for m in metrics]] for p in rank["paired"]]
        lines += ["### Every arm paired with uniform and with TRACE (difference [95 % interval] over paired "
                  "repetitions; 'above'/'below' when it excludes 0)", "",
                  markdown_table(["pair", *[m["label"] for m in metrics]], body), ""]
    return lines


def plot_ranking(results: Mapping[str, Any], out_dir: str | Path) -> list[str]:
    """``ranking.png`` and ``paired.png`` in ``out_dir`` (nothing when there is no ranking)."""
    from trace_gym.report import pyplot, save_figure

    rank = results.get("ranking")
    if not rank or not rank["rows"]:
        return []
    plt = pyplot()
    out, metrics, rows = Path(out_dir), rank["metrics"], rank["rows"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 0.45 * len(rows) + 1.6), sharey=True)
    names = [e["arm"] for e in rows]
    for ax, m in zip(axes, metrics):
        vals = [e["values"][m["key"]] for e in rows]
        errs = [0.0 if not math.isfinite(e["cis"][m["key"]]) else e["cis"][m["key"]] for e in rows]
        ax.barh(range(len(rows)), [v if math.isfinite(v) else 0 for v in vals], xerr=errs, color="#5b8db8")
        ax.set_title(m["label"] + (" (lower better)" if not m["higher_is_better"] else ""), fontsize=9)
        ax.set_yticks(range(len(rows)), names, fontsize=8)
    axes[0].invert_yaxis()
    paths = [save_figure(plt, fig, out / "ranking.png")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 0.4 * len(rank["paired"]) + 1.6),
                             sharey=True)
    labels = [f"{p['a']} - {p['b']}" for p in rank["paired"]]
    for ax, m in zip(axes, metrics):
        for y, p in enumerate(rank["paired"]):
            d = p.get(m["key"])
            if d is not None and math.isfinite(d["difference"]):
                color = {1: "#2a7f2a", -1: "#b03030", 0: "#777777"}[d["shown"]]
                ax.errorbar(d["difference"], y, xerr=[[d["difference"] - d["low"]], [d["high"] - d["difference"]]],
                            fmt="o", color=color, capsize=2, markersize=3)
        ax.axvline(0, color="black", linewidth=0.6)
        ax.set_title(m["label"], fontsize=9)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
    axes[0].invert_yaxis()
    paths.append(save_figure(plt, fig, out / "paired.png"))
    return [str(p) for p in paths]
