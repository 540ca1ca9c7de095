"""What a kernel sees of the filesystem: the zygote's root, the kernel's /tmp, a stacked root.

Three layers, each in a mount namespace of its own:

* :func:`build_root` (the zygote, once): a private mount namespace whose root is a
  read-only tmpfs showing only the system directories, the interpreter's directories
  and a few devices; never the project or task data (``hide``), which is masked even
  inside an exposed directory. ``pivot_root`` detaches the host's tree (``chroot`` where
  that is refused).
* :func:`private_tmp` (each supervisor): a fresh tmpfs on ``/tmp`` of ``disk_mb`` MB and
  4096 inodes, holding the workdir ``/tmp/work``; it ends with the kernel.
* :func:`stack_root` (each supervisor, last): ``/`` bound over itself, so that the
  executor's root counts as a chroot and it may not create a user namespace.
"""

import errno
import os
import platform
import sys

from .libc import (CLONE_NEWNS, LIBC, MNT_DETACH, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_RDONLY,
                   MS_REC, MS_REMOUNT, check, mount)

SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")


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
    check(LIBC.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
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
        check(LIBC.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root")
        check(LIBC.umount2(b".", MNT_DETACH), "umount old root")
    except OSError:
        os.chroot(".")  # the executor has no capability, and no descriptor outside, to leave it
    os.chdir("/")
    sys.path[:] = [p for p in sys.path if p and os.path.isdir(p)]
    report["filesystem"] = ("read-only: " + ", ".join(d for d in SYSTEM_DIRS if d in sources) + ", the interpreter ("
                            + ", ".join(exposed) + "); writable: only the workdir /tmp/work (private tmpfs, "
                            f"{cfg.get('disk_mb', 64)} MB); nothing else of the host")
    report["hidden"] = sorted(hide)



def private_tmp(limits, under_tmp):
    """Mount the kernel's own tmpfs on ``/tmp`` (``disk_mb`` MB, 4096 inodes) and make the
    workdir in it; returns the workdir's path. ``under_tmp``: directories of the
    interpreter below ``/tmp`` (a checkout, a venv), bound back read-only above it, their
    parents traversable but not listable. Needs a private mount namespace; raises OSError."""
    # an interpreter (a checkout, a venv) under /tmp stays visible, read-only, above the tmpfs
    keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in under_tmp}
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={limits['disk_mb']}m,nr_inodes=4096,mode=0755")
    for path, fd in keep.items():
        os.makedirs(path, 0o755, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
        parent = os.path.dirname(path)  # traversable, not listable: the checkout's layout stays hidden
        while parent not in ("/tmp", "/", "") and parent not in keep:
            os.chmod(parent, 0o711)
            parent = os.path.dirname(parent)
    workdir = "/tmp/work"
    os.mkdir(workdir, 0o700)
    return workdir


def stack_root(report):
    """Bind ``/`` over itself, as the last mount; True if it worked, else why not in
    ``report["stacked_root"]``.

    The executor's root stays the lower mount, which the kernel then counts as a chroot,
    and a chrooted process may not create a user namespace (EPERM, user_namespaces(7)).
    """
    try:
        mount("/", "/", None, MS_BIND | MS_REC)
        return True
    except OSError as exc:
        report["stacked_root"] = f"NOT set ({exc})"
        return False
