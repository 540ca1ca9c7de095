"""The data-parallel policy update: one :class:`~trace_gym.train.trainer.PolicyTrainer` per rank.

:class:`DataParallelTrainer` is the in-process trainer on one rank of a
``torch.distributed`` group (gloo on CPU, NCCL on GPUs). A step is the same loss as the
single-process step, split by rows:

1. every rank plans the *whole* batch (the loss weights of the aggregation mode are
   normalised over all the step's tokens, as in one process) and keeps its share of the
   packed rows: rows are dealt to ranks largest first, each to the rank with the fewest
   tokens so far;
2. each rank runs forward/backward on its rows (so its gradient is its rows' part of the
   global loss's gradient);
3. before clipping, the gradients are summed over ranks with one all-reduce (a parameter
   that no rank's rows reached keeps ``grad = None``, as in one process); every rank then
   clips the same global gradient and takes the same AdamW step, so the replicas stay
   equal, to each other bit for bit and to the single-process update up to float32
   summation order (``tests/train/test_distributed_trainer.py`` states the tolerance).

This is DDP's arithmetic with one all-reduce per optimizer step instead of per bucket
during backward. :class:`ShardedTrainer` is the memory-saving variant for 8B+ policies:
FSDP2 (``fully_shard`` per decoder layer and on the root) shards parameters, gradients and
AdamW state over the ranks, reduce-scatters the gradients (FSDP's mean, scaled back to the
sum: the loss weights are already global), and pads each rank's rows to the same count with zero-weight
copies (every forward and backward is a collective). It runs on CPU with gloo too, which
is how it is tested against one process.

:class:`TrainerGroup` runs the ranks as Ray actors and looks like a ``PolicyTrainer`` to
the training loop (``step``, ``sync_weights``, ``save``, ``load_state``, ``score``).
"""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from trace_gym.train.batches import TokenTree
from trace_gym.runs.files import load_state_file
from trace_gym.train.trainer import PolicyTrainer, TrainerConfig
from trace_gym.train.update_stats import UpdateStats


def deal_rows(sizes: Sequence[int], world_size: int) -> list[int]:
    """The rank of each row: largest first, to the rank with the fewest tokens (ties:
    lowest rank). Deterministic, so every rank computes the same deal."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load = [0] * world_size
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return owner


def combine_metrics(per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from every rank's :meth:`PolicyTrainer.step` dict.

    Losses (sums of weighted per-token losses, weights global) add up over ranks;
    per-token means (entropy, clip fractions, mismatches, IS weight) are averaged with the
    ranks' trained-token counts; counts add up; ``grad_norm``, ``lr`` and
    ``policy_tokens`` are the same on every rank (rank 0's); ``seconds`` is the slowest
    rank's.
    """
    if not per_rank:
        raise ValueError("combine_metrics needs at least one rank's metrics")
    first = per_rank[0]
    out = dict(first)
    for key in ("loss", "pg_loss", "kl", "micro_batches", "row_tokens", "trained_tokens"):
        if key in first:
            out[key] = float(sum(m[key] for m in per_rank))
    tokens = [m.get("trained_tokens", 0.0) for m in per_rank]
    total = sum(tokens)
    for key in ("entropy", "clip_fraction_low", "clip_fraction_high", "mismatch_abs", "mismatch_kl",
                "is_weight_mean"):
        if key not in first:
            continue
        pairs = [(m[key], t) for m, t in zip(per_rank, tokens) if t > 0 and not math.isnan(m[key])]
        out[key] = sum(v * t for v, t in pairs) / sum(t for _, t in pairs) if pairs and total else math.nan
    if "seconds" in first:
        out["seconds"] = max(m["seconds"] for m in per_rank)
    return out


