"""Issue 44 D: ``check-env`` runs the whole kit inside the env boundary. A hung call, an exit,
a constructor or task loader that fails, a missing entry module, an error text with a lone
surrogate, an env that prints while the cross-process worker replies, an endless reference
generator: each is one line (a FAIL naming what and where, exit 1) and never a hang, a
traceback or a silent exit 0; options are refused as the user's (exit 2) before the env loads."""

from __future__ import annotations

import os
import sys

import pytest

from trace_gym import cli

# one plugin module of hostile envs, each a GuessNumber with one thing broken
HOSTILE = '''
import itertools, os, sys, time
from environments.guess_number.env import GuessNumberEnv, make_tasks
from trace_gym.api import register_env


class ExitInReset(GuessNumberEnv):
    def reset(self, *, seed=None, options=None):
        sys.exit(0)


class HangInStep(GuessNumberEnv):
    def step(self, action):
        while True:
            time.sleep(0.01)


class HangInReset(GuessNumberEnv):
    def reset(self, *, seed=None, options=None):
        while True:
            time.sleep(0.01)


class PrintsInStep(GuessNumberEnv):
    def step(self, action):
        print("stepping on", action)
        sys.stdout.flush()
        os.write(1, b"and from C\\n")
        return super().step(action)


class EndlessReference(GuessNumberEnv):
    def reference_actions(self, task):
        return (f"guess: {i}" for i in itertools.count(1))


class RaisesInCtor(GuessNumberEnv):
    def __init__(self, **kwargs):
        raise RuntimeError("no backend here")


class Surrogate(GuessNumberEnv):
    def step(self, action):
        raise RuntimeError("bad \\udc80 byte")


class ExitInWorker(GuessNumberEnv):
    def restore(self, snapshot):
        if str(os.getpid()) != os.environ["T44_KIT_PID"]:
            sys.exit(0)  # only in the cross-process worker
        super().restore(snapshot)


def failing_loader(n, seed=0):
    raise RuntimeError("dataset gone")


for cls in (ExitInReset, HangInStep, HangInReset, PrintsInStep, EndlessReference, RaisesInCtor, Surrogate,
            ExitInWorker):
    register_env(f"{cls.__name__}-v0", cls, task_loader=make_tasks)
register_env("FailingLoader-v0", GuessNumberEnv, task_loader=failing_loader)
register_env("NoEntryModule-v0", "no_such_module_t44.env:Env", task_loader=make_tasks)
'''


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    from registry_fixtures import registries_restored

    (tmp_path / "hostile_t44.py").write_text(HOSTILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setenv("T44_KIT_PID", str(os.getpid()))
    with registries_restored(lambda name, module: name == "hostile_t44"):
        yield


def _check_env(capsys, env_id: str, *args: str) -> tuple[int, list[str], str]:
    code = cli.main(["--plugin", "hostile_t44", "check-env", env_id, "tasks=1", *args])
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines(), captured.err


# env id, extra arguments, (exit code, a piece of the FAIL line, the check it names or None)
FAILING = {
    "exit_in_reset": ("ExitInReset-v0", [], "FAIL  gymnasium_api: ExitInReset: the env's reset raised SystemExit: 0"),
    "hang_in_step": ("HangInStep-v0", ["only=message_schema", "call_timeout_s=1"],
                     "FAIL  message_schema: HangInStep: the env's step gave no reply within call_timeout_s=1 s"),
    "hang_in_reset": ("HangInReset-v0", ["call_timeout_s=1"],
                      "FAIL  gymnasium_api: HangInReset: the env's reset gave no reply within call_timeout_s=1 s"),
    "ctor_raises": ("RaisesInCtor-v0", [],
                    "check-env RaisesInCtor-v0: FAIL: building the env raised RuntimeError: no backend here"),
    "loader_raises": ("FailingLoader-v0", [],
                      "check-env FailingLoader-v0: FAIL: its task loader raised RuntimeError: dataset gone"),
    "no_entry_module": ("NoEntryModule-v0", [], "FAIL: building the env raised ModuleNotFoundError: No module "
                        "named 'no_such_module_t44'"),
    "lone_surrogate": ("Surrogate-v0", ["only=message_schema"], "FAIL  message_schema: RuntimeError: bad \\udc80 byte"),
    "exit_in_worker": ("ExitInWorker-v0", ["only=snapshot_pickle_process"],
                       "FAIL  snapshot_pickle_process: in the worker process, the env raised SystemExit: 0"),
}


@pytest.mark.parametrize("case", FAILING)
def test_what_an_env_does_wrong_is_one_fail_line_and_exit_1(hostile, capsys, case):
    env_id, args, line = FAILING[case]
    code, out, err = _check_env(capsys, env_id, *args)
    assert code == 1, (out, err)  # never 0 (CI reads success), never a traceback
    assert any(line in row for row in out), out
    assert "Traceback" not in err and sum("FAIL" in row for row in out) == 1


@pytest.mark.parametrize("env_id,args", [("PrintsInStep-v0", ["only=snapshot_pickle_process"]),
                                         ("EndlessReference-v0", ["only=message_schema,snapshot_roundtrip",
                                                                  "max_steps=3"])])
def test_an_env_that_prints_or_scripts_forever_still_passes(hostile, capsys, env_id, args):
    """The worker's reply travels on a private copy of its stdout (an env printing there, from
    Python or C, corrupted the pickle: "could not find MARK"); reference actions are taken
    lazily, at most max_steps of them (an endless generator was listed whole)."""
    code, out, _ = _check_env(capsys, env_id, *args)
    assert code == 0, out
    assert out[-1].startswith("OK: snapshot strategy native") and not any("FAIL" in row for row in out)


@pytest.mark.parametrize("flag,value,named", [
    ("process_timeout", "nan", "process_timeout must be a finite number of seconds > 0, got nan"),
    ("process_timeout", "-1", "process_timeout must be a finite number of seconds > 0, got -1.0"),
    ("call_timeout_s", "inf", "call_timeout_s must be a finite number of seconds > 0, got inf"),
    ("seed", "-1", "seed must be an integer >= 0 (Gymnasium seeds no further down), got -1"),
    ("max_steps", "0", "max_steps must be an integer >= 1, got 0"),
])
def test_an_option_out_of_range_is_the_users_error_before_the_env_loads(hostile, capsys, flag, value, named):
    code, out, err = _check_env(capsys, "RaisesInCtor-v0", f"{flag}={value}")  # its constructor would fail
    assert code == 2 and out == [], out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"trace-gym check-env: error: {named}", lines


def test_the_python_api_turns_an_exit_into_the_failing_check(hostile):
    """check_env() itself: sys.exit in reset fails the check that called it (an EnvCheckError
    naming the call), the env is not closed through a call that is still running, and a bad
    option is a ValueError before any check runs."""
    import hostile_t44

    from trace_gym.env.contract import EnvCheckError
    from trace_gym.env.checks import check_env

    tasks = hostile_t44.make_tasks(1)
    with pytest.raises(EnvCheckError, match=r"^\[seeded_determinism\] ExitInReset: the env's reset raised "
                                            r"SystemExit: 0$"):
        check_env(hostile_t44.ExitInReset(), tasks, only="seeded_determinism")
    with pytest.raises(EnvCheckError, match=r"HangInStep: the env's step gave no reply within call_timeout_s=0.5 s"):
        check_env(hostile_t44.HangInStep(), tasks, only="message_schema", call_timeout_s=0.5)
    for option in ({"seed": -1}, {"process_timeout": float("nan")}, {"max_steps": True}):
        with pytest.raises(ValueError, match=next(iter(option))):
            check_env(hostile_t44.HangInStep(), tasks, **option)
