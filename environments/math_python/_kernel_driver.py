"""The sandboxed kernel processes (run as a script; imports nothing of this project).

Process tree on a root host::

    host (any size)
     └─ zygote       ``python -I _kernel_driver.py CONFIG``: one per host process and preload
        │            set. Moves into a mount namespace whose root is a read-only tmpfs that
        │            shows only the system directories and the interpreter (never the
        │            project or task data), imports numpy/sympy there, then forks kernels.
        └─ supervisor  pid 1 of a fresh pid namespace, in fresh network, IPC (with
           │           limits) and mount namespaces (no interface up; private /proc,
           │           /tmp) and its own memory cgroup; root; holds the host's pipes;
           │           trusted code only
           └─ executor own uid (``uid_base`` + the supervisor's pid), rlimits,
                       ``no_new_privs``, a seccomp filter, a stacked root (no user
                       namespaces); runs the model's cells; its stdout/stderr and a
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

Memory: where a memory cgroup (v1 or v2) can be written, the zygote makes a group of
its own under its cgroup (``trace_gym_<pid>``), probes it, and gives every kernel a
child of it (``k<n>``, limit ``memory_mb + disk_mb``), which the supervisor joins before
anything else; the directory is removed when the kernel is reaped.

Each setup step that fails for lack of privilege is reported in the hello's
``protections``, never silently assumed; the hello's ``mechanisms`` says which of the
sandbox's mechanisms this zygote uses (``_kernel_proc.MECHANISMS``).
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


# --- memory cgroups: one per kernel ------------------------------------------------------

def _memory_cgroup_dir():
    """``(version, path)`` of this process's memory cgroup directory; raises OSError(why not)."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]

    def mounted(fstype, want):  # (mount root, mount point) of a cgroup fs with option ``want``
        for m in mounts:
            sep = m.index("-")
            if m[sep + 1] == fstype and (want is None or want in m[sep + 3].split(",")):
                return m[3], m[4]
        return None

    for version, fstype, want, match in (("v1", "cgroup", "memory", lambda c: "memory" in c.split(",")),
                                         ("v2", "cgroup2", None, lambda c: c == "")):
        own = next((path for _, controllers, path in lines if match(controllers)), None)
        mount_ = mounted(fstype, want)
        if own is None or mount_ is None:
            continue
        root, point = mount_
        if not (own == root or own.startswith(root.rstrip("/") + "/")):
            raise OSError(errno.ENOENT, f"this process's cgroup {own} is outside the mounted {fstype} tree")
        path = point + own[len(root.rstrip("/")):]
        if version == "v2":
            with open(os.path.join(path, "cgroup.subtree_control")) as f:
                if "memory" not in f.read().split():
                    raise OSError(errno.EPERM, f"the memory controller is not enabled below {path}")
        return version, path
    raise OSError(errno.ENOENT, "no memory cgroup controller is mounted")


