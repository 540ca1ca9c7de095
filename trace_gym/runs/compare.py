"""Training runs side by side, with uncertainty (what ``trace-gym compare RUN [RUN ...]`` prints).

Reads each run directory (``config.yaml``, ``metrics.jsonl``, ``evals/step-N.json``) and
prints one markdown table, plus PNG plots of reward, effective ratio and held-out
accuracy against the nominal budget spent, the exact generated tokens and wall-clock
seconds (the paper's axes).

Uncertainty, stated rather than hidden:

- runs whose configs differ only in ``seed`` (and ``run_dir``) form one row; with two or
  more seeds every number is a mean with a 95 % Student-t interval over seeds (printed
  ``± 0 (all n equal)`` when every seed gave the same value: no spread, not certainty);
- held-out accuracy with one seed carries a 95 % interval over the evaluation's tasks,
  recomputed from its per-task outcomes: Wilson at the effective sample size of the
  tasks' samples (:func:`trace_gym.report.clustered_wilson_interval`), never zero width;
- each row's gain (after minus before) is paired over the evaluation tasks (one seed:
  the Agresti-Min interval for matched proportions,
  :func:`trace_gym.report.paired_proportion_difference`, printed as ``[lower, upper]``,
  wide even when no task changed) or taken over seeds (Student t, ``±``);
- every row is compared with the first one on held-out accuracy after training, the same
  way, and the table says when the two cannot be told apart (the interval contains 0; a
  zero-width interval over seeds is judged by the exact sign test for paired gains, and
  tells two rows of independent seeds nothing).

Runs of different envs or evaluation suites are still tabulated side by side, under a
one-line warning that their numbers measure different things. Rows are labelled by the
names the user gives (``--names``), else by the folders' names.

Eval output dirs (``trace-gym eval --out DIR``) may be given too: then every folder is one
or more *arms* paired on their shared tasks (:mod:`trace_gym.runs.compare_arms`).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from trace_gym import report
from trace_gym.runs.run_dir import RunDir

#: Time phases reported, in the order of a training step.
PHASES = ("generation", "environment", "predictor_scoring", "predictor_update", "allocation", "policy_update",
          "weight_sync", "eval")


@dataclass
class Run:
    """One run directory, loaded."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    evals: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: the label the user gave (``--names``), else the folder's name
    name: str = ""
    #: what the table should say about how the run was read (a step its metrics repeat)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name or self.path.name

    def series(self, key: str) -> np.ndarray:
        return np.array([math.nan if m.get(key) is None else float(m[key]) for m in self.metrics])

    def cumulative(self, key: str) -> np.ndarray:
        return np.cumsum([float(m.get(key) or 0.0) for m in self.metrics])

    def phase_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.metrics:
            for k, v in m.get("seconds", {}).items():
                out[k] = out.get(k, 0.0) + float(v)
        return out


