"""Transformers rollout engine: a manual decode loop over ``DynamicCache`` with a prefix KV cache.

Why not ``model.generate``: it cannot start from an already computed KV cache for some
rows and not others, nor report sampling logprobs under top-k/top-p, nor seed each
completion independently of its batch mates. The loop here is short:

1. **Lookup.** Each distinct prefix looks up the longest common prefix (LCP) with any
   entry of an LRU cache of KV tensors (:mod:`trace_gym.engines.prefix_cache`: a tree of
   segments, so a prompt and its completions share the prompt's KV).
   ``u = min(LCP, len(prefix) - 1)`` tokens are reused (one token is always recomputed
   to get next-token logits); ``u`` is reported as ``Completion.cached_tokens``.
2. **Prefill once per prefix.** Rows = distinct prefixes, in groups of similar new-token
   length (at most 25 % padding; on CPU padding is pure waste). A group's KV is laid out
   as ``[left-pad | cached u_i | left-pad | new d_i]`` with a boolean 4D mask (causal
   within the new part, padding masked, every query may see itself so no softmax row is
   empty) and explicit position ids, so padded rows compute what they would alone; long
   prefixes are encoded ``prefill_chunk`` tokens per pass.
3. **Branch.** The prefilled KV is expanded along the batch (``n[i]`` copies per prefix),
   so a k-way continuation encodes the prefix once.
4. **Decode** one token per step for all live rows; finished rows are dropped from the
   batch (their KV stored in the prefix cache first, so a later call whose prefix extends
   ``prefix + completion`` -- the agent loop's next turn -- only encodes the delta).

What makes a decode step cheap on CPU (found with the torch profiler; the attention alone
is 1.8x transformers' own path in ``benchmarks/bench_engines.py``, and the three together
took this CPU's 64-wide rate in ``benchmarks/bench_step.py``'s curve from 118 to 426 tok/s):
attention that reads each grouped KV head once (:mod:`trace_gym.engines.gqa_attention`),
KV layers that append in place into room reserved for the call
(:mod:`trace_gym.engines.dynamic_cache`), and one uniform a step per seeded row.

Sampling: ``logits / T`` -> top-k -> top-p -> ``log_softmax`` (float32); the sampled
token's entry of that is its logprob (greedy: plain model log-softmax, see
:mod:`trace_gym.engines`). Seeds: completion ``j`` of prefix ``i`` draws one uniform a step
from its own ``torch.Generator`` seeded with ``(seed, i, j)`` and inverts the batch's CDFs
at once (:func:`~trace_gym.engines.sampling.inverse_cdf`), so it does not depend on batch
mates (a multinomial per row drew a whole vocabulary of exponentials: a fifth of a 64-wide
decode step here).

Limits: decoder-only models with full attention on every layer (Llama, Qwen2/3,
Mistral without sliding window); a sliding-window / hybrid model is refused at load.

Two pieces live beside this module (and are re-exported here):
:mod:`trace_gym.engines.sampling` (``process_logits``, ``row_seed``, ``StopStrings``: the
sampling rule as pure functions) and :mod:`trace_gym.engines.dynamic_cache` (every call
into transformers' ``DynamicCache`` internals).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from trace_gym.engines import check_generate_args, check_score_args
from trace_gym.engines.dynamic_cache import (
    _cache_layers,
    _cache_select,
    _cache_trim_left,
    _make_cache,
    _merge_states,
)
from trace_gym.engines.dtypes import auto_dtype
from trace_gym.engines.prefix_cache import PrefixKVCache
from trace_gym.engines.sampling import StopStrings, inverse_cdf, process_logits, row_seed
from trace_gym.types import Completion, SamplingParams
from trace_gym.utils.threads import resolve_threads, torch_threads

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the engine


class HFEngine:
    """Transformers rollout engine (see the module docstring for the algorithm).

    Args:
        model_path: local HF folder (use :func:`trace_gym.models.resolve_model` for names).
        device: ``"cpu"``, ``"cuda"``, ...; default CUDA when available.
        dtype: ``"auto"`` (:func:`~trace_gym.engines.dtypes.auto_dtype`: on a CPU bf16 with
            AVX-512/AMX, else fp32; on CUDA bf16 where supported, else fp16),
            ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        max_model_len: context limit in tokens (default: the model's
            ``max_position_embeddings``).
        max_batch_rows: most completions decoded together; larger requests run in chunks.
        prefill_chunk: most new prefix tokens encoded per forward pass (bounds the memory
            of the attention mask and scores for long prompts).
        prefix_cache_bytes: byte budget of the prefix KV cache (0 disables it).
        cache_completions: also cache ``prefix + completion`` KV for follow-up turns.
        ignore_eos: do not stop at the model's EOS ids (benchmarks with fixed lengths).
        num_threads: torch threads of ``generate`` on CPU, set around each call and restored
            after it (:func:`trace_gym.utils.threads.torch_threads`); ``None``: the process's count.
        attention: ``"gqa"`` (default: grouped-query attention without copying KV heads,
            :mod:`trace_gym.engines.gqa_attention`; the same sums) or ``"sdpa"`` (transformers'
            own: the ``hf-sdpa`` baseline of ``benchmarks/bench_engines.py``).
    """

    #: With ``sampling.seed`` set, a completion is a function of the call's prefixes, counts
    #: and seed (each row its own generator; padded rows compute what they would alone):
    #: deterministic mode (:mod:`trace_gym.utils.determinism`) relies on it.
    deterministic = True

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        device: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_batch_rows: int = 64,
        prefill_chunk: int = 2048,
        prefix_cache_bytes: int = 1 << 30,
        cache_completions: bool = True,
        ignore_eos: bool = False,
        num_threads: int | None = None,
        attention: str = "gqa",
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from trace_gym.models import quiet_third_party

        quiet_third_party()  # transformers' "Loading weights" bar: our progress bars only
        self.num_threads = resolve_threads(num_threads, "num_threads") if num_threads else None
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = self._pick_dtype(dtype)
        t0 = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if attention not in ("gqa", "sdpa"):
            raise ValueError(f"attention must be 'gqa' or 'sdpa', got {attention!r}")
        if attention == "gqa":
            from trace_gym.engines.gqa_attention import register

            attention = register()
        self.attention = attention
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, attn_implementation=attention)
        self.model.to(self.device).eval()
        self.load_seconds = time.perf_counter() - t0
        config = self.model.config
        layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise NotImplementedError(
                f"HFEngine supports full-attention models only; "
                f"{config.model_type} has layer types {sorted(layer_types)}"
            )
        self.model_path = str(model_path)
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = int(max_model_len or getattr(config, "max_position_embeddings", 4096))
        self.max_batch_rows = int(max_batch_rows)
        self.prefill_chunk = int(prefill_chunk)
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.cache_completions = cache_completions
        self.ignore_eos = ignore_eos
        self.eos_token_ids = self._eos_ids()
        self.prefix_cache = PrefixKVCache(prefix_cache_bytes)
        self._version = 0
        #: counters of the last ``generate`` call: prefill/cached/generated tokens, seconds
        self.last_stats: dict[str, float] = {}

    # -- setup helpers

    def _pick_dtype(self, dtype: str) -> torch.dtype:
        names = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
        if dtype in names:
            return names[dtype]
        if dtype != "auto":
            raise ValueError(f"dtype must be 'auto' or one of {sorted(names)}, got {dtype!r}")
        return names[auto_dtype(self.device.type)]

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for value in (getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        return frozenset(ids)

    # -- protocol

    @property
    def weights_version(self) -> int:
        return self._version

    @torch.inference_mode()
    def generate(
        self, prefixes: Sequence[Sequence[int]], n: Sequence[int] | int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        counts = check_generate_args(prefixes, n, self.vocab_size, self.max_model_len)
        rows = [(i, j) for i, k in enumerate(counts) for j in range(k)]
        results: list[list[Completion | None]] = [[None] * k for k in counts]
        stats = {"prefill_tokens": 0, "cached_tokens": 0, "generated_tokens": 0, "forward_passes": 0}
        t0 = time.perf_counter()
        with torch_threads(self.num_threads if self.device.type == "cpu" else None):
            for start in range(0, len(rows), self.max_batch_rows):
                chunk = rows[start : start + self.max_batch_rows]
                for (i, j), completion in zip(chunk, self._generate_rows(prefixes, chunk, sampling, stats)):
                    results[i][j] = completion
        stats["seconds"] = time.perf_counter() - t0
        self.last_stats = stats
        return results  # type: ignore[return-value]

    def _generate_rows(
        self, prefixes: Sequence[Sequence[int]], rows: list[tuple[int, int]], sampling: SamplingParams, stats: dict
    ) -> list[Completion]:
        unique = sorted({i for i, _ in rows})
        prefill_row = {i: r for r, i in enumerate(unique)}
        tokens = [np.asarray(prefixes[i], dtype=np.int64) for i in unique]
        cache, valid, pos, logits, reused = self._prefill(tokens, stats, sampling.max_tokens)

        # branch: one batch row per completion, sharing its prefix's prefill
        picks = [prefill_row[i] for i, _ in rows]
        if picks != list(range(len(unique))):  # some prefix has several completions
            expand = torch.tensor(picks, device=self.device)
            _cache_select(cache, expand)
            valid, pos, logits = valid[expand], pos[expand], logits[expand]

        generators = None
        if sampling.seed is not None and sampling.temperature > 0:
            generators = [
                torch.Generator(self.device).manual_seed(row_seed(sampling.seed, i, j)) for i, j in rows
            ]
        stop_ids = set(sampling.stop_token_ids) | (set() if self.ignore_eos else set(self.eos_token_ids))
        stopper = StopStrings(self.tokenizer, sampling.stop)
        out_tokens: list[list[int]] = [[] for _ in rows]
        out_logprobs: list[list[float]] = [[] for _ in rows]
        finish: list[str | None] = [None] * len(rows)
        live = list(range(len(rows)))  # batch row -> completion index

        while True:
            logprobs = process_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
            sampled = self._sample(logprobs, sampling.temperature, generators and [generators[c] for c in live])
            chosen = logprobs.gather(-1, sampled[:, None])[:, 0].tolist()
            sampled_list = sampled.tolist()
            keep = []
            for r, c in enumerate(live):
                tok = sampled_list[r]
                out_tokens[c].append(tok)
                out_logprobs[c].append(chosen[r])
                i = rows[c][0]
                if tok in stop_ids or stopper.hit(out_tokens[c]):
                    finish[c] = "stop"
                elif (len(out_tokens[c]) >= sampling.max_tokens
                      or len(prefixes[i]) + len(out_tokens[c]) >= self.max_model_len):
                    finish[c] = "length"
                else:
                    keep.append(r)
                    continue
                if self.cache_completions and self.prefix_cache.max_bytes:
                    self._store_row(cache, valid, r, list(prefixes[i]) + out_tokens[c][:-1])
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                _cache_select(cache, index)
                valid, pos, sampled = valid[index], pos[index], sampled[index]
                live = [live[r] for r in keep]
                dead = int(torch.nonzero(valid.any(0))[0])  # leading columns nobody attends to
                _cache_trim_left(cache, dead)
                valid = valid[:, dead:]
            valid = torch.cat([valid, valid.new_ones(len(live), 1)], dim=1)
            mask = None if bool(valid.all()) else valid[:, None, None, :]
            out = self.model(
                input_ids=sampled[:, None], attention_mask=mask, position_ids=pos[:, None],
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            stats["forward_passes"] += 1
            logits = out.logits[:, -1].float()
            pos = pos + 1

        completions = []
        for c, (i, _) in enumerate(rows):
            stats["generated_tokens"] += len(out_tokens[c])
            completions.append(Completion(
                token_ids=out_tokens[c], logprobs=out_logprobs[c], finish_reason=finish[c] or "length",
                cached_tokens=reused[prefill_row[i]],
                text=self.tokenizer.decode(out_tokens[c], skip_special_tokens=True),
            ))
        return completions

    def _prefill(self, prefixes: list[np.ndarray], stats: dict, max_tokens: int = 0):
        """Encode each prefix on top of its cached KV. Returns the batch state after it.

        Prefixes whose new parts have similar lengths are encoded together; a group spends
        at most 25 % of its compute on padding (on CPU a long prefix alone is about as
        efficient as a batch, so padding is pure waste). The groups' states are then
        merged, left-padded, in the callers' order. The cache keeps room for ``max_tokens``
        more positions a row (the decode loop appends in place).

        Returns ``(cache, valid [B, K] bool, next position [B], logits [B, V] float32,
        reused tokens per row)``.
        """
        cached = [self.prefix_cache.lookup(p) if self.prefix_cache.max_bytes else (None, 0) for p in prefixes]
        reused = [min(lcp, len(p) - 1) for p, (_, lcp) in zip(prefixes, cached)]
        new = [len(p) - u for p, u in zip(prefixes, reused)]
        stats["cached_tokens"] += sum(reused)
        stats["prefill_tokens"] += sum(new)
        order = sorted(range(len(prefixes)), key=lambda b: new[b])
        groups: list[list[int]] = []
        for b in order:  # ascending new length: the last member is the group's widest
            if groups and 4 * new[b] * (len(groups[-1]) + 1) <= 5 * (sum(new[i] for i in groups[-1]) + new[b]):
                groups[-1].append(b)
            else:
                groups.append([b])
        states = [self._prefill_group([prefixes[b] for b in g], [cached[b] for b in g], [reused[b] for b in g], stats,
                                      max_tokens) for g in groups]
        cache, valid, logits = _merge_states(states, spare=max_tokens)
        rows = [b for g in groups for b in g]
        if rows != list(range(len(prefixes))):
            back = torch.tensor(np.argsort(rows), device=self.device)
            _cache_select(cache, back)
            valid, logits = valid[back], logits[back]
        pos = torch.tensor([len(p) for p in prefixes], dtype=torch.long, device=self.device)
        return cache, valid, pos, logits, reused

    def _prefill_group(self, prefixes: list[np.ndarray], cached: list, reused: list[int], stats: dict,
                       max_tokens: int = 0):
        """Batched prefill of one group; returns ``(cache, valid, logits)``."""
        new = [len(p) - u for p, u in zip(prefixes, reused)]
        batch, width_cached, width_new = len(prefixes), max(reused), max(new)
        dev = self.device

        kv = None
        valid = torch.zeros(batch, width_cached + width_new, dtype=torch.bool, device=dev)
        # room for the new tokens and the decode (an empty cache reserves it at its first chunk)
        spare = max_tokens + width_new - (0 if width_cached else min(width_new, self.prefill_chunk))
        if width_cached:
            gathered = [self.prefix_cache.gather(entry, u) if u else None for (entry, _), u in zip(cached, reused)]
            ref = next(g for g in gathered if g is not None)
            kv = []
            for layer, (ref_k, ref_v) in enumerate(ref):  # the cached part in place, the room after it
                k = ref_k.new_empty(batch, ref_k.shape[0], width_cached + spare, ref_k.shape[-1], device=dev)
                v = ref_v.new_empty(batch, ref_v.shape[0], width_cached + spare, ref_v.shape[-1], device=dev)
                for b, (g, u) in enumerate(zip(gathered, reused)):
                    if u < width_cached:  # left padding: masked, but finite (0 x NaN is NaN)
                        k[b, :, : width_cached - u].zero_()
                        v[b, :, : width_cached - u].zero_()
                    if u:
                        k[b, :, width_cached - u : width_cached] = g[layer][0]
                        v[b, :, width_cached - u : width_cached] = g[layer][1]
                kv.append((k, v))
            for b, u in enumerate(reused):
                valid[b, width_cached - u : width_cached] = True

        input_ids = torch.zeros(batch, width_new, dtype=torch.long, device=dev)
        positions = torch.zeros(batch, width_new, dtype=torch.long, device=dev)
        for b, (p, u, d) in enumerate(zip(prefixes, reused, new)):
            input_ids[b, width_new - d :] = torch.from_numpy(p[u:])
            positions[b, width_new - d :] = torch.arange(u, u + d)
            valid[b, width_cached + width_new - d :] = True

        # chunked prefill bounds the mask and attention memory of long prompts
        cache = _make_cache(kv, spare, filled=width_cached if kv else None)
        padded = not bool(valid.all())
        for lo in range(0, width_new, self.prefill_chunk):
            hi = min(width_new, lo + self.prefill_chunk)
            mask = None
            if padded:
                q = torch.arange(hi - lo, device=dev)
                causal = q[None, :] <= q[:, None]  # [query, key] within this chunk
                here = valid[:, None, width_cached + lo : width_cached + hi]
                # every query may see itself, so a padding query's softmax row is never empty
                new_part = (causal[None] & here) | torch.eye(hi - lo, dtype=torch.bool, device=dev)[None]
                old_part = valid[:, None, : width_cached + lo].expand(batch, hi - lo, width_cached + lo)
                mask = torch.cat([old_part, new_part], dim=-1)[:, None]  # [B, 1, query, key]
            out = self.model(
                input_ids=input_ids[:, lo:hi], attention_mask=mask, position_ids=positions[:, lo:hi],
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            stats["forward_passes"] += 1
        if self.prefix_cache.max_bytes:
            for b, p in enumerate(prefixes):
                if cached[b][1] < len(p):  # the cache does not hold all of p yet
                    self._store_row(cache, valid, b, p)
        return cache, valid, out.logits[:, -1].float()

    def _store_row(self, cache, valid: torch.Tensor, row: int, tokens: Sequence[int]) -> None:
        """Put one batch row's KV (its real columns) into the prefix cache under ``tokens``."""
        columns = torch.nonzero(valid[row])[:, 0]
        if len(columns) != len(tokens):
            raise RuntimeError(f"KV row has {len(columns)} positions for {len(tokens)} tokens")
        layers = _cache_layers(cache)

        def kv_from(start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            tail = columns[start:]  # index_select copies: the entry keeps no view of the batch
            return [(k[row].index_select(1, tail), v[row].index_select(1, tail)) for k, v in layers]

        self.prefix_cache.put(np.asarray(tokens, dtype=np.int64), kv_from)

    @staticmethod
    def _sample(logprobs: torch.Tensor, temperature: float, generators: list | None) -> torch.Tensor:
        if temperature == 0:
            return logprobs.argmax(dim=-1)
        probs = logprobs.exp()
        if generators is None:
            return torch.multinomial(probs, 1)[:, 0]
        # one uniform from each row's own generator: batch mates never change a row's draw
        uniforms = torch.cat([torch.rand(1, generator=g, device=probs.device) for g in generators])
        return inverse_cdf(probs, uniforms)

    @torch.inference_mode()
    def score(self, sequences: Sequence[Sequence[int]], start: int | Sequence[int] = 1,
              max_tokens_per_batch: int = 4096) -> list[list[float]]:
        starts = check_score_args(sequences, start)
        results: list[list[float]] = [[] for _ in sequences]
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        batch: list[int] = []
        for i in order + [None]:  # type: ignore[list-item]
            if i is not None and (not batch or (len(batch) + 1) * len(sequences[i]) <= max_tokens_per_batch):
                batch.append(i)
                continue
            if batch:
                self._score_batch(sequences, starts, batch, results)
            batch = [i] if i is not None else []
        return results

    def _score_batch(self, sequences, starts, batch: list[int], results: list[list[float]]) -> None:
        # right padding: causal attention never lets a real token see a pad, so no mask is needed
        width = max(len(sequences[i]) for i in batch)
        first = min(starts[i] for i in batch) - 1
        ids = torch.zeros(len(batch), width, dtype=torch.long, device=self.device)
        for b, i in enumerate(batch):
            ids[b, : len(sequences[i])] = torch.as_tensor(list(sequences[i]))
        keep = torch.arange(first, width - 1, device=self.device)
        logits = self.model(input_ids=ids, logits_to_keep=keep).logits  # [B, width-1-first, V]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        targets = ids[:, first + 1 :]
        picked = logprobs.gather(-1, targets[..., None])[..., 0]
        for b, i in enumerate(batch):
            results[i] = picked[b, starts[i] - 1 - first : len(sequences[i]) - 1 - first].tolist()

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Copy tensors into the model's parameters (HF names; tied aliases accepted).

        Raises ``KeyError`` for an unknown name and ``ValueError`` for a shape mismatch;
        the prefix cache is cleared (its KV came from the old weights).
        """
        targets = self.model.state_dict(keep_vars=True)
        for name, tensor in named_tensors:
            if name not in targets:
                raise KeyError(f"update_weights: {name!r} is not a parameter of {self.model_path} "
                               f"(e.g. {list(targets)[:3]})")
            target = targets[name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"update_weights: {name!r} has shape {tuple(tensor.shape)}, "
                                 f"model expects {tuple(target.shape)}")
            target.data.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
        self.prefix_cache.clear()
        self._version = int(version)

    def reset_prefix_cache(self) -> None:
        self.prefix_cache.clear()

    def forget_prefix(self, tokens: Sequence[int]) -> int:
        """Drop the cached KV of every sequence that starts with ``tokens`` (a finished prompt:
        the bank recorder calls it, so the cache holds the prompts in flight, not every prompt
        until its byte budget is full); returns the bytes freed."""
        return self.prefix_cache.forget(np.asarray(tokens, dtype=np.int64))

    def close(self) -> None:
        self.prefix_cache.clear()
        self.model = None  # type: ignore[assignment]
