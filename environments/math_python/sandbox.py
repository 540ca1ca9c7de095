"""Host side of the persistent, isolated Python kernel.

A :class:`Kernel` is one interpreter process (``_kernel_driver.py``) that keeps its
variables between :meth:`Kernel.execute` calls. What is enforced, and how:

==========================  ===========================================================
limit                       mechanism
==========================  ===========================================================
wall clock per cell         the host waits ``cell_timeout_s``, then SIGKILLs the
                            kernel's process group and every process of its uid; the
                            kernel is dead afterwards (status ``timeout``)
CPU seconds                 ``RLIMIT_CPU`` (per process, cumulative over the kernel's
                            life): SIGXCPU kills the kernel (status ``crashed``)
memory                      ``RLIMIT_AS`` (address space): allocations fail with
                            ``MemoryError`` inside the cell (``oom=True``)
open files / file size      ``RLIMIT_NOFILE`` / ``RLIMIT_FSIZE``; no core dumps
processes (fork bombs)      its own uid (root hosts) makes ``RLIMIT_NPROC`` count only
                            the kernel's processes; the wall-clock kill sweeps them all
output                      capped inside the kernel (head + tail kept, the middle
                            counted and dropped), so the host never buffers it
network                     its own network namespace (root hosts): no interface is up
files                       its own uid: nothing outside world-writable places is
                            writable; those (/tmp, /var/tmp, /dev/shm, /run/lock) are
                            private tmpfs mounts in its own mount namespace
environment                 a fixed, minimal set of variables; other processes' are
                            unreadable (different uid)
==========================  ===========================================================

Without root (or where namespaces are refused) the uid, network and filesystem lines
do not hold; :attr:`Kernel.protections` says what the driver could set up. Not
enforced anywhere: CPU *share* (a cell may use a whole core for its time limit),
reading world-readable files, seeing other processes in ``/proc``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernel_driver.py")

#: Kernel uids are ``UID_BASE + pid``: unique among live kernels, never a real user.
UID_BASE = 0x40000000

#: Variables the kernel sees (everything else of the host's environment is dropped).
KERNEL_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",  # str/bytes hashing, hence set iteration order, is reproducible
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass(frozen=True)
class KernelLimits:
    """Resource limits of one kernel.

    Attributes:
        cell_timeout_s: wall-clock seconds one cell may run before the kernel is killed.
        cpu_time_s: CPU seconds each kernel process may use over its whole life.
        memory_mb: address-space limit per process, in MiB.
        max_open_files: file descriptors per process.
        max_processes: processes + threads of the kernel's uid (enforced only when the
            kernel runs under its own uid, i.e. the host is root).
        output_bytes: bytes kept per stream per cell (3/4 head, 1/4 tail).
        disk_mb: size of the private /tmp (and the largest file), in MiB.
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
            (killed at the wall-clock limit); ``crashed`` (the kernel process died:
            segfault, ``os._exit``, CPU limit, a broken protocol).
        stdout, stderr: captured output (capped inside the kernel).
        error: the formatted traceback, or a sentence on why the kernel died.
        error_name: exception class name (``"MemoryError"``...), ``"Timeout"`` or the
            signal name for a dead kernel.
        timed_out: the wall-clock limit was hit.
        oom: a ``MemoryError`` was raised, or the kernel was killed by the OOM killer.
        elapsed: host-measured seconds (timing: never put it in an observation).
        kernel_alive: whether the kernel survived the cell.
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

    def info(self) -> dict:
        """The JSON-friendly summary used in ``info["exec"]``."""
        return {"status": self.status, "timed_out": self.timed_out, "oom": self.oom,
                "elapsed": round(self.elapsed, 6), "error_name": self.error_name,
                "stdout_omitted": self.stdout.omitted, "stderr_omitted": self.stderr.omitted}


