"""Grouped-query attention without copying the KV heads: the HF engine's attention kernel.

Transformers' ``sdpa`` attention repeats every KV head ``groups = heads / kv_heads`` times
(``repeat_kv``, a full copy of the cache) whenever a mask is passed, and otherwise hands
``enable_gqa`` to a CPU flash kernel that is slow for one query row. Decoding a padded batch
does both on every layer of every step: on this CPU, SmolLM2-135M at 64 rows x 250 cached
positions spent about 10 ms a layer there (``benchmarks/bench_engines.py`` compares the two side by side).

The query heads that share a KV head are folded into the query axis instead: query
``[B, H, Q, D]`` is viewed as ``[B, kv_heads, groups * Q, D]`` (head ``h`` reads KV head
``h // groups``, the layout ``repeat_kv`` produces), the mask is repeated along its query
axis to match, and one ``scaled_dot_product_attention`` over the unrepeated KV computes the
same sums: in float32 the engine's tokens are identical to ``sdpa``'s (tested); in bf16 the
kernels round in a different order, so a near-tie can sample another token. About 9x less
time in attention at that shape.

Used where it is exact and needed: a mask is given, or one query row (decode); dropout is
zero. Anything else (an unmasked causal prefill, sliding windows, attention sinks, training
with dropout) goes to transformers' own ``sdpa`` function unchanged.
"""

from __future__ import annotations

from typing import Any

#: the name the HF engine loads its model with (registered on first use)
NAME = "trace_gym_gqa"

#: keyword arguments that change what attention computes: with any of them set, ``sdpa`` runs
_SEMANTIC = ("sliding_window", "s_aux", "sinks", "softcap", "position_bias", "cache")


def gqa_attention(module: Any, query, key, value, attention_mask, dropout: float = 0.0,
                  scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """Transformers' attention-interface signature; returns ``(output [B, Q, H, D], None)``."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads if kv_heads else 0
    plain = (groups <= 1 or heads != groups * kv_heads or dropout
             or (attention_mask is None and q_len > 1)
             or (attention_mask is not None and attention_mask.dtype != torch.bool)
             or any(kwargs.get(k) is not None for k in _SEMANTIC))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    folded = query.reshape(batch, kv_heads, groups * q_len, dim)  # query head h -> KV head h // groups
    mask = attention_mask
    if mask is not None:
        if mask.shape[1] != 1:  # a per-head mask: fold its heads the same way
            mask = mask.expand(batch, heads, q_len, mask.shape[-1])
            mask = mask.reshape(batch, kv_heads, groups * q_len, mask.shape[-1])
        elif q_len > 1:  # one row per query: repeated for each head of the group
            mask = mask.expand(mask.shape[0], groups, q_len, mask.shape[-1])
            mask = mask.reshape(mask.shape[0], 1, groups * q_len, mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :func:`gqa_attention` (and ``sdpa``'s mask builder) under :data:`NAME`; returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
