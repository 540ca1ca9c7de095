"""The sandboxed kernel process (run as a script; imports nothing of this project).

The host (``sandbox.py``) starts ``python -s _kernel_driver.py CONFIG_JSON`` in a new
session with a scrubbed environment and two pipes (``req_fd`` host->kernel,
``resp_fd`` kernel->host). Frames on both are a 4-byte big-endian length and UTF-8
JSON. The driver, in order:

1. (as root) moves into fresh network and mount namespaces: no network interface is
   up; ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` become small private
   tmpfs mounts; directories the interpreter needs that an unprivileged user could not
   traverse (e.g. a Python under ``/root``) are re-exposed read-only by bind mounts
   over a tmpfs that hides the rest of their parent;
2. preloads numpy and sympy;
3. sets resource limits and drops to a uid/gid of its own (``uid_base + pid``) with
   ``no_new_privs``, so file permissions, ``RLIMIT_NPROC`` and signal permissions
   apply to it;
4. sends ``{"op": "hello", ...}`` describing what it could enforce, then waits for
   ``{"op": "start", "seed": S}`` (seeds ``random`` and numpy's global RNG);
5. serves ``{"op": "exec", "id": N, "code": str}`` requests one at a time.

Each step that fails for lack of privilege is reported in ``hello["protections"]``,
never silently assumed.
"""

import ctypes
import errno
import json
import os
import signal
import struct
import sys
import threading

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # the user's `import env` must not find this package's modules

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
F_SETPIPE_SZ = 1031
FIONREAD = 0x541B
MAX_FRAME = 64 << 20

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


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


def write_frame(fd, obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


# --- isolation (runs as root, before any user code) ------------------------------------

def _world_searchable(path):
    try:
        return bool(os.stat(path).st_mode & 0o001)
    except OSError:
        return False


def _hidden_roots(paths):
    """Map each topmost non-world-searchable ancestor to the needed paths below it."""
    groups = {}
    for p in sorted(set(paths)):
        parts = p.strip("/").split("/")
        for i in range(1, len(parts)):
            anc = "/" + "/".join(parts[:i])
            if not _world_searchable(anc):
                groups.setdefault(anc, []).append(p)
                break
    for anc, ps in groups.items():  # drop paths nested in another needed path
        groups[anc] = [p for p in ps if not any(p != q and p.startswith(q + "/") for q in ps)]
    return groups


def _interpreter_paths():
    """Directories the interpreter reads from (prefixes and ``sys.path``), resolved."""
    needed = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable))]
    needed += [p for p in sys.path if p and os.path.isdir(p)]
    # the project's packages (the grader worker imports ``environments.math_python.grading``,
    # which imports ``trace_gym``); the packages, not the project root, since the root
    # may itself be untraversable (a 0700 checkout such as ``mktemp -d``)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    needed += [os.path.join(root, pkg) for pkg in ("environments", "trace_gym")
               if os.path.isdir(os.path.join(root, pkg))]
    return [os.path.realpath(p) for p in needed]


