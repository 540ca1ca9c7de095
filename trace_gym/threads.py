"""CPU thread ownership: each component runs its torch ops on its own intra-op thread count.

torch's intra-op (OpenMP) thread count is process-wide, and the components of one
training step want different ones: vLLM's CPU engine wants 1 thread while it serves
(multi-threaded small ops leave OpenMP workers spin-waiting), while the trainer's
forward+backward wants every core. Setting the count once at start-up (what vLLM does)
makes whichever component did not choose it slow: the trainer's update beside a vLLM
engine ran on the engine's one thread (``benchmarks/bench_step.py``, whose
``--plant shared-threads`` puts that back, shows the gap). So each component enters
:func:`torch_threads` with its own count around its work and the previous count comes
back on exit.

:func:`set_threads` calls ``torch._C.set_num_threads``, the setter itself: vLLM's CPU
worker replaces ``torch.set_num_threads`` with a warning no-op once it starts.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask; at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def default_threads(fallback: int | None = None) -> int:
    """``$OMP_NUM_THREADS`` when it is a positive integer (the user's word, e.g. the test
    suite's 1), else ``fallback``, else every available core."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return fallback if fallback is not None else available_cores()


def resolve_threads(threads: int | None, name: str = "threads", fallback: int | None = None) -> int:
    """``threads`` checked (>= 1), or :func:`default_threads` (``fallback``) when it is ``None`` or 0."""
    if threads is None or threads == 0:
        return default_threads(fallback)
    if int(threads) != threads or threads < 0:
        raise ValueError(f"{name} must be a positive integer (0: the default), got {threads!r}")
    return int(threads)


def set_threads(n: int) -> None:
    """Set torch's intra-op thread count to ``n`` (the unpatched setter, see the module docstring)."""
    import torch

    torch._C.set_num_threads(int(n))


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``n`` intra-op threads (``None``: leave the count alone); the
    previous count is restored on exit, also on an exception."""
    if n is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    if old != n:
        set_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != old:
            set_threads(old)
