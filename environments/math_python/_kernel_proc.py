"""The two processes of one kernel: its supervisor and its executor (loaded by the zygote).

Like ``_kernel_driver.py`` this runs inside the sandbox and imports nothing of this
project. The supervisor is pid 1 of the kernel's pid namespace, root, in fresh network,
IPC and mount namespaces, in the kernel's memory cgroup, and owns the host's two pipes;
it runs trusted code only. The executor is its child: own uid, rlimits,
``no_new_privs``, a seccomp filter; it runs the model's cells, and its stdout, stderr
and result pipe lead to the supervisor, never to the host. Frames on every pipe are a
4-byte big-endian length and UTF-8 JSON.
"""

import ctypes
import errno
import fcntl
import io
import json
import os
import platform
import random
import resource
import select
import signal
import struct
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x20000, 0x8000000, 0x40000000
#: every CLONE_NEW* flag of clone(2) (CLONE_NEWTIME, 0x80, is an exit-signal bit there)
CLONE_NAMESPACES = 0x7E020000
CLONE_NEWTIME = 0x80
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC = 4096, 16384
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 38, 22
#: mechanisms a ForkServer may be told to leave off (to test the fallbacks)
MECHANISMS = ("memory_cgroup", "seccomp", "ipc_limits", "stacked_root")
MAX_FRAME = 64 << 20
#: what the executor may send per cell (its ``done`` message), in bytes
MAX_DONE_BYTES = 1 << 20
#: the executor's exit code when its pipes to the supervisor are gone (a cell closed them)
CHANNEL_LOST = 121

_libc = ctypes.CDLL(None, use_errno=True)


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {target}")


def prctl(option, value):
    check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def close_all_but(keep):
    """Close every descriptor of this process except ``keep`` (inherited ones included)."""
    low = 3
    for fd in sorted(fd for fd in keep if fd >= 3):
        if fd > low:  # closerange(a, b) with b < a would close everything from a up
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def clean(text, limit=None):
    """``text`` as a str that encodes to UTF-8 (lone surrogates escaped), at most ``limit`` chars."""
    if not isinstance(text, str):
        return None
    if limit is not None and len(text) > limit:
        text = f"[... {len(text) - limit} characters omitted ...]\n" + text[-limit:]
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# --- seccomp: what the executor may not ask the kernel for -------------------------------

