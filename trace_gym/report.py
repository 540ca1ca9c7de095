"""Metrics over rollout trees, markdown tables and PNG plots.

Metrics (the method page's definitions, computed on :class:`~trace_gym.tree.RolloutTree`):

- :func:`effective_ratio`: fraction of prompts whose tree ends with both a success and
  a failure, over the prompts that got rollouts (trees with at least one leaf).
- :func:`contrast_pairs_by_depth`: opposite-reward leaf pairs per anchor depth (the
  depth of their deepest common ancestor), summed over trees.
- :func:`continuations_by_depth`: the continuations that ended, and their successes, per
  depth of the prefix they started from (where a strategy spends its second stage).
- :func:`spearman`, :func:`spearman_by_depth`: predictor quality against the truth.
- :func:`mean_ci`, :func:`paired_difference`: Student-t uncertainty of continuous
  quantities across repetitions (seeds);
- :func:`wilson_bounds`, :func:`clustered_wilson_interval`,
  :func:`paired_proportion_difference`: uncertainty of binary outcomes over tasks
  (held-out accuracy and its paired differences), intervals that stay wide when the
  observed variance is 0 (a t interval there has zero width and claims certainty).

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
def effective_ratio(trees: Iterable[RolloutTree], mixed_rule: Any = None) -> float:
    """Mixed trees / trees with at least one finished leaf; NaN when there are none. A tree is
    mixed by ``mixed_rule`` (:class:`~trace_gym.step.mixed.MixedRule`; default: a success and a failure)."""
    counted = mixed = 0
    for tree in trees:
        if not tree.leaves():
            continue
        counted += 1
        mixed += tree.is_mixed() if mixed_rule is None else mixed_rule.tree(tree)
    return mixed / counted if counted else math.nan


def contrast_pairs_by_depth(trees: Iterable[RolloutTree]) -> dict[int, int]:
    """Anchor depth -> contrast pairs, summed over ``trees`` (see ``RolloutTree.contrast_pairs``)."""
    out: dict[int, int] = {}
    for tree in trees:
        for depth, n in tree.contrast_pairs().items():
            out[depth] = out.get(depth, 0) + n
    return dict(sorted(out.items()))


def continuations_by_depth(trees: Iterable[RolloutTree]) -> dict[int, tuple[int, int]]:
    """Anchor depth -> ``(continuations, successes)``: the continuation branches that ended, by the depth
    of the prefix each started from, and how many of them succeeded, summed over ``trees``."""
    out: dict[int, tuple[int, int]] = {}
    for tree in trees:
        for branch in tree.branches:
            leaf = tree.branch_leaf(branch.id)
            if not branch.is_continuation or leaf is None:
                continue
            depth = tree.nodes[branch.anchor].depth
            n, wins = out.get(depth, (0, 0))
            out[depth] = (n + 1, wins + int(tree.nodes[leaf].success))
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


def spearman_within(
    predicted: Sequence[float] | np.ndarray,
    truth: Sequence[float] | np.ndarray,
    depth: Sequence[int] | np.ndarray,
) -> float:
    """The rank correlation within a depth: the mean of :func:`spearman_by_depth` over the depths where it is
    defined, each weighted by its entries. What a predictor knows of prefixes beside their depth (a reading
    over every depth also credits it for telling one depth's level from another's). NaN where no depth has one."""
    d = np.asarray(depth)
    per = [(r, int((d == k).sum())) for k, r in spearman_by_depth(predicted, truth, depth).items() if not math.isnan(r)]
    if not per:
        return math.nan
    return float(sum(r * n for r, n in per) / sum(n for _, n in per))


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """Mean, half-width of the Student-t confidence interval, and n (NaN ignored).

    The half-width is NaN with fewer than 2 values: one repetition has no interval. With
    n values that are all equal it is exactly 0: the sample has no spread to estimate an
    interval from (equal up to a relative 1e-12, so rounding residues such as 0.6 - 0.4 vs
    0.2 count as equal), which is not certainty; :func:`pm` prints it as ``± 0 (all n equal)``
    and :func:`distinguishable` tells nothing apart by it.
    """
    from scipy import stats

    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    n = int(arr.size)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(arr[0]), math.nan, 1
    if np.ptp(arr) <= 1e-12 * max(1.0, float(np.abs(arr).max())):  # equal up to rounding: 0, not a residue
        return float(arr.mean()), 0.0, n
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * arr.std(ddof=1) / math.sqrt(n))
    return float(arr.mean()), half, n


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """Mean of a_i - b_i over paired repetitions (common random numbers) and its CI half-width.

    Student t over the differences, for continuous quantities (an effective ratio per
    repetition). Two strategies are *distinguishable* at ``level`` when
    :func:`distinguishable` says so; with fewer than 2 pairs the half-width is NaN and
    nothing can be told apart. Binary outcomes per task: :func:`paired_proportion_difference`.
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    return mean_ci([x - y for x, y in zip(a, b)], level)


