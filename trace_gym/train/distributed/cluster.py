"""Starting or joining a Ray cluster, and launching this package's actors on it.

:func:`start_ray` starts a local cluster when no address is given (token auth off, no
dashboard, its own temp dir, the driver's import path handed to the workers) or joins
an existing one (``"auto"`` or ``"ray://host:10001"`` / ``"host:6379"``). Actors are
named ``trace_gym/<role>-<i>`` in the ``trace_gym`` namespace, so
``ray.util.list_named_actors()`` (and ``ray list actors`` on a cluster that runs Ray's
dashboard) shows which is which; ``ray status`` shows the resources they hold.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from trace_gym.utils.pythonpath import source_folders_path

NAMESPACE = "trace_gym"
_launches = itertools.count()

_log = logging.getLogger(__name__)


def ray_available() -> tuple[bool, str]:
    """Whether ``import ray`` works here, and why not when it does not."""
    try:
        import ray  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (report why; callers skip or fail with it)
        return False, f"import ray failed: {type(exc).__name__}: {exc} (pip install 'trace_gym[ray]')"
    return True, "ok"


@dataclass
class RayCluster:
    """A Ray connection made by :func:`start_ray`.

    Attributes:
        address: the cluster's address (``None`` when this call started it).
        temp_dir: the local cluster's session folder root (removed by :meth:`shutdown`),
            ``None`` when joining.
        started: whether :func:`start_ray` started the cluster (rather than joining one,
            or finding Ray already initialised in this process).
    """

    address: str | None
    temp_dir: str | None
    started: bool

    def shutdown(self) -> None:
        """Disconnect (and stop the cluster when this process started it)."""
        import ray

        if self.started and ray.is_initialized():
            ray.shutdown()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_ray(address: str | None = None, *, num_cpus: int | None = None, temp_dir: str | None = None,
              object_store_memory: int | None = None) -> RayCluster:
    """Start a local Ray cluster (``address=None``) or join ``address``.

    Args:
        address: ``None`` to start a local cluster; ``"auto"`` or a cluster address to join.
        num_cpus: logical CPUs of a local cluster (default: the machine's). Actors here ask
            for fractions of it (``num_cpus`` in their options).
        temp_dir: the local cluster's temp root (default: a fresh ``/tmp/trace_gym_ray_*``;
            Ray's socket paths must stay under ~100 characters).
        object_store_memory: bytes of a local cluster's object store (default: Ray's).

    Returns a :class:`RayCluster`; call its ``shutdown()`` when done. When Ray is already
    initialised in this process it is reused as is.
    """
    import ray

    if ray.is_initialized():
        return RayCluster(address, None, False)
    env_vars = {"PYTHONPATH": source_folders_path(), "TOKENIZERS_PARALLELISM": "false"}
    for key in ("OMP_NUM_THREADS", "HF_HOME", "HF_HUB_OFFLINE", "TRACE_GYM_HOME"):
        if key in os.environ:
            env_vars[key] = os.environ[key]
    runtime_env = {"env_vars": env_vars}
    if address is not None:
        ray.init(address=address, namespace=NAMESPACE, runtime_env=runtime_env, log_to_driver=False,
                 logging_level=logging.WARNING)
        return RayCluster(address, None, False)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, single-user cluster: auth off
    own_dir = temp_dir is None
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="trace_gym_ray_", dir="/tmp")
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir, namespace=NAMESPACE,
                 runtime_env=runtime_env, object_store_memory=object_store_memory, log_to_driver=False,
                 logging_level=logging.WARNING)
    except BaseException:
        if own_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return RayCluster(None, temp_dir if own_dir else None, True)


def actor_options(role: str, index: int, num_cpus: float = 1.0, num_gpus: float = 0.0,
                  **extra: Any) -> dict[str, Any]:
    """Ray ``.options(...)`` of one of this package's actors (named, no restarts: a dead
    actor's work is recovered by the driver, from env snapshots or by re-issuing requests)."""
    if num_cpus < 0 or num_gpus < 0:
        raise ValueError(f"num_cpus and num_gpus must be >= 0, got {num_cpus!r}, {num_gpus!r}")
    return {"name": f"trace_gym/{role}-{index}.{next(_launches)}.{os.getpid()}", "num_cpus": num_cpus,
            "num_gpus": num_gpus, "max_restarts": 0, "max_task_retries": 0, **extra}
