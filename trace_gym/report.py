"""Metrics over rollout trees, markdown tables and PNG plots.

Metrics (the method page's definitions, computed on :class:`~trace_gym.tree.RolloutTree`):

- :func:`effective_ratio`: fraction of prompts whose tree ends with both a success and
  a failure, over the prompts that got rollouts (trees with at least one leaf).
- :func:`contrast_pairs_by_depth`: opposite-reward leaf pairs per anchor depth (the
  depth of their deepest common ancestor), summed over trees.
- :func:`spearman`, :func:`spearman_by_depth`: predictor quality against the truth.
- :func:`mean_ci`, :func:`paired_difference`: uncertainty across repetitions.

Plots use matplotlib's Agg backend (no display needed); matplotlib is imported only
when a plot is drawn, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trace_gym.tree import RolloutTree


# ---------------------------------------------------------------------- metrics
def effective_ratio(trees: Iterable[RolloutTree]) -> float:
    """Mixed trees / trees with at least one finished leaf; NaN when there are none."""
    counted = mixed = 0
    for tree in trees:
        if not tree.leaves():
            continue
        counted += 1
        mixed += tree.is_mixed()
    return mixed / counted if counted else math.nan


def contrast_pairs_by_depth(trees: Iterable[RolloutTree]) -> dict[int, int]:
    """Anchor depth -> contrast pairs, summed over ``trees`` (see ``RolloutTree.contrast_pairs``)."""
    out: dict[int, int] = {}
    for tree in trees:
        for depth, n in tree.contrast_pairs().items():
            out[depth] = out.get(depth, 0) + n
    return dict(sorted(out.items()))


def spearman(predicted: Sequence[float] | np.ndarray, truth: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (scipy); NaN with fewer than 3 entries or a constant side."""
    from scipy import stats

    p = np.asarray(predicted, dtype=float)
    t = np.asarray(truth, dtype=float)
    if p.shape != t.shape:
        raise ValueError(f"predicted shape {p.shape} != truth shape {t.shape}")
    if len(p) < 3 or np.ptp(p) == 0 or np.ptp(t) == 0:
        return math.nan
    return float(stats.spearmanr(p, t).statistic)


def spearman_by_depth(
    predicted: Sequence[float] | np.ndarray,
    truth: Sequence[float] | np.ndarray,
    depth: Sequence[int] | np.ndarray,
) -> dict[int, float]:
    """Depth -> Spearman of the entries at that depth (prompt level is depth 0)."""
    p, t, d = (np.asarray(x) for x in (predicted, truth, depth))
    if not p.shape == t.shape == d.shape:
        raise ValueError(f"shapes differ: predicted {p.shape}, truth {t.shape}, depth {d.shape}")
    return {int(k): spearman(p[d == k], t[d == k]) for k in np.unique(d)}


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """Mean, half-width of the Student-t confidence interval, and n (NaN ignored).

    The half-width is NaN with fewer than 2 values: one repetition has no interval.
    """
    from scipy import stats

    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    n = int(arr.size)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(arr[0]), math.nan, 1
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * arr.std(ddof=1) / math.sqrt(n))
    return float(arr.mean()), half, n


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """Mean of a_i - b_i over paired repetitions (common random numbers) and its CI half-width.

    Two strategies are *distinguishable* at ``level`` when ``abs(mean) > half``; with
    fewer than 2 pairs the half-width is NaN and nothing can be told apart.
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    return mean_ci([x - y for x, y in zip(a, b)], level)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std over seeds, ignoring NaN; (NaN, NaN) when nothing is left."""
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std())


# ---------------------------------------------------------------------- tables
def _cell(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        return f"{x:.3g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-markdown table; floats get 3 significant digits, large ones commas."""
    rows = [[_cell(c) for c in r] for r in rows]
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(f"row {r!r} has {len(r)} cells for {len(headers)} headers")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def pm(mean: float, half: float, digits: int = 3) -> str:
    """``mean ± half`` with ``digits`` decimals; just the mean when ``half`` is NaN
    (one repetition: no interval to print)."""
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


# ---------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bars(
    labels: Sequence[str],
    means: Sequence[float],
    stds: Sequence[float] | None,
    path: str | Path,
    *,
    ylabel: str,
    title: str,
    hline: tuple[float, str] | None = None,
) -> Path:
    """Bar chart with optional error bars and one labelled horizontal reference line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels)), 3.6))
    x = np.arange(len(labels))
    ax.bar(x, means, yerr=stds, capsize=4, color="#4878a8")
    if hline is not None:
        ax.axhline(hline[0], color="#c44", linestyle="--", linewidth=1, label=hline[1])
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xticks(x, labels, rotation=25, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(plt, fig, path)


def _save(plt, fig, path: str | Path) -> Path:
    """Lay out, write as PNG (120 dpi, parent folders created) and close the figure."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_grouped(
    groups: Mapping[str, Mapping[int, float]], path: str | Path, *, xlabel: str, ylabel: str, title: str
) -> Path:
    """Grouped bars: one group per key of the inner maps (e.g. depth), one bar per series."""
    plt = _pyplot()
    keys = sorted({k for series in groups.values() for k in series})
    fig, ax = plt.subplots(figsize=(min(10.0, 3.0 + 1.2 * len(keys)), 3.6))
    width = 0.8 / max(1, len(groups))
    for i, (name, series) in enumerate(groups.items()):
        ax.bar(np.arange(len(keys)) + i * width, [series.get(k, 0.0) for k in keys], width, label=name)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, [str(k) for k in keys])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save(plt, fig, path)


def plot_root_allocation(
    values: Sequence[float], budgets: Sequence[int], allocations: Sequence[Sequence[int]], path: str | Path
) -> Path:
    """m_i against the root budget, one line per prompt (labelled by its predicted v)."""
    plt = _pyplot()
    alloc = np.asarray(allocations)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, v in enumerate(values):
        ax.plot(budgets, alloc[:, i], marker="o", markersize=3, label=f"v = {v:g} (#{i})")
    ax.set_xlabel("root budget M")
    ax.set_ylabel("rollouts m_i")
    ax.set_title("TRACE root allocation as the budget grows")
    ax.legend(fontsize=7)
    return _save(plt, fig, path)
