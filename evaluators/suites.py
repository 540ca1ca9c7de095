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
                  OlympiadBench (``data_dir`` or hub)
``mmlu_pro``,     MMLU-Pro, ARC-Challenge, GPQA-diamond  the option letter, exact
``arc_c``,        (multiple choice, out of domain;       (:mod:`evaluators.choice`);
``gpqa_diamond``  ``data_dir`` or hub)                   MMLU-Pro per category too
``bfcl``          BFCL v4 multi-turn, eval split, all    the official multi-turn checks,
                  four categories                        per category and overall
an env id         the held-out split of a registered     reward (success at >= 0.5)
                  env's task loader (:func:`env_suite`)
================  =====================================  ===============================

:func:`get_suite` looks a name up in :data:`SUITES`, else takes it as a registered env id
(or env family) that offers tasks; :func:`register_suite` adds a named suite (plugins).

:func:`evaluate` runs one suite end to end: its tasks, the runner
(:func:`~evaluators.episodes.run_episodes`: the rollout engine with the agent loop, fixed
seeds) and the scorer (:func:`~evaluators.scoring.score_episodes`). The runner and the
scorers live in :mod:`evaluators.episodes` and :mod:`evaluators.scoring`; their names are
importable from here too.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

from evaluators import choice
from evaluators.episodes import episode_transcripts, run_episodes
from evaluators.scoring import score_episodes
from evaluators.suite import Suite
from trace_gym.env.datafiles import HELDOUT_FRACTION, HubUnreachable, split_tasks
from trace_gym.types import Task

#: Seed offset of the held-out evaluation draw (disjoint ids from any training draw).
HELDOUT_SEED = 7_777


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


def choice_dataset(name: str) -> Callable[..., list[Task]]:
    """A loader of one multiple-choice set of :mod:`evaluators.choice` (hub copy, or a local file / folder)."""
    return _dataset_loader("evaluators.choice", name)


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
                   max_episode_tokens=8192, description=f"{name} (local file via data_dir, else the hub)",
                   data_file=True)
       for name in ("aime24", "amc23", "math500", "minerva", "olympiadbench")},
    # the paper's out-of-domain suites: multiple choice in the math env (Python tool kept, as in
    # training), graded by the option letter; zero-shot prompts (evaluators.choice)
    **{name: Suite(name, _MATH_ENV, choice_dataset(name), choice.env_kwargs(name), offline=False, max_turns=4,
                   max_turn_tokens=2048, max_episode_tokens=8192, data_file=True,
                   breakdown="category" if name == "mmlu_pro" else "",
                   description=f"{title}, multiple choice ({choice.DATASETS[name].max_options} options at most"
                   f"{', per category' if name == 'mmlu_pro' else ''}; local file via data_dir, else the hub)")
       for name, title in (("mmlu_pro", "MMLU-Pro"), ("arc_c", "ARC-Challenge"), ("gpqa_diamond", "GPQA-diamond"))},
    "bfcl": Suite("bfcl", "trace_gym/BFCL-v0", bfcl_eval_split, scorer="bfcl", max_turns=64, max_turn_tokens=512,
                  max_episode_tokens=16384, description="BFCL v4 multi-turn, eval split, per category"),
    "wiki_qa": Suite("wiki_qa", "trace_gym/WikiQA-v0", offline_qa_heldout, {"few_shot": True}, scorer="qa",
                     max_turns=4, max_turn_tokens=160, max_episode_tokens=2048,
                     description="held-out split of the offline synthetic QA world (offline; EM and F1)"),
    # the multi-hop QA suites of evaluators.qa (Search-R1's datasets); the env needs a Wikipedia index
    # (env_kwargs), the questions come from data_dir or the hub
    **{name: Suite(name, "trace_gym/WikiQA-v0", qa_dataset(name), scorer="qa", offline=False, max_turns=4,
                   max_turn_tokens=512, max_episode_tokens=8192, description=f"{name} (EM and F1; local FlashRAG "
                   "file via data_dir, else the hub; index via env_kwargs)", data_file=True)
       for name in ("hotpotqa", "2wiki", "musique", "bamboogle")},
}


