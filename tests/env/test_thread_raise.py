"""A foreign call given up while blocked in C leaves no exception pending: CPython 3.11 keeps an
interpreter-wide flag set while one is, and every line run under ``sys.settrace`` (a debugger,
coverage) then spins for ever (trace_gym.env.thread_raise). Each case runs in a fresh
interpreter, so that a spin is a timeout here, not a hung test session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A call blocked in C (a 60 s sleep) is given up by the boundary; then a traced function runs.
# PLANT=1 puts back the boundary as it was: the exception sent to the helper stays pending.
SCRIPT = """
import os, sys, threading, time
from trace_gym.env import boundary, thread_raise
from trace_gym.env.boundary import ForeignBoundary, ForeignEnvError
if os.environ.get("PLANT") == "1":
    thread_raise.withdraw = lambda thread: None
b = ForeignBoundary(call_timeout_s=0.2)
try:
    b.call("step", time.sleep, 60, where="Sleeper")
except ForeignEnvError as exc:
    print("given up:", exc)
assert b.stuck
lines = []
def tracer(frame, event, arg):
    return local
def local(frame, event, arg):
    lines.append(event)
    return local
def work():
    return sum(i for i in range(2000))
sys.settrace(tracer)
work()
sys.settrace(None)
print("traced lines:", len(lines))
"""


def _run(plant: bool, timeout: float) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PLANT": "1" if plant else "0"}
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_tracing_after_a_call_given_up_in_c_runs():
    out = _run(plant=False, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "given up: Sleeper: the env's step gave no reply" in out.stdout
    assert int(out.stdout.split("traced lines:")[1]) > 2000


def test_the_planted_boundary_that_leaves_the_exception_pending_spins():
    with pytest.raises(subprocess.TimeoutExpired):
        _run(plant=True, timeout=6)


def test_an_exception_pending_for_another_thread_is_still_delivered_after_a_withdrawal():
    import threading
    import time

    from trace_gym.env import thread_raise

    class Stop(BaseException):
        pass

    blocked = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    gate, stopped = threading.Event(), threading.Event()

    def loop_after_the_gate():
        try:
            gate.wait()
            while True:
                sum(range(10))
        except Stop:
            stopped.set()

    looping = threading.Thread(target=loop_after_the_gate, daemon=True)
    blocked.start()
    looping.start()
    thread_raise.raise_in(blocked, Stop)
    thread_raise.raise_in(looping, Stop)  # pending while that thread waits at the gate
    thread_raise.withdraw(blocked)
    gate.set()
    assert stopped.wait(10)
    looping.join(10)
    assert not looping.is_alive() and blocked.is_alive()
