"""The agent-environment contract, snapshots, and the public conformance kit.

An agent environment is a :class:`gymnasium.Env` whose actions are text (the model's
raw output for one turn) and whose observations are chat messages:

* ``reset(*, seed=None, options=None) -> (list[Message], info)``. ``options["task"]``
  is a :class:`~trace_gym.types.Task`, a task dict, or a task id the env can load;
  without it the env draws one of its own tasks with its seeded RNG.
* ``step(action: str) -> (list[Message], reward: float, terminated, truncated, info)``.
  The env parses the action (never rewrites it); malformed actions become
  observations the model can read, never exceptions.
* ``snapshot() -> Snapshot`` / ``restore(snapshot)``: an immutable, picklable record
  of everything that determines future behaviour (world state, turn counter, RNG).
  Restoring and stepping the same action gives identical results, and steps after a
  restore never leak into the snapshot or into sibling branches.

:func:`trace_gym.env.checks.check_env` checks all of that on a user's env; a new env is "done" when it
passes. Its checks, one function each, live in :mod:`trace_gym.env.checks`.
"""

from __future__ import annotations

import copy
import logging
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from trace_gym.types import Message, Task

_log = logging.getLogger(__name__)

#: How an env implements snapshots: ``state`` (a copy of its state), ``replay``
#: (the actions/cells to re-execute in a fresh backend), ``fork`` (an OS fork).
SNAPSHOT_MODES = ("state", "replay", "fork")


@dataclass(frozen=True)
class Snapshot:
    """An opaque, immutable record of an env's full state after some turn.

    Attributes:
        env_id: the class (or registered id) that made it; ``restore`` checks it.
        mode: one of :data:`SNAPSHOT_MODES`.
        turn: number of ``step`` calls since ``reset``.
        state: env-specific payload. It must never alias live env state: use
            :func:`freeze` / :func:`thaw` (pickle bytes) or immutable values.
    """

    env_id: str
    mode: str
    turn: int
    state: Any = field(repr=False)

    def __post_init__(self) -> None:
        if self.mode not in SNAPSHOT_MODES:
            raise ValueError(f"Snapshot.mode must be one of {SNAPSHOT_MODES}, got {self.mode!r}")
        if self.turn < 0:
            raise ValueError(f"Snapshot.turn must be >= 0, got {self.turn}")


