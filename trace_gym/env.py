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

:func:`check_env` checks all of that on a user's env; a new env is "done" when it
passes.
"""

from __future__ import annotations

import copy
import logging
import math
import pickle
import warnings
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


def task_from_options(options: Mapping[str, Any] | None, pool: Sequence[Task], rng: np.random.Generator,
                      load: Callable[[str], Task] | None = None) -> Task:
    """The task ``reset`` should use: ``options["task"]`` (or ``options["task_id"]``)
    resolved with :func:`resolve_task`, else one drawn from ``pool`` with the env's
    seeded ``rng``."""
    options = options or {}
    raw = options.get("task", options.get("task_id"))
    if raw is not None:
        return resolve_task(raw, load)
    if not pool:
        raise ValueError("reset() without options['task'] needs a non-empty task pool")
    return pool[int(rng.integers(len(pool)))]


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
    ``task`` the way its author meant; :func:`check_env` plays them by default, so the
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


class EnvCheckError(AssertionError):
    """Raised by :func:`check_env`; ``check`` names the failed check."""

    def __init__(self, check: str, message: str):
        super().__init__(f"[{check}] {message}")
        self.check = check


@dataclass
class CheckReport:
    """What :func:`check_env` verified (each entry: check name -> count of cases)."""

    passed: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def ok(self, check: str, n: int = 1) -> None:
        self.passed[check] = self.passed.get(check, 0) + n


# --- trajectory helpers -------------------------------------------------------------

Step = tuple  # (observation: tuple[Message, ...], reward: float, terminated: bool, truncated: bool)


def _record(result: tuple) -> Step:
    obs, reward, terminated, truncated, _info = result
    return (tuple(obs), float(reward), bool(terminated), bool(truncated))


def _play(env: Any, actions: Sequence[str]) -> list[Step]:
    """Step ``actions`` in order until the episode ends; return the recorded steps."""
    out: list[Step] = []
    for action in actions:
        out.append(_record(env.step(action)))
        if out[-1][2] or out[-1][3]:
            break
    return out


def _diff(a: Sequence[Step], b: Sequence[Step]) -> str | None:
    """First difference between two recorded trajectories, or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            for name, u, v in zip(("observation", "reward", "terminated", "truncated"), x, y):
                if u != v:
                    return f"step {i}: {name} differs: {u!r:.300} != {v!r:.300}"
    if len(a) != len(b):
        return f"trajectory lengths differ: {len(a)} != {len(b)}"
    return None


def _replay_in_fresh_env(make_env: EnvFactory, jobs: list[tuple[bytes, list[str]]]) -> list:
    """Worker body: restore each pickled snapshot into a fresh env, play its actions."""
    results = []
    env = make_env()
    base = env.unwrapped if hasattr(env, "unwrapped") else env
    try:
        for blob, actions in jobs:
            snap = pickle.loads(blob)
            base.reset(seed=0)
            base.restore(snap)
            results.append(_play(base, actions))
    finally:
        env.close()
    return results


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


def _cross_process(make_env: EnvFactory, jobs, timeout: float) -> list:
    """Replay ``jobs`` in a fresh interpreter (``python -m trace_gym.env``), via pickle.

    The worker gets this process's ``sys.path`` (so the factory's module imports there
    too) and a :func:`_portable` factory; it imports nothing but this module.
    """
    import subprocess
    import sys

    try:
        factory = pickle.dumps(_portable(make_env), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise EnvCheckError("snapshot_pickle_process", f"make_env {make_env!r:.100} does not pickle: {exc}") from exc
    payload = pickle.dumps((list(sys.path), factory, jobs), protocol=pickle.HIGHEST_PROTOCOL)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "trace_gym.env"], input=payload, capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvCheckError("snapshot_pickle_process", f"worker gave no answer in {timeout:.0f} s") from exc
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise EnvCheckError("snapshot_pickle_process", f"worker exited {proc.returncode}: {tail}")
    return pickle.loads(proc.stdout)


def _default_make_env(env: Any) -> EnvFactory | None:
    spec = getattr(env, "spec", None)
    if spec is None or spec.id is None:
        return None
    import functools

    import gymnasium

    # the spec itself (not its id): a fresh interpreter may not have registered the id
    return functools.partial(gymnasium.make, spec, disable_env_checker=True)


def _check_messages(check: str, obs: Any, where: str, *, first: bool = False) -> None:
    if not isinstance(obs, list):
        raise EnvCheckError(check, f"{where}: observation must be a list of Message, got {type(obs).__name__}")
    for m in obs:
        if not isinstance(m, Message):
            raise EnvCheckError(check, f"{where}: observation item {m!r:.100} is not a Message")
    if first and not any(m.role == "user" for m in obs):
        raise EnvCheckError(check, f"{where}: the first observation has no user message")


