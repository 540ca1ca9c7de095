"""Evaluation suites: one table, one runner, one scorer per kind.

A suite names its tasks, the env they run in, and how finished episodes are scored.
:data:`SUITES` is the one table (adding a suite is one entry; the QA suites of the
retrieval issue arrive the same way):

================  =====================================  ===============================
suite             tasks                                  scored by
================  =====================================  ===============================
``generated``     the generated math family's held-out   reward (math-verify), avg@k,
                  split (offline; the CPU default)       unbiased pass@k
``aime24`` ...    AIME24, AMC23, MATH500, Minerva,       the same
                  OlympiadBench (``data_path`` or hub)
``bfcl``          BFCL v4 multi-turn, eval split, all    the official multi-turn checks,
                  four categories                        per category and overall
================  =====================================  ===============================

:func:`run_suite` generates through the rollout engine with the agent loop (batched, the
same code as rollouts), with fixed seeds: sample ``j`` of task ``i`` resets its env with
``seed + 1000 i + j`` and the engine draws with ``seed``. Greedy (temperature 0) or
sampled.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from evaluators.math.metrics import avg_at_k, mean_interval, pass_at_k, wilson_interval
from trace_gym.datafiles import split_tasks
from trace_gym.types import Task

#: The held-out share of the generated family (must match the training run's ``heldout_fraction``).
HELDOUT_FRACTION = 0.2
#: Seed offset of the held-out evaluation draw (disjoint ids from any training draw).
HELDOUT_SEED = 7_777


@dataclass(frozen=True)
class Suite:
    """One evaluation suite.

    Attributes:
        name: the suite's name in :data:`SUITES`.
        env_id: registered Gymnasium id the episodes run in.
        load: ``load(limit, seed, path, heldout_fraction) -> list[Task]`` (``limit`` None: all).
        env_kwargs: keyword arguments of ``gymnasium.make``.
        scorer: ``"reward"`` (per-sample reward, success at >= 0.5), ``"bfcl"`` (the
            official checks, per category) or ``"qa"`` (EM and F1, :mod:`evaluators.qa`).
        offline: tasks load without network.
        max_turns, max_turn_tokens, max_episode_tokens: the agent loop's defaults here.
        description: one line.
    """

    name: str
    env_id: str
    load: Callable[..., list[Task]]
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    scorer: str = "reward"
    offline: bool = True
    max_turns: int = 4
    max_turn_tokens: int = 512
    max_episode_tokens: int = 4096
    description: str = ""


# ---------------------------------------------------------------------- task loaders
def generated_heldout(limit: int | None, seed: int = 0, path: str | None = None,
                      heldout_fraction: float = HELDOUT_FRACTION) -> list[Task]:
    """``limit`` held-out prompts of the generated family (digit sums + algebra), distinct texts."""
    from environments.math_python.generated import generate_mixed_tasks

    want = 64 if limit is None else limit
    n, out = 4 * want + 16, []
    while True:
        pool = generate_mixed_tasks(n, seed=HELDOUT_SEED + seed)
        seen: dict[str, Task] = {}
        for t in split_tasks(pool, "heldout", heldout_fraction):
            seen.setdefault(t.prompt, t)
        out = list(seen.values())
        if len(out) >= want or n > 64 * want + 4096:
            return out[:want]
        n *= 2


def generated_train(n: int, seed: int = 0, heldout_fraction: float = HELDOUT_FRACTION) -> list[Task]:
    """``n`` training prompts of the generated family with every held-out prompt removed."""
    from environments.math_python.generated import generate_mixed_tasks

    size = n + n // 2 + 8
    while True:
        kept = split_tasks(generate_mixed_tasks(size, seed=seed), "train", heldout_fraction)
        if len(kept) >= n:
            return kept[:n]
        size *= 2


def _dataset_loader(module: str, name: str) -> Callable[..., list[Task]]:
    """A suite loader of dataset ``name`` through ``module``'s ``load_tasks`` (hub copy, or a
    local file / folder as ``path``)."""

    def load(limit: int | None, seed: int = 0, path: str | None = None, heldout_fraction: float = 0.0) -> list[Task]:
        import importlib

        return importlib.import_module(module).load_tasks(name, path=path or None, limit=limit)

    load.__name__ = f"load_{name}"
    return load


def math_dataset(name: str) -> Callable[..., list[Task]]:
    """A loader of one named math dataset (hub copy, or a local file / folder as ``path``)."""
    return _dataset_loader("environments.math_python.data", name)


def bfcl_eval_split(limit: int | None, seed: int = 0, path: str | None = None,
                    heldout_fraction: float = 0.0) -> list[Task]:
    """BFCL v4 multi-turn eval split, all four categories (``limit`` entries per category)."""
    from environments.bfcl import data

    return [t for c in data.CATEGORIES for t in data.load_tasks(c, "eval")[:limit]]


def qa_dataset(name: str) -> Callable[..., list[Task]]:
    """A loader of one QA dataset of :mod:`environments.wiki_qa.data` (local FlashRAG file or the hub)."""
    return _dataset_loader("environments.wiki_qa.data", name)


def offline_qa_heldout(limit: int | None, seed: int = 0, path: str | None = None,
                       heldout_fraction: float = HELDOUT_FRACTION) -> list[Task]:
    """The held-out split of the offline synthetic QA world's questions (``wiki_qa``'s own tasks)."""
    from environments.wiki_qa.data import offline_tasks

    held = split_tasks(offline_tasks(None, seed=None), "heldout", heldout_fraction)
    return held[:limit] if limit is not None else held


_MATH_ENV = "trace_gym/MathPython-v0"
#: The CPU default's env settings: a one-shot tool demonstration and a last-number fallback.
_TINY_MATH = {"answer_extraction": "boxed_or_last_number", "few_shot": True}

#: Every evaluation suite by name. A new suite is one entry.
SUITES: dict[str, Suite] = {
    "generated": Suite("generated", _MATH_ENV, generated_heldout, _TINY_MATH, max_turns=3, max_turn_tokens=160,
                       max_episode_tokens=1024,
                       description="held-out split of the generated math family (offline CPU default)"),
    **{name: Suite(name, _MATH_ENV, math_dataset(name), offline=False, max_turns=4, max_turn_tokens=2048,
                   max_episode_tokens=8192, description=f"{name} (local file via data_path, else the hub)")
       for name in ("aime24", "amc23", "math500", "minerva", "olympiadbench")},
    "bfcl": Suite("bfcl", "trace_gym/BFCL-v0", bfcl_eval_split, scorer="bfcl", max_turns=64, max_turn_tokens=512,
                  max_episode_tokens=16384, description="BFCL v4 multi-turn, eval split, per category"),
    "wiki_qa": Suite("wiki_qa", "trace_gym/WikiQA-v0", offline_qa_heldout, {"few_shot": True}, scorer="qa",
                     max_turns=4, max_turn_tokens=160, max_episode_tokens=2048,
                     description="held-out split of the offline synthetic QA world (offline; EM and F1)"),
    # the multi-hop QA suites of evaluators.qa (Search-R1's datasets); the env needs a Wikipedia index
    # (env_kwargs), the questions come from data_dir or the hub
    **{name: Suite(name, "trace_gym/WikiQA-v0", qa_dataset(name), scorer="qa", offline=False, max_turns=4,
                   max_turn_tokens=512, max_episode_tokens=8192, description=f"{name} (EM and F1; local FlashRAG "
                   "file via data_dir, else the hub; index via env_kwargs)")
       for name in ("hotpotqa", "2wiki", "musique", "bamboogle")},
}


@dataclass(frozen=True)
class TrainData:
    """A named training set (``trace-gym train data=NAME``): ``load(n, seed, path)``."""

    load: Callable[..., list[Task]]
    offline: bool
    description: str


def _shuffled(tasks: list[Task], n: int, seed: int) -> list[Task]:
    order = np.random.default_rng(seed).permutation(len(tasks))
    return [tasks[i] for i in order[:n]]


def deepscaler_train(n: int, seed: int = 0, path: str | None = None) -> list[Task]:
    """``n`` DeepScaleR problems (a seeded draw), from ``path`` or the hub."""
    return _shuffled(math_dataset("deepscaler")(None, path=path), n, seed)


def bfcl_train_split(n: int, seed: int = 0, path: str | None = None) -> list[Task]:
    """``n`` entries (a seeded draw) of the BFCL multi-turn train split, all four categories (80 %)."""
    from environments.bfcl import data

    return _shuffled([t for c in data.CATEGORIES for t in data.load_tasks(c, "train")], n, seed)


#: Named training sets. The generated family needs none (``data`` empty: the family's own
#: tasks minus the held-out split).
TRAIN_DATA: dict[str, TrainData] = {
    "generated": TrainData(lambda n, seed=0, path=None: generated_train(n, seed), True,
                           "generated math family minus its held-out split"),
    "deepscaler": TrainData(deepscaler_train, False, "DeepScaleR-Preview (hub agentica-org/DeepScaleR-Preview-Dataset)"),
    "bfcl": TrainData(bfcl_train_split, True, "BFCL v4 multi-turn train split (80 %, all categories)"),
    "hotpotqa": TrainData(lambda n, seed=0, path=None: _shuffled(_qa_train("hotpotqa", path), n, seed), False,
                          "HotpotQA train split (FlashRAG hub copy, or a local file)"),
}


def _qa_train(name: str, path: str | None) -> list[Task]:
    from environments.wiki_qa.data import load_tasks

    return load_tasks(name, path=path or None, split="train")


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {sorted(SUITES)}")
    return SUITES[name]


# ---------------------------------------------------------------------- running
def run_episodes(engine: Any, suite: Suite, tasks: Sequence[Task], *, samples: int, temperature: float, seed: int,
                 env_kwargs: Mapping[str, Any] | None = None, max_turns: int | None = None, max_turn_tokens: int | None = None,
                 max_episode_tokens: int | None = None, progress: bool = False, batch_episodes: int = 64) -> list[list[Any]]:
    """Run ``samples`` episodes of every task; returns the finished episodes per task.

    Episodes run ``batch_episodes`` at a time (the engine decodes them as one batch).
    """
    import gymnasium
    from tqdm.auto import tqdm

    import trace_gym  # noqa: F401  (registers the env ids)
    from trace_gym.agent import AgentConfig, AgentRunner
    from trace_gym.types import SamplingParams

    if temperature == 0 and samples > 1:
        raise ValueError(f"greedy decoding (temperature 0) gives {samples} identical samples; use samples=1 "
                         "or temperature > 0")
    agent_cfg = AgentConfig(max_turn_tokens=max_turn_tokens or suite.max_turn_tokens,
                            max_episode_tokens=max_episode_tokens or suite.max_episode_tokens,
                            max_turns=max_turns or suite.max_turns)
    sampling = SamplingParams(max_tokens=agent_cfg.max_turn_tokens, temperature=temperature, seed=seed)
    kwargs = {**dict(suite.env_kwargs), **dict(env_kwargs or {})}
    make_env = functools.partial(gymnasium.make, suite.env_id, disable_env_checker=True, **kwargs)
    out: list[list[Any]] = [[] for _ in tasks]
    bar = tqdm(total=len(tasks), desc=f"eval {suite.name}", disable=not progress, leave=False, dynamic_ncols=True)
    runner = AgentRunner(engine, engine.tokenizer, make_env, sampling, agent_cfg)
    per_batch = max(1, batch_episodes // samples)
    try:
        for lo in range(0, len(tasks), per_batch):
            episodes = []
            for i in range(lo, min(lo + per_batch, len(tasks))):  # a task's samples: one request, n = samples
                episodes += runner.start_many([(tasks[i], seed + 1000 * i + j) for j in range(samples)], anchor=i)
            for ep in runner.run(episodes):
                out[ep.anchor].append(ep)
            bar.update(min(per_batch, len(tasks) - lo))
    finally:
        runner.close()
        bar.close()
    return out


def score_episodes(suite: Suite, tasks: Sequence[Task], episodes: Sequence[Sequence[Any]],
                   pass_k: Sequence[int] = (1,)) -> dict[str, Any]:
    """Accuracy (avg@k over samples), unbiased pass@k, a 95 % interval over tasks, per-task
    rewards; BFCL suites add the official per-category table."""
    rewards = [[float(ep.reward) for ep in eps] for eps in episodes]
    success = [[float(r >= 0.5) for r in rs] for rs in rewards]
    n = min((len(s) for s in success), default=0)
    per_task = [float(np.mean(s)) for s in success]
    if n == 1:
        lo, hi = wilson_interval(int(sum(per_task)), len(per_task))
    else:
        lo, hi = mean_interval(per_task)
    result: dict[str, Any] = {
        "suite": suite.name,
        "tasks": len(tasks),
        "samples": n,
        "accuracy": avg_at_k(success),
        "accuracy_ci": [lo, hi],
        "mean_reward": avg_at_k(rewards),
        "pass_at_k": {str(k): float(np.mean([pass_at_k(len(s), int(sum(s)), k) for s in success]))
                      for k in pass_k if 1 <= k <= n},
        "per_task": {t.id: rs for t, rs in zip(tasks, rewards)},
        "generated_tokens": int(sum(len(turn.action_ids) for eps in episodes for ep in eps for turn in ep.own_turns)),
    }
    if suite.scorer == "bfcl":
        result["bfcl"] = bfcl_scores(tasks, episodes)
    if suite.scorer == "qa":
        result["qa"] = qa_scores(suite.name, tasks, episodes)
    return result


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


def bfcl_entry_results(tasks: Sequence[Task], episodes: Sequence[Sequence[Any]]) -> list[Any]:
    """One official verdict per episode (the first sample of each task); an episode the agent
    loop cut (turn or token limit) before the env ended it is a failure ``trace_gym:<reason>``."""
    from environments.bfcl import data
    from evaluators.bfcl import EntryResult

    out = []
    for task, eps in zip(tasks, episodes):
        ep = eps[0]
        last = ep.turns[-1] if ep.turns else None
        if last is not None and "valid" in last.info and last.terminated:
            out.append(EntryResult.from_info(last.info, len(ep.turns)))
        else:
            reason = (last.truncation if last is not None else None) or ("error" if ep.error else "no_turn")
            out.append(EntryResult(task.id, data.category_of(task.id), False, {"check": f"trace_gym:{reason}"},
                                   len(ep.turns)))
    return out


def bfcl_scores(tasks: Sequence[Task], episodes: Sequence[Sequence[Any]]) -> dict[str, Any]:
    from evaluators.bfcl import markdown, score

    scores = score(bfcl_entry_results(tasks, episodes))
    return scores.to_dict() | {"markdown": markdown(scores)}


def evaluate(engine: Any, suite_name: str, *, limit: int | None, samples: int = 1, temperature: float = 0.0,
             seed: int = 0, pass_k: Sequence[int] = (1,), data_path: str | None = None,
             heldout_fraction: float = HELDOUT_FRACTION, progress: bool = False,
             agent_limits: Mapping[str, int] | None = None, env_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Load a suite's tasks, run them through ``engine`` and score them (one suite)."""
    suite = get_suite(suite_name)
    t0 = time.perf_counter()
    tasks = suite.load(limit, seed=0, path=data_path or None, heldout_fraction=heldout_fraction)
    if not tasks:
        raise ValueError(f"suite {suite_name!r} has no tasks (limit={limit}, data_path={data_path!r})")
    episodes = run_episodes(engine, suite, tasks, samples=samples, temperature=temperature, seed=seed,
                            env_kwargs=env_kwargs, progress=progress, **dict(agent_limits or {}))
    result = score_episodes(suite, tasks, episodes, pass_k)
    result.update(temperature=temperature, seed=seed, seconds=time.perf_counter() - t0)
    if math.isnan(result["accuracy"]):
        raise RuntimeError(f"suite {suite_name!r}: no episode finished")
    return result
