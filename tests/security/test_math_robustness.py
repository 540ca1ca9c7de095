"""MathPython under hostile output and infrastructure faults (issue 11): every case ends
in a readable, UTF-8, tokenizable observation; no infrastructure fault changes a reward;
the kernel's channel, the project and the task data are out of the model's reach."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from math_actions import code

from environments.math_python.env import MathPythonEnv
from environments.math_python.grading import Grader
from environments.math_python.sandbox import Kernel, KernelLimits
from environments.math_python.zygote import ForkServer, hidden_paths
from trace_gym.types import Task

LIMITS = KernelLimits(cell_timeout_s=3.0, memory_mb=512, max_processes=24, output_bytes=2048)
TASK = Task(id="robust", prompt="What is 2 + 3?", answer="5")
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def assert_readable(tokenizer, obs) -> str:
    """The observation encodes as UTF-8 and passes through the real chat template."""
    text = "\n".join(m.content for m in obs)
    text.encode("utf-8")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                *({"role": m.role, "content": m.content} for m in obs)]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert len(ids) > 0
    return text


@pytest.fixture()
def env():
    e = MathPythonEnv([TASK], limits=LIMITS, max_turns=50, step_timeout_s=6.0)
    e.reset(seed=0)
    yield e
    e.close()


# -- 1. every output is an observation -----------------------------------------------

@pytest.mark.parametrize("src", [
    "raise ValueError(chr(0xd800))",
    "print(chr(0xdfff) + 'tail')",
    "import sys\nsys.stderr.write('\\udcff')",
    "import sys\nsys.stdout.flush()\nsys.stdout.buffer.write(b'\\xff\\xfe\\xc3')",
    "class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise E()",
    "raise KeyError('\\ud83d')",
])
def test_lone_surrogates_and_bad_bytes_become_valid_utf8(env, tokenizer, src):
    obs, *_ = env.step(code(src))
    text = assert_readable(tokenizer, obs)
    assert text.startswith("```output\n")


# -- 2. caps that cannot be bypassed ----------------------------------------------------

def test_cells_per_action_are_capped(env, tokenizer):
    obs, _, _, _, info = env.step(code(*["print('x' * 3000)"] * 936))
    text = assert_readable(tokenizer, obs)
    assert len(info["exec"]["cells"]) == env.max_cells and info["exec"]["cells_not_run"] == 936 - env.max_cells
    assert f"{936 - env.max_cells} more code block(s) not executed" in text
    assert len(text) <= env.max_observation_chars


def test_wall_clock_per_step_is_capped(env, tokenizer):
    t0 = time.monotonic()
    obs, _, _, _, info = env.step(code(*["import time\ntime.sleep(2)\nprint('slept')"] * 15))
    elapsed = time.monotonic() - t0
    assert elapsed < env.step_timeout_s + 4, f"one step took {elapsed:.1f} s"
    text = assert_readable(tokenizer, obs)
    assert "limit per response" in text and text.count("slept") <= 3
    obs, *_ = env.step(code("print(6 * 7)"))
    assert "42" in obs[0].content


def test_action_length_limit_is_enforced(env):
    long = code("print('ran')") + "x" * 400_000
    obs, reward, terminated, truncated, info = env.step(long)
    assert "over the limit of 65536" in obs[0].content and "ran" not in obs[0].content.split("\n", 1)[1]
    assert info["action_too_long"] == len(long) and info["exec"] is None and not terminated
    boxed = "\\boxed{5}" + " " * 70_000  # not graded either
    obs, reward, terminated, *_ = env.step(boxed)
    assert reward == 0.0 and not terminated
    obs, *_ = env.step(code("print('ok')") + " " * (65536 - len(code("print('ok')"))))  # exactly at the limit
    assert obs[0].content == "```output\nok\n```"


# -- 3. the channel to the host belongs to the host -------------------------------------

FORGE = r"""
import json, os, struct
def frame(obj):
    data = json.dumps(obj).encode()
    return struct.pack('>I', len(data)) + data
forged = [frame({'op': 'result', 'id': i, 'status': s, 'stdout': ['FORGED', '', 0], 'stderr': 7,
                 'error': None, 'error_name': None}) for i in range(1, 6) for s in ('ok', 'weird')]
