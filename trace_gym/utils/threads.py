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

**The process budget** (:func:`apply_thread_policy`, called first thing by
:func:`trace_gym.cli.main`, before torch loads): a command sizes its CPU threads to what
the machine can give it. ``$TRACE_GYM_THREADS``, else ``$OMP_NUM_THREADS``, is the user's
word; without either the budget is :func:`thread_budget` of the cores it may run on, the
CPU quota of its cgroup (:func:`cpu_quota`) and the load of the *other* processes
(:func:`others_load`: the CPU time the other processes used over a short sample of
``/proc/stat``; the 1-minute load average less this process's own measured share only where
no sample can be read, because the average lags a finished neighbour by a minute). The budget becomes ``$OMP_NUM_THREADS`` (torch's default count,
inherited by child processes), so every component that takes the default (the trainer's
``cpu_threads=0``, the HF engine's ``num_threads=None``, the predictor) runs on it, while
an explicit per-component key (``trainer.cpu_threads=2``) stays the user's word. Where the
budget is below the cores (the machine is shared) it also sets ``OMP_WAIT_POLICY=PASSIVE``
unless the user set it: idle OpenMP workers sleep instead of spinning, so two processes on
two cores do not burn each other's time; on an idle machine OpenMP's default stays, because
passive waits slow small-op generation there (:func:`wait_policy`;
``benchmarks/bench_threads.py`` measures both settings idle and beside a busy process).
The budget is decided once, at start; a neighbour that comes or goes later is not seen.
An override is read strictly (:func:`thread_override`): a whole number of ASCII digits
(``OMP_NUM_THREADS`` may also be an OpenMP list, ``2,1``: its first level counts, and the
list stays as the user wrote it); anything else (``²``, ``٣``, ``2.5``, ``0``) is ignored with
one warning, and a count past :data:`MAX_THREADS` is capped at it with one warning. A ``/proc``
file that cannot be read or parsed means "unknown" (that figure is left out), never an error.
Under deterministic mode (``deterministic: true``, :mod:`trace_gym.utils.determinism`) the count
follows no load: once the config is read it is replaced by the user's count or a fixed one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, MutableMapping, Sequence

#: The environment variable that sets the process's thread budget (overrides the measurement).
THREADS_ENV = "TRACE_GYM_THREADS"
#: Seconds of ``/proc/stat`` sampled to see what the other processes use right now.
SAMPLE_SECONDS = 0.25
#: Most threads an override may ask for (more is capped, with a warning): far above any
#: machine's cores, far below the counts OpenMP refuses or torch's int32 setter overflows on.
MAX_THREADS = 1024

_log = logging.getLogger(__name__)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask; at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def thread_override(name: str, value: str | None) -> tuple[int | None, str | None]:
    """``(threads, warning)`` of the environment variable ``name`` set to ``value``.

    A whole number >= 1 of ASCII digits is that count (at most :data:`MAX_THREADS`: more is
    capped, with a warning); for ``OMP_NUM_THREADS`` an OpenMP list of them (``2,1``, one
    count per nesting level) gives its first. Anything else (``²``, ``٣``, which
    ``str.isdigit`` accepts and ``int`` refuses or reads; ``2.5``, ``0``, ``-1``) is
    ``(None, warning)``: ignored. Unset or blank is ``(None, None)``.

    >>> thread_override("OMP_NUM_THREADS", "2,1"), thread_override("TRACE_GYM_THREADS", "2,1")[0]
    ((2, None), None)
    """
    text = (value or "").strip()
    if not text:
        return None, None
    levels = [t.strip() for t in text.split(",")] if name == "OMP_NUM_THREADS" else [text]
    if not all(t.isascii() and t.isdecimal() and t.lstrip("0") for t in levels):
        return None, (f"${name}={text[:40]!r} is not a whole number of threads >= 1 written in ASCII digits"
                      f"{' (or an OpenMP list such as 2,1)' if name == 'OMP_NUM_THREADS' else ''}; ignored")
    first = levels[0].lstrip("0")
    if len(first) > 4 or int(first) > MAX_THREADS:  # its length first: int() of 4,301+ digits raises
        return MAX_THREADS, f"${name}={text[:40]!r} asks for more than {MAX_THREADS} threads; capped at {MAX_THREADS}"
    return int(first), None


def default_threads(fallback: int | None = None) -> int:
    """``$OMP_NUM_THREADS`` when it is a valid count (the user's word, e.g. the test suite's 1;
    :func:`thread_override`, silently here), else ``fallback``, else every available core."""
    n, _ = thread_override("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
    if n is not None:
        return n
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


# ------------------------------------------------------------------ the process budget
def parse_cpu_max(text: str) -> float | None:
    """Cores a cgroup v2 ``cpu.max`` line allows (``"150000 100000"`` -> 1.5), ``None`` when
    unlimited (``"max 100000"``) or unreadable."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota: str, period: str) -> float | None:
    """Cores a cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` pair allows (``None``: -1, no quota)."""
    try:
        q, p = int(quota.strip()), int(period.strip())
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _read(path: str) -> str | None:
    """The text of ``path`` (at most 1 MiB), ``None`` when it cannot be read or decoded."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read(1 << 20)
    except (OSError, ValueError):  # missing, unreadable, not ASCII
        return None


def cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """The CPU quota (cores, may be fractional) of this process's cgroup: v2 ``cpu.max``,
    else v1 ``cpu.cfs_quota_us``; ``None`` without one."""
    text = _read(os.path.join(root, "cpu.max"))
    if text is not None:
        return parse_cpu_max(text)
    for folder in ("cpu", "cpu,cpuacct"):
        quota, period = (_read(os.path.join(root, folder, f"cpu.cfs_{k}_us")) for k in ("quota", "period"))
        if quota is not None and period is not None:
            return parse_cfs_quota(quota, period)
    return None


def own_load_share(cpu_seconds: float, age_seconds: float, window: float = 60.0) -> float:
    """This process's part of the ``window``-second load average: its mean CPU rate over its
    life (``cpu_seconds`` / ``age_seconds``, both measured) weighted by how much of the
    average's exponential window its life covers, ``1 - exp(-age / window)``.

    >>> round(own_load_share(60.0, 60.0), 3)  # one busy thread for a minute
    0.632
    """
    if age_seconds <= 0:
        return 0.0
    return cpu_seconds / age_seconds * (1.0 - math.exp(-age_seconds / window))


def busy_cores(before: Sequence[Sequence[int]], after: Sequence[Sequence[int]]) -> float:
    """Cores busy between two samples of ``/proc/stat`` CPU lines (per CPU: the jiffy
    counters user, nice, system, idle, iowait, irq, softirq, steal): the busy share of
    each CPU's elapsed jiffies, summed over the CPUs (idle and iowait are not busy)."""
    total = 0.0
    for a, b in zip(before, after):
        delta = [y - x for x, y in zip(a, b)]
        elapsed = sum(delta[:8])
        if elapsed > 0:
            total += (elapsed - delta[3] - delta[4]) / elapsed
    return total


def others_load(load_1m: float | None, own_share: float, sampled_busy: float | None, own_busy: float) -> float:
    """Cores the other processes keep busy now: the cores busy in a short sample of
    ``/proc/stat`` less this process's own; without a sample, the 1-minute load average
    less this process's share of it. The sample wins where both exist: the average lags by
    a minute both ways, so after a neighbour ends (the previous phase of ``make demo``, the
    previous arm of a benchmark) it still counts it, and a command on an idle box ran on one
    core of two (HF generation 119 vs 180 tokens/s, ``benchmarks/bench_threads.py``). A
    sample misses a neighbour that paused in that instant; with passive OpenMP waits the
    extra thread then costs little. ``None`` for a figure that could not be read."""
    if sampled_busy is not None:
        return max(0.0, sampled_busy - own_busy)
    return max(0.0, load_1m - own_share) if load_1m is not None else 0.0


def thread_budget(cores: int, quota: float | None, others: float) -> int:
    """Threads this process should use: the cores it may run on, capped by the cgroup
    quota (rounded down, at least 1), less the cores the others keep busy (rounded to
    the nearest core), at least 1.

    >>> thread_budget(2, None, 0.1), thread_budget(2, None, 1.9), thread_budget(8, 2.5, 0.0)
    (2, 1, 2)
    """
    cap = max(1, min(cores, math.floor(quota) if quota is not None else cores))
    return max(1, min(cap, cap - int(math.floor(others + 0.5))))


def _counter(text: str) -> bool:
    return text.isascii() and text.isdecimal() and len(text) <= 20


def parse_cpu_lines(text: str | None, cpus: set[int]) -> list[list[int]] | None:
    """The jiffy counters (user .. steal, 8 per CPU) of the ``cpuN`` lines of a ``/proc/stat``
    text for the CPUs in ``cpus``; ``None`` (unknown) when the text is missing, names none of
    them, or a line of theirs is garbled (a counter that is not a whole number)."""
    rows = []
    for line in (text or "").splitlines():
        name, *fields = line.split() or [""]
        if not (name.startswith("cpu") and _counter(name[3:]) and int(name[3:]) in cpus):
            continue
        if not fields or not all(_counter(v) for v in fields[:8]):
            return None
        rows.append([int(v) for v in fields[:8]] + [0] * (8 - len(fields[:8])))
    return rows or None


def parse_process_age(stat: str | None, uptime: str | None, ticks_per_second: float) -> float | None:
    """Seconds a process has run: ``/proc/uptime``'s first field less the start time (field
    22, in clock ticks) of its ``/proc/PID/stat`` text; ``None`` (unknown) when either text is
    missing or garbled."""
    try:
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        up = float(uptime.split()[0])
    except (AttributeError, IndexError, ValueError):  # None, a short or garbled line
        return None
    if not (math.isfinite(up) and start_ticks >= 0 and ticks_per_second > 0):
        return None
    return max(0.0, up - start_ticks / ticks_per_second)


def read_cpu_lines(cpus: set[int], proc: str = "/proc") -> list[list[int]] | None:
    """:func:`parse_cpu_lines` of ``PROC/stat``."""
    return parse_cpu_lines(_read(os.path.join(proc, "stat")), cpus)


def read_process_age(proc: str = "/proc") -> float | None:
    """Seconds since this process started (:func:`parse_process_age` of ``PROC/self/stat``
    and ``PROC/uptime``)."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return None
    return parse_process_age(_read(os.path.join(proc, "self", "stat")), _read(os.path.join(proc, "uptime")), ticks)


@dataclass(frozen=True)
class ThreadDecision:
    """The process budget and what it was decided from (``source``: ``TRACE_GYM_THREADS``,
    ``OMP_NUM_THREADS`` or ``measured``; the measurements are ``None`` for an override)."""

    threads: int
    source: str
    cores: int
    quota: float | None = None
    load_1m: float | None = None
    own_share: float | None = None
    others: float | None = None
    #: an override past :data:`MAX_THREADS`, capped (its variable is then rewritten)
    capped: bool = False

    def describe(self) -> str:
        if self.source != "measured":
            return f"{self.threads} CPU thread(s) (${self.source})"
        quota = "no quota" if self.quota is None else f"quota {self.quota:g}"
        return (f"{self.threads} CPU thread(s) of {self.cores} cores ({quota}; others keep {self.others:.1f} busy: "
                f"load {self.load_1m:.2f}, own share {self.own_share:.2f}; ${THREADS_ENV} overrides)")


def decide_threads(env: Mapping[str, str] | None = None, sample_seconds: float = SAMPLE_SECONDS,
                   proc: str = "/proc") -> ThreadDecision:
    """The process budget: the override of ``env`` (``TRACE_GYM_THREADS``, then
    ``OMP_NUM_THREADS``; :func:`thread_override`, a bad one warned about and passed over),
    else :func:`thread_budget` of what this machine shows now (sampling ``PROC/stat`` for
    ``sample_seconds``; a figure that cannot be read is left out)."""
    env = os.environ if env is None else env
    cores = available_cores()
    for name in (THREADS_ENV, "OMP_NUM_THREADS"):
        n, warning = thread_override(name, env.get(name))
        if warning is not None:
            _log.warning("%s", warning)
        if n is not None:
            return ThreadDecision(n, name, cores, capped=warning is not None)
    quota = cpu_quota()
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(cores))
    own0, before = time.process_time(), read_cpu_lines(cpus, proc)
    time.sleep(sample_seconds)
    own_busy = (time.process_time() - own0) / sample_seconds if sample_seconds > 0 else 0.0
    after = read_cpu_lines(cpus, proc)
    sampled = busy_cores(before, after) if before and after and len(before) == len(after) else None
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    age = read_process_age(proc)
    share = own_load_share(time.process_time(), age) if age is not None else 0.0
    others = others_load(load, share, sampled, own_busy)
    return ThreadDecision(thread_budget(cores, quota, others), "measured", cores, quota, load, share, others)


_DECISION: ThreadDecision | None = None


def process_decision() -> ThreadDecision | None:
    """The budget :func:`apply_thread_policy` decided for this process (``None``: not called;
    a library user's process). Deterministic mode (:mod:`trace_gym.utils.determinism`) reads it to
    tell the user's ``OMP_NUM_THREADS`` from the one the policy wrote."""
    return _DECISION


def wait_policy(threads: int, cores: int) -> str | None:
    """``"PASSIVE"`` (idle OpenMP workers sleep) when the process runs on fewer threads than
    the cores it may use, i.e. it shares the machine; else ``None`` (OpenMP's default, brief
    spinning). Measured with ``benchmarks/bench_threads.py``: on an idle 2-core box passive
    waits cut HF generation on 2 threads from 178 to 106 tokens/s (many small parallel
    regions, each waking sleeping workers), while beside a busy process the gain is all in
    the thread count (1 thread: 109 vs 2 spinning threads: 10 tokens/s).

    >>> wait_policy(1, 2), wait_policy(2, 2)
    ('PASSIVE', None)
    """
    return "PASSIVE" if threads < cores else None


def apply_thread_policy(env: MutableMapping[str, str] | None = None) -> ThreadDecision:
    """Decide the process budget (:func:`decide_threads`) once per process and put it
    where every component finds it: ``OMP_NUM_THREADS`` (unless the user set it), and
    ``OMP_WAIT_POLICY=PASSIVE`` where it shares the machine (:func:`wait_policy`; unless the
    user set it). Call it before torch is
    imported: OpenMP reads both when it loads."""
    global _DECISION
    env = os.environ if env is None else env
    if _DECISION is None or env is not os.environ:
        decision = decide_threads(env)
        policy = wait_policy(decision.threads, decision.cores)
        if policy is not None:
            env.setdefault("OMP_WAIT_POLICY", policy)
        if decision.source != "OMP_NUM_THREADS" or decision.capped:  # the user's valid value (2,1) stays
            env["OMP_NUM_THREADS"] = str(decision.threads)
        if env is not os.environ:
            return decision
        _DECISION = decision
    return _DECISION
