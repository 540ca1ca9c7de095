"""Memory cgroups, one per kernel: what all of a kernel's processes may hold together.

``RLIMIT_AS`` bounds one process; a kernel's memory cgroup bounds everything it charges
at once: all its processes, SysV shared memory, memfd and tmpfs (workdir) pages, and
kernel objects, at ``memory_mb + disk_mb`` MiB and no swap. Where a memory cgroup (v1 or
v2) can be written, the zygote makes a group of its own under its cgroup
(``trace_gym_<pid>``), probes it, and gives every kernel a child of it (``k<n>``); the
supervisor joins it before anything else, and reads its OOM-kill counter to tell a
cell that went over the limit from one killed otherwise. The zygote reaches the groups
through descriptors opened before the sandbox root hid ``/sys``.
"""

import errno
import os

#: the zygote's script: a ``trace_gym_<pid>`` group is live while ``pid`` runs it
ZYGOTE_SCRIPT = "_kernel_driver.py"


def cgroup_dir(controller):
    """``(version, path)`` of this process's cgroup directory in the hierarchy of
    ``controller`` (``"memory"`` or ``"cpuacct"``: v1, or the v2 unified tree); raises
    OSError(why not). In v2 the memory controller must be enabled below the directory;
    CPU accounting (``cpu.stat``) is in every v2 group."""
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

    for version, fstype, want, match in (("v1", "cgroup", controller, lambda c: controller in c.split(",")),
                                         ("v2", "cgroup2", None, lambda c: c == "")):
        own = next((path for _, controllers, path in lines if match(controllers)), None)
        mount_ = mounted(fstype, want)
        if own is None or mount_ is None:
            continue
        root, point = mount_
        if not (own == root or own.startswith(root.rstrip("/") + "/")):
            raise OSError(errno.ENOENT, f"this process's cgroup {own} is outside the mounted {fstype} tree")
        path = os.path.normpath(point + own[len(root.rstrip("/")):])
        if version == "v2" and controller == "memory":
            with open(os.path.join(path, "cgroup.subtree_control")) as f:
                if "memory" not in f.read().split():
                    raise OSError(errno.EPERM, f"the memory controller is not enabled below {path}")
        return version, path
    raise OSError(errno.ENOENT, f"no {controller} cgroup controller is mounted")