forged += [frame({'op': 'done', 'id': i, 'status': 'ok', 'error': None, 'error_name': None}) for i in range(1, 6)]
forged += [frame({'op': 'begin', 'id': 1}), frame([1, 2]), b'\xff' * 64, struct.pack('>I', 2**31) + b'{',
           frame({'op': 'result', 'id': 1, 'status': 'ok', 'stdout': {'a': 1}})]
fds = set(range(0, 256)) | {int(f) for f in os.listdir('/proc/self/fd')}
wrote = 0
for fd in sorted(fds):
    for blob in forged:
        try:
            os.write(fd, blob)
            wrote += 1
        except OSError:
            pass
print('wrote', wrote)
"""


def test_forged_frames_on_every_descriptor_never_reach_the_host(env, tokenizer):
    for _ in range(2):
        obs, _, _, _, info = env.step(code(FORGE))
        text = assert_readable(tokenizer, obs)
        assert "```output\nFORGED" not in text and "\nFORGED\n" not in text  # no forged result was taken
        cell = info["exec"]["cells"][0]
        assert (cell["status"], cell["error_name"]) == ("crashed", "ProtocolViolation")
        assert "forged message" in text and "restarted" in text
    obs, *_ = env.step(code("print(6 * 7)"))
    assert "42" in obs[0].content


def test_the_kernel_has_no_descriptor_of_the_host_and_no_config_in_argv(env):
    obs, *_ = env.step(code("import os, sys\nprint(sys.argv)\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"))
    argv, fds = obs[0].content.split("\n")[1:3]
    assert "resp_fd" not in argv and "sock_fd" not in argv and "hide" not in argv
    assert len(json.loads(fds)) <= 6  # stdin/stdout/stderr, two pipes to the supervisor, the listing itself


# -- 4. gold answers are out of reach ---------------------------------------------------

def test_the_kernel_cannot_import_the_project_or_read_task_data(env, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("without root the kernel has the host user's view of the filesystem")
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(json.dumps({"problem": "secret", "answer": "GOLD-123"}) + "\n")
    probes = {
        "import_environments": "import environments",
        "import_trace_gym": "import trace_gym",
        "generate_tasks": "from environments.math_python.generated import generate_tasks",
        "read_readme": f"open({os.path.join(PROJECT, 'README.md')!r}).read()",
        "read_generator": f"open({os.path.join(PROJECT, 'environments/math_python/generated.py')!r}).read()",
        "list_checkout": f"print(os.listdir({PROJECT!r}))",
        "read_task_file": f"open({str(task_file)!r}).read()",
        "sys_path_import": f"sys.path.insert(0, {PROJECT!r})\nimport environments.math_python.generated",
    }
    for name, src in probes.items():
        obs, _, _, _, info = env.step(code(f"import os, sys\n{src}\nprint('REACHED')"))
        text = obs[0].content
        assert "REACHED" not in text and "GOLD-123" not in text, (name, text)
        assert info["exec"]["status"] == "error", (name, text)
    for path in hidden_paths():
        obs, *_ = env.step(code(f"import os\nprint(os.path.exists({path!r}) and os.listdir({path!r}))"))
        # absent, empty, or (a venv inside the checkout) traversable but not listable
        assert (obs[0].content in ("```output\nFalse\n```", "```output\n[]\n```")
                or "PermissionError: [Errno 13] Permission denied" in obs[0].content), (path, obs[0].content)



def test_a_slow_kernel_start_is_not_charged_to_the_response(tokenizer):
    """The per-response budget counts the cells' own run time: a kernel that takes long to
    start (a loaded machine) must not skip the response's cells, or the reward would depend
    on the machine's load. The start is slowed here by a second, around the real kernel."""
    env = MathPythonEnv([TASK], limits=LIMITS, step_timeout_s=0.8, max_turns=5, prestart_kernel=False)
    real = env._ensure_kernel

    def slow_start():
        fresh = env._kernel is None
        kernel = real()
        if fresh:
            time.sleep(1.0)  # longer than the whole response's budget
        return kernel

    env._ensure_kernel = slow_start
    try:
        env.reset(seed=0)
        obs, _, _, _, info = env.step(code("print(6 * 7)", "print(6 * 8)", "import time\ntime.sleep(0.9)", "print(1)"))
        text = assert_readable(tokenizer, obs)
        assert "42" in text and "48" in text, text
        statuses = [c["status"] for c in info["exec"]["cells"]]
        assert statuses[:2] == ["ok", "ok"] and statuses[-1] == "skipped", statuses  # the sleep spent it
        assert "limit per response" in text
    finally:
        env.close()


