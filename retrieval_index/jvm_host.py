"""The process that hosts the JVM for BM25 (pyserini / Lucene), and the client that talks to it.

Why a process of its own: a JVM embedded in a Python process shares that process's signal
handlers and threads with everything else loaded there. HotSpot raises SIGSEGV on purpose
(implicit null checks, safepoint polls) and expects its own handler to run; a handler that
another library installs later turns those into crashes (pyserini issue #1867: segfaults
"during search with ray"), and a handler installed before the JVM (Python's
``faulthandler``, which pytest enables) is chained behind HotSpot's and takes a real crash
before HotSpot writes its error report. The test suite's worker died with SIGSEGV and no
report in a BM25 test, in a process that also held torch, vLLM and Ray (three stops and CI,
never in the file run alone; the cause inside the JVM was not pinned down). In a host of
its own the JVM meets none of them, a crash there cannot take the trainer or the env down
with it, and HotSpot's report is kept (:func:`hs_err_path`).

The host is ``python -m retrieval_index.bm25`` (that module names the requests it answers;
this one knows no Java); :class:`JVMHost` starts it. One host serves any number of searchers
(each a handle) and index builds, one request at a time.

Protocol: JSON lines. The client writes a request ``{"op": ..., ...}`` to the host's
stdin; the host answers one line ``{"ok": value}`` or ``{"error": [type, message]}`` on a
private copy of its stdout, and points its own stdout at stderr as it starts, so that Java
or pyserini printing to standard output cannot corrupt the channel. The host ends when its
stdin closes (the client closed it, or the client's process ended).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

#: The module the host runs (``python -m``): its ``__main__`` calls :func:`run_host` with its requests.
HOST_MODULE = "retrieval_index.bm25"
#: Exceptions the host may report that the client raises as themselves (others: RuntimeError).
_RAISABLE: dict[str, type[Exception]] = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError,
                                         "RuntimeError": RuntimeError, "UnicodeEncodeError": ValueError}


def hs_err_path(pid: int) -> Path:
    """Where HotSpot writes its fatal-error report for the host of process id ``pid``."""
    return Path(tempfile.gettempdir()) / f"trace_gym_bm25_hs_err_pid{pid}.log"


class HostDied(RuntimeError):
    """The host process ended while a request was open (a JVM crash, or killed from outside)."""


class JVMHost:
    """A running host process and the channel to it (thread-safe: one request at a time)."""

    def __init__(self):
        root = str(Path(__file__).resolve().parent.parent)  # the folder that holds retrieval_index
        child_env = dict(os.environ)
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH", "")) if p)
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-m", HOST_MODULE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=child_env, text=True, encoding="utf-8",
                                     errors="surrogateescape")
        self.owner = os.getpid()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        """The host runs and belongs to this process (a forked child must start its own)."""
        return self.owner == os.getpid() and self.proc.poll() is None

    def call(self, op: str, **args: Any) -> Any:
        """Send one request and return its ``ok`` value; the host's errors are raised here."""
        line = json.dumps({"op": op, **args}) + "\n"
        with self._lock:
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                answer = self.proc.stdout.readline()
            except (BrokenPipeError, OSError, ValueError):
                answer = ""
            if not answer.endswith("\n"):  # EOF, or a line cut off as the host died
                raise HostDied(self.how_it_ended())
        reply = json.loads(answer)
        if "error" in reply:
            kind, message = reply["error"]
            raise _RAISABLE.get(kind, RuntimeError)(message if kind in _RAISABLE else f"{kind}: {message}")
        return reply["ok"]

    def how_it_ended(self) -> str:
        """One line: the host's exit code or signal, and HotSpot's report when one was written."""
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        report = hs_err_path(self.pid)
        where = f"; the JVM's report: {report}" if report.exists() else ""
        return f"the BM25 (Java) host process {self.pid} ended ({how}){where}"

    def close(self) -> None:
        """End the host: close its stdin (it closes its searchers and exits), kill it after 10 s."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


_shared: list[JVMHost] = []
_shared_lock = threading.Lock()


def shared_host() -> JVMHost:
    """This process's host, started on first use and again after one ended."""
    with _shared_lock:
        if not _shared or not _shared[0].alive():
            if _shared and _shared[0].owner == os.getpid():
                _shared[0].close()
            _shared[:] = [JVMHost()]
        return _shared[0]


@atexit.register
def _close_shared() -> None:
    for host in _shared:
        if host.owner == os.getpid():
            host.close()


# ---------------------------------------------------------------- the host's side


def serve(requests: Iterable[str], reply: Callable[[str], None], ops: Mapping[str, Callable[..., Any]]) -> None:
    """Answer each JSON line of ``requests`` with one line to ``reply``: ``ops[op](**args)``'s value,
    or the error it raised (named, and the host goes on)."""
    for line in requests:
        try:
            request = json.loads(line)
            answer = {"ok": ops[request.pop("op")](**request)}
        except Exception as exc:  # every failure goes back to the client, named; the host goes on
            answer = {"error": [type(exc).__name__, str(exc)]}
        reply(json.dumps(answer))


def run_host(ops: Mapping[str, Callable[..., Any]]) -> None:
    """The host's main: serve stdin on a private copy of stdout, with stdout itself pointed at stderr."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # Java's and pyserini's prints go to stderr, never into the channel
    sys.stdout = sys.stderr

    def reply(text: str) -> None:
        channel.write(text + "\n")
        channel.flush()

    serve(sys.stdin, reply, ops)
