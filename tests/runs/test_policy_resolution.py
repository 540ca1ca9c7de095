"""One resolver for every command's ``--policy`` / ``policy=`` (``trace_gym.runs.policies``): a
bad folder or name is one line naming it, exit 2, before any model loads and before any
run dir or output is written; a run's checkpoint resolves to its policy folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trace_gym import cli
from trace_gym.runs.policies import find_policy, with_policy


@pytest.fixture
def not_a_model(tmp_path) -> Path:
    """A folder that is no model: one random file, no config.json."""
    folder = tmp_path / "not_a_model"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    return folder


def _one_line(capsys, command: str, value: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"trace-gym {command}: error: policy {value!r}"), lines[0]
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_bench_env_with_a_folder_or_name_that_is_no_model_is_one_line(tmp_path, not_a_model, capsys):
    out = tmp_path / "bench_out"
    for value in (str(not_a_model), "not-a-model"):
        assert cli.main(["bench", "--env", "math_python", "--policy", value, "--out", str(out),
                         "--json", str(out / "r.json")]) == 2
        line = _one_line(capsys, "bench", value)
        assert ("no config.json" in line) == (value != "not-a-model")
    assert not out.exists()


def test_bank_record_with_a_folder_that_is_no_model_is_one_line(tmp_path, not_a_model, capsys):
    bank = tmp_path / "banks" / "b.jsonl.gz"
    for extra in ([], ["--dry-run"]):
        assert cli.main(["bank", "record", "--policy", str(not_a_model), "--out", str(bank), *extra]) == 2
        assert "neither a model (no config.json) nor a run dir" in _one_line(capsys, "bank", str(not_a_model))
    assert not bank.parent.exists()


@pytest.mark.parametrize("dry_run", [True, False])
def test_train_with_a_bad_policy_writes_no_run_dir(tmp_path, not_a_model, capsys, dry_run):
    run_dir = tmp_path / "run"
    for value in (str(not_a_model), "smollm2-135n"):
        assert cli.main(["train", f"policy={value}", f"run_dir={run_dir}", *(["--dry-run"] if dry_run else [])]) == 2
        line = _one_line(capsys, "train", value)
        if value == "smollm2-135n":
            assert "did you mean smollm2-135m" in line
    assert not run_dir.exists()


def test_train_with_bad_data_writes_no_run_dir_so_the_fixed_command_is_not_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(["train", "data=hotpotqa", f"data_path={tmp_path / 'missing.jsonl'}", f"run_dir={run_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data_path=" in err[0], err
    assert not run_dir.exists()


def test_a_checkpoint_resolves_to_its_policy_folder_and_a_model_is_left_as_given(tmp_path):
    from trace_gym.runs.run_dir import RunDir
    from trace_gym.banks.config import BankRecordConfig

    run = RunDir(tmp_path / "my_run")
    run.start("x: 1\n")
    for step in (1, 3):
        run.commit(step, {"step": step}, lambda f: (f / "policy").mkdir(), keep=0)
    run = run.path
    policy = find_policy(f"{run}@3")
    assert (policy.ref, policy.label, policy.base) == (str(run / "checkpoints" / "step-3" / "policy"), "my_run@3", False)
    cfg = with_policy(BankRecordConfig(policy=f"{run}@3"))
    assert cfg.policy == policy.ref
    named = BankRecordConfig(policy="smollm2-135m")
    assert with_policy(named) is named  # a name is kept as given (the run config and bank manifest keep it)
    with pytest.raises(ValueError, match=r"step after @ must be an integer"):
        find_policy(f"{run}@last")


def test_a_checkpoint_named_by_its_folder_is_the_runs_checkpoint_not_a_base_model(tmp_path):
    """``RUN/checkpoints/step-N/policy`` (or ``.../step-N``) is ``RUN@N``: checked against the
    manifest and labelled as the run's step, never "ReAct (no RL)"."""
    from trace_gym.runs.run_dir import RunDir

    run = RunDir(tmp_path / "my_run")
    run.start("x: 1\n")
    run.commit(2, {"step": 2}, lambda f: ((f / "policy").mkdir(), (f / "policy" / "config.json").write_text("{}"),
                                          (f / "policy" / "model.safetensors").write_bytes(b"w" * 32)), keep=0)
    step = run.checkpoints / "step-2"
    for spec in (step / "policy", step, f"{step / 'policy'}/.", step / "policy" / ".." / "policy"):
        policy = find_policy(str(spec))
        assert (policy.label, policy.base, Path(policy.ref)) == ("my_run@2", False, step / "policy"), spec
        assert dict(policy.file_sha256) == {"config.json": hashlib.sha256(b"{}").hexdigest(),
                                            "model.safetensors": hashlib.sha256(b"w" * 32).hexdigest()}
    (step / "policy" / "model.safetensors").write_bytes(b"X" * 32)  # same size, other bytes: refused as by RUN@2
    with pytest.raises(ValueError, match="model.safetensors differs from the manifest"):
        find_policy(str(step / "policy"))


