"""The conformance kit: :func:`check_env`, an orchestrator over one function per named check.

Each check is a function ``check(run: CheckRun) -> int | None`` named as it reports
itself: it raises :class:`~trace_gym.env.contract.EnvCheckError` (whose ``check`` is that name)
on the first failure, else returns how many cases it verified, or ``None`` when it
was skipped (the reason is then in ``run.skipped``). :data:`CHECKS` lists them in the
order ``check_env`` runs them.

A :class:`CheckRun` holds the env, the tasks and ``check_env``'s options, and plays
each task once from a seeded reset (checking the message schema as it goes,
snapshotting after every turn); every check after ``message_schema`` compares against
those recordings. So any one check runs alone::

    run = CheckRun(env, tasks)
    snapshot_roundtrip(run)  # or check_env(env, tasks, only=("snapshot_roundtrip",))

The whole kit runs the env behind its boundary (:class:`~trace_gym.env.play.BoundedEnv`):
each call into the env has ``call_timeout_s`` seconds (a hung ``reset`` or ``step`` fails
the check that made it, naming the call and the deadline); an ``sys.exit`` or other
``BaseException`` of the env fails it too, named, instead of ending the caller; the
options are checked before the env is touched (:func:`check_options`), and reference
actions are taken lazily (at most ``max_steps`` of them).

Playing episodes and the cross-process worker of :func:`snapshot_pickle_process` live in
:mod:`trace_gym.env.play`.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from trace_gym.env.boundary import DEFAULT_CALL_TIMEOUT_S, ForeignEnvError, error_text
from trace_gym.env.contract import SNAPSHOT_MODES, EnvCheckError, EnvFactory, ReplayDivergence, Snapshot
from trace_gym.env.play import (
    BoundedEnv, Step, actions_for, check_messages, check_step_types, cross_process, default_make_env, diff, play,
    record,
)
from trace_gym.types import Message, Task

#: Why the checks that need fresh env instances skip without a factory.
NO_FACTORY = "no make_env and env has no spec"


def check_options(*, max_steps: Any = 12, seed: Any = 0, process_timeout: Any = 300.0,
                  call_timeout_s: Any = DEFAULT_CALL_TIMEOUT_S) -> None:
    """``ValueError`` (one line naming the option and the value) for an option of
    :func:`check_env` out of range: ``max_steps`` an int >= 1, ``seed`` an int >= 0,
    ``process_timeout`` and ``call_timeout_s`` finite seconds > 0. Checked before the env
    is touched, so a bad option is never blamed on the env."""
    def whole(value: Any) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))

    if not whole(max_steps) or max_steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    if not whole(seed) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0 (Gymnasium seeds no further down), got {seed!r}")
    for name, value in (("process_timeout", process_timeout), ("call_timeout_s", call_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


# --- one run of the kit ---------------------------------------------------------------


@dataclass(frozen=True)
class Recording:
    """One task played once from a seeded reset: what the later checks compare against.

    Attributes:
        task: the task reset to.
        where: ``"task '<id>'"``, the prefix of this task's error messages.
        first_observation: the reset's observation.
        actions: the actions played, cut where the episode ended.
        trajectory: one recorded step (observation, reward, terminated, truncated) per action.
        snapshots: ``snapshots[t]`` was taken after ``t`` steps (``0``: right after reset).
        blobs: ``pickle.dumps(snapshots[t])`` at the moment it was taken.
    """

    task: Task
    where: str
    first_observation: tuple[Message, ...]
    actions: list[str]
    trajectory: list[Step]
    snapshots: list[Snapshot]
    blobs: list[bytes]


@dataclass
class CheckRun:
    """The env under check, its tasks and ``check_env``'s options (same meanings).

    ``make_env`` defaults from ``env.spec``; ``skipped`` collects check name -> why.
    :attr:`recordings` plays the tasks on first use and keeps them for later checks.
    ``base`` is the env behind its boundary (:class:`~trace_gym.env.play.BoundedEnv`, each
    call within ``call_timeout_s`` seconds); :meth:`bounded` puts a fresh instance there too.
    """

    env: Any
    tasks: Sequence[Task]
    actions: Mapping[str, Sequence[str]] | Callable[[Task], Sequence[str]] | None = None
    branch_actions: Sequence[str] | None = None
    make_env: EnvFactory | None = None
    max_steps: int = 12
    seed: int = 0
    process_timeout: float = 300.0
    skipped: dict[str, str] = field(default_factory=dict)
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("check_env needs at least one task")
        check_options(max_steps=self.max_steps, seed=self.seed, process_timeout=self.process_timeout,
                      call_timeout_s=self.call_timeout_s)
        self.base = self.bounded(self.env)
        self.make_env = self.make_env or default_make_env(self.env)
        self._recordings: list[Recording] | None = None
        #: ``native``, or the :mod:`trace_gym.env.adapter` strategy of an adapted env
        self.snapshot_strategy: str = getattr(self.base, "snapshot_strategy", "native")

    def bounded(self, env: Any) -> BoundedEnv:
        """``env`` behind a boundary of its own, with this run's ``call_timeout_s``."""
        return BoundedEnv(env, self.call_timeout_s)

    @contextlib.contextmanager
    def closing(self, close: bool = True) -> Iterator[None]:
        """Close the env under check after the block (with ``close``), unless a call given up
        on still runs in it; after a block that raised, an error of ``close`` is dropped."""
        try:
            yield
        except BaseException:
            if close and not self.base.stuck:
                with contextlib.suppress(Exception):
                    self.base.close()
            raise
        if close and not self.base.stuck:
            self.base.close()

    @property
    def recordings(self) -> list[Recording]:
        """Every task's :class:`Recording` (raises ``message_schema`` errors while playing)."""
        if self._recordings is None:
            self._recordings = [self._play_task(task) for task in self.tasks]
        return self._recordings

    def _play_task(self, task: Task) -> Recording:
        where, base = f"task {task.id!r}", self.base
        acts = actions_for(self.base, task, self.actions, self.max_steps, self.seed)
        obs0, info0 = base.reset(seed=self.seed, options={"task": task})
        check_messages("message_schema", obs0, f"{where} reset", first=True)
        if not isinstance(info0, dict):
            raise EnvCheckError("message_schema", f"{where}: reset info must be a dict")
        snaps = [base.snapshot()]
        blobs = [pickle.dumps(snaps[0])]
        trajectory: list[Step] = []
        for t, action in enumerate(acts):
            result = base.step(action)
            check_step_types("message_schema", result, f"{where} step {t}")
            trajectory.append(record(result))
            if trajectory[-1][2] or trajectory[-1][3]:
                break
            snaps.append(base.snapshot())
            blobs.append(pickle.dumps(snaps[-1]))
        return Recording(task, where, tuple(obs0), acts[: len(trajectory)], trajectory, snaps, blobs)


