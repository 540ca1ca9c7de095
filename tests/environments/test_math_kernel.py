"""The persistent kernel itself: state, seeds, output capture, errors, limits, lifecycle."""

from __future__ import annotations

import os

import pytest

from environments.math_python.sandbox import Kernel, KernelFactory, KernelLimits, StreamOutput


@pytest.fixture(scope="module")
def kernel():
    k = Kernel(KernelLimits(cell_timeout_s=20, output_bytes=1024))
    k.start(seed=7)
    yield k
    k.close()


def test_variables_and_imports_persist(kernel):
    assert kernel.execute("a = 20\nimport fractions").status == "ok"
    result = kernel.execute("print(a + 22, fractions.Fraction(1, 3))")
    assert (result.status, result.stdout.text()) == ("ok", "42 1/3\n")


def test_last_expression_is_displayed_like_a_notebook(kernel):
    assert kernel.execute("x = 3\nx * 2").stdout.text() == "6\n"
    assert kernel.execute("None").stdout.text() == ""
    assert kernel.execute("y = 1").stdout.text() == ""


def test_preloaded_modules_import_instantly(kernel):
    result = kernel.execute("import sys\nprint('numpy' in sys.modules, 'sympy' in sys.modules)")
    assert result.stdout.text() == "True True\n"
    assert kernel.execute("import sympy\nsympy.factor(sympy.Symbol('x')**2 - 1)").stdout.text() == "(x - 1)*(x + 1)\n"


def test_stdout_stderr_and_traceback_are_separate(kernel):
    result = kernel.execute("import sys\nprint('out')\nprint('err', file=sys.stderr)\n1 / 0")
    assert result.status == "error" and result.error_name == "ZeroDivisionError"
    assert result.stdout.text() == "out\n" and result.stderr.text() == "err\n"
    assert 'File "<cell' in result.error and "1 / 0" in result.error and "_kernel_driver" not in result.error
    assert result.kernel_alive


def test_syntax_error_is_reported(kernel):
    result = kernel.execute("def broken(:\n    pass")
    assert result.status == "error" and result.error_name == "SyntaxError" and "SyntaxError" in result.error


def test_system_exit_and_input_do_not_end_the_kernel(kernel):
    assert kernel.execute("raise SystemExit(3)").error_name == "SystemExit"
    assert kernel.execute("input()").error_name == "EOFError"
    assert kernel.execute("print('alive')").stdout.text() == "alive\n"


def test_output_is_capped_with_head_and_tail(kernel):
    result = kernel.execute("print('A' * 5000)\nprint('END')")
    assert result.stdout.omitted == 5005 - 1024  # 5001 + 4 bytes written, 1024 kept
    text = result.stdout.text()
    assert text.startswith("A" * 100) and text.endswith("END\n")
    assert "[... output truncated: 3981 bytes omitted ...]" in text
    assert len(text) < 1200


def test_output_of_subprocesses_is_captured(kernel):
    result = kernel.execute("import subprocess\nsubprocess.run(['echo', 'from child'])")
    assert "from child" in result.stdout.text()


def test_seeded_kernels_repeat_and_differ():
    draws = []
    for seed in (11, 11, 12):
        k = Kernel()
        k.start(seed)
        draws.append(k.execute("import random, numpy\nprint(random.random(), numpy.random.rand())").stdout.text())
        k.close()
    assert draws[0] == draws[1] != draws[2]


def test_hash_seed_is_fixed():
    outs = []
    for _ in range(2):
        k = Kernel(preload=())
        k.start(0)
        outs.append(k.execute("print(list({'alpha', 'beta', 'gamma', 'delta'}))").stdout.text())
        k.close()
    assert outs[0] == outs[1]


def test_protections_are_reported(kernel):
    hello = kernel.wait_ready()
    assert set(hello["protections"]) >= {"RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_NPROC", "user"}
    if os.geteuid() == 0:
        assert kernel.uid is not None and kernel.uid != 0
        assert hello["protections"]["network"].startswith("none")
        assert kernel.execute("import os\nprint(os.getcwd())").stdout.text() == "/tmp/work\n"


def test_environment_is_scrubbed(kernel):
    env = kernel.execute("import os\nprint(sorted(os.environ))").stdout.text()
    assert "PATH" in env and "PYTHONHASHSEED" in env and "VIRTUAL_ENV" not in env


def test_a_dead_kernel_refuses_work_and_close_is_idempotent():
    k = Kernel(preload=())
    k.start(0)
    result = k.execute("import os\nos._exit(5)")
    assert result.status == "crashed" and result.error_name == "exit code 5" and not k.alive
    with pytest.raises(RuntimeError, match="dead"):
        k.execute("1")
    k.close()
    k.close()


def test_timeout_override_and_status():
    k = Kernel(KernelLimits(cell_timeout_s=30), preload=())
    k.start(0)
    result = k.execute("import time\ntime.sleep(30)", timeout=0.5)
    assert result.status == "timeout" and result.timed_out and not result.kernel_alive
    assert 0.4 < result.elapsed < 10


def test_cpu_limit_kills_the_kernel():
    k = Kernel(KernelLimits(cpu_time_s=1, cell_timeout_s=30), preload=())
    k.start(0)
    result = k.execute("while True:\n    pass")
    assert result.status == "crashed" and result.error_name in ("SIGXCPU", "SIGKILL", "CPULimit")  # own, or the kernel's


def test_factory_forks_kernels_from_one_server():
    factory = KernelFactory(KernelLimits(), prestart=True, preload=())
    first, second = factory.new_kernel(1), factory.new_kernel(2)
    assert first.pid != second.pid and first.server is second.server and first.server.pid is not None
    assert first.execute("print(1)").stdout.text() == "1\n" and second.execute("print(2)").stdout.text() == "2\n"
    for k in (first, second):
        k.close()
    factory.close()


def test_limits_are_validated():
    with pytest.raises(ValueError, match="memory_mb"):
        KernelLimits(memory_mb=0)
    with pytest.raises(ValueError, match="output_bytes"):
        KernelLimits(output_bytes=8)


def test_stream_output_text():
    assert StreamOutput("ab", "", 0).text() == "ab"
    assert StreamOutput("ab", "yz", 5).text("|{omitted}|") == "ab|5|yz"


def test_a_forked_copy_of_the_host_does_not_kill_the_kernel():
    k = Kernel(preload=())
    k.start(0)
    assert k.execute("v = 5").status == "ok"
    pid = os.fork()
    if pid == 0:  # the child drops its copy, as a dying DataLoader worker would
        k.close()
        os._exit(0)
    os.waitpid(pid, 0)
    assert k.execute("print(v)").stdout.text() == "5\n"
    k.close()
