"""One resolver for every command's ``--policy`` / ``policy=`` (``trace_gym.policies``): a
bad folder or name is one line naming it, exit 2, before any model loads and before any
run dir or output is written; a run's checkpoint resolves to its policy folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_gym import cli
from trace_gym.policies import find_policy, with_policy


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
    from trace_gym.checkpoint import RunDir
    from trace_gym.entry_configs import BankRecordConfig

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
