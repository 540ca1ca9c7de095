"""Host side of the persistent, isolated Python kernel.

A :class:`Kernel` is one sandboxed interpreter that keeps its variables between
:meth:`Kernel.execute` calls. Kernels are forked by a per-host fork server
(:mod:`environments.math_python.zygote`), which has numpy and sympy imported already:
a kernel is ready in milliseconds. What is enforced, and how (root host):

==========================  ===========================================================
limit                       mechanism
==========================  ===========================================================
wall clock per cell         the host waits ``cell_timeout_s``, then has the zygote
                            SIGKILL the kernel (status ``timeout``)
every process of a kernel   a pid namespace per kernel: killing its pid 1 ends them
                            all, ``setsid`` included; the kernel sees only its own
CPU seconds                 ``RLIMIT_CPU`` (per process, cumulative over the kernel's
                            life): SIGXCPU kills the interpreter (status ``crashed``)
CPU of the whole kernel     its supervisor reads the CPU time of all the kernel's
                            processes together (during and between cells) from a CPU
                            cgroup per kernel, or else sums its process tree from
                            ``/proc``, every 0.25 s; past ``cpu_time_s`` it kills them
                            all (``crashed``/``dead``, ``error_name="CPULimit"``)
memory per process          ``RLIMIT_AS`` (address space): allocations fail with
                            ``MemoryError`` inside the cell (``oom=True``)
memory of the whole kernel  a memory cgroup per kernel (``memory_mb + disk_mb``): all its
                            processes, SysV shared memory, pipes and kernel objects, and
                            its workdir files together; over it the OOM killer takes the
                            largest process of the kernel (the interpreter: ``crashed``,
                            ``error_name="MemoryLimit"``, ``oom=True``)
memfd, user namespaces      a seccomp filter on the model's processes refuses
                            ``memfd_create`` and new namespaces (``PermissionError`` in the
                            cell); the interpreter's root counts as a chroot, so the
                            kernel refuses it user namespaces even without the filter
SysV IPC                    a private IPC namespace per kernel (it ends with the kernel)
                            whose limits hold shared memory to ``disk_mb`` in all
                            (``shmget`` fails in the cell); where it cannot be bounded,
                            the filter refuses SysV IPC
open files / file size      ``RLIMIT_NOFILE`` / ``RLIMIT_FSIZE``; no core dumps
processes (fork bombs)      its own uid makes ``RLIMIT_NPROC`` count only the kernel's
                            processes; ``fork`` then fails inside the cell
output                      captured by the kernel's supervisor, outside the model's
                            process (head + tail kept, the middle counted)
protocol channel            only the supervisor writes host frames; the model's process
                            has no descriptor of the host, and whatever it sends the
                            supervisor is checked (anything else: a crashed cell)
network                     its own network namespace: no interface is up
files                       a read-only root showing only system directories and the
                            interpreter (never the project or task data); the only
                            writable place is a private tmpfs workdir
environment                 a fixed, minimal set of variables
==========================  ===========================================================

Without root (or where namespaces are refused) the uid, pid, network, IPC namespace,
chroot and filesystem lines do not hold; without a writable memory cgroup only the
per-process limit bounds memory; without a CPU cgroup the kernel's CPU is the
supervisor's sum over its process tree (approximate: :mod:`._kernel.cpu`);
:meth:`ForkServer.mechanisms` says which mechanisms the kernels get and
:attr:`Kernel.protections` what each kernel could set up. Not enforced anywhere: CPU
*share* (a kernel may use several cores at once, for ``cpu_time_s`` CPU seconds in all).
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import asdict, dataclass
from typing import Sequence

from environments.math_python.zygote import KERNEL_ENV, UID_BASE, ForkServer, KernelError, wait_readable
from trace_gym.utils.textsafe import clean_text

__all__ = ["KERNEL_ENV", "UID_BASE", "CellResult", "Kernel", "KernelError", "KernelFactory", "KernelLimits",
           "StreamOutput"]


@dataclass(frozen=True)
class KernelLimits:
    """Resource limits of one kernel.

    Attributes:
        cell_timeout_s: wall-clock seconds one cell may run before the kernel is killed.
        cpu_time_s: CPU seconds the kernel may use over its whole life: all its
            processes together, during and between cells (and each process alone).
        memory_mb: address-space limit per process, in MiB; with a memory cgroup the
            whole kernel (every process, shared memory, workdir files) holds at most
            ``memory_mb + disk_mb`` MiB.
        max_open_files: file descriptors per process.
        max_processes: processes + threads of the kernel's uid (enforced only when the
            kernel runs under its own uid, i.e. the host is root).
        output_bytes: bytes kept per stream per cell (3/4 head, 1/4 tail).
        disk_mb: size of the private /tmp (and the largest file), in MiB; also the most
            SysV shared memory the kernel's IPC namespace holds.
        startup_timeout_s: seconds allowed for the process to start and import.
    """

    cell_timeout_s: float = 10.0
    cpu_time_s: int = 120
    memory_mb: int = 1024
    max_open_files: int = 64
    max_processes: int = 32
    output_bytes: int = 8192
    disk_mb: int = 64
    startup_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("cell_timeout_s", "cpu_time_s", "memory_mb", "max_open_files", "max_processes",
                     "output_bytes", "disk_mb", "startup_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"KernelLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.output_bytes < 16:
            raise ValueError(f"KernelLimits.output_bytes must be >= 16, got {self.output_bytes}")


@dataclass(frozen=True)
class StreamOutput:
    """One captured stream: the first and last bytes kept, and how many were dropped between."""

    head: str = ""
    tail: str = ""
    omitted: int = 0

    def text(self, marker: str = "\n[... output truncated: {omitted} bytes omitted ...]\n") -> str:
        if not self.omitted:
            return self.head + self.tail
        return self.head + marker.format(omitted=self.omitted) + self.tail


@dataclass(frozen=True)
class CellResult:
    """What one cell did.

    Attributes:
        status: ``ok``; ``error`` (the cell raised, the kernel lives on); ``timeout``
            (killed at the wall-clock limit); ``crashed`` (the interpreter died, or broke
            the protocol); ``dead`` (the kernel had died *before* this cell, which was
            not run: start a new kernel and run it there).
        stdout, stderr: captured output (capped by the kernel's supervisor).
        error: the formatted traceback, or a sentence on why the kernel died.
        error_name: exception class name (``"MemoryError"``...), ``"Timeout"``, the
            signal name (``"SIGSEGV"``), ``"MemoryLimit"`` (killed at the kernel's
            memory cgroup limit), ``"CPULimit"`` (all the kernel's processes killed at
            ``cpu_time_s`` of CPU together), ``"exit code N"`` or ``"ProtocolViolation"``.
        timed_out: the wall-clock limit was hit.
        oom: the cell raised ``MemoryError`` (the address-space limit) or was killed at
            the kernel's memory limit.
        elapsed: host-measured seconds (timing: never put it in an observation).
        kernel_alive: whether the kernel survived the cell.
        background: output printed between the previous cell's end and this cell's
            start (background threads or processes), ``(stdout, stderr)``.
    """

    status: str
    stdout: StreamOutput = StreamOutput()
    stderr: StreamOutput = StreamOutput()
    error: str | None = None
    error_name: str | None = None
    timed_out: bool = False
    oom: bool = False
    elapsed: float = 0.0
    kernel_alive: bool = True
    background: tuple[StreamOutput, StreamOutput] = (StreamOutput(), StreamOutput())

    def info(self) -> dict:
        """The JSON-friendly summary used in ``info["exec"]``."""
        return {"status": self.status, "timed_out": self.timed_out, "oom": self.oom,
                "elapsed": round(self.elapsed, 6), "error_name": self.error_name,
                "stdout_omitted": self.stdout.omitted, "stderr_omitted": self.stderr.omitted,
                "background_bytes": sum(len(s.head) + len(s.tail) + s.omitted for s in self.background)}


class _ProtocolError(Exception):
    pass


def _read_frame(fd: int, deadline: float, max_bytes: int) -> dict:
    """Read one frame before ``deadline`` (monotonic). Raises TimeoutError/EOFError/_ProtocolError."""

    def read_exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not wait_readable(fd, left):
                raise TimeoutError
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    (n,) = struct.unpack(">I", read_exact(4))
    if n > max_bytes:
        raise _ProtocolError(f"kernel sent a {n}-byte frame (limit {max_bytes})")
    try:
        reply = json.loads(read_exact(n).decode())
    except (TimeoutError, EOFError):
        raise
    except Exception as exc:  # noqa: BLE001 - undecodable, too deep, ...: never the host's exception
        raise _ProtocolError(f"kernel sent a malformed frame ({type(exc).__name__})") from None
    if not isinstance(reply, dict):
        raise _ProtocolError(f"kernel sent a {type(reply).__name__}, not an object")
    return reply


def _write_frame(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _stream(value: object) -> StreamOutput:
    """A ``[head, tail, omitted]`` triple from the kernel, checked."""
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str) and isinstance(value[1], str)
            and type(value[2]) is int and value[2] >= 0):
        raise _ProtocolError(f"bad stream field {value!r:.100}")
    return StreamOutput(clean_text(value[0]), clean_text(value[1]), value[2])


def _optional_text(value: object, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _ProtocolError(f"bad {name} field {value!r:.100}")
    return None if value is None else clean_text(value)


def parse_result(reply: dict, cell_id: int, elapsed: float) -> CellResult:
    """A kernel's result frame as a :class:`CellResult`; any deviation raises ``_ProtocolError``."""
    if reply.get("op") != "result" or reply.get("id") != cell_id:
        raise _ProtocolError(f"kernel answered out of turn: {reply!r:.200}")
    status = reply.get("status")
    if status == "dead":
        cause = _optional_text(reply.get("crashed"), "crashed") or "unknown cause"
        return CellResult(status="dead", error=cause, error_name=_optional_text(reply.get("error_name"), "error_name"),
                          elapsed=elapsed, kernel_alive=False)
    if status not in ("ok", "error", "crashed"):
        raise _ProtocolError(f"unknown status {status!r:.50}")
    background = reply.get("background")
    if not (isinstance(background, list) and len(background) == 2):
        raise _ProtocolError(f"bad background field {background!r:.100}")
    error_name = _optional_text(reply.get("error_name"), "error_name")
    error = _optional_text(reply.get("error"), "error")
    crashed = _optional_text(reply.get("crashed"), "crashed")
    if status == "crashed":
        error = crashed or f"the kernel died ({error_name})"
    return CellResult(status=status, stdout=_stream(reply.get("stdout")), stderr=_stream(reply.get("stderr")),
                      error=error, error_name=error_name, oom=error_name in ("MemoryError", "MemoryLimit"),
                      elapsed=elapsed, kernel_alive=status != "crashed",
                      background=(_stream(background[0]), _stream(background[1])))


class Kernel:
    """One sandboxed interpreter; variables persist across :meth:`execute` calls.

    The constructor asks the fork server for a new kernel (milliseconds once the
    server runs); :meth:`start` sends the seed; :meth:`execute` waits for readiness
    when it must. A kernel that timed out or crashed stays dead: make a new one.

    Args:
        limits: resource limits.
        isolate: use namespaces and a private uid where the host allows it.
        preload: modules imported before the first cell (the fork server's).
        server: the :class:`ForkServer` to fork from; default: the process-wide one
            for ``(isolate, preload)``.
        seed: seed the kernel as it is forked (then :meth:`start` is not called; this
            saves a round trip).
    """

    def __init__(self, limits: KernelLimits | None = None, *, isolate: bool = True,
                 preload: Sequence[str] = ("numpy", "sympy"), server: ForkServer | None = None,
                 seed: int | None = None):
        self.limits = limits or KernelLimits()
        self.server = server or ForkServer.shared(isolate=isolate, preload=preload)
        self.protections: dict = {}
        self.uid: int | None = None
        self.workdir: str | None = None
        self._hello: dict | None = None
        self._started = seed is not None
        self._start_sent = False
        self._alive = True
        self._dead: tuple[str, str] | None = None  # (why, name) learnt before a cell ran
        self._next_id = 0
        config = {k: v for k, v in asdict(self.limits).items() if k not in ("cell_timeout_s", "startup_timeout_s")}
        config["seed"] = None if seed is None else int(seed)
        self._pid, self._req_w, self._resp_r = self.server.fork(config)
        self._launched = time.monotonic()
        self._owner = os.getpid()  # a forked copy of the host must not kill this kernel

    # -- lifecycle -------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int:
        """The host pid of the kernel's supervisor (pid 1 of its namespace)."""
        return self._pid

    def start(self, seed: int) -> None:
        """Seed ``random`` and numpy's global RNG; queued until the kernel is ready."""
        if self._started:
            raise RuntimeError("Kernel.start called twice")
        self._started = self._start_sent = True
        try:
            _write_frame(self._req_w, {"op": "start", "seed": int(seed)})
        except OSError as exc:  # died already: the next execute says so and a new kernel runs the cell
            self._dead = (f"the kernel process was gone before its first cell ({exc.strerror})", "BrokenPipe")

    def wait_ready(self) -> dict:
        """Block until the kernel said hello and acknowledged ``start``; returns the hello."""
        if self._hello is not None:
            return self._hello
        deadline = self._launched + self.limits.startup_timeout_s
        try:
            hello = _read_frame(self._resp_r, deadline, 1 << 20)
            if hello.get("op") != "hello" or "error" in hello:
                raise KernelError(f"kernel failed to start: {hello.get('error', hello)!r:.500}")
            self.protections = dict(hello.get("protections") or {})
            self.uid = hello.get("uid") if hello.get("own_uid") else None
            self.workdir = hello.get("workdir")
            if self._start_sent and self._dead is None:
                ack = _read_frame(self._resp_r, deadline, 1 << 20)
                if ack.get("op") != "started":
                    raise KernelError(f"kernel answered {ack!r:.200} to start")
        except (TimeoutError, EOFError, _ProtocolError, OSError) as exc:
            self.close()
            raise KernelError(f"kernel did not start ({type(exc).__name__}: {exc})") from exc
        except KernelError:
            self.close()
            raise
        self._hello = hello
        return hello

    def execute(self, code: str, timeout: float | None = None) -> CellResult:
        """Run one cell; ``timeout`` overrides ``limits.cell_timeout_s`` for this call.

        Never raises on what the kernel does: a kernel that was already dead answers
        ``status="dead"`` (the cell did not run), a kernel that dies or misbehaves
        during the cell answers ``crashed``.
        """
        if not self._alive:
            raise RuntimeError("this kernel is dead; start a new one")
        if not self._started:
            raise RuntimeError("call Kernel.start(seed) before execute()")
        self.wait_ready()
        if self._dead is not None:
            self.close()
            return CellResult(status="dead", error=self._dead[0], error_name=self._dead[1], kernel_alive=False)
        self._next_id += 1
        limit = self.limits.cell_timeout_s if timeout is None else timeout
        t0 = time.monotonic()
        running = False  # the supervisor said the cell started
        try:
            _write_frame(self._req_w, {"op": "exec", "id": self._next_id, "code": code})
            reply = _read_frame(self._resp_r, t0 + limit, 32 * self.limits.output_bytes + (1 << 20))
            if reply == {"op": "running", "id": self._next_id}:
                running = True
                reply = _read_frame(self._resp_r, t0 + limit, 32 * self.limits.output_bytes + (1 << 20))
            result = parse_result(reply, self._next_id, time.monotonic() - t0)
        except TimeoutError:
            self.close()
            return CellResult(status="timeout", error=f"cell timed out after {limit:g} s", error_name="Timeout",
                              timed_out=True, elapsed=time.monotonic() - t0, kernel_alive=False)
        except (EOFError, OSError, _ProtocolError) as exc:
            self.close()
            if not running and isinstance(exc, (EOFError, BrokenPipeError)):  # gone before the cell started
                return CellResult(status="dead", error="the kernel process was gone before this cell",
                                  error_name="EOF", elapsed=time.monotonic() - t0, kernel_alive=False)
            why = ("the kernel process ended unexpectedly" if isinstance(exc, (EOFError, OSError))
                   else f"the kernel broke the protocol ({exc})")
            return CellResult(status="crashed", error=why, error_name=type(exc).__name__,
                              elapsed=time.monotonic() - t0, kernel_alive=False)
        if not result.kernel_alive:
            self.close()
        return result

    def close(self, *, kill: bool = True) -> None:
        """Kill the kernel and every process it started; idempotent and cheap (one
        request to the fork server; the host never forks). With ``kill=False`` only the
        pipes are closed: the kernel's supervisor sees that and ends the kernel itself."""
        if not self._alive:
            return
        self._alive = False
        for fd in (self._req_w, self._resp_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if kill and os.getpid() == self._owner:
            self.server.kill(self._pid)

    def __del__(self) -> None:
        try:  # never a request from a finalizer: it may run while the server's lock is held
            self.close(kill=False)
        except Exception:
            pass


class KernelFactory:
    """Makes seeded kernels from the fork server.

    Args:
        limits, isolate, preload: passed to every :class:`Kernel`.
        prestart: start the fork server in the background now, so that the first
            kernel does not wait for its imports.
        server: the fork server; default: the process-wide one for ``(isolate, preload)``.
    """

    def __init__(self, limits: KernelLimits | None = None, *, isolate: bool = True,
                 preload: Sequence[str] = ("numpy", "sympy"), prestart: bool = True,
                 server: ForkServer | None = None):
        self.limits = limits or KernelLimits()
        self.isolate, self.preload, self.prestart = isolate, tuple(preload), prestart
        self.server = server or ForkServer.shared(isolate=isolate, preload=self.preload)
        if prestart:
            self.server.start_background()

    def new_kernel(self, seed: int) -> Kernel:
        """A kernel seeded with ``seed``, being set up (raises :class:`KernelError` if none
        can be forked); it answers once ready."""
        return Kernel(self.limits, server=self.server, seed=seed)

    def close(self) -> None:
        """Nothing to release: the fork server is shared by the host process."""
