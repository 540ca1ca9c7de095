"""Issue 35, item 6: run dirs sized for their use (only the newest checkpoint keeps the resume
state; ``keep_final_state: false`` leaves a finished run weights-only) and ``report_to``
backends beside ``metrics.jsonl`` (a real tiny Llama, the real guess-number env, trainer and
HF engine, through the command line)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from trace_gym.runs import reporters
from trace_gym.cli import main

RESUME = {"trainer.pt", "predictor.pt", "rng.pt"}


def argv(run_dir, model, *extra):
    return ["train", f"run_dir={run_dir}", f"policy={model}", "env=guess_number", "predictor=constant",
            "candidates=2", "root_budget=2", "max_turns=2", "max_turn_tokens=6", "max_episode_tokens=512",
            "trainer.lr=1e-4", "progress=false", *extra]


def files(folder):
    return {p.name for p in folder.iterdir()}


def manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def test_only_the_newest_checkpoint_keeps_the_resume_state(tmp_path, tiny_model_path, capsys):
    from trace_gym.runs.policies import resolve_policy
    from trace_gym.runs.checkpoint import TRAINING_STEP_FILES, verify_checkpoint
    from trace_gym.runs.run_dir import RunDir

    run = tmp_path / "run"
    assert main(argv(run, tiny_model_path, "steps=3", "keep_checkpoints=2")) == 0
    old, new = run / "checkpoints" / "step-2", run / "checkpoints" / "step-3"
    assert RESUME <= files(new) and manifest(new).get("resumable", True) is True
    assert not RESUME & files(old) and "policy" in files(old)  # weights (and state.json, metrics.json) stay
    assert manifest(old)["resumable"] is False and set(manifest(old)["dropped"]) == RESUME
    assert verify_checkpoint(old, 2, required=TRAINING_STEP_FILES) is None  # still a complete checkpoint
    assert resolve_policy(f"{run}@2")[0] == old / "policy"  # and evaluable
    # the weights are the trainer's own (float32 master weights), not a lossy cast
    cfg = json.loads((old / "policy" / "config.json").read_text())
    assert cfg.get("torch_dtype", cfg.get("dtype")) == "float32"
    # more steps resume exactly from the newest, which then gives up its resume state in turn
    assert main(argv(run, tiny_model_path, "steps=4", "keep_checkpoints=2")) == 0
    assert not RESUME & files(new) and RESUME <= files(run / "checkpoints" / "step-4")
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert RunDir(run).last_checkpoint().resumable


def test_a_finished_run_can_keep_weights_only(tmp_path, tiny_model_path, capsys):
    run = tmp_path / "slim"
    assert main(argv(run, tiny_model_path, "steps=2", "keep_checkpoints=1", "keep_final_state=false")) == 0
    last = run / "checkpoints" / "step-2"
    assert not RESUME & files(last) and manifest(last)["resumable"] is False
    capsys.readouterr()
    assert main(argv(run, tiny_model_path, "steps=2", "keep_checkpoints=1", "keep_final_state=false")) == 0
    # asking for more steps is one line: there is no optimiser state to continue from exactly
    assert main(argv(run, tiny_model_path, "steps=3", "keep_checkpoints=1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "keeps weights only" in err[0] and "keep_final_state" in err[0]


def test_report_to_a_registered_backend_and_the_missing_ones(tmp_path, tiny_model_path, capsys, monkeypatch):
    logged, closed = [], []

    class Lines:
        def __init__(self, run_dir, config):
            assert config["steps"] == 2 and (run_dir / "config.yaml").exists()

        def log(self, scalars, step):
            logged.append((step, scalars))

        def close(self):
            closed.append(True)

    monkeypatch.setitem(reporters.REPORTERS, "lines", ("", "", Lines))
    assert main(argv(tmp_path / "r", tiny_model_path, "steps=2", "report_to=lines")) == 0
    lines = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [s for s, _ in logged] == [1, 2] and closed == [True]  # metrics.jsonl is written as well
    assert logged[1][1]["reward"] == pytest.approx(lines[1]["reward"])
    assert logged[1][1]["seconds/generation"] == pytest.approx(lines[1]["seconds"]["generation"])
    capsys.readouterr()
    for name in ("tensorboard", "wandb", "mlflow"):
        if importlib.util.find_spec(name) is not None:
            continue
        assert main(argv(tmp_path / name, tiny_model_path, "steps=1", f"report_to={name}")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"report_to: {name} is not installed (pip install {name})" in err[0]
        assert not (tmp_path / name).exists()  # refused before the run dir is written
    assert main(argv(tmp_path / "typo", tiny_model_path, "report_to=tensorbord")) == 2
    assert "did you mean tensorboard" in capsys.readouterr().err


def test_tensorboard_when_installed(tmp_path, tiny_model_path):
    pytest.importorskip("tensorboard")
    assert main(argv(tmp_path / "tb", tiny_model_path, "steps=1", "report_to=tensorboard")) == 0
    assert list((tmp_path / "tb" / "tb").glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trace_gym.runs.reporters import scalars

    events = EventAccumulator(str(tmp_path / "tb" / "tb"))
    events.Reload()
    record = json.loads((tmp_path / "tb" / "metrics.jsonl").read_text().splitlines()[0])
    want = scalars(record)  # every number of the step's metrics line, at its step
    assert set(events.Tags()["scalars"]) == set(want)
    for tag in ("reward", "prompts", "generated_tokens", "seconds/generation"):
        (event,) = events.Scalars(tag)
        assert event.step == record["step"] == 1 and event.value == pytest.approx(want[tag], rel=1e-6), tag


def test_dropping_is_crash_safe_and_tolerates_only_what_it_dropped(tmp_path):
    from test_run_dir_integrity import rec, training_files

    from trace_gym.runs.checkpoint import MANIFEST, TRAINING_STEP_FILES, verify_checkpoint
    from trace_gym.runs.files import atomic_write_text
    from trace_gym.runs.run_dir import RunDir
    from trace_gym.train.loop import RESUME_FILES

    run = RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES)
    run.start("a: 1\n")
    for s in (1, 2):
        run.commit(s, rec(s), lambda f, s=s: training_files(f, s), keep=2, drop_superseded=RESUME_FILES)
    one = run.checkpoints / "step-1"
    assert not RESUME & files(one) and RESUME <= files(run.checkpoints / "step-2")
    # a kill after the manifest was rewritten but before the files went: still complete
    for name in RESUME:
        (one / name).write_bytes(b"t" * 16)
    assert verify_checkpoint(one, 1, required=TRAINING_STEP_FILES) is None
    (one / "planted.pt").write_bytes(b"x")  # but nothing the manifest did not drop
    assert "planted.pt is not listed" in verify_checkpoint(one, 1, required=TRAINING_STEP_FILES)
    (one / "planted.pt").unlink()
    assert run.drop_files(1, RESUME_FILES) == [] and not RESUME & files(one)  # the next pass finishes the job
    # "dropped" counts only in a manifest marked not resumable
    two = run.checkpoints / "step-2"
    m = manifest(two)
    atomic_write_text(two / MANIFEST, json.dumps({**m, "dropped": ["extra.pt"]}))
    (two / "extra.pt").write_bytes(b"x")
    assert "extra.pt is not listed" in verify_checkpoint(two, 2, required=TRAINING_STEP_FILES)
    run.close()


# ---------------------------------------------------------------------- issue 44 H: reporters
class _Counting:
    """A backend that counts its calls and raises where ``fail`` says (``init``, ``log``, ``close``)."""

    calls: list = []
    fail = ""

    def __init__(self, run_dir, config):
        if self.fail == "init":
            raise OSError(f"cannot open {run_dir / 'sink'}")

    def log(self, scalars, step):
        type(self).calls.append(step)
        if self.fail == "log":
            raise RuntimeError("the sink went away")

    def close(self):
        type(self).calls.append("close")
        if self.fail == "close":
            raise RuntimeError("already gone")


def _tensorboard_surrogate(run_dir, reporter):
    reporter.log({"reward": 1.0, "bad \udc80 name": 2.0}, 1)


def _tensorboard_folder_deleted(run_dir, reporter):
    import shutil

    reporter.log({"reward": 1.0}, 1)
    shutil.rmtree(run_dir / "tb")
    reporter.log({"reward": 1.0}, 2)


def _counting(fail):
    def run(run_dir, reporter):
        reporter.log({"reward": 1.0}, 1)
        reporter.log({"reward": 1.0}, 2)
    run.fail = fail
    return run


#: case -> (backend, what happens to it, a piece of the one warning)
FAILING_LATER = {
    "surrogate_metric_name": ("tensorboard", _tensorboard_surrogate, "tensorboard failed at step 1 (UnicodeEncodeError"),
    "events_folder_deleted": ("tensorboard", _tensorboard_folder_deleted, "tensorboard failed "),
    "log_raises": ("counting", _counting("log"), "counting failed at step 1 (RuntimeError: the sink went away)"),
    "close_raises": ("counting", _counting("close"), "counting failed closing (RuntimeError: already gone)"),
}


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # no writer thread dies either
@pytest.mark.parametrize("case", FAILING_LATER)
def test_a_reporter_that_fails_after_it_started_warns_once_and_is_switched_off(tmp_path, monkeypatch, caplog, case):
    backend, happen, said = FAILING_LATER[case]
    if backend == "tensorboard":
        pytest.importorskip("tensorboard")
    monkeypatch.setitem(reporters.REPORTERS, "counting", ("", "", _Counting))
    monkeypatch.setattr(_Counting, "calls", [])
    monkeypatch.setattr(_Counting, "fail", getattr(happen, "fail", ""))
    with caplog.at_level("WARNING", logger="trace_gym.runs.reporters"):
        (reporter,) = reporters.make_reporters([backend], tmp_path, {})
        happen(tmp_path, reporter)  # nothing raises out of log ...
        reporter.log({"reward": 1.0}, 3)
        reporter.close()  # ... nor out of close
    warnings = [r.getMessage() for r in caplog.records if r.name == "trace_gym.runs.reporters"]
    assert len(warnings) == 1 and said in warnings[0] and "switched off" in warnings[0], warnings
    if case == "log_raises":
        assert _Counting.calls == [1, "close"]  # off after its failure: steps 2 and 3 never reached it


@pytest.mark.parametrize("case", ["tb_is_a_file", "backend_cannot_open"])
def test_a_reporter_that_cannot_start_is_one_line_before_training(tmp_path, tiny_model_path, capsys, monkeypatch,
                                                                  case):
    monkeypatch.setitem(reporters.REPORTERS, "counting", ("", "", _Counting))
    monkeypatch.setattr(_Counting, "fail", "init")
    run = tmp_path / "run"
    run.mkdir()
    if case == "tb_is_a_file":
        pytest.importorskip("tensorboard")
        (run / "tb").write_text("a file where the events folder goes")
    backend = "tensorboard" if case == "tb_is_a_file" else "counting"
    assert main(argv(run, tiny_model_path, "steps=1", f"report_to={backend}")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"report_to: {backend} could not start in {str(run)!r} (" in err[0], err
    assert ("FileExistsError" if case == "tb_is_a_file" else "OSError: cannot open") in err[0]
    metrics = run / "metrics.jsonl"
    assert (not metrics.exists() or metrics.read_text() == "") and not list((run / "checkpoints").glob("step-*"))


def test_training_goes_on_when_a_reporter_fails(tmp_path, tiny_model_path, monkeypatch, caplog):
    monkeypatch.setitem(reporters.REPORTERS, "counting", ("", "", _Counting))
    monkeypatch.setattr(_Counting, "calls", [])
    monkeypatch.setattr(_Counting, "fail", "log")
    with caplog.at_level("WARNING", logger="trace_gym.runs.reporters"):
        assert main(argv(tmp_path / "r", tiny_model_path, "steps=2", "report_to=counting")) == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and _Counting.calls == [1, "close"]  # metrics.jsonl is the record
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.name == "trace_gym.runs.reporters"] == [
        "report_to: counting failed at step 1"]
