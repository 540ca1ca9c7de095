"""What ``trace-gym train --ray [ADDRESS]`` builds: the loop's backend, on Ray.

:func:`trace_gym.train.loop.train` builds a trainer, an engine and, per step, an agent runner
from one backend object (:class:`trace_gym.train.backend.TrainBackend`). :class:`RayBackend`
builds the same interfaces on Ray actors, so the loop is the same code either way:

- trainer: a :class:`~trace_gym.train.distributed.trainer.TrainerGroup` of ``trainer_workers``
  ranks, replicas or FSDP2 shards (``trainer_shard``); ``0``: the in-process
  :class:`~trace_gym.train.trainer.PolicyTrainer` on the driver;
- engine: an :class:`~trace_gym.train.distributed.engines.EngineGroup` over ``rollout_workers``
  actors; its ``close()``, like the backend's, also stops the env pools, the trainer
  ranks and a cluster this process started;
- runner: a :class:`~trace_gym.train.distributed.runner.RayAgentRunner` on ``env_pools`` env
  pool actors, started on the first step for the run's env factory (dead pools are
  replaced at the start of each step).

Sizing comes from the ``ray_options`` mapping of the config (:class:`RayOptions`); on a
local cluster the CPU shares left at their defaults shrink to fit the machine
(:func:`size_to_cluster`).
"""

from __future__ import annotations

import atexit
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from trace_gym.config import config_from_mapping, doc