class KernelError(RuntimeError):
    """The kernel could not be started (an infrastructure error, not a cell's fault)."""


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
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
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
        return json.loads(read_exact(n).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _ProtocolError(f"kernel sent a malformed frame: {exc}") from exc


def _write_frame(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "unknown"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class Kernel:
    """One sandboxed interpreter process; variables persist across :meth:`execute` calls.

    The constructor only launches the process (numpy/sympy import in the background);
    :meth:`start` sends the seed; :meth:`execute` waits for readiness when it must.
    A kernel that timed out or crashed stays dead: make a new one.

    Args:
        limits: resource limits.
        isolate: use namespaces and a private uid where the host allows it.
        preload: modules imported before the first cell.
    """

    def __init__(self, limits: KernelLimits | None = None, *, isolate: bool = True,
                 preload: tuple[str, ...] = ("numpy", "sympy")):
        self.limits = limits or KernelLimits()
        self._isolate = bool(isolate)
        self.protections: dict = {}
        self.uid: int | None = None
        self.workdir: str | None = None
        self._hello: dict | None = None
        self._startup_stderr = ""
        self._started = False
        self._alive = True
        self._next_id = 0
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        config = {
            "req_fd": req_r, "resp_fd": resp_w, "isolate": bool(isolate), "uid_base": UID_BASE,
            "preload": list(preload), "env": KERNEL_ENV,
            **{k: v for k, v in asdict(self.limits).items() if k not in ("cell_timeout_s", "startup_timeout_s")},
        }
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-s", DRIVER, json.dumps(config)],
                # stderr is read only if the driver dies before its hello (it then redirects fd 2)
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(req_r, resp_w), start_new_session=True, env=dict(KERNEL_ENV), close_fds=True,
            )
        finally:
            os.close(req_r)
            os.close(resp_w)
        self._launched = time.monotonic()
        self._owner = os.getpid()  # a forked copy of the host must not kill this kernel

    # -- lifecycle -------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int:
        return self._proc.pid

    def start(self, seed: int) -> None:
        """Seed ``random`` and numpy's global RNG; queued until the kernel is ready."""
        if self._started:
            raise RuntimeError("Kernel.start called twice")
        _write_frame(self._req_w, {"op": "start", "seed": int(seed)})
        self._started = True

    def wait_ready(self) -> dict:
        """Block until the kernel said hello and acknowledged ``start``; returns the hello."""
        if self._hello is not None:
            return self._hello
        deadline = self._launched + self.limits.startup_timeout_s
        try:
            hello = _read_frame(self._resp_r, deadline, 1 << 20)
            if "error" in hello:
                raise KernelError(f"kernel failed to start: {hello['error']} (protections {hello['protections']})")
            self.protections = hello["protections"]
            self.uid = hello["uid"] if hello.get("own_uid") else None
            self.workdir = hello["workdir"]
            if self._started:
                ack = _read_frame(self._resp_r, deadline, 1 << 20)
                if ack.get("op") != "started":
                    raise KernelError(f"kernel answered {ack!r:.200} to start")
        except (TimeoutError, EOFError, _ProtocolError) as exc:
            self.close()
            raise KernelError(f"kernel did not start ({type(exc).__name__}: {exc}); it exited with "
                              f"{_signal_name(self._proc.returncode)}; stderr: {self._startup_stderr!r}") from exc
        except KernelError:
            self.close()
            raise
        self._proc.stderr.close()
        self._hello = hello
        return hello

    def execute(self, code: str, timeout: float | None = None) -> CellResult:
        """Run one cell; ``timeout`` overrides ``limits.cell_timeout_s`` for this call."""
        if not self._alive:
            raise RuntimeError("this kernel is dead; start a new one")
        if not self._started:
            raise RuntimeError("call Kernel.start(seed) before execute()")
        self.wait_ready()
        self._next_id += 1
        limit = self.limits.cell_timeout_s if timeout is None else timeout
        t0 = time.monotonic()
        try:
            _write_frame(self._req_w, {"op": "exec", "id": self._next_id, "code": code})
            reply = _read_frame(self._resp_r, t0 + limit, 4 * self.limits.output_bytes + (256 << 10))
            if reply.get("op") != "result" or reply.get("id") != self._next_id:
                raise _ProtocolError(f"kernel answered out of turn: {reply!r:.200}")
            elapsed = time.monotonic() - t0
            out, err = (StreamOutput(*reply[k]) for k in ("stdout", "stderr"))
            return CellResult(status=reply["status"], stdout=out, stderr=err, error=reply["error"],
                              error_name=reply["error_name"], oom=reply["error_name"] == "MemoryError",
                              elapsed=elapsed)
        except TimeoutError:
            self.close()
            return CellResult(status="timeout", error=f"cell timed out after {limit:g} s", error_name="Timeout",
                              timed_out=True, elapsed=time.monotonic() - t0, kernel_alive=False)
        except (EOFError, BrokenPipeError, _ProtocolError, KeyError, TypeError, ValueError) as exc:
            elapsed = time.monotonic() - t0
            self.close()
            how = _signal_name(self._proc.returncode)
            if isinstance(exc, (EOFError, BrokenPipeError)):
                error = f"kernel died ({how})"
            else:
                error = f"kernel broke the protocol ({exc}) and was killed"
            return CellResult(status="crashed", error=error, error_name=how,
                              oom=self._proc.returncode == -signal.SIGKILL, elapsed=elapsed, kernel_alive=False)

    def close(self) -> None:
        """Kill the kernel and every process it started; idempotent."""
        if not self._alive:
            return
        self._alive = False
        for fd in (self._req_w, self._resp_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if os.getpid() != self._owner:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if not self._proc.stderr.closed:  # never got ready: keep what the driver said, for errors
            self._startup_stderr = self._proc.stderr.read()[-2000:].decode(errors="replace")
            self._proc.stderr.close()
        uid = self.uid if self.uid is not None else (UID_BASE + self._proc.pid if self._isolate and os.geteuid() == 0 else None)
        if uid is not None:
            _kill_uid(uid)
        if self.workdir and self.workdir != "/tmp/work":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (escapees that left the process group with setsid)."""
    for _ in range(10):  # until kill(-1) finds no live process (a fork bomb may race one sweep)
        try:
            proc = subprocess.run(["kill", "-9", "-1"], user=uid, group=uid, extra_groups=[],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10,
                                  env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.SubprocessError):
            return
        if proc.returncode != 0:  # nothing left to signal
            return


class KernelFactory:
    """Makes seeded kernels, keeping one spare process warm so a new kernel costs no import.

    Args:
        limits, isolate, preload: passed to every :class:`Kernel`.
        prestart: keep a spare kernel launched ahead of need (one idle process).
    """

    def __init__(self, limits: KernelLimits | None = None, *, isolate: bool = True,
                 preload: tuple[str, ...] = ("numpy", "sympy"), prestart: bool = True):
        self.limits = limits or KernelLimits()
        self.isolate, self.preload, self.prestart = isolate, tuple(preload), prestart
        self._spare: Kernel | None = None

    def _launch(self) -> Kernel:
        return Kernel(self.limits, isolate=self.isolate, preload=self.preload)

    def new_kernel(self, seed: int) -> Kernel:
        kernel, self._spare = self._spare, None
        if kernel is None or not kernel.alive:
            kernel = self._launch()
        kernel.start(seed)
        if self.prestart:
            self._spare = self._launch()
        return kernel

    def close(self) -> None:
        if self._spare is not None:
            self._spare.close()
            self._spare = None
