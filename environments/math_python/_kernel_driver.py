"""The sandboxed kernel processes (run as a script; imports nothing of this project).

Process tree on a root host::

    host (any size)
     └─ zygote       ``python -I _kernel_driver.py CONFIG``: one per host process and preload
        │            set. Moves into a mount namespace whose root is a read-only tmpfs that
        │            shows only the system directories and the interpreter (never the
        │            project or task data), imports numpy/sympy there, then forks kernels.
        └─ supervisor  pid 1 of a fresh pid namespace, in fresh network and mount
           │           namespaces (no interface up; private /proc, /tmp); root; holds the
           │           host's pipes; trusted code only
           └─ executor own uid (``uid_base`` + the supervisor's pid), rlimits,
                       ``no_new_privs``; runs the model's cells; its stdout/stderr and a
                       result pipe go to the supervisor, never to the host

The host starts it as ``python -I _kernel_driver.py FD`` and sends its configuration as
the first message on the ``SOCK_SEQPACKET`` socket ``FD``. Then it asks: ``{"op": "fork", "limits":
{...}}`` with the kernel's two pipe ends attached (``SCM_RIGHTS``), answered by
``{"op": "forked", "pid": P}``; ``{"op": "kill", "pid": P}`` SIGKILLs a supervisor, and
with it (pid namespace) every process of that kernel. Frames between host and
supervisor, and between supervisor and executor, are a 4-byte big-endian length and
UTF-8 JSON.

The protocol channel belongs to the host: model code runs in the executor, which has
no descriptor of the host. What it sends the supervisor (one ``done`` message per cell)
is checked field by field; anything else ends the executor (a crashed cell), and the
supervisor alone writes host frames, from values it built itself. Output is captured by
the supervisor (head + tail kept, the rest counted); output that arrives between cells
is reported apart, as background output.

Each setup step that fails for lack of privilege is reported in the hello's
``protections``, never silently assumed.
"""

import errno
import json
import os
import platform
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # loaded before the project is hidden
import _kernel_proc as kp  # noqa: E402

sys.path.pop(0)

CLONE_NEWNS, CLONE_NEWPID = 0x20000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_CHILD_SUBREAPER = 36
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = kp._libc
check, mount, prctl = kp.check, kp.mount, kp.prctl


# --- the zygote's view of the filesystem -----------------------------------------------

def _covered(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _exposed_paths(hide):
    """Directories the sandbox shows (read-only): system directories and the interpreter's."""
    interp = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable))]
    interp += [p for p in sys.path if p and os.path.isdir(p)]
    paths = []
    for p in sorted({os.path.realpath(p) for p in interp}, key=len):
        if not _covered(p, paths) and p not in hide and not _covered(p, SYSTEM_DIRS):
            paths.append(p)
    return paths


def _traverse_only(prefix, paths):
    """Make the directories created as parents of ``paths`` (below ``prefix``) traversable
    but not listable (0711): a venv inside the checkout must not show the checkout's
    layout, let alone its files (the interpreter's own directories stay readable)."""
    mounted = set(paths)
    for p in paths:
        parent = os.path.dirname(p)
        while parent not in ("/", "") and parent not in mounted:
            if os.path.isdir(prefix + parent):
                os.chmod(prefix + parent, 0o711)
            parent = os.path.dirname(parent)


