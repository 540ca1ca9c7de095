"""Score QA predictions per dataset and on average: the HotpotQA/2Wiki/MuSiQue/Bamboogle suites.

The metric is the env's (:mod:`environments.wiki_qa.metrics`): EM and token F1 after
SQuAD normalisation with HotpotQA's yes/no/noanswer rule, maximised over gold aliases.
A dataset's score is the mean over its questions (a question without a prediction,
e.g. an episode truncated before ``<answer>``, scores 0). The average row is the
unweighted mean over datasets, as Search-R1 reports "Avg.".

Three ways in:

* :func:`score` on records ``{"id", "prediction", "golden_answers"}`` per dataset (or
  the terminal ``info`` dicts of :class:`~environments.wiki_qa.env.WikiQAEnv`);
* :func:`load_predictions`: FlashRAG / Search-R1 output files (JSONL with ``pred`` or
  ``prediction`` and ``golden_answers``);
* :func:`run_policy`: run a policy ``messages -> response text`` through the env.

:data:`SUITES` names the four multi-hop suites for ``trace-gym eval``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from environments.wiki_qa.metrics import best_exact_match, best_f1
from trace_gym.types import Message, Task

Policy = Callable[[list[Message]], str]


@dataclass(frozen=True)
class QASuite:
    """One evaluation suite: a dataset of :mod:`environments.wiki_qa.data`, run in ``env_id``.

    Attributes:
        dataset: the loader's name (``load_tasks(dataset, path=...)``).
        env_id: the Gymnasium id episodes run in.
        loader, scorer: ``"module:function"`` of the task loader and of the per-dataset scorer.
        metric: the headline metric (``em``).
    """

    dataset: str
    env_id: str = "trace_gym/WikiQA-v0"
    loader: str = "environments.wiki_qa.data:load_tasks"
    scorer: str = "evaluators.qa.score:score_records"
    metric: str = "em"


#: The multi-hop QA suites, by the name ``trace-gym eval`` knows them.
SUITES: dict[str, QASuite] = {
    "hotpotqa": QASuite("hotpotqa"),
    "2wiki": QASuite("2wiki"),
    "musique": QASuite("musique"),
    "bamboogle": QASuite("bamboogle"),
}


@dataclass(frozen=True)
class QARecord:
    """One scored question: its id, the model's answer (``None``: none given) and the gold aliases."""

    id: str
    prediction: str | None
    golden_answers: tuple[str, ...]

    @classmethod
    def coerce(cls, item: Any, index: int = 0) -> "QARecord":
        """From a record dict, a terminal ``WikiQAEnv`` info dict, or a ``QARecord``."""
        if isinstance(item, QARecord):
            return item
        if not isinstance(item, Mapping):
            raise TypeError(f"record {index} must be a dict or QARecord, got {type(item).__name__}")
        golds = item.get("golden_answers")
        if isinstance(golds, str):
            golds = [golds]
        if not golds:
            raise ValueError(f"record {item.get('id', item.get('task_id', index))!r} has no golden_answers")
        prediction = item.get("prediction", item.get("pred"))
        return cls(str(item.get("id", item.get("task_id", index))), None if prediction is None else str(prediction),
                   tuple(str(g) for g in golds))


@dataclass(frozen=True)
class DatasetScore:
    """EM and F1 (fractions in [0, 1]) over ``n`` questions; ``answered``: fraction with a prediction."""

    dataset: str
    n: int
    em: float
    f1: float
    answered: float


@dataclass(frozen=True)
class QAScores:
    """Per-dataset scores and their unweighted average (over datasets)."""

    datasets: dict[str, DatasetScore]
    average_em: float
    average_f1: float
    complete: bool  # every suite of SUITES is present

    def to_dict(self) -> dict[str, Any]:
        return {"average_em": self.average_em, "average_f1": self.average_f1, "complete": self.complete,
                "datasets": {k: asdict(v) for k, v in self.datasets.items()}}


def score_records(dataset: str, records: Iterable[Any]) -> DatasetScore:
    """EM/F1 of one dataset's records (see :meth:`QARecord.coerce` for accepted shapes)."""
    rows = [QARecord.coerce(r, i) for i, r in enumerate(records)]
    if not rows:
        raise ValueError(f"dataset {dataset!r} has no records to score")
    em = sum(best_exact_match(r.prediction, r.golden_answers) for r in rows) / len(rows)
    f1 = sum(best_f1(r.prediction, r.golden_answers) for r in rows) / len(rows)
    answered = sum(r.prediction is not None for r in rows) / len(rows)
    return DatasetScore(dataset, len(rows), em, f1, answered)


def score(results: Mapping[str, Iterable[Any]]) -> QAScores:
    """Score every dataset of ``results`` (name -> records) and average over datasets."""
    if not results:
        raise ValueError("no datasets to score")
    per = {name: score_records(name, recs) for name, recs in results.items()}
    n = len(per)
    return QAScores(per, sum(s.em for s in per.values()) / n, sum(s.f1 for s in per.values()) / n,
                    all(name in per for name in SUITES))


def markdown(scores: QAScores) -> str:
    """The per-dataset table with an average row (EM and F1 in percent)."""
    lines = ["| dataset | questions | EM | F1 | answered |", "|---|---:|---:|---:|---:|"]
    for s in scores.datasets.values():
        lines.append(f"| {s.dataset} | {s.n} | {100 * s.em:.1f} | {100 * s.f1:.1f} | {100 * s.answered:.0f} % |")
    label = "average" if scores.complete else f"average ({len(scores.datasets)} datasets)"
    lines.append(f"| **{label}** | {sum(s.n for s in scores.datasets.values())} | {100 * scores.average_em:.1f} | "
                 f"{100 * scores.average_f1:.1f} | |")
    return "\n".join(lines)


def load_predictions(path: str | Path) -> list[QARecord]:
    """Records from a JSONL (or JSON list) of ``{"id", "pred" | "prediction", "golden_answers"}``."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    return [QARecord.coerce(r, i) for i, r in enumerate(rows)]


def run_policy(policy: Policy, tasks: Sequence[Task], env: Any = None, **env_kwargs: Any) -> list[QARecord]:
    """Run ``policy`` (chat history -> response text) on each task in a WikiQA env; one record per task.

    Args:
        policy: called with the conversation so far (env observations and the policy's
            own earlier responses as ``assistant`` messages).
        tasks: the questions.
        env: an env to reuse (else ``WikiQAEnv(tasks, **env_kwargs)``).
    """
    if env is None:
        from environments.wiki_qa.env import WikiQAEnv

        env = WikiQAEnv(list(tasks), **env_kwargs)
    records = []
    for task in tasks:
        obs, _ = env.reset(seed=0, options={"task": task})
        messages, info = list(obs), {}
        while True:
            action = policy(list(messages))
            messages.append(Message("assistant", action))
            obs, _, terminated, truncated, info = env.step(action)
            messages += obs
            if terminated or truncated:
                break
        golds = [task.answer] if isinstance(task.answer, str) else list(task.answer)
        records.append(QARecord(task.id, info.get("prediction"), tuple(golds)))
    return records


def write_report(scores: QAScores, out_dir: str | Path) -> tuple[Path, Path]:
    """``qa_scores.json`` and ``qa_scores.md`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qa_scores.json").write_text(json.dumps(scores.to_dict(), indent=2))
    (out / "qa_scores.md").write_text(markdown(scores) + "\n")
    return out / "qa_scores.json", out / "qa_scores.md"
