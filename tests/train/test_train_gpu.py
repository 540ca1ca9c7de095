"""On a machine with one GPU: `trace-gym train` trains there (bf16 autocast, vLLM on the same
device with a memory fraction), and vLLM serves the trainer's weights after each sync.
Runs with ``-m gpu`` when CUDA and vLLM's GPU build are present; skips with the reason otherwise."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM's GPU build"),
]


def test_train_on_one_gpu_with_vllm_on_the_same_device(tmp_path):
    from trace_gym.cli import main
    from gpu_checks import gpu_model

    model, _ = gpu_model(tmp_path)
    run = tmp_path / "run"
    config = Path(__file__).resolve().parents[2] / "configs" / "train_cpu_trace.yaml"
    assert main(["train", "--config", str(config), f"run_dir={run}", f"policy={model}",
                 "steps=2", "eval_every=0", "eval_at_start=false", "engine=vllm", "device=cuda",
                 'engine_kwargs={"gpu_memory_utilization": 0.3, "dtype": "bfloat16"}',
                 "trainer.dtype=bfloat16", "trainer.gradient_checkpointing=true", "progress=false"]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert all(r["seconds"]["weight_sync"] > 0 for r in lines)
    mismatch = [r["policy/mismatch_abs"] for r in lines if r["policy/mismatch_abs"] is not None]
    assert all(m < 0.06 for m in mismatch)  # engine (bf16) vs trainer logprobs of the sampled tokens
