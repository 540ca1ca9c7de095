"""``trace-gym check-env ENV``: the conformance kit from the command line (PASS/SKIP/FAIL
per check, exit 1 on a failure, one line and exit 2 for a bad id or check name);
``--env verifiers:MODULE`` finds ``MODULE.py`` in the current folder as ``--plugin`` does,
with ``datasets``' ``Map:`` bars kept off unless ``--verbose``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_gym import cli

ROOT = Path(__file__).resolve().parents[2]
GUESS = "gem:game:GuessTheNumber-v0-easy"

# a tiny classic verifiers env: one question, an exact-match rubric; its dataset is
# formatted with `datasets`' map (the `Map:` bar the command line must keep quiet)
VF_ADD = '''
import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((2, 3), (4, 4), (1, 6))]
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def exact(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Answer in <answer> tags.",
                            parser=parser, rubric=vf.Rubric(funcs=[exact], parser=parser))
'''

# a native env whose restore() forgets to restore: snapshot_roundtrip must FAIL
FORGETFUL = '''
from environments.guess_number.env import GuessNumberEnv, make_tasks
from trace_gym.api import register_env


class ForgetfulGuess(GuessNumberEnv):
    def restore(self, snapshot):
        pass


register_env("ForgetfulGuess-v0", ForgetfulGuess, task_loader=make_tasks)
'''


def test_check_env_runs_the_kit_on_a_gem_game(capsys):
    assert cli.main(["check-env", GUESS, "only=snapshot_roundtrip,protocol", "tasks=2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"check-env {GUESS} (trace_gym/gem.game.GuessTheNumber-v0-easy): 2 task(s)")
    assert out[1:3] == ["  PASS  protocol (1 case)", "  PASS  snapshot_roundtrip (2 cases)"]  # the kit's order
    assert out[-1] == "OK: snapshot strategy copy; 2 passed, 0 skipped"


def test_a_bad_check_name_or_env_id_is_one_line_exit_2(capsys):
    assert cli.main(["check-env", GUESS, "only=snapshot_rountrip"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'snapshot_rountrip' is not a check; did you mean snapshot_roundtrip?" in err[0]
    assert cli.main(["check-env", "gem:game:GuessTheNumbr-v0-easy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean game:GuessTheNumber-v0-easy" in err[0]


def test_a_failing_check_is_named_with_exit_1_and_the_rest_listed(tmp_path, monkeypatch, capsys):
    from registry_fixtures import registries_restored

    (tmp_path / "forgetful_t35.py").write_text(FORGETFUL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with registries_restored(lambda name, module: name == "forgetful_t35"):
        code = cli.main(["check-env", "ForgetfulGuess-v0", "--plugin", "forgetful_t35",
                         "only=protocol,snapshot_roundtrip,close_idempotent", "tasks=1"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "  PASS  protocol (1 case)" in out and "  FAIL  snapshot_roundtrip: task " in out
    assert "not run: close_idempotent" in out and "Traceback" not in out


# a correct env that only a --plugin module registers (its class lives in the module itself)
LOCAL_GUESS = '''
from environments.guess_number.env import GuessNumberEnv, make_tasks
from trace_gym.api import register_env


class LocalGuess(GuessNumberEnv):
    pass


register_env("LocalGuess-v0", LocalGuess, task_loader=make_tasks)
'''


def test_a_plugin_env_passes_the_cross_process_check_from_the_command_line(tmp_path, monkeypatch, capsys):
    """The fresh worker of snapshot_pickle_process imports the --plugin module before it makes
    the env (issue 41: it never did, and gymnasium said NameNotFound for an env that passes
    every check through the Python API)."""
    from registry_fixtures import registries_restored

    (tmp_path / "local_guess_t41.py").write_text(LOCAL_GUESS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.realpath(p or os.curdir) != str(tmp_path)])
    with registries_restored(lambda name, module: name == "local_guess_t41"):
        code = cli.main(["--plugin", "local_guess_t41", "check-env", "LocalGuess-v0",
                         "only=snapshot_roundtrip,snapshot_pickle_process", "tasks=1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "  PASS  snapshot_pickle_process (" in out and "NameNotFound" not in out


@pytest.fixture
def vf_module_here(tmp_path, monkeypatch):
    """``vf_add_t35.py`` in the current folder, which is not on ``sys.path`` (as under the
    installed ``trace-gym`` script, whose ``sys.path[0]`` is its bin folder)."""
    pytest.importorskip("verifiers")
    from registry_fixtures import registries_restored

    (tmp_path / "vf_add_t35.py").write_text(VF_ADD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.realpath(p or os.curdir) != str(tmp_path)])
    with registries_restored(lambda name, module: name == "vf_add_t35"):
        yield tmp_path


def test_env_verifiers_module_finds_a_module_in_the_current_folder_with_no_map_bars(vf_module_here, capsys):
    assert cli.main(["check-env", "verifiers:vf_add_t35", "only=message_schema,snapshot_roundtrip", "tasks=2"]) == 0
    captured = capsys.readouterr()
    assert "PASS  snapshot_roundtrip (2 cases)" in captured.out
    assert "Map" not in captured.err + captured.out  # datasets' bars while the env formats its dataset


@pytest.mark.slow  # ~25 s: two fresh interpreters import verifiers
def test_the_map_bars_show_with_verbose_only(vf_module_here):
    def run(*args: str) -> subprocess.CompletedProcess:
        code = "import sys; from trace_gym.cli import main; sys.exit(main(sys.argv[1:]))"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        env.pop("HF_DATASETS_DISABLE_PROGRESS_BARS", None)
        return subprocess.run([sys.executable, "-c", code, *args, "check-env", "verifiers:vf_add_t35",
                               "only=message_schema", "tasks=1"], cwd=vf_module_here, env=env, capture_output=True,
                              text=True, timeout=180)

    quiet, loud = run(), run("--verbose")
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert "Map" not in quiet.stderr and "Map" in loud.stderr
