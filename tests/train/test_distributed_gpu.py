"""The Ray backend on one GPU: vLLM rollout worker and trainer colocated on the device.

Runs with ``-m gpu`` when CUDA, vLLM's GPU build and Ray are present; skips with the reason
otherwise (this machine: no GPU). Each test prints its measurements (``pytest -s``) for
``docs/gpu.md``: logprob parity after a weight update, one real training step of
SmolLM2-135M (or the tiny fallback of ``gpu_checks.gpu_model``) with ``--ray``, and tokens/s of generation and of the policy update.
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's GPU build"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray (pip install 'trace_gym[ray]')"),
]

VLLM_KW = {"dtype": "bfloat16", "gpu_memory_utilization": 0.3, "max_model_len": 2048}
#: What the ``cluster`` fixture (tests/train/conftest.py) starts here: 8 CPUs, and a failure to
#: start is a failure (this module runs only where CUDA, vLLM and Ray are all present).
RAY_CPUS, RAY_MUST_START = 8, True


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from gpu_checks import gpu_model

    path, label = gpu_model(tmp_path_factory.mktemp("gpu_model"))
    return str(path), label


def test_vllm_worker_logprobs_match_the_trainer_after_a_weight_update(cluster, model):
    """Trainer (bf16 autocast) and a colocated vLLM rollout worker (GPU share 0.4): after one
    policy update synced through the object store, the worker's sampling logprobs of its own
    tokens match the trainer's within bf16 noise; tokens/s of generation and update."""
    from gpu_checks import parity_after_update

    from trace_gym.train.distributed.launch import launch_rollout_workers
    from trace_gym.train.trainer import PolicyTrainer, TrainerConfig

    path, label = model
    trainer = PolicyTrainer(path, TrainerConfig(lr=1e-5, dtype="bfloat16"), device="cuda")
    engine = launch_rollout_workers("vllm", path, 1, engine_kwargs=VLLM_KW, num_gpus=0.4, num_cpus=1)
    try:
        out = parity_after_update(trainer, engine)
    finally:
        engine.close()
    print(json.dumps({"check": "vllm_worker_trainer_parity_cuda", "model": label, **out}))
    assert out["mean_abs_logprob_diff_after_sync"] < 0.05  # bf16 engine vs bf16-autocast trainer on the same weights


def test_one_training_step_with_ray_on_the_gpu(tmp_path, model):
    """`trace-gym train --ray` with the trainer rank and the vLLM worker sharing the GPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    run = tmp_path / "run"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "trace_gym.cli", "train", "--config", "configs/train_cpu_trace.yaml", "--ray",
           f"run_dir={run}", f"policy={model[0]}", "steps=1", "eval_every=0", "eval_at_start=false", "engine=vllm",
           "device=cuda", f"engine_kwargs={json.dumps(VLLM_KW)}", "trainer.dtype=bfloat16", "progress=false",
           'ray_options={"rollout_workers": 1, "worker_gpus": 0.4, "trainer_workers": 1, "trainer_gpus": 0.4, '
           '"env_pools": 2, "pool_cpus": 1}']
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1200, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-4000:]
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    print(json.dumps({"check": "train_step_vllm_cuda_ray", "model": model[1], "step_seconds": record["step_seconds"], "wall_seconds": time.perf_counter() - t0,
                      "generated_tokens": record["generated_tokens"], "seconds": record["seconds"],
                      "mismatch_abs": record.get("policy/mismatch_abs")}))
    assert record["step"] == 1 and record["seconds"]["weight_sync"] > 0