class DataParallelTrainer(PolicyTrainer):
    """A :class:`PolicyTrainer` on one rank of an initialised ``torch.distributed`` group.

    Args:
        model_path, config, total_steps, temperature, device, seed: as for
            :class:`PolicyTrainer`; every rank loads the same weights.
    """

    def __init__(self, model_path: str | Path, config: TrainerConfig = TrainerConfig(), **kwargs: Any):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("DataParallelTrainer needs torch.distributed.init_process_group first")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        super().__init__(model_path, config, **kwargs)

    def _rows(self, trees: Sequence[TokenTree]):
        rows, total = super()._rows(trees)  # the whole batch's plan and global loss weights
        owner = deal_rows([len(row) for row in rows], self.world_size)
        return [row for row, r in zip(rows, owner) if r == self.rank], total

    def all_reduce_gradients(self) -> None:
        """Sum every parameter's gradient over the ranks (one flat all-reduce)."""
        import torch
        import torch.distributed as dist

        params = list(self.model.parameters())
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        reached = [p for p, h in zip(params, has.tolist()) if h]
        for p in reached:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not reached:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in reached])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in reached:
            n = p.numel()
            p.grad.copy_(flat[offset: offset + n].view_as(p.grad))
            offset += n

    def _clip(self) -> float:
        self.all_reduce_gradients()
        return super()._clip()

    def gradients(self, trees: Sequence[TokenTree]) -> dict[str, Any]:
        """The global loss gradient (summed over ranks) of one on-policy pass, by name."""
        self.optimizer.zero_grad(set_to_none=True)
        rows, _ = self._rows(trees)
        self._accumulate(rows, None, UpdateStats())
        self.all_reduce_gradients()
        grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.optimizer.zero_grad(set_to_none=True)
        return grads