def env_heldout(family: Any) -> Callable[..., list[Task]]:
    """A suite loader over an env's own task loader (a :class:`trace_gym.env.family.EnvFamily`):
    its held-out split, the prompts that ``trace-gym train`` on that env never trains on
    (``limit`` None: 64 tasks; ``heldout_fraction`` 0: the loader's first tasks, no split)."""

    def load(limit: int | None, seed: int = 0, path: str | None = None,
             heldout_fraction: float = HELDOUT_FRACTION) -> list[Task]:
        want = 64 if limit is None else limit
        if heldout_fraction <= 0:
            return family.load_tasks(want, seed=HELDOUT_SEED + seed)[:want]
        n = 4 * want + 16
        while True:
            pool = family.load_tasks(n, seed=HELDOUT_SEED + seed)
            held = split_tasks(pool, "heldout", heldout_fraction)
            if len(held) >= want or len(pool) < n or n > 64 * want + 4096:  # enough, or the loader ran dry
                break
            n *= 2
        if want and not held:
            raise ValueError(f"none of the {len(pool)} prompts of {family.env_id}'s task loader is held out at "
                             f"heldout_fraction={heldout_fraction}; heldout_fraction=0 takes its tasks unsplit")
        return held[:want]

    load.__name__ = f"heldout_of_{family.env_id.split('/')[-1]}"
    return load


def env_suite(name: str, family: Any, **fields: Any) -> Suite:
    """The suite of an env that offers tasks: its held-out split (:func:`env_heldout`), scored
    by reward, with the agent-loop defaults of :class:`Suite` unless ``fields`` say otherwise."""
    fields = {"env_kwargs": dict(family.env_kwargs), "hash_tasks": True,
              "description": f"held-out split of {family.env_id}'s tasks", **fields}
    return Suite(name, family.env_id, env_heldout(family), **fields)


def register_suite(name: str, env_id: str, load: Callable[..., list[Task]] | None = None, **fields: Any) -> Suite:
    """Add a named suite to :data:`SUITES` (plugins and user code); ``--suite NAME`` and
    ``eval_suite=NAME`` then take it.

    Args:
        name: the suite's name.
        env_id: the registered env id its episodes run in (``trace_gym/`` when it has no namespace).
        load: ``load(limit, seed=0, path=None, heldout_fraction=0.2) -> list[Task]``; ``None``:
            the held-out split of the env's own task loader (:func:`env_heldout`).
        fields: any other :class:`Suite` field (``scorer``, ``env_kwargs``, ``max_turns``,
            ``max_turn_tokens``, ``max_episode_tokens``, ``description``, ``offline``, ...);
            ``hash_tasks`` defaults to True (the cache key follows what the loader returns).

    Returns the suite. Registering an equal suite again is a no-op.

    Raises:
        ValueError: an empty name, a name taken by another suite, or a bad field.
    """
    if not isinstance(name, str) or not name.strip() or "," in name:
        raise ValueError(f"a suite name must be a non-empty str without commas, got {name!r}")
    full = env_id if "/" in env_id else f"trace_gym/{env_id}"
    known = {f.name for f in dataclasses.fields(Suite)} - {"name", "env_id", "load"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"register_suite({name!r}): unknown field(s) {unknown}; known: {sorted(known)}")
    old = SUITES.get(name)
    if old is not None and old.env_id != full:
        raise ValueError(f"suite name {name!r} is taken (env {old.env_id}); known: {sorted(SUITES)}")
    if load is None:
        from trace_gym.registry import resolve_env

        suite = env_suite(name, resolve_env(full), **fields)
    else:
        suite = Suite(name, full, load, **{"hash_tasks": True, "description": f"{name} ({full})", **fields})
    from evaluators.scoring import SCORERS

    if suite.scorer not in SCORERS:
        raise ValueError(f"register_suite({name!r}): scorer must be one of {', '.join(map(repr, SCORERS))}, "
                         f"got {suite.scorer!r}")
    if old is not None and (old.env_kwargs, old.scorer) != (suite.env_kwargs, suite.scorer):
        raise ValueError(f"suite name {name!r} is taken (env {old.env_id}); known: {sorted(SUITES)}")
    if old is None:
        SUITES[name] = suite
    return SUITES[name]


