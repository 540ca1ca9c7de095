"""How the driver talks to its actors: one seam, two implementations.

Everything on the driver side of :mod:`trace_gym.train.distributed` (the env pool executor,
the rollout engine group, the trainer group) calls actors only through a
:class:`Transport`: ``call(actor, method, *args) -> concurrent.futures.Future``. So the
same driver code runs

- on Ray (:class:`RayTransport`): an actor is a Ray actor handle, a call is
  ``actor.method.remote(*args)``, its future is ``ObjectRef.future()``, and a dead actor
  surfaces as ``ray.exceptions.RayActorError``;
- in one process (:class:`LocalTransport`): an actor is a plain object, calls run on a
  thread pool, one at a time per actor (Ray's default actor semantics), and
  :meth:`LocalTransport.kill` makes an actor's running and later calls fail with
  :class:`ActorDied`. The scheduling simulation (``benchmarks/bench_ray_scheduling.py``)
  drives 64 mock rollout workers and 256 mock env pools through it, which this machine
  could not start as processes.

This module imports Ray only inside :class:`RayTransport`.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable


class ActorDied(RuntimeError):
    """A call's actor died (or was killed) before it answered (:class:`LocalTransport`)."""


@runtime_checkable
class Transport(Protocol):
    """Calls into actors, returning futures."""

    def call(self, actor: Any, method: str, *args: Any) -> Future:
        """Run ``actor.method(*args)`` where the actor lives; the future holds its result."""
        ...

    def put(self, value: Any) -> Any:
        """A shared reference to ``value`` that several calls can take as an argument
        (Ray: an object-store ref, fetched once per node; locally: the value itself)."""
        ...

    def is_dead(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by a call's future) means the actor is gone."""
        ...

    def kill(self, actor: Any) -> None:
        """End the actor now; its running and queued calls fail (fault drills, shutdown)."""
        ...


class RayTransport:
    """:class:`Transport` over Ray actor handles."""

    def __init__(self) -> None:
        import ray

        self._ray = ray

    def call(self, actor: Any, method: str, *args: Any) -> Future:
        return getattr(actor, method).remote(*args).future()

    def put(self, value: Any) -> Any:
        return self._ray.put(value)

    def is_dead(self, exc: BaseException) -> bool:
        from ray.exceptions import ActorUnavailableError, RayActorError

        return isinstance(exc, (RayActorError, ActorUnavailableError))

    def kill(self, actor: Any) -> None:
        self._ray.kill(actor, no_restart=True)


class LocalTransport:
    """:class:`Transport` over plain objects in this process (tests, the scheduling simulation).

    Each actor runs one call at a time, in submission order (a queue per actor drained on
    a shared pool of ``threads`` threads). A killed actor fails its queued calls, and the
    call it is running (its result is dropped), with :class:`ActorDied`.
    """

    def __init__(self, threads: int = 64):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="actor")
        self._queues: dict[int, deque] = {}
        self._running: set[int] = set()
        self._dead: set[int] = set()
        self._guard = threading.Lock()

    def call(self, actor: Any, method: str, *args: Any) -> Future:
        out: Future = Future()
        key = id(actor)
        with self._guard:
            if key in self._dead:
                out.set_exception(ActorDied(f"{type(actor).__name__} actor was killed"))
                return out
            self._queues.setdefault(key, deque()).append((out, getattr(actor, method), args, method))
            if key in self._running:
                return out
            self._running.add(key)
        self._pool.submit(self._drain, key, type(actor).__name__)
        return out

    def _drain(self, key: int, name: str) -> None:
        while True:
            with self._guard:
                queue = self._queues[key]
                if not queue:
                    self._running.discard(key)
                    return
                out, fn, args, method = queue.popleft()
                dead = key in self._dead
            if dead:
                out.set_exception(ActorDied(f"{name} actor was killed"))
                continue
            try:
                value = fn(*args)
            except BaseException as exc:  # noqa: BLE001  (delivered through the future)
                out.set_exception(exc)
                continue
            if key in self._dead:
                out.set_exception(ActorDied(f"{name} actor died during {method}"))
            else:
                out.set_result(value)

    def put(self, value: Any) -> Any:
        return value

    def is_dead(self, exc: BaseException) -> bool:
        return isinstance(exc, ActorDied)

    def kill(self, actor: Any) -> None:
        with self._guard:
            self._dead.add(id(actor))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
