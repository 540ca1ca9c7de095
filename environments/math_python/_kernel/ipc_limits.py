"""The limits of a kernel's private IPC namespace: what SysV IPC and POSIX queues may hold.

The supervisor unshares an IPC namespace per kernel (it ends with the kernel) and writes
these sysctls into its ``/proc/sys``: SysV shared memory is RAM like the workdir, so at
most ``disk_mb`` MB of it in all; message queues, semaphores and POSIX queues get small
fixed counts. Where they cannot be written, the executor's seccomp filter refuses SysV
IPC instead (:mod:`.seccomp`).
"""

import os


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


def describe_ipc_limits(limits):
    """The ``ipc`` line of a kernel's protections once :func:`set_ipc_limits` succeeded."""
    shm = ipc_limits(limits)
    return (f"private IPC namespace (it ends with the kernel): SysV shared memory at most "
            f"{limits['disk_mb']} MB in all ({shm['kernel/shmmni']} segments), "
            f"{shm['kernel/msgmni']} message queues, {shm['kernel/sem'].split()[-1]} semaphore "
            f"sets, {shm['fs/mqueue/queues_max']} POSIX queues")