def bounded_interval(mean: float, half: float, low: float = -math.inf, high: float = math.inf) -> tuple[float, float]:
    """``mean ± half`` intersected with ``[low, high]``, the values the quantity can take (an
    effective ratio lies in [0, 1], a difference of two in [-1, 1]). Cutting off impossible
    values keeps the interval's coverage and never narrows it below what the data hold.
    (NaN, NaN) with a NaN half-width (one value)."""
    if math.isnan(half) or math.isnan(mean):
        return math.nan, math.nan
    return max(low, mean - half), min(high, mean + half)


def distinguishable(mean: float, half: float, n: int | None = None, level: float = 0.95) -> bool:
    """Whether ``mean ± half`` (a :func:`mean_ci` or :func:`paired_difference` result over
    ``n`` values) tells the mean apart from 0 at ``level``.

    A NaN half-width (one value) tells nothing apart. A zero one (all n values equal: no
    spread, the t interval is undefined) falls back to the exact sign test of n paired
    differences that all share one nonzero sign: apart when 2 (1/2)^n < 1 - level, i.e.
    from n = 6 at 95 %; with ``n`` not given (differences that are not paired), never.
    """
    if math.isnan(half):
        return False
    if half == 0:
        return mean != 0 and n is not None and 2 * 0.5**n < 1 - level
    return abs(mean) > half


def _z(level: float) -> float:
    from scipy import stats

    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    return float(stats.norm.ppf(0.5 + level / 2))


def wilson_bounds(p: float, n: float, level: float = 0.95, *, z: float | None = None) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p`` observed on ``n`` trials (``n`` may be an
    effective, non-integer sample size); (NaN, NaN) when ``n <= 0``.

    With z the normal quantile of ``level`` (or ``z`` itself when given)::

        centre = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)

    It never has zero width: at p = 0 the upper bound is z^2 / (n + z^2)
    (0 of 5: [0, 0.4345]).
    """
    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= p <= 1:
        raise ValueError(f"p must lie in [0, 1], got {p!r}")
    z = _z(level) if z is None else z
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at p = 0 (1) the lower (upper) bound is exactly 0 (1); say so rather than leave a rounding residue
    return (0.0 if p == 0 else max(0.0, centre - half), 1.0 if p == 1 else min(1.0, centre + half))


def _task_means(outcomes: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-task mean outcome x_i and sample count m_i; ValueError on an empty task or an
    outcome outside [0, 1]."""
    means, counts = [], []
    for i, task in enumerate(outcomes):
        arr = np.asarray(task, dtype=float)
        if arr.size == 0:
            raise ValueError(f"task {i} has no sampled outcome; every task needs at least one")
        if not ((arr >= 0) & (arr <= 1)).all():
            raise ValueError(f"task {i}: outcomes must lie in [0, 1], got {arr.tolist()}")
        means.append(arr.mean())
        counts.append(arr.size)
    return np.asarray(means), np.asarray(counts, dtype=float)