#: The metrics a table reads from each ``metrics.jsonl`` line: a number (or null) each.
METRIC_NUMBERS = ("reward", "effective_ratio", "nominal_budget", "generated_tokens", "step_seconds",
                  "prefill_tokens_uncached", "env_steps")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked_metrics(path: str | Path, records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The run's metrics one record per step, in step order, and the notes on how they were
    read: a step given twice (a resume that tore its last write) is counted once, the later
    record winning. ``ValueError`` naming the step and field for a value of the wrong type."""
    by_step: dict[int, dict[str, Any]] = {}
    repeated: list[int] = []
    for record in records:
        where = f"run {str(path)!r}: metrics.jsonl step {record['step']}"
        for key in METRIC_NUMBERS:
            if record.get(key) is not None and not _is_number(record[key]):
                raise ValueError(f"{where}: {key} is {str(record[key])[:60]!r}, expected a number")
        seconds = record.get("seconds", {})
        if type(seconds) is not dict or not all(_is_number(v) for v in seconds.values()):
            raise ValueError(f"{where}: seconds is {str(seconds)[:60]!r}, expected an object of phase -> seconds")
        if record["step"] in by_step:
            repeated.append(record["step"])
        by_step[record["step"]] = record
    notes = []
    if repeated:
        shown = ", ".join(map(str, sorted(set(repeated))[:5])) + (" ..." if len(set(repeated)) > 5 else "")
        notes.append(f"note: run {Path(path).name!r}: metrics.jsonl gives step(s) {shown} more than once (a "
                     "resumed run's torn write); each step is counted once, its later record")
    return [by_step[s] for s in sorted(by_step)], notes


def _read_eval(run_path: str | Path, f: Path) -> dict[str, Any]:
    """``evals/step-N.json``, read bounded and checked for what the tables read (a numeric
    ``accuracy``; ``per_task`` of reward lists, each task once; ``accuracy_ci`` two numbers)."""
    from trace_gym.runs.compare_arms import per_task_rewards
    from trace_gym.runs.files import read_json_file

    where = f"run {str(run_path)!r}: evals/{f.name}"
    try:
        ev = read_json_file(f, unique_keys=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where} is unreadable ({exc})") from None
    if type(ev) is not dict or not _is_number(ev.get("accuracy")):
        raise ValueError(f"{where} is not an evaluation (no numeric accuracy)")
    if ev.get("per_task") is not None:
        per_task_rewards(ev["per_task"], where)
    ci = ev.get("accuracy_ci")
    if ci is not None and not (type(ci) is list and len(ci) == 2 and all(_is_number(v) for v in ci)):
        raise ValueError(f"{where}: accuracy_ci is {str(ci)[:60]!r}, expected [lower, upper]")
    return ev


def load_run(path: str | Path, name: str = "") -> Run:
    """A run directory as written by ``trace-gym train`` (every file read bounded:
    :mod:`trace_gym.runs.files`); ValueError when it is not one, or when a file in it is
    too large or of the wrong shape (naming it). A step its metrics give twice is counted
    once (:func:`_checked_metrics`), and said in ``Run.notes``."""
    import yaml

    from trace_gym.runs.run_dir import MAX_CONFIG_BYTES
    from trace_gym.config import load_yaml
    from trace_gym.runs.files import open_regular, read_json_file

    rd = RunDir(path)
    if not rd.config_path.exists():
        raise ValueError(f"{str(path)!r} is neither a run directory (no config.yaml) nor an eval output dir "
                         "(no results.json)")
    metrics, notes = _checked_metrics(path, rd.read_metrics())
    if not metrics:
        raise ValueError(f"run {str(path)!r} has no finished step in metrics.jsonl")
    evals = {}
    for f in sorted((rd.path / "evals").glob("step-*.json")) if (rd.path / "evals").exists() else []:
        step = f.stem.split("-")[1]
        if not (step.isascii() and step.isdigit()) or len(step) > 15:  # "step-٣" is not step 3
            continue  # not a file the run wrote
        evals[int(step)] = _read_eval(path, f)
    with open_regular(rd.config_path) as fh:
        text = fh.read(MAX_CONFIG_BYTES + 1)
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"run {str(path)!r}: config.yaml is more than {MAX_CONFIG_BYTES:,} bytes")
    try:
        config = load_yaml(text) or {}
    except (yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"run {str(path)!r}: config.yaml is unreadable ({str(exc)[:200]})") from None
    if type(config) is not dict:
        raise ValueError(f"run {str(path)!r}: config.yaml is a {type(config).__name__}, expected a mapping")
    return Run(rd.path, config, metrics, evals, name, notes)


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs whose configs differ only in seed and run_dir, under one label (first seen first)."""
    members: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in run.config.items() if k not in ("seed", "run_dir", "progress")},
                         sort_keys=True, default=str)
        members.setdefault(key, []).append(run)
    groups: dict[str, list[Run]] = {}
    for group in members.values():
        label = ", ".join(r.label for r in group)  # the names the user gave, every seed's
        while label in groups:
            label += "'"
        groups[label] = group
    return groups


