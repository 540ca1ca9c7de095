"""The engines' ``dtype="auto"``: the precision a rollout engine computes in on a device.

On CUDA: bf16 where the GPU supports it, else fp16. On a CPU it depends on the vector
units, and getting it wrong costs an order of magnitude:

- with AVX-512 (oneDNN's bf16 kernels; native ``avx512_bf16``/AMX on newer parts) bf16
  decodes faster than fp32 (SmolLM2-135M, HF engine: ~1.75x, measured on such a box);
- with AVX2 only (e.g. an EPYC whose hypervisor hides AVX-512) torch and vLLM have no bf16
  GEMM kernel and fall back to scalar code: a 64 x 576 x 1536 matmul took 75 ms in bf16 vs
  1.3 ms in fp32, and SmolLM2's decode ran 2.0-4.6x slower than in fp32 (HF 75 vs 150 tok/s and
  vLLM 29 vs 133 tok/s at 32 wide; ``benchmarks/bench_engines.py --dtypes`` measures it).

So ``auto`` on a CPU is bf16 only where torch reports AVX-512 or AMX, else fp32. The
rule reads the CPU's capability (deterministic: one machine always gets the same dtype),
not a timing probe.
"""

from __future__ import annotations

import functools

__all__ = ["DTYPES", "cpu_has_fast_bf16", "auto_dtype"]

#: The dtypes a model (a policy, an engine, the LM critic) may be loaded and computed in.
DTYPES = ("float32", "bfloat16", "float16")


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls at least as fast as fp32: AVX-512 (torch's CPU
    capability ``AVX512``), native ``avx512_bf16``, or AMX tiles."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_avx512_supported")
    for name in probes:
        probe = getattr(torch.cpu, name, None)
        try:
            if probe is not None and probe():
                return True
        except Exception:  # an unusual build without the probe's backing: ask the next one
            continue
    try:
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    except Exception:
        return False


def auto_dtype(device: str) -> str:
    """The dtype name (``"bfloat16"``, ``"float16"`` or ``"float32"``) that ``dtype="auto"``
    means on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...); see the module docstring."""
    kind = str(device).split(":")[0]
    if kind == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if kind == "cpu":
        return "bfloat16" if cpu_has_fast_bf16() else "float32"
    raise ValueError(f"no dtype rule for device {device!r} (expected 'cpu' or 'cuda[:N]')")
