"""The executor's seccomp filter: what the model's processes may not ask the kernel for.

A classic BPF program (``SECCOMP_MODE_FILTER``) installed by ``prctl`` after
``no_new_privs``; the executor's children, and whatever they exec, inherit it. It
refuses ``memfd_create``/``memfd_secret`` (memory outside ``RLIMIT_AS`` and the
workdir), every way to a new namespace (a user namespace would let a cell mount a tmpfs
of its own), and, where the kernel has no bounded private IPC namespace, System V IPC
and POSIX message queues. Syscall numbers are per machine (x86_64, aarch64); any other
machine gets no filter, and the zygote reports why (:func:`probe_seccomp`).
"""

import ctypes
import errno
import os
import platform

from .libc import CLONE_NAMESPACES, CLONE_NEWTIME, LIBC, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, check, prctl

#: syscall numbers per machine: (audit arch, x32 bit or 0, {name: number})
SYSCALLS = {
    "x86_64": (0xC000003E, 0x40000000, {
        "memfd_create": 319, "memfd_secret": 447, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
        "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240}),
    "aarch64": (0xC00000B7, 0, {
        "memfd_create": 279, "memfd_secret": 447, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
        "shmget": 194, "msgget": 186, "semget": 190, "mq_open": 180}),
}
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000


def _errno(code):
    return 0x00050000 | code  # SECCOMP_RET_ERRNO


def seccomp_program(machine, refuse_sysv_ipc):
    """The executor's filter as BPF ``(code, jt, jf, k)`` tuples, or ``None`` for an unknown machine.

    Refused with ``EPERM``: ``memfd_create`` and ``memfd_secret`` (memory outside
    ``RLIMIT_AS`` and the workdir), ``unshare``/``clone`` with any ``CLONE_NEW*`` flag
    (a user namespace would let the cell mount a tmpfs of its own), ``setns``, and with
    ``refuse_sysv_ipc`` (no private, bounded IPC namespace) ``shmget``/``msgget``/
    ``semget``/``mq_open``. ``clone3`` answers ``ENOSYS`` (its flags sit in memory a
    filter cannot read; glibc then falls back to ``clone``). Another ABI (i386 through
    ``int 0x80``, x32) is refused whole: its numbers differ.
    """
    if machine not in SYSCALLS:
        return None
    arch, x32_bit, nr = SYSCALLS[machine]
    prog = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _errno(errno.EPERM)), (_LD_ABS, 0, 0, 0)]
    if x32_bit:
        prog += [(_JGE, 0, 1, x32_bit), (_RET, 0, 0, _errno(errno.ENOSYS))]
    refused = {"memfd_create": errno.EPERM, "memfd_secret": errno.EPERM, "setns": errno.EPERM,
               "clone3": errno.ENOSYS}
    if refuse_sysv_ipc:
        refused.update(dict.fromkeys(("shmget", "msgget", "semget", "mq_open"), errno.EPERM))
    for name, code in refused.items():
        prog += [(_JEQ, 0, 1, nr[name]), (_RET, 0, 0, _errno(code))]
    for name, mask in (("unshare", CLONE_NAMESPACES | CLONE_NEWTIME), ("clone", CLONE_NAMESPACES)):
        # the low 32 bits of args[0] (offset 16, little-endian): the flags
        prog += [(_JEQ, 0, 4, nr[name]), (_LD_ABS, 0, 0, 16), (_JSET, 0, 1, mask),
                 (_RET, 0, 0, _errno(errno.EPERM)), (_RET, 0, 0, _ALLOW)]
    return prog + [(_RET, 0, 0, _ALLOW)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def install_seccomp(refuse_sysv_ipc):
    """Install the filter on this process (needs ``no_new_privs`` or root); its children
    and whatever they exec inherit it. Returns what it refuses; raises OSError."""
    prog = seccomp_program(platform.machine(), refuse_sysv_ipc)
    if prog is None:
        raise OSError(errno.ENOSYS, f"no syscall table for machine {platform.machine()!r}")
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    check(LIBC.prctl(PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")
    what = "memfd_create, memfd_secret, new namespaces (unshare/clone CLONE_NEW*, setns; clone3 is ENOSYS)"
    return what + (", System V IPC and POSIX message queues" if refuse_sysv_ipc else "")


def probe_seccomp():
    """Whether a filter installs and works here: a forked child installs it and checks that
    ``memfd_create`` is refused. Returns ``None`` (works) or why not."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            install_seccomp(False)
            try:
                os.memfd_create("probe")
            except PermissionError:
                code = 0
            else:
                code = 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    if code == 0:
        return None
    if platform.machine() not in SYSCALLS:
        return f"no syscall table for machine {platform.machine()!r}"
    return {2: "the filter installed but memfd_create was not refused"}.get(code, "prctl(PR_SET_SECCOMP) failed")
