"""The HF engine's prefix KV cache: token sequences -> per-layer KV tensors, as a segment tree.

Pure data structure (torch tensors in, torch tensors out); the engine decides what to
store. Shapes: one ``(keys, values)`` pair per layer, each ``[heads, tokens, head_dim]``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    neq = np.flatnonzero(a[:m] != b[:m])
    return int(neq[0]) if len(neq) else m



@dataclass(eq=False)
class _Entry:
    tokens: np.ndarray  # [L] int64: the whole sequence this entry stands for
    parent: "_Entry | None"  # holds the KV of tokens[:start] (through its own ancestors)
    start: int
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, KV of tokens[start:]: ([H, L-start, D], ...)
    nbytes: int  # of this entry's own KV
    children: int = 0


class PrefixKVCache:
    """LRU cache of KV tensors for token sequences, stored as a tree of segments.

    An entry keeps only the KV of its tokens past its parent's common prefix, so a prompt
    and its ``n`` completions cost ``len(prompt) + sum(len(completion))`` tokens of KV, not
    ``n`` copies of the prompt. Bounded in bytes; only leaves are evicted (least recently
    used first), since children reference their parents' segments.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._ids: dict[int, int] = {}  # id(entry) -> key
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: np.ndarray) -> tuple[_Entry | None, int]:
        """The entry with the longest common prefix (LCP) with ``tokens``, and that length."""
        best, best_len = None, 0
        for entry in self._entries.values():
            n = common_prefix_len(entry.tokens, tokens)
            if n > best_len:
                best, best_len = entry, n
        if best is not None:
            self._entries.move_to_end(self._ids[id(best)])
        return best, best_len

    @staticmethod
    def gather(entry: _Entry, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer KV of ``entry.tokens[:length]``, ``([H, length, D], [H, length, D])``."""
        segments = []
        node, end = entry, length
        while end > 0:
            if end > node.start:
                segments.append((node, end - node.start))
                end = node.start
            node = node.parent
        segments.reverse()
        return [
            (torch.cat([n.kv[layer][0][:, :m] for n, m in segments], dim=1),
             torch.cat([n.kv[layer][1][:, :m] for n, m in segments], dim=1))
            for layer in range(len(entry.kv))
        ]

    def put(self, tokens: np.ndarray, kv_from: Callable[[int], list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
        """Cache ``tokens``; ``kv_from(start)`` returns the per-layer KV of ``tokens[start:]``."""
        if not self.max_bytes or len(tokens) == 0:
            return
        parent, lcp = self.lookup(tokens)
        if lcp == len(tokens):  # already covered by a longer (or equal) entry
            return
        while parent is not None and parent.start >= lcp:  # the deepest ancestor that holds tokens[:lcp]
            parent = parent.parent
        start = lcp if parent is not None else 0
        kv = kv_from(start)
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return
        entry = _Entry(tokens.copy(), parent, start, kv, nbytes)
        if parent is not None:
            parent.children += 1
        self._entries[self._next_id] = entry
        self._ids[id(entry)] = self._next_id
        self._next_id += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            victim = next(key for key, e in self._entries.items() if e.children == 0)
            self._drop(victim)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        del self._ids[id(entry)]
        self.nbytes -= entry.nbytes
        if entry.parent is not None:
            entry.parent.children -= 1

    def forget(self, prefix: np.ndarray) -> int:
        """Drop every entry whose sequence starts with ``prefix`` (a prompt no later call will
        extend), leaves first; an entry that another one still builds on stays. Returns the
        bytes of KV freed."""
        prefix = np.asarray(prefix, dtype=np.int64)
        m, before = len(prefix), self.nbytes
        doomed = [key for key, e in self._entries.items() if m and common_prefix_len(e.tokens[:m], prefix) == m]
        while doomed:
            leaves = [key for key in doomed if self._entries[key].children == 0]
            if not leaves:
                break
            for key in leaves:
                self._drop(key)
            doomed = [key for key in doomed if key in self._entries]
        return before - self.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self._ids.clear()
        self.nbytes = 0
