"""Deterministic mode (``deterministic: true``, trace_gym/utils/determinism.py): the same tiny training
run twice through the real CLI, once on the machine as it is and once beside a busy process
that spins numpy matmuls on every core, gives the same metrics.jsonl (every key but the
timings, :func:`trace_gym.train.metrics.is_timing_key`) and the same final weights (SHA-256
of the policy and of the predictor's state).

Without the mode the second run sizes its threads to the load (one thread beside the
neighbour, both cores idle), and the thread count reaches the numbers: with 1 thread and
with 2 the same config and seed logged other ``predictor_loss`` and ``policy/mismatch_abs``
values and saved another predictor state (docs/training.md, Deterministic mode). The child
processes get no ``OMP_NUM_THREADS``/``TRACE_GYM_THREADS`` (the suite runs with
``OMP_NUM_THREADS=1``), so the load policy is live in them.

The env is ``ParityLocal-v0`` (tests/fixtures/parity_env.py): a tiny random policy succeeds
about half the time there, so the update has advantages and the weights depend on what was
sampled.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from trace_gym.utils import threads
from trace_gym.utils.determinism import FIXED_THREADS
from trace_gym.train.metrics import is_timing_key, without_timings

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

#: The neighbour: numpy matmuls on every core until it is killed ("ready" once it spins).
BUSY = ("import numpy as np\n"
        "a = np.random.default_rng(0).random((768, 768))\n"
        "a = a @ a\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    a = a @ a\n"
        "    a /= np.abs(a).max()\n")


def child_env(**extra: str) -> dict[str, str]:
    """The test process's env without a thread count (the load policy decides in the child)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", threads.THREADS_ENV)}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FIXTURES)]), **extra}


def train(run_dir: Path, model: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trace_gym.cli", "--plugin", "parity_env", "train", f"run_dir={run_dir}",
           f"policy={model}", "env=ParityLocal-v0", "predictor=embedding", "strategy=trace", "steps=2",
           "candidates=4", "root_budget=4", "max_turns=2", "max_turn_tokens=8", "max_episode_tokens=512",
           "trainer.lr=1e-3", "keep_checkpoints=1", "progress=false", "--deterministic", "true"]
    out = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def timing_keys(record: dict, prefix: str = "") -> set[str]:
    """Every timing key of ``record`` (dotted paths), the ones the comparison leaves out."""
    out = set()
    for key, value in record.items():
        if is_timing_key(key):
            out.add(prefix + key)
        elif isinstance(value, dict):
            out |= timing_keys(value, f"{prefix}{key}.")
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprint(run_dir: Path) -> tuple[list[dict], dict[str, str]]:
    """(the metrics lines without timings, the SHA-256 of the final policy weights and predictor state)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    # the only keys left out are the timings, named here: a new key is compared unless it is one
    assert all(timing_keys(r) == {"seconds", "step_seconds"} for r in lines), [timing_keys(r) for r in lines]
    final = run_dir / "checkpoints" / "step-2"
    return [without_timings(r) for r in lines], {"policy": sha256(final / "policy" / "model.safetensors"),
                                                 "predictor": sha256(final / "predictor.pt")}


def test_the_same_run_beside_a_busy_process_gives_the_same_metrics_and_weights(tmp_path, tiny_model_path):  # noqa: F811
    train(tmp_path / "alone", tiny_model_path)
    # niced: the load policy counts nice time as busy (it sees the neighbour), while the run
    # itself keeps most of its cores' time (beside a neighbour at nice 0 this test took 95 s)
    busy = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True,
                            env=child_env(OMP_NUM_THREADS=str(threads.available_cores())))
    try:
        assert busy.stdout.readline().strip() == "ready"
        if threads.available_cores() > 1:  # the neighbour is seen: the load policy would give fewer threads now
            assert threads.decide_threads({}).threads < threads.available_cores()
        train(tmp_path / "beside", tiny_model_path)
    finally:
        busy.kill()
        busy.wait()
    alone, beside = fingerprint(tmp_path / "alone"), fingerprint(tmp_path / "beside")
    assert any(r["nodes_with_advantage"] for r in alone[0])  # the update had something to follow
    for a, b in zip(alone[0], beside[0]):
        assert a == b, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert alone[1] == beside[1]
    # the fixed count, not the load's: on a loaded machine the load policy gives one thread to
    # both runs as well, so this is what tells the mode from the policy there
    assert [r["cpu_threads"] for r in alone[0] + beside[0]] == [FIXED_THREADS] * 4