class ShardedTrainer(DataParallelTrainer):
    """FSDP2: a :class:`DataParallelTrainer` whose parameters, gradients and AdamW state are
    sharded over the ranks (each rank holds ``1 / world_size`` of them).

    Built on CPU, then sharded onto the device (a rank never holds the whole fp32 model on
    its GPU). Weight export, ``save`` and ``score`` are collectives: every rank must call
    them (:class:`TrainerGroup` does). Checkpoints: the full HF weights (rank 0) plus one
    optimizer shard per rank (``trainer-rank{r}-of-{n}.pt``), so a sharded run resumes with
    the same number of ranks.
    """

    def __init__(self, model_path: str | Path, config: TrainerConfig = TrainerConfig(), **kwargs: Any):
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        device = kwargs.pop("device", "auto")
        target = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                              else ("cpu" if device == "auto" else device))
        super().__init__(model_path, config, device="cpu", **kwargs)
        self.device = target
        self.autocast_dtype = self._autocast_dtype(config.dtype)
        mesh = init_device_mesh(target.type, (self.world_size,))
        mp = MixedPrecisionPolicy(param_dtype=self.autocast_dtype, reduce_dtype=torch.float32) \
            if self.autocast_dtype is not None else MixedPrecisionPolicy()
        for model in (self.model, self.reference):
            if model is None:
                continue
            for module in list(model.modules()):
                if type(module).__name__.endswith("DecoderLayer"):
                    fully_shard(module, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
        c = self.config
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=c.lr, betas=tuple(c.adam_betas),
                                           weight_decay=c.weight_decay)
        self._set_lr()
        self._padding: set[int] = set()
        self._padded = {"rows": 0, "tokens": 0, "targets": 0}

    def _rows(self, trees: Sequence[TokenTree]):
        import dataclasses

        import torch

        rows, total = PolicyTrainer._rows(self, trees)
        owner = deal_rows([len(row) for row in rows], self.world_size)
        mine = [row for row, r in zip(rows, owner) if r == self.rank]
        most = max((owner.count(r) for r in range(self.world_size)), default=0)
        padding = []
        if most > len(mine):  # same number of forward/backward passes on every rank
            small = min(rows, key=len)
            zero = torch.zeros_like(small.weights)
            padding = [dataclasses.replace(small, weights=zero, pos=zero.clone(), neg=zero.clone())
                       for _ in range(most - len(mine))]
        self._padding.update(id(row) for row in padding)
        self._padded["rows"] += len(padding)
        self._padded["tokens"] += sum(len(row) for row in padding)
        self._padded["targets"] += sum(len(row.targets) for row in padding)
        return mine + padding, total

    def _accumulate(self, rows, old, stats) -> None:
        import torch

        for row in rows:
            if id(row) not in self._padding:
                super()._accumulate([row], old, stats)
                continue
            logp, _ = self.row_logprobs(row)  # a collective like the others; contributes zero
            if self.reference is not None:
                with torch.no_grad():
                    self.row_logprobs(row, model=self.reference)
            (logp.sum() * 0.0).backward()

    def step(self, trees: Sequence[TokenTree]) -> dict[str, float]:
        self._padding.clear()
        self._padded = {"rows": 0, "tokens": 0, "targets": 0}
        out = super().step(trees)
        out["micro_batches"] -= self._padded["rows"]
        out["row_tokens"] -= self._padded["tokens"]
        out["trained_tokens"] -= self._padded["targets"]
        return out

    def all_reduce_gradients(self) -> None:
        """FSDP2 reduce-scattered the gradients during backward, as a mean over ranks (a
        plain sum needs PREMUL_SUM, which gloo lacks): scale the shards back to the sum."""
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(self.world_size)

    def _clip(self) -> float:
        import torch

        self.all_reduce_gradients()
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if self.config.max_grad_norm:
            torch.nn.utils.clip_grads_with_norm_(params, self.config.max_grad_norm, norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def gradients(self, trees: Sequence[TokenTree]) -> dict[str, Any]:
        self._padding.clear()
        self.optimizer.zero_grad(set_to_none=True)
        rows, _ = self._rows(trees)
        self._accumulate(rows, None, UpdateStats())
        self.all_reduce_gradients()
        grads = {n: _full(p.grad).detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.optimizer.zero_grad(set_to_none=True)
        return grads

    def named_weights(self) -> Iterator[tuple[str, Any]]:
        """Full (unsharded) tensors, gathered parameter by parameter: a collective."""
        for name, p in self.model.named_parameters():
            yield name, _full(p).detach()

    def save(self, folder: str | Path) -> None:
        """Full HF weights from rank 0; each rank's optimizer shard. A collective."""
        import torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)  # every rank writes its shard here, rank 0 or not first
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            self.model.save_pretrained(folder / "policy", state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(folder / "policy")
        torch.save({"optimizer": self.optimizer.state_dict(), "updates": self.updates}, self._shard_file(folder))

    def load_state(self, folder: str | Path) -> None:
        path = self._shard_file(Path(folder))
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: a sharded run resumes from a checkpoint of a sharded "
                                    f"run with {self.world_size} ranks")
        state = load_state_file(path, map_location=self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self._set_lr()

    def _shard_file(self, folder: Path) -> Path:
        return folder / f"trainer-rank{self.rank}-of-{self.world_size}.pt"

    def score(self, sequences: Sequence[Sequence[int]], start: int = 1) -> list[list[float]]:
        """As :meth:`PolicyTrainer.score`; a collective (every rank scores the same sequences)."""
        return super().score(sequences, start)


def _full(t: Any) -> Any:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class TrainerRank:
    """Actor body: joins the process group, then holds one :class:`DataParallelTrainer`."""

    def __init__(self) -> None:
        self.trainer: DataParallelTrainer | None = None

    def address(self) -> tuple[str, int]:
        """This host's address and a free port (asked of rank 0 before anyone joins)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, init_method: str, rank: int, world_size: int, backend: str, model_path: str,
              config: TrainerConfig, kwargs: dict, shard: bool = False) -> int:
        import torch
        import torch.distributed as dist

        if kwargs.get("num_threads"):
            torch.set_num_threads(int(kwargs["num_threads"]))
        kwargs.pop("num_threads", None)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
        self.shard = shard
        self.trainer = (ShardedTrainer if shard else DataParallelTrainer)(model_path, config, **kwargs)
        return self.trainer.rank

    def step(self, trees: list[TokenTree]) -> dict[str, float]:
        return self.trainer.step(trees)

    def gradients(self, trees: list[TokenTree]) -> dict[str, Any]:
        return {k: v.cpu().numpy() for k, v in self.trainer.gradients(trees).items()}

    def packed_weights(self, every_rank: bool = False) -> dict | None:
        """Rank 0's packed full weights; ``None`` on the other ranks unless ``every_rank``
        (to compare replicas). Every rank gathers when sharded."""
        from trace_gym.train.distributed.engines import pack_weights

        if self.trainer.rank != 0 and not self.shard and not every_rank:
            return None
        packed = pack_weights(self.trainer.named_weights())
        return packed if self.trainer.rank == 0 or every_rank else None

    def save(self, folder: str) -> None:
        if self.shard or self.trainer.rank == 0:
            self.trainer.save(folder)

    def join_broadcast(self, host: str, port: int, rank: int, world_size: int, backend: str) -> int:
        """Rank 0 joins the rollout workers' weight broadcast group as its source."""
        from trace_gym.train.distributed.broadcast import open_group

        self._broadcast = open_group(host, port, rank, world_size, backend)
        return rank

    def weight_spec(self) -> list:
        from trace_gym.train.distributed.broadcast import weight_spec

        return weight_spec((n, p) for n, p in self.trainer.model.named_parameters())

    def broadcast_weights(self) -> int:
        """Rank 0 broadcasts every parameter (full tensors: every rank takes part in the
        gathers when sharded); returns the bytes sent (0 on other ranks)."""
        from trace_gym.train.distributed.broadcast import send

        if self.trainer.rank != 0:
            if self.shard:
                for _ in self.trainer.named_weights():
                    pass
            return 0
        return send(self._broadcast, self.trainer.named_weights(), self.trainer.device)

    def load_state(self, folder: str) -> int:
        self.trainer.load_state(folder)
        return self.trainer.updates

    def score(self, sequences: list, start: int) -> list[list[float]] | None:
        if self.trainer.rank != 0 and not self.shard:
            return None
        return self.trainer.score(sequences, start)

    def updates(self) -> int:
        return self.trainer.updates


class TrainerGroup:
    """``world_size`` :class:`TrainerRank` actors on Ray, used like a :class:`PolicyTrainer`.

    Args:
        model_path, config, total_steps, temperature, device, seed: as for
            :class:`PolicyTrainer` (``device="auto"`` picks CUDA when the actor has a GPU).
        world_size: ranks (actors).
        backend: ``"gloo"`` or ``"nccl"`` (default: NCCL when ``num_gpus > 0``, else gloo).
        num_cpus / num_gpus: resources per rank.
        num_threads: torch threads per rank.
        shard: FSDP2 (:class:`ShardedTrainer`) instead of replicas (:class:`DataParallelTrainer`).
        weight_sync: ``"object_store"`` (rank 0's packed weights through Ray's store) or
            ``"broadcast"`` (a collective from rank 0 to the rollout workers:
            :class:`~trace_gym.train.distributed.broadcast.BroadcastSync`, NCCL across GPU nodes).
    """

    def __init__(self, model_path: str | Path, config: TrainerConfig = TrainerConfig(), *, total_steps: int = 1,
                 temperature: float = 1.0, device: str = "auto", seed: int = 0, world_size: int = 2,
                 backend: str | None = None, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 num_threads: int | None = None, shard: bool = False, weight_sync: str = "object_store",
                 timeout: float = 600.0):
        import ray

        from trace_gym.train.distributed.cluster import actor_options

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        backend = backend or ("nccl" if num_gpus > 0 else "gloo")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if weight_sync not in ("object_store", "broadcast"):
            raise ValueError(f"weight_sync must be 'object_store' or 'broadcast', got {weight_sync!r}")
        self.backend, self.weight_sync, self._broadcast = backend, weight_sync, None
        remote = ray.remote(TrainerRank)
        self.ranks = [remote.options(**actor_options("trainer-rank", r, num_cpus, num_gpus)).remote()
                      for r in range(world_size)]
        host, port = ray.get(self.ranks[0].address.remote(), timeout=timeout)
        kwargs = {"total_steps": total_steps, "temperature": temperature, "device": device, "seed": seed,
                  "num_threads": num_threads}
        got = ray.get([a.setup.remote(f"tcp://{host}:{port}", r, world_size, backend, str(model_path), config,
                                      dict(kwargs), shard) for r, a in enumerate(self.ranks)], timeout=timeout)
        if got != list(range(world_size)):
            raise RuntimeError(f"trainer ranks came up as {got}, expected 0..{world_size - 1}")
        self.world_size = world_size
        self._ray = ray

    def step(self, trees: Sequence[TokenTree]) -> dict[str, float]:
        """One data-parallel policy update; returns the combined metrics."""
        t0 = time.perf_counter()
        ref = self._ray.put(list(trees))  # once in the object store, read by every rank
        out = combine_metrics(self._ray.get([a.step.remote(ref) for a in self.ranks]))
        out["seconds"] = time.perf_counter() - t0
        return out

    def gradients(self, trees: Sequence[TokenTree]) -> dict[str, Any]:
        """Rank 0's all-reduced gradient (every rank holds the same), as torch tensors."""
        import torch

        ref = self._ray.put(list(trees))
        per_rank = self._ray.get([a.gradients.remote(ref) for a in self.ranks])
        return {k: torch.from_numpy(v.copy()) for k, v in per_rank[0].items()}

    def packed_weights_ref(self) -> Any:
        """An object-store reference to rank 0's packed weights (not fetched here). Every
        rank is called: when sharded, the gather is a collective."""
        return [a.packed_weights.remote() for a in self.ranks][0]

    def named_weights(self) -> Iterator[tuple[str, Any]]:
        from trace_gym.train.distributed.engines import unpack_weights

        return unpack_weights(self._ray.get(self.packed_weights_ref()))

    def sync_weights(self, engine: Any, version: int) -> float:
        """Push rank 0's weights to ``engine``: to an
        :class:`~trace_gym.train.distributed.engines.EngineGroup` by broadcast or through the object
        store without a stop on the driver (``weight_sync``); to any other engine fetched
        and passed to ``update_weights``. Checks the version; returns seconds."""
        t0 = time.perf_counter()
        if self.weight_sync == "broadcast" and hasattr(engine, "set_version"):
            from trace_gym.train.distributed.broadcast import BroadcastSync

            if self._broadcast is None or self._broadcast.engine is not engine:
                self._broadcast = BroadcastSync(self, engine, self.backend)
            self._broadcast(version)
        elif hasattr(engine, "update_weights_ref"):
            engine.update_weights_ref(self.packed_weights_ref(), version)
        else:
            engine.update_weights(self.named_weights(), version)
        if engine.weights_version != version:
            raise RuntimeError(f"weight sync failed: engine reports version {engine.weights_version}, expected {version}")
        return time.perf_counter() - t0

    def save(self, folder: str | Path) -> None:
        self._ray.get([a.save.remote(str(folder)) for a in self.ranks])

    def load_state(self, folder: str | Path) -> None:
        self._ray.get([a.load_state.remote(str(folder)) for a in self.ranks])

    def score(self, sequences: Sequence[Sequence[int]], start: int = 1) -> list[list[float]]:
        seqs = [list(s) for s in sequences]
        return self._ray.get([a.score.remote(seqs, start) for a in self.ranks])[0]

    @property
    def updates(self) -> int:
        return self._ray.get(self.ranks[0].updates.remote())

    def close(self) -> None:
        for a in self.ranks:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001  (already gone)
                pass