def _is_zygote(pid):
    """Whether ``pid`` (host pid namespace) is a live kernel zygote."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(__file__).encode() in f.read()
    except OSError:
        return False


class MemoryCgroups:
    """Per-kernel memory cgroups below a group of this zygote, reached through a
    descriptor opened before the sandbox root hid ``/sys``."""

    FILES = {"v1": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.oom_control"),
             "v2": ("memory.max", "memory.swap.max", "memory.events")}

    def __init__(self, version, path):
        self.version, self.path = version, path
        self.limit_file, self.swap_file, self.events_file = self.FILES[version]
        self.name = f"trace_gym_{os.getpid()}"
        self.parent_fd = os.open(path, os.O_PATH | os.O_DIRECTORY)  # the path is gone once the root is built
        self._sweep(path)
        try:
            os.mkdir(self.name, 0o700, dir_fd=self.parent_fd)
            self.fd = os.open(self.name, os.O_PATH | os.O_DIRECTORY, dir_fd=self.parent_fd)
        except OSError:
            os.close(self.parent_fd)
            raise
        self.count = 0
        self.stale = []  # kernel directories still busy when their kernel was reaped
        try:
            if version == "v2":  # the kernels' directories get the memory controller
                self._write("cgroup.subtree_control", "+memory")
            name, procs, events = self.new(16)  # a probe: a group with a limit that reads back
            os.close(procs)
            os.close(events)
            with open(f"{name}/{self.limit_file}", opener=self._opener) as f:
                if int(f.read()) != 16 << 20:
                    raise OSError(errno.EIO, "the probe's limit did not read back")
            self.remove(name)
        except OSError:
            self.close()
            raise

    def _sweep(self, path):
        """Remove the groups that killed zygotes left here (a zygote removes its own on exit);
        a kernel that outlived its zygote keeps its directory until a later sweep."""
        for entry in os.listdir(path):
            pid = entry[len("trace_gym_"):]
            if not (entry.startswith("trace_gym_") and pid.isdigit()) or _is_zygote(int(pid)):
                continue
            group = os.path.join(path, entry)
            for name in [n for n in os.listdir(group) if n[:1] == "k" and n[1:].isdigit()] + [None]:
                try:
                    os.rmdir(group if name is None else os.path.join(group, name))
                except OSError:
                    pass

    def _opener(self, path, flags):
        return os.open(path, flags, dir_fd=self.fd)

    def _write(self, path, value):
        fd = os.open(path, os.O_WRONLY, dir_fd=self.fd)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def new(self, limit_mb):
        """A kernel's cgroup: ``(name, procs fd to write, events fd to read)``, limited to
        ``limit_mb`` MiB of memory (and no swap); raises OSError."""
        self.count += 1
        name = f"k{self.count}"
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
        except FileNotFoundError:  # the group was removed under us (a sweep that took it for a dead one's)
            os.close(self.fd)
            os.mkdir(self.name, 0o700, dir_fd=self.parent_fd)
            self.fd = os.open(self.name, os.O_PATH | os.O_DIRECTORY, dir_fd=self.parent_fd)
            if self.version == "v2":
                self._write("cgroup.subtree_control", "+memory")
            os.mkdir(name, 0o700, dir_fd=self.fd)
        try:
            self._write(f"{name}/{self.limit_file}", str(limit_mb << 20))
            try:  # v1: memory + swap (needs swap accounting); v2: swap alone
                self._write(f"{name}/{self.swap_file}", str(limit_mb << 20) if self.version == "v1" else "0")
            except FileNotFoundError:
                pass
            procs = os.open(f"{name}/cgroup.procs", os.O_WRONLY, dir_fd=self.fd)
            events = os.open(f"{name}/{self.events_file}", os.O_RDONLY, dir_fd=self.fd)
        except OSError:
            self.remove(name)
            raise
        return name, procs, events

    def remove(self, name):
        """Remove a kernel's cgroup (all its processes are gone); retried at the next call
        while the kernel still holds it."""
        for n in [name, *self.stale] if name else list(self.stale):
            try:
                os.rmdir(n, dir_fd=self.fd)
            except FileNotFoundError:
                pass
            except OSError:
                if n not in self.stale:
                    self.stale.append(n)
                continue
            if n in self.stale:
                self.stale.remove(n)

    def close(self):
        """Remove what is left and this zygote's group (busy ones stay: their kernels live)."""
        self.remove(None)
        os.close(self.fd)
        try:
            os.rmdir(self.name, dir_fd=self.parent_fd)
        except OSError:
            pass
        finally:
            os.close(self.parent_fd)


