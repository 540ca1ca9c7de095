"""Playing a text env for the conformance kit (:mod:`trace_gym.env.checks`): trajectories,
their comparison, message and step-type checks, and the cross-process replay.

Run as ``python -m trace_gym.env.play``, this module is the cross-process worker of
:func:`trace_gym.env.checks.snapshot_pickle_process`: it reads ``(sys.path, pickled
factory, jobs)`` on stdin, restores each pickled snapshot into a fresh env, plays its
actions, and writes the trajectories back, pickled.
"""

from __future__ import annotations

import math
import pickle
from typing import Any, Sequence

import numpy as np

from trace_gym.env.contract import EnvCheckError, EnvFactory, ReferenceActions, _portable
from trace_gym.types import Message, Task


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
        raise EnvCheckError("snapshot_pickle_process", f"worker gave no answer in {timeout:.0f} s") from exc
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise EnvCheckError("snapshot_pickle_process", f"worker exited {proc.returncode}: {tail}")
    return pickle.loads(proc.stdout)


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


def actions_for(env: Any, task: Task, actions: Any, max_steps: int, seed: int) -> list[str]:
    if actions is None:
        if isinstance(env.unwrapped, ReferenceActions):
            return list(env.unwrapped.reference_actions(task))[:max_steps]
        space = env.action_space
        space.seed(seed)
        return [space.sample() for _ in range(max_steps)]
    if callable(actions):
        return list(actions(task))[:max_steps]
    return list(actions[task.id])[:max_steps]


if __name__ == "__main__":  # the cross-process worker of snapshot_pickle_process
    import sys as _sys

    _path, _factory, _jobs = pickle.loads(_sys.stdin.buffer.read())
    _sys.path[:0] = [p for p in _path if p not in _sys.path]
    _make_env = pickle.loads(_factory)  # after sys.path: unpickling imports the factory's module
    _out = replay_in_fresh_env(_make_env, _jobs)
    _sys.stdout.buffer.write(pickle.dumps(_out, protocol=pickle.HIGHEST_PROTOCOL))
