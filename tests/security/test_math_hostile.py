"""Hostile code in the MathPython kernel: each case ends as a readable observation within
its limit, while the host process and a second, concurrently running episode keep working."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import threading
import time

import pytest
from math_actions import code

from environments.math_python.env import MathPythonEnv
from environments.math_python.sandbox import KernelLimits
from trace_gym.types import Task

LIMITS = KernelLimits(cell_timeout_s=3.0, memory_mb=512, max_processes=24, output_bytes=4096)
SLACK_S = 12.0  # kernel start-up, kill and reap on a loaded 2-core machine
TASK = Task(id="hostile", prompt="What is 1 + 1?", answer="2")
SECRET = "trace-gym-host-secret-7f3a"


code = functools.partial(code, lead="Let me try.\n")  # each attack after a line of prose, as a model writes it


@pytest.fixture(scope="module")
def envs():
    os.environ["TRACE_GYM_TEST_SECRET"] = SECRET  # must never reach a kernel
    hostile = MathPythonEnv([TASK], limits=LIMITS, max_turns=1000)
    bystander = MathPythonEnv([TASK], limits=LIMITS, max_turns=1000)
    hostile.reset(seed=1)
    bystander.reset(seed=2)
    obs, *_ = bystander.step(code("counter = 0\nprint('ready')"))
    assert "ready" in obs[0].content
    yield hostile, bystander
    hostile.close()
    bystander.close()
    os.environ.pop("TRACE_GYM_TEST_SECRET", None)


def run_hostile(envs, src: str) -> tuple[str, dict, float]:
    """Run ``src`` in the hostile episode while the bystander keeps stepping; check the bystander."""
    hostile, bystander = envs
    box: dict = {}

    def attack():
        t0 = time.monotonic()
        obs, reward, terminated, truncated, info = hostile.step(code(src))
        box.update(text=obs[0].content, info=info, elapsed=time.monotonic() - t0)

    thread = threading.Thread(target=attack)
    thread.start()
    before = int(bystander_counter(bystander))
    steps = 0
    while thread.is_alive() or steps == 0:
        obs, *_ = bystander.step(code("counter += 1\nprint(counter)"))
        assert obs[0].content == f"```output\n{before + steps + 1}\n```", obs[0].content
        steps += 1
        time.sleep(0.05)
    thread.join()
    hostile.reset(seed=1)  # a fresh episode (and kernel) for the next case
    return box["text"], box["info"], box["elapsed"]


def bystander_counter(env: MathPythonEnv) -> str:
    obs, *_ = env.step(code("print(counter)"))
    return obs[0].content.removeprefix("```output\n").removesuffix("\n```")


def assert_bounded(text: str, elapsed: float, limit: float = LIMITS.cell_timeout_s) -> None:
    assert text.startswith("```output\n") and text.endswith("```")
    assert len(text) < 4 * LIMITS.output_bytes
    assert elapsed < limit + SLACK_S, f"took {elapsed:.1f} s"


def live_processes_of(uid: int, wait_s: float = 10.0) -> list[int]:
    """Non-zombie processes of ``uid``, after up to ``wait_s`` for SIGKILLed ones to exit."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = _scan(uid)
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