def effective_sample_size(outcomes: Sequence[Sequence[float]]) -> float:
    """Kish's effective number of independent trials behind the mean over tasks of per-task
    mean outcomes, when each of N tasks has m_i sampled answers (a clustered binomial).

    With x_i the task means, p = mean x_i, s^2 = mean (x_i - p)^2 (the moment estimate of
    the between-task variance, so that it is exactly p (1 - p) for 0/1 values)::

        var(p)    = s^2 / N                       (tasks are the sampling unit)
        n_max     = N^2 / sum_i (1 / m_i)          (= N k with k samples per task)
        n_eff     = p (1 - p) / var(p) = N p (1 - p) / s^2, clipped to [N, n_max]

    i.e. n_max over the design effect, the design effect floored at 1 (the samples are
    never worth more than independent trials) and capped at n_max / N (the tasks are
    never worth less than N independent trials: intraclass correlation 1). When p is 0
    or 1 nothing tells how correlated a task's samples are, and n_eff = N (the
    conservative end); when s^2 = 0 with 0 < p < 1 it is n_max. With one sample per
    task n_eff = N exactly.
    """
    x, m = _task_means(outcomes)
    N = len(x)
    if N == 0:
        return 0.0
    n_max = N * N / float(np.sum(1.0 / m))
    p = float(x.mean())
    if p in (0.0, 1.0):
        return float(N)
    s2 = float(np.mean((x - p) ** 2))
    if s2 == 0:
        return n_max
    return float(np.clip(N * p * (1 - p) / s2, N, n_max))


def clustered_wilson_interval(outcomes: Sequence[Sequence[float]], level: float = 0.95) -> tuple[float, float]:
    """Interval of held-out accuracy (the mean over tasks of each task's mean outcome, avg@k)
    when task i has m_i sampled 0/1 outcomes (``outcomes[i]``, shape (m_i,)).

    :func:`wilson_bounds` at p = mean_i x_i with n = :func:`effective_sample_size`: a
    clustered binomial over tasks. It equals the plain Wilson interval of
    ``successes / N`` with one sample per task, and keeps the Wilson width (never 0) when
    every task agrees with itself: 5 tasks x 2 samples, all wrong, gives [0, 0.4345],
    Wilson of 0 of 5. (NaN, NaN) with no task.
    """
    x, _ = _task_means(outcomes)
    if len(x) == 0:
        return (math.nan, math.nan)
    return wilson_bounds(float(x.mean()), effective_sample_size(outcomes), level)


def paired_proportion_difference(a: Sequence[float], b: Sequence[float],
                                 level: float = 0.95) -> tuple[float, float, float, int]:
    """Difference of two accuracies paired over the same N tasks: (mean of a_i - b_i, lower,
    upper, N), where a_i, b_i in [0, 1] are per-task outcomes (0/1) or per-task mean outcomes.

    The interval is Agresti & Min's (2005) for matched proportions: add 1/2 to each cell
    of the paired 2 x 2 table, then take the Wald interval. Written with the differences
    d_i = a_i - b_i it is the Wald interval after adding two pseudo-tasks of total weight
    2 (weight 1/2 at d = +1, 1/2 at d = -1, 1 at d = 0), so it applies unchanged to
    per-task means::

        W  = N + 2
        d~ = sum_i d_i / W
        v  = ((sum_i d_i^2 + 1) / W - d~^2) / W
        [lower, upper] = d~ -/+ z sqrt(v), clipped to [-1, 1]

    For 0/1 outcomes (n12, n21 discordant tasks) that is exactly (p12 - p21) -/+ z
    sqrt((p12 + p21 - (p12 - p21)^2) / W) with p12 = (n12 + 1/2) / W. It never has zero
    width: N tasks that all agree give +-z / (N + 2) (16 tasks: +-10.9 points). The
    returned mean is the observed difference (the interval's centre d~ is shrunk toward
    0). (NaN, NaN, NaN, 0) with no pair.
    """
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.isnan(d).any() or (np.abs(d) > 1).any():
        raise ValueError(f"paired outcomes must lie in [0, 1], got differences {d.tolist()}")
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    w = n + 2.0
    centre = float(d.sum()) / w
    var = ((float(np.sum(d * d)) + 1.0) / w - centre * centre) / w
    half = _z(level) * math.sqrt(max(var, 0.0))
    return float(d.mean()), max(-1.0, centre - half), min(1.0, centre + half), n



