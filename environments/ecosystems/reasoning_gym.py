"""reasoning-gym (open-thought's procedural datasets, PyPI ``reasoning-gym``) under the
trace_gym contract: ``--env reasoning_gym:<dataset>[?config]``.

A reasoning-gym dataset is a seeded generator of entries ``{"question", "answer",
"metadata"}`` with its own scorer ``score_answer(answer, entry) -> float`` in [0, 1].
:class:`ReasoningGymEnv` asks an entry's question, reads the answer from the model's
reply with reasoning-gym's own ``extract_answer`` (the last ``<answer>...</answer>``) and
rewards it with the dataset's own ``score_answer``; the score is never ours.

Ids: ``reasoning_gym:<name>`` for any name in ``reasoning_gym.factory.DATASETS``
(:func:`available`); the query is the dataset's config, the fields of its config
dataclass but ``seed`` and ``size`` (which come from the task loader):
``reasoning_gym:chain_sum?min_terms=2&max_terms=3``. Adapter options are env keyword
arguments (``--env-kwargs``): ``max_attempts``, ``system_prompt``, ``few_shot``,
``score_timeout_s``, ``snapshot``, ``max_turns``.

Tasks: :func:`load_tasks` builds ``create_dataset(name, seed=seed, size=n, **config)`` and
gives each entry as a :class:`Task` (prompt: its question; answer: its answer; metadata:
the dataset, config, seed, index and the entry itself in a JSON form that keeps tuples
and non-string keys, so the scorer gets back exactly the entry it made).

## Action Space
``TextAction``: the model's raw text. Only its last :data:`MAX_SCAN_CHARS` characters are
scanned for the answer tag (reasoning-gym's regex is quadratic in unclosed ``<answer>``
tags; the last answer is the one that counts, so the tail holds it).

## Observation Space
At reset, a system message (reasoning-gym's ``SYSTEM_PROMPTS[system_prompt]``, by default
``"default"``: think, then ``<answer>answer here</answer>``; none with ``system_prompt=None``)
and a user message with the question; with ``few_shot=True``, first one solved example
of the same dataset and config (a user question and an assistant reply that is just
``<answer>gold</answer>``, from a fixed seed no task uses), so that small models see the
format. After a wrong answer with attempts left, one user
message: :data:`FEEDBACK`. Nothing after the last answer.

## Rewards
The dataset's ``score_answer(extract_answer(tail), entry)`` (``None`` when no tag was
found; every dataset scores that 0) on the turn that ends the episode; 0 on a turn that
earns another attempt. A scorer that raises (some do on malformed answers:
``prime_factorization`` on any non-integer, ``boxnet`` on a list), or returns a non-finite
or non-number score, scores 0 with ``info["env_error"]``, and the episode goes on as after
any wrong answer: it is the model's answer that failed, not the env. An episode is a
success for trace_gym when its reward is at least 0.5 (``SUCCESS_THRESHOLD``); the
datasets' partial credit (an answer that contains the oracle answer scores
``len(oracle) / len(answer)``) can reach it.

## Episode End
Terminated after an answer scoring 1.0 (full marks) or the ``max_attempts``-th answer
(default 1: single turn); truncated after our ``max_turns`` steps.

## Snapshot
``copy`` (default): the episode's state is plain Python (the entry and the attempts
used), pickled. ``replay`` also works (scoring is deterministic).

Not carried over: curricula (``create_curriculum``; pick a difficulty with the config
query instead), composite datasets' weighting across runs, and GEM's ``rg:<name>`` envs
(use this adapter instead).

## Scoring is sandboxed
Several scorers evaluate the answer text as code (``eval``, sympy's ``parse_expr``), and
some run for tens of seconds on hostile numbers. Every score therefore runs in a forked
child of a sandboxed kernel of the math env, is killed after ``score_timeout_s`` of CPU time
(default 5 s, not wall clock; the answer then scores 0 with ``info["env_error"]``), and, for a dataset
whose scorer evaluates text, an answer outside its dataset's allow-list grammar
(:mod:`environments.ecosystems.answer_grammar`) or holding code-reaching names scores 0
unscored, with ``info["env_error"]`` naming the rule
(:mod:`environments.ecosystems.sandboxed_scoring`).

## Version History
v0: first version (reasoning-gym 0.1.23).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Mapping, Sequence

from environments.ecosystems.entry_json import from_json, to_json
from trace_gym.env.process_state import process_state_kept
from trace_gym.env.adapter import ForeignEnv, options_of
from trace_gym.env.boundary import error_text
from trace_gym.types import Message, Task

PACKAGE = "reasoning-gym"
PREFIX = "reasoning_gym"
ENTRY_POINT = "environments.ecosystems.reasoning_gym:ReasoningGymEnv"
TASK_LOADER = "environments.ecosystems.reasoning_gym:load_tasks"
#: keyword arguments of :class:`ReasoningGymEnv` an ``--env-kwargs`` may set
ENV_OPTIONS = ("max_attempts", "system_prompt", "few_shot", "score_timeout_s", "snapshot", "max_turns", "call_timeout_s",
               "max_observation_chars")
#: the dataset seed of the ``few_shot`` example (no task loader call uses it by default)
FEW_SHOT_SEED = 987_654_321
#: config fields the task loader sets itself
LOADER_FIELDS = ("seed", "size")
#: characters of an action (its tail) scanned for ``<answer>...</answer>``
MAX_SCAN_CHARS = 8192
#: what the model reads after a wrong answer with attempts left
FEEDBACK = ("Your answer is incorrect, try again ({left} attempt(s) left). "
            "Give only the final answer inside <answer></answer>.")
#: tasks a ``reset()`` without ``options["task"]`` draws from
DEFAULT_POOL = 8
# --- the dataset -------------------------------------------------------------------------------------


def _where(name: str) -> str:
    return f"--env {PREFIX}:{name}"


def _rg() -> Any:
    """``reasoning_gym.factory``, imported with the process state kept (its import draws
    from the global ``random``)."""
    try:
        with process_state_kept():
            from reasoning_gym import factory
    except ImportError as exc:
        raise ValueError(f"--env {PREFIX}:...: cannot import reasoning_gym ({exc}); `pip install {PACKAGE}`") from None
    return factory


def config_fields(name: str) -> list[str]:
    """The config a ``reasoning_gym:<name>?...`` query may set (its config dataclass's
    fields but :data:`LOADER_FIELDS`); one line with did-you-mean for an unknown name."""
    datasets = _rg().DATASETS
    if name not in datasets:
        from trace_gym.utils.suggest import did_you_mean

        raise ValueError(f"{_where(name)}: not a reasoning-gym dataset{did_you_mean(name, sorted(datasets))}; "
                         f"`trace-gym envs --ecosystem {PREFIX}` lists its {len(datasets)} datasets")
    return [f.name for f in dataclasses.fields(datasets[name][1]) if f.name not in LOADER_FIELDS]


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=repr)


def _create(name: str, config: Mapping[str, Any], seed: int, size: int) -> Any:
    """``create_dataset(name, seed=seed, size=size, **config)``, its failure in one line."""
    factory = _rg()
    options_of(config, config_fields(name), _where(name))
    try:
        with process_state_kept():  # a dataset may seed numpy's global RNG (pool_matrix)
            return factory.create_dataset(name, seed=seed, size=size, **config)
    except Exception as exc:  # noqa: BLE001  (the config's validate() asserts; bad types)
        raise ValueError(f"{_where(name)}: reasoning-gym refused this config ({error_text(exc)[:300]})") from None


@functools.lru_cache(maxsize=64)
def _scorer(name: str, config_key: str) -> Any:
    """One dataset object per (dataset, config) and process: what :class:`ReasoningGymEnv`
    calls ``score_answer`` on (a scorer reads only its config and the entry)."""
    return _create(name, json.loads(config_key), seed=0, size=1)


def _tag(name: str, config: Mapping[str, Any]) -> str:
    """``name``, with a digest of a non-default config (task ids of two configs differ)."""
    if not config:
        return name
    return f"{name}@{hashlib.blake2b(_config_key(config).encode(), digest_size=4).hexdigest()}"


def load_tasks(n: int, seed: int = 0, *, dataset: str, config: Mapping[str, Any] | None = None) -> list[Task]:
    """The ``n`` entries of ``create_dataset(dataset, seed=seed, size=n, **config)`` as tasks.

    Raises:
        ValueError: ``n < 1``, an unknown dataset or config field, a config the dataset
            refuses, or an entry with no JSON form (one line each).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    config = dict(config or {})
    data = _create(dataset, config, seed=seed, size=n)
    tag, tasks = _tag(dataset, config), []
    for index in range(n):
        with process_state_kept():
            entry = data[index]
        try:
            encoded = to_json(entry, f"entry {index}")
        except TypeError as exc:
            raise ValueError(f"{_where(dataset)}: {exc}; this adapter cannot carry it in a Task") from None
        tasks.append(Task(id=f"{tag}/seed{seed}/{index}", prompt=str(entry["question"]), answer=encoded["answer"],
                          source=f"{PREFIX}:{dataset}",
                          metadata={"dataset": dataset, "config": json.loads(_config_key(config)),
                                    "dataset_seed": seed, "index": index, "entry": encoded}))
    return tasks


