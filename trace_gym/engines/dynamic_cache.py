"""The HF engine's calls into transformers' ``DynamicCache`` internals, in one place.

The decode loop of :class:`trace_gym.engines.hf.HFEngine` builds, slices, merges and trims
batched KV caches; these helpers are the only code that touches ``DynamicCache`` itself
(``ddp_cache_data``, ``cache.layers[i].keys / .values``), so a transformers release that
changes that layout is fixed here. KV tensors are ``[batch, heads, positions, head_dim]``
per layer. ``transformers`` is imported lazily, on the first cache built.
"""

from __future__ import annotations

import torch


def _make_cache(kv: list[tuple[torch.Tensor, torch.Tensor]] | None):
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_select(cache, index: torch.Tensor) -> None:
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)


def _merge_states(states: list) -> tuple:
    """Stack ``(cache, valid, logits)`` states along the batch, left-padding shorter ones."""
    if len(states) == 1:
        return states[0]
    width = max(valid.shape[1] for _, valid, _ in states)
    kv = []
    for layer in range(len(states[0][0].layers)):
        ks, vs = [], []
        for cache, valid, _ in states:
            k, v = _cache_layers(cache)[layer]
            pad = width - valid.shape[1]
            ks.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
            vs.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
        kv.append((torch.cat(ks), torch.cat(vs)))
    valid = torch.cat([torch.nn.functional.pad(valid, (width - valid.shape[1], 0)) for _, valid, _ in states])
    logits = torch.cat([logits for _, _, logits in states])
    return _make_cache(kv), valid, logits


def _cache_trim_left(cache, columns: int) -> None:
    if columns > 0:
        for layer in cache.layers:
            layer.keys = layer.keys[:, :, columns:]
            layer.values = layer.values[:, :, columns:]
