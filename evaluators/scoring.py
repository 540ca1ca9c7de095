"""Scoring a suite's finished episodes: one scorer per kind.

:func:`score_episodes` gives every suite accuracy (avg@k), unbiased pass@k, a 95 % interval
and per-task rewards; a ``"bfcl"`` suite adds the official per-category table
(:func:`bfcl_scores`), a ``"qa"`` suite EM and F1 (:func:`qa_scores`), a suite with a
``breakdown`` the same numbers per group (:func:`breakdown_scores`).
:func:`episode_verdict` is one episode as its suite's scorer sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from evaluators.math.metrics import accuracy_summary, avg_at_k
from trace_gym.types import Task

if TYPE_CHECKING:
    from evaluators.suite import Suite


def score_episodes(suite: Suite, tasks: Sequence[Task], episodes: Sequence[Sequence[Any]],
                   pass_k: Sequence[int] = (1,)) -> dict[str, Any]:
    """Accuracy (avg@k over samples), unbiased pass@k, a 95 % interval over tasks, per-task
    rewards; BFCL suites add the official per-category table, a suite with a ``breakdown``
    the same numbers per group (:func:`breakdown_scores`)."""
    rewards = [[float(ep.reward) for ep in eps] for eps in episodes]
    success = [[float(r >= 0.5) for r in rs] for rs in rewards]
    overall = accuracy_summary(success, pass_k)  # Wilson at one sample per task; never zero width
    result: dict[str, Any] = {
        "suite": suite.name,
        "tasks": len(tasks),
        "samples": min((len(s) for s in success), default=0),
        "accuracy": overall["accuracy"],
        "accuracy_ci": overall["accuracy_ci"],
        "mean_reward": avg_at_k(rewards),
        "pass_at_k": overall["pass_at_k"],
        "per_task": {t.id: rs for t, rs in zip(tasks, rewards)},
        "generated_tokens": int(sum(len(turn.action_ids) for eps in episodes for ep in eps for turn in ep.own_turns)),
    }
    scorer = get_scorer(suite.scorer)
    if scorer.table is not None:
        result[suite.scorer] = scorer.table(suite, tasks, episodes)
    if suite.breakdown:
        result["breakdown"] = breakdown_scores(tasks, success, suite.breakdown, pass_k)
    return result


def breakdown_scores(tasks: Sequence[Task], success: Sequence[Sequence[float]], key: str,
                     pass_k: Sequence[int] = (1,)) -> dict[str, Any]:
    """``{"by": key, "groups": {value: accuracy_summary}}``: the tasks grouped by
    ``task.metadata[key]`` (``"(none)"`` where missing), each group's avg@k, interval and
    pass@k (:func:`~evaluators.math.metrics.accuracy_summary`), groups sorted by name."""
    groups: dict[str, list[Sequence[float]]] = {}
    for task, s in zip(tasks, success):
        groups.setdefault(str(task.metadata.get(key, "(none)")), []).append(s)
    return {"by": key, "groups": {name: accuracy_summary(groups[name], pass_k) for name in sorted(groups)}}


def qa_scores(name: str, tasks: Sequence[Task], episodes: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """EM and F1 of the first sample per question with :mod:`evaluators.qa`'s scorer (an episode
    without an answer scores 0)."""
    from dataclasses import asdict

    from evaluators.qa.score import QARecord, score_records

    records = []
    for task, eps in zip(tasks, episodes):
        info = eps[0].turns[-1].info if eps and eps[0].turns else {}
        golds = [task.answer] if isinstance(task.answer, str) else list(task.answer or [])
        records.append(QARecord(task.id, info.get("prediction"), tuple(str(g) for g in golds)))
    return asdict(score_records(name, records))


def bfcl_entry_result(task: Task, ep: Any) -> Any:
    """The official verdict of one episode; an episode the agent loop cut (turn or token
    limit) before the env ended it is a failure ``trace_gym:<reason>``."""
    from environments.bfcl import data
    from evaluators.bfcl import EntryResult

    last = ep.turns[-1] if ep.turns else None
    if last is not None and "valid" in last.info and last.terminated:
        return EntryResult.from_info(last.info, len(ep.turns))
    reason = (last.truncation if last is not None else None) or ("error" if ep.error else "no_turn")
    return EntryResult(task.id, data.category_of(task.id), False, {"check": f"trace_gym:{reason}"}, len(ep.turns))


def bfcl_entry_results(tasks: Sequence[Task], episodes: Sequence[Sequence[Any]]) -> list[Any]:
    """One official verdict per task (its first sample; :func:`bfcl_entry_result`)."""
    return [bfcl_entry_result(task, eps[0]) for task, eps in zip(tasks, episodes)]


def bfcl_scores(tasks: Sequence[Task], episodes: Sequence[Sequence[Any]]) -> dict[str, Any]:
    from evaluators.bfcl import markdown, score

    scores = score(bfcl_entry_results(tasks, episodes))
    return scores.to_dict() | {"markdown": markdown(scores)}


def _reward_verdict(task: Task, ep: Any) -> tuple[Any, dict[str, Any]]:
    grading = (ep.turns[-1].info if ep.turns else {}).get("grading")
    return (grading or {}).get("extracted"), {"success": ep.reward >= 0.5, "reward": ep.reward, "grading": grading}


def _qa_verdict(task: Task, ep: Any) -> tuple[Any, dict[str, Any]]:
    info = ep.turns[-1].info if ep.turns else {}
    return info.get("prediction"), {key: info.get(key) for key in ("em", "f1", "golden_answers")}


def _bfcl_verdict(task: Task, ep: Any) -> tuple[Any, dict[str, Any]]:
    entry = bfcl_entry_result(task, ep)
    calls = [c for turn in ep.turns for c in turn.info.get("tool_calls", [])]
    return calls, {"valid": entry.valid, "failure": entry.failure, "category": entry.category}


@dataclass(frozen=True)
class Scorer:
    """One kind of suite scoring: the extra table it adds to a suite's result (under the
    scorer's name; ``None``: none) and one episode's ``(answer, verdict)``."""

    table: Callable[[Suite, Sequence[Task], Sequence[Sequence[Any]]], dict[str, Any]] | None
    verdict: Callable[[Task, Any], tuple[Any, dict[str, Any]]]


#: Every scorer a suite may name (``Suite.scorer``).
SCORERS: dict[str, Scorer] = {
    "reward": Scorer(None, _reward_verdict),
    "qa": Scorer(lambda suite, tasks, episodes: qa_scores(suite.name, tasks, episodes), _qa_verdict),
    "bfcl": Scorer(lambda suite, tasks, episodes: bfcl_scores(tasks, episodes), _bfcl_verdict),
}


def get_scorer(name: str) -> Scorer:
    """The scorer called ``name`` (``ValueError`` naming the known ones)."""
    if name not in SCORERS:
        from trace_gym.utils.suggest import did_you_mean

        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(SCORERS)}{did_you_mean(name, SCORERS)}")
    return SCORERS[name]


def episode_verdict(suite: Suite, task: Task, ep: Any) -> tuple[Any, dict[str, Any]]:
    """``(the extracted answer, the grader's verdict)`` of one finished episode, as its
    suite's scorer sees it: the math grader's ``grading`` record (reward scorer), the QA
    prediction with EM and F1, or BFCL's official entry verdict with the calls made."""
    return get_scorer(suite.scorer).verdict(task, ep)