@functools.lru_cache(maxsize=64)
def _example(name: str, config_key: str) -> dict:
    """The ``few_shot`` example: entry 0 of the dataset at :data:`FEW_SHOT_SEED`."""
    data = _create(name, json.loads(config_key), seed=FEW_SHOT_SEED, size=1)
    with process_state_kept():
        return dict(data[0])


@functools.lru_cache(maxsize=64)
def _pool(name: str, config_key: str) -> tuple[Task, ...]:
    return tuple(load_tasks(DEFAULT_POOL, 0, dataset=name, config=json.loads(config_key)))


# --- the adapter ------------------------------------------------------------------------------


@dataclasses.dataclass
class Episode:
    """The state of one episode (what the ``copy`` strategy pickles)."""

    entry: dict
    attempts: int = 0


class ReasoningGymEpisode:
    """Episodes of one reasoning-gym dataset (a :class:`~trace_gym.env.adapter.ForeignEpisode`):
    an entry's question, then the dataset's own score of each answer; the state, an
    :class:`Episode`, is plain Python (``copy``). Arguments as :class:`ReasoningGymEnv`'s.

    Raises:
        ValueError: an unknown dataset, config or system prompt, or a bad ``max_attempts``
            or ``score_timeout_s`` (one line each).
    """

    snapshot_strategies = ("copy", "replay")
    global_rng = False

    def __init__(self, dataset: str = "chain_sum", config: Mapping[str, Any] | None = None, *, max_attempts: int = 1,
                 system_prompt: str | None = "default", few_shot: bool = False, score_timeout_s: float = 5.0):
        self.current: Episode | None = None  # the episode under way
        if not isinstance(score_timeout_s, (int, float)) or isinstance(score_timeout_s, bool) or score_timeout_s <= 0:
            raise ValueError(f"{_where(dataset)}: score_timeout_s must be a positive number, got {score_timeout_s!r}")
        self.few_shot, self.score_timeout_s = bool(few_shot), float(score_timeout_s)
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise ValueError(f"{_where(dataset)}: max_attempts must be a positive int, got {max_attempts!r}")
        self.dataset, self.config, self.max_attempts = dataset, dict(config or {}), max_attempts
        self._config_key = _config_key(self.config)
        self._data = _scorer(dataset, self._config_key)
        with process_state_kept():
            from reasoning_gym.utils import SYSTEM_PROMPTS
        if system_prompt is not None and system_prompt not in SYSTEM_PROMPTS:
            from trace_gym.utils.suggest import did_you_mean

            raise ValueError(f"{_where(dataset)}: system_prompt {system_prompt!r} is not one of reasoning-gym's "
                             f"{sorted(SYSTEM_PROMPTS)}{did_you_mean(system_prompt, SYSTEM_PROMPTS)} (or None)")
        self.system_prompt = None if system_prompt is None else SYSTEM_PROMPTS[system_prompt]

    @property
    def env_key(self) -> str:
        return f"{PREFIX}:{_tag(self.dataset, self.config)}"

    def default_tasks(self) -> Sequence[Task]:
        return _pool(self.dataset, self._config_key)

    def begin(self, task: Task, seed: int):
        meta = task.metadata
        if meta.get("dataset") != self.dataset or "entry" not in meta:
            raise ValueError(f"task {task.id!r} is not a reasoning-gym {self.dataset!r} task (its metadata names "
                             f"dataset {meta.get('dataset')!r}{'' if 'entry' in meta else ' and holds no entry'})")
        if "config" in meta and _config_key(meta["config"]) != self._config_key:
            raise ValueError(f"task {task.id!r} was made with config {dict(meta['config'])}, this env scores "
                             f"{self.dataset} with {self.config}")
        self.current = Episode(entry=from_json(meta["entry"]))
        obs = [] if self.system_prompt is None else [Message("system", self.system_prompt)]
        if self.few_shot:
            example = _example(self.dataset, self._config_key)
            obs += [Message("user", str(example["question"])), Message("assistant", f"<answer>{example['answer']}</answer>")]
        return [*obs, Message("user", str(self.current.entry["question"]))], {}

    def _refusal(self, answer: str | None) -> str | None:
        """Why ``answer`` is refused unscored, or ``None``: for a scorer that evaluates text,
        a code-reaching name (:data:`~.sandboxed_scoring.CODE_NAMES`), then an answer
        outside its dataset's grammar (:func:`~.answer_grammar.refusal`, the gate)."""
        from environments.ecosystems.answer_grammar import refusal
        from environments.ecosystems.sandboxed_scoring import CODE_NAMES, evaluates_text

        if answer is None:
            return None
        metadata = self.current.entry.get("metadata") or {}
        name, evaluates = self.dataset, evaluates_text(type(self._data))
        if name == "composite":  # scored by its source dataset's scorer
            name = str(metadata.get("source_dataset", name))
            inner = getattr(self._data, "datasets", {}).get(name)
            evaluates = True if inner is None else evaluates_text(type(inner))
        found = CODE_NAMES.search(answer) if evaluates else None
        if found is not None:
            return (f"answer not scored: it holds {found.group(0)!r}, and the {self.dataset} scorer "
                    "evaluates text (code in answers is refused)")
        return refusal(name, answer, metadata, evaluates=evaluates)

    def _score(self, answer: str | None) -> tuple[float, str | None]:
        """The dataset's score of ``answer``, computed in the sandbox, or 0 and why when it
        failed, ran out of time, or was refused (:meth:`_refusal`)."""
        from environments.ecosystems.sandboxed_scoring import shared_scorer

        refused = self._refusal(answer)
        if refused is not None:
            return 0.0, refused
        scorer = shared_scorer()
        scorer.timeout_s = self.score_timeout_s
        return scorer.score(self.dataset, json.loads(self._config_key), answer, to_json(self.current.entry))

    def act(self, action: str):
        from reasoning_gym.utils import extract_answer

        episode = self.current
        episode.attempts += 1
        answer = extract_answer(action[-MAX_SCAN_CHARS:])
        score, error = self._score(answer)
        info: dict[str, Any] = {"score": score, "attempt": episode.attempts, "answer_found": answer is not None}
        if error is not None:
            info["env_error"] = error
        if score >= 1.0 or episode.attempts >= self.max_attempts:
            return [], score, True, False, info
        return [Message("user", FEEDBACK.format(left=self.max_attempts - episode.attempts))], 0.0, False, False, info

    def load_task(self, task_id: str) -> Task:
        raise ValueError(f"{self.env_key} cannot load a task by id ({task_id!r}); pass the Task")

    def state(self) -> Episode | None:
        return self.current

    def set_state(self, state: Episode) -> None:
        self.current = state

    def end(self) -> None:
        self.current = None


