"""The HF engine's calls into transformers' ``DynamicCache`` internals, in one place.

The decode loop of :class:`trace_gym.engines.hf.HFEngine` builds, slices, merges and trims
batched KV caches; these helpers are the only code that touches ``DynamicCache`` itself
(``cache.layers``, ``layer_class_to_replicate``, a layer's ``keys / values``), so a
transformers release that changes that layout is fixed here. KV tensors are
``[batch, heads, positions, head_dim]`` per layer. ``transformers`` is imported lazily, on
the first cache built.

Each layer is a :class:`GrowingLayer`: its keys and values are views of buffers with
``spare`` free columns, so appending a token writes in place. Transformers' own layer
concatenates (``torch.cat``), copying the whole cache of every layer at every decode step:
an eighth of a 64-wide step over 130-token contexts here. The engine reserves what a call
can append (the prefill's new tokens plus ``max_tokens``), so a call never reallocates.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _layer_class():
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose ``keys`` / ``values`` are views ``[:, :, lo:hi]`` of buffers
        with spare columns; ``update`` writes new positions in place (reallocating, with
        ``spare`` more columns, only when they do not fit)."""

        def __init__(self, spare: int = 0):
            super().__init__()
            self.spare = max(int(spare), 0)
            self._kbuf = self._vbuf = None
            self._lo = self._hi = 0

        @property
        def keys(self):
            buf = self._kbuf
            return buf[:, :, self._lo:self._hi] if buf is not None and buf.dim() == 4 else buf

        @keys.setter
        def keys(self, tensor):  # transformers' own methods assign whole tensors: no spare
            self._kbuf, self._lo = tensor, 0
            self._hi = tensor.shape[-2] if tensor is not None and tensor.dim() == 4 else 0

        @property
        def values(self):
            buf = self._vbuf
            return buf[:, :, self._lo:self._hi] if buf is not None and buf.dim() == 4 else buf

        @values.setter
        def values(self, tensor):  # always assigned with keys of the same shape
            self._vbuf = tensor

        def adopt(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
            """Hold the buffers themselves (no copy): columns ``[0, filled)`` are the cache,
            the rest its spare room."""
            self._kbuf, self._vbuf, self._lo, self._hi = keys, values, 0, int(filled)
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

        def reserve(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
            """Hold ``keys`` / ``values`` with room for ``spare`` more positions."""
            batch, heads, n, dim = keys.shape
            self._kbuf = keys.new_empty(batch, heads, n + spare, dim)
            self._vbuf = values.new_empty(batch, heads, n + spare, values.shape[-1])
            self._kbuf[:, :, :n] = keys
            self._vbuf[:, :, :n] = values
            self._lo, self._hi = 0, n
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            new = key_states.shape[-2]
            buf = self._kbuf
            if buf is None or buf.dim() != 4 or self._hi + new > buf.shape[-2]:
                old = self.keys if buf is not None and buf.dim() == 4 else key_states[:, :, :0]
                olds = self.values if buf is not None and buf.dim() == 4 else value_states[:, :, :0]
                self.reserve(old, olds, new + max(self.spare, 16))
            self._kbuf[:, :, self._hi:self._hi + new] = key_states
            self._vbuf[:, :, self._hi:self._hi + new] = value_states
            self._hi += new
            return self.keys, self.values

        def select(self, index: torch.Tensor) -> None:
            """Keep batch rows ``index`` (in that order), spare columns included (the whole,
            contiguous buffer: index_select of a column slice is several times slower here)."""
            self._kbuf = self._kbuf.index_select(0, index)
            self._vbuf = self._vbuf.index_select(0, index)

        def trim_left(self, columns: int) -> None:
            self._lo += columns

    return GrowingLayer


def _make_cache(kv: list[tuple[torch.Tensor, torch.Tensor]] | None, spare: int = 0, filled: int | None = None):
    """A ``DynamicCache`` of growing layers holding ``kv`` (or empty), each with ``spare``
    free positions beyond what it holds (an empty one: beyond its first update).

    ``filled``: the ``kv`` tensors are already buffers whose first ``filled`` positions are
    the cache (the rest is room): they are held as they are, not copied."""
    from transformers import DynamicCache

    layer = _layer_class()
    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(layer, spare)
    for keys, values in kv or ():
        grown = layer(spare)
        if filled is None:
            grown.reserve(keys, values, spare)
        else:
            grown.adopt(keys, values, filled)
        cache.layers.append(grown)
    return cache


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache_select(cache, index: torch.Tensor) -> None:
    for layer in cache.layers:
        if hasattr(layer, "select"):
            layer.select(index)
        else:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)


def _merge_states(states: list, spare: int = 0) -> tuple:
    """Stack ``(cache, valid, logits)`` states along the batch, left-padding shorter ones."""
    if len(states) == 1:
        return states[0]
    width = max(valid.shape[1] for _, valid, _ in states)
    rows = sum(valid.shape[0] for _, valid, _ in states)
    kv = []
    for layer in range(len(states[0][0].layers)):
        parts = [_cache_layers(cache)[layer] for cache, _, _ in states]
        k0, v0 = parts[0]
        k = k0.new_empty(rows, k0.shape[1], width + spare, k0.shape[-1])  # one copy: into place, room after
        v = v0.new_empty(rows, v0.shape[1], width + spare, v0.shape[-1])
        r = 0
        for ki, vi in parts:
            n, pad = ki.shape[0], width - ki.shape[2]
            k[r:r + n, :, :pad].zero_()  # left padding: masked, but finite (0 x NaN is NaN)
            v[r:r + n, :, :pad].zero_()
            k[r:r + n, :, pad:width] = ki
            v[r:r + n, :, pad:width] = vi
            r += n
        kv.append((k, v))
    valid = torch.cat([torch.nn.functional.pad(valid, (width - valid.shape[1], 0)) for _, valid, _ in states])
    logits = torch.cat([logits for _, _, logits in states])
    return _make_cache(kv, spare, filled=width), valid, logits


def _cache_trim_left(cache, columns: int) -> None:
    if columns > 0:
        for layer in cache.layers:
            if hasattr(layer, "trim_left"):
                layer.trim_left(columns)
            else:
                layer.keys = layer.keys[:, :, columns:]
                layer.values = layer.values[:, :, columns:]