def test_a_missing_path_under_a_local_folder_is_not_taken_for_a_hub_id(tmp_path, monkeypatch, capsys):
    """``runs/does_not_exist`` where ``runs/`` exists: one line naming the folder and the
    closest names in it, never a hub lookup (and not "the hub is off" offline)."""
    from trace_gym.models import locate_model

    (tmp_path / "runs" / "train_trace").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for spec in ("runs/does_not_exist", "runs/train_trac"):
        with pytest.raises(ValueError) as caught:
            find_policy(spec)
        assert str(caught.value).startswith(f"policy {spec!r}: no model folder or run dir there (runs/ exists here, "
                                            "so it is read as a local path, not a hub id"), caught.value
    assert "did you mean runs/train_trace?" in str(caught.value)
    with pytest.raises(FileNotFoundError, match="read as a local path, not a hub id"):
        locate_model("runs/does_not_exist")  # the one rule, for train's policy= and critic_model= too
    assert locate_model("Qwen/Qwen3-0.6B") is None  # no Qwen/ here: still a hub id
    assert cli.main(["eval", "--policy", "runs/does_not_exist", f"out={tmp_path / 'ev'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a hub id" in err[0] and "offline" not in err[0], err
    assert not (tmp_path / "ev").exists()


def test_a_hub_failure_is_said_whole_or_marked_where_it_was_cut():
    from huggingface_hub.errors import LocalEntryNotFoundError

    from trace_gym.models import hub_failure

    said = ("An error happened while trying to locate the files on the Hub, and we cannot find the appropriate "
            "snapshot folder for the specified revision on the local disk. Please check your internet connection "
            "and try again.")
    line = hub_failure("org/model", LocalEntryNotFoundError(said))
    assert f"(LocalEntryNotFoundError: {said});" in line and "\n" not in line  # whole: 241 characters
    long = hub_failure("org/model", RuntimeError("word " * 300))
    assert "characters cut ...]" in long and len(long) < 600


def _run_whose_checkpoints_is_a_file(root: Path) -> None:
    (root / "run").mkdir()
    (root / "run" / "config.yaml").write_text("x: 1\n")
    (root / "run" / "checkpoints").write_text("not a folder")


#: issue 44 D: spec -> (what to plant under the current folder, a piece of the one line)
BAD_SPECS = {
    "run": (_run_whose_checkpoints_is_a_file, "'run' looks like a run dir, but its checkpoints is not a folder"),
    "run@3": (_run_whose_checkpoints_is_a_file, "'run' looks like a run dir, but its checkpoints is not a folder"),
    "~nosuchuser_t44/model": (lambda root: None, "'~nosuchuser_t44' names no user of this machine"),
    "~nosuchuser_t44/run@2": (lambda root: None, "'~nosuchuser_t44' names no user of this machine"),
}


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_a_policy_spec_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, capsys, spec):
    plant, said = BAD_SPECS[spec]
    plant(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"^policy {spec!r}: ") as caught:
        find_policy(spec)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    assert cli.main(["eval", "--policy", spec, f"out={tmp_path / 'ev'}"]) == 2  # the command: one line, exit 2
    assert said in _one_line(capsys, "eval", spec) and not (tmp_path / "ev").exists()


@pytest.mark.parametrize("name", ["qwen@v2", "qwen@2", "a@b@3"])
def test_a_model_folder_with_an_at_sign_is_a_model_folder_not_run_at_step(tmp_path, monkeypatch, name):
    """A path-like spec is tried as a path first: ``models/qwen@v2`` that exists is that
    folder (it was split at the first ``@`` and refused as RUN@STEP)."""
    folder = tmp_path / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    for spec in (f"models/{name}", str(folder)):
        policy = find_policy(spec)
        assert (policy.ref, policy.base) == (spec, True)


@pytest.mark.parametrize("plant", ["folder", "folder_with_a_file"])
def test_a_lock_that_is_a_folder_is_one_line(tmp_path, plant):
    from trace_gym.runs.run_dir import RunDir

    (tmp_path / "run" / ".lock").mkdir(parents=True)
    if plant == "folder_with_a_file":
        (tmp_path / "run" / ".lock" / "x").write_text("x")
    with pytest.raises(ValueError) as caught:
        RunDir(tmp_path / "run").start("a: 1\n")
    assert str(caught.value) == f"run dir {str(tmp_path / 'run')!r}: .lock is a folder, not the run's lock file " \
        "(remove it)"