class ReasoningGymEnv(ForeignEnv):
    """A reasoning-gym dataset as a question-answer env (see the module docstring): a
    :class:`~trace_gym.env.adapter.ForeignEnv` around a :class:`ReasoningGymEpisode`.

    Args:
        dataset: a name of ``reasoning_gym.factory.DATASETS``.
        config: the dataset's config (:func:`config_fields`).
        max_attempts: answers the model may give; a wrong one before the last gets
            :data:`FEEDBACK` (default 1: one turn).
        system_prompt: a key of reasoning-gym's ``SYSTEM_PROMPTS``, or ``None`` for none.
        few_shot: show one solved example of the dataset first (module docstring).
        score_timeout_s: seconds one score may take in the sandbox.
        snapshot: ``copy`` (default) or ``replay``.
        max_turns: truncate after this many steps.
        call_timeout_s, max_observation_chars: the boundary's deadline per call into the
            env (seconds) and bound on an observation (characters); see
            :class:`~trace_gym.env.boundary.ForeignBoundary`.
    """

    #: what makes a dataset easier or harder for a policy (named by the no-contrast warning)
    difficulty_knobs = {
        "few_shot": "env kwarg (--env-kwargs '{\"few_shot\": true}'): one solved example first, so a small model "
                    "sees the <answer> format",
        "max_attempts": "env kwarg: answers the model may give, with feedback after a wrong one (default 1)",
        "dataset config": "the dataset's own fields in the id's query, e.g. "
                          "reasoning_gym:chain_sum?min_terms=2&max_terms=2&max_digits=1",
    }

    def __init__(self, dataset: str = "chain_sum", config: Mapping[str, Any] | None = None, *, max_attempts: int = 1,
                 system_prompt: str | None = "default", few_shot: bool = False, score_timeout_s: float = 5.0,
                 snapshot: str | None = None, max_turns: int | None = None, call_timeout_s: float | None = None,
                 max_observation_chars: int | None = None):
        super().__init__(ReasoningGymEpisode(dataset, config, max_attempts=max_attempts, system_prompt=system_prompt,
                                             few_shot=few_shot, score_timeout_s=score_timeout_s),
                         snapshot=snapshot, max_turns=max_turns, call_timeout_s=call_timeout_s,
                         max_observation_chars=max_observation_chars)