def paired_over_shared(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[float, float, float, int] | None:
    """``a - b`` over the keys (task ids) both have, by :func:`paired_proportion_difference`:
    ``(difference, lower, upper, n)``, or ``None`` when they share no key."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    return paired_proportion_difference([a[t] for t in shared], [b[t] for t in shared])


# ---------------------------------------------------------------------- tables
def _cell(x: Any) -> str:
    """One table cell as text: a float to 3 significant digits (large ones with commas), a
    ``|`` escaped and line breaks as spaces (a name with either would break the table)."""
    if isinstance(x, float):
        if math.isnan(x):
            return "n/a"
        return f"{x:.3g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return " ".join(str(x).replace("|", "\\|").splitlines())


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-markdown table; floats get 3 significant digits, large ones commas; every
    cell and header escaped (:func:`_cell`)."""
    headers = [_cell(h) for h in headers]
    rows = [[_cell(c) for c in r] for r in rows]
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(f"row {r!r} has {len(r)} cells for {len(headers)} headers")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def pm(mean: float, half: float, digits: int = 3, n: int | None = None, *, low: float = -math.inf,
       high: float = math.inf) -> str:
    """``mean ± half`` with ``digits`` decimals; just the mean when ``half`` is NaN
    (one repetition: no interval to print); ``mean ± 0 (all n equal)`` when ``half`` is 0
    (n equal values: no spread to estimate from, not certainty; ``n`` when given). When the
    interval reaches past ``[low, high]`` (the values the quantity can take) it is cut there
    and printed as ``mean [lo, hi]`` (:func:`bounded_interval`)."""
    if math.isnan(mean):
        return "n/a"
    if math.isnan(half):
        return f"{mean:.{digits}f}"
    if half == 0:
        return f"{mean:.{digits}f} ± 0 (all {'' if n is None else f'{n} '}equal)"
    lo, hi = bounded_interval(mean, half, low, high)
    if lo > mean - half or hi < mean + half:
        return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


# ---------------------------------------------------------------------- plots
def pyplot():
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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels)), 3.6))
    x = np.arange(len(labels))
    ax.bar(x, means, yerr=stds, capsize=4, color="#4878a8")
    if hline is not None:
        ax.axhline(hline[0], color="#c44", linestyle="--", linewidth=1, label=hline[1])
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xticks(x, labels, rotation=25, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return save_figure(plt, fig, path)


def save_figure(plt, fig, path: str | Path) -> Path:
    """Lay out, write as PNG (120 dpi, parent folders created) and close the figure."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_lines(
    x: Sequence[float],
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
    path: str | Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    log_x: bool = False,
) -> Path:
    """One line per series with its interval as a band: ``series[name] = (means, lows, highs)``
    at ``x``. Lines are drawn with a small horizontal offset each (and a marker of their own) so
    that two series with the same values stay visible side by side; NaN bounds draw no band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs = np.asarray(x, dtype=float)
    span = (np.log(xs.max()) - np.log(xs.min())) if log_x and len(xs) > 1 else float(np.ptp(xs)) or 1.0
    markers = "osD^v<>ph*"
    for i, (name, (mean, low, high)) in enumerate(series.items()):
        shift = (i - (len(series) - 1) / 2) * 0.012 * span
        at = xs * np.exp(shift) if log_x else xs + shift
        ax.plot(at, mean, marker=markers[i % len(markers)], markersize=4, linewidth=1.4, label=name)
        lo, hi = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
        if np.isfinite(lo).any():
            ax.fill_between(at, lo, hi, alpha=0.15)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return save_figure(plt, fig, path)


def plot_grouped(
    groups: Mapping[str, Mapping[int, float]], path: str | Path, *, xlabel: str, ylabel: str, title: str
) -> Path:
    """Grouped bars: one group per key of the inner maps (e.g. depth), one bar per series."""
    plt = pyplot()
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
    return save_figure(plt, fig, path)


def plot_root_allocation(
    values: Sequence[float], budgets: Sequence[int], allocations: Sequence[Sequence[int]], path: str | Path
) -> Path:
    """m_i against the root budget, one line per prompt (labelled by its predicted v)."""
    plt = pyplot()
    alloc = np.asarray(allocations)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, v in enumerate(values):
        ax.plot(budgets, alloc[:, i], marker="o", markersize=3, label=f"v = {v:g} (#{i})")
    ax.set_xlabel("root budget M")
    ax.set_ylabel("rollouts m_i")
    ax.set_title("TRACE root allocation as the budget grows")
    ax.legend(fontsize=7)
    return save_figure(plt, fig, path)
