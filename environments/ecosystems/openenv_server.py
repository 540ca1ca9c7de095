"""The OpenEnv servers the adapter starts itself (:mod:`environments.ecosystems.openenv`).

A server runs as its own process group on a free loopback port, is awaited on its
``/health`` route with a deadline, and is terminated when its last adapter instance
closes (or, with ``keep_servers``, at :func:`stop_servers` or interpreter exit).
Instances of one process may share a server up to its session capacity (reference
counted).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Mapping, Sequence

from trace_gym.env.boundary import error_text
from trace_gym.utils.pythonpath import source_folders_path
APP_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
LOOPBACK = "127.0.0.1"
#: how a server's failure to bind a port reads in its log (then it is retried on another)
_PORT_TAKEN = re.compile(r"address already in use|errno 98|errno 48", re.IGNORECASE)

_log = logging.getLogger(__name__)


class OpenEnvError(RuntimeError):
    """An OpenEnv server that cannot be reached, started, or answered; one line."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_command(server_cmd: str | Sequence[str], port: int, host: str = LOOPBACK) -> list[str]:
    """The argv that serves an OpenEnv app on ``host:port``.

    ``"module:attr"`` is ``python -m uvicorn module:attr --host HOST --port PORT`` with this
    interpreter; a command line (a string, split like a shell would) or an argv list has
    its ``{port}``, ``{host}`` and ``{python}`` (this interpreter) placeholders filled in.

    Raises:
        ValueError: a command without ``{port}`` (the adapter picks the port).
    """
    if isinstance(server_cmd, str) and APP_TARGET.fullmatch(server_cmd.strip()):
        return [sys.executable, "-m", "uvicorn", server_cmd.strip(), "--host", host, "--port", str(port),
                "--log-level", "warning"]
    parts = shlex.split(server_cmd) if isinstance(server_cmd, str) else [str(p) for p in server_cmd]
    if not parts or not any("{port}" in p for p in parts):
        raise ValueError(f"server_cmd {server_cmd!r} must be 'module:app' or a command with a {{port}} placeholder "
                         "(the adapter picks a free loopback port)")
    values = {"{port}": str(port), "{host}": host, "{python}": sys.executable}
    return [re.sub(r"\{port\}|\{host\}|\{python\}", lambda m: values[m.group()], p) for p in parts]


#: opens loopback URLs without the HTTP(S)_PROXY of the environment
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: every server process this process started and has not stopped (stopped at exit)
_LIVE: set["ServerProcess"] = set()
_LIVE_LOCK = threading.Lock()


class ServerProcess:
    """One OpenEnv server process: started on a free loopback port in its own process
    group (its output in a temporary log), ready once ``GET /health`` answers 200.

    Args:
        server_cmd: as :func:`server_command` takes it.
        env: extra environment variables of the process (``"module:app"`` commands also
            get this interpreter's ``sys.path`` as ``PYTHONPATH``).
        label: how errors name it (``openenv:<name>``).
    """

    def __init__(self, server_cmd: str | Sequence[str], env: Mapping[str, str] | None = None, label: str = ""):
        self.server_cmd, self.label = server_cmd, label
        self.env = {**os.environ, **{str(k): str(v) for k, v in (env or {}).items()}}
        if isinstance(server_cmd, str) and APP_TARGET.fullmatch(server_cmd.strip()):
            # the app module imports in the server as it would here (a test's folder, say)
            self.env["PYTHONPATH"] = os.pathsep.join([source_folders_path(), self.env.get("PYTHONPATH", "")])
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.command: list[str] = []
        self._log_path: str | None = None
        self._last: subprocess.Popen | None = None  # the stopped process (for its exit code)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self) -> None:
        """Start the process (without waiting for it to answer)."""
        self.port = free_port()
        self.command = server_command(self.server_cmd, self.port)
        log = tempfile.NamedTemporaryFile(prefix="openenv-server-", suffix=".log", delete=False)
        self._log_path = log.name
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
        except OSError as exc:
            raise OpenEnvError(f"{self.label}: cannot run the server command {self.command} "
                               f"({error_text(exc)})") from None
        finally:
            log.close()
        with _LIVE_LOCK:
            _LIVE.add(self)

    def wait_ready(self, start_timeout: float, probe_timeout: float, port_attempts: int = 3) -> None:
        """Block until ``GET /health`` answers 200, relaunching on another port when the
        first was taken meanwhile.

        Raises:
            OpenEnvError: the process exited first, or gave no answer within
                ``start_timeout`` seconds (then it is stopped); the last log line named.
        """
        deadline = time.monotonic() + start_timeout
        while True:
            if not self.alive():
                tail = self.log_tail()
                if port_attempts > 1 and _PORT_TAKEN.search(tail):
                    port_attempts -= 1
                    self.stop()
                    self.launch()
                    continue
                code = None if self.proc is None else self.proc.returncode
                self.stop()
                raise OpenEnvError(f"{self.label}: the server {self.command} exited with code {code} before "
                                   f"answering GET /health (its log ends: {tail or 'nothing'})")
            try:
                with _LOCAL.open(f"{self.url}/health", timeout=probe_timeout) as answer:
                    if answer.status == 200:
                        return
            except OSError:  # not listening yet
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise OpenEnvError(f"{self.label}: the server {self.command} did not answer GET {self.url}/health "
                                   f"within start_timeout={start_timeout:g} s (its log ends: {tail or 'nothing'})")
            time.sleep(0.05)

    def log_tail(self, chars: int = 400) -> str:
        """The end of the process's output, on one line."""
        if self._log_path is None:
            return ""
        try:
            with open(self._log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self._log_path) - 4 * chars))
                return " ".join(f.read().decode(errors="replace").split())[-chars:]
        except OSError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; reap it. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break  # reaped: its pid may be reused, so its group is signalled no more
                try:
                    os.killpg(proc.pid, sig)  # its own session: the group is the server and its children
                    proc.wait(timeout=grace)
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            if proc.poll() is None:
                _log.warning("%s: server pid %d survived SIGKILL", self.label, proc.pid)
            self._last = proc
        if self._log_path is not None:
            try:
                os.unlink(self._log_path)
            except OSError:
                pass
            self._log_path = None
        with _LIVE_LOCK:
            _LIVE.discard(self)

    @property
    def returncode(self) -> int | None:
        proc = self.proc if self.proc is not None else self._last
        return None if proc is None else proc.poll()


