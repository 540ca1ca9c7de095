"""The GPU path without vLLM: the HF engine, the trainer and the LM critic on one device.

A lent GPU machine has CUDA torch but no vLLM, so these are the GPU tests that run there
(``pytest -m gpu -s tests/train/test_gpu_checks.py``; they print their numbers for
``docs/gpu.md``). The same checks (``tests/fixtures/gpu_checks.py``) run here on the CPU with a
tiny model in the default suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_checks import TOKENIZER, critic_learns_on, gpu_model, parity_after_update

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """SmolLM2, or where it cannot be pulled, a tiny random model (``gpu_checks.gpu_model``)."""
    return gpu_model(tmp_path_factory.mktemp("gpu_model"))


def on_gpu(test):
    """Mark ``test`` ``gpu`` and skip it, with the reason, where CUDA is absent."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
    return pytest.mark.gpu(skip(test))


# ------------------------------------------------------------------ the checks on this CPU
def test_parity_check_on_cpu(tiny_model_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine
    from trace_gym.train.trainer import PolicyTrainer, TrainerConfig

    trainer = PolicyTrainer(str(tiny_model_path), TrainerConfig(lr=1e-3, dtype="float32"), device="cpu")
    engine = HFEngine(tiny_model_path, dtype="float32", device="cpu", prefix_cache_bytes=0)
    try:
        before = trainer.score([[1, 2, 3, 4, 5]])[0]
        out = parity_after_update(trainer, engine, prompts=4, samples=2, max_tokens=8)
    finally:
        engine.close()
    assert trainer.score([[1, 2, 3, 4, 5]])[0] != pytest.approx(before, abs=1e-6)  # the update moved the policy
    assert out["generation_tok_s"] > 0 and out["update_tok_s"] > 0
    assert out["mismatch_before_update"] < 1e-3  # float32 engine and trainer, same weights
    assert out["mean_abs_logprob_diff_after_sync"] < 1e-3  # the synced engine serves the updated policy


def test_parity_check_catches_an_engine_left_on_old_weights(tiny_model_path):  # noqa: F811
    """Planted: an engine that reports the new version but keeps its old weights. The
    check must see the gap (so a pass on the GPU means the weights really moved)."""
    from trace_gym.engines.hf import HFEngine
    from trace_gym.train.trainer import PolicyTrainer, TrainerConfig

    class Stale(HFEngine):
        def update_weights(self, named_tensors, version):
            for _ in named_tensors:
                pass
            self._version = version

    trainer = PolicyTrainer(str(tiny_model_path), TrainerConfig(lr=5e-2, dtype="float32"), device="cpu")
    engine = Stale(tiny_model_path, dtype="float32", device="cpu", prefix_cache_bytes=0)
    try:
        out = parity_after_update(trainer, engine, prompts=4, samples=2, max_tokens=8)
    finally:
        engine.close()
    assert out["mean_abs_logprob_diff_after_sync"] > 1e-2


def test_critic_check_on_cpu(tiny_model_path):  # noqa: F811
    out = critic_learns_on(str(tiny_model_path), "cpu", "float32", rounds=40)
    assert out["device"] == "cpu" and out["contexts_per_s"] > 0
    assert out["gap"] > 0.2  # positives above negatives after training


def test_shipped_tokenizer_matches_the_pulled_one(smollm2_path, tmp_path):  # noqa: F811
    """The tokenizer in tests/data (the GPU checks' offline fallback) is SmolLM2's: the same
    ids and the same chat template; a tiny model builds from it without any download."""
    from transformers import AutoTokenizer

    from trace_gym.models import tiny_random_model

    shipped, pulled = AutoTokenizer.from_pretrained(TOKENIZER), AutoTokenizer.from_pretrained(smollm2_path)
    text = "Solve 3x + 5 = 20 with python: ```python\nprint((20 - 5) / 3)\n``` naïve ✓ <|im_end|>"
    assert shipped(text)["input_ids"] == pulled(text)["input_ids"]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert shipped.apply_chat_template(chat, tokenize=False) == pulled.apply_chat_template(chat, tokenize=False)
    tiny = tiny_random_model(tmp_path / "tiny", tokenizer_from=TOKENIZER)
    assert AutoTokenizer.from_pretrained(tiny)(text)["input_ids"] == pulled(text)["input_ids"]


# ------------------------------------------------------------------ the same on a GPU
@on_gpu
def test_hf_engine_and_trainer_on_the_gpu(model):
    """SmolLM2-135M (or the tiny fallback), bf16 HF engine and bf16-autocast trainer on one GPU: logprob parity after
    a weight update, tokens/s of generation and of the update."""
    from trace_gym.engines.hf import HFEngine
    from trace_gym.train.trainer import PolicyTrainer, TrainerConfig

    path, label = model
    trainer = PolicyTrainer(str(path), TrainerConfig(lr=1e-5, dtype="bfloat16"), device="cuda")
    engine = HFEngine(path, dtype="bfloat16", device="cuda")
    try:
        out = parity_after_update(trainer, engine)
    finally:
        engine.close()
    print(json.dumps({"check": "hf_engine_trainer_parity_cuda", "model": label, **out}))
    assert out["mean_abs_logprob_diff_after_sync"] < 0.05  # bf16 noise


@on_gpu
def test_lm_critic_on_the_gpu(model):
    path, label = model
    out = critic_learns_on(str(path), "cuda", "bfloat16")
    print(json.dumps({"check": "lm_critic_cuda", "model": label, **out}))
    assert out["device"] == "cuda" and out["gap"] > 0.2


@on_gpu
@pytest.mark.parametrize("ray", [False, True], ids=["in-process", "ray"])
def test_one_training_step_on_the_gpu_with_the_hf_engine(tmp_path, model, ray):
    """`trace-gym train` for one real step of SmolLM2-135M (or the tiny fallback) on the GPU (HF engine, bf16), in
    process and with `--ray` (a rollout worker and a trainer rank sharing the device)."""
    if ray and importlib.util.find_spec("ray") is None:
        pytest.skip("needs Ray (pip install 'trace_gym[ray]')")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "trace_gym.cli", "train", "--config", "configs/train_cpu_trace.yaml",
           f"run_dir={run}", f"policy={model[0]}", "steps=1", "eval_every=0", "eval_at_start=false",
           "engine=hf", "device=cuda", 'engine_kwargs={"dtype": "bfloat16", "device": "cuda"}',
           "trainer.dtype=bfloat16", "predictor=lm_critic", 'predictor_kwargs={"device": "cuda", "dtype": "bfloat16"}',
           "progress=false"]
    if ray:
        cmd += ["--ray", 'ray_options={"rollout_workers": 1, "worker_gpus": 0.4, "trainer_workers": 1, '
                         '"trainer_gpus": 0.4, "env_pools": 2, "pool_cpus": 1}']
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-4000:]
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    print(json.dumps({"check": f"train_step_hf_cuda_{'ray' if ray else 'in_process'}", "model": model[1],
                      "step_seconds": record["step_seconds"], "generated_tokens": record["generated_tokens"],
                      "seconds": record["seconds"], "mismatch_abs": record.get("policy/mismatch_abs")}))
    assert record["step"] == 1 and record["seconds"]["weight_sync"] > 0