#: syscall numbers per machine: (audit arch, x32 bit or 0, {name: number})
SYSCALLS = {
    "x86_64": (0xC000003E, 0x40000000, {
        "memfd_create": 319, "memfd_secret": 447, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
        "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240}),
    "aarch64": (0xC00000B7, 0, {
        "memfd_create": 279, "memfd_secret": 447, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
        "shmget": 194, "msgget": 186, "semget": 190, "mq_open": 180}),
}
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000


def _errno(code):
    return 0x00050000 | code  # SECCOMP_RET_ERRNO


def seccomp_program(machine, refuse_sysv_ipc):
    """The executor's filter as BPF ``(code, jt, jf, k)`` tuples, or ``None`` for an unknown machine.

    Refused with ``EPERM``: ``memfd_create`` and ``memfd_secret`` (memory outside
    ``RLIMIT_AS`` and the workdir), ``unshare``/``clone`` with any ``CLONE_NEW*`` flag
    (a user namespace would let the cell mount a tmpfs of its own), ``setns``, and with
    ``refuse_sysv_ipc`` (no private, bounded IPC namespace) ``shmget``/``msgget``/
    ``semget``/``mq_open``. ``clone3`` answers ``ENOSYS`` (its flags sit in memory a
    filter cannot read; glibc then falls back to ``clone``). Another ABI (i386 through
    ``int 0x80``, x32) is refused whole: its numbers differ.
    """
    if machine not in SYSCALLS:
        return None
    arch, x32_bit, nr = SYSCALLS[machine]
    prog = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _errno(errno.EPERM)), (_LD_ABS, 0, 0, 0)]
    if x32_bit:
        prog += [(_JGE, 0, 1, x32_bit), (_RET, 0, 0, _errno(errno.ENOSYS))]
    refused = {"memfd_create": errno.EPERM, "memfd_secret": errno.EPERM, "setns": errno.EPERM,
               "clone3": errno.ENOSYS}
    if refuse_sysv_ipc:
        refused.update(dict.fromkeys(("shmget", "msgget", "semget", "mq_open"), errno.EPERM))
    for name, code in refused.items():
        prog += [(_JEQ, 0, 1, nr[name]), (_RET, 0, 0, _errno(code))]
    for name, mask in (("unshare", CLONE_NAMESPACES | CLONE_NEWTIME), ("clone", CLONE_NAMESPACES)):
        # the low 32 bits of args[0] (offset 16, little-endian): the flags
        prog += [(_JEQ, 0, 4, nr[name]), (_LD_ABS, 0, 0, 16), (_JSET, 0, 1, mask),
                 (_RET, 0, 0, _errno(errno.EPERM)), (_RET, 0, 0, _ALLOW)]
    return prog + [(_RET, 0, 0, _ALLOW)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def install_seccomp(refuse_sysv_ipc):
    """Install the filter on this process (needs ``no_new_privs`` or root); its children
    and whatever they exec inherit it. Returns what it refuses; raises OSError."""
    prog = seccomp_program(platform.machine(), refuse_sysv_ipc)
    if prog is None:
        raise OSError(errno.ENOSYS, f"no syscall table for machine {platform.machine()!r}")
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    check(_libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")
    what = "memfd_create, memfd_secret, new namespaces (unshare/clone CLONE_NEW*, setns; clone3 is ENOSYS)"
    return what + (", System V IPC and POSIX message queues" if refuse_sysv_ipc else "")


def probe_seccomp():
    """Whether a filter installs and works here: a forked child installs it and checks that
    ``memfd_create`` is refused. Returns ``None`` (works) or why not."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            install_seccomp(False)
            try:
                os.memfd_create("probe")
            except PermissionError:
                code = 0
            else:
                code = 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    if code == 0:
        return None
    if platform.machine() not in SYSCALLS:
        return f"no syscall table for machine {platform.machine()!r}"
    return {2: "the filter installed but memfd_create was not refused"}.get(code, "prctl(PR_SET_SECCOMP) failed")


# --- the kernel's IPC namespace and memory cgroup ----------------------------------------

def ipc_limits(limits):
    """Sysctls of a kernel's private IPC namespace: what SysV IPC and POSIX queues may hold
    (``path under /proc/sys -> value``). Shared memory is RAM like the workdir: ``disk_mb``."""
    page = os.sysconf("SC_PAGE_SIZE")
    shm = limits["disk_mb"] << 20
    return {"kernel/shmmax": str(shm), "kernel/shmall": str(shm // page), "kernel/shmmni": "64",
            "kernel/msgmni": "16", "kernel/msgmnb": "16384", "kernel/msgmax": "8192",
            "kernel/sem": "250 4096 32 16",  # per set, in all, per semop, sets
            "fs/mqueue/queues_max": "16", "fs/mqueue/msg_max": "10", "fs/mqueue/msgsize_max": "8192"}


def set_ipc_limits(limits):
    """Write :func:`ipc_limits` (this process must be in the kernel's own IPC namespace,
    with a writable /proc of it); raises OSError."""
    for path, value in ipc_limits(limits).items():
        with open(f"/proc/sys/{path}", "w") as f:
            f.write(value)


def oom_kills(fd):
    """The ``oom_kill`` counter of a memory cgroup (``memory.oom_control`` of v1 or
    ``memory.events`` of v2, open at ``fd``); 0 when there is none."""
    if fd is None:
        return 0
    try:
        text = os.pread(fd, 4096, 0).decode()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def _oom_score_adj(value):
    """Set this process's OOM score adjustment; False where /proc refuses."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
        return True
    except OSError:
        return False


# --- framing ---------------------------------------------------------------------------

def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def read_frame(fd):
    (n,) = struct.unpack(">I", _read_exact(fd, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    return json.loads(_read_exact(fd, n).decode())


def encode_frame(obj):
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def write_frame(fd, obj):
    data = encode_frame(obj)
    while data:
        data = data[os.write(fd, data):]


# --- executor: runs the model's cells --------------------------------------------------

def _set_limits(limits, report):
    mb = 1 << 20
    values = {
        "RLIMIT_AS": (limits["memory_mb"] * mb,) * 2,
        "RLIMIT_CPU": (limits["cpu_time_s"], limits["cpu_time_s"] + 1),
        "RLIMIT_NOFILE": (limits["max_open_files"],) * 2,
        "RLIMIT_NPROC": (limits["max_processes"],) * 2,
        "RLIMIT_FSIZE": (limits["disk_mb"] * mb,) * 2,
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_MSGQUEUE": (mb // 2,) * 2,  # bytes of POSIX message queues of the uid (default hard: 800 KiB)
    }
    for name, value in values.items():
        try:
            resource.setrlimit(getattr(resource, name), value)
            report[name] = value[0]
        except (OSError, ValueError) as exc:
            report[name] = f"not set ({exc})"


def _run_cell(code, filename, namespace):
    """Execute ``code``; return (error text or None, exception name or None)."""
    import ast
    import linecache
    import traceback

    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                print(repr(value))
        return None, None
    except BaseException as exc:  # the cell's error is data for the model, including SystemExit
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # hide the driver's own frames
        try:
            if isinstance(exc, SyntaxError):
                text = "".join(traceback.format_exception_only(type(exc), exc))
            else:
                text = "".join(traceback.format_exception(type(exc), exc, tb))
        except BaseException as fmt_exc:  # an exception whose __str__ raises
            text = f"{type(exc).__name__} (its message could not be formatted: {type(fmt_exc).__name__})\n"
        return text, type(exc).__name__


def executor(req, res, limits, uid, workdir, env, namespace, report, sandbox):
    """The model's interpreter: fds 1/2 go to the supervisor; ``req``/``res`` are its pipes.
    ``sandbox``: ``seccomp`` (install the filter) and ``refuse_sysv_ipc`` (no bounded
    private IPC namespace: the filter refuses SysV IPC too)."""
    own = os.getpid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # the supervisor is the last choice of the OOM killer; the cell's processes the first
    report["oom_score_adj"] = 1000 if _oom_score_adj(1000) else "not set (/proc refused)"
    _set_limits(limits, report)
    if uid is not None:
        os.chown(workdir, uid, uid)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        report["user"] = f"uid {uid} (own uid, no capabilities)"
    else:
        report["user"] = f"same uid as the host ({os.geteuid()}): file permissions of the host user apply"
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
    try:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        report["no_new_privs"] = True
    except OSError as exc:
        report["no_new_privs"] = f"not set ({exc})"
    if sandbox["seccomp"] is True:
        try:  # last: everything above may use what it refuses
            report["seccomp"] = "refuses " + install_seccomp(sandbox["refuse_sysv_ipc"])
        except OSError as exc:  # it worked in the zygote's probe: fail closed
            write_frame(res, {"op": "ready", "error": f"the seccomp filter could not be installed ({exc})"})
            os._exit(1)
    else:
        report["seccomp"] = f"NOT active ({sandbox['seccomp']})"
    os.environ.clear()
    os.environ.update(env, HOME=workdir, TMPDIR=workdir)
    os.chdir(workdir)
    os.umask(0o077)
    if limits.get("seed") is not None:  # seeded at fork: no start round trip
        _seed(limits["seed"])
    write_frame(res, {"op": "ready", "protections": report})
    stdout, stderr = _streams()
    cells = 0
    while True:
        msg = _next_request(req, lambda: _flush((sys.stdout, sys.stderr, stdout, stderr)))
        if msg.get("op") == "start":
            _seed(msg["seed"])
            _tell(res, {"op": "started"})
            continue
        cells += 1
        if stdout.closed or stderr.closed:  # a cell closed them: later cells still print
            stdout, stderr = _streams()
        _flush((sys.stdout, sys.stderr, stdout, stderr))  # what background threads printed so far
        _tell(res, {"op": "begin", "id": msg["id"]})
        if _next_request(req, lambda: None).get("op") != "go":  # the supervisor has drained the pipes
            os._exit(CHANNEL_LOST)
        sys.stdout, sys.stderr, sys.stdin = stdout, stderr, io.StringIO()
        error, error_name = _run_cell(msg["code"], f"<cell {cells}>", namespace)
        _flush((sys.stdout, sys.stderr, stdout, stderr))
        if os.getpid() != own:  # a process the cell forked never speaks the protocol
            os._exit(0)
        _tell(res, {"op": "done", "id": msg["id"], "status": "ok" if error is None else "error",
                    "error": clean(error, limits["output_bytes"]), "error_name": clean(error_name, 200)})


def _seed(seed):
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % (1 << 32))


def _tell(res, obj):
    try:
        write_frame(res, obj)
    except (OSError, ValueError):  # a cell closed or replaced the descriptor
        os._exit(CHANNEL_LOST)


def _streams():
    """Text streams on fds 1 and 2 (never closing the descriptors)."""
    stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                              write_through=True)
    return stdout, stderr


def _flush(streams):
    for stream in streams:
        try:
            stream.flush()
        except BaseException:  # a closed or replaced stream must not end the kernel
            pass



def ready(readers, writers, timeout):
    """``(readable, writable)`` among the given descriptors (ints or objects with
    ``fileno()``, returned as given) within ``timeout`` seconds: ``poll``, which, unlike
    ``select``, takes descriptors above ``FD_SETSIZE`` (1024)."""
    def num(f):
        return f if isinstance(f, int) else f.fileno()

    want = {}
    for f in readers:
        want[num(f)] = want.get(num(f), 0) | select.POLLIN | select.POLLPRI
    for f in writers:
        want[num(f)] = want.get(num(f), 0) | select.POLLOUT
    poller = select.poll()
    for fd, mask in want.items():
        poller.register(fd, mask)
    events = dict(poller.poll(timeout * 1000.0))
    gone = select.POLLHUP | select.POLLERR
    r = [f for f in readers if events.get(num(f), 0) & (select.POLLIN | select.POLLPRI | gone)]
    w = [f for f in writers if events.get(num(f), 0) & (select.POLLOUT | gone)]
    return r, w


def _next_request(req, flush):
    """The supervisor's next request; meanwhile, output of background threads is flushed
    every 0.1 s so that it reaches the supervisor as between-cell output."""
    try:
        while not ready([req], [], 0.1)[0]:
            flush()
        return read_frame(req)
    except (EOFError, OSError, ValueError):  # the supervisor is gone, or a cell broke the pipe
        os._exit(CHANNEL_LOST)


# --- supervisor: pid 1 of the kernel, owner of the host's channel ----------------------

class Capture:
    """Head + tail of one stream, the middle counted."""

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


def _death_cause(status, limits):
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

    def __init__(self, host_req, host_resp, limits, child, pipes, cgroup=None):
        self.host_req, self.host_resp, self.limits, self.child = host_req, host_resp, limits, child
        self.cgroup = cgroup  # {"events_fd", "limit_mb"} of the kernel's memory cgroup, or None
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
                cause = _death_cause(status, self.limits)
                if cause[1] == "SIGKILL" and self.cgroup and oom_kills(self.cgroup["events_fd"]) > self.oom_seen:
                    cause = (f"the kernel went over its memory limit of {self.cgroup['limit_mb']} MB (all its "
                             "processes, shared memory and files together) and the interpreter was killed, "
                             "SIGKILL", "MemoryLimit")
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
            ready_r, ready_w = ready(readers, writers, 1.0)
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
            self._reap()  # after the result pipe: a cell that answered and then died did answer
            if self.host_req in ready_r:
                self._on_host()


def supervisor(host_req, host_resp, limits, base_report, cfg, isolated, pidns, namespace, cgroup=None):
    """Body of a forked kernel: namespaces, the executor, then the relay loop. Never returns.

    ``cgroup``: the kernel's memory cgroup (``procs_fd`` to join it, ``events_fd`` to
    read its OOM kills, ``limit_mb``), made by the zygote; ``None`` where there is none.
    """
    report = dict(base_report)
    disabled = set(cfg.get("disable", ()))
    try:
        # No parent-death signal: a dead zygote must not take live kernels with it. The
        # kernel ends when the host closes (or loses) its pipes, or the zygote kills it.
        close_all_but({host_req, host_resp} | ({cgroup["procs_fd"], cgroup["events_fd"]} if cgroup else set()))
        if cgroup:  # first: every process of the kernel, and every page it charges, in it
            try:
                os.write(cgroup["procs_fd"], b"0")
            except OSError as exc:  # the cgroup works in this zygote: fail closed
                raise OSError(exc.errno, f"could not join the kernel's memory cgroup ({exc})") from None
            os.close(cgroup["procs_fd"])
            report["memory"] = (f"RLIMIT_AS {limits['memory_mb']} MB per process; the kernel's memory cgroup: "
                                f"{cgroup['limit_mb']} MB for all its processes, shared memory, kernel objects and "
                                "workdir files together")
        else:
            report["memory"] = (f"RLIMIT_AS {limits['memory_mb']} MB per process only (no memory cgroup: "
                                f"{base_report.get('memory_cgroup', 'none')})")
        if os.getpid() != 1:
            os.setsid()
        gpid = int(os.readlink("/proc/self")) if pidns else os.getpid()
        uid = None
        ipc_private = ipc_bounded = stacked = False
        if isolated:
            try:
                check(_libc.unshare(CLONE_NEWNET | CLONE_NEWIPC), "unshare(CLONE_NEWNET | CLONE_NEWIPC)")
                report["network"] = "none (own network and IPC namespaces, no interface up)"
                ipc_private = True
            except OSError as exc:
                report["network"] = f"NOT isolated ({exc})"
            check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            if pidns:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _oom_score_adj(-999)  # the OOM killer takes the cell's processes first (it still can take this one)
            if ipc_private and "ipc_limits" in disabled:
                report["ipc"] = "private IPC namespace (it ends with the kernel), limits left off"
            elif ipc_private:
                try:  # a writable /proc of this IPC namespace: the pid namespace's own
                    set_ipc_limits(limits)
                    ipc_bounded = True
                except OSError as exc:
                    report["ipc"] = f"private IPC namespace, limits NOT set ({exc})"
            # an interpreter (a checkout, a venv) under /tmp stays visible, read-only, above the tmpfs
            keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in cfg.get("under_tmp", ())}
            mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
                  f"size={limits['disk_mb']}m,nr_inodes=4096,mode=0755")
            for path, fd in keep.items():
                os.makedirs(path, 0o755, exist_ok=True)
                mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
                mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
                os.close(fd)
                parent = os.path.dirname(path)  # traversable, not listable: the checkout's layout stays hidden
                while parent not in ("/tmp", "/", "") and parent not in keep:
                    os.chmod(parent, 0o711)
                    parent = os.path.dirname(parent)
            workdir = "/tmp/work"
            os.mkdir(workdir, 0o700)
            uid = cfg["uid_base"] + gpid
            if "stacked_root" not in disabled:
                # Last mount: "/" bound over itself. The executor's root stays the lower
                # mount, which the kernel then counts as a chroot, and a chrooted process
                # may not create a user namespace (EPERM, user_namespaces(7)).
                try:
                    mount("/", "/", None, MS_BIND | MS_REC)
                    stacked = True
                except OSError as exc:
                    report["stacked_root"] = f"NOT set ({exc})"
        else:
            report["network"] = "NOT isolated (host is not root, or isolation is off)"
            workdir = cfg["workdirs"] + f"/kernel_{gpid}"
            os.mkdir(workdir, 0o700)
        if pidns:
            report["processes"] = "own pid namespace: the kernel sees and can signal only its own processes"
        else:
            report.setdefault("processes", "shares the host's pid namespace")
        if ipc_bounded:
            shm = ipc_limits(limits)
            report["ipc"] = (f"private IPC namespace (it ends with the kernel): SysV shared memory at most "
                             f"{limits['disk_mb']} MB in all ({shm['kernel/shmmni']} segments), "
                             f"{shm['kernel/msgmni']} message queues, {shm['kernel/sem'].split()[-1]} semaphore "
                             f"sets, {shm['fs/mqueue/queues_max']} POSIX queues")
        elif cfg.get("seccomp") is True:
            report["ipc"] = (report.get("ipc", "the host's IPC namespace") + "; SysV IPC and POSIX queues refused "
                             "by seccomp")
        else:
            report["ipc"] = report.get("ipc", "the host's IPC namespace") + "; NOT bounded"
        sandbox = {"seccomp": cfg.get("seccomp", "not probed"), "refuse_sysv_ipc": not ipc_bounded}
        e_req_r, e_req_w = os.pipe()
        e_res_r, e_res_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        wake_r, wake_w = os.pipe()
        for fd in (out_w, err_w):
            try:
                fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: fewer wake-ups on big output
            except OSError:
                pass
        child = os.fork()
        if child == 0:
            try:
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                close_all_but({e_req_r, e_res_w})
                os.set_inheritable(e_req_r, True)
                os.set_inheritable(e_res_w, True)
                executor(e_req_r, e_res_w, limits, uid, workdir, cfg["env"], namespace, report, sandbox)
            finally:
                os._exit(1)
        for fd in (e_req_r, e_res_w, out_w, err_w):
            os.close(fd)
        for fd in (e_req_w, e_res_r, out_r, err_r, wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        ready = _await_ready(e_res_r, child, limits)
        if "error" in ready:
            raise RuntimeError(ready["error"])
        protections = ready["protections"]
        guards = (["seccomp"] if protections.get("seccomp", "").startswith("refuses") else []) + (
            ["the executor's stacked root (a chroot to the kernel)"] if stacked else [])
        protections["user_namespaces"] = ("refused by " + " and ".join(guards) if guards else
                                          "NOT refused: a cell can create a user namespace and mount its own tmpfs")
        write_frame(host_resp, {"op": "hello", "pid": gpid, "uid": os.geteuid() if uid is None else uid,
                                "own_uid": uid is not None, "workdir": workdir, "protections": protections})
        Supervisor(host_req, host_resp, limits, child, (e_req_w, e_res_r, out_r, err_r, wake_r), cgroup).serve()
    except SystemExit:
        pass
    except BaseException as exc:  # report instead of dying silently
        try:
            write_frame(host_resp, {"op": "hello", "error": f"{type(exc).__name__}: {exc}", "protections": report})
        except OSError:
            pass
    try:
        os.kill(-1, signal.SIGKILL) if os.getpid() == 1 else os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _await_ready(fd, child, limits):
    """The executor's first message (its protections), read before any model code runs."""
    buf = bytearray()
    while True:
        ready([fd], [], 1.0)
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            pid, status = os.waitpid(child, 0)
            return {"error": f"the executor died during set-up ({_death_cause(status, limits)[0]})"}
        if chunk:
            buf += chunk
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            return json.loads(bytes(buf[4:4 + struct.unpack(">I", buf[:4])[0]]).decode())
