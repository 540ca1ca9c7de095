"""The supervisor's relay: the only writer of host frames, and the executor's warden.

It relays host requests (``start``, ``exec``) to the executor and builds every host
frame from values it checked or made itself: the executor may send at most
:data:`MAX_DONE_BYTES` per message and only the protocol's messages, field by field;
anything else kills it (a crashed cell, ``ProtocolViolation``). Output of fds 1 and 2 is
captured at most ``output_bytes`` per stream and cell (head and tail kept, the middle
counted); output between cells is reported apart, as background output. Every
:data:`~.cpu.CHECK_S` seconds it reads the CPU time of the whole kernel (:mod:`.cpu`), and
past ``cpu_time_s`` kills all its processes. When the executor dies, the cause is read
from its wait status, the memory cgroup's OOM-kill counter and that CPU check, and, as
pid 1, every process the cell left behind is killed with it.
"""

import json
import os
import signal
import struct
import time

from .cgroups import oom_kills
from .channel import clean, encode_frame, read_frame, ready, write_frame
from .cpu import CHECK_S
from .executor import CHANNEL_LOST

#: what the executor may send per cell (its ``done`` message), in bytes
MAX_DONE_BYTES = 1 << 20


class Capture:
    """Head + tail of one stream, the middle counted: ``limit`` bytes, a quarter of them tail."""

    def __init__(self, limit):
        self.head_limit, self.tail_limit = limit - limit // 4, limit // 4
        self.clear()

    def clear(self):
        self.head, self.tail, self.omitted = bytearray(), bytearray(), 0

    def add(self, data):
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_limit:
                self.omitted += len(self.tail) - self.tail_limit
                del self.tail[: len(self.tail) - self.tail_limit]

    def take(self):
        out = [self.head.decode("utf-8", "replace"), self.tail.decode("utf-8", "replace"), self.omitted]
        self.clear()
        return out