def live_servers() -> list[int]:
    """The pids of the servers this process started and has not stopped yet."""
    with _LIVE_LOCK:
        return sorted(server.pid for server in _LIVE if server.pid is not None)


@atexit.register
def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        server.stop(grace=2.0)


class _SharedServer:
    """A started server and how many adapter instances hold a session on it; a ``keep``
    one stays up, idle, when the last lets go."""

    def __init__(self, process: ServerProcess, key: tuple, keep: bool):
        self.process, self.key, self.keep = process, key, keep
        self.users = 1
        self.ready = False
        self.error: OpenEnvError | None = None
        self.lock = threading.Lock()  # held by the instance that waits for it to boot


#: started servers by (command, env, keep): shared up to ``sessions_per_server``, or kept
_POOL: dict[tuple, list[_SharedServer]] = {}
_POOL_LOCK = threading.Lock()


def _acquire(server_cmd: str | Sequence[str], server_env: Mapping[str, str], capacity: int, keep: bool,
             label: str) -> _SharedServer:
    """A live server of this command with a free session, or a newly launched one."""
    key = (server_cmd if isinstance(server_cmd, str) else tuple(server_cmd), tuple(sorted(server_env.items())), keep)
    with _POOL_LOCK:
        group = _POOL.setdefault(key, [])
        dead = [s for s in group if s.users == 0 and not s.process.alive()]  # kept, died while idle
        group[:] = [s for s in group if s not in dead]
        joined = next((s for s in group if s.users < capacity and s.error is None
                       and (not s.ready or s.process.alive())), None)
        if joined is not None:
            joined.users += 1
        else:
            fresh = _SharedServer(ServerProcess(server_cmd, server_env, label), key, keep)
            fresh.lock.acquire()  # whoever joins waits in _wait_ready until it has launched
            group.append(fresh)
    for idle in dead:
        idle.process.stop()  # reaped
    if joined is not None:
        return joined
    try:
        fresh.process.launch()
    except OpenEnvError as exc:
        fresh.error = exc
        fresh.lock.release()
        _release(fresh)
        raise
    fresh.lock.release()
    return fresh


def _release(shared: _SharedServer) -> None:
    """One instance lets go of ``shared``; the last one stops it, unless it is kept."""
    with _POOL_LOCK:
        shared.users -= 1
        if shared.users > 0 or (shared.keep and shared.error is None and shared.process.alive()):
            return
        group = _POOL.get(shared.key, [])
        if shared in group:
            group.remove(shared)
        if not group:
            _POOL.pop(shared.key, None)
    shared.process.stop()


def stop_servers() -> list[int]:
    """Stop the idle servers kept by ``keep_servers=True``; their pids."""
    with _POOL_LOCK:
        idle = [s for group in _POOL.values() for s in group if s.users == 0]
        for group in _POOL.values():
            group[:] = [s for s in group if s.users > 0]
    pids = [s.process.pid for s in idle if s.process.pid is not None]
    for shared in idle:
        shared.process.stop()
    return pids


def _wait_ready(shared: _SharedServer, start_timeout: float, probe_timeout: float) -> None:
    with shared.lock:
        if shared.error is not None:
            raise shared.error
        if not shared.ready:
            try:
                shared.process.wait_ready(start_timeout, probe_timeout)
            except OpenEnvError as exc:
                shared.error = exc
                raise
            shared.ready = True
