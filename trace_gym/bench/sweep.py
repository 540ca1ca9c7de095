"""``trace-gym bench --root-budgets 8,16,32``: one bench per root budget, a table and a PNG per metric.

The same bench (mode, strategies, seeds, warm-up) runs at each root budget M, every
other key as given; the budget per step is M (1 + N/2) for every strategy as in a
single bench. The results keep each budget's full bench result, and the report prints,
per headline metric, strategies as rows and budgets as columns (mean ± 95 % CI over
repetitions), then each budget's verdict. ``--out DIR`` writes ``budget_<metric>.png``:
strategies as lines, their 95 % intervals as bands, upper bounds included and labelled.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from trace_gym.bench.checks import HEADLINE


def parse_budgets(text: str) -> tuple[int, ...]:
    """``"8,16,32"`` -> ``(8, 16, 32)``; ValueError naming a bad item (each an integer in
    ``root_budget``'s declared range, written in ASCII digits; no repeats)."""
    from trace_gym.utils.config_fields import shown
    from trace_gym.config_sections import BudgetShape

    within = BudgetShape.__dataclass_fields__["root_budget"].metadata["within"]
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        # isdigit() alone accepts "²", which int() refuses; 20 digits keep int() cheap (the range is smaller)
        if not (item.isascii() and item.isdigit() and len(item) <= 20) or int(item) not in within:
            raise ValueError(f"--root-budgets: expected integers in {within} (root_budget's range) separated by "
                             f"commas, got {shown(item)}")
        out.append(int(item))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"--root-budgets: expected distinct root budgets, got {text!r}")
    return tuple(sorted(out))


def run_sweep(cfg: Any, budgets: Sequence[int], run: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """``run(cfg with root_budget=M)`` for each M of ``budgets``; returns ``{"root_budgets", "benches"}``."""
    return {"root_budgets": list(budgets),
            "benches": [run(dataclasses.replace(cfg, root_budget=int(m))) for m in budgets]}


def metric_curves(sweep: Mapping[str, Any], key: str) -> dict[str, tuple[list, list, list]]:
    """Per strategy: ``(means, lows, highs)`` of ``key`` over the sweep's budgets (the interval cut to
    what the metric can take; NaN where a bench had no interval or lacked the strategy)."""
    from trace_gym.bench.checks import METRICS
    from trace_gym.report import bounded_interval

    metric = METRICS[key]
    names = list(dict.fromkeys(n for b in sweep["benches"] for n in b["strategies"]))
    out: dict[str, tuple[list, list, list]] = {}
    for name in names:
        means, lows, highs = [], [], []
        for bench in sweep["benches"]:
            row = bench["strategies"].get(name)
            mean, half = (row[key], row[key + "_ci"]) if row else (math.nan, math.nan)
            lo, hi = bounded_interval(mean, half, metric.low, metric.high)
            means.append(mean)
            lows.append(lo)
            highs.append(hi)
        out[name] = (means, lows, highs)
    return out


def format_sweep(sweep: Mapping[str, Any]) -> str:
    """Per headline metric a table (strategies x budgets), then each budget's verdict."""
    from trace_gym.report import markdown_table, pm

    budgets, first = sweep["root_budgets"], sweep["benches"][0]
    lines = [f"## Budget curve: bench --{first['mode']} at root budgets {', '.join(map(str, budgets))}", ""]
    for metric in HEADLINE:
        curves = metric_curves(sweep, metric.key)
        rows = []
        for name, (means, lows, highs) in curves.items():
            cells = [pm(m, (h - lo) / 2 if math.isfinite(lo) else math.nan) if math.isfinite(m) else "n/a"
                     for m, lo, h in zip(means, lows, highs)]
            rows.append([name, *cells])
        lines += [f"### {metric.label} (mean ± 95 % CI over repetitions)", "",
                  markdown_table(["strategy", *[f"M = {m}" for m in budgets]], rows), ""]
    lines += ["### Verdict at each budget", ""]
    lines += [f"- M = {m} (budget {b['nominal_budget']:g}): {b['verdict']}" for m, b in zip(budgets, sweep["benches"])]
    return "\n".join(lines)


def write_sweep_plots(sweep: Mapping[str, Any], out_dir: str | Path) -> list[str]:
    """``budget_<metric>.png`` per headline metric in ``out_dir``."""
    from trace_gym.report import plot_lines

    paths = []
    title_mode = sweep["benches"][0]["mode"]
    for metric in HEADLINE:
        paths.append(plot_lines(sweep["root_budgets"], metric_curves(sweep, metric.key),
                                Path(out_dir) / f"budget_{metric.key}.png", xlabel="root budget M per step",
                                ylabel=metric.label, log_x=True,
                                title=f"{metric.label} by budget (bench --{title_mode}; bands: 95 % CI)"))
    return [str(p) for p in paths]
