"""``trace-gym train --ray``: the same loop with its trainer ranks, rollout workers and env
pools as Ray actors on a local cluster it starts, against the in-process run of the same
command (tiny Llama, guess-number env, float32 HF engine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trace_gym.train.distributed.cluster import ray_available

ROOT = Path(__file__).resolve().parents[2]
ok, why = ray_available()
pytestmark = pytest.mark.skipif(not ok, reason=why)


def command(run_dir: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trace_gym.cli", "train", f"run_dir={run_dir}", f"policy={model}",
            "env=guess_number", "predictor=constant", "steps=2", "candidates=4", "root_budget=4",
            "max_turns=3", "max_turn_tokens=8", "max_episode_tokens=512", "trainer.lr=1e-4",
            "trainer.micro_batch_tokens=128", 'engine_kwargs={"dtype": "float32", "prefix_cache_bytes": 0}',
            "progress=false", *extra]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run(cmd: list[str]) -> str:
    """Run ``cmd``; its stderr."""
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stderr


@pytest.mark.slow  # ~50 s: a whole train run on Ray (test_distributed covers one Ray step against in-process)
def test_train_with_ray_flag_runs_the_same_steps(tmp_path, tiny_model_path):  # noqa: F811
    local, distributed = tmp_path / "local", tmp_path / "ray"
    run(command(local, tiny_model_path))
    err = run(command(distributed, tiny_model_path, "--ray",
                'ray_options={"rollout_workers": 2, "env_pools": 2, "trainer_workers": 2, "pool_cpus": 0.5, '
                '"num_cpus": 6, "torch_threads": 1}'))
    # a local cluster says where it is, so `ray status --address` can find its actors
    assert re.search(r"local Ray cluster at \S+:\d+ \(ray status --address \S+:\d+\)", err), err[-2000:]
    a, b = metrics(local), metrics(distributed)
    assert [r["step"] for r in b] == [1, 2]
    same = ("rollouts", "continuations", "nominal_budget", "generated_tokens", "env_steps", "episode_errors",
            "reward", "prompts", "nodes_with_advantage")
    # step 1 samples from the same initial weights: the same trees, hence the same counts and rewards
    assert {k: a[0][k] for k in same} == {k: b[0][k] for k in same}
    assert b[0]["policy/trained_tokens"] == a[0]["policy/trained_tokens"]
    assert b[0]["policy/loss"] == pytest.approx(a[0]["policy/loss"], rel=1e-4, abs=1e-6)
    assert b[1]["seconds"]["weight_sync"] > 0 and (distributed / "checkpoints").exists()
