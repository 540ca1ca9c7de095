"""What the training tests share: a local Ray cluster per test module (``cluster``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cluster(request):
    """A local Ray cluster for one test module, shut down after it, with ``RAY_CPUS`` CPUs (a
    module attribute; 4 where unset). Where Ray is missing or no cluster can start here (a
    sandbox without shared memory), the module's tests skip, saying why; a module that sets
    ``RAY_MUST_START = True`` (the GPU checks: a machine with a GPU must run them) fails instead."""
    from trace_gym.train.distributed.cluster import ray_available, start_ray

    must_start = getattr(request.module, "RAY_MUST_START", False)
    ok, why = ray_available()
    if not ok and not must_start:
        pytest.skip(why)
    try:
        handle = start_ray(num_cpus=getattr(request.module, "RAY_CPUS", 4))
    except Exception as exc:  # noqa: BLE001  (no cluster here: say why)
        if must_start:
            raise
        pytest.skip(f"a local Ray cluster cannot start here: {type(exc).__name__}: {exc}")
    yield handle
    handle.shutdown()
