"""A run dir is input too: anyone may have edited it, and its manifest is no signature.
Resume reads ``rng.pt`` and ``predictor.pt`` without unpickling code (a tampered file
could otherwise run any command), and a state file of the wrong shape is one ValueError
naming it."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from trace_gym.runs.checkpoint import TRAINING_STEP_FILES, write_manifest
from trace_gym.runs.files import load_state_file
from trace_gym.runs.run_dir import RunDir
from trace_gym.train.loop import TaskCursor, _load_predictor, _load_rng


class _Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling it would create the marker file
        return (open, (self.marker, "w"))


def _files(folder, step):
    (folder / "policy").mkdir()
    (folder / "policy" / "config.json").write_text("{}")
    (folder / "policy" / "model.safetensors").write_bytes(b"w" * 64)
    for name in ("trainer.pt", "predictor.pt", "rng.pt"):
        (folder / name).write_bytes(b"t" * 16)
    (folder / "state.json").write_text(json.dumps({"step": step, "cursor": {"epoch": 0, "position": step}}))


def _run_with(tmp_path, name, payload):
    run = RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES)
    run.start("a: 1\n")
    run.commit(1, {"step": 1, "reward": 0.1}, lambda folder: _files(folder, 1), keep=0)
    run.close()
    folder = tmp_path / "run" / "checkpoints" / "step-1"
    torch.save(payload, folder / name)
    (folder / "manifest.json").unlink()
    write_manifest(folder, 1)  # the tamperer rewrites the manifest too
    return folder


@pytest.mark.parametrize("name", ["rng.pt", "predictor.pt"])
def test_a_state_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path, name):
    marker = tmp_path / "ran"
    folder = _run_with(tmp_path, name, {"generator": _Planted(str(marker)), "state_dict": _Planted(str(marker))})
    with pytest.raises(ValueError, match=f"{name} is not a state file trace_gym wrote"):
        if name == "rng.pt":
            _load_rng(folder, TaskCursor(10, 0), np.random.default_rng(0))
        else:
            _load_predictor(object(), folder / name)
    assert not marker.exists()


def test_the_rng_states_a_checkpoint_saves_load_back(tmp_path):
    rng = np.random.default_rng(5)
    saved = {"generator": rng.bit_generator.state, "python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    torch.save(saved, tmp_path / "rng.pt")
    back = load_state_file(tmp_path / "rng.pt")  # numpy arrays included, without unpickling code
    assert back["generator"] == saved["generator"] and np.array_equal(back["numpy"][1], saved["numpy"][1])


@pytest.mark.parametrize("payload", [{"generator": 1}, [1, 2], {"python": None}])
def test_an_rng_file_of_the_wrong_shape_is_one_error_naming_it(tmp_path, payload):
    folder = _run_with(tmp_path, "rng.pt", payload)
    with pytest.raises(ValueError, match="rng.pt does not hold the RNG states"):
        _load_rng(folder, TaskCursor(10, 0), np.random.default_rng(0))


def test_garbage_is_one_error_naming_the_file(tmp_path):
    (tmp_path / "predictor.pt").write_bytes(os.urandom(64))
    with pytest.raises(ValueError, match="predictor.pt is not a state file"):
        load_state_file(tmp_path / "predictor.pt")


def _billion_laughs() -> str:
    text, previous = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]\n"
        previous = name
    return text  # 342 bytes; with its aliases expanded, about 4e8 strings


def test_yaml_aliases_are_refused_before_they_expand(tmp_path):
    import yaml

    from trace_gym.config import load_yaml

    assert load_yaml("a: 1\nb: [x, y]\nc: {d: e}\n") == {"a": 1, "b": ["x", "y"], "c": {"d": "e"}}
    with pytest.raises(yaml.YAMLError, match=r"alias \(\*a\).*not allowed"):
        load_yaml(_billion_laughs())
    run = RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES)  # a run dir whose config.yaml was replaced
    run.start("a: 1\n")
    run.close()
    (tmp_path / "run" / "config.yaml").write_text(_billion_laughs())
    from trace_gym.train.loop import config_differences

    with pytest.raises(ValueError, match="config.yaml is unreadable.*alias"):
        RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES).start("a: 1\n", compare=config_differences)


@pytest.mark.parametrize("spec", ["{run}@1", "{run}"])
def test_a_policy_from_a_checkpoint_whose_weights_changed_at_the_same_size_is_refused(tmp_path, spec):
    from trace_gym.runs.policies import find_policy

    folder = _run_with(tmp_path, "rng.pt", {"generator": 1})  # a complete step-1, manifest rewritten
    run = tmp_path / "run"
    assert find_policy(spec.format(run=run)) is not None  # as written: accepted
    (folder / "policy" / "model.safetensors").write_bytes(b"X" * 64)  # same size, other bytes
    with pytest.raises(ValueError, match="model.safetensors.*SHA-256|SHA-256.*model.safetensors"):
        find_policy(spec.format(run=run))


@pytest.mark.timeout(60)  # a FIFO blocked its reader for ever; /dev/zero never ended
@pytest.mark.parametrize("name,kind", [("config.yaml", "fifo"), ("metrics.jsonl", "fifo"), ("metrics.jsonl", "zero"),
                                       ("config.yaml", "folder")])
def test_a_run_file_that_is_not_a_regular_file_is_one_error_in_resume_and_compare(tmp_path, name, kind):
    from trace_gym.runs.compare import load_run

    _run_with(tmp_path, "rng.pt", {"generator": 1})
    target = tmp_path / "run" / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "zero":
        os.symlink("/dev/zero", target)
    else:
        target.mkdir()
    with pytest.raises(ValueError, match=f"{name}.*(is not a regular file|unreadable)"):
        load_run(tmp_path / "run")
    with pytest.raises(ValueError, match=f"{name}.*(is not a regular file|unreadable|outside)"):
        RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES).start("a: 1\n")


@pytest.mark.parametrize("odd", ["step-007", "step-1\n", "step-" + "9" * 250, "step-٣"])
def test_a_step_folder_the_run_never_writes_is_ignored_by_resume(tmp_path, odd):
    _run_with(tmp_path, "rng.pt", {"generator": 1})
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / odd).mkdir()
    resume = RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES).start("a: 1\n")
    assert resume is not None and resume.step == 1 and (checkpoints / odd).is_dir()


@pytest.mark.parametrize("step", ["9" * 300, "²", "1" * 5000])
def test_a_policy_step_that_is_not_a_short_integer_is_one_line(tmp_path, step):
    from trace_gym.runs.policies import find_policy

    _run_with(tmp_path, "rng.pt", {"generator": 1})
    with pytest.raises(ValueError, match="the step after @ must be an integer of at most 15 digits"):
        find_policy(f"{tmp_path / 'run'}@{step}")
