"""Playing a text env for the conformance kit (:mod:`trace_gym.env.checks`): the env under
check behind its boundary (:class:`BoundedEnv`), trajectories, their comparison, message and
step-type checks, and the cross-process replay.

Run as ``python -m trace_gym.env.play``, this module is the cross-process worker of
:func:`trace_gym.env.checks.snapshot_pickle_process`: it reads ``(sys.path, pickled
factory, jobs)`` on stdin, restores each pickled snapshot into a fresh env, plays its
actions, and writes ``("ok", trajectories)`` or ``("error", one line)`` back, pickled, on
a private copy of its stdout: before any env code runs, file descriptor 1 is pointed at
stderr, so an env that prints (from Python or C) cannot corrupt the reply.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
from typing import Any, Callable, Sequence

import numpy as np

from trace_gym.env.boundary import ForeignBoundary, error_text
from trace_gym.env.contract import EnvCheckError, EnvFactory, ReferenceActions, _portable
from trace_gym.types import Message, Task


# --- the env under check, behind its boundary ----------------------------------------


class BoundedEnv:
    """The env under check with every call into it (reset, step, snapshot, restore, close,
    reference_actions) made through a :class:`~trace_gym.env.boundary.ForeignBoundary`:
    each call has ``call_timeout_s`` seconds, and a ``BaseException`` that is not an
    ``Exception`` (``sys.exit`` in ``reset``) becomes a
    :class:`~trace_gym.env.boundary.ForeignEnvError` naming the call; an ``Exception``
    arrives as the env raised it. Other attributes are the env's own.

    An env that already crosses a boundary of its own (an adapted env,
    :class:`trace_gym.env.adapter.ForeignEnv`, whose ``boundary`` bounds every call into
    the foreign code with its own ``call_timeout_s``) is called directly: a second
    boundary around it would run its calls inline, without the private RNG they swap in.
    """

    def __init__(self, env: Any, call_timeout_s: float):
        self.env = env  # as given (wrappers and all): close() goes through them
        self.raw = env.unwrapped if hasattr(env, "unwrapped") else env
        own = isinstance(getattr(self.raw, "boundary", None), ForeignBoundary)
        self.boundary = None if own else ForeignBoundary(call_timeout_s=call_timeout_s)
        self.where = type(self.raw).__name__

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` as a call into the env named ``what`` (through the boundary)."""
        if self.boundary is None:
            return fn(*args)
        return self.boundary.call(what, fn, *args, where=self.where)

    @property
    def stuck(self) -> bool:
        """Whether a call given up on is still running (the env then takes no further call)."""
        return self.boundary is not None and self.boundary.stuck

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        return self.call("reset", lambda: self.raw.reset(seed=seed, options=options))

    def step(self, action: Any) -> Any:
        return self.call("step", self.raw.step, action)

    def snapshot(self) -> Any:
        return self.call("snapshot", self.raw.snapshot)

    def restore(self, snapshot: Any) -> None:
        self.call("restore", self.raw.restore, snapshot)

    def close(self) -> None:
        self.call("close", self.env.close)

    def reference_actions(self, task: Task, max_steps: int) -> list:
        """The first ``max_steps`` of the env's ``reference_actions(task)``, taken lazily (an
        endless generator is cut, not listed whole), within one call's deadline."""
        return self.call("reference_actions", lambda: list(itertools.islice(self.raw.reference_actions(task),
                                                                           max_steps)))

    def __getattr__(self, name: str) -> Any:
        if name in ("env", "raw", "boundary"):  # not set yet (a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.raw, name)


# --- trajectory helpers -------------------------------------------------------------

Step = tuple  # (observation: tuple[Message, ...], reward: float, terminated: bool, truncated: bool)


def record(result: tuple) -> Step:
    obs, reward, terminated, truncated, _info = result
    return (tuple(obs), float(reward), bool(terminated), bool(truncated))


def play(env: Any, actions: Sequence[str]) -> list[Step]:
    """Step ``actions`` in order until the episode ends; return the recorded steps."""
    out: list[Step] = []
    for action in actions:
        out.append(record(env.step(action)))
        if out[-1][2] or out[-1][3]:
            break
    return out