def _n_snapshots(run: CheckRun) -> int:
    return sum(len(rec.snapshots) for rec in run.recordings)


# --- the checks, in the order check_env runs them --------------------------------------


def gymnasium_api(run: CheckRun) -> int:
    """Gymnasium's own ``check_env`` (spaces, seeded reset, step determinism), its resets and
    steps made through the env's boundary."""
    import functools

    import gymnasium
    from gymnasium.utils.env_checker import check_env as gym_check_env

    class Bounded(gymnasium.Wrapper):  # what Gymnasium's checker calls (reset and step), bounded
        def step(self, action):
            return run.base.step(action)

    raw, view = run.base.raw, run.base.raw
    if isinstance(raw, gymnasium.Env):  # else Gymnasium's checker refuses it, touching nothing
        view = Bounded(raw)
        # Gymnasium reads reset's signature (does it take seed, options?): the env's own, not a wrapper's
        view.reset = functools.wraps(raw.reset)(lambda *a, **kw: run.base.call("reset", lambda: raw.reset(*a, **kw)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # among them: "the env is wrapped" (by Bounded)
            gym_check_env(view, skip_render_check=True, skip_close_check=True)
    except ForeignEnvError:
        raise  # a call past its deadline or an exit: check_env names it
    except Exception as exc:
        raise EnvCheckError("gymnasium_api", error_text(exc)) from exc
    return 1


def protocol(run: CheckRun) -> int:
    """``snapshot``/``restore`` exist and ``snapshot_mode`` is one of :data:`SNAPSHOT_MODES`."""
    base = run.base.raw
    mode = getattr(base, "snapshot_mode", None)
    if mode not in SNAPSHOT_MODES or not callable(getattr(base, "snapshot", None)) or not callable(
        getattr(base, "restore", None)
    ):
        raise EnvCheckError(
            "protocol", f"env needs snapshot()/restore() and snapshot_mode in {SNAPSHOT_MODES}, got {mode!r}"
        )
    return 1


def message_schema(run: CheckRun) -> int:
    """Observations are ``list[Message]`` (the first holds a user message), rewards finite
    floats, flags bools, info dicts; checked while the tasks are recorded."""
    return len(run.recordings)


def seeded_determinism(run: CheckRun) -> int:
    """Two seeded resets to the same task, then the same actions, give identical
    observations, rewards and flags."""
    for rec in run.recordings:
        obs1, _ = run.base.reset(seed=run.seed, options={"task": rec.task})
        if tuple(obs1) != rec.first_observation:
            raise EnvCheckError("seeded_determinism", f"{rec.where}: two seeded resets gave different observations")
        problem = diff(rec.trajectory, play(run.base, rec.actions))
        if problem:
            raise EnvCheckError("seeded_determinism", f"{rec.where}: same seed and actions, {problem}")
    return len(run.recordings)


def replay_deterministic(run: CheckRun) -> int | None:
    """An env snapshotted by replay (:mod:`trace_gym.env.adapter`) reproduces every
    recorded turn when its actions are re-applied to a fresh episode with the same seed;
    a non-deterministic one is refused, naming the first turn that differed. Not run
    (and not reported as skipped) for the other strategies: ``CheckReport.snapshot_strategy``
    says which one the env has."""
    if run.snapshot_strategy != "replay":
        return None
    def restore(rec) -> None:
        try:
            run.base.restore(rec.snapshots[-1])  # re-applies every recorded action, digest-checked
        except ReplayDivergence as exc:
            raise EnvCheckError("replay_deterministic", f"{rec.where}: {exc}") from None

    for rec in run.recordings:
        restore(rec)
        if rec.trajectory and not (rec.trajectory[-1][2] or rec.trajectory[-1][3]):
            continue
        # the last step ended the episode and has no snapshot: replay it by hand (a second
        # replay, which a non-deterministic env can fail where the first one passed)
        restore(rec)
        last = play(run.base, rec.actions[len(rec.snapshots) - 1:])
        problem = diff(rec.trajectory[len(rec.snapshots) - 1:], last)
        if problem:
            raise EnvCheckError("replay_deterministic", f"{rec.where}: replaying turn {len(rec.snapshots)}: the env "
                                f"is not deterministic under replay ({problem}); seed its randomness from the "
                                "episode seed, or use snapshot='copy'")
    return len(run.recordings)


def snapshot_immutable(run: CheckRun) -> int:
    """A snapshot's pickled bytes do not change when the env steps on (catches a
    snapshot that aliases live mutable state)."""
    for rec in run.recordings:
        for t, (snap, blob) in enumerate(zip(rec.snapshots, rec.blobs)):
            if pickle.dumps(snap) != blob:
                raise EnvCheckError(
                    "snapshot_immutable",
                    f"{rec.where}: the snapshot taken after turn {t} changed when the env stepped on; "
                    "it shares mutable state with the env",
                )
    return _n_snapshots(run)


def snapshot_roundtrip(run: CheckRun) -> int:
    """Restoring the snapshot taken after turn t and replaying the remaining actions
    reproduces the original trajectory."""
    for rec in run.recordings:
        for t, snap in enumerate(rec.snapshots):
            run.base.restore(snap)
            problem = diff(rec.trajectory[t:], play(run.base, rec.actions[t:]))
            if problem:
                raise EnvCheckError("snapshot_roundtrip", f"{rec.where}: restored after turn {t}, {problem}")
    return _n_snapshots(run)


def branch_isolation(run: CheckRun) -> int:
    """After a restore, stepping a *different* branch and restoring again still reproduces
    the original suffix; a second env instance (from ``make_env``; skipped without one)
    restored from the same snapshot replays identically."""
    base, rng = run.base, np.random.default_rng(run.seed)
    second = run.bounded(run.make_env()) if run.make_env is not None else None
    if second is None:
        run.skipped["branch_isolation/second_instance"] = NO_FACTORY
    for rec in run.recordings:
        where = rec.where
        for t, (snap, blob) in enumerate(zip(rec.snapshots, rec.blobs)):
            suffix = rec.actions[t:]
            base.restore(snap)
            alt = list(run.branch_actions) if run.branch_actions is not None else []
            if not alt:
                space = base.action_space
                space.seed(int(rng.integers(2**31)))
                alt = [space.sample() for _ in range(2)]
            play(base, alt)
            if pickle.dumps(snap) != blob:
                raise EnvCheckError(
                    "branch_isolation", f"{where}: stepping a branch restored from turn {t} changed the snapshot"
                )
            base.restore(snap)
            problem = diff(rec.trajectory[t:], play(base, suffix))
            if problem:
                raise EnvCheckError(
                    "branch_isolation", f"{where}: after a sibling branch from turn {t} ran, {problem}"
                )
            if second is not None:
                second.reset(seed=run.seed + 1)
                second.restore(snap)
                problem = diff(rec.trajectory[t:], play(second, suffix))
                if problem:
                    raise EnvCheckError(
                        "branch_isolation", f"{where}: a second instance restored from turn {t}, {problem}"
                    )
            if pickle.dumps(snap) != blob:
                raise EnvCheckError(
                    "branch_isolation", f"{where}: a second instance restored from turn {t} changed the snapshot")
    if second is not None and not second.stuck:
        second.close()
    return _n_snapshots(run)


def snapshot_pickle_process(run: CheckRun) -> int | None:
    """Snapshots pickled and restored in a freshly spawned process (built with
    ``make_env``; skipped without one) replay identically."""
    if run.make_env is None:
        run.skipped["snapshot_pickle_process"] = NO_FACTORY
        return None
    jobs = [(rec.blobs[t], rec.actions[t:]) for rec in run.recordings for t in range(len(rec.snapshots))]
    expect = [(f"{rec.where} turn {t}", rec.trajectory[t:]) for rec in run.recordings
              for t in range(len(rec.snapshots))]
    got = cross_process(run.make_env, jobs, run.process_timeout)
    for (label, expected), trajectory in zip(expect, got):
        problem = diff(expected, trajectory)
        if problem:
            raise EnvCheckError("snapshot_pickle_process", f"{label}: restored in another process, {problem}")
    return len(got)


def close_idempotent(run: CheckRun) -> int:
    """``close()`` twice raises nothing (this closes the env)."""
    try:
        run.base.close()
        run.base.close()
    except ForeignEnvError:
        raise
    except Exception as exc:
        raise EnvCheckError("close_idempotent", f"close() twice raised {type(exc).__name__}: {exc}") from exc
    return 1


#: Every check by the name it reports, in the order :func:`check_env` runs them.
CHECKS: dict[str, Callable[[CheckRun], int | None]] = {
    check.__name__: check
    for check in (gymnasium_api, protocol, message_schema, replay_deterministic, seeded_determinism, snapshot_immutable,
                  snapshot_roundtrip, branch_isolation, snapshot_pickle_process, close_idempotent)
}


@dataclass
class CheckReport:
    """What :func:`check_env` verified (each entry: check name -> count of cases).

    ``snapshot_strategy`` is how the env snapshots: ``native`` (its own ``snapshot``),
    or, for another ecosystem's env run through :mod:`trace_gym.env.adapter`, ``copy``
    or ``replay``.
    """

    passed: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    snapshot_strategy: str = "native"

    def ok(self, check: str, n: int = 1) -> None:
        self.passed[check] = self.passed.get(check, 0) + n


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
    only: Sequence[str] | None = None,
    on_check: Callable[[str, int | None, CheckReport], None] | None = None,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
) -> CheckReport:
    """Check that ``env`` honours the agent-environment contract on ``tasks``.

    Runs the checks of :data:`CHECKS` in its order (``gymnasium_api``, ``protocol``, ...,
    ``close_idempotent``), each over every task (played once, the recordings shared); each
    is a function of its name in :mod:`trace_gym.env.checks`, and the failing one is named
    in :class:`EnvCheckError`.

    Args:
        env: the env to check (closed at the end, whichever checks ran).
        tasks: tasks to reset to (``options={"task": task}``).
        actions: per-task action lists (by id) or a function task -> actions; default: the env's
            ``reference_actions(task)`` (:class:`ReferenceActions`), else seeded samples.
        branch_actions: actions for the alternative branch; default: seeded samples.
        make_env: zero-argument, picklable factory for fresh instances; default from
            ``env.spec`` (registered envs). Without one the cross-instance and
            cross-process checks are skipped and reported in ``CheckReport.skipped``.
        max_steps, seed: at most this many actions per task; the reset seed.
        gymnasium_checks: run Gymnasium's checker first.
        process_timeout, call_timeout_s: seconds for the cross-process worker, and for each call
            into the env (:class:`~trace_gym.env.play.BoundedEnv`); finite, > 0.
        only: run just these checks (names in ``CHECKS``, run in its order), e.g. ``only=("snapshot_roundtrip",)``;
            a check also runs alone: ``env_checks.snapshot_roundtrip(CheckRun(env, tasks))``.
        on_check: ``(name, cases or None if skipped, report so far)`` after each check (``check-env``).

    Returns:
        A :class:`CheckReport`. Raises :class:`EnvCheckError` on the first failure (a call
        past its deadline and an exit of the env included), and ``ValueError`` for no tasks,
        an option out of range (:func:`check_options`) or a name in ``only`` that is no check.
    """
    names = _check_names(only)
    run = CheckRun(env, tasks, actions, branch_actions, make_env, max_steps, seed, process_timeout,
                   call_timeout_s=call_timeout_s)
    report = CheckReport(skipped=run.skipped, snapshot_strategy=run.snapshot_strategy)
    with run.closing("close_idempotent" not in names):  # that check closes the env itself (twice)
        for name in (n for n in CHECKS if n in names and (gymnasium_checks or n != "gymnasium_api")):
            passed = _run_check(name, run)
            if passed is not None:
                report.ok(name, passed)
            if on_check is not None:
                on_check(name, passed, report)
    return report


def _check_names(only: Sequence[str] | str | None) -> tuple[str, ...]:
    """The checks ``only`` names (all of them for ``None``); ``ValueError`` for a name that is no check."""
    names = (only,) if isinstance(only, str) else tuple(CHECKS if only is None else only)
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        raise ValueError(f"check_env(only=...): {unknown} are not checks; the checks are {list(CHECKS)}")
    return names


def _run_check(name: str, run: CheckRun) -> int | None:
    """``CHECKS[name](run)``, with a call past its deadline and an exit of the env
    (``sys.exit``, any ``BaseException`` but ``KeyboardInterrupt``) turned into its failure."""
    try:
        return CHECKS[name](run)
    except ForeignEnvError as exc:
        raise EnvCheckError(name, str(exc)) from exc
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001  (sys.exit & co. off the boundary: the env's main-thread code)
        raise EnvCheckError(name, f"the env raised {error_text(exc)}") from exc