def get_suite(name: str, task_kwargs: Mapping[str, Any] | None = None) -> Suite:
    """The suite ``name``: a :data:`SUITES` entry, else the held-out split of a registered env
    id (``trace_gym/Echo-v0``, ``Echo-v0``), env family, or other ecosystem's env
    (``reasoning_gym:chain_sum?min_terms=2``) that offers tasks (:func:`env_suite`), its task
    loader called with ``task_kwargs`` on top of its own (a :data:`SUITES` entry takes none).

    Raises:
        ValueError: neither (with the closest names), or an env without a task loader.
    """
    if name in SUITES:
        return SUITES[name]
    from gymnasium.envs.registration import registry

    from trace_gym.registry import ENV_FAMILIES, NAMESPACE, env_ids, resolve_env

    from trace_gym.registry import ECOSYSTEMS

    if name.partition(":")[0] in ECOSYSTEMS and ":" in name:  # another ecosystem's env (gem:<id>, ...)
        return env_suite(name, resolve_env(name, task_kwargs=task_kwargs))
    ids = env_ids()  # registers the built-in and plugin ids
    if name not in ENV_FAMILIES and name not in registry and f"{NAMESPACE}/{name}" not in registry:
        from trace_gym.utils.suggest import did_you_mean

        short = [i.split("/", 1)[1] for i in ids]
        raise ValueError(f"unknown suite {name!r}{did_you_mean(name, [*SUITES, *short])}; known suites: "
                         f"{sorted(SUITES)}, or a registered env id with a task loader: {short}")
    return env_suite(name, resolve_env(name, task_kwargs=task_kwargs))


def load_suite_tasks(suite: Suite, limit: int | None, data_path: str | None = None,
                     heldout_fraction: float = HELDOUT_FRACTION) -> list[Task]:
    """The suite's tasks (``limit`` None: all, or the loader's default).

    Raises:
        ValueError: no tasks, or tasks to come from the hub, which cannot be reached (one
            line naming ``data_dir``, the file names looked for there and what they hold).
    """
    try:
        tasks = suite.load(limit, seed=0, path=data_path or None, heldout_fraction=heldout_fraction)
    except HubUnreachable as exc:
        first, *rest = suite.data_file_names()
        raise ValueError(f"suite {suite.name!r} reads {exc.hub_id} from the hub, which cannot be reached "
                         f"({exc.reason}); offline, set data_dir=DIR holding {first} (or {', '.join(rest)}): "
                         f"{exc.local_hint}") from None
    if not tasks:
        raise ValueError(f"suite {suite.name!r} has no tasks (limit={limit}, file={data_path!r}, "
                         f"heldout_fraction={heldout_fraction})")
    return list(tasks)


# ---------------------------------------------------------------------- one suite end to end
def evaluate(engine: Any, suite_name: str, *, limit: int | None, samples: int = 1, temperature: float = 0.0,
             seed: int = 0, pass_k: Sequence[int] = (1,), data_path: str | None = None,
             heldout_fraction: float = HELDOUT_FRACTION, progress: bool = False,
             agent_limits: Mapping[str, int] | None = None, env_kwargs: Mapping[str, Any] | None = None,
             tasks: Sequence[Task] | None = None, transcripts: int = 0) -> dict[str, Any]:
    """Load a suite's tasks (unless given), run them through ``engine`` and score them (one
    suite). With ``transcripts`` > 0 the result's ``"transcripts"`` holds that many
    (:func:`episode_transcripts`)."""
    suite = get_suite(suite_name)
    t0 = time.perf_counter()
    if tasks is None:
        tasks = load_suite_tasks(suite, limit, data_path, heldout_fraction)
    episodes = run_episodes(engine, suite, tasks, samples=samples, temperature=temperature, seed=seed,
                            env_kwargs=env_kwargs, progress=progress, **dict(agent_limits or {}))
    result = score_episodes(suite, tasks, episodes, pass_k)
    result.update(temperature=temperature, seed=seed, seconds=time.perf_counter() - t0)
    if transcripts:
        result["transcripts"] = episode_transcripts(suite, tasks, episodes, transcripts)
    if math.isnan(result["accuracy"]):
        raise RuntimeError(f"suite {suite_name!r}: no episode finished")
    return result