def diff(a: Sequence[Step], b: Sequence[Step]) -> str | None:
    """First difference between two recorded trajectories, or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            for name, u, v in zip(("observation", "reward", "terminated", "truncated"), x, y):
                if u != v:
                    return f"step {i}: {name} differs: {u!r:.300} != {v!r:.300}"
    if len(a) != len(b):
        return f"trajectory lengths differ: {len(a)} != {len(b)}"
    return None


def replay_in_fresh_env(make_env: EnvFactory, jobs: list[tuple[bytes, list[str]]]) -> list:
    """Worker body: restore each pickled snapshot into a fresh env, play its actions."""
    results = []
    env = make_env()
    base = env.unwrapped if hasattr(env, "unwrapped") else env
    try:
        for blob, actions in jobs:
            snap = pickle.loads(blob)
            base.reset(seed=0)
            base.restore(snap)
            results.append(play(base, actions))
    finally:
        env.close()
    return results


def worker_reply(make_env: Callable[[], EnvFactory], jobs: list[tuple[bytes, list[str]]]) -> tuple[str, Any]:
    """``("ok", trajectories)``, or ``("error", one line)`` naming what the env raised or
    exited with (``sys.exit`` included): the worker always answers."""
    try:
        return "ok", replay_in_fresh_env(make_env(), jobs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001  (the env under check: whatever it raised, named)
        return "error", error_text(exc)


def cross_process(make_env: EnvFactory, jobs, timeout: float) -> list:
    """Replay ``jobs`` in a fresh interpreter (``python -m trace_gym.env.play``), via pickle.

    The worker gets this process's ``sys.path`` (so the factory's module imports there
    too) and a :func:`~trace_gym.env.contract._portable` factory; it imports nothing but this
    module and the contract it checks.
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
            [sys.executable, "-m", "trace_gym.env.play"], input=payload, capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvCheckError("snapshot_pickle_process", f"worker gave no answer in {timeout:g} s "
                            "(process_timeout)") from exc
    tail = " ".join(proc.stderr.decode(errors="replace")[-2000:].split())
    if proc.returncode != 0:
        raise EnvCheckError("snapshot_pickle_process", f"worker exited {proc.returncode}: {tail}")
    try:
        kind, value = pickle.loads(proc.stdout)
    except Exception as exc:  # noqa: BLE001  (an empty or cut reply: the env ended the worker, os._exit)
        raise EnvCheckError("snapshot_pickle_process", f"the worker ended without a readable reply "
                            f"({type(exc).__name__}: {exc}); did the env end the process? {tail}") from None
    if kind != "ok":
        raise EnvCheckError("snapshot_pickle_process", f"in the worker process, the env raised {value}")
    return value


def default_make_env(env: Any) -> EnvFactory | None:
    spec = getattr(env, "spec", None)
    if spec is None or spec.id is None:
        return None
    import functools

    import gymnasium

    # the spec itself (not its id): a fresh interpreter may not have registered the id
    return functools.partial(gymnasium.make, spec, disable_env_checker=True)


def check_messages(check: str, obs: Any, where: str, *, first: bool = False) -> None:
    if not isinstance(obs, list):
        raise EnvCheckError(check, f"{where}: observation must be a list of Message, got {type(obs).__name__}")
    for m in obs:
        if not isinstance(m, Message):
            raise EnvCheckError(check, f"{where}: observation item {m!r:.100} is not a Message")
    if first and not any(m.role == "user" for m in obs):
        raise EnvCheckError(check, f"{where}: the first observation has no user message")


def check_step_types(check: str, result: Any, where: str) -> None:
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvCheckError(check, f"{where}: step must return a 5-tuple, got {result!r:.200}")
    obs, reward, terminated, truncated, info = result
    check_messages(check, obs, where)
    if not isinstance(reward, (float, int, np.floating)) or isinstance(reward, bool) or not math.isfinite(reward):
        raise EnvCheckError(check, f"{where}: reward must be a finite float, got {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise EnvCheckError(check, f"{where}: {name} must be bool, got {flag!r}")
    if not isinstance(info, dict):
        raise EnvCheckError(check, f"{where}: info must be a dict, got {type(info).__name__}")


def actions_for(env: BoundedEnv, task: Task, actions: Any, max_steps: int, seed: int) -> list[str]:
    """At most ``max_steps`` actions for ``task``, each source taken lazily (an endless
    generator is cut at ``max_steps``): ``actions`` (a mapping by task id or a function of
    the task), else the env's ``reference_actions`` (through its boundary), else seeded
    samples of its action space."""
    if actions is None:
        if isinstance(env.raw, ReferenceActions):
            return env.reference_actions(task, max_steps)
        space = env.action_space
        space.seed(seed)
        return [space.sample() for _ in range(max_steps)]
    return list(itertools.islice(actions(task) if callable(actions) else actions[task.id], max_steps))


def _worker_main() -> None:
    """The cross-process worker of snapshot_pickle_process (module docstring)."""
    import sys

    reply = os.fdopen(os.dup(1), "wb")  # the private reply channel: a copy of stdout no env code knows
    os.dup2(2, 1)  # what anything prints to stdout from now on (Python or C) goes to stderr
    path, factory, jobs = pickle.loads(sys.stdin.buffer.read())
    sys.path[:0] = [p for p in path if p not in sys.path]
    # unpickled after sys.path is set (it imports the factory's module), and inside the reply
    out = worker_reply(lambda: pickle.loads(factory), jobs)
    with reply:
        reply.write(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    _worker_main()
