"""Score BFCL v4 multi-turn episodes per category and overall, the official way.

The metric is the env's: an entry is correct when its episode ends with every user turn
passing the official multi-turn checks (:mod:`environments.bfcl.checker`). Accuracy per
category is correct / entries; the overall score is the unweighted mean of the four
categories' accuracies (BFCL's multi-turn overall), reported only when all four are
present (``overall_complete``) and otherwise over the categories present.

Three ways in:

* :func:`score` on finished episodes: the terminal ``info`` dicts of ``BFCLEnv`` (or
  :class:`EntryResult` rows, or ``trace_gym.agent.loop.Episode`` objects);
* :func:`run_policy`: run a policy ``messages -> response text`` through the env;
* :func:`replay_results`: replay bfcl-eval result files (``{"id", "result": [[step
  responses] per turn]}``, text responses) through the env.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from environments.bfcl import data
from environments.bfcl.checker import FORCE_TERMINATED
from environments.bfcl.env import END_TURN, BFCLEnv
from trace_gym.types import Message

Policy = Callable[[list[Message]], str]


@dataclass(frozen=True)
class EntryResult:
    """One finished entry: ``valid`` is the official verdict; ``failure`` the first failing turn check."""

    task_id: str
    category: str
    valid: bool
    failure: Mapping[str, Any] | None = None
    steps: int = 0

    @classmethod
    def from_info(cls, info: Mapping[str, Any], steps: int = 0) -> "EntryResult":
        """From the ``info`` of ``BFCLEnv``'s terminal step."""
        missing = {"task_id", "category", "valid"} - set(info)
        if missing:
            raise ValueError(f"not a terminal BFCLEnv info (missing {sorted(missing)}): keys {sorted(info)}")
        return cls(info["task_id"], info["category"], bool(info["valid"]), info.get("failure"), steps)


@dataclass
class CategoryScore:
    category: str
    entries: int
    correct: int
    accuracy: float
    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class Scores:
    """Per-category scores and the overall (unweighted mean over categories)."""

    categories: dict[str, CategoryScore]
    overall: float
    overall_complete: bool
    entries: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall,
            "overall_complete": self.overall_complete,
            "entries": self.entries,
            "categories": {k: asdict(v) for k, v in self.categories.items()},
        }


def _as_result(item: Any) -> EntryResult:
    if isinstance(item, EntryResult):
        return item
    if isinstance(item, Mapping):
        return EntryResult.from_info(item)
    turns = getattr(item, "turns", None)  # a trace_gym.agent.loop.Episode
    if turns:
        last = turns[-1]
        if not (last.terminated or last.truncated):
            raise ValueError(f"episode of {item.task.id!r} has not finished")
        return EntryResult.from_info(last.info, len(turns))
    raise TypeError(f"cannot score a {type(item).__name__}; give EntryResult, terminal info dicts or finished Episodes")


def score(results: Iterable[Any]) -> Scores:
    """Accuracy per category and overall. Raises on duplicate task ids."""
    rows = [_as_result(r) for r in results]
    seen: set[str] = set()
    for row in rows:
        if row.task_id in seen:
            raise ValueError(f"task {row.task_id!r} was scored twice")
        seen.add(row.task_id)
    categories = {}
    for category in data.CATEGORIES:
        mine = [r for r in rows if r.category == category]
        if not mine:
            continue
        correct = sum(r.valid for r in mine)
        failures = Counter((r.failure or {}).get("check") or "unknown" for r in mine if not r.valid)
        categories[category] = CategoryScore(category, len(mine), correct, correct / len(mine), dict(sorted(failures.items())))
    unknown = {r.category for r in rows} - set(data.CATEGORIES)
    if unknown:
        raise ValueError(f"results from unknown categories {sorted(unknown)}")
    overall = sum(c.accuracy for c in categories.values()) / len(categories) if categories else float("nan")
    return Scores(categories, overall, len(categories) == len(data.CATEGORIES), len(rows))


def _run_episode(env: BFCLEnv, task_id: str, respond: Callable[[list[Message], dict], str], max_steps: int) -> EntryResult:
    obs, info = env.reset(options={"task_id": task_id})
    history = list(obs)
    for steps in range(1, max_steps + 1):
        action = respond(history, info)
        obs, _, terminated, truncated, info = env.step(action)
        history += [Message("assistant", action), *obs]
        if terminated or truncated:
            return EntryResult.from_info(info, steps)
    raise RuntimeError(f"{task_id}: no end after {max_steps} steps")