def freeze(obj: Any) -> bytes:
    """Serialise live state into immutable bytes for a :class:`Snapshot`."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def thaw(blob: bytes) -> Any:
    """A fresh, unshared copy of state stored with :func:`freeze`."""
    return pickle.loads(blob)


def rng_state(rng: np.random.Generator | None) -> dict | None:
    """The bit-generator state of a numpy Generator (a plain, copyable dict)."""
    return None if rng is None else copy.deepcopy(rng.bit_generator.state)


def rng_from_state(state: dict | None) -> np.random.Generator | None:
    """Rebuild a numpy Generator from :func:`rng_state`."""
    if state is None:
        return None
    bit_gen = getattr(np.random, state["bit_generator"])()
    bit_gen.state = copy.deepcopy(state)
    return np.random.Generator(bit_gen)


def resolve_task(task: Any, load: Callable[[str], Task] | None = None) -> Task:
    """Accept a :class:`Task`, a task dict, or an id (looked up with ``load``)."""
    if isinstance(task, Task):
        return task
    if isinstance(task, Mapping):
        return Task.from_dict(task)
    if isinstance(task, str):
        if load is None:
            raise ValueError(f"task id {task!r} given, but this env cannot load tasks by id")
        return load(task)
    raise TypeError(f"options['task'] must be a Task, dict or id str, got {type(task).__name__}")


def validate_task(task: Task, *, require_answer: bool = False) -> Task:
    """``task``, refused when an env could not show or grade it honestly: a text field
    (``id``, ``prompt``, ``source``, a string answer) that UTF-8 cannot encode (a lone
    surrogate), an answer that is not JSON data, and, with ``require_answer`` (an env
    that grades against the answer), a missing or empty answer: ``None`` would be read as
    the text ``"None"`` and reward a model that writes it.

    Raises:
        ValueError: one line naming the task and the field.
    """
    import json

    from trace_gym.utils.textsafe import first_unencodable

    texts = [("id", task.id), ("prompt", task.prompt), ("source", task.source)]
    texts += [("answer", task.answer)] if isinstance(task.answer, str) else []
    for name, text in texts:
        at = first_unencodable(text) if isinstance(text, str) else None
        if at is not None:
            raise ValueError(f"task {task.id!r:.80}: Task.{name} holds a character UTF-8 cannot encode at {at} "
                             "(a lone surrogate); clean the task data")
    if require_answer and (task.answer is None or (isinstance(task.answer, (str, list, tuple, dict))
                                                   and not (task.answer.strip() if isinstance(task.answer, str)
                                                            else task.answer))):
        raise ValueError(f"task {task.id!r:.80}: Task.answer is {task.answer!r:.40}; this env grades against the "
                         "answer, so a task without one cannot be scored")
    try:
        json.dumps(task.answer, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task {task.id!r:.80}: Task.answer is not JSON data ({exc})") from None
    return task


def task_from_options(options: Mapping[str, Any] | None, pool: Sequence[Task], rng: np.random.Generator,
                      load: Callable[[str], Task] | None = None, *, require_answer: bool = False) -> Task:
    """The task ``reset`` should use: ``options["task"]`` (or ``options["task_id"]``)
    resolved with :func:`resolve_task`, else one drawn from ``pool`` with the env's
    seeded ``rng``; checked by :func:`validate_task` (``require_answer`` for an env that
    grades against the answer)."""
    options = options or {}
    raw = options.get("task", options.get("task_id"))
    if raw is not None:
        return validate_task(resolve_task(raw, load), require_answer=require_answer)
    if not pool:
        raise ValueError("reset() without options['task'] needs a non-empty task pool")
    return validate_task(pool[int(rng.integers(len(pool)))], require_answer=require_answer)


@runtime_checkable
class AgentEnv(Protocol):
    """What the rollout code needs from an environment (a ``gymnasium.Env`` too)."""

    snapshot_mode: ClassVar[str]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]: ...

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]: ...

    def snapshot(self) -> Snapshot: ...

    def restore(self, snapshot: Snapshot) -> None: ...

    def close(self) -> None: ...


#: A zero-argument factory of fresh env instances (``gymnasium.make`` partials, classes).
EnvFactory = Callable[[], AgentEnv]


@runtime_checkable
class ReplayCost(Protocol):
    """Optional: an env whose ``restore`` re-executes work (``snapshot_mode = "replay"``).

    ``replay_steps(snapshot)`` is how many env steps (for math_python: executed cells)
    restoring ``snapshot`` re-runs. The agent loop counts them as env steps (and apart,
    as replayed steps), so exact costs include the price of branching.
    """

    def replay_steps(self, snapshot: Snapshot) -> int: ...


@runtime_checkable
class ReferenceActions(Protocol):
    """Optional: an env that can script a task's intended solution.

    ``reference_actions(task)`` returns the actions (raw model text per turn) that play
    ``task`` the way its author meant; :func:`~trace_gym.env.checks.check_env` plays them by default, so the
    checks reach deep turns that random text would never reach.
    """

    def reference_actions(self, task: Task) -> Sequence[str]: ...


@runtime_checkable
class StopStrings(Protocol):
    """Optional: an env whose actions end at a closing tag (Search-R1's ``</search>``).

    ``stop_strings`` (a class attribute) are strings at which generation of a turn stops,
    kept in the action, so the model hands over to the env right after the tag instead
    of writing on past it (and, say, inventing the search results). The agent loop reads
    them from the env factory without building an env (:func:`env_stop_strings`).
    """

    stop_strings: ClassVar[tuple[str, ...]]


def env_creator(make_env: Any) -> Callable[..., Any] | None:
    """What a factory builds its env with, found without calling it: the class (or the
    entry-point function) behind a class, a ``gymnasium.make`` partial (id or ``EnvSpec``,
    positional or ``id=``), a partial of a class, or the bound ``make_env`` of an object with
    an ``env_id`` (an ``EnvFamily``); ``None`` when it cannot be told (a lambda, say)."""
    import functools

    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    if isinstance(make_env, type):
        return make_env
    spec = None
    if isinstance(make_env, functools.partial):
        if isinstance(make_env.func, type):
            return make_env.func
        if make_env.func is gymnasium.make:
            spec = make_env.args[0] if make_env.args else make_env.keywords.get("id")
    elif isinstance(getattr(getattr(make_env, "__self__", None), "env_id", None), str):
        spec = make_env.__self__.env_id
    if spec is None:
        return None

    try:
        entry = (gymnasium.spec(spec) if isinstance(spec, str) else spec).entry_point
        return load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception as exc:  # noqa: BLE001  (an id or entry point this process cannot resolve)
        _log.debug("env_creator(%r): %s: %s", make_env, type(exc).__name__, exc)
        return None


def env_class(make_env: Any) -> type | None:
    """The env class ``make_env`` builds (:func:`env_creator`, when that is a class)."""
    creator = env_creator(make_env)
    return creator if isinstance(creator, type) else None


def env_stop_strings(make_env: Any) -> tuple[str, ...]:
    """The :class:`StopStrings` of the env ``make_env`` builds: the ``stop_strings``
    attribute of its class (or entry-point function); ``()`` when it declares none or its
    creator cannot be found without building an env (logged at debug level).

    Raises:
        ValueError: ``stop_strings`` that is not a tuple of non-empty strings.
    """
    creator = env_creator(make_env)
    if creator is None:
        _log.debug("env_stop_strings: cannot tell what %r builds; no env stop strings", make_env)
        return ()
    stops = getattr(creator, "stop_strings", ())
    if isinstance(stops, str) or not isinstance(stops, (tuple, list)) or not all(
            isinstance(s, str) and s for s in stops):
        raise ValueError(f"{getattr(creator, '__name__', creator)}.stop_strings must be a tuple of non-empty "
                         f"strings, got {stops!r}")
    return tuple(stops)


@runtime_checkable
class DifficultyKnobs(Protocol):
    """Optional: an env that names its own settings that change how hard its tasks are.

    ``difficulty_knobs`` (a class attribute): setting -> one line on how to set it and what
    it does (``{"few_shot": "env kwarg few_shot=true: one demonstrated turn first ..."}``).
    When every rollout of a step or a bench arm has the same outcome, the no-contrast
    warning and the bench's NO VERDICT line name them (:func:`env_difficulty_knobs`), so a
    user of an env from another ecosystem finds the setting without reading its docs.
    """

    difficulty_knobs: ClassVar[Mapping[str, str]]


def env_difficulty_knobs(make_env: Any) -> dict[str, str]:
    """The :class:`DifficultyKnobs` of the env ``make_env`` builds, found without building
    one; ``{}`` when it declares none or its creator cannot be told (:func:`env_creator`).

    Raises:
        ValueError: ``difficulty_knobs`` that is not a mapping of non-empty strings.
    """
    creator = env_creator(make_env)
    knobs = getattr(creator, "difficulty_knobs", None) if creator is not None else None
    if knobs is None:
        return {}
    if not isinstance(knobs, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                 for k, v in knobs.items()):
        raise ValueError(f"{getattr(creator, '__name__', creator)}.difficulty_knobs must map setting names to "
                         f"one-line descriptions, got {knobs!r:.200}")
    return dict(knobs)


class ReplayDivergence(RuntimeError):
    """Re-applying a snapshot's actions gave a different observation than when it was taken
    (an env snapshotted by deterministic replay that is not deterministic)."""

    def __init__(self, turn: int, detail: str = "", copy_possible: bool = True):
        super().__init__(f"replaying the snapshot's actions diverged at turn {turn}{detail}: the env is not "
                         "deterministic under replay (seed its randomness from the episode seed"
                         + (", or use snapshot='copy')" if copy_possible else ")"))
        self.turn = turn


class EnvCheckError(AssertionError):
    """Raised by :func:`~trace_gym.env.checks.check_env`; ``check`` names the failed check."""

    def __init__(self, check: str, message: str):
        super().__init__(f"[{check}] {message}")
        self.check = check


def _portable(make_env: EnvFactory) -> EnvFactory:
    """A factory a fresh interpreter can call without any registration of its own.

    ``functools.partial(gymnasium.make, "ns/Id-v0", ...)`` names an id that only this
    process may have registered (a plugin, a test): swap the id for its ``EnvSpec``,
    which carries the entry point string. Other factories pass through unchanged.
    """
    import functools

    if isinstance(make_env, functools.partial) and make_env.args and isinstance(make_env.args[0], str):
        import gymnasium

        if make_env.func is gymnasium.make:
            spec = gymnasium.spec(make_env.args[0])
            return functools.partial(gymnasium.make, spec, *make_env.args[1:], **make_env.keywords)
    return make_env
