"""Scale-out on Ray: rollout workers, env pools and a trainer group behind the existing seams.

The only part of trace_gym that imports Ray (lazily: importing this package does not).
See ``docs/distributed.md`` for the design and the measurements.

=====================  ==================================================================
module                 what it holds
=====================  ==================================================================
``transport``          the one seam to actors (Ray handles, or plain objects in process)
``cluster``            start a local cluster / join one; actor naming and options
``env_pool``           the env pool actor; the driver's pool group and batching executor
                       (fault tolerance from env snapshots)
``engines``            the rollout worker actor; the driver's ``RolloutEngine`` over
                       workers (seed-preserving sharding, version checks, re-issue)
``runner``             the agent loop over both (``RayAgentRunner``, ``RayBranchRunner``)
``trainer``            data-parallel policy update (gloo on CPU, NCCL on GPUs) and the
                       trainer group of actors
``launch``             start pools and workers on Ray
``backend``            what ``trace-gym train --ray`` builds
=====================  ==================================================================
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "start_ray": "trace_gym.train.distributed.cluster",
    "ray_available": "trace_gym.train.distributed.cluster",
    "RayCluster": "trace_gym.train.distributed.cluster",
    "EnvPool": "trace_gym.train.distributed.env_pool",
    "EnvPoolGroup": "trace_gym.train.distributed.env_pool",
    "PoolExecutor": "trace_gym.train.distributed.env_pool",
    "RolloutWorker": "trace_gym.train.distributed.engines",
    "EngineGroup": "trace_gym.train.distributed.engines",
    "StaleWeightsError": "trace_gym.train.distributed.engines",
    "RayAgentRunner": "trace_gym.train.distributed.runner",
    "RayBranchRunner": "trace_gym.train.distributed.runner",
    "launch_env_pools": "trace_gym.train.distributed.launch",
    "launch_rollout_workers": "trace_gym.train.distributed.launch",
    "DataParallelTrainer": "trace_gym.train.distributed.trainer",
    "TrainerGroup": "trace_gym.train.distributed.trainer",
    "ray_backend": "trace_gym.train.distributed.backend",
    "RayBackend": "trace_gym.train.distributed.backend",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trace_gym.train.distributed' has no attribute {name!r}")