def _tmpfs_keeping(path, keep, options):
    """Mount a fresh tmpfs over ``path``, then bind the directories ``keep`` (absolute
    paths below ``path``, opened before the mount hides them) back, read-only."""
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in keep]
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for p, fd in zip(keep, fds):
        os.makedirs(p, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        _mount(None, p, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(fd)


def _setup_namespaces(cfg, report):
    """Private network and mount namespaces; returns the working directory to use."""
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        report["network"] = "none (own network namespace, no interface up)"
    except OSError as exc:
        report["network"] = f"NOT isolated ({exc})"
    before = os.readlink("/proc/self/ns/mnt")
    try:
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        if os.readlink("/proc/self/ns/mnt") == before:
            raise OSError(errno.EPERM, "mount namespace did not change")
        # Without this every mount below would propagate to the host's namespace.
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as exc:
        report["filesystem"] = f"shared with host ({exc}); workdir is a host temp dir"
        return None
    needed = _interpreter_paths()
    for anc, ps in _hidden_roots(needed).items():
        _tmpfs_keeping(anc, ps, "size=1m,mode=0755")
        _mount(None, anc, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    # The world-writable places become private, root-owned tmpfs mounts: the working
    # directory (owned by the kernel's uid) is the only place it can write. An
    # interpreter or project that lives below one of them (a checkout under /tmp) stays
    # visible there, read-only.
    disk = int(cfg["disk_mb"])
    for path, size in (("/tmp", disk), ("/var/tmp", 1), ("/dev/shm", 1), ("/run/lock", 1)):
        if os.path.isdir(path):
            below = [p for p in needed if p.startswith(path + "/")]
            below = [p for p in below if not any(p != q and p.startswith(q + "/") for q in below)]
            _tmpfs_keeping(path, below, f"size={size}m,nr_inodes=4096,mode=0755")
    workdir = "/tmp/work"
    os.mkdir(workdir, 0o700)
    report["filesystem"] = ("writable: only the workdir /tmp/work (private tmpfs, %d MB); /tmp, /var/tmp, "
                            "/dev/shm, /run/lock are private and read-only to the kernel" % disk)
    if _hidden_roots(needed):
        report["filesystem"] += "; hidden: " + ", ".join(sorted(_hidden_roots(needed)))
    return workdir


def _set_limits(cfg, report):
    import resource

    mb = 1 << 20
    limits = {
        "RLIMIT_AS": (cfg["memory_mb"] * mb,) * 2,
        "RLIMIT_CPU": (cfg["cpu_time_s"], cfg["cpu_time_s"] + 1),
        "RLIMIT_NOFILE": (cfg["max_open_files"],) * 2,
        "RLIMIT_NPROC": (cfg["max_processes"],) * 2,
        "RLIMIT_FSIZE": (cfg["disk_mb"] * mb,) * 2,
        "RLIMIT_CORE": (0, 0),
    }
    for name, value in limits.items():
        try:
            resource.setrlimit(getattr(resource, name), value)
            report[name] = value[0]
        except (OSError, ValueError) as exc:
            report[name] = f"not set ({exc})"


def _drop_privileges(cfg, workdir, mount_ns, report):
    """Switch to a uid of our own; returns whether that happened."""
    if os.geteuid() != 0:
        report["user"] = f"same uid as the host ({os.geteuid()}): file permissions of the host user apply"
        return False
    hidden = _hidden_roots(_interpreter_paths())
    if hidden and not mount_ns:
        # Another uid could not import the rest of the standard library from there.
        report["user"] = (f"root, NOT dropped: the interpreter lies under {sorted(hidden)}, which another uid "
                          "cannot traverse, and no mount namespace was available to expose it")
        return False
    uid = gid = cfg["uid_base"] + os.getpid()
    os.chown(workdir, uid, gid)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    report["user"] = f"uid {uid} (own uid, no capabilities)"
    return True


def _no_new_privs(report):
    try:
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        report["no_new_privs"] = True
    except OSError as exc:
        report["no_new_privs"] = f"not set ({exc})"


# --- output capture ----------------------------------------------------------------------

class Capture:
    """A pipe on fd ``target`` drained by a thread: keeps ``head`` + ``tail`` bytes, counts the rest."""

    def __init__(self, target, limit):
        self.head_limit = limit - limit // 4
        self.tail_limit = limit // 4
        self.lock = threading.Lock()
        r, w = os.pipe()
        try:
            import fcntl

            fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        os.dup2(w, target)
        os.close(w)
        self.fd = r
        self.reset()

    def reset(self):
        with self.lock:
            self.head, self.tail, self.omitted = bytearray(), bytearray(), 0

    def start(self):
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        import select

        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while True:
            poller.poll()
            with self.lock:
                data = os.read(self.fd, 1 << 20)
                if not data:
                    return
                room = self.head_limit - len(self.head)
                if room > 0:
                    self.head += data[:room]
                    data = data[room:]
                if data:
                    self.tail += data
                    if len(self.tail) > self.tail_limit:
                        self.omitted += len(self.tail) - self.tail_limit
                        del self.tail[: len(self.tail) - self.tail_limit]

    def collect(self):
        """Wait until everything written so far was read, then return and clear it."""
        import fcntl
        import time

        buf = bytearray(4)
        while True:
            with self.lock:
                fcntl.ioctl(self.fd, FIONREAD, buf)
                if struct.unpack("i", buf)[0] == 0:
                    out = (self.head.decode(errors="replace"), self.tail.decode(errors="replace"),
                           self.omitted)
                    self.head, self.tail, self.omitted = bytearray(), bytearray(), 0
                    return out
            time.sleep(0.0005)


def _watchdog(req_fd, own_uid):
    """Kill every process of this sandbox when the host goes away (POLLHUP on its pipe)."""
    import select

    poller = select.poll()
    poller.register(req_fd, 0)  # only POLLHUP / POLLERR / POLLNVAL are reported
    poller.poll()
    try:
        if own_uid:  # never with the host's uid: kill(-1) would reach the host's processes
            os.kill(-1, signal.SIGKILL)
    finally:
        os.killpg(0, signal.SIGKILL)


# --- execution ---------------------------------------------------------------------------

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
        if isinstance(exc, SyntaxError):
            text = "".join(traceback.format_exception_only(type(exc), exc))
        else:
            text = "".join(traceback.format_exception(type(exc), exc, tb))
        return text, type(exc).__name__


def main():
    cfg = json.loads(sys.argv[1])
    req_fd, resp_fd = cfg["req_fd"], cfg["resp_fd"]
    report = {}
    try:
        workdir = None
        if cfg["isolate"] and os.geteuid() == 0:
            workdir = _setup_namespaces(cfg, report)
        elif cfg["isolate"]:
            report["network"] = "NOT isolated (host is not root)"
        mount_ns = workdir is not None
        if workdir is None:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="trace_gym_kernel_")
        for name in cfg["preload"]:
            __import__(name)
        _set_limits(cfg, report)
        own_uid = cfg["isolate"] and _drop_privileges(cfg, workdir, mount_ns, report)
        _no_new_privs(report)
        os.environ.clear()
        os.environ.update(cfg["env"], HOME=workdir, TMPDIR=workdir)
        os.chdir(workdir)
        os.umask(0o077)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        out, err = Capture(1, cfg["output_bytes"]), Capture(2, cfg["output_bytes"])
        out.start()
        err.start()
        threading.Thread(target=_watchdog, args=(req_fd, own_uid), daemon=True).start()
    except BaseException as exc:  # report instead of dying silently
        write_frame(resp_fd, {"op": "hello", "error": f"{type(exc).__name__}: {exc}", "protections": report})
        raise SystemExit(1)
    write_frame(resp_fd, {"op": "hello", "pid": os.getpid(), "uid": os.geteuid(), "own_uid": own_uid, "workdir": workdir,
                          "protections": report})

    import io

    stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                              errors="backslashreplace", write_through=True)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    cell_count = 0
    while True:
        try:
            msg = read_frame(req_fd)
        except EOFError:
            os._exit(0)
        if msg["op"] == "start":
            import random

            random.seed(msg["seed"])
            if "numpy" in sys.modules:
                sys.modules["numpy"].random.seed(msg["seed"] % (1 << 32))
            write_frame(resp_fd, {"op": "started", "seed": msg["seed"]})
            continue
        if msg["op"] != "exec":
            write_frame(resp_fd, {"op": "error", "error": f"unknown op {msg['op']!r}"})
            continue
        cell_count += 1
        sys.stdout, sys.stderr, sys.stdin = stdout, stderr, io.StringIO()
        error, error_name = _run_cell(msg["code"], f"<cell {cell_count}>", namespace)
        for stream in (sys.stdout, sys.stderr, stdout, stderr):
            try:
                stream.flush()
            except BaseException:  # a closed or replaced stream must not kill the kernel
                pass
        o_head, o_tail, o_omit = out.collect()
        e_head, e_tail, e_omit = err.collect()
        limit = cfg["output_bytes"]
        if error is not None and len(error) > limit:
            error = f"[... {len(error) - limit} characters of traceback omitted ...]\n" + error[-limit:]
        write_frame(resp_fd, {
            "op": "result", "id": msg["id"], "status": "ok" if error is None else "error",
            "stdout": [o_head, o_tail, o_omit], "stderr": [e_head, e_tail, e_omit],
            "error": error, "error_name": error_name,
        })


if __name__ == "__main__":
    main()