def _check_step_types(check: str, result: Any, where: str) -> None:
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvCheckError(check, f"{where}: step must return a 5-tuple, got {result!r:.200}")
    obs, reward, terminated, truncated, info = result
    _check_messages(check, obs, where)
    if not isinstance(reward, (float, int, np.floating)) or isinstance(reward, bool) or not math.isfinite(reward):
        raise EnvCheckError(check, f"{where}: reward must be a finite float, got {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise EnvCheckError(check, f"{where}: {name} must be bool, got {flag!r}")
    if not isinstance(info, dict):
        raise EnvCheckError(check, f"{where}: info must be a dict, got {type(info).__name__}")


def _actions_for(env: Any, task: Task, actions: Any, max_steps: int, seed: int) -> list[str]:
    if actions is None:
        if isinstance(env.unwrapped, ReferenceActions):
            return list(env.unwrapped.reference_actions(task))[:max_steps]
        space = env.action_space
        space.seed(seed)
        return [space.sample() for _ in range(max_steps)]
    if callable(actions):
        return list(actions(task))[:max_steps]
    return list(actions[task.id])[:max_steps]


def check_env(
    env: Any,
    tasks: Sequence[Task],
    *,
    actions: Mapping[str, Sequence[str]] | Callable[[Task], Sequence[str]] | None = None,
    branch_actions: Sequence[str] | None = None,
    make_env: EnvFactory | None = None,
    max_steps: int = 12,
    seed: int = 0,
    gymnasium_checks: bool = True,
    process_timeout: float = 300.0,
) -> CheckReport:
    """Check that ``env`` honours the agent-environment contract on ``tasks``.

    Checks, in order (the failing one is named in :class:`EnvCheckError`):

    ``gymnasium_api``
        Gymnasium's own ``check_env`` (spaces, seeded reset, step determinism).
    ``protocol``
        ``snapshot``/``restore`` exist and ``snapshot_mode`` is one of :data:`SNAPSHOT_MODES`.
    ``message_schema``
        observations are ``list[Message]`` (the first holds a user message), rewards
        finite floats, flags bools, info dicts.
    ``seeded_determinism``
        two seeded resets to the same task then the same actions give identical
        observations, rewards and flags.
    ``snapshot_roundtrip``
        restoring the snapshot taken after turn t and replaying the remaining actions
        reproduces the original trajectory.
    ``snapshot_immutable``
        a snapshot's pickled bytes do not change when the env steps on (catches a
        snapshot that aliases live mutable state).
    ``branch_isolation``
        after a restore, stepping a *different* branch and restoring again still
        reproduces the original suffix; a second env instance restored from the same
        snapshot replays identically.
    ``snapshot_pickle_process``
        snapshots pickled and restored in a freshly spawned process replay identically.
    ``close_idempotent``
        ``close()`` twice raises nothing.

    Args:
        env: the env to check (closed at the end).
        tasks: tasks to reset to (``options={"task": task}``).
        actions: per-task action lists (by id) or a function task -> actions; default:
            the env's ``reference_actions(task)`` if it has one
            (:class:`ReferenceActions`), else seeded
            ``action_space.sample()`` strings.
        branch_actions: actions for the alternative branch; default: seeded samples.
        make_env: zero-argument, picklable factory for fresh instances; default from
            ``env.spec`` (registered envs). Without one the cross-instance and
            cross-process checks are skipped and reported in ``CheckReport.skipped``.
        max_steps: at most this many actions per task.
        seed: the reset seed.
        gymnasium_checks: run Gymnasium's checker first.
        process_timeout: seconds allowed for the cross-process worker.

    Returns:
        A :class:`CheckReport`. Raises :class:`EnvCheckError` on the first failure.
    """
    report = CheckReport()
    if not tasks:
        raise ValueError("check_env needs at least one task")
    base = env.unwrapped if hasattr(env, "unwrapped") else env

    if gymnasium_checks:
        from gymnasium.utils.env_checker import check_env as gym_check_env

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gym_check_env(base, skip_render_check=True, skip_close_check=True)
        except Exception as exc:
            raise EnvCheckError("gymnasium_api", f"{type(exc).__name__}: {exc}") from exc
        report.ok("gymnasium_api")

    mode = getattr(base, "snapshot_mode", None)
    if mode not in SNAPSHOT_MODES or not callable(getattr(base, "snapshot", None)) or not callable(
        getattr(base, "restore", None)
    ):
        raise EnvCheckError(
            "protocol", f"env needs snapshot()/restore() and snapshot_mode in {SNAPSHOT_MODES}, got {mode!r}"
        )
    report.ok("protocol")

    make_env = make_env or _default_make_env(env)
    second = make_env() if make_env is not None else None
    if second is None:
        report.skipped["branch_isolation/second_instance"] = "no make_env and env has no spec"
        report.skipped["snapshot_pickle_process"] = "no make_env and env has no spec"
    process_jobs: list[tuple[bytes, list[str]]] = []
    process_expect: list[tuple[str, list[Step]]] = []
    rng = np.random.default_rng(seed)

    for task in tasks:
        where = f"task {task.id!r}"
        acts = _actions_for(env, task, actions, max_steps, seed)
        obs0, info0 = base.reset(seed=seed, options={"task": task})
        _check_messages("message_schema", obs0, f"{where} reset", first=True)
        if not isinstance(info0, dict):
            raise EnvCheckError("message_schema", f"{where}: reset info must be a dict")
        snaps = [base.snapshot()]
        blobs = [pickle.dumps(snaps[0])]
        trajectory: list[Step] = []
        for t, action in enumerate(acts):
            result = base.step(action)
            _check_step_types("message_schema", result, f"{where} step {t}")
            trajectory.append(_record(result))
            if trajectory[-1][2] or trajectory[-1][3]:
                break
            snaps.append(base.snapshot())
            blobs.append(pickle.dumps(snaps[-1]))
        acts = acts[: len(trajectory)]
        report.ok("message_schema")

        obs1, _ = base.reset(seed=seed, options={"task": task})
        if tuple(obs1) != tuple(obs0):
            raise EnvCheckError("seeded_determinism", f"{where}: two seeded resets gave different observations")
        problem = _diff(trajectory, _play(base, acts))
        if problem:
            raise EnvCheckError("seeded_determinism", f"{where}: same seed and actions, {problem}")
        report.ok("seeded_determinism")

        for t, (snap, blob) in enumerate(zip(snaps, blobs)):
            if pickle.dumps(snap) != blob:
                raise EnvCheckError(
                    "snapshot_immutable",
                    f"{where}: the snapshot taken after turn {t} changed when the env stepped on; "
                    "it shares mutable state with the env",
                )
        report.ok("snapshot_immutable", len(snaps))

        for t, snap in enumerate(snaps):
            suffix = acts[t:]
            base.restore(snap)
            problem = _diff(trajectory[t:], _play(base, suffix))
            if problem:
                raise EnvCheckError("snapshot_roundtrip", f"{where}: restored after turn {t}, {problem}")
            # an alternative branch, then the original again
            base.restore(snap)
            alt = list(branch_actions) if branch_actions is not None else []
            if not alt:
                space = base.action_space
                space.seed(int(rng.integers(2**31)))
                alt = [space.sample() for _ in range(2)]
            _play(base, alt)
            if pickle.dumps(snap) != blobs[t]:
                raise EnvCheckError(
                    "branch_isolation", f"{where}: stepping a branch restored from turn {t} changed the snapshot"
                )
            base.restore(snap)
            problem = _diff(trajectory[t:], _play(base, suffix))
            if problem:
                raise EnvCheckError(
                    "branch_isolation", f"{where}: after a sibling branch from turn {t} ran, {problem}"
                )
            if second is not None:
                second.reset(seed=seed + 1)
                second.unwrapped.restore(snap)
                problem = _diff(trajectory[t:], _play(second.unwrapped, suffix))
                if problem:
                    raise EnvCheckError(
                        "branch_isolation", f"{where}: a second instance restored from turn {t}, {problem}"
                    )
            if pickle.dumps(snap) != blobs[t]:
                raise EnvCheckError(
                    "branch_isolation", f"{where}: a second instance restored from turn {t} changed the snapshot")
            process_jobs.append((blobs[t], suffix))
            process_expect.append((f"{where} turn {t}", trajectory[t:]))
        report.ok("snapshot_roundtrip", len(snaps))
        report.ok("branch_isolation", len(snaps))

    if second is not None:
        second.close()
        got = _cross_process(make_env, process_jobs, process_timeout)
        for (label, expect), traj in zip(process_expect, got):
            problem = _diff(expect, traj)
            if problem:
                raise EnvCheckError("snapshot_pickle_process", f"{label}: restored in another process, {problem}")
        report.ok("snapshot_pickle_process", len(got))

    try:
        env.close()
        env.close()
    except Exception as exc:
        raise EnvCheckError("close_idempotent", f"close() twice raised {type(exc).__name__}: {exc}") from exc
    report.ok("close_idempotent")
    return report


if __name__ == "__main__":  # the cross-process worker of check_env
    import sys as _sys

    _path, _factory, _jobs = pickle.loads(_sys.stdin.buffer.read())
    _sys.path[:0] = [p for p in _path if p not in _sys.path]
    _make_env = pickle.loads(_factory)  # after sys.path: unpickling imports the factory's module
    _out = _replay_in_fresh_env(_make_env, _jobs)
    _sys.stdout.buffer.write(pickle.dumps(_out, protocol=pickle.HIGHEST_PROTOCOL))
