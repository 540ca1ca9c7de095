"""A forked kernel's set-up: its supervisor, then its executor, in that order of trust.

The supervisor is pid 1 of the kernel's pid namespace, root, in fresh network, IPC and
mount namespaces and in the kernel's memory and CPU cgroups, and owns the host's two
pipes; it runs trusted code only. It applies, in order: the memory cgroup (:mod:`.cgroups`),
the CPU cgroup (:mod:`.cpu`; without a pid namespace it becomes the kernel's subreaper),
no network (a network namespace with no interface up), a private IPC namespace with
limits (:mod:`.ipc_limits`), a private ``/proc`` and ``/tmp`` and the stacked root
(:mod:`.root`). Then it forks the executor (:mod:`.executor`), which bounds itself
further, waits for its ``ready``, sends the host its ``hello`` (what each protection
came to) and relays (:mod:`.relay`). Each step that fails for lack of privilege is
reported, never silently assumed.
"""

import fcntl
import json
import os
import signal
import struct

from .cgroups import join_memory_cgroup
from .channel import close_all_but, ready, write_frame
from .cpu import CpuMeter, join_cpu_cgroup, kill_tree
from .executor import executor
from .ipc_limits import describe_ipc_limits, set_ipc_limits
from .libc import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, LIBC, MS_NODEV, MS_NOEXEC, MS_NOSUID,
                   PR_SET_CHILD_SUBREAPER, check, mount, prctl)
from .relay import Supervisor, death_cause
from .rlimits import set_oom_score_adj
from .root import private_tmp, stack_root


def supervisor(host_req, host_resp, limits, base_report, cfg, isolated, pidns, namespace, cgroup=None, cpu=None):
    """Body of a forked kernel: namespaces, the executor, then the relay loop. Never returns.

    ``cgroup``: the kernel's memory cgroup (``procs_fd`` to join it, ``events_fd`` to
    read its OOM kills, ``limit_mb``), made by the zygote; ``None`` where there is none.
    ``cpu``: its CPU cgroup (``procs_fd`` to join it, or ``None`` when it is the memory
    cgroup; ``usage_fd``, ``version``: :mod:`.cpu`); ``None`` where there is none.
    """
    report = dict(base_report)
    disabled = set(cfg.get("disable", ()))
    try:
        _enter_cgroups(host_req, host_resp, limits, report, cgroup, cpu)
        gpid = int(os.readlink("/proc/self")) if pidns else os.getpid()
        if isolated:
            uid, workdir, ipc_bounded, stacked = _isolate(limits, cfg, report, disabled, pidns, gpid)
        else:
            report["network"] = "NOT isolated (host is not root, or isolation is off)"
            uid, ipc_bounded, stacked = None, False, False
            workdir = cfg["workdirs"] + f"/kernel_{gpid}"
            os.mkdir(workdir, 0o700)
        report.update(_sharing_report(report, pidns, ipc_bounded, cfg.get("seccomp"), limits))
        sandbox = {"seccomp": cfg.get("seccomp", "not probed"), "refuse_sysv_ipc": not ipc_bounded}
        child, relay_fds = _start_executor(limits, uid, workdir, cfg["env"], namespace, report, sandbox)
        first = _await_ready(relay_fds[1], child, limits)
        if "error" in first:
            raise RuntimeError(first["error"])
        protections = first["protections"]
        protections["user_namespaces"] = _user_namespace_guard(protections.get("seccomp", ""), stacked)
        write_frame(host_resp, {"op": "hello", "pid": gpid, "uid": os.geteuid() if uid is None else uid,
                                "own_uid": uid is not None, "workdir": workdir, "protections": protections})
        meter = CpuMeter(cpu["usage_fd"], cpu["version"]) if cpu else CpuMeter()
        Supervisor(host_req, host_resp, limits, child, relay_fds, cgroup, meter).serve()
    except SystemExit:
        pass
    except BaseException as exc:  # report instead of dying silently
        try:
            write_frame(host_resp, {"op": "hello", "error": f"{type(exc).__name__}: {exc}", "protections": report})
        except OSError:
            pass
    try:
        os.kill(-1, signal.SIGKILL) if os.getpid() == 1 else kill_tree(os.getpid())  # a subreaper: setsid'd ones too
    finally:
        os._exit(0)