def _before_after(run: Run) -> tuple[dict | None, dict | None]:
    if not run.evals:
        return None, None
    last = max(run.evals)
    return run.evals.get(0), (run.evals[last] if last > 0 else None)


def _acc(ev: Mapping[str, Any] | None) -> str:
    """Accuracy % with its 95 % interval over tasks, from the per-task outcomes when the
    eval recorded them (an older eval's zero-width Student-t interval is not reprinted)."""
    if ev is None:
        return "-"
    if ev.get("per_task"):
        lo, hi = report.clustered_wilson_interval([[float(r >= 0.5) for r in rs] for rs in ev["per_task"].values()])
    else:
        lo, hi = ev.get("accuracy_ci", [math.nan, math.nan])
    return f"{100 * ev['accuracy']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _task_scores(ev: Mapping[str, Any]) -> dict[str, float]:
    return {t: float(np.mean([r >= 0.5 for r in rs])) for t, rs in ev.get("per_task", {}).items()}


def _over_tasks(a: Mapping[str, float], b: Mapping[str, float], words: tuple[str, str]) -> str:
    """``a - b`` paired over their shared tasks, Agresti-Min interval; ``words`` = (told apart, not)."""
    paired = report.paired_over_shared(a, b)
    if paired is None:
        return "no shared eval tasks"
    diff, lo, hi, n = paired
    verdict = words[0] if lo > 0 or hi < 0 else words[1]
    return f"{100 * diff:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] (paired over {n} tasks): {verdict}"


def _over_seeds(diff: float, half: float, n: str, words: tuple[str, str], paired: int | None = None) -> str:
    """``diff ± half`` (Student t over seeds); ``words`` = (told apart, not); ``paired``: the
    number of paired seed differences, for the sign test when they are all equal
    (:func:`trace_gym.report.distinguishable`)."""
    spread = "± 0 (every seed equal)" if half == 0 else f"± {100 * half:.1f}"
    verdict = words[0] if report.distinguishable(diff, half, paired) else words[1]
    return f"{100 * diff:+.1f} {spread} pts ({n}): {verdict}"


def _versus(ref: list[Run], other: list[Run]) -> str:
    """Held-out accuracy after training, ``other`` minus ``ref``: difference, interval, verdict."""
    words = ("distinguishable", "cannot be told apart")
    if len(ref) >= 2 and len(other) >= 2:
        a = [_before_after(r)[1] for r in other]
        b = [_before_after(r)[1] for r in ref]
        if any(x is None for x in a + b):
            return "-"
        mean, half, _ = report.mean_ci([x["accuracy"] for x in a])
        mean_b, half_b, _ = report.mean_ci([x["accuracy"] for x in b])
        half = math.sqrt(half**2 + half_b**2)  # independent seeds: intervals add in quadrature
        return _over_seeds(mean - mean_b, half, f"{min(len(a), len(b))} seeds each", words)
    after_o, after_r = _before_after(other[0])[1], _before_after(ref[0])[1]
    if after_o is None or after_r is None:
        return "-"
    return _over_tasks(_task_scores(after_o), _task_scores(after_r), words)


def _gain(runs: list[Run]) -> str:
    """Held-out accuracy after minus before training: paired over the evaluation tasks (one
    seed) or over seeds (several), with its 95 % interval and whether it excludes 0."""
    words = ("a real change", "no detectable change")
    pairs = [_before_after(r) for r in runs]
    if any(b is None or a is None for b, a in pairs):
        return "-"
    if len(runs) == 1:
        return _over_tasks(_task_scores(pairs[0][1]), _task_scores(pairs[0][0]), words)
    diff, half, n = report.mean_ci([a["accuracy"] - b["accuracy"] for b, a in pairs])
    return _over_seeds(diff, half, f"over {len(runs)} seeds", words, paired=n)


