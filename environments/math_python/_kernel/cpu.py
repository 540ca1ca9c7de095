"""The CPU time of a whole kernel: all its processes, during and between cells, together.

``RLIMIT_CPU`` (:mod:`.rlimits`) bounds each process: a chain of processes that each
fork and exit before their limit, or a background process started by one cell, burns
without end. Here the kernel's supervisor measures the CPU seconds of *all* the kernel's
processes together, every :data:`CHECK_S` seconds (it is awake anyway), and once they
pass ``cpu_time_s`` it kills every process of the kernel (the executor's death is then
reported as ``CPULimit``). Two meters, the exact one where the machine has it:

``cgroup``  a CPU accounting cgroup per kernel (v1 ``cpuacct.usage``, or v2 ``cpu.stat``
            ``usage_usec``: in v2 the kernel's memory cgroup, where there is one), made
            by the zygote like the memory cgroups (``trace_gym_<pid>/k<n>``), joined by
            the supervisor before anything else: the kernel's every process, and the
            CPU of processes long gone, whoever reaped them.
``tree``    (no writable CPU cgroup) the supervisor sums, from ``/proc``, the user and
            system time of itself and every live process below it, each with the time
            of the children it reaped (``cutime``/``cstime``). The supervisor is the
            kernel's reaper of orphans (pid 1 of its pid namespace, else a child
            subreaper), so a process that outlives its parent is still below it, and
            the CPU of a dead process lives on in whoever waited for it. Approximate:
            a process that dies between two reads may be counted twice in one read,
            and the CPU of a child its parent never waits for (``SIGCHLD`` ignored,
            ``SA_NOCLDWAIT``: Linux then adds it to no one) counts only while it lives.

The overshoot is what the kernel burns in one check interval (at most ``CHECK_S`` per
core it holds), plus the time the supervisor itself waits for a core.
"""

import errno
import os
import signal

from .cgroups import GroupTree, cgroup_dir

#: seconds between two readings of a kernel's CPU time
CHECK_S = 0.25
_TICK = os.sysconf("SC_CLK_TCK")


class CpuCgroups:
    """Per-kernel CPU accounting groups of this zygote: its own :class:`GroupTree` (v1
    ``cpuacct``, or v2 without a memory cgroup), or, in v2 with one, the kernels' memory
    cgroups themselves (a v2 process is in one group of one tree)."""

    def __init__(self, version, path, memory=None):
        self.version, self.path = version, path
        self.usage_file = "cpuacct.usage" if version == "v1" else "cpu.stat"
        self.shared = memory if memory is not None and memory.version == "v2" and version == "v2" else None
        self.tree = None if self.shared else GroupTree(version, path)
        self.name = self.shared.name if self.shared else self.tree.name
        if self.tree is not None:
            try:
                name, procs, usage = self.new()  # a probe: a group whose usage reads back
                os.close(procs)
                if usage_seconds(usage, self.version) is None:
                    raise OSError(errno.EIO, f"the probe's {self.usage_file} did not read back")
                os.close(usage)
                self.remove(name)
            except OSError:
                self.close()
                raise

    @property
    def stale(self):
        return self.tree.stale if self.tree else []

    def new(self, memory_group=None):
        """A kernel's CPU group: ``(name, procs fd to write or None, usage fd to read)``; in
        the shared case the kernel's memory group ``memory_group``, which it joins anyway."""
        if self.shared:
            return None, None, os.open(f"{memory_group}/{self.usage_file}", os.O_RDONLY, dir_fd=self.shared.fd)
        name = self.tree.make()
        try:
            procs = os.open(f"{name}/cgroup.procs", os.O_WRONLY, dir_fd=self.tree.fd)
            usage = os.open(f"{name}/{self.usage_file}", os.O_RDONLY, dir_fd=self.tree.fd)
        except OSError:
            self.remove(name)
            raise
        return name, procs, usage

    def remove(self, name):
        if self.tree:
            self.tree.remove(name)

    def close(self):
        if self.tree:
            self.tree.close()


