"""The sandboxed kernel processes (run as a script; imports nothing of this project).

Process tree on a root host::

    host (any size)
     └─ zygote       ``python -I _kernel_driver.py FD``: one per host process and preload
        │            set. Moves into a mount namespace whose root is a read-only tmpfs that
        │            shows only the system directories and the interpreter (never the
        │            project or task data), imports numpy/sympy there, then forks kernels.
        └─ supervisor  pid 1 of a fresh pid namespace, in fresh network, IPC (with
           │           limits) and mount namespaces (no interface up; private /proc,
           │           /tmp) and its own memory and CPU cgroups; root; holds the host's pipes;
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
anything else; the directory is removed when the kernel is reaped. CPU: the same for a
CPU accounting group (v1 ``cpuacct``; in v2 the memory group itself), whose usage the
supervisor reads to hold all the kernel's processes to ``cpu_time_s`` together
(``_kernel.cpu``; without one it sums the kernel's process tree from ``/proc``).

Each setup step that fails for lack of privilege is reported in the hello's
``protections``, never silently assumed; the hello's ``mechanisms`` says which of the
sandbox's mechanisms this zygote uses (``_kernel.MECHANISMS``).

The mechanisms live in the package ``_kernel`` next to this script, one module each
(its docstring lists them); this file is the zygote itself: the fork server's loop and
its start-up.
"""

import json
import os
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # loaded before the project is hidden
from _kernel.cgroups import setup_memory_cgroups  # noqa: E402
from _kernel.cpu import kill_tree, setup_cpu_cgroups  # noqa: E402
from _kernel.channel import ready  # noqa: E402
from _kernel.libc import CLONE_NEWPID, LIBC, PR_SET_CHILD_SUBREAPER, check, prctl  # noqa: E402
from _kernel.root import build_root  # noqa: E402
from _kernel.seccomp import probe_seccomp  # noqa: E402
from _kernel.supervisor import supervisor  # noqa: E402