def setup_memory_cgroups(cfg, mechanisms):
    """This zygote's :class:`MemoryCgroups`, or ``None`` (the reason in ``mechanisms``)."""
    if "memory_cgroup" in cfg.get("disable", ()):
        mechanisms["memory_cgroup"] = "NOT active (left off): memory is bounded per process only"
        return None
    try:
        cgroups = MemoryCgroups(*_memory_cgroup_dir())
    except OSError as exc:
        mechanisms["memory_cgroup"] = f"NOT active ({exc}): memory is bounded per process only"
        return None
    mechanisms["memory_cgroup"] = (f"active (cgroup {cgroups.version}, {cgroups.path}/{cgroups.name}): each kernel "
                                   "holds at most memory_mb + disk_mb MB by any route")
    return cgroups


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
    def __init__(self, sock, cfg, report, isolated, cgroups=None):
        self.sock, self.cfg, self.report, self.isolated = sock, cfg, report, isolated
        self.cgroups = cgroups
        self.kernels = {}  # supervisor pid -> (own uid or None, memory cgroup name or None)
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
        cgroup = None
        if self.cgroups is not None:  # fail closed: no kernel without its memory cgroup
            limit_mb = int(limits["memory_mb"]) + int(limits["disk_mb"])
            name, procs, events = self.cgroups.new(limit_mb)
            cgroup = {"name": name, "procs_fd": procs, "events_fd": events, "limit_mb": limit_mb}
        try:
            if self.pidns:
                check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
            try:
                pid = os.fork()
            finally:
                if self.pidns and os.getpid() != 1:
                    check(_libc.setns(self.self_ns, CLONE_NEWPID), "setns(pid)")
        except OSError:
            if cgroup:
                os.close(cgroup["procs_fd"])
                os.close(cgroup["events_fd"])
                self.cgroups.remove(cgroup["name"])
            raise
        if pid == 0:
            try:
                self.sock.close()
                if self.self_ns is not None:
                    os.close(self.self_ns)
                kp.supervisor(fds[0], fds[1], limits, self.report, self.cfg, self.isolated, self.pidns, NAMESPACE,
                              cgroup)
            finally:
                os._exit(1)
        if cgroup:
            os.close(cgroup["procs_fd"])
            os.close(cgroup["events_fd"])
        self.kernels[pid] = (self.cfg["uid_base"] + pid if self.isolated else None, cgroup and cgroup["name"])
        return pid

    def kill(self, pid):
        if pid not in self.kernels:
            return False
        uid = self.kernels[pid][0]
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
            _, cgroup = self.kernels.pop(pid, (None, None))
            if self.cgroups is not None and cgroup:
                self.cgroups.remove(cgroup)
            if not self.isolated:
                import shutil

                shutil.rmtree(self.cfg["workdirs"] + f"/kernel_{pid}", ignore_errors=True)

    def serve(self):
        while True:
            ready = kp.ready([self.sock], [], 0.5)[0]
            self.reap()
            if self.cgroups is not None and self.cgroups.stale:  # kernels whose last processes were still exiting
                self.cgroups.remove(None)
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
        if self.cgroups is not None:
            for pid, (_, cgroup) in list(self.kernels.items()):  # a killed pid 1 is reaped once its namespace is empty
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                self.cgroups.remove(cgroup)
            self.cgroups.close()


def main():
    # the config comes as the first message: /proc/PID/cmdline is readable by every kernel
    sock = socket.socket(fileno=int(sys.argv[1]))
    cfg = json.loads(sock.recv(1 << 22).decode())
    report = {}
    mechanisms = {}
    isolated = bool(cfg["isolate"]) and os.geteuid() == 0
    disabled = set(cfg.get("disable", ()))
    cgroups = None
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of kernels are reaped here
        cgroups = setup_memory_cgroups(cfg, mechanisms)  # before the sandbox root hides /sys
        report["memory_cgroup"] = mechanisms["memory_cgroup"]
        why_not = "left off" if "seccomp" in disabled else kp.probe_seccomp()
        cfg["seccomp"] = True if why_not is None else why_not
        mechanisms["seccomp"] = ("active: the cell's processes may not call memfd_create, create namespaces "
                                 "(user namespaces included) or, without a bounded IPC namespace, use SysV IPC"
                                 if why_not is None else f"NOT active ({why_not})")
        if not isolated:
            mechanisms["private_ipc"] = "NOT active (host is not root, or isolation is off): the host's IPC namespace"
        elif "ipc_limits" in disabled:
            mechanisms["private_ipc"] = "a private IPC namespace per kernel, its limits left off"
        else:
            mechanisms["private_ipc"] = "a private IPC namespace per kernel, SysV shared memory at most disk_mb MB"
        guards = (["seccomp"] if why_not is None else []) + (
            ["the stacked root"] if isolated and "stacked_root" not in disabled else [])
        mechanisms["user_namespaces"] = ("refused by " + " and ".join(guards) if guards else
                                         "NOT refused: a cell can create one and mount a tmpfs of its own")
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
        zygote = Zygote(sock, cfg, report, isolated, cgroups)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except BaseException as exc:  # report instead of dying silently
        if cgroups is not None:
            cgroups.close()
        sock.send(json.dumps({"op": "hello", "error": f"{type(exc).__name__}: {exc}", "protections": report,
                              "mechanisms": mechanisms}).encode())
        raise SystemExit(1)
    sock.send(json.dumps({"op": "hello", "pid": os.getpid(), "protections": report, "mechanisms": mechanisms,
                          "cgroup_dir": cgroups and f"{cgroups.path}/{cgroups.name}"}).encode())
    zygote.serve()
    if not isolated:
        import shutil

        shutil.rmtree(cfg["workdirs"], ignore_errors=True)


if __name__ == "__main__":
    main()
