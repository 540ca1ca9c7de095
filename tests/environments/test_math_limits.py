"""Memory, disk and namespace limits of a MathPython kernel, by every route we know of.

Each route a cell could take around ``memory_mb``/``disk_mb`` (memfd, SysV shared memory
and queues, several processes, a user namespace with a tmpfs of its own, the workdir's
unlinked files, POSIX shared memory) ends inside its bound: a readable error in the
cell, or a kernel killed at its memory limit and reported as such. Every mechanism is
also tested alone (``ForkServer(disable=...)``), as a machine without the others would
run it, and the mechanisms a capable machine offers must be active, so that a broken
probe cannot turn these tests into skips.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import time

import pytest

from environments.math_python.env import MathPythonEnv
from environments.math_python.sandbox import Kernel, KernelLimits
from environments.math_python.zygote import ForkServer
from trace_gym.types import Task

LIMITS = KernelLimits(cell_timeout_s=15.0, memory_mb=256, disk_mb=16, output_bytes=4096)
CGROUP_MB = LIMITS.memory_mb + LIMITS.disk_mb
TASK = Task(id="limits", prompt="What is 1 + 1?", answer="2")

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
#: the issue's user-namespace payload: own uid as root, a tmpfs of its own, STORE_MB in it
USERNS_TMPFS = LIBC + """uid, gid = os.getuid(), os.getgid()
libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self/*_map become writable
if libc.unshare(0x10000000 | 0x20000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    raise OSError(ctypes.get_errno(), 'unshare: ' + os.strerror(ctypes.get_errno()))
open('/proc/self/setgroups', 'w').write('deny')
open('/proc/self/uid_map', 'w').write(f'0 {uid} 1')
open('/proc/self/gid_map', 'w').write(f'0 {gid} 1')
os.makedirs('/tmp/work/mnt', exist_ok=True)
if libc.mount(b'none', b'/tmp/work/mnt', b'tmpfs', 0, b'size=4g') != 0:
    raise OSError(ctypes.get_errno(), 'mount: ' + os.strerror(ctypes.get_errno()))
print('mounted', flush=True)
chunk = b'x' * (1 << 20)
for i in range(STORE_MB // 8):  # files of 8 MB: under RLIMIT_FSIZE (disk_mb)
    with open(f'/tmp/work/mnt/f{i}', 'wb') as f:
        for _ in range(8):
            f.write(chunk)
print('stored', STORE_MB, 'MB')
"""
#: 40 memfds of 15 MB each (each under RLIMIT_FSIZE), 600 MB in all
MEMFD_HOG = ("import os\nchunk = b'x' * (1 << 20)\nfds = []\nfor i in range(40):\n"
             "    fds.append(os.memfd_create('hog'))\n    for _ in range(15):\n        os.write(fds[-1], chunk)\n"
             "print('held', len(fds) * 15, 'MB')")


#: children holding TOTAL_MB MB together, each under its own RLIMIT_AS (sized from the kernel's
#: measured address space: the zygote's preloads differ by machine); exit codes: 0 held its share
#: for a second, 3 hit RLIMIT_AS (MemoryError), -9 was killed (the OOM killer)
CHILDREN_HOLDING = """import math, os, resource, time
vm_mb = int(open('/proc/self/status').read().split('VmSize:')[1].split()[0]) >> 10
each = min(90, (resource.getrlimit(resource.RLIMIT_AS)[0] >> 20) - vm_mb - 32)
assert each >= 16, f'no room under RLIMIT_AS: the kernel already maps {vm_mb} MB'
kids = []
for i in range(math.ceil(TOTAL_MB / each)):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            hold = b'\\x01' * (each << 20)
            time.sleep(1.0)
        except MemoryError:
            code = 3
        finally:
            os._exit(code)
    kids.append(pid)
print('each', each, 'MB; exit codes', [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids])
"""


def children_holding(total_mb: int) -> str:
    """The :data:`CHILDREN_HOLDING` cell for ``total_mb`` MB together."""
    return CHILDREN_HOLDING.replace("TOTAL_MB", str(total_mb))


def exit_codes(text: str) -> list[int]:
    return [int(c) for c in re.search(r"exit codes \[(.*)\]", text).group(1).split(",")]


@pytest.fixture(scope="module")
def env():
    e = MathPythonEnv([TASK], limits=LIMITS, max_turns=1000, step_timeout_s=30.0)
    e.reset(seed=0)
    yield e
    e.close()


@pytest.fixture(scope="module")
def mechanisms(env):
    return env.sandbox_mechanisms()


def step(env: MathPythonEnv, *sources: str) -> tuple[list[str], dict]:
    """Run one response of ``sources`` as cells: (per-cell output blocks, info)."""
    obs, _, _, _, info = env.step("\n".join(f"```python\n{s}\n```" for s in sources))
    text = obs[0].content
    text.encode("utf-8")
    blocks = text.split("\n\n```output\n")
    assert len(blocks) == len(sources), text
    return blocks, info


def need(mechanisms: dict, name: str) -> None:
    if not mechanisms[name].startswith(("active", "refused", "a private")):
        pytest.skip(f"{name}: {mechanisms[name]}")


def kernel(server: ForkServer) -> Kernel:
    k = Kernel(LIMITS, server=server)
    k.start(0)
    return k


@pytest.fixture(scope="module")
def servers():
    """Fork servers each without some mechanisms (a machine that lacks them), made on demand."""
    made: dict[tuple, ForkServer] = {}

    def get(*disable: str) -> ForkServer:
        if disable not in made:
            made[disable] = ForkServer(preload=(), disable=disable)
        return made[disable]

    yield get
    for server in made.values():
        server.close()


# --- what is active, and said so --------------------------------------------------------

def _own_memory_cgroup_writable() -> bool:
    """Independent of the sandbox's probe: cgroup v1 memory, our own group writable."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return os.access(f"/sys/fs/cgroup/memory{path}", os.W_OK)
    return False


def test_mechanisms_are_logged_once_and_active_where_the_machine_allows(caplog):
    server = ForkServer(preload=())
    try:
        with caplog.at_level(logging.DEBUG, logger="environments.math_python.zygote"):
            found = server.mechanisms()
        lines = [r.getMessage() for r in caplog.records if "kernel sandbox" in r.getMessage()]
        assert len(lines) == 1 and all(f"{name}: " in lines[0] for name in found), lines
        assert set(found) == {"memory_cgroup", "cpu_cgroup", "seccomp", "private_ipc", "user_namespaces"}
        if platform.machine() in ("x86_64", "aarch64"):  # seccomp needs nothing but no_new_privs
            assert found["seccomp"].startswith("active"), found
        if os.geteuid() == 0:
            assert found["user_namespaces"] == "refused by seccomp and the stacked root", found
            assert found["private_ipc"].startswith("a private IPC namespace per kernel, SysV"), found
        if os.geteuid() == 0 and _own_memory_cgroup_writable():
            assert found["memory_cgroup"].startswith("active (cgroup v1"), found
    finally:
        server.close()


def test_each_kernel_reports_its_memory_and_ipc_bounds(env, mechanisms):
    step(env, "print(1)")
    p = env.kernel_protections
    assert p["seccomp"].startswith("refuses memfd_create") == mechanisms["seccomp"].startswith("active")
    if mechanisms["memory_cgroup"].startswith("active"):
        assert f"{CGROUP_MB} MB for all its processes" in p["memory"], p["memory"]
    if os.geteuid() == 0:
        assert f"SysV shared memory at most {LIMITS.disk_mb} MB" in p["ipc"], p["ipc"]


def test_unknown_mechanisms_are_refused():
    with pytest.raises(ValueError, match="no_such_mechanism"):
        ForkServer(disable=("seccomp", "no_such_mechanism"))


# --- memfd -------------------------------------------------------------------------------

def test_memfd_is_refused_inside_the_cell(env, mechanisms):
    need(mechanisms, "seccomp")
    blocks, info = step(env, "kept = 'still here'", MEMFD_HOG,
                        LIBC + "print(libc.syscall(319 if os.uname().machine == 'x86_64' else 279, b'x', 0), "
                               "ctypes.get_errno())\n"
                               "print(libc.syscall(0x40000000 + 319, b'x', 0), ctypes.get_errno())  # x32 ABI\n"
                               "print(libc.syscall(447, 0), ctypes.get_errno())  # memfd_secret",
                        "print(kept)")
    assert "PermissionError: [Errno 1] Operation not permitted" in blocks[1] and "held" not in blocks[1]
    errnos = re.findall(r"^-1 (\d+)$", blocks[2], re.M)
    assert errnos[0] == "1" and errnos[1] in ("1", "38") and errnos[2] == "1", blocks[2]  # EPERM; x32: ENOSYS
    assert "still here" in blocks[3] and not info["exec"]["kernel_restarted"]


def test_memfd_without_seccomp_is_killed_at_the_kernel_memory_limit(servers):
    server = servers("seccomp")
    if not server.mechanisms()["memory_cgroup"].startswith("active"):
        pytest.skip(server.mechanisms()["memory_cgroup"])
    env = MathPythonEnv([TASK], limits=LIMITS, max_turns=10, kernel_server=server, prestart_kernel=False)
    try:
        env.reset(seed=0)
        t0 = time.monotonic()
        blocks, info = step(env, MEMFD_HOG, "print(6 * 7)")
        assert "KernelDied" in blocks[0] and f"memory limit of {CGROUP_MB} MB" in blocks[0], blocks[0]
        assert "held" not in blocks[0] and "42" in blocks[1]  # the next cell ran in a new interpreter
        cell = info["exec"]["cells"][0]
        assert cell["status"] == "crashed" and cell["error_name"] == "MemoryLimit" and cell["oom"]
        assert time.monotonic() - t0 < LIMITS.cell_timeout_s
    finally:
        env.close()


# --- several processes -----------------------------------------------------------------

def test_all_processes_of_a_kernel_share_one_memory_limit(env, mechanisms):
    need(mechanisms, "memory_cgroup")
    # 450 MB together: each child under RLIMIT_AS (256 MB), all of them over the cgroup's 272 MB
    blocks, info = step(env, "kept = 1", children_holding(450), "print(kept + 41)")
    codes = exit_codes(blocks[1])
    assert 3 not in codes, blocks[1]  # no child hit its own RLIMIT_AS: the test measures the cgroup
    assert -9 in codes, blocks[1]  # the OOM killer took some (SIGKILL); without the cgroup all exit 0
    assert "42" in blocks[2] and not info["exec"]["kernel_restarted"]  # the interpreter lived on


def test_without_a_cgroup_memory_is_bounded_per_process_only(servers):
    server = servers("memory_cgroup")
    assert server.mechanisms()["memory_cgroup"].startswith("NOT active (left off)")
    k = kernel(server)
    try:
        assert "per process only" in k.wait_ready()["protections"]["memory"]
        bomb = k.execute("hog = []\nwhile True:\n    hog.append(bytearray(10**7))")
        assert bomb.status == "error" and bomb.oom and bomb.error_name == "MemoryError"
        k.execute("del hog")
        together = k.execute(children_holding(320))  # 320 MB together: the documented gap
        assert set(exit_codes(together.stdout.text())) == {0}, together
        if server.mechanisms()["seccomp"].startswith("active"):  # memfd is still refused
            assert k.execute("import os\nos.memfd_create('x')").error_name == "PermissionError"
    finally:
        k.close()


# --- SysV and POSIX IPC ------------------------------------------------------------------

SYSV = LIBC + """libc.shmat.restype = ctypes.c_void_p
print('one 600 MB segment:', libc.shmget(0, ctypes.c_size_t(600 << 20), 0o1600), ctypes.get_errno())
held = 0
for _ in range(150):  # 4 MB segments, attached, written, detached, never IPC_RMID: 600 MB wanted
    sid = libc.shmget(0, ctypes.c_size_t(4 << 20), 0o1600)
    if sid < 0:
        break
    at = libc.shmat(sid, None, 0)
    ctypes.memset(at, 1, 4 << 20)
    libc.shmdt(ctypes.c_void_p(at))
    held += 4
print('held', held, 'MB, then errno', ctypes.get_errno())
queues = 0
while queues < 1000 and libc.msgget(0, 0o1600) >= 0:
    queues += 1
print('queues', queues)
print('semaphores:', libc.semget(0, 32000, 0o1600), ctypes.get_errno())
"""


def test_sysv_shared_memory_and_queues_are_bounded_and_private(env, mechanisms):
    need(mechanisms, "private_ipc")
    blocks, info = step(env, LIBC + "print('mine', libc.shmget(0x7467, 4096, 0o1600))", SYSV,
                        "import os\nos._exit(3)",  # a new interpreter, a new IPC namespace
                        LIBC + "print('found', libc.shmget(0x7467, 0, 0), ctypes.get_errno())")
    out = blocks[1]
    assert "one 600 MB segment: -1 22" in out, out  # EINVAL: over shmmax
    held = int(re.search(r"held (\d+) MB, then errno (\d+)", out).group(1))
    assert held <= LIMITS.disk_mb and re.search(r"then errno 28", out), out  # ENOSPC: shmall
    assert int(re.search(r"queues (\d+)", out).group(1)) <= 16
    assert "semaphores: -1 22" in out
    assert re.search(r"mine \d+", blocks[0]) and "found -1 2" in blocks[3]  # ENOENT: the segment died with it
    assert not os.path.exists("/proc/sysvipc/shm") or "0x7467" not in open("/proc/sysvipc/shm").read()


def test_sysv_ipc_is_refused_where_the_namespace_has_no_limits(servers):
    server = servers("ipc_limits")
    if not server.mechanisms()["seccomp"].startswith("active"):
        pytest.skip(server.mechanisms()["seccomp"])
    k = kernel(server)
    try:
        assert "refused by seccomp" in k.wait_ready()["protections"]["ipc"]
        out = k.execute(SYSV).stdout.text()
        assert "one 600 MB segment: -1 1" in out and "held 0 MB, then errno 1" in out and "queues 0" in out, out
    finally:
        k.close()


def test_posix_shared_memory_has_no_place_to_live(env, mechanisms):
    need(mechanisms, "private_ipc")  # the sandbox's /dev has no shm
    blocks, _ = step(env, "from multiprocessing import shared_memory\n"
                          "shared_memory.SharedMemory(create=True, size=600 << 20)")
    assert "FileNotFoundError" in blocks[0], blocks[0]


# --- user namespaces ---------------------------------------------------------------------

def test_user_namespaces_are_refused(env, mechanisms):
    need(mechanisms, "user_namespaces")
    blocks, info = step(
        env, USERNS_TMPFS.replace("STORE_MB", "152"),
        LIBC + "print('clone', libc.syscall(56 if os.uname().machine == 'x86_64' else 220, 0x10000000 | 17, "
               "0, 0, 0, 0), ctypes.get_errno())\nprint('clone3', libc.syscall(435, 0, 0), ctypes.get_errno())",
        "import shutil, subprocess, threading\nthreading.Thread(target=print, args=('a thread',)).start()\n"
        "print(subprocess.run(['echo', 'a subprocess'], capture_output=True, text=True).stdout.strip())\n"
        "if shutil.which('unshare'):\n    print(subprocess.run(['unshare', '-Urm', 'true']).returncode)")
    assert "PermissionError: [Errno 1] unshare: Operation not permitted" in blocks[0], blocks[0]
    assert "mounted" not in blocks[0] and "stored" not in blocks[0]
    assert "clone -1 1" in blocks[1] and re.search(r"clone3 -1 (38|1)\b", blocks[1]), blocks[1]
    assert "a thread" in blocks[2] and "a subprocess" in blocks[2]  # threads and processes still start
    if shutil.which("unshare"):  # the filter holds across exec
        assert blocks[2].rstrip("`\n").splitlines()[-1] != "0", blocks[2]


@pytest.mark.parametrize("alone", ["stacked_root", "seccomp"])
def test_either_guard_alone_refuses_user_namespaces(servers, alone):
    other = {"stacked_root": "seccomp", "seccomp": "stacked_root"}[alone]
    server = servers(other)  # only ``alone`` is left on
    if os.geteuid() != 0 and alone == "stacked_root":
        pytest.skip("the stacked root needs a mount namespace (root)")
    k = kernel(server)
    try:
        guard = k.wait_ready()["protections"]["user_namespaces"]
        assert guard.startswith("refused by") and (alone[:5] in guard) and (other[:5] not in guard), guard
        result = k.execute(USERNS_TMPFS.replace("STORE_MB", "152"))
        assert result.error_name == "PermissionError" and "unshare" in result.error, result
    finally:
        k.close()


def test_without_both_guards_a_private_tmpfs_is_still_held_by_the_cgroup(servers):
    server = servers("seccomp", "stacked_root")
    if os.geteuid() != 0 or not server.mechanisms()["memory_cgroup"].startswith("active"):
        pytest.skip("needs root and a memory cgroup")
    k = kernel(server)
    try:
        assert k.wait_ready()["protections"]["user_namespaces"].startswith("NOT refused")
        result = k.execute(USERNS_TMPFS.replace("STORE_MB", "600"))
        assert "mounted" in result.stdout.text(), result  # the attack did get its own tmpfs here
        assert result.status == "crashed" and result.error_name == "MemoryLimit" and result.oom, result
        assert "stored" not in result.stdout.text()
    finally:
        k.close()


# --- the workdir -------------------------------------------------------------------------

def test_unlinked_and_anonymous_files_count_against_disk_mb(env):
    step(env, "pass")
    if env.kernel_protections["filesystem"].startswith("NOT isolated"):
        pytest.skip("no private workdir: files are limited per file only (documented)")
    blocks, _ = step(env, "import os\nchunk = b'x' * (1 << 20)\nwritten, fds = 0, []\ntry:\n"
                          "    for i in range(40):\n"
                          "        fd = os.open('/tmp/work', os.O_TMPFILE | os.O_WRONLY) if i % 2 else "
                          "os.open(f'gone{i}', os.O_CREAT | os.O_WRONLY)\n"
                          "        fds.append(fd)\n        if not i % 2:\n            os.unlink(f'gone{i}')\n"
                          "        for _ in range(4):\n            os.write(fd, chunk)\n            written += 1\n"
                          "except OSError as exc:\n    print(type(exc).__name__, exc.errno)\n"
                          "print('written', written, 'MB')")
    written = int(re.search(r"written (\d+) MB", blocks[0]).group(1))
    assert written <= LIMITS.disk_mb and re.search(r"OSError 28", blocks[0]), blocks[0]  # ENOSPC


def test_kernel_cgroups_are_removed_with_their_kernels(servers):
    server = servers("seccomp", "ipc_limits")  # a server of this module's own: no one else's kernels
    line = server.mechanisms()["memory_cgroup"]
    if not line.startswith("active"):
        pytest.skip(line)
    group = re.search(r"(/\S+/trace_gym_\d+)\)", line).group(1)
    ks = [kernel(server) for _ in range(3)]
    for k in ks:
        assert k.execute("print(1)").status == "ok"
    assert len([n for n in os.listdir(group) if n.startswith("k")]) >= 3
    for k in ks:
        k.close()
    deadline = time.monotonic() + 10
    while [n for n in os.listdir(group) if n.startswith("k")] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [n for n in os.listdir(group) if n.startswith("k")] == []


def test_without_namespaces_sysv_ipc_and_user_namespaces_are_refused_by_seccomp():
    server = ForkServer(isolate=False, preload=())  # what a host without root gets
    try:
        found = server.mechanisms()
        assert found["private_ipc"].startswith("NOT active")
        if not found["seccomp"].startswith("active"):
            pytest.skip(found["seccomp"])
        assert found["user_namespaces"] == "refused by seccomp"
        k = kernel(server)
        try:
            assert "refused by seccomp" in k.wait_ready()["protections"]["ipc"]
            out = k.execute(SYSV).stdout.text()
            assert "one 600 MB segment: -1 1" in out and "held 0 MB, then errno 1" in out, out  # EPERM
            result = k.execute(USERNS_TMPFS.replace("STORE_MB", "152"))
            assert result.error_name == "PermissionError" and "mounted" not in result.stdout.text()
        finally:
            k.close()
    finally:
        server.close()