def _scan(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                pids.append(int(entry))
    return pids


def test_infinite_loop_times_out(envs):
    text, info, elapsed = run_hostile(envs, "while True:\n    pass")
    assert "TimeoutError" in text and "restarted" in text
    assert info["exec"]["status"] == "timeout" and info["exec"]["timed_out"] and info["exec"]["kernel_restarted"]
    assert_bounded(text, elapsed)


def test_memory_bomb_is_a_memory_error(envs):
    text, info, elapsed = run_hostile(envs, "hog = []\nwhile True:\n    hog.append(bytearray(10**7))")
    assert "MemoryError" in text
    assert info["exec"]["oom"] and info["exec"]["status"] == "error" and not info["exec"]["kernel_restarted"]
    assert_bounded(text, elapsed)


def test_fork_bomb_is_contained_and_cleaned_up(envs):
    hostile, _ = envs
    obs, *_ = hostile.step(code("import os\nprint(os.getuid())"))
    uid = int(obs[0].content.splitlines()[1])
    src = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    text, info, elapsed = run_hostile(envs, src)
    assert "TimeoutError" in text
    assert_bounded(text, elapsed)
    if os.geteuid() == 0:  # the kernel ran under a uid of its own: nothing of it may survive
        assert live_processes_of(uid) == []


def test_forked_children_are_killed_with_the_kernel(envs):
    hostile, _ = envs
    if os.geteuid() != 0:
        pytest.skip("kernels share the host uid without root; cleanup is by process group only")
    text, info, _ = run_hostile(envs, "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n"
                                      "        os.setsid()\n        time.sleep(600)\nprint(os.getuid())")
    uid = int(text.splitlines()[1])
    assert live_processes_of(uid) == []  # the reset above closed the kernel, escapees included


def test_deep_recursion(envs):
    text, info, elapsed = run_hostile(envs, "import sys\nsys.setrecursionlimit(10**6)\n"
                                            "def down(n):\n    return down(n + 1)\ndown(0)")
    assert any(word in text for word in ("RecursionError", "MemoryError", "TimeoutError", "KernelDied"))
    assert_bounded(text, elapsed)


def test_segfault_via_ctypes_restarts_the_kernel(envs):
    hostile, _ = envs
    hostile.step(code("keep = 41"))
    obs, _, _, _, info = hostile.step(code("import ctypes\nctypes.string_at(0)"))
    assert "KernelDied" in obs[0].content and "SIGSEGV" in obs[0].content
    assert info["exec"]["status"] == "crashed" and info["exec"]["kernel_restarted"]
    obs, *_ = hostile.step(code("print(keep)"))  # state is gone, as the notice said
    assert "NameError" in obs[0].content
    obs, *_ = hostile.step(code("print(6 * 7)"))
    assert obs[0].content == "```output\n42\n```"
    hostile.reset(seed=1)


def test_killing_the_parent_process_fails(envs):
    text, info, elapsed = run_hostile(envs, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    if os.geteuid() == 0:
        assert "PermissionError" in text
    assert_bounded(text, elapsed)
    assert os.getpid() > 0  # this process is still here to say so
    text, _, _ = run_hostile(envs, "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\n"
                                   "except ProcessLookupError:\n    print('no other process in sight')\nprint('alone')")
    assert "alone" in text


def test_writing_outside_the_working_directory_fails(envs):
    hostile, _ = envs
    if os.geteuid() != 0:
        pytest.skip("without root the kernel has the host user's file permissions")
    probe_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), f".math_sandbox_probe_{os.getpid()}")
    os.makedirs(probe_dir)
    os.chmod(probe_dir, 0o755)
    targets = [os.path.join(probe_dir, "escaped.txt"), "/etc/trace_gym_probe.txt", "../escaped.txt"]
    try:
        src = "results = []\n"
        for path in targets:
            src += (f"try:\n    open({path!r}, 'w').write('x')\n    results.append('WROTE')\n"
                    f"except OSError as exc:\n    results.append(type(exc).__name__)\n")
        src += "open('inside.txt', 'w').write('ok')\nprint(results, open('inside.txt').read())"
        text, info, elapsed = run_hostile(envs, src)
        assert "WROTE" not in text and "ok" in text, text
        assert not os.path.exists(targets[0]) and not os.path.exists(targets[1])
        assert_bounded(text, elapsed)
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)


def test_host_environment_variables_are_unreadable(envs):
    src = ("import os\nprint(sorted(os.environ))\nprint(dict(os.environ))\n"
           "for pid in (os.getppid(), 1):\n    try:\n        print(open(f'/proc/{pid}/environ').read())\n"
           "    except OSError as exc:\n        print(type(exc).__name__)")
    text, info, elapsed = run_hostile(envs, src)
    assert SECRET not in text and "TRACE_GYM_TEST_SECRET" not in text
    assert "PATH" in text
    assert_bounded(text, elapsed)


def test_network_connection_to_a_host_socket_fails(envs):
    hostile, _ = envs
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        src = (f"import socket\ns = socket.socket()\ns.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {port}))\n"
               "    print('CONNECTED')\nexcept OSError as exc:\n    print('refused:', exc)")
        text, info, elapsed = run_hostile(envs, src)
        if not hostile.kernel_protections.get("network", "").startswith("none"):
            pytest.skip(f"no network namespace here: {hostile.kernel_protections.get('network')}")
        assert "CONNECTED" not in text and "refused" in text
        with pytest.raises(socket.timeout):
            server.accept()
        assert_bounded(text, elapsed)
    finally:
        server.close()


def test_printing_100_mb_is_truncated_in_the_kernel(envs):
    text, info, elapsed = run_hostile(envs, "chunk = 'x' * 999_999\nfor _ in range(100):\n    print(chunk)\nprint('done')")
    assert "output truncated" in text and "bytes omitted" in text
    assert text.rstrip("`\n").endswith("done")  # the tail survives
    assert info["exec"]["cells"][0]["stdout_omitted"] > 99_000_000
    assert_bounded(text, elapsed)