def run_policy(policy: Policy, categories: Sequence[str] = data.CATEGORIES, split: str = "all",
               action_format: str = "python", limit: int | None = None, max_steps: int = 2000) -> list[EntryResult]:
    """Run ``policy(history) -> response`` on every entry of ``categories`` (``limit`` per category)."""
    out = []
    for category in categories:
        env = BFCLEnv(category=category, split=split, action_format=action_format)
        for task in env.tasks[:limit]:
            out.append(_run_episode(env, task.id, lambda history, _info: policy(history), max_steps))
        env.close()
    return out


def run_ground_truth(categories: Sequence[str] = data.CATEGORIES, split: str = "all", action_format: str = "python",
                     limit: int | None = None) -> list[EntryResult]:
    """The ground-truth calls as a policy (every entry should be correct)."""
    out = []
    for category in categories:
        env = BFCLEnv(category=category, split=split, action_format=action_format)
        for task in env.tasks[:limit]:
            script = iter(env.reference_actions(task))
            out.append(_run_episode(env, task.id, lambda _h, _i: next(script, END_TURN), 2000))
        env.close()
    return out


def replay_results(records: Iterable[Mapping[str, Any]], action_format: str = "python") -> list[EntryResult]:
    """Replay bfcl-eval result records (``{"id", "result"}``, text responses) through the env.

    Each turn's responses are stepped in order (a non-string response is JSON-encoded).
    When a turn's list is used up before the env ends the turn, an empty response ends
    it. A record whose number of turns differs from the entry's fails with
    ``multi_turn:force_terminated``, as in bfcl-eval's evaluator.
    """
    envs: dict[str, BFCLEnv] = {}
    out = []
    for record in records:
        task_id, turns = record["id"], record["result"]
        if not isinstance(turns, list) or not all(isinstance(t, list) for t in turns):
            raise ValueError(f"{task_id}: 'result' must be a list of turns, each a list of responses")
        category = data.category_of(task_id)
        env = envs.setdefault(category, BFCLEnv(category=category, action_format=action_format))
        _, info = env.reset(options={"task_id": task_id})
        n_turns = info["num_turns"]
        steps, done = 0, False
        for turn in turns[:n_turns] + [[]] * max(0, n_turns - len(turns)):
            queue = [r if isinstance(r, str) else json.dumps(r) for r in turn]
            while True:
                _, _, done, _, info = env.step(queue.pop(0) if queue else "")
                steps += 1
                if info.get("turn_end") or done:
                    break
            if done:
                break
        result = EntryResult.from_info(info, steps)
        if len(turns) != n_turns and result.valid:
            failure = {"turn": min(len(turns), n_turns), "passed": False, "check": FORCE_TERMINATED,
                       "message": f"the result has {len(turns)} turns, the entry {n_turns}"}
            result = EntryResult(result.task_id, result.category, False, failure, steps)
        out.append(result)
    return out


def load_result_files(paths: Iterable[str | Path]) -> list[dict]:
    """Records from bfcl-eval result files (JSON lines) or directories of them."""
    records = []
    for path in map(Path, paths):
        files = sorted(path.rglob("*multi_turn*.json")) if path.is_dir() else [path]
        for file in files:
            with open(file, encoding="utf-8") as f:
                records += [json.loads(line) for line in f if line.strip()]
    return records


def markdown(scores: Scores) -> str:
    """The score table: one row per category, then the overall."""
    from trace_gym.report import markdown_table

    rows = [
        [c.category, c.entries, c.correct, f"{100 * c.accuracy:.2f}", ", ".join(f"{k}: {v}" for k, v in c.failures.items()) or "-"]
        for c in scores.categories.values()
    ]
    label = "overall (mean of 4)" if scores.overall_complete else f"overall (mean of {len(scores.categories)}, incomplete)"
    rows.append([label, scores.entries, sum(c.correct for c in scores.categories.values()), f"{100 * scores.overall:.2f}", ""])
    return markdown_table(["category", "entries", "correct", "accuracy %", "failures (first failing check)"], rows)


def write_report(scores: Scores, out_dir: str | Path, results: Sequence[EntryResult] = ()) -> tuple[Path, Path]:
    """Write ``bfcl_scores.json`` (scores + per-entry verdicts) and ``bfcl_scores.md``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = scores.to_dict()
    payload["results"] = [asdict(r) | {"failure": dict(r.failure) if r.failure else None} for r in results]
    json_path, md_path = out / "bfcl_scores.json", out / "bfcl_scores.md"
    json_path.write_text(json.dumps(payload, indent=2, default=str))
    md_path.write_text("# BFCL v4 multi-turn\n\n" + markdown(scores) + "\n")
    return json_path, md_path
