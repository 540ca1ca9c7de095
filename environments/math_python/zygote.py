"""Host side of the kernel fork server (the zygote).

One zygote process per host process and preload set (:meth:`ForkServer.shared`). It
starts once (~1 s: interpreter, sandbox view, numpy and sympy), then forks each kernel
in a few milliseconds: a new kernel costs a request on a socket, not an interpreter
start. Closing a kernel is one more request (the zygote SIGKILLs the kernel's pid 1,
which takes every process of the kernel with it); the host never forks itself, so the
cost does not grow with the host's size.

If the zygote dies, its kernels live on (a kernel ends when the host closes its pipes,
or dies), and the next request starts a new zygote transparently. A forked copy of the
host (a DataLoader worker) gets a zygote of its own, and never kills kernels of its
parent.

When a zygote starts it logs one line (logger ``environments.math_python.zygote``, level
DEBUG) naming the sandbox mechanisms it uses; :meth:`ForkServer.mechanisms` returns them.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

#: Mechanisms a :class:`ForkServer` can be told to leave off (``disable``), to test the
#: fallbacks of a machine without them: the per-kernel memory and CPU cgroups, the executor's
#: seccomp filter, the limits of a kernel's private IPC namespace, and the stacked root
#: that counts as a chroot (no user namespaces). The sandbox's own package (stdlib only).
from environments.math_python._kernel import MECHANISMS


def wait_readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable (data, end of file or an error) within ``timeout`` seconds.

    ``poll``, not ``select``: a process that holds many kernels has descriptors above
    ``FD_SETSIZE`` (1024), which ``select`` refuses ("filedescriptor out of range").
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(max(timeout, 0.0) * 1000.0))


DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernel_driver.py")

logger = logging.getLogger(__name__)

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

#: Top-level packages of this project: the sandbox hides wherever they live.
PROJECT_PACKAGES = ("environments", "trace_gym", "baselines", "evaluators", "retrieval_index", "benchmarks")


class KernelError(RuntimeError):
    """A kernel or the zygote could not be started (an infrastructure error, not a cell's fault)."""


def hidden_paths() -> list[str]:
    """What the sandbox must never show: the project's checkout and its installed packages."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = {os.path.realpath(here)}
    import importlib.util

    for name in PROJECT_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            paths.add(os.path.realpath(loc))
    return sorted(paths)


def _remove_cgroups(path: str) -> None:
    """Remove a zygote's cgroup directory and its kernels' (best effort: a kernel that
    still runs keeps its own, and so the zygote's)."""
    try:
        names = [n for n in os.listdir(path) if n.startswith("k") and os.path.isdir(os.path.join(path, n))]
    except OSError:
        return
    for name in [*names, None]:
        try:
            os.rmdir(path if name is None else os.path.join(path, name))
        except OSError:
            pass


class ForkServer:
    """A zygote process that forks sandboxed kernels; thread-safe.

    Args:
        isolate: sandbox the kernels (namespaces, own uid) where the host allows it.
        preload: modules the zygote imports, so every kernel starts with them.
        warmup: trusted Python source run once in the zygote after ``preload``; its
            globals are every kernel's initial namespace (the grader's functions).
        hide: more paths the kernels must not see (task data, caches), besides the
            project's own (:func:`hidden_paths`); only paths inside the directories the
            sandbox exposes need it, the rest is not there anyway.
        startup_timeout_s: seconds the zygote may take to start.
        disable: names from :data:`MECHANISMS` to leave off (tests of the fallbacks; a
            machine where one misbehaves). Never needed for safety: each is used only
            where it works.
    """

    _registry: dict[tuple, "ForkServer"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, *, isolate: bool = True, preload: Sequence[str] = ("numpy", "sympy"),
                 warmup: str | None = None, hide: Sequence[str] = (), startup_timeout_s: float = 120.0,
                 disable: Sequence[str] = ()):
        unknown = sorted(set(disable) - set(MECHANISMS))
        if unknown:
            raise ValueError(f"ForkServer(disable=...) takes names from {MECHANISMS}, got {unknown}")
        self.isolate, self.preload, self.warmup = bool(isolate), tuple(preload), warmup
        self.hide = tuple(os.path.realpath(p) for p in hide)
        self.startup_timeout_s = startup_timeout_s
        self.disable = tuple(sorted(set(disable)))
        self.protections: dict = {}
        self._mechanisms: dict = {}
        self._cgroup_dirs: list[str] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()
        self._starter: threading.Thread | None = None
        self.starts = 0  # how many zygote processes this server has started

    @classmethod
    def shared(cls, *, isolate: bool = True, preload: Sequence[str] = ("numpy", "sympy"),
               warmup: str | None = None) -> "ForkServer":
        """The process-wide fork server for this configuration (a new one after ``fork``)."""
        key = (bool(isolate), tuple(preload), warmup, os.getpid())
        with cls._registry_lock:
            server = cls._registry.get(key)
            if server is None:
                cls._registry = {k: v for k, v in cls._registry.items() if k[-1] == os.getpid()}
                server = cls._registry[key] = cls(isolate=isolate, preload=preload, warmup=warmup)
            return server

    # -- lifecycle -------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The zygote's pid (``None`` before it started)."""
        return self._proc.pid if self._proc is not None else None

    def mechanisms(self) -> dict[str, str]:
        """Which sandbox mechanisms this server's kernels get (name -> ``active: ...`` or
        ``NOT active (why)``), starting the zygote if needed; raises :class:`KernelError`.
        Each kernel's own outcome is in :attr:`Kernel.protections`."""
        with self._lock:
            self._ensure_started()
            return dict(self._mechanisms)

    def start_background(self) -> None:
        """Start the zygote in a background thread (no-op when it runs or is starting)."""
        with self._lock:
            if self._sock is not None or (self._starter is not None and self._starter.is_alive()):
                return
            self._starter = threading.Thread(target=self._background_start, daemon=True, name="zygote-start")
            self._starter.start()

    def _background_start(self) -> None:
        try:
            with self._lock:
                self._ensure_started()
        except KernelError:
            pass  # the next request starts it again, and reports the error if it persists

    def _ensure_started(self) -> socket.socket:
        """The live socket to the zygote, starting one if needed (call with the lock held)."""
        if self._owner != os.getpid():  # a forked copy of the host: never touch the parent's
            self._sock, self._proc, self._owner = None, None, os.getpid()
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._discard()
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:
            raise KernelError(f"could not start the kernel zygote: {exc}") from exc
        config = {"isolate": self.isolate, "uid_base": UID_BASE, "preload": list(self.preload),
                  "warmup": self.warmup, "env": KERNEL_ENV, "hide": sorted({*hidden_paths(), *self.hide}),
                  "disable": list(self.disable)}
        try:
            parent.send(json.dumps(config).encode())  # queued until the zygote reads it
            proc = subprocess.Popen(
                [sys.executable, "-I", DRIVER, str(child.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(child.fileno(),), start_new_session=True, env=dict(KERNEL_ENV), close_fds=True,
            )
        except OSError as exc:
            parent.close()
            raise KernelError(f"could not start the kernel zygote: {exc}") from exc
        finally:
            child.close()
        self.starts += 1
        try:
            hello = self._recv(parent, time.monotonic() + self.startup_timeout_s)
        except (TimeoutError, EOFError, ValueError, OSError) as exc:
            proc.kill()
            proc.wait()
            stderr = proc.stderr.read()[-2000:].decode(errors="replace")
            proc.stderr.close()
            parent.close()
            raise KernelError(f"the kernel zygote did not start ({type(exc).__name__}: {exc}); stderr: {stderr!r}") from exc
        proc.stderr.close()
        if "error" in hello:
            proc.kill()
            proc.wait()
            parent.close()
            raise KernelError(f"the kernel zygote failed to start: {hello['error']} "
                              f"(protections {hello.get('protections')})")
        self.protections = hello.get("protections", {})
        self._mechanisms = dict(hello.get("mechanisms") or {})
        self._cgroup_dirs = [d for d in hello.get("cgroup_dirs") or () if isinstance(d, str)]
        logger.debug("kernel sandbox (zygote pid %d): %s", proc.pid,
                     "; ".join(f"{name}: {what}" for name, what in self._mechanisms.items()))
        self._sock, self._proc = parent, proc
        return parent

    def _discard(self, grace_s: float = 0.0) -> None:
        """Drop the zygote; with ``grace_s`` it may first end its kernels and remove their
        cgroups itself (it does so when its socket closes), else it is killed at once."""
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None:
            if self._proc.poll() is None and grace_s > 0:
                try:
                    self._proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
        for path in self._cgroup_dirs:  # what a killed zygote left: empty cgroups of ended kernels
            _remove_cgroups(path)
        self._sock = self._proc = None
        self._cgroup_dirs = []

    def close(self) -> None:
        """End the zygote and, with it, every kernel it forked."""
        with self._lock:
            if self._owner == os.getpid():
                self._discard(grace_s=2.0)

    # -- requests ----------------------------------------------------------------------
    @staticmethod
    def _recv(sock: socket.socket, deadline: float) -> dict:
        left = deadline - time.monotonic()
        if left <= 0 or not wait_readable(sock.fileno(), left):
            raise TimeoutError("no answer from the kernel zygote")
        data = sock.recv(1 << 20)
        if not data:
            raise EOFError("the kernel zygote closed its socket")
        reply = json.loads(data.decode())
        if not isinstance(reply, dict):
            raise ValueError(f"the kernel zygote answered {reply!r:.100}")
        return reply

    def _request(self, msg: dict, fds: Sequence[int] = (), *, restart: bool) -> dict:
        """One request and its answer; with ``restart`` a dead zygote is replaced once."""
        for attempt in (0, 1):
            with self._lock:
                if not restart and (self._sock is None or self._owner != os.getpid() or self._proc.poll() is not None):
                    return {"op": "none"}  # nothing to ask, and no reason to start a zygote for it
                sock = self._ensure_started()
                try:
                    socket.send_fds(sock, [json.dumps(msg).encode()], list(fds))
                    return self._recv(sock, time.monotonic() + 30.0)
                except (OSError, EOFError, TimeoutError, ValueError) as exc:
                    self._discard()
                    if not restart or attempt:
                        raise KernelError(f"the kernel zygote failed on {msg['op']!r}: {exc}") from exc
        raise AssertionError("unreachable")

    def fork(self, limits: dict[str, Any]) -> tuple[int, int, int]:
        """A new kernel: ``(pid, request fd to write, response fd to read)``."""
        try:
            req_r, req_w = os.pipe()
        except OSError as exc:  # out of descriptors: the host's fault, never the model's
            raise KernelError(f"no pipe for a new kernel: {exc}") from exc
        try:
            resp_r, resp_w = os.pipe()
        except OSError as exc:
            os.close(req_r)
            os.close(req_w)
            raise KernelError(f"no pipe for a new kernel: {exc}") from exc
        try:
            reply = self._request({"op": "fork", "limits": limits}, (req_r, resp_w), restart=True)
        except BaseException:
            for fd in (req_w, resp_r):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(resp_w)
        if reply.get("op") != "forked" or not isinstance(reply.get("pid"), int):
            os.close(req_w)
            os.close(resp_r)
            raise KernelError(f"the kernel zygote could not fork a kernel: {reply.get('error', reply)!r:.300}")
        return reply["pid"], req_w, resp_r

    def kill(self, pid: int) -> None:
        """SIGKILL kernel ``pid`` and everything it started (no-op if the zygote is gone)."""
        try:
            self._request({"op": "kill", "pid": int(pid)}, restart=False)
        except KernelError:
            pass  # the zygote died: its kernels died with it
