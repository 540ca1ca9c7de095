"""Issue 41: a checkpoint is read-only to its readers. Train a tiny run, evaluate its checkpoint
twice through ``trace-gym eval`` (by run dir, then by ``@N`` and by its folder), and the run
dir is byte-identical; the next ``train`` continues from that step (a real tiny Llama, the
real guess-number env, trainer, HF engine and eval, in process through the command line)."""

from __future__ import annotations

import json

from run_dir_checks import tree_digest
from test_run_dir_size import argv  # the cheapest training command the resume tests use
from trace_gym.cli import main


def _eval(policies: str, out, *extra: str) -> list[dict]:
    assert main(["eval", "--policy", policies, "--suite", "guess_number", "limit=1", "heldout_fraction=0",
                 "max_turns=1", "max_turn_tokens=4", f"out={out}", "progress=false", *extra]) == 0
    return json.loads((out / "results.json").read_text())


def test_eval_twice_leaves_the_checkpoint_byte_identical_and_the_run_resumes_from_it(tmp_path, tiny_model_path,
                                                                                     monkeypatch, capsys):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))  # the eval cache and the weights-hash memo
    run = tmp_path / "run"
    assert main(argv(run, tiny_model_path, "steps=2", "keep_checkpoints=2")) == 0
    step2 = run / "checkpoints" / "step-2"
    before = tree_digest(run)
    weights = step2 / "policy" / "model.safetensors"
    inode = weights.stat().st_ino
    lines = (run / "metrics.jsonl").read_bytes()

    first = _eval(str(run), tmp_path / "ev1")
    again = _eval(f"{run}@2,{step2 / 'policy'}", tmp_path / "ev2", "cache=false")  # loads the weights twice more
    assert tree_digest(run) == before  # every file of the run dir, checkpoints included, as it was
    assert [r["label"] for r in first + again] == ["run@2"] * 3  # a checkpoint by folder is the run's, not a base model
    assert len({r["weights_sha256"] for r in first + again}) == 1

    assert main(argv(run, tiny_model_path, "steps=3", "keep_checkpoints=2")) == 0  # resume: one more step
    capsys.readouterr()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (run / "metrics.jsonl").read_bytes().startswith(lines)  # steps 1-2 as logged, not retrained
    assert weights.stat().st_ino == inode and json.loads((run / "checkpoints" / "step-3" / "state.json").read_text()
                                                         )["step"] == 3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-3"]  # nothing moved aside