def _is_zygote(pid):
    """Whether ``pid`` (host pid namespace) is a live kernel zygote."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return ZYGOTE_SCRIPT.encode() in f.read()
    except OSError:
        return False


def _sweep(path):
    """Remove the groups that killed zygotes left in ``path`` (a zygote removes its own on
    exit); a kernel that outlived its zygote keeps its directory until a later sweep.
    Best effort, never raising: a group may vanish while it is swept."""
    for entry in os.listdir(path):
        pid = entry[len("trace_gym_"):]
        if not (entry.startswith("trace_gym_") and pid.isdigit()) or _is_zygote(int(pid)):
            continue
        group = os.path.join(path, entry)
        try:  # its owner may be removing it right now: an exiting zygote's cmdline is empty
            names = [n for n in os.listdir(group) if n[:1] == "k" and n[1:].isdigit()]
        except OSError:
            continue
        for name in names + [None]:
            try:
                os.rmdir(group if name is None else os.path.join(group, name))
            except OSError:
                pass


class GroupTree:
    """This zygote's group (``trace_gym_<pid>``) in one cgroup hierarchy, and its kernels'
    groups below it (``k<n>``), reached through descriptors opened before the sandbox
    root hid ``/sys``. ``enable``: the v2 controller the kernels' groups get."""

    def __init__(self, version, path, enable=None):
        self.version, self.path, self.enable = version, path, enable
        self.name = f"trace_gym_{os.getpid()}"
        self.parent_fd = os.open(path, os.O_PATH | os.O_DIRECTORY)  # the path is gone once the root is built
        _sweep(path)
        try:
            os.mkdir(self.name, 0o700, dir_fd=self.parent_fd)
            self.fd = os.open(self.name, os.O_PATH | os.O_DIRECTORY, dir_fd=self.parent_fd)
        except OSError:
            os.close(self.parent_fd)
            raise
        self.count = 0
        self.stale = []  # kernel directories still busy when their kernel was reaped
        if enable:
            try:
                self.write("cgroup.subtree_control", "+" + enable)
            except OSError:
                self.close()
                raise

    def opener(self, path, flags):
        return os.open(path, flags, dir_fd=self.fd)

    def write(self, path, value):
        fd = os.open(path, os.O_WRONLY, dir_fd=self.fd)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def make(self):
        """A new kernel group's name (``k<n>``), made; raises OSError."""
        self.count += 1
        name = f"k{self.count}"
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
        except FileNotFoundError:  # the group was removed under us (a sweep that took it for a dead one's)
            os.close(self.fd)
            os.mkdir(self.name, 0o700, dir_fd=self.parent_fd)
            self.fd = os.open(self.name, os.O_PATH | os.O_DIRECTORY, dir_fd=self.parent_fd)
            if self.enable:
                self.write("cgroup.subtree_control", "+" + self.enable)
            os.mkdir(name, 0o700, dir_fd=self.fd)
        return name

    def remove(self, name):
        """Remove a kernel's group (all its processes are gone); retried at the next call
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


class MemoryCgroups:
    """Per-kernel memory cgroups below a group of this zygote (:class:`GroupTree`)."""

    FILES = {"v1": ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.oom_control"),
             "v2": ("memory.max", "memory.swap.max", "memory.events")}

    def __init__(self, version, path):
        self.version, self.path = version, path
        self.limit_file, self.swap_file, self.events_file = self.FILES[version]
        self.tree = GroupTree(version, path, enable="memory" if version == "v2" else None)
        self.name = self.tree.name
        try:
            name, procs, events = self.new(16)  # a probe: a group with a limit that reads back
            os.close(procs)
            os.close(events)
            with open(f"{name}/{self.limit_file}", opener=self.tree.opener) as f:
                if int(f.read()) != 16 << 20:
                    raise OSError(errno.EIO, "the probe's limit did not read back")
            self.remove(name)
        except OSError:
            self.close()
            raise

    @property
    def fd(self):
        """This zygote's group directory (a v2 kernel's CPU accounting shares its groups)."""
        return self.tree.fd

    @property
    def stale(self):
        return self.tree.stale

    def new(self, limit_mb):
        """A kernel's cgroup: ``(name, procs fd to write, events fd to read)``, limited to
        ``limit_mb`` MiB of memory (and no swap); raises OSError."""
        name = self.tree.make()
        try:
            self.tree.write(f"{name}/{self.limit_file}", str(limit_mb << 20))
            try:  # v1: memory + swap (needs swap accounting); v2: swap alone
                self.tree.write(f"{name}/{self.swap_file}", str(limit_mb << 20) if self.version == "v1" else "0")
            except FileNotFoundError:
                pass
            procs = os.open(f"{name}/cgroup.procs", os.O_WRONLY, dir_fd=self.tree.fd)
            events = os.open(f"{name}/{self.events_file}", os.O_RDONLY, dir_fd=self.tree.fd)
        except OSError:
            self.remove(name)
            raise
        return name, procs, events

    def remove(self, name):
        """Remove a kernel's cgroup (retried later while the kernel still holds it)."""
        self.tree.remove(name)

    def close(self):
        """Remove what is left and this zygote's group (busy ones stay: their kernels live)."""
        self.tree.close()


def setup_memory_cgroups(cfg, mechanisms):
    """This zygote's :class:`MemoryCgroups`, or ``None`` (the reason in ``mechanisms``)."""
    if "memory_cgroup" in cfg.get("disable", ()):
        mechanisms["memory_cgroup"] = "NOT active (left off): memory is bounded per process only"
        return None
    try:
        cgroups = MemoryCgroups(*cgroup_dir("memory"))
    except OSError as exc:
        mechanisms["memory_cgroup"] = f"NOT active ({exc}): memory is bounded per process only"
        return None
    mechanisms["memory_cgroup"] = (f"active (cgroup {cgroups.version}, {cgroups.path}/{cgroups.name}): each kernel "
                                   "holds at most memory_mb + disk_mb MB by any route")
    return cgroups


def join_memory_cgroup(cgroup, limits, report):
    """Move this process (and so every process it will fork) into the kernel's memory
    cgroup, made by the zygote (``procs_fd`` to join it, closed here; ``limit_mb``), or
    into none where ``cgroup`` is ``None``; the outcome goes into ``report["memory"]``.
    Raises OSError where the group cannot be joined: it worked in this zygote, so the
    kernel fails closed."""
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
                            f"{report.get('memory_cgroup', 'none')})")


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
