"""SIGKILL ``trace-gym train`` mid-step, twice, rerun the same command: the run resumes from its
last checkpoint and metrics.jsonl holds every step exactly once (a real tiny Llama, the real
guess-number env, the real trainer and HF engine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5


def command(run_dir: Path, model: Path) -> list[str]:
    # `trace-gym train` once the face wires it; the same parser and handler today
    return [sys.executable, "-m", "trace_gym.cli", "train", f"run_dir={run_dir}", f"policy={model}",
            "env=guess_number", "predictor=constant", f"steps={STEPS}", "candidates=4", "root_budget=2",
            "max_turns=3", "max_turn_tokens=8", "max_episode_tokens=512", "trainer.lr=1e-4", "keep_checkpoints=1",
            "progress=false"]


def steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            pass
    return out


def run_until(cmd: list[str], run_dir: Path, kill_when, timeout: float = 240) -> int | None:
    """Start ``cmd``; SIGKILL it as soon as ``kill_when()`` holds. Returns the exit code
    (None when it was killed)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                assert proc.returncode == 0, proc.stderr.read()[-3000:]
                return proc.returncode
            if kill_when():
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return None
            time.sleep(0.005)
        raise AssertionError("training did not finish in time")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigkill_mid_step_then_rerun_logs_every_step_once(tmp_path, tiny_model_path):  # noqa: F811
    run_dir = tmp_path / "run"
    cmd = command(run_dir, tiny_model_path)
    ckpts = run_dir / "checkpoints"
    # 1: killed while step 2's checkpoint is being written (its temp folder exists), or mid-step 3
    assert run_until(cmd, run_dir, lambda: (ckpts.exists() and any(p.name.startswith(".tmp-step-2")
                                                                  for p in ckpts.iterdir()))
                     or len(steps_logged(run_dir)) >= 2) is None
    first = steps_logged(run_dir)
    assert 1 <= len(first) <= 2
    # 2: rerun, killed again 0.3 s after its first new line (in the middle of the next step)
    seen: list[float] = []

    def mid_next_step() -> bool:
        if len(steps_logged(run_dir)) > len(first) and not seen:
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] > 0.3

    assert run_until(cmd, run_dir, mid_next_step) is None
    assert steps_logged(run_dir)[: len(first) + 1] == list(range(1, len(first) + 2))
    # 3: rerun to the end
    assert run_until(cmd, run_dir, lambda: False) == 0
    assert steps_logged(run_dir) == list(range(1, STEPS + 1))
    assert sorted(p.name for p in ckpts.iterdir()) == [f"step-{STEPS}"]
    final = json.loads((ckpts / f"step-{STEPS}" / "state.json").read_text())
    assert final["step"] == STEPS
    # a fourth run has nothing left to do and changes nothing
    before = (run_dir / "metrics.jsonl").read_text()
    assert run_until(cmd, run_dir, lambda: False) == 0
    assert (run_dir / "metrics.jsonl").read_text() == before


@pytest.mark.slow  # ~10 s; reward_warning itself is unit-tested in test_plugins.py
def test_train_warns_when_every_reward_is_the_same(tmp_path, tiny_model_path):  # noqa: F811
    """A tiny random policy never finds the secret: the step's rewards are all 0 and the
    trainer says what that means for contrast (through `trace-gym train`), its advice once."""
    cmd = [sys.executable, "-m", "trace_gym.cli", "train", *command(tmp_path / "run", tiny_model_path)[4:]]
    cmd = [c if not c.startswith("steps=") else "steps=2" for c in cmd]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "WARNING: step 1: every one of the" in out.stderr and "no prompt is mixed" in out.stderr
    step2 = next(line for line in out.stderr.splitlines() if line.startswith("WARNING: step 2:"))
    assert step2.endswith("learns nothing; what to change: as above"), step2  # the advice once per run