def _enter_cgroups(host_req, host_resp, limits, report, cgroup, cpu):
    """Close every inherited fd but the host's pipes and the cgroups' files, join the
    memory and CPU cgroups, and (outside a pid namespace) become the kernel's subreaper."""
    # No parent-death signal: a dead zygote must not take live kernels with it. The
    # kernel ends when the host closes (or loses) its pipes, or the zygote kills it.
    keep = {host_req, host_resp} | ({cgroup["procs_fd"], cgroup["events_fd"]} if cgroup else set())
    close_all_but(keep | ({cpu["procs_fd"], cpu["usage_fd"]} - {None} if cpu else set()))
    join_memory_cgroup(cgroup, limits, report)
    join_cpu_cgroup(cpu, limits, report)
    if os.getpid() != 1:
        os.setsid()
        prctl(PR_SET_CHILD_SUBREAPER, 1)  # the kernel's orphans stay below it: its CPU is summed over them


def _isolate(limits, cfg, report, disabled, pidns, gpid):
    """Own network, IPC and mount namespaces, a private ``/proc`` and ``/tmp``, the
    stacked root last. Returns ``(uid, workdir, ipc_bounded, stacked)``."""
    ipc_private = False
    try:
        check(LIBC.unshare(CLONE_NEWNET | CLONE_NEWIPC), "unshare(CLONE_NEWNET | CLONE_NEWIPC)")
        report["network"] = "none (own network and IPC namespaces, no interface up)"
        ipc_private = True
    except OSError as exc:
        report["network"] = f"NOT isolated ({exc})"
    check(LIBC.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    if pidns:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    set_oom_score_adj(-999)  # the OOM killer takes the cell's processes first (it still can take this one)
    ipc_bounded = ipc_private and _bound_ipc(limits, report, "ipc_limits" in disabled)
    workdir = private_tmp(limits, cfg.get("under_tmp", ()))
    uid = cfg["uid_base"] + gpid
    stacked = False
    if "stacked_root" not in disabled:
        stacked = stack_root(report)  # last mount
    return uid, workdir, ipc_bounded, stacked


def _bound_ipc(limits, report, limits_off):
    """Set the private IPC namespace's limits unless ``limits_off``; True when they are set."""
    if limits_off:
        report["ipc"] = "private IPC namespace (it ends with the kernel), limits left off"
        return False
    try:  # a writable /proc of this IPC namespace: the pid namespace's own
        set_ipc_limits(limits)
        return True
    except OSError as exc:
        report["ipc"] = f"private IPC namespace, limits NOT set ({exc})"
        return False


def _sharing_report(report, pidns, ipc_bounded, seccomp, limits):
    """The ``processes`` and ``ipc`` lines of the hello, from what set-up came to."""
    if pidns:
        processes = "own pid namespace: the kernel sees and can signal only its own processes"
    else:
        processes = report.get("processes", "shares the host's pid namespace")
    if ipc_bounded:
        ipc = describe_ipc_limits(limits)
    elif seccomp is True:
        ipc = report.get("ipc", "the host's IPC namespace") + "; SysV IPC and POSIX queues refused by seccomp"
    else:
        ipc = report.get("ipc", "the host's IPC namespace") + "; NOT bounded"
    return {"processes": processes, "ipc": ipc}


def _user_namespace_guard(seccomp, stacked):
    """What refuses a cell its own user namespace: seccomp (when it ``refuses``), the stacked root."""
    guards = (["seccomp"] if seccomp.startswith("refuses") else []) + (
        ["the executor's stacked root (a chroot to the kernel)"] if stacked else [])
    return ("refused by " + " and ".join(guards) if guards else
            "NOT refused: a cell can create a user namespace and mount its own tmpfs")


def _start_executor(limits, uid, workdir, env, namespace, report, sandbox):
    """Fork the executor on fresh pipes and arm the SIGCHLD wake-up. Returns its pid and
    the supervisor's ends ``(e_req_w, e_res_r, out_r, err_r, wake_r)``, all non-blocking."""
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
            executor(e_req_r, e_res_w, limits, uid, workdir, env, namespace, report, sandbox)
        finally:
            os._exit(1)
    for fd in (e_req_r, e_res_w, out_w, err_w):
        os.close(fd)
    for fd in (e_req_w, e_res_r, out_r, err_r, wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    return child, (e_req_w, e_res_r, out_r, err_r, wake_r)


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
            return {"error": f"the executor died during set-up ({death_cause(status, limits)[0]})"}
        if chunk:
            buf += chunk
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            return json.loads(bytes(buf[4:4 + struct.unpack(">I", buf[:4])[0]]).decode())