def mixed_warning(runs: Sequence[Run]) -> str | None:
    """One line when ``runs`` train on different envs or evaluate on different suites
    (their numbers measure different things); None when they agree or do not say."""
    parts = []
    for key, what in (("env", "envs"), ("eval_suite", "eval suites")):
        seen: dict[str, list[str]] = {}
        for run in runs:
            value = run.config.get(key)
            if value not in (None, ""):
                seen.setdefault(str(value), []).append(run.path.name)
        if len(seen) > 1:
            parts.append(f"{what} " + "; ".join(f"{v} ({', '.join(names)})" for v, names in seen.items()))
    if not parts:
        return None
    return ("WARNING: these runs mix " + " and ".join(parts)
            + ": rows of different envs or suites are not comparable, and their 'after vs first row' is not a "
            "like-for-like difference")


def compare_table(groups: Mapping[str, list[Run]]) -> str:
    """The markdown comparison (main table, time by phase, per-step table)."""
    rows = []
    first = next(iter(groups.values()))
    for label, runs in groups.items():
        def stat(fn) -> str:
            values = [fn(r) for r in runs]
            mean, half, n = report.mean_ci(values)
            return report.pm(mean, half, 3 if abs(mean) < 10 else 0, n)

        before = [_before_after(r)[0] for r in runs]
        after = [_before_after(r)[1] for r in runs]
        if len(runs) == 1:
            acc_before, acc_after = _acc(before[0]), _acc(after[0])
        else:
            acc_before = stat(lambda r: (_before_after(r)[0] or {}).get("accuracy", math.nan))
            acc_after = stat(lambda r: (_before_after(r)[1] or {}).get("accuracy", math.nan))
        rows.append([
            f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})",
            len(runs[0].metrics),
            stat(lambda r: float(np.nanmean(r.series("effective_ratio")))),
            stat(lambda r: float(np.nanmean(r.series("reward")))),
            stat(lambda r: float(r.cumulative("nominal_budget")[-1])),
            stat(lambda r: float(r.cumulative("generated_tokens")[-1])),
            stat(lambda r: float(r.cumulative("step_seconds")[-1])),
            acc_before, acc_after, _gain(runs),
            "reference" if runs is first else _versus(first, runs),
        ])
    headers = ["run", "steps", "effective ratio", "train reward", "nominal budget", "generated tokens",
               "wall-clock s", "held-out acc % before", "held-out acc % after", "after - before",
               "after vs first row"]
    parts = [report.markdown_table(headers, rows), "", "Time by phase (share of step time, summed over steps):", ""]
    phase_rows = []
    for label, runs in groups.items():
        total = {k: sum(r.phase_seconds().get(k, 0.0) for r in runs) for k in PHASES}
        step_total = sum(float(r.cumulative("step_seconds")[-1]) for r in runs)
        predictor = total["predictor_scoring"] + total["predictor_update"]
        phase_rows.append([label, *[f"{100 * total[k] / max(step_total, 1e-9):.1f} %" for k in PHASES],
                           f"{100 * predictor / max(step_total, 1e-9):.1f} %"])
    parts.append(report.markdown_table(["run", *PHASES, "predictor (scoring + update)"], phase_rows))
    parts += ["", "Per step (first seed of each run):", ""]
    step_rows = []
    for label, runs in groups.items():
        for m in runs[0].metrics:
            s = m.get("seconds", {})
            step_rows.append([label, m["step"], m.get("effective_ratio", math.nan), m.get("reward", math.nan),
                              m.get("nominal_budget", math.nan), m.get("generated_tokens", 0),
                              m.get("prefill_tokens_uncached", 0), m.get("env_steps", 0),
                              s.get("generation", 0.0), s.get("environment", 0.0),
                              s.get("predictor_scoring", 0.0) + s.get("predictor_update", 0.0),
                              s.get("policy_update", 0.0), s.get("weight_sync", 0.0)])
    parts.append(report.markdown_table(["run", "step", "effective ratio", "reward", "nominal", "gen tokens",
                                      "prefill tokens", "env steps", "gen s", "env s", "predictor s", "update s",
                                      "sync s"], step_rows))
    return "\n".join(parts)