def test_code_that_ends_its_interpreter_in_every_cell_gets_a_bounded_number_of_new_ones(env, tokenizer):
    """The starts a response may cause are capped (``max_kernel_starts``): with the code budget
    counting only the cells' run time, 8 cells that each end the interpreter would otherwise
    make the step wait for 8 new kernels."""
    assert "42" in env.step(code("print(6 * 7)"))[0][0].content  # a live kernel takes the first cell
    t0 = time.monotonic()
    obs, _, _, _, info = env.step(code(*["import os\nos._exit(0)"] * 8))
    elapsed = time.monotonic() - t0
    statuses = [c["status"] for c in info["exec"]["cells"]]
    ran = 1 + env.max_kernel_starts  # the live kernel's cell, then one per allowed start
    assert statuses == ["crashed"] * ran + ["skipped"] * (8 - ran), statuses
    text = assert_readable(tokenizer, obs)
    assert text.count(f"needed {env.max_kernel_starts} Python sessions, the limit per response") == 8 - ran
    assert elapsed < env.step_timeout_s, f"one step took {elapsed:.1f} s"
    obs, *_ = env.step(code("print(6 * 7)"))  # the next response gets a new session
    assert "42" in obs[0].content

# -- 5. infrastructure faults never change a reward -------------------------------------

def test_grader_killed_between_gradings_regrades_in_a_fresh_worker():
    grader = Grader(timeout_s=10)
    assert grader.grade("\\boxed{5}", "5").correct
    os.kill(grader.worker_pid, signal.SIGKILL)  # the worker dies between gradings
    time.sleep(0.2)
    result = grader.grade("\\boxed{5}", "5")
    assert result.correct and result.reason == "equivalent" and result.attempts == 2 and not result.infra_error
    os.kill(grader.server.pid, signal.SIGKILL)  # so does the workers' fork server
    os.kill(grader.worker_pid, signal.SIGKILL)
    time.sleep(0.2)
    result = grader.grade("\\boxed{5}", "5")
    assert result.correct and not result.infra_error
    grader.close()


def test_grader_worker_killed_while_grading_is_regraded():
    grader = Grader(timeout_s=20)
    grader.grade("\\boxed{1}", "1")  # warm
    killed = []

    def killer():
        deadline = time.monotonic() + 10
        while not grader.grading and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # well inside math-verify's parse of the long sum below
        killed.append(grader.worker_pid)
        os.kill(killed[0], signal.SIGKILL)

    thread = threading.Thread(target=killer)
    thread.start()
    result = grader.grade("\\boxed{5" + "+0" * 300 + "}", "5")  # ~0.5 s of parsing, and correct
    thread.join()
    assert killed, "the worker was never seen grading"
    assert result.correct and result.attempts == 2 and not result.infra_error
    grader.close()


def test_an_ungradable_answer_is_an_infrastructure_error_not_a_wrong_answer():
    broken = ForkServer(preload=("no_such_module_trace_gym",))  # no worker can ever start
    env = MathPythonEnv([TASK], limits=LIMITS, grader=Grader(server=broken), prestart_kernel=False)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("The answer is \\boxed{5}.")
        assert terminated and reward == 0.0
        assert info["infra_error"].startswith("infrastructure_error") and info["grading"]["infra_error"]
        assert info["reward_components"]["infra_error"] == 1.0
    finally:
        env.close()
        broken.close()


def test_a_kernel_that_cannot_start_is_an_infrastructure_error(tokenizer):
    slow = ForkServer(startup_timeout_s=0.001)  # a machine too loaded to start any kernel
    env = MathPythonEnv([TASK], limits=LIMITS, prestart_kernel=False, kernel_server=slow)
    try:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(code("print(1)"))
        assert truncated and info["infra_error"] and info["reward_components"]["infra_error"] == 1.0
        assert "infrastructure error" in assert_readable(tokenizer, obs)
    finally:
        env.close()
        slow.close()


