"""Rollout workers (actors holding an engine) and the driver's engine over them.

:class:`RolloutWorker` is the actor body: one :class:`~trace_gym.engines.RolloutEngine`
(HF or vLLM, built with :func:`~trace_gym.engines.make_engine`), plus a weights version
check on every call. :class:`EngineGroup` is a :class:`~trace_gym.engines.RolloutEngine`
on the driver, so the agent loop uses it as it uses a local engine:

- **Sharding that keeps the seeds.** Both engines seed completion ``j`` of prefix ``i``
  from ``(sampling.seed, i, j)``. A call is split across workers by sending every worker
  the *whole* prefix list with ``n[i] = 0`` (and a one-token placeholder prefix) for the
  prefixes it does not serve: each completion is drawn from the same seed as in one
  engine, whatever the split. One call per worker per ``generate``.
- **Sticky routing.** A prefix goes to the worker that served the longest earlier prefix
  of it (the agent loop's next turn extends the last one), so a worker's prefix KV cache
  keeps serving its episodes; a worker past 1.25x its fair share of the call's rows gets
  no more, and prefixes without a known owner go to the least loaded worker.
- **Versions.** Every ``generate`` and ``score`` call carries the version the driver
  expects; a worker that holds another one raises :class:`StaleWeightsError` instead of
  answering.
- **Weight sync through the object store.** ``update_weights`` packs the tensors once
  (numpy arrays, zero-copy readable by every worker on a node), puts them in the store
  and has every worker load them; replacements of dead workers get the latest weights
  before they serve.
- **Dead workers.** A worker that dies during a call (``ray.kill``, a crash) is dropped,
  and its share of the call is re-issued to the live workers with the same indices (so
  the same seeds). The count of re-issued completions is kept in
  :attr:`EngineGroup.reissued_completions` (the runner books it in the step's ledger).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from collections import OrderedDict
from concurrent.futures import wait
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from trace_gym.types import Completion, SamplingParams

_log = logging.getLogger(__name__)


class StaleWeightsError(RuntimeError):
    """A rollout worker was asked to serve a weights version it does not hold."""


# ---------------------------------------------------------------------- weights in the object store
def pack_weights(named_tensors: Iterable[tuple[str, Any]]) -> dict[str, tuple[str, np.ndarray]]:
    """``name -> (dtype name, numpy array)`` on CPU; bfloat16 travels as its int16 bits.

    Numpy arrays are what Ray's object store hands to readers without a copy.
    """
    import torch

    out = {}
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            out[name] = ("bfloat16", t.view(torch.int16).numpy())
        else:
            out[name] = (str(t.dtype).removeprefix("torch."), t.numpy())
    return out


def unpack_weights(packed: dict[str, tuple[str, np.ndarray]]) -> Iterator[tuple[str, Any]]:
    """The tensors of :func:`pack_weights` (views of the arrays where possible)."""
    import torch

    for name, (dtype, array) in packed.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only store buffers; the engine copies them
            t = torch.from_numpy(array)
        yield name, (t.view(torch.bfloat16) if dtype == "bfloat16" else t)


# ---------------------------------------------------------------------- the actor
class RolloutWorker:
    """Actor body: one rollout engine and its weights version.

    Args:
        kind: engine kind (``"hf"``, ``"vllm"``, ``"auto"``).
        model_path: model name or local folder.
        engine_kwargs: keyword arguments of the engine.
        latency_seconds: extra seconds slept inside each ``generate`` before the engine
            runs (fault drills and scheduling tests that need a call to be in flight).
        num_threads: ``torch.set_num_threads`` in this process, if given.
    """

    def __init__(self, kind: str, model_path: str, engine_kwargs: dict | None = None, *,
                 latency_seconds: float = 0.0, num_threads: int | None = None):
        if latency_seconds < 0:
            raise ValueError(f"latency_seconds must be >= 0, got {latency_seconds!r}")
        if num_threads:
            import torch

            torch.set_num_threads(int(num_threads))
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # progress bars stay on the driver
        except ImportError:
            pass
        from trace_gym.engines import make_engine

        self.engine = make_engine(kind, model_path, **(engine_kwargs or {}))
        self.latency_seconds = float(latency_seconds)
        self._lock = threading.Lock()
        self._busy = False
        self._stats = {"calls": 0, "engine_seconds": 0.0, "completions": 0}

    def _check(self, expected_version: int | None) -> None:
        if expected_version is not None and self.engine.weights_version != expected_version:
            raise StaleWeightsError(f"rollout worker holds weights version {self.engine.weights_version}, "
                                    f"the driver expects version {expected_version}")

    def generate(self, prefixes: Sequence[Sequence[int]], n: Sequence[int], sampling: SamplingParams,
                 expected_version: int | None) -> list[list[Completion]]:
        with self._lock:
            self._check(expected_version)
            self._busy = True
            try:
                if self.latency_seconds:
                    time.sleep(self.latency_seconds)
                t0 = time.perf_counter()
                out = self.engine.generate(prefixes, n, sampling)
                self._stats["engine_seconds"] += time.perf_counter() - t0
                self._stats["calls"] += 1
                self._stats["completions"] += sum(int(k) for k in n)
                return out
            finally:
                self._busy = False

    def score(self, sequences: Sequence[Sequence[int]], start: Any, expected_version: int | None) -> list[list[float]]:
        with self._lock:
            self._check(expected_version)
            return self.engine.score(sequences, start)

    def update_weights(self, packed: dict, version: int) -> int:
        with self._lock:
            self.engine.update_weights(unpack_weights(packed), version)
            return self.engine.weights_version

    def weights_version(self) -> int:
        return self.engine.weights_version

    def join_broadcast(self, host: str, port: int, rank: int, world_size: int, backend: str, device: str) -> int:
        """Join trainer rank 0's weight broadcast group (:mod:`trace_gym.train.distributed.broadcast`)."""
        from trace_gym.train.distributed.broadcast import open_group

        self._broadcast = (open_group(host, port, rank, world_size, backend), device)
        return rank

    def receive_broadcast(self, spec: list, version: int) -> int:
        """Load the weights rank 0 broadcasts now (in ``spec`` order) as ``version``."""
        from trace_gym.train.distributed.broadcast import receive

        group, device = self._broadcast
        with self._lock:
            self.engine.update_weights(receive(group, spec, device), version)
            return self.engine.weights_version

    def reset_prefix_cache(self) -> None:
        with self._lock:
            self.engine.reset_prefix_cache()

    def busy(self) -> bool:
        """Whether a ``generate`` call is running now (answered while it runs: the actor
        takes two calls at once, the engine one)."""
        return self._busy

    def info(self) -> dict[str, Any]:
        """Process, engine, version, and counters: generate calls, completions, and seconds
        inside the engine (the rest of a call's wall time is transport and queueing)."""
        import os

        return {"pid": os.getpid(), "engine": type(self.engine).__name__,
                "weights_version": self.engine.weights_version, **self._stats}