#: Marker and line style per run group, so that groups drawn on the same values stay apart.
_STYLES = (("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", (0, (5, 1))), ("P", (0, (3, 1, 1, 1))))


def side_offsets(groups: int, span: float, share: float = 0.015) -> np.ndarray:
    """Sideways shifts of ``groups`` point series on an axis of length ``span``: centred on 0,
    ``share * span`` apart (so coincident points of different groups are all seen)."""
    return (np.arange(groups) - (groups - 1) / 2) * share * span


def _accuracy_bars(runs: Sequence[Run], steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper error-bar lengths of held-out accuracy at ``steps``: over seeds
    (Student t) with several runs, else over the eval's tasks (Wilson at the effective
    sample size, from its per-task outcomes; its stored interval for an older eval)."""
    low, high = [], []
    for s in steps:
        evs = [r.evals[s] for r in runs if s in r.evals]
        mean = float(np.mean([ev["accuracy"] for ev in evs]))
        if len(evs) > 1:
            half = report.mean_ci([ev["accuracy"] for ev in evs])[1]
            lo, hi = max(0.0, mean - half), min(1.0, mean + half)
        elif evs[0].get("per_task"):
            lo, hi = report.clustered_wilson_interval([[float(r >= 0.5) for r in rs]
                                                       for rs in evs[0]["per_task"].values() if rs])
        else:
            lo, hi = (evs[0].get("accuracy_ci") or [mean, mean])[:2]
        low.append(max(0.0, mean - lo))
        high.append(max(0.0, hi - mean))
    return np.array(low), np.array(high)


def plot_runs(groups: Mapping[str, list[Run]], out_dir: str | Path) -> list[str]:
    """PNG plots: {reward, effective_ratio, accuracy} against {nominal budget, tokens, seconds}.

    A line per run group, each with its own marker and line style; with several seeds the
    mean with a shaded 95 % band (runs aligned by step). Held-out accuracy draws its 95 %
    interval at every evaluation as an error bar (:func:`_accuracy_bars`), and the groups'
    points are spread sideways by a small share of the axis, so two groups with the same
    values are both seen, not one drawn over the other."""
    plt = report.pyplot()
    out = Path(out_dir)
    paths = []
    axes = {"nominal budget": "nominal_budget", "generated tokens": "generated_tokens", "wall-clock s": "step_seconds"}
    for ykey, ylabel in (("reward", "train reward"), ("effective_ratio", "effective ratio"), ("accuracy", "held-out accuracy")):
        fig, axs = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, (xlabel, xkey) in zip(axs, axes.items()):
            span = max([float(r.cumulative(xkey)[-1]) for rs in groups.values() for r in rs] + [1e-9])
            for k, (label, runs) in enumerate(groups.items()):
                marker, style = _STYLES[k % len(_STYLES)]
                xs, ys, steps = [], [], []
                for r in runs:
                    x = np.concatenate([[0.0], r.cumulative(xkey)])
                    if ykey == "accuracy":
                        steps = [s for s in sorted(r.evals) if s < len(x)]
                        xs.append(np.array([x[s] for s in steps]))
                        ys.append(np.array([r.evals[s]["accuracy"] for s in steps]))
                    else:
                        xs.append(x[1:])
                        ys.append(r.series(ykey))
                n = min(len(y) for y in ys)
                if n == 0:
                    continue
                x_mean = np.mean([x[:n] for x in xs], axis=0)
                y_arr = np.array([y[:n] for y in ys])
                y_mean = np.nanmean(y_arr, axis=0)
                name = f"{label} (n={len(runs)})"
                if ykey == "accuracy":
                    ax.errorbar(x_mean + side_offsets(len(groups), span)[k], y_mean, yerr=_accuracy_bars(runs, steps[:n]), marker=marker,
                                linestyle=style, ms=4, capsize=3, label=name)
                    continue
                line, = ax.plot(x_mean, y_mean, marker=marker, linestyle=style, ms=3, label=name)
                if len(runs) > 1:
                    half = np.array([report.mean_ci(y_arr[:, i])[1] for i in range(n)])
                    ax.fill_between(x_mean, y_mean - half, y_mean + half, color=line.get_color(), alpha=0.2)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel + (" (95 % CI)" if ykey == "accuracy" else ""))
        axs[0].legend(fontsize=8)
        fig.suptitle(f"{ylabel} against budget, tokens and time")
        paths.append(str(report.save_figure(plt, fig, out / f"{ykey}.png")))
    return paths


def arm_names(paths: Sequence[str | Path], names: Sequence[str] | None = None) -> list[str]:
    """One label per folder: ``names`` as given (one each, distinct), else each folder's
    name (its path as given where two folders share a name)."""
    if names:
        names = [n.strip() for n in names]
        if len(names) != len(paths) or not all(names) or len(set(names)) != len(names):
            raise ValueError(f"--names needs {len(paths)} distinct non-empty names (one per folder, in order), "
                             f"got {','.join(names)!r}")
        return list(names)
    base = [Path(p).resolve().name or str(p) for p in paths]
    return [b if base.count(b) == 1 else str(p) for b, p in zip(base, paths)]


def readable_paths(paths: Sequence[str | Path]) -> None:
    """``ValueError`` (one line naming it) for a path that cannot be looked at: a symlink
    loop, a folder that may not be entered, a name too long."""
    import os

    for p in paths:
        try:
            os.stat(p)
        except FileNotFoundError:
            continue  # said where it is read ("neither a run directory nor ...")
        except OSError as exc:
            raise ValueError(f"{str(p)!r} cannot be read ({exc.strerror})") from None


def run_compare(paths: Sequence[str], out_dir: str | None = None, *, names: Sequence[str] | None = None,
                out: Any = None) -> str:
    """Load, tabulate and plot; returns the markdown.

    Training run dirs get the run table (seeds of one config grouped; every row against
    the first); when any folder is an eval output dir, every folder becomes one or more
    arms (:mod:`trace_gym.runs.compare_arms`) paired with the first on the tasks they share.
    Rows are labelled by ``names`` (default: the folders' names)."""
    from trace_gym.runs import compare_arms
    from trace_gym.runs.output_paths import write_output_text

    out = out or sys.stdout
    readable_paths(paths)
    labels = arm_names(paths, names)
    evals = [compare_arms.is_eval_dir(p) for p in paths]
    runs = [load_run(p, n) for p, n, e in zip(paths, labels, evals) if not e]
    parts, plots = [], []
    warning = mixed_warning(runs)
    if warning:
        parts.append(warning)
    parts += [note for run in runs for note in run.notes]
    if runs and not any(evals):
        groups = group_runs(runs)
        parts.append(compare_table(groups))
        if out_dir:
            plots = plot_runs(groups, out_dir)
    else:
        by_path = {str(r.path): r for r in runs}
        arms = []
        for p, n, e in zip(paths, labels, evals):
            arms += compare_arms.load_eval_arms(p, n) if e else [compare_arms.run_arm(by_path[str(Path(p))], n)]
        parts.append(compare_arms.paired_table(arms))
        if out_dir:
            plots = [str(compare_arms.plot_arms(arms, Path(out_dir) / "accuracy.png"))]
    text = "\n\n".join(parts)
    if out_dir:  # checked when the command started; a folder changed since then keeps the table beside it
        written = write_output_text(Path(out_dir) / "compare.md", text + "\n", key="--out")
        text += "\n\nwrote " + ", ".join([str(written), *plots])
    print(text, file=out)
    return text
