"""Checkpoints compared as strategies are: any two evaluations, paired on the tasks they share.

An *arm* is one policy's held-out outcomes per task, from either kind of folder:

- an eval output dir (what ``trace-gym eval ... --out DIR`` writes): its ``results.json``
  holds one row per policy and suite with every sample's reward per task (``per_task``);
  each policy in it is one arm;
- a training run dir: its last evaluation (``evals/step-N.json``, on the run's
  ``eval_suite``).

:func:`paired_table` tabulates every arm's accuracy per suite (Wilson interval at the
effective sample size of the tasks' samples, :func:`trace_gym.report.clustered_wilson_interval`)
and its difference from the first arm paired over the tasks both evaluated (the
Agresti-Min interval for matched proportions,
:func:`trace_gym.report.paired_proportion_difference`, the one ``compare`` uses for runs),
with the verdict "distinguishable" only when that interval excludes 0. A task counts as
solved by a sample whose reward is >= 0.5 (the evaluators' success threshold); a task's
outcome is the share of its samples that solved it.

Every file is read bounded (:func:`trace_gym.runs.files.read_json_file`: size cap, then a
depth-limited parse) and checked for the shape indexed here; a bad one is one
``ValueError`` naming the file and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from trace_gym import report
from trace_gym.runs.files import read_json_file

#: The file an eval output dir is recognised by (``evaluators.run.run_eval`` writes it).
EVAL_RESULTS = "results.json"
#: Largest ``results.json`` read, bytes (a 64-task suite with 8 samples is ~10 kB).
MAX_EVAL_RESULTS_BYTES = 64 << 20
#: Most samples per task read from one row (beyond it the file is refused, not truncated).
MAX_SAMPLES = 1 << 16
#: A sample's reward at or above this counts as a success (the evaluators' threshold).
SUCCESS = 0.5


@dataclass
class Arm:
    """One policy's per-task outcomes per suite.

    Attributes:
        name: the label the user gave (or the folder's name), with ``:POLICY`` for one of
            several policies of an eval dir.
        where: the folder and what in it (``results.json``, ``evals/step-3.json``).
        suites: suite -> task id -> the rewards of its samples.
    """

    name: str
    where: str
    suites: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def outcomes(self, suite: str) -> dict[str, float]:
        """Task id -> the share of its samples that succeeded (tasks with no sample left out)."""
        return {t: sum(r >= SUCCESS for r in rs) / len(rs) for t, rs in self.suites.get(suite, {}).items() if rs}

    def accuracy(self, suite: str) -> tuple[float, float, float]:
        """(accuracy, lower, upper) on ``suite``: the mean over tasks of each task's success
        share, with Wilson's 95 % interval at the effective sample size of the tasks' samples;
        NaNs with no task."""
        success = [[float(r >= SUCCESS) for r in rs] for rs in self.suites.get(suite, {}).values() if rs]
        if not success:
            return math.nan, math.nan, math.nan
        lo, hi = report.clustered_wilson_interval(success)
        return sum(sum(s) / len(s) for s in success) / len(success), lo, hi


def is_eval_dir(path: str | Path) -> bool:
    """Whether ``path`` is an eval output dir (a ``results.json``, no run ``config.yaml``)."""
    p = Path(path)
    return (p / EVAL_RESULTS).is_file() and not (p / "config.yaml").exists()


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def per_task_rewards(value: Any, where: str) -> dict[str, list[float]]:
    """A checked ``per_task`` mapping (task id -> list of finite rewards); ``ValueError``
    naming ``where`` and the first entry of the wrong shape."""
    if type(value) is not dict:
        raise ValueError(f"{where}: per_task is {type(value).__name__}, expected an object of task id -> rewards")
    out: dict[str, list[float]] = {}
    for task, rewards in value.items():
        if type(rewards) is not list or len(rewards) > MAX_SAMPLES or not all(_number(r) for r in rewards):
            raise ValueError(f"{where}: per_task[{task!r:.60}] is {str(rewards)[:60]!r}, expected a list of at most "
                             f"{MAX_SAMPLES} finite rewards")
        out[task] = [float(r) for r in rewards]
    return out


def load_eval_arms(path: str | Path, name: str) -> list[Arm]:
    """The arms of an eval output dir: one per policy in its ``results.json`` (named
    ``name``, or ``name:LABEL`` when the dir holds several policies).

    Raises:
        ValueError: the file is too large, not JSON, gives a key twice in one object (a task
            id), or is not a list of result rows with a string ``suite`` and a ``per_task`` of
            reward lists, each (policy, suite) once (naming the row and field).
    """
    file = Path(path) / EVAL_RESULTS
    try:
        rows = read_json_file(file, max_bytes=MAX_EVAL_RESULTS_BYTES, unique_keys=True)  # a task id twice: refused
    except (OSError, ValueError) as exc:
        raise ValueError(f"{file}: unreadable eval results ({exc})") from None
    if type(rows) is not list or not rows:
        raise ValueError(f"{file}: expected a non-empty list of result rows (what `trace-gym eval` writes), "
                         f"got {type(rows).__name__}")
    by_policy: dict[str, dict[str, dict[str, list[float]]]] = {}
    first: dict[tuple[str, str], int] = {}  # (policy, suite) -> the row that gave it
    for i, row in enumerate(rows):
        where = f"{file} row {i}"
        if type(row) is not dict or type(row.get("suite")) is not str:
            raise ValueError(f"{where}: expected an object with a string 'suite'")
        policy = row.get("policy", row.get("label", "policy"))
        if type(policy) is not str:
            raise ValueError(f"{where}: policy is {type(policy).__name__}, expected a string")
        if (policy, row["suite"]) in first:
            raise ValueError(f"{where}: policy {policy!r} on suite {row['suite']!r} again (row "
                             f"{first[policy, row['suite']]} has it); each policy and suite once, or which counts?")
        first[policy, row["suite"]] = i
        by_policy.setdefault(policy, {})[row["suite"]] = per_task_rewards(row.get("per_task"), where)
    several = len(by_policy) > 1
    return [Arm(f"{name}:{policy}" if several else name, str(file), suites) for policy, suites in by_policy.items()]


def run_arm(run: Any, name: str) -> Arm:
    """A training run's last evaluation as an arm (``run``: a :class:`trace_gym.runs.compare.Run`);
    ``ValueError`` when the run evaluated nothing."""
    if not run.evals:
        raise ValueError(f"run {str(run.path)!r} has no evaluation (evals/step-N.json; train with eval_every > 0) "
                         "to pair with")
    step = max(run.evals)
    ev = run.evals[step]
    where = f"{run.path}/evals/step-{step}.json"
    suite = ev.get("suite") if type(ev.get("suite")) is str else str(run.config.get("eval_suite", "generated"))
    return Arm(f"{name}@{step}", where, {suite: per_task_rewards(ev.get("per_task"), where)})


def _accuracy(arm: Arm, suite: str) -> str:
    acc, lo, hi = arm.accuracy(suite)
    return "-" if math.isnan(acc) else f"{100 * acc:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def versus_text(a: Mapping[str, float], b: Mapping[str, float]) -> str:
    """``a - b`` over their shared tasks, as a table cell (:func:`trace_gym.report.paired_over_shared`:
    Agresti-Min); the verdict says "distinguishable" only when the interval excludes 0."""
    paired = report.paired_over_shared(a, b)
    if paired is None:
        return "no shared tasks"
    diff, lo, hi, n = paired
    verdict = "distinguishable" if lo > 0 or hi < 0 else "cannot be told apart"
    return f"{100 * diff:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] (paired over {n} shared tasks): {verdict}"


def paired_table(arms: Sequence[Arm]) -> str:
    """The markdown table: a row per arm and suite (the first arm's suites first), each with
    its accuracy and its paired difference from the first arm on that suite."""
    ref = arms[0]
    suites = list(dict.fromkeys([s for arm in arms for s in arm.suites]))
    rows = []
    for suite in suites:
        for arm in arms:
            if suite not in arm.suites:
                continue
            mine = arm.outcomes(suite)
            if arm is ref:
                versus = "reference"
            elif suite not in ref.suites:
                versus = f"no shared tasks ({ref.name} did not evaluate {suite})"
            else:
                versus = versus_text(mine, ref.outcomes(suite))
            rows.append([arm.name, suite, len(mine), _accuracy(arm, suite), versus])
    head = [f"Held-out accuracy per suite, each policy paired with {ref.name} on the tasks both evaluated:", ""]
    return "\n".join(head) + "\n" + report.markdown_table(
        ["policy", "suite", "tasks", "accuracy % [95 % CI]", f"minus {ref.name} (95 % CI)"], rows)


def plot_arms(arms: Sequence[Arm], path: str | Path) -> Path:
    """``accuracy.png`` of eval arms: per suite, each arm's accuracy with its 95 % interval as
    an error bar, the arms side by side (never drawn over one another)."""
    plt = report.pyplot()
    suites = list(dict.fromkeys([s for arm in arms for s in arm.suites]))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(suites) * max(1, len(arms)) ** 0.5 + 2), 3.6))
    width = 0.8 / max(1, len(arms))
    for k, arm in enumerate(arms):
        xs, ys, lows, highs = [], [], [], []
        for i, suite in enumerate(suites):
            acc, lo, hi = arm.accuracy(suite)
            if math.isnan(acc):
                continue
            xs.append(i - 0.4 + width * (k + 0.5))
            ys.append(acc)
            lows.append(acc - lo)
            highs.append(hi - acc)
        ax.errorbar(xs, ys, yerr=[lows, highs], fmt="o", capsize=4, label=arm.name)
    ax.set_xticks(range(len(suites)), suites)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("held-out accuracy (95 % CI)")
    ax.legend(fontsize=8)
    fig.suptitle("held-out accuracy per suite")
    return report.save_figure(plt, fig, path)