# ---------------------------------------------------------------------- routing
_MULT = np.uint64(0x9E3779B97F4A7C15)


def prefix_hashes(tokens: Sequence[int]) -> np.ndarray:
    """``h[l - 1]`` = a 64-bit hash of ``tokens[:l]`` for every ``l`` (vectorised)."""
    t = np.asarray(tokens, dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(len(t), _MULT, dtype=np.uint64))
        return np.cumsum(t * powers, dtype=np.uint64) ^ (np.arange(1, len(t) + 1, dtype=np.uint64) * np.uint64(31))


class Router:
    """Assigns a call's prefixes to workers: sticky to the worker that served the longest
    earlier prefix, within 1.25x of a fair share of rows; the rest least loaded.

    Args:
        capacity: prefixes remembered (oldest forgotten first).
    """

    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._owner: OrderedDict[int, int] = OrderedDict()  # prefix hash -> worker
        self._lengths: dict[int, int] = {}  # remembered prefix length -> how many
        self._hash_len: dict[int, int] = {}
        self.sticky = 0  # prefixes routed to a remembered owner

    def assign(self, prefixes: Sequence[Sequence[int]], counts: Sequence[int], live: Sequence[int]) -> dict[int, list[int]]:
        """``worker -> prefix indices`` for the prefixes with ``counts[i] > 0``."""
        if not live:
            raise RuntimeError("no live rollout worker to send the request to")
        wanted = [i for i, k in enumerate(counts) if k > 0]
        total = sum(counts[i] for i in wanted)
        cap = math.ceil(1.25 * total / len(live)) + 1
        load = {w: 0 for w in live}
        out: dict[int, list[int]] = {w: [] for w in live}
        lengths = np.array(sorted(self._lengths), dtype=np.int64)
        orphans = []
        for i in wanted:
            owner = self._lookup(prefixes[i], lengths)
            if owner in load and load[owner] + counts[i] <= cap:
                load[owner] += counts[i]
                out[owner].append(i)
                self.sticky += 1
            else:
                orphans.append(i)
        for i in sorted(orphans, key=lambda i: -counts[i]):
            w = min(live, key=lambda w: (load[w], w))
            load[w] += counts[i]
            out[w].append(i)
        for w, idx in out.items():
            idx.sort()
            for i in idx:
                self._remember(prefixes[i], w)
        return {w: idx for w, idx in out.items() if idx}

    def _lookup(self, prefix: Sequence[int], lengths: np.ndarray) -> int | None:
        if not len(lengths):
            return None
        usable = lengths[lengths <= len(prefix)]
        if not len(usable):
            return None
        hashes = prefix_hashes(prefix)[usable - 1]
        for h in hashes[::-1].tolist():  # longest first
            owner = self._owner.get(h)
            if owner is not None:
                return owner
        return None

    def _remember(self, prefix: Sequence[int], worker: int) -> None:
        h = int(prefix_hashes(prefix)[-1])
        if h in self._owner:
            self._owner.move_to_end(h)
        else:
            self._lengths[len(prefix)] = self._lengths.get(len(prefix), 0) + 1
            self._hash_len[h] = len(prefix)
        self._owner[h] = worker
        while len(self._owner) > self.capacity:
            old, _ = self._owner.popitem(last=False)
            n = self._hash_len.pop(old)
            self._lengths[n] -= 1
            if not self._lengths[n]:
                del self._lengths[n]

    def forget_worker(self, worker: int) -> None:
        for h in [h for h, w in self._owner.items() if w == worker]:
            del self._owner[h]
            n = self._hash_len.pop(h)
            self._lengths[n] -= 1
            if not self._lengths[n]:
                del self._lengths[n]