def setup_cpu_cgroups(cfg, mechanisms, memory=None):
    """This zygote's :class:`CpuCgroups`, or ``None``; what the kernels get in ``mechanisms``."""
    why = "left off" if "cpu_cgroup" in cfg.get("disable", ()) else None
    cgroups = None
    if why is None:
        try:
            cgroups = CpuCgroups(*cgroup_dir("cpuacct"), memory=memory)
        except OSError as exc:
            why = str(exc)
    if cgroups is None:
        mechanisms["cpu_cgroup"] = (f"NOT active ({why}): the supervisor sums the CPU time of the kernel's process "
                                    "tree from /proc instead (approximate: a child its parent never waits for counts "
                                    "only while it lives)")
        return None
    where = f"{cgroups.path}/{cgroups.name}" + (" (the memory cgroups)" if cgroups.shared else "")
    mechanisms["cpu_cgroup"] = (f"active (cgroup {cgroups.version}, {where}): each kernel's processes together use "
                                "at most cpu_time_s CPU seconds, during and between cells; past it all are killed")
    return cgroups


def join_cpu_cgroup(cpu, limits, report):
    """Move this process (and so every process it will fork) into the kernel's CPU group
    (``cpu["procs_fd"]``, closed here; ``None`` when it shares the memory cgroup), and
    say in ``report["cpu"]`` how the kernel's CPU is bounded. Raises OSError where the
    group cannot be joined (it worked in this zygote: the kernel fails closed)."""
    total = limits["cpu_time_s"]
    if cpu is None:
        report["cpu"] = (f"RLIMIT_CPU {total} s per process; {total} s for all the kernel's processes together, "
                         "summed from /proc by the supervisor (no CPU cgroup)")
        return
    if cpu["procs_fd"] is not None:
        try:
            os.write(cpu["procs_fd"], b"0")
        except OSError as exc:
            raise OSError(exc.errno, f"could not join the kernel's CPU cgroup ({exc})") from None
        os.close(cpu["procs_fd"])
    report["cpu"] = (f"RLIMIT_CPU {total} s per process; the kernel's CPU cgroup: {total} s for all its processes "
                     "together, during and between cells")


def usage_seconds(fd, version):
    """CPU seconds a cgroup's usage file (open at ``fd``) reports, or ``None``."""
    try:
        text = os.pread(fd, 4096, 0).decode()
    except OSError:
        return None
    if version == "v1":
        return int(text) / 1e9 if text.strip().isdigit() else None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec" and value.strip().isdigit():
            return int(value) / 1e6
    return None


def _processes():
    """``{pid: (ppid, CPU seconds of itself and the children it reaped, state)}`` from
    ``/proc`` (state ``Z``: a zombie, dead and not yet reaped)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = data[data.rindex(b")") + 2:].split()  # after the command name, which may hold anything
        found[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK, fields[0].decode())
    return found


def descendants(root, processes):
    """``root`` and every pid below it in ``processes`` (``{pid: (ppid, ...)}``)."""
    children = {}
    for pid, (ppid, *_) in processes.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def tree_seconds(root):
    """CPU seconds of ``root`` and its live descendants, each with the children it reaped."""
    processes = _processes()
    return sum(processes[p][1] for p in descendants(root, processes) if p in processes)


class CpuMeter:
    """The CPU seconds a kernel has used, read by its supervisor: from its cgroup's usage
    file (``usage_fd``) or, without one, from the process tree below the supervisor."""

    def __init__(self, usage_fd=None, version=None):
        self.usage_fd, self.version = usage_fd, version
        self.root = os.getpid()
        self.kind = "cgroup" if usage_fd is not None else "tree"

    def seconds(self):
        if self.usage_fd is not None:
            used = usage_seconds(self.usage_fd, self.version)
            if used is not None:
                return used
        return tree_seconds(self.root)

    def kill_all(self):
        """SIGKILL every process of the kernel but the supervisor."""
        if os.getpid() == 1:  # pid 1 of the kernel's pid namespace: everything else in it
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            return
        kill_tree(self.root)


def kill_tree(root, rounds=50):
    """SIGKILL every live process below ``root`` (not ``root`` itself), until none is left
    or ``rounds`` scans of ``/proc`` are spent. ``root`` must be a subreaper (or pid 1):
    a process forked meanwhile is orphaned below it, and found by the next scan."""
    for _ in range(rounds):
        processes = _processes()
        left = [p for p in descendants(root, processes) if p != root and p in processes and processes[p][2] != "Z"]
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