@dataclass(frozen=True)
class RayOptions:
    """``ray_options`` of a training config: how many actors of each role, and their resources."""

    rollout_workers: int = field(default=2, metadata=doc("rollout worker actors (one engine each)"))
    env_pools: int = field(default=2, metadata=doc("env pool actors"))
    envs_per_pool: int = field(default=64, metadata=doc("envs a pool is meant to hold at once (placement target)"))
    env_threads: int = field(default=4, metadata=doc("env work a pool runs at once"))
    trainer_workers: int = field(default=1, metadata=doc(
        "data-parallel trainer ranks as actors (0: the trainer runs in the driver process)"))
    trainer_shard: bool = field(default=False, metadata=doc(
        "FSDP2: shard parameters, gradients and AdamW state over the trainer ranks (8B+ policies)"))
    weight_sync: str = field(default="object_store", metadata=doc(
        "trainer -> rollout workers: object_store (one node) | broadcast (NCCL/gloo collective, across nodes)"))
    worker_cpus: float = field(default=1.0, metadata=doc("CPUs reserved per rollout worker"))
    worker_gpus: float = field(default=0.0, metadata=doc("GPUs per rollout worker (fractions colocate)"))
    pool_cpus: float = field(default=1.0, metadata=doc("CPUs reserved per env pool"))
    trainer_cpus: float = field(default=1.0, metadata=doc("CPUs reserved per trainer rank"))
    trainer_gpus: float = field(default=0.0, metadata=doc("GPUs per trainer rank (NCCL when > 0, else gloo)"))
    num_cpus: int | None = field(default=None, metadata=doc("logical CPUs of a local cluster (null: all)"))
    torch_threads: int | None = field(default=None, metadata=doc("torch threads per actor (null: torch's default)"))

    def __post_init__(self) -> None:
        for name in ("rollout_workers", "env_pools", "envs_per_pool", "env_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ray_options.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.weight_sync not in ("object_store", "broadcast"):
            raise ValueError(f"ray_options.weight_sync must be object_store or broadcast, got {self.weight_sync!r}")
        if self.trainer_workers < 0:
            raise ValueError(f"ray_options.trainer_workers must be >= 0, got {self.trainer_workers!r}")
        for name in ("worker_cpus", "worker_gpus", "pool_cpus", "trainer_cpus", "trainer_gpus"):
            if getattr(self, name) < 0:
                raise ValueError(f"ray_options.{name} must be >= 0, got {getattr(self, name)!r}")


def resource_demand(opts: RayOptions) -> dict[str, float]:
    """Logical ``CPU`` and ``GPU`` the actors of ``opts`` reserve at once (workers, pools,
    and trainer ranks when ``trainer_workers > 0``; each share at Ray's 1e-4 granularity).
    The driver process holds none."""
    def share(x: float) -> float:
        return round(x, 4)

    return {"CPU": opts.rollout_workers * share(opts.worker_cpus) + opts.env_pools * share(opts.pool_cpus)
            + opts.trainer_workers * share(opts.trainer_cpus),
            "GPU": opts.rollout_workers * share(opts.worker_gpus) + opts.trainer_workers * share(opts.trainer_gpus)}


def check_fits(opts: RayOptions, available: dict[str, float]) -> None:
    """Raise ``ValueError`` when the actors of ``opts`` cannot all be placed on a cluster
    with ``available`` resources (``ray.cluster_resources()``), naming what each role asks,
    rather than waiting for a placement that never comes."""
    demand = resource_demand(opts)
    for kind, need in demand.items():
        have = float(available.get(kind, 0.0))
        if need > have + 1e-9:
            gpus = kind == "GPU"
            parts = (f"{opts.rollout_workers} rollout workers x {opts.worker_gpus if gpus else opts.worker_cpus:g}",
                     *(() if gpus else (f"{opts.env_pools} env pools x {opts.pool_cpus:g}",)),
                     f"{opts.trainer_workers} trainer ranks x {opts.trainer_gpus if gpus else opts.trainer_cpus:g}")
            hint = ("a local cluster's num_cpus is logical: raise ray_options.num_cpus, or lower the per-actor "
                    "worker_cpus / pool_cpus / trainer_cpus" if not gpus else
                    "lower worker_gpus / trainer_gpus (fractions colocate) or the actor counts")
            raise ValueError(f"ray_options ask for {need:g} {kind} ({', '.join(parts)}) but the cluster has "
                             f"{have:g}; {hint}")
    # A share below one GPU lives on one device, so two shares above half a GPU never share
    # one: such actors need a device each, beside the whole devices of whole-GPU actors.
    shares = [(opts.worker_gpus, opts.rollout_workers, "worker_gpus"), (opts.trainer_gpus, opts.trainer_workers,
                                                                        "trainer_gpus")]
    whole = sum(math.ceil(g) * n for g, n, _ in shares if g >= 1)
    over_half = sum(n for g, n, _ in shares if 0.5 < g < 1)
    devices = int(float(available.get("GPU", 0.0)) + 1e-9)
    if over_half and whole + over_half > devices:
        names = [f"{n} x {name}={g:g}" for g, n, name in shares if 0.5 < g < 1]
        raise ValueError(f"ray_options: {' and '.join(names)} need {over_half} GPUs of their own (two shares above "
                         f"0.5 never fit on one device), plus {whole} whole GPUs, but the cluster has {devices}; "
                         f"use shares of at most 0.5 to colocate, or fewer actors")


#: per-actor CPU shares, with the option that counts the actors holding each
CPU_SHARES = {"worker_cpus": "rollout_workers", "pool_cpus": "env_pools", "trainer_cpus": "trainer_workers"}


def size_to_cluster(opts: RayOptions, given: Iterable[str], cpus: float) -> RayOptions:
    """``opts`` with the CPU shares the user did not set scaled down, all by one factor, so
    that every actor fits a local cluster of ``cpus`` logical CPUs.

    The defaults (2 rollout workers, 2 env pools and 1 trainer rank at 1 CPU each: 5) are
    sized for no machine in particular; a cluster this run starts on a 2-core machine must
    still take them (at 0.4 CPU each). Shares the user wrote (``given``: the keys of their
    ``ray_options``) are kept as written, so an explicit ask that exceeds the machine is
    still refused, by :func:`check_fits`. Shares are floored to Ray's 1e-4 granularity.
    """
    demand = resource_demand(opts)["CPU"]
    if demand <= cpus + 1e-9:
        return opts
    given = set(given)
    held = {name: getattr(opts, count) * round(getattr(opts, name), 4) for name, count in CPU_SHARES.items()}
    fixed = sum(cpu for name, cpu in held.items() if name in given)
    free = [name for name, cpu in held.items() if name not in given and cpu > 0]
    flexible = sum(held[name] for name in free)
    if not free or fixed >= cpus - 1e-9:
        return opts  # nothing of ours to shrink, or the user's own shares fill the cluster: check_fits says so
    scale = (cpus - fixed) / flexible
    return dataclasses.replace(opts, **{name: math.floor(getattr(opts, name) * scale * 1e4) / 1e4 for name in free})


def ray_options(mapping: dict | None) -> RayOptions:
    """:class:`RayOptions` from a config mapping; unknown keys and bad values name themselves."""
    return config_from_mapping(RayOptions, dict(mapping or {}), source="ray_options")


class RayBackend:
    """The :class:`~trace_gym.train.backend.TrainBackend` of ``train --ray``: the trainer, the
    engine and the agent runners on Ray actors (see the module docstring).

    Args:
        cfg: a ``TrainConfig`` with ``ray`` set: ``"local"`` starts a local cluster,
            anything else is an address to join; ``ray_options`` sizes the actors.
    """

    def __init__(self, cfg: Any):
        from trace_gym.train.distributed.cluster import ray_available, start_ray

        self.opts = opts = ray_options(getattr(cfg, "ray_options", None))
        ok, why = ray_available()
        if not ok:
            raise ValueError(f"--ray needs Ray: {why}")
        self.cluster = start_ray(None if cfg.ray in (None, "", "local") else cfg.ray, num_cpus=opts.num_cpus)
        self._closers: list[Callable[[], None]] = []
        self._pools: dict[int, Any] = {}
        self._closed = False
        if self.cluster.started:
            import sys

            import ray

            atexit.register(self.cluster.shutdown)
            try:
                resources = ray.cluster_resources()
                cpus = float(resources.get("CPU", 0.0))
                sized = size_to_cluster(opts, dict(getattr(cfg, "ray_options", None) or {}), cpus)
                check_fits(sized, resources)
            except ValueError:
                self.cluster.shutdown()
                raise
            shrunk = [f"{name}={getattr(sized, name):g}" for name in CPU_SHARES
                      if getattr(sized, name) != getattr(opts, name)]
            self.opts = opts = sized
            address = ray.get_runtime_context().gcs_address
            print(f"trace-gym train --ray: local Ray cluster at {address} (ray status --address {address})"
                  + (f"; default CPU shares sized to its {cpus:g} CPUs: {', '.join(shrunk)}" if shrunk else ""),
                  file=sys.stderr)

    def make_trainer(self, model_path: Any, config: Any, **kwargs: Any) -> Any:
        opts = self.opts
        if opts.trainer_workers == 0:
            from trace_gym.train.trainer import PolicyTrainer

            return PolicyTrainer(model_path, config, **kwargs)
        from trace_gym.train.distributed.trainer import TrainerGroup

        group = TrainerGroup(model_path, config, world_size=opts.trainer_workers, num_cpus=opts.trainer_cpus,
                             num_gpus=opts.trainer_gpus, num_threads=opts.torch_threads, shard=opts.trainer_shard,
                             weight_sync=opts.weight_sync, **kwargs)
        self._closers.append(group.close)
        return group

    def make_engine(self, kind: str, model_path: Any, **engine_kwargs: Any) -> Any:
        from trace_gym.train.distributed.launch import launch_rollout_workers

        opts = self.opts
        engine = launch_rollout_workers(kind, str(model_path), opts.rollout_workers, engine_kwargs=engine_kwargs,
                                        num_cpus=opts.worker_cpus, num_gpus=opts.worker_gpus,
                                        num_threads=opts.torch_threads)
        engine.on_close.append(self.close)  # closing the engine stops the whole backend, as before
        return engine

    def make_runner(self, engine: Any, tokenizer: Any, make_env: Any, sampling: Any, config: Any) -> Any:
        from trace_gym.train.distributed.launch import launch_env_pools
        from trace_gym.train.distributed.runner import RayAgentRunner

        opts = self.opts
        group = self._pools.get(id(make_env))
        if group is None:
            group = self._pools[id(make_env)] = launch_env_pools(make_env, opts.env_pools, size=opts.envs_per_pool,
                                                                  threads=opts.env_threads, num_cpus=opts.pool_cpus)
        group.revive()
        return RayAgentRunner(engine, tokenizer, group, sampling, config)

    def close(self) -> None:
        """Stop the trainer ranks, the env pools and a cluster this process started; idempotent."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        for fn in [*self._closers, *(pool.shutdown for pool in self._pools.values()), self.cluster.shutdown]:
            try:  # every part is stopped even when one of them fails; the first failure is raised
                fn()
            except Exception as exc:  # noqa: BLE001
                first = first or exc
        if first is not None:
            raise first


def ray_backend(cfg: Any) -> RayBackend:
    """:class:`RayBackend` for ``cfg`` (kept as the documented entry point)."""
    return RayBackend(cfg)


def describe(opts: RayOptions) -> str:
    """One line for ``--dry-run``."""
    return ", ".join(f"{f.name}={getattr(opts, f.name)}" for f in dataclasses.fields(opts))