def death_cause(status, limits):
    """(sentence, short name) for a wait status of the executor."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = {
            "SIGXCPU": f"it used up its CPU time limit of {limits['cpu_time_s']} s",
            "SIGSEGV": "segmentation fault",
            "SIGBUS": "bus error",
            "SIGABRT": "aborted",
            "SIGKILL": "killed by SIGKILL (by the cell's own code, or the machine's out-of-memory killer)",
            "SIGXFSZ": f"a file grew over the {limits['disk_mb']} MB limit",
        }.get(name, f"killed by {name}")
        return f"{why}, {name}", name
    code = os.WEXITSTATUS(status)
    if code == CHANNEL_LOST:
        return "the cell closed or replaced the interpreter's own pipes to the kernel", "ChannelLost"
    return f"the process exited with code {code} (os._exit, exec or a C extension)", f"exit code {code}"


class Supervisor:
    """Relays host requests to the executor and builds every host frame itself.

    A request is pending from the moment it is forwarded. For a cell, the executor
    first says ``begin`` (after flushing what background threads printed) and waits for
    ``go``, sent once the output pipes are drained; then it runs the cell and says
    ``done``. Output read between ``begin`` and ``done`` is the cell's, any other output
    is background output, reported with the next result. Any other message ends the
    executor.
    """

    def __init__(self, host_req, host_resp, limits, child, pipes, cgroup=None, meter=None):
        self.host_req, self.host_resp, self.limits, self.child = host_req, host_resp, limits, child
        self.cgroup = cgroup  # {"events_fd", "limit_mb"} of the kernel's memory cgroup, or None
        self.meter = meter  # the kernel's CPU time (.cpu.CpuMeter), or None: not watched
        self.cpu_over = None  # the CPU seconds that were found over cpu_time_s (all were killed then)
        self.next_cpu_check = 0.0
        self.oom_seen = oom_kills(cgroup and cgroup["events_fd"])  # kills before the current cell
        self.e_req, self.e_res, self.e_out, self.e_err, self.wake = pipes
        n = limits["output_bytes"]
        self.out, self.err, self.bg_out, self.bg_err = Capture(n), Capture(n), Capture(n), Capture(n)
        self.pending = None  # ["start", seed] or ["exec", id, began] while the executor works
        self.res_buf = bytearray()
        self.to_exec = bytearray()
        self.dead = None  # (sentence, name) once the executor is gone
        self.streams = {self.e_out: (self.out, self.bg_out), self.e_err: (self.err, self.bg_err)}

    def _in_cell(self):
        return self.pending is not None and self.pending[0] == "exec" and self.pending[2]

    def _read_stream(self, fd):
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            del self.streams[fd]
            os.close(fd)
            return False
        cell, bg = self.streams[fd]
        (cell if self._in_cell() else bg).add(data)
        return True

    def _drain(self):
        for fd in list(self.streams):
            while fd in self.streams and self._read_stream(fd):
                pass

    def _reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child and self.dead is None:
                cause = death_cause(status, self.limits)
                if cause[1] == "SIGKILL" and self.cgroup and oom_kills(self.cgroup["events_fd"]) > self.oom_seen:
                    cause = (f"the kernel went over its memory limit of {self.cgroup['limit_mb']} MB (all its "
                             "processes, shared memory and files together) and the interpreter was killed, "
                             "SIGKILL", "MemoryLimit")
                elif cause[1] == "SIGKILL" and self.cpu_over is not None:
                    cause = (f"the kernel's processes together used {self.cpu_over:.1f} s of CPU time, over its "
                             f"limit of {self.limits['cpu_time_s']} s (all its processes, during and between "
                             "cells), and all were killed, SIGKILL", "CPULimit")
                self._executor_gone(cause)

    def _executor_gone(self, cause):
        self.dead = cause
        self.to_exec.clear()
        if os.getpid() == 1:  # whatever the cell left behind goes with it
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        self._drain()
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] == "exec":
            self._reply_result(pending[1], "crashed", None, cause[1], crashed=cause[0])
        elif pending is not None:
            self._send({"op": "error", "error": f"the kernel died while starting: {cause[0]}"})

    def _check_cpu(self):
        """Past ``cpu_time_s`` of CPU for the whole kernel, kill all its processes (once)."""
        if self.meter is None or self.cpu_over is not None or time.monotonic() < self.next_cpu_check:
            return
        self.next_cpu_check = time.monotonic() + self.interval
        used = self.meter.seconds()
        if used > self.limits["cpu_time_s"]:
            self.cpu_over = used
            self.meter.kill_all()

    @property
    def interval(self):
        """Seconds between CPU checks: a whole host's /proc costs more to read than a cgroup."""
        return CHECK_S if self.meter is None or self.meter.kind == "cgroup" or os.getpid() == 1 else 4 * CHECK_S

    def _kill_executor(self, why):
        try:
            os.kill(self.child, signal.SIGKILL)
        except OSError:
            pass
        self._executor_gone((why, "ProtocolViolation"))

    def _send(self, obj):
        write_frame(self.host_resp, obj)

    def _reply_result(self, cell_id, status, error, error_name, crashed=None):
        self._drain()
        self._send({"op": "result", "id": cell_id, "status": status, "stdout": self.out.take(),
                    "stderr": self.err.take(), "error": error, "error_name": error_name, "crashed": crashed,
                    "background": [self.bg_out.take(), self.bg_err.take()]})

    def _on_result_pipe(self):
        try:
            data = os.read(self.e_res, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            os.close(self.e_res)
            self.e_res = None
            return
        self.res_buf += data
        while self.dead is None and len(self.res_buf) >= 4:
            (n,) = struct.unpack(">I", self.res_buf[:4])
            if n > MAX_DONE_BYTES:
                return self._kill_executor("the cell wrote an oversized message to the kernel's result channel")
            if len(self.res_buf) < 4 + n:
                return
            raw, self.res_buf = bytes(self.res_buf[4:4 + n]), self.res_buf[4 + n:]
            self._on_message(raw)

    def _on_message(self, raw):
        try:
            msg = json.loads(raw.decode())
        except Exception:  # noqa: BLE001 - anything unreadable is a violation
            msg = None
        pending = self.pending
        if pending is None or not isinstance(msg, dict):
            return self._kill_executor("the cell wrote to the kernel's result channel")
        if pending[0] == "start":
            if msg != {"op": "started"}:
                return self._kill_executor("the kernel answered start out of protocol")
            self.pending = None
            return self._send({"op": "started", "seed": pending[1]})
        if not pending[2]:
            if msg != {"op": "begin", "id": pending[1]}:
                return self._kill_executor("the kernel answered a cell out of protocol")
            self._drain()  # output flushed before ``begin`` was printed between cells
            pending[2] = True
            if self.cgroup:  # a child the OOM killer took in an earlier cell is not this cell's death
                self.oom_seen = oom_kills(self.cgroup["events_fd"])
            self.to_exec += encode_frame({"op": "go"})  # only now does the cell start
            return self._send({"op": "running", "id": pending[1]})  # the host: it did start
        ok = (set(msg) == {"op", "id", "status", "error", "error_name"} and msg["op"] == "done"
              and type(msg["id"]) is int and msg["id"] == pending[1] and msg["status"] in ("ok", "error")
              and all(msg[k] is None or isinstance(msg[k], str) for k in ("error", "error_name"))
              and (msg["status"] == "ok") == (msg["error"] is None))
        if not ok:
            return self._kill_executor("the cell wrote a forged message to the kernel's result channel")
        self._reply_result(pending[1], msg["status"], clean(msg["error"], self.limits["output_bytes"]),
                           clean(msg["error_name"], 200))
        self.pending = None

    def _on_host(self):
        try:
            msg = read_frame(self.host_req)
        except (EOFError, OSError, ValueError):
            raise SystemExit(0)  # the host is gone or closed us
        op = msg.get("op")
        if op not in ("start", "exec") or self.pending is not None:
            return self._send({"op": "error", "error": f"unexpected request {op!r}"})
        if self.dead is not None:
            if op == "exec":  # the cell is not run: the host restarts the kernel and says why
                return self._send({"op": "result", "id": msg["id"], "status": "dead", "crashed": self.dead[0],
                                   "error_name": self.dead[1]})
            return self._send({"op": "error", "error": f"the kernel died before start: {self.dead[0]}"})
        self.pending = ["start", msg["seed"]] if op == "start" else ["exec", msg["id"], False]
        self.to_exec += encode_frame(msg)

    def serve(self):
        while True:
            readers = [self.host_req, self.wake, *self.streams]
            if self.e_res is not None:
                readers.append(self.e_res)
            writers = [self.e_req] if self.to_exec else []
            ready_r, ready_w = ready(readers, writers, self.interval if self.meter is not None else 1.0)
            for fd in ready_r:
                if fd in self.streams:
                    self._read_stream(fd)
            if self.e_res is not None and self.e_res in ready_r:
                self._on_result_pipe()
            if ready_w and self.to_exec:
                try:
                    del self.to_exec[: os.write(self.e_req, self.to_exec)]
                except BlockingIOError:
                    pass
                except OSError:
                    self.to_exec.clear()
            if self.wake in ready_r:
                try:
                    os.read(self.wake, 4096)
                except BlockingIOError:
                    pass
            self._check_cpu()
            self._reap()  # after the result pipe: a cell that answered and then died did answer
            if self.host_req in ready_r:
                self._on_host()
