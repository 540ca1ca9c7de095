"""The engines' ``dtype="auto"``: bf16 only on CPUs with fast bf16 kernels (trace_gym.engines.dtypes)."""

from __future__ import annotations

import pytest
import torch

from trace_gym.engines import dtypes
from trace_gym.engines.dtypes import auto_dtype, cpu_has_fast_bf16
from trace_gym.engines.hf import HFEngine

PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_avx512_supported")


@pytest.fixture
def cpu(monkeypatch):
    """Set what the CPU probes report: ``cpu(avx512=True, capability="AVX2")``; the rule's
    cache is cleared before and after."""

    def set_cpu(capability: str = "AVX2", **flags: bool) -> None:
        for name in PROBES:
            key = name.removeprefix("_is_").removesuffix("_supported")
            monkeypatch.setattr(torch.cpu, name, lambda v=flags.get(key, False): v, raising=False)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        cpu_has_fast_bf16.cache_clear()

    yield set_cpu
    cpu_has_fast_bf16.cache_clear()


@pytest.mark.parametrize("flags,capability,expected", [
    ({}, "AVX2", "float32"),  # this session's EPYC under KVM: bf16 matmuls ran ~60x slower than fp32
    ({}, "DEFAULT", "float32"),
    ({"avx512_bf16": True}, "AVX2", "bfloat16"),
    ({"amx_tile": True}, "AVX2", "bfloat16"),
    ({"avx512": True}, "AVX2", "bfloat16"),
    ({}, "AVX512", "bfloat16"),  # a build without the probes still reads the capability
])
def test_cpu_auto_is_bf16_only_with_avx512_or_amx(cpu, flags, capability, expected):
    cpu(capability, **flags)
    assert auto_dtype("cpu") == expected


def test_a_probe_that_raises_falls_through_to_the_next(cpu, monkeypatch):
    cpu("AVX2", avx512=True)

    def broken():
        raise RuntimeError("no cpuinfo")

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", broken)
    assert auto_dtype("cpu") == "bfloat16"  # the AVX-512 probe still answers


def test_cuda_auto_follows_the_gpu_s_bf16_support(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert auto_dtype("cuda:1") == "float16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert auto_dtype("cuda") == "bfloat16"


def test_an_unknown_device_is_named_in_the_error():
    with pytest.raises(ValueError, match="'tpu'"):
        auto_dtype("tpu")


def test_hf_engine_auto_takes_the_rule_s_dtype(cpu, tiny_model_path):
    for flags, expected in (({}, torch.float32), ({"avx512_bf16": True}, torch.bfloat16)):
        cpu("AVX2", **flags)
        engine = HFEngine(tiny_model_path, dtype="auto", device="cpu")
        try:
            assert engine.dtype == expected
            assert next(engine.model.parameters()).dtype == expected
        finally:
            engine.close()


def test_this_machine_s_answer_matches_its_cpu_flags():
    """Read /proc/cpuinfo independently of torch: no avx512 flag -> fp32 here."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo")
    has_512 = any(f.startswith("avx512") or f.startswith("amx") for f in flags)
    assert (dtypes.auto_dtype("cpu") == "bfloat16") == has_512


def test_vllm_engine_resolves_auto_itself(vllm_engine):
    """The default ``auto`` is resolved by our rule (not vLLM's, which reads the checkpoint's
    fp32 config) and is the dtype vLLM's model config runs in."""
    assert vllm_engine.dtype == auto_dtype("cpu")
    assert str(vllm_engine.llm.llm_engine.model_config.dtype) == f"torch.{auto_dtype('cpu')}"
