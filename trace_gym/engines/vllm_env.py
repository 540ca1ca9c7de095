"""vLLM's process environment, set before ``import vllm`` (a leaf: it imports neither vLLM nor
the engines package, so the package's ``vllm_importable`` and the backend both use it).

On a CPU the backend defaults of :mod:`trace_gym.engines.vllm` apply: in-process engine
core (no multiprocessing), a 1 GiB KV cache.
"""

from __future__ import annotations

import os

#: env defaults for the CPU backend (see the module docstring)
CPU_ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def configure_vllm_env() -> None:
    """Env defaults for vLLM; call before ``import vllm``.

    vLLM logs at WARNING unless the user set ``VLLM_LOGGING_LEVEL`` (``trace-gym
    --verbose`` sets INFO); on a CPU the defaults above apply.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM's records go through Python logging's root handlers (the CLI's), so the
    # application decides the level and the filter below applies
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    if not _has_cuda():
        for key, value in CPU_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
