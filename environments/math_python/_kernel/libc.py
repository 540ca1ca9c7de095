"""The system calls the sandbox needs that Python's ``os`` module lacks, through ctypes.

``mount``, ``unshare``, ``setns``, ``prctl``, ``pivot_root`` and ``umount2`` of the C
library, and the flag values of ``clone(2)``, ``mount(2)`` and ``prctl(2)`` they take.
Bounds nothing itself; every mechanism that bounds a kernel calls through here. A
failed call raises ``OSError`` with the C ``errno`` and what was asked.
"""

import ctypes
import os

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWPID = 0x20000, 0x8000000, 0x40000000, 0x20000000
#: every CLONE_NEW* flag of clone(2) (CLONE_NEWTIME, 0x80, is an exit-signal bit there)
CLONE_NAMESPACES = 0x7E020000
CLONE_NEWTIME = 0x80
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER = 1, 38, 22, 36

#: this process's C library (``errno`` kept for :func:`check`)
LIBC = ctypes.CDLL(None, use_errno=True)


def check(ret, what):
    """Raise ``OSError(errno, "what: strerror")`` unless the C call returned 0."""
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target, fstype, flags, data=None):
    """``mount(2)``; ``None`` arguments are passed as NULL."""
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(LIBC.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {target}")


def prctl(option, value):
    """``prctl(option, value, 0, 0, 0)``."""
    check(LIBC.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")