def test_a_dead_fork_server_is_replaced_transparently(env):
    env.step(code("kept = 41"))
    server = env._factory.server
    os.kill(server.pid, signal.SIGKILL)
    time.sleep(0.2)
    obs, *_ = env.step(code("print(kept + 1)"))  # the live kernel does not depend on the server
    assert obs[0].content == "```output\n42\n```"
    other = MathPythonEnv([TASK], limits=LIMITS, prestart_kernel=False)
    try:
        other.reset(seed=1)
        obs, *_ = other.step(code("print(6 * 7)"))  # a new kernel needs a new server: started on demand
        assert obs[0].content == "```output\n42\n```"
    finally:
        other.close()


def test_a_host_holding_descriptors_above_fd_setsize_still_runs_cells():
    """A recording holds many kernels, so the host's descriptors pass 1024 (select's
    FD_SETSIZE); the bank recorded with select had 156 episodes end on "filedescriptor out
    of range in select()". Every wait on a kernel's channel must take such descriptors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"the descriptor limit here ({hard}) is below 1400")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400) if hard == resource.RLIM_INFINITY
                                                else min(max(soft, 1400), hard), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        fresh = MathPythonEnv([TASK], limits=LIMITS, step_timeout_s=6.0)  # its channels open above 1100
        try:
            fresh.reset(seed=0)
            obs, _, _, _, info = fresh.step(code("print(6 * 7)"))
            assert obs[0].content == "```output\n42\n```", info
        finally:
            fresh.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_kernel_killed_between_steps_restarts_with_a_notice(env, tokenizer):
    env.step(code("kept = 1"))
    os.kill(env._kernel.pid, signal.SIGKILL)
    obs, _, _, _, info = env.step(code("print(6 * 7)"))
    text = assert_readable(tokenizer, obs)
    assert "42" in text and "restarted" in text and info["exec"]["cells"][0]["restarted_before"]


def test_fork_bomb_then_the_next_cell_runs(env):
    obs, _, _, _, info = env.step(code("import os\nwhile True:\n    os.fork()", "print(6 * 7)"))
    first, second = obs[0].content.split("\n\n")
    if os.geteuid() == 0:  # the process limit stops it inside the cell: a readable error, not a dead kernel
        assert "BlockingIOError" in first and not info["exec"]["oom"]
    assert second == "```output\n42\n```"
    obs, *_ = env.step(code("print(6 * 7)"))
    assert obs[0].content == "```output\n42\n```"


def test_fork_bomb_that_ignores_errors_times_out_and_the_next_cell_runs_restarted(env):
    src = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    obs, _, _, _, info = env.step(code(src, "print(6 * 7)"))
    first, second = obs[0].content.split("\n\n")
    assert "TimeoutError" in first and "restarted" in first and info["exec"]["cells"][0]["status"] == "timeout"
    assert not info["exec"]["oom"] and second == "```output\n42\n```"


def test_background_thread_output_is_attributed(env):
    env.step(code("import threading, time\n"
                  "def later():\n    time.sleep(0.2)\n    print('from the thread')\n"
                  "threading.Thread(target=later).start()\nprint('started')"))
    time.sleep(2.5)  # generous: the machine may be loaded
    obs, _, _, _, info = env.step(code("print('mine')"))
    text = obs[0].content
    assert "background thread" in text and "from the thread" in text
    assert text.index("from the thread") < text.index("mine") and text.rstrip("`\n").endswith("mine")
    assert info["exec"]["cells"][0]["background_bytes"] == len("from the thread\n")


def test_background_exit_restarts_the_next_cell_with_the_real_cause(env):
    env.step(code("import threading, time, os\n"
                  "threading.Thread(target=lambda: (time.sleep(0.2), os._exit(3))).start()"))
    time.sleep(2.5)
    obs, _, _, _, info = env.step(code("print(6 * 7)"))
    text = obs[0].content
    assert "exited with code 3" in text and "restarted" in text and text.endswith("\n42\n```")


def test_kernel_close_is_complete(env):
    if os.geteuid() != 0:
        pytest.skip("no pid namespace without root")
    obs, *_ = env.step(code("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n"
                            "        time.sleep(600)\nprint(os.getuid())"))
    uid = int(obs[0].content.splitlines()[1])
    env.close()
    deadline = time.monotonic() + 10
    while _processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_of(uid) == []


def _processes_of(uid: int) -> list[int]:
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


def test_default_pool_is_made_lazily():
    import environments.math_python.env as env_module

    env_module.default_tasks.cache_clear()
    env = MathPythonEnv(prestart_kernel=False)
    try:
        assert env_module.default_tasks.cache_info().currsize == 0  # not made at construction
        env.reset(seed=0, options={"task": TASK})
        assert env_module.default_tasks.cache_info().currsize == 0  # nor when the task is given
        env.reset(seed=0)
        assert len(env.tasks) == 64 and env_module.default_tasks.cache_info().currsize == 1
    finally:
        env.close()


def test_the_grader_starts_in_the_background_at_env_creation():
    grader = Grader(server=ForkServer(preload=("sympy", "math_verify"), warmup="x = 1\n"))
    env = MathPythonEnv([TASK], grader=grader)
    try:
        deadline = time.monotonic() + 60
        while grader.worker_pid is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert grader.server.pid is not None and grader.worker_pid is not None  # no grading asked for them
    finally:
        env.close()
        grader.close()
        grader.server.close()


def test_a_kernel_answers_fast_after_the_server_started():
    kernel = Kernel(LIMITS)
    kernel.start(0)
    kernel.wait_ready()
    kernel.close()
    t0 = time.monotonic()
    kernel = Kernel(LIMITS)
    kernel.start(1)
    result = kernel.execute("import sympy\nprint(sympy.Integer(6) * 7)")
    kernel.close()
    assert result.stdout.text() == "42\n" and time.monotonic() - t0 < 5  # generous: 2 shared cores


def test_kernels_share_no_ipc_objects():
    if os.geteuid() != 0:
        pytest.skip("no IPC namespace without root")
    msgget = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "print(libc.msgget(0x7ace, {flags}), ctypes.get_errno())")
    a, b = Kernel(LIMITS, seed=1), Kernel(LIMITS, seed=2)
    try:
        made = a.execute(msgget.format(flags=0o1000 | 0o666)).stdout.text().split()  # IPC_CREAT, world-open
        seen = b.execute(msgget.format(flags=0)).stdout.text().split()
        assert int(made[0]) >= 0 and seen == ["-1", "2"]  # ENOENT: the other kernel's queue does not exist here
    finally:
        a.close()
        b.close()


def test_paths_inside_exposed_directories_can_be_hidden():
    if os.geteuid() != 0:
        pytest.skip("no sandbox root without root")
    dirs = [p for p in ("/usr/share/zoneinfo", "/usr/share/doc") if os.path.isdir(p)]
    files = [p for p in ("/etc/os-release", "/etc/hostname") if os.path.isfile(p)]
    if not dirs or not files:
        pytest.skip("no directory and file to hide on this machine")
    hidden_dir, hidden_file = dirs[0], files[0]
    server = ForkServer(preload=(), hide=(hidden_dir, hidden_file))
    try:
        kernel = Kernel(LIMITS, server=server, seed=0)
        out = kernel.execute(f"import os\nprint(os.listdir({hidden_dir!r}), repr(open({hidden_file!r}).read()))")
        assert out.stdout.text() == "[] ''\n", out
        assert os.listdir(hidden_dir) and open(hidden_file).read()  # the host still sees them
        kernel.close()
    finally:
        server.close()


def test_an_answer_that_kills_the_grader_every_time_is_wrong_not_excluded():
    # a worker whose comparison dies on this answer (as a pathological expression might):
    crashing = ForkServer(preload=(), warmup="import os\ndef _grade(gold, candidate, timeout_s):\n    os._exit(3)\n")
    grader = Grader(server=crashing)
    try:
        result = grader.grade("\\boxed{5}", "5")
        assert not result.correct and not result.infra_error and result.attempts == 2
        assert result.reason.startswith("grader_crashed") and "code 3" in result.reason
    finally:
        grader.close()
        crashing.close()