def build_root(cfg, report):
    """Private mount namespace whose root is a read-only tmpfs holding only what the
    interpreter needs; the host's project and task data are not in it."""
    check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    hide = [os.path.realpath(p) for p in cfg.get("hide", ())]
    exposed = _exposed_paths(hide)
    # open everything before the staging tmpfs may shadow it (an interpreter under /tmp)
    sources = {}
    for p in [d for d in SYSTEM_DIRS if os.path.lexists(d)] + exposed + ["/proc"]:
        sources[p] = os.readlink(p) if os.path.islink(p) else os.open(p, os.O_PATH | os.O_DIRECTORY)
    devices = {d: os.open(f"/dev/{d}", os.O_PATH) for d in DEVICES if os.path.exists(f"/dev/{d}")}
    stage = "/tmp"
    mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for p, src in sources.items():
        target = stage + p
        if isinstance(src, str):  # /bin -> usr/bin on merged-/usr systems
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(src, target)
            continue
        os.makedirs(target, mode=0o755, exist_ok=True)
        flags = MS_NOSUID | MS_NODEV | (MS_NOEXEC if p == "/proc" else 0)
        mount(f"/proc/self/fd/{src}", target, None, MS_BIND | MS_REC)
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | flags)
        os.close(src)
    masked = [h for h in hide if _covered(h, exposed + [d for d in SYSTEM_DIRS if d in sources])]
    for h in masked:  # a project installed inside an exposed directory (site-packages)
        if os.path.isdir(stage + h):
            mount("tmpfs", stage + h, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
        elif os.path.exists(stage + h):
            mount(f"/proc/self/fd/{devices['null']}", stage + h, None, MS_BIND)
    os.makedirs(stage + "/dev", 0o755)
    for name, fd in devices.items():
        open(f"{stage}/dev/{name}", "w").close()
        mount(f"/proc/self/fd/{fd}", f"{stage}/dev/{name}", None, MS_BIND)
        os.close(fd)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{stage}/dev/{name}")
    os.makedirs(stage + "/tmp", 0o755, exist_ok=True)  # exists already when the interpreter lives under /tmp
    _traverse_only(stage, [p for p, src in sources.items() if not isinstance(src, str)])
    # the kernel's private /tmp tmpfs would shadow these: the supervisor binds them back
    cfg["under_tmp"] = [p for p in exposed if p.startswith("/tmp/") and p in sources]
    mount(None, stage, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    os.chdir(stage)
    try:  # pivot_root detaches the host's tree; where it is refused (an initramfs root), chroot
        if SYS_PIVOT_ROOT is None:
            raise OSError(errno.ENOSYS, "no pivot_root number for this machine")
        check(_libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
        check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    except OSError:
        os.chroot(".")  # the executor has no capability, and no descriptor outside, to leave it
    os.chdir("/")
    sys.path[:] = [p for p in sys.path if p and os.path.isdir(p)]
    report["filesystem"] = ("read-only: " + ", ".join(d for d in SYSTEM_DIRS if d in sources) + ", the interpreter ("
                            + ", ".join(exposed) + "); writable: only the workdir /tmp/work (private tmpfs, "
                            f"{cfg.get('disk_mb', 64)} MB); nothing else of the host")
    report["hidden"] = sorted(hide)


# --- zygote: the fork server -----------------------------------------------------------

NAMESPACE = {"__name__": "__main__", "__builtins__": __builtins__}


def _sweep_uid(uid):
    """SIGKILL every process of ``uid`` (used only where no pid namespace holds the kernel)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(20):
                os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


class Zygote:
    def __init__(self, sock, cfg, report, isolated):
        self.sock, self.cfg, self.report, self.isolated = sock, cfg, report, isolated
        self.kernels = {}  # supervisor pid -> own uid (None: no uid of its own)
        self.pidns = False
        self.self_ns = None
        if isolated:
            try:  # can we give each kernel a pid namespace? (undone at once)
                self.self_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
                check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
                check(_libc.setns(self.self_ns, CLONE_NEWPID), "setns(pid)")
                self.pidns = True
            except OSError as exc:
                report["processes"] = f"no pid namespace ({exc}); kills sweep the kernel's uid"

    def fork(self, limits, fds):
        if self.pidns:
            check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        try:
            pid = os.fork()
        finally:
            if self.pidns and os.getpid() != 1:
                check(_libc.setns(self.self_ns, CLONE_NEWPID), "setns(pid)")
        if pid == 0:
            try:
                self.sock.close()
                if self.self_ns is not None:
                    os.close(self.self_ns)
                kp.supervisor(fds[0], fds[1], limits, self.report, self.cfg, self.isolated, self.pidns, NAMESPACE)
            finally:
                os._exit(1)
        self.kernels[pid] = self.cfg["uid_base"] + pid if self.isolated else None
        return pid

    def kill(self, pid):
        if pid not in self.kernels:
            return False
        uid = self.kernels[pid]
        try:
            os.kill(pid, signal.SIGKILL)  # pid 1 of its namespace: every process of the kernel dies
            if not self.pidns:
                os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if not self.pidns and uid is not None:
            _sweep_uid(uid)
        return True

    def reap(self):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.kernels.pop(pid, None)
            if not self.isolated:
                import shutil

                shutil.rmtree(self.cfg["workdirs"] + f"/kernel_{pid}", ignore_errors=True)

    def serve(self):
        while True:
            ready = kp.ready([self.sock], [], 0.5)[0]
            self.reap()
            if not ready:
                continue
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            try:
                msg = json.loads(data.decode())
                if msg["op"] == "fork":
                    reply = {"op": "forked", "pid": self.fork(msg["limits"], fds)}
                elif msg["op"] == "kill":
                    reply = {"op": "killed", "known": self.kill(msg["pid"])}
                else:
                    reply = {"op": "error", "error": f"unknown op {msg['op']!r}"}
            except Exception as exc:  # noqa: BLE001 - a bad request must not end the server
                reply = {"op": "error", "error": f"{type(exc).__name__}: {exc}"}
            finally:
                for fd in fds:
                    os.close(fd)
            self.sock.send(json.dumps(reply).encode())
        for pid in list(self.kernels):  # the host is gone: so are its kernels
            self.kill(pid)


def main():
    # the config comes as the first message: /proc/PID/cmdline is readable by every kernel
    sock = socket.socket(fileno=int(sys.argv[1]))
    cfg = json.loads(sock.recv(1 << 22).decode())
    report = {}
    isolated = bool(cfg["isolate"]) and os.geteuid() == 0
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of kernels are reaped here
        if isolated:
            try:
                build_root(cfg, report)
            except OSError as exc:  # fail closed: never run model code unsandboxed by surprise
                raise OSError(exc.errno, f"the sandbox root could not be built ({exc}); run kernels without "
                                         "it only knowingly: isolate=False") from exc
        else:
            report["filesystem"] = "NOT isolated (host is not root, or isolation is off): the host user's view"
            import tempfile

            cfg["workdirs"] = tempfile.mkdtemp(prefix="trace_gym_kernels_")
        for name in cfg["preload"]:
            __import__(name)
        if "numpy" in sys.modules:
            __import__("numpy.random")  # lazy in numpy 2: else each kernel pays it when seeded
        if cfg.get("warmup"):
            exec(compile(cfg["warmup"], "<warmup>", "exec"), NAMESPACE)
        zygote = Zygote(sock, cfg, report, isolated)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except BaseException as exc:  # report instead of dying silently
        sock.send(json.dumps({"op": "hello", "error": f"{type(exc).__name__}: {exc}", "protections": report}).encode())
        raise SystemExit(1)
    sock.send(json.dumps({"op": "hello", "pid": os.getpid(), "protections": report}).encode())
    zygote.serve()
    if not isolated:
        import shutil

        shutil.rmtree(cfg["workdirs"], ignore_errors=True)


if __name__ == "__main__":
    main()