sys.path.pop(0)


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
    """The fork server's state and loop: forks kernels on request (each with its memory
    cgroup and, where it can, its own pid namespace), kills and reaps them."""

    def __init__(self, sock, cfg, report, isolated, cgroups=None, cpu=None):
        self.sock, self.cfg, self.report, self.isolated = sock, cfg, report, isolated
        self.cgroups, self.cpu = cgroups, cpu
        self.kernels = {}  # supervisor pid -> (own uid or None, memory cgroup name or None, CPU cgroup name or None)
        self.pidns = False
        self.self_ns = None
        if isolated:
            try:  # can we give each kernel a pid namespace? (undone at once)
                self.self_ns = os.open("/proc/self/ns/pid", os.O_RDONLY)
                check(LIBC.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
                check(LIBC.setns(self.self_ns, CLONE_NEWPID), "setns(pid)")
                self.pidns = True
            except OSError as exc:
                report["processes"] = f"no pid namespace ({exc}); kills sweep the kernel's uid"

    def _groups(self, limits):
        """The new kernel's memory and CPU cgroups (dicts of descriptors, or ``None`` where
        there are none); raises OSError: no kernel without the groups this zygote has."""
        cgroup = cpu = None
        if self.cgroups is not None:
            limit_mb = int(limits["memory_mb"]) + int(limits["disk_mb"])
            name, procs, events = self.cgroups.new(limit_mb)
            cgroup = {"name": name, "procs_fd": procs, "events_fd": events, "limit_mb": limit_mb}
        if self.cpu is not None:
            try:
                name, procs, usage = self.cpu.new(cgroup and cgroup["name"])
            except OSError:
                self._drop(cgroup, None)
                raise
            cpu = {"name": name, "procs_fd": procs, "usage_fd": usage, "version": self.cpu.version}
        return cgroup, cpu

    def _drop(self, cgroup, cpu):
        """Close the zygote's descriptors of a kernel's groups; remove the groups too if
        the kernel was never forked (``cpu``/``cgroup`` may be ``None``)."""
        for group, fds in ((cgroup, ("procs_fd", "events_fd")), (cpu, ("procs_fd", "usage_fd"))):
            for key in fds if group else ():
                if group[key] is not None:
                    os.close(group[key])

    def fork(self, limits, fds):
        cgroup, cpu = self._groups(limits)  # fail closed: no kernel without its cgroups
        try:
            if self.pidns:
                check(LIBC.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
            try:
                pid = os.fork()
            finally:
                if self.pidns and os.getpid() != 1:
                    check(LIBC.setns(self.self_ns, CLONE_NEWPID), "setns(pid)")
        except OSError:
            self._drop(cgroup, cpu)
            if cgroup:
                self.cgroups.remove(cgroup["name"])
            if cpu and cpu["name"]:
                self.cpu.remove(cpu["name"])
            raise
        if pid == 0:
            try:
                self.sock.close()
                if self.self_ns is not None:
                    os.close(self.self_ns)
                supervisor(fds[0], fds[1], limits, self.report, self.cfg, self.isolated, self.pidns, NAMESPACE,
                           cgroup, cpu)
            finally:
                os._exit(1)
        self._drop(cgroup, cpu)
        self.kernels[pid] = (self.cfg["uid_base"] + pid if self.isolated else None, cgroup and cgroup["name"],
                             cpu and cpu["name"])
        return pid

    def kill(self, pid):
        if pid not in self.kernels:
            return False
        uid = self.kernels[pid][0]
        if not self.pidns:  # the supervisor is the subreaper of its processes: setsid'd ones too
            kill_tree(pid)
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
            _, cgroup, cpu = self.kernels.pop(pid, (None, None, None))
            if self.cgroups is not None and cgroup:
                self.cgroups.remove(cgroup)
            if self.cpu is not None and cpu:
                self.cpu.remove(cpu)
            if not self.isolated:
                import shutil

                shutil.rmtree(self.cfg["workdirs"] + f"/kernel_{pid}", ignore_errors=True)

    def serve(self):
        while True:
            readable = ready([self.sock], [], 0.5)[0]
            self.reap()
            for groups in (self.cgroups, self.cpu):  # kernels whose last processes were still exiting
                if groups is not None and groups.stale:
                    groups.remove(None)
            if not readable:
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
        if self.cgroups is not None or self.cpu is not None:
            # a killed pid 1 is reaped once its namespace is empty
            for pid, (_, cgroup, cpu) in list(self.kernels.items()):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                if self.cgroups is not None and cgroup:
                    self.cgroups.remove(cgroup)
                if self.cpu is not None and cpu:
                    self.cpu.remove(cpu)
        for groups in (self.cgroups, self.cpu):
            if groups is not None:
                groups.close()


def main():
    # the config comes as the first message: /proc/PID/cmdline is readable by every kernel
    sock = socket.socket(fileno=int(sys.argv[1]))
    cfg = json.loads(sock.recv(1 << 22).decode())
    report = {}
    mechanisms = {}
    isolated = bool(cfg["isolate"]) and os.geteuid() == 0
    disabled = set(cfg.get("disable", ()))
    cgroups = cpu = None
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of kernels are reaped here
        cgroups = setup_memory_cgroups(cfg, mechanisms)  # before the sandbox root hides /sys
        report["memory_cgroup"] = mechanisms["memory_cgroup"]
        cpu = setup_cpu_cgroups(cfg, mechanisms, cgroups)
        report["cpu_cgroup"] = mechanisms["cpu_cgroup"]
        why_not = "left off" if "seccomp" in disabled else probe_seccomp()
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
        zygote = Zygote(sock, cfg, report, isolated, cgroups, cpu)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except BaseException as exc:  # report instead of dying silently
        for groups in (cpu, cgroups):
            if groups is not None:
                groups.close()
        sock.send(json.dumps({"op": "hello", "error": f"{type(exc).__name__}: {exc}", "protections": report,
                              "mechanisms": mechanisms}).encode())
        raise SystemExit(1)
    sock.send(json.dumps({"op": "hello", "pid": os.getpid(), "protections": report, "mechanisms": mechanisms,
                          "cgroup_dirs": [f"{g.path}/{g.name}" for g in (cgroups, cpu and cpu.tree and cpu) if g]}
                         ).encode())
    zygote.serve()
    if not isolated:
        import shutil

        shutil.rmtree(cfg["workdirs"], ignore_errors=True)


if __name__ == "__main__":
    main()
