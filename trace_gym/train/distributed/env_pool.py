"""Environment pools: actors holding env instances, and the driver's side of them.

Three pieces:

- :class:`EnvPool` is the actor body. It holds the env instances of one family and serves
  them in batches: ``open`` (make + reset, then restore for a branch), ``step`` (step, then
  snapshot if the episode goes on) and ``close``, each for a list of envs in one call, run
  on the pool's own threads. A turn's env work is the agent loop's own code
  (:meth:`AgentRunner._env_step <trace_gym.agent.loop.AgentRunner._env_step>`,
  ``_open_env``, ``_close_env``), so an env behaves, fails and is timed exactly as in
  process.
- :class:`EnvPoolGroup` is the driver's view of the pools: which are alive, how many envs
  each holds (new envs go to the least loaded), and how to start replacements.
- :class:`PoolExecutor` stands in for :class:`~trace_gym.agent.loop.AgentRunner`'s env thread
  pool (see :class:`trace_gym.train.distributed.runner.RayAgentRunner`). The agent loop submits
  one turn's env step per episode; the executor holds them until the round is complete
  and then sends **one call per pool** with all of that pool's steps. Closes are batched
  the same way.

Fault tolerance: when a pool dies (its call fails with the transport's actor-death error,
``ray.kill`` included), every episode whose env lived there is restored **from its last
snapshot** on a live pool -- reset with the episode's seed, then ``restore`` of the
snapshot after its last turn (none for an episode that had not stepped yet) -- and the
lost step is stepped again there. Snapshots restore exactly (the env contract,
:func:`trace_gym.env.checks.check_env`), so the episode goes on as if nothing happened: its turn
is recorded once. The re-done work goes to the episode's ledger apart
(``recovered_episodes``, ``redone_env_steps``); ``env_steps`` counts each step of the
trajectories once. Episodes on the dead pool that are waiting for generation are restored
lazily, when their next step is sent; their close on the dead pool is a no-op.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from trace_gym.agent.loop import AgentRunner
from trace_gym.env.contract import EnvFactory, ReplayCost, Snapshot
from trace_gym.types import Task

_log = logging.getLogger(__name__)


@dataclass
class _Slot:
    """What the agent loop's env helpers read from an episode (``env``, ``env_closed``)
    or a runner (``make_env``)."""

    env: Any = None
    env_closed: bool = False
    make_env: Any = None


class EnvPool:
    """Actor body: N env instances of one family, served in batches.

    Args:
        make_env: zero-argument factory of fresh envs (pickled to the actor).
        threads: env work run at once inside the pool (resets, steps of slow tools).
        name: label in logs and :meth:`stats`.
    """

    def __init__(self, make_env: EnvFactory, threads: int = 4, name: str = "env-pool"):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.name = name
        self._slot = _Slot(make_env=make_env)
        self._envs: dict[int, Any] = {}
        self._next_id = 0
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="env")
        self._counts = {"opened": 0, "steps": 0, "closed": 0, "calls": 0}

    def open(self, jobs: Sequence[tuple[Task, int, Snapshot | None]]) -> list[tuple]:
        """Make, reset (``seed``, ``options={"task": task}``) and, when given, restore one
        env per job. Returns per job ``(env_id, obs, info, error, seconds, replay_steps)``;
        ``env_id`` is ``None`` when the factory itself failed (there is nothing to close)."""
        self._counts["calls"] += 1

        def one(job: tuple) -> tuple:
            task, seed, snapshot = job
            env, obs, info, error, seconds = AgentRunner._open_env(self._slot, task, seed, snapshot)
            replay = 0
            if snapshot is not None and error is None and isinstance(env.unwrapped, ReplayCost):
                replay = int(env.unwrapped.replay_steps(snapshot))
            return env, obs, info, error, seconds, replay

        rows = []
        for env, obs, info, error, seconds, replay in self._threads.map(one, list(jobs)):
            env_id = None
            if env is not None:
                env_id = self._next_id
                self._next_id += 1
                self._envs[env_id] = env
                self._counts["opened"] += 1
            rows.append((env_id, obs, info, error, seconds, replay))
        return rows

    def step(self, items: Sequence[tuple[int, str]]) -> list[tuple]:
        """Step each ``(env_id, action)``; snapshot the env when its episode goes on.

        Returns per item ``(result, snapshot, error, seconds)`` as the agent loop's
        ``_env_step`` does; an env that raises gives ``error`` and never fails the call.
        """
        self._counts["calls"] += 1

        def one(item: tuple[int, str]) -> tuple:
            env_id, action = item
            env = self._envs.get(env_id)
            if env is None:
                return None, None, f"KeyError in env.step: env {env_id} is not open in {self.name}", 0.0
            return AgentRunner._env_step(_Slot(env=env), action)

        rows = list(self._threads.map(one, list(items)))
        self._counts["steps"] += len(rows)
        return rows

    def close(self, env_ids: Sequence[int]) -> list[tuple[float, str | None]]:
        """Close and forget each env: ``(seconds, error)`` per id; never raises."""
        self._counts["calls"] += 1
        envs = [self._envs.pop(i, None) for i in env_ids]
        rows = list(self._threads.map(lambda env: AgentRunner._close_env(_Slot(env=env)), envs))
        self._counts["closed"] += len(rows)
        return rows

    def stats(self) -> dict[str, Any]:
        """Live env count and call/step counters since the pool started."""
        return {"name": self.name, "live": len(self._envs), **self._counts}

    def ping(self) -> bool:
        return True


@dataclass(eq=False)
class RemoteEnv:
    """Driver-side handle of an env held by a pool: which pool, which env there.

    It is what ``Episode.env`` holds in a distributed run; the pool executor moves it to
    another pool when an episode is recovered. It is not an env: the agent loop reaches
    envs only through its executor.
    """

    pool: int
    env_id: int

    @property
    def unwrapped(self) -> "RemoteEnv":
        return self


class EnvPoolGroup:
    """The driver's view of a set of env pools.

    Args:
        pools: actor handles (Ray) or :class:`EnvPool` objects (a local transport).
        transport: how to call them (:mod:`trace_gym.train.distributed.transport`).
        make_env: the factory the pools were started with.
        spawn: ``index -> new pool``, used by :meth:`revive` to replace dead pools
            (``None``: dead pools stay dead).
        size: envs a pool is meant to hold at once; placement is least-loaded first, and
            a pool above ``size`` is logged once (the agent loop opens one env per live
            episode, so ``pools * size`` should cover a step's widest moment).
    """

    def __init__(self, pools: Sequence[Any], transport: Any, make_env: EnvFactory | None = None, *,
                 spawn: Callable[[int], Any] | None = None, size: int = 64):
        if not pools:
            raise ValueError("an env pool group needs at least one pool")
        self.pools = list(pools)
        self.transport = transport
        self.make_env = make_env
        self.spawn = spawn
        self.size = size
        self.alive = [True] * len(self.pools)
        self.load = [0] * len(self.pools)
        self.deaths = 0
        self._lock = threading.Lock()
        self._warned = False

    def place(self, count: int) -> list[int]:
        """Pools for ``count`` new envs: each on the live pool holding the fewest
        (ties: lowest index). Raises ``RuntimeError`` when every pool is dead."""
        with self._lock:
            live = [i for i, ok in enumerate(self.alive) if ok]
            if not live:
                raise RuntimeError(f"every env pool is dead ({len(self.pools)} started, {self.deaths} deaths)")
            out = []
            load = {i: self.load[i] for i in live}
            for _ in range(count):
                i = min(live, key=lambda p: (load[p], p))
                load[i] += 1
                out.append(i)
            if not self._warned and max(load.values()) > self.size:
                self._warned = True
                _log.warning("env pools hold %d envs each, above their size %d", max(load.values()), self.size)
            return out

    def opened(self, pool: int, n: int = 1) -> None:
        with self._lock:
            self.load[pool] += n

    def closed(self, pool: int, n: int = 1) -> None:
        with self._lock:
            self.load[pool] = max(0, self.load[pool] - n)

    def mark_dead(self, pool: int) -> bool:
        """Record that ``pool`` died; returns whether this is news."""
        with self._lock:
            if not self.alive[pool]:
                return False
            self.alive[pool] = False
            self.load[pool] = 0
            self.deaths += 1
        _log.warning("env pool %d died; its episodes resume from their snapshots elsewhere", pool)
        return True

    def revive(self) -> int:
        """Start a fresh pool in place of each dead one (when a ``spawn`` was given).
        Returns how many were started. Call between steps."""
        if self.spawn is None:
            return 0
        started = 0
        for i, ok in enumerate(self.alive):
            if not ok:
                self.pools[i] = self.spawn(i)
                with self._lock:
                    self.alive[i], self.load[i] = True, 0
                started += 1
        return started

    def stats(self) -> list[dict[str, Any]]:
        """Each live pool's :meth:`EnvPool.stats` (dead pools: ``{"alive": False}``)."""
        futures = {i: self.transport.call(p, "stats") for i, p in enumerate(self.pools) if self.alive[i]}
        return [futures[i].result() | {"alive": True} if i in futures else {"alive": False}
                for i in range(len(self.pools))]

    def shutdown(self) -> None:
        """Kill every pool (their envs go with them)."""
        for i, p in enumerate(self.pools):
            if self.alive[i]:
                try:
                    self.transport.kill(p)
                except Exception:  # noqa: BLE001  (already gone)
                    pass
            self.alive[i] = False


class PoolExecutor:
    """Stands in for the agent loop's env thread pool: batches env work per pool.

    ``submit`` accepts the two calls the agent loop makes (``AgentRunner._env_step`` and
    ``AgentRunner._close_env``) and returns a future at once; :meth:`flush` sends what was
    submitted, one call per pool for the steps and one for the closes. ``open`` is the
    batched reset/restore of new episodes (used by the runner's ``_open``).
    """

    def __init__(self, group: EnvPoolGroup, recovery_threads: int = 4):
        self.group = group
        self.transport = group.transport
        self._steps: list[tuple[Any, str, Future]] = []
        self._closes: list[tuple[Any, Future]] = []
        self._recovery = ThreadPoolExecutor(max_workers=recovery_threads, thread_name_prefix="env-recovery")
        self._redone: dict[int, tuple[int, int]] = {}  # episode uid -> (episodes recovered, steps re-done)
        self._lock = threading.Lock()
        self.calls = {"open": 0, "step": 0, "close": 0}  # calls sent to pools (batches), by kind

    # -- the executor interface the agent loop uses
    def submit(self, fn: Callable, *args: Any) -> Future:
        out: Future = Future()
        if fn is AgentRunner._env_step:
            ep, text = args
            self._steps.append((ep, text, out))
        elif fn is AgentRunner._close_env:
            self._closes.append((args[0], out))
        else:
            raise TypeError(f"PoolExecutor runs env steps and closes only, got {getattr(fn, '__name__', fn)!r}")
        return out

    def map(self, fn: Callable, items: Sequence[Any]) -> list[Any]:
        futures = [self.submit(fn, item) for item in items]
        self.flush()
        return [f.result() for f in futures]

    def shutdown(self, wait: bool = True) -> None:  # noqa: A002  (Executor signature)
        self.flush()
        self._recovery.shutdown(wait=wait)

    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.calls[kind] += n

    # -- batching
    def flush(self) -> None:
        """Send every submitted step and close: one call per pool for each kind."""
        steps, self._steps = self._steps, []
        closes, self._closes = self._closes, []
        if steps:
            self._send_steps([(ep, text, out) for ep, text, out in steps])
        by_pool: dict[int, list[tuple[Any, Future]]] = {}
        for ep, out in closes:
            if ep.env is None or ep.env_closed:
                out.set_result((0.0, None))
                continue
            ep.env_closed = True
            if not self.group.alive[ep.env.pool]:
                out.set_result((0.0, None))  # the env went with its pool
                continue
            by_pool.setdefault(ep.env.pool, []).append((ep, out))
        for pool, items in by_pool.items():
            future = self.transport.call(self.group.pools[pool], "close", [ep.env.env_id for ep, _ in items])
            self._count("close")
            future.add_done_callback(lambda f, pool=pool, items=items: self._closes_done(pool, items, f))

    def _send_steps(self, items: list[tuple[Any, str, Future]]) -> None:
        by_pool: dict[int, list] = {}
        lost = []
        for item in items:
            handle = item[0].env
            (by_pool.setdefault(handle.pool, []) if self.group.alive[handle.pool] else lost).append(item)
        if lost:
            self._recovery.submit(self._recover, lost)
        for pool, batch in by_pool.items():
            future = self.transport.call(self.group.pools[pool], "step", [(ep.env.env_id, text) for ep, text, _ in batch])
            self._count("step")
            future.add_done_callback(lambda f, pool=pool, batch=batch: self._steps_done(pool, batch, f))

    def _steps_done(self, pool: int, batch: list, future: Future) -> None:
        try:
            rows = future.result()
        except BaseException as exc:  # noqa: BLE001  (a dead pool is recovered; other errors end the episodes)
            if self.transport.is_dead(exc):
                self.group.mark_dead(pool)
                self._recovery.submit(self._recover, batch)
            else:
                for _, _, out in batch:
                    out.set_result((None, None, _remote_error(exc, pool, "step"), 0.0))
            return
        for (_, _, out), row in zip(batch, rows):
            out.set_result(row)

    def _closes_done(self, pool: int, items: list, future: Future) -> None:
        try:
            rows = future.result()
        except BaseException as exc:  # noqa: BLE001
            if self.transport.is_dead(exc):
                self.group.mark_dead(pool)
                rows = [(0.0, None)] * len(items)
            else:
                rows = [(0.0, _remote_error(exc, pool, "close"))] * len(items)
        else:
            self.group.closed(pool, len(items))
        for (_, out), row in zip(items, rows):
            out.set_result(row)

    # -- opening envs
    def open(self, jobs: Sequence[tuple[Task, int, Snapshot | None]]) -> list[tuple]:
        """Open one env per job on the pools (least loaded first), in one call per pool;
        jobs whose pool dies meanwhile are placed again. Returns per job
        ``(RemoteEnv | None, obs, info, error, seconds, replay_steps)``."""
        rows: list[tuple | None] = [None] * len(jobs)
        todo = list(range(len(jobs)))
        while todo:
            placed: dict[int, list[int]] = {}
            for j, pool in zip(todo, self.group.place(len(todo))):
                placed.setdefault(pool, []).append(j)
            futures = {pool: self.transport.call(self.group.pools[pool], "open", [jobs[j] for j in js])
                       for pool, js in placed.items()}
            self._count("open", len(futures))
            wait(list(futures.values()))
            todo = []
            for pool, js in placed.items():
                try:
                    got = futures[pool].result()
                except BaseException as exc:  # noqa: BLE001
                    if not self.transport.is_dead(exc):
                        for j in js:
                            rows[j] = (None, None, None, _remote_error(exc, pool, "reset"), 0.0, 0)
                        continue
                    self.group.mark_dead(pool)
                    todo.extend(js)
                    continue
                for j, (env_id, obs, info, error, seconds, replay) in zip(js, got):
                    handle = None
                    if env_id is not None:
                        handle = RemoteEnv(pool, env_id)
                        self.group.opened(pool)
                    rows[j] = (handle, obs, info, error, seconds, replay)
            todo.sort()
        return rows  # type: ignore[return-value]

    # -- recovery
    def _recover(self, items: list[tuple[Any, str, Future]]) -> None:
        """Restore each item's episode from its last snapshot on a live pool, then step it
        again; the futures get the re-done step's result."""
        try:
            jobs = [(ep.task, ep.seed, ep.turns[-1].snapshot if ep.turns else None) for ep, _, _ in items]
            opened = self.open(jobs)
        except BaseException as exc:  # noqa: BLE001  (no pool left: the episodes end on the error)
            for _, _, out in items:
                out.set_result((None, None, f"{type(exc).__name__} in env.restore: {exc}", 0.0))
            return
        again = []
        for (ep, text, out), (handle, _, _, error, seconds, replay) in zip(items, opened):
            if error is not None or handle is None:
                out.set_result((None, None, error or "env recovery failed", seconds))
                continue
            ep.env.pool, ep.env.env_id = handle.pool, handle.env_id  # the episode's env moved
            with self._lock:
                episodes, steps = self._redone.get(ep.uid, (0, 0))
                self._redone[ep.uid] = (episodes + 1, steps + 1 + replay)
            again.append((ep, text, out))
        if again:
            self._send_steps(again)

    def take_redone(self, uid: int) -> tuple[int, int]:
        """``(episodes recovered, env steps re-done)`` for episode ``uid`` since the last
        call (the runner books them into the episode's ledger)."""
        with self._lock:
            return self._redone.pop(uid, (0, 0))


def _remote_error(exc: BaseException, pool: int, where: str) -> str:
    return f"{type(exc).__name__} in env.{where} (env pool {pool}): {exc}"[:2000]