# ---------------------------------------------------------------------- the driver's engine
class EngineGroup:
    """A :class:`~trace_gym.engines.RolloutEngine` over rollout workers (see the module docstring).

    Args:
        workers: actor handles (Ray) or :class:`RolloutWorker`-like objects (local transport).
        transport: how to call them.
        tokenizer: the policy's tokenizer, loaded on the driver (the agent loop renders
            chat templates there).
        spawn: ``index -> new worker`` for :meth:`revive` (``None``: dead workers stay dead).

    Attributes:
        reissued_completions: completions re-requested after a worker died, so far.
        on_dispatch: optional ``(call number, {worker index: future})`` hook, called right
            after a ``generate`` call's shards are sent (fault drills).
        on_close: callables run by :meth:`close` after the workers are stopped (a backend
            hangs the env pools, trainer ranks and cluster it started here).
    """

    def __init__(self, workers: Sequence[Any], transport: Any, tokenizer: Any = None, *,
                 spawn: Callable[[int], Any] | None = None):
        if not workers:
            raise ValueError("an engine group needs at least one rollout worker")
        self.workers = list(workers)
        self.transport = transport
        self.tokenizer = tokenizer
        self.spawn = spawn
        self.alive = [True] * len(self.workers)
        self.router = Router()
        self.reissued_completions = 0
        self.deaths = 0
        self.calls = 0
        self.on_dispatch: Callable[[int, dict[int, Any]], None] | None = None
        self.on_close: list[Callable[[], Any]] = []
        self._version = 0
        self._weights: Any = None  # the latest packed weights' reference, for replacements
        self._score_turn = 0

    # -- protocol
    @property
    def weights_version(self) -> int:
        return self._version

    def live(self) -> list[int]:
        return [w for w, ok in enumerate(self.alive) if ok]

    def _died(self, w: int) -> None:
        if self.alive[w]:
            self.alive[w] = False
            self.deaths += 1
            self.router.forget_worker(w)
            _log.warning("rollout worker %d died; its requests are re-issued", w)

    def _gather(self, futures: dict[int, Any]) -> dict[int, Any]:
        """Wait for every worker's call; the results of those that answered. A worker whose
        actor died is marked dead (and left out); any other error is raised."""
        wait(list(futures.values()))
        out = {}
        for w, future in futures.items():
            try:
                out[w] = future.result()
            except BaseException as exc:  # noqa: BLE001
                if not self.transport.is_dead(exc):
                    raise
                self._died(w)
        return out

    def generate(self, prefixes: Sequence[Sequence[int]], n: Sequence[int] | int,
                 sampling: SamplingParams) -> list[list[Completion]]:
        counts = [int(n)] * len(prefixes) if isinstance(n, int) else [int(k) for k in n]
        if len(counts) != len(prefixes):
            raise ValueError(f"n has {len(counts)} entries but there are {len(prefixes)} prefixes")
        for i, (p, k) in enumerate(zip(prefixes, counts)):
            if k < 0 or not len(p):
                raise ValueError(f"prefixes[{i}] must be non-empty with n[{i}] >= 0, got {len(p)} tokens, n={k}")
        results: list[list[Completion]] = [[] for _ in counts]
        self.calls += 1
        todo = [i for i, k in enumerate(counts) if k > 0]
        first = True
        while todo:
            asked = set(todo)
            sub = [counts[i] if i in asked else 0 for i in range(len(counts))]
            shards = self.router.assign(prefixes, sub, self.live())
            futures = {w: self.transport.call(self.workers[w], "generate", *self._shard(prefixes, counts, idx),
                                              sampling, self._version) for w, idx in shards.items()}
            if first and self.on_dispatch is not None:
                self.on_dispatch(self.calls, futures)
            first = False
            answered = self._gather(futures)
            todo = []
            for w in futures:
                if w not in answered:  # died: its prefixes go round again
                    todo.extend(shards[w])
                    self.reissued_completions += sum(counts[i] for i in shards[w])
                    continue
                out = answered[w]
                for i in shards[w]:
                    if len(out[i]) != counts[i]:
                        raise RuntimeError(f"rollout worker {w} returned {len(out[i])} completions for prefix {i}, "
                                           f"asked {counts[i]}")
                    results[i] = out[i]
            if todo and not self.live():
                raise RuntimeError(f"every rollout worker died ({len(self.workers)} started); "
                                   f"{len(todo)} prefixes were left without an answer")
            todo.sort()
        return results

    @staticmethod
    def _shard(prefixes: Sequence[Sequence[int]], counts: Sequence[int], idx: Sequence[int]) -> tuple[list, list]:
        """The whole call with ``n = 0`` and a one-token placeholder outside ``idx``: each
        kept prefix keeps its index, hence its sampling seeds."""
        keep = set(idx)
        return ([list(p) if i in keep else [int(p[0])] for i, p in enumerate(prefixes)],
                [counts[i] if i in keep else 0 for i in range(len(prefixes))])

    def score(self, sequences: Sequence[Sequence[int]], start: int | Sequence[int] = 1) -> list[list[float]]:
        while True:
            live = self.live()
            if not live:
                raise RuntimeError("every rollout worker died; nothing can score")
            w = live[self._score_turn % len(live)]
            self._score_turn += 1
            try:
                return self.transport.call(self.workers[w], "score", [list(s) for s in sequences], start,
                                           self._version).result()
            except BaseException as exc:  # noqa: BLE001
                if not self.transport.is_dead(exc):
                    raise
                self._died(w)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Pack the tensors once, put them in the object store, load them on every worker."""
        self.update_weights_ref(self.transport.put(pack_weights(named_tensors)), version)

    def update_weights_ref(self, packed_ref: Any, version: int) -> None:
        """Load already packed weights (:func:`pack_weights`, e.g. put in the store by a
        trainer actor) on every live worker, replacing dead ones first; checks that every
        worker reports ``version``."""
        self._weights = packed_ref
        self.revive(sync=False)
        futures = {w: self.transport.call(self.workers[w], "update_weights", packed_ref, int(version))
                   for w in self.live()}
        for w, got in self._gather(futures).items():
            if got != int(version):
                raise RuntimeError(f"weight sync failed: rollout worker {w} reports version {got}, expected {version}")
        if not self.live():
            raise RuntimeError("every rollout worker died during the weight sync")
        self._version = int(version)

    def set_version(self, version: int) -> None:
        """Record that every live worker now holds ``version`` (loaded by another path, e.g.
        :class:`~trace_gym.train.distributed.broadcast.BroadcastSync`); replacements started later
        get no object-store copy of it, so the next sync must reach them."""
        self._version = int(version)
        self._weights = None

    def revive(self, sync: bool = True) -> int:
        """Start a replacement for each dead worker (with a ``spawn``); when ``sync`` and
        weights were pushed before, load them before it serves. Returns how many."""
        if self.spawn is None:
            return 0
        started = []
        for w, ok in enumerate(self.alive):
            if not ok:
                self.workers[w] = self.spawn(w)
                self.alive[w] = True
                started.append(w)
        if sync and started and self._weights is not None:
            for w in started:
                got = self.transport.call(self.workers[w], "update_weights", self._weights, self._version).result()
                if got != self._version:
                    raise RuntimeError(f"replacement rollout worker {w} reports version {got}, expected {self._version}")
        return len(started)

    def reset_prefix_cache(self) -> None:
        for f in [self.transport.call(self.workers[w], "reset_prefix_cache") for w in self.live()]:
            f.result()

    def close(self) -> None:
        """Kill every worker, then run ``on_close``; idempotent."""
        for w in self.live():
            try:
                self.transport.kill(self.workers[w])
            except Exception:  # noqa: BLE001  (already gone)
                pass
            self.alive[w] = False
        closers, self.on_close = self.on_close, []
        for fn in closers:
            fn()
