"""Per-process bounds of the executor: rlimits, and who the OOM killer takes first.

``RLIMIT_AS`` (``memory_mb`` MB of address space per process), ``RLIMIT_CPU``
(``cpu_time_s`` s, SIGXCPU, then SIGKILL a second later), ``RLIMIT_NOFILE``,
``RLIMIT_NPROC`` (processes of the kernel's uid), ``RLIMIT_FSIZE`` (``disk_mb`` MB per
file), no core files, and 512 KiB of POSIX message queues. The memory cgroup
(:mod:`.cgroups`) and the CPU check (:mod:`.cpu`) bound the kernel's processes
together; these bound each one.
"""

import resource


def set_rlimits(limits, report):
    """Set the rlimits of this process (inherited by its children); each outcome goes into
    ``report`` (``RLIMIT_* -> soft value`` or ``"not set (why)"``)."""
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


def set_oom_score_adj(value):
    """Set this process's OOM score adjustment (-1000 never .. 1000 first); False where /proc refuses."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
        return True
    except OSError:
        return False