# --- the face ------------------------------------------------------------------------------------------


def family(name: str, options: dict, env_kwargs: dict, task_kwargs: dict):
    """The :class:`~trace_gym.env.family.EnvFamily` of ``reasoning_gym:<name>?<config>``:
    ``options`` are the dataset's config, ``env_kwargs`` the adapter's (:data:`ENV_OPTIONS`);
    the task loader takes none of its own.

    Raises:
        ValueError: an unknown dataset, config field, env kwarg or task kwarg (one line
            each, with did-you-mean), or a config the dataset refuses.
    """
    from trace_gym.env.family import adapter_family

    options_of(env_kwargs, ENV_OPTIONS, f"{_where(name)} env kwargs")
    options_of(task_kwargs, (), f"{_where(name)} task kwargs")
    data = _scorer(name, _config_key(options))  # refuses a bad name or config now, in one line
    summary = (type(data).__doc__ or "").strip().splitlines()
    return adapter_family(PREFIX, name, ENTRY_POINT,
                          env_kwargs={"dataset": name, "config": dict(options), **env_kwargs},
                          task_loader=TASK_LOADER, loader_kwargs={"dataset": name, "config": dict(options)},
                          description=f"reasoning-gym {name}: {summary[0] if summary else 'procedural dataset'}")


def available() -> list[str]:
    """Every dataset in reasoning-gym's registry, with the ``reasoning_gym:`` prefix."""
    return [f"{PREFIX}:{name}" for name in sorted(_rg().DATASETS)]
