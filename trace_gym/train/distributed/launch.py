"""Starting this package's actors on Ray: env pools and rollout workers.

Both return the driver-side group (:class:`~trace_gym.train.distributed.env_pool.EnvPoolGroup`,
:class:`~trace_gym.train.distributed.engines.EngineGroup`) with a ``spawn`` that starts a
replacement for a dead actor, and wait until every actor is up (env module imported,
model loaded), so a broken setup fails here with its own error rather than mid-step.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from trace_gym.train.distributed.cluster import actor_options
from trace_gym.train.distributed.engines import EngineGroup, RolloutWorker
from trace_gym.train.distributed.env_pool import EnvPool, EnvPoolGroup
from trace_gym.train.distributed.transport import RayTransport
from trace_gym.env.contract import EnvFactory, _portable


def launch_env_pools(make_env: EnvFactory, pools: int, *, size: int = 64, threads: int = 4,
                     num_cpus: float = 1.0, timeout: float = 300.0) -> EnvPoolGroup:
    """Start ``pools`` :class:`EnvPool` actors of ``make_env``'s family.

    Args:
        make_env: picklable zero-argument factory (a ``gymnasium.make`` partial names the
            env spec, not an id only this process registered).
        pools: how many pool actors.
        size: envs each pool is meant to hold at once (placement target).
        threads: env work each pool runs at once.
        num_cpus: CPUs each pool actor reserves.
    """
    import ray

    if pools < 1:
        raise ValueError(f"pools must be >= 1, got {pools}")
    factory = _portable(make_env)
    remote = ray.remote(EnvPool)

    def spawn(i: int) -> Any:
        return remote.options(**actor_options("env-pool", i, num_cpus)).remote(factory, threads, f"env-pool-{i}")

    group = EnvPoolGroup([spawn(i) for i in range(pools)], RayTransport(), factory, spawn=spawn, size=size)
    _wait(group.transport, group.pools, "ping", timeout, "env pool")
    return group


def launch_rollout_workers(kind: str, model_path: str, workers: int, *, engine_kwargs: dict | None = None,
                           num_cpus: float = 1.0, num_gpus: float = 0.0, latency_seconds: float = 0.0,
                           num_threads: int | None = None, timeout: float = 600.0) -> EngineGroup:
    """Start ``workers`` :class:`RolloutWorker` actors, each loading ``model_path``.

    Args:
        kind: engine kind (``"hf"``, ``"vllm"``, ``"auto"``).
        model_path: model name or local folder (resolved on the driver; a local folder
            must be readable on every node).
        engine_kwargs: keyword arguments of each engine.
        num_cpus / num_gpus: resources each worker reserves (a fractional GPU colocates
            workers, or a worker and the trainer, on one device).
        latency_seconds: see :class:`RolloutWorker` (fault drills).
        num_threads: torch threads per worker.
    """
    import ray
    from transformers import AutoTokenizer

    from trace_gym.models import resolve_model

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    path = str(resolve_model(model_path))
    remote = ray.remote(RolloutWorker)

    def spawn(i: int) -> Any:
        opts = actor_options("rollout-worker", i, num_cpus, num_gpus, max_concurrency=2)
        return remote.options(**opts).remote(kind, path, dict(engine_kwargs or {}), latency_seconds=latency_seconds,
                                             num_threads=num_threads)

    handles = [spawn(i) for i in range(workers)]
    group = EngineGroup(handles, RayTransport(), AutoTokenizer.from_pretrained(path), spawn=spawn)
    _wait(group.transport, handles, "info", timeout, "rollout worker")
    return group


def _wait(transport: Any, actors: list, method: str, timeout: float, what: str) -> None:
    t0 = time.perf_counter()
    futures = [transport.call(a, method) for a in actors]
    for i, f in enumerate(futures):
        try:
            f.result(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except (TimeoutError, concurrent.futures.TimeoutError) as exc:  # one class from Python 3.11
            raise RuntimeError(f"{what} {i} did not start within {timeout:g} s: its actor was not placed or is "
                               f"still loading (`ray status` shows the cluster's free resources and pending "
                               f"demands)") from exc
        except Exception as exc:
            raise RuntimeError(f"{what} {i} did not start: {type(exc).__name__}: {exc}") from exc
