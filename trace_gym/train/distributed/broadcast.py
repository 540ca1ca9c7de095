"""Weight sync by collective broadcast: trainer rank 0 -> every rollout worker, across nodes.

The object store path (:meth:`EngineGroup.update_weights_ref
<trace_gym.train.distributed.engines.EngineGroup.update_weights_ref>`) copies the weights into
each node's store and from there into each worker: right on CPU and on one GPU node. Across
GPU nodes the weights should go GPU to GPU: trainer rank 0 and the rollout workers form one
extra process group of their own (a ``TCPStore`` rendezvous and a stand-alone NCCL or gloo
group, outside the trainer's ``torch.distributed`` world), and rank 0 broadcasts every
parameter, one at a time, into buffers on each worker's device. The workers then load them
with ``engine.update_weights`` and report the version, as on the other path.

:class:`BroadcastSync` sets the group up once and rebuilds it when the set of rollout
workers changed (a dead worker would stall a collective). With ``backend="gloo"`` the same
code runs on CPU, which is how it is tested here; NCCL needs CUDA tensors and a GPU build.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Iterable, Iterator

_TIMEOUT = datetime.timedelta(seconds=600)


def open_group(host: str, port: int, rank: int, world_size: int, backend: str = "nccl") -> Any:
    """A stand-alone process group (not the default one) of ``world_size`` processes."""
    import torch.distributed as dist

    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=_TIMEOUT)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, _TIMEOUT)
    if not hasattr(dist, "ProcessGroupNCCL"):
        raise RuntimeError("backend 'nccl' needs a CUDA build of torch; use 'gloo' on CPU")
    return dist.ProcessGroupNCCL(store, rank, world_size)


def weight_spec(named_tensors: Iterable[tuple[str, Any]]) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype name)`` per tensor: what receivers allocate."""
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named_tensors]


def send(group: Any, named_tensors: Iterable[tuple[str, Any]], device: Any) -> int:
    """Broadcast every tensor from this process (rank 0 of ``group``); returns the bytes sent."""
    sent = 0
    for _, tensor in named_tensors:
        t = tensor.detach().to(device).contiguous()
        group.broadcast(t, 0).wait()
        sent += t.numel() * t.element_size()
    return sent


def receive(group: Any, spec: list[tuple[str, tuple[int, ...], str]], device: Any) -> Iterator[tuple[str, Any]]:
    """The tensors rank 0 broadcasts, in ``spec`` order (lazily: one buffer alive at a time
    when the consumer copies as it goes, as ``update_weights`` does)."""
    import torch

    for name, shape, dtype in spec:
        buf = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        group.broadcast(buf, 0).wait()
        yield name, buf


class BroadcastSync:
    """Trainer rank 0 broadcasting to the rollout workers of an engine group (driver side).

    Args:
        trainer: a :class:`~trace_gym.train.distributed.trainer.TrainerGroup`.
        engine: an :class:`~trace_gym.train.distributed.engines.EngineGroup` on Ray.
        backend: ``"nccl"`` (GPUs) or ``"gloo"`` (CPU).
    """

    def __init__(self, trainer: Any, engine: Any, backend: str = "nccl"):
        self.trainer, self.engine, self.backend = trainer, engine, backend
        self._members: tuple | None = None
        self._spec: list | None = None
        self.rebuilds = 0

    def _setup(self) -> None:
        import ray

        live = self.engine.live()
        members = tuple(id(self.engine.workers[w]) for w in live)
        if members == self._members:
            return
        rank0 = self.trainer.ranks[0]
        host, port = ray.get(rank0.address.remote())
        world = 1 + len(live)
        device = "cuda" if self.backend == "nccl" else "cpu"
        refs = [rank0.join_broadcast.remote(host, port, 0, world, self.backend)]
        refs += [self.engine.workers[w].join_broadcast.remote(host, port, i + 1, world, self.backend, device)
                 for i, w in enumerate(live)]
        ray.get(refs)
        self._spec = ray.get(rank0.weight_spec.remote())
        self._members = members
        self.rebuilds += 1

    def __call__(self, version: int) -> float:
        """Broadcast the trainer's weights as ``version``; returns the seconds it took."""
        import ray

        t0 = time.perf_counter()
        self.engine.revive(sync=False)  # replacements of dead workers get this very broadcast
        self._setup()
        senders = [a.broadcast_weights.remote() for a in self.trainer.ranks]
        live = self.engine.live()
        got = ray.get([self.engine.workers[w].receive_broadcast.remote(self._spec, int(version)) for w in live])
        ray.get(senders)
        for w, v in zip(live, got):
            if v != int(version):
                raise RuntimeError(f"weight broadcast failed: rollout worker {w} reports version {v}, expected {version}")
        self.engine.set_version(int(version))
        return time.perf_counter() - t0
