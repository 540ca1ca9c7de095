"""What a success predictor remembers: a replay buffer of its samples and per-prompt evidence.

A predictor that trains on the last batch alone forgets: its level follows whatever
that batch's success rate was (measured on the math bank: the pool-mean prediction
correlated 0.85 with the previous batch's rate and swung between 0.04 and 0.83 while
the true pool mean moved by 0.05). Two pieces of memory fix that, both plain data with
``state_dict`` / ``load_state_dict`` so a checkpoint carries them:

- :class:`ReplayBuffer`: every ``(item, target, weight)`` sample seen, bounded, each
  sample's weight halved every ``half_life`` updates (recency weighting, the one knob);
  the head regresses on the whole buffer at every update instead of on the last batch.
- :class:`PromptEvidence`: a discounted Beta-binomial record per prompt of its own root
  outcomes (as MoPPS keeps, arXiv:2507.04632): successes and trials, each multiplied by
  ``discount`` at every update so that old evidence about an earlier policy fades.
  :func:`blend_evidence` combines it with the head's prediction: the head is the prior
  mean, worth ``strength`` pseudo-outcomes, so a prompt's own evidence takes over as it
  grows (the posterior mean of Beta(strength v + s, strength (1 - v) + n - s)).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import numpy as np

#: A sample whose recency weight falls below this share is dropped from the buffer.
MIN_RECENCY = 0.01
#: The most that dropping a faded prompt's evidence may move a blended prediction
#: (:class:`PromptEvidence`; a probability).
EVIDENCE_TOLERANCE = 1e-6
#: :class:`PromptEvidence` prunes once it holds this many entries, and twice as many as
#: its last pruning left (below it a scan is not worth its cost).
MIN_PRUNE_ENTRIES = 1024


def blend_evidence(head: np.ndarray, successes: np.ndarray, trials: np.ndarray, strength: float) -> np.ndarray:
    """Posterior mean success with the head's prediction as the prior.

    ``(strength * head + successes) / (strength + trials)``, elementwise: with no
    evidence (``trials == 0``) the head's value, and the prompt's own rate
    ``successes / trials`` as ``trials`` grows past ``strength``.

    Args:
        head: the head's predictions in [0, 1], shape (n,).
        successes: discounted successes per prompt, shape (n,), ``0 <= s <= trials``.
        trials: discounted trials per prompt, shape (n,), ``>= 0``.
        strength: the head's weight in pseudo-outcomes (> 0).
    """
    if not strength > 0:
        raise ValueError(f"evidence strength must be > 0, got {strength!r}")
    head, s, n = (np.asarray(x, dtype=float) for x in (head, successes, trials))
    return (strength * head + s) / (strength + n)


@dataclass
class ReplayBuffer:
    """A bounded memory of regression samples with recency weights.

    Each :meth:`add` is one update's batch; a sample added ``age`` updates ago weighs
    ``weight * 0.5 ** (age / half_life)`` in :meth:`samples`. Samples whose recency factor
    fell below :data:`MIN_RECENCY` are dropped, and beyond ``capacity`` samples the
    oldest go first. ``half_life = inf`` keeps every sample at full weight (a window of
    ``capacity`` samples).

    :meth:`add` costs O(1) amortised, whatever the batch sizes: the batches sit in a deque
    in the order they came (so the too-old and the over-capacity ones are at its left
    end), the size is kept as a count, and samples cut from the oldest batch are skipped
    by an offset, never copied. (Before, every add rebuilt the list of batches and summed
    their sizes: 30,000 one-sample updates did not finish in 25 s.)

    Items are whatever the predictor regresses on: feature rows (a 2-d array per batch)
    or contexts (a list per batch).

    Attributes:
        half_life: updates after which a sample's weight has halved (> 0).
        capacity: the most samples kept (>= 1).
    """

    half_life: float = 8.0
    capacity: int = 20_000
    _chunks: deque = field(default_factory=deque)  # (items, targets, weights, tick), oldest first
    _tick: int = 0
    _size: int = 0  # samples kept, the first chunk's skipped ones excluded
    _skip: int = 0  # samples of the first chunk already dropped (over capacity)

    def __post_init__(self) -> None:
        if not self.half_life > 0:
            raise ValueError(f"replay half_life must be > 0 updates, got {self.half_life!r}")
        if int(self.capacity) != self.capacity or self.capacity < 1:
            raise ValueError(f"replay capacity must be an integer >= 1, got {self.capacity!r}")

    def __len__(self) -> int:
        return self._size

    def add(self, items: Any, targets: np.ndarray, weights: np.ndarray) -> None:
        """Append one update's samples (``len(items) == len(targets) == len(weights)``) and age the rest."""
        targets, weights = np.asarray(targets, dtype=float), np.asarray(weights, dtype=float)
        if not len(items) == len(targets) == len(weights):
            raise ValueError(f"replay batch lengths differ: {len(items)} items, {len(targets)} targets, "
                             f"{len(weights)} weights")
        self._tick += 1
        if len(targets):
            self._chunks.append((items, targets, weights, self._tick))
            self._size += len(targets)
        horizon = math.inf if math.isinf(self.half_life) else self.half_life * math.log2(1 / MIN_RECENCY)
        while self._chunks and self._tick - self._chunks[0][3] > horizon:
            self._drop_first()
        while self._size > self.capacity:  # the oldest samples first
            first = len(self._chunks[0][1]) - self._skip
            if first <= self._size - self.capacity:
                self._drop_first()
            else:
                self._skip += self._size - self.capacity
                self._size = self.capacity

    def _drop_first(self) -> None:
        """Drop the oldest chunk (what is left of it)."""
        self._size -= len(self._chunks.popleft()[1]) - self._skip
        self._skip = 0

    def _kept(self) -> list[tuple[Any, np.ndarray, np.ndarray, int]]:
        """The chunks as kept: the first one cut by the samples already dropped."""
        chunks = list(self._chunks)
        if chunks and self._skip:
            items, t, w, tick = chunks[0]
            chunks[0] = (items[self._skip:], t[self._skip:], w[self._skip:], tick)
        return chunks

    def samples(self) -> tuple[Any, np.ndarray, np.ndarray]:
        """``(items, targets, recency-weighted weights)`` of every sample kept, oldest first.

        Items come back as one array when the batches were arrays, else as one list.
        """
        chunks = self._kept()
        if not chunks:
            return [], np.zeros(0), np.zeros(0)
        items = [c[0] for c in chunks]
        joined = np.concatenate(items) if isinstance(items[0], np.ndarray) else [x for part in items for x in part]
        decay = [np.full(len(t), 0.5 ** ((self._tick - tick) / self.half_life)) for _, t, _, tick in chunks]
        return (joined, np.concatenate([t for _, t, _, _ in chunks]),
                np.concatenate([w for _, _, w, _ in chunks]) * np.concatenate(decay))

    def state_dict(self) -> dict[str, Any]:
        return {"half_life": self.half_life, "capacity": self.capacity, "tick": self._tick,
                "chunks": [(items, t.copy(), w.copy(), tick) for items, t, w, tick in self._kept()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.half_life, self.capacity, self._tick = state["half_life"], state["capacity"], state["tick"]
        self._chunks = deque((items, np.asarray(t, float), np.asarray(w, float), int(tick))
                             for items, t, w, tick in state["chunks"])
        self._size, self._skip = sum(len(c[1]) for c in self._chunks), 0


@dataclass
class PromptEvidence:
    """Discounted Beta-binomial evidence per prompt (see the module docstring), pruned.

    **Pruning.** A prompt seen ``age`` updates ago with ``n`` trials then holds
    ``n' = n * discount ** age`` trials now, and moves its blended prediction by at most
    ``n' / strength``: with ``h`` the head's value, ``s'`` its faded successes
    (``0 <= s' <= n'``) and any other evidence ``(S, N)`` the prompt has,
    ``|(k h + S + s') / (k + N + n') - (k h + S) / (k + N)| = |s' (k + N) - n' (k h + S)| /
    ((k + N)(k + N + n')) <= n' / (k + N) <= n' / k`` (``k = strength``; the middle step
    because ``0 <= k h + S <= k + N``). ``n'`` only shrinks from then on, so an entry whose
    faded trials fell below ``tolerance * strength`` is dropped: no blended prediction,
    now or at any later update, differs by more than ``tolerance`` from what it would
    have been with the entry kept (``tests/core/test_predictor_memory.py`` checks it
    against ``tolerance=0``, which keeps everything). The entries kept are then those seen
    within ``log(tolerance * strength / n) / log(discount)`` updates: about 140 updates'
    prompts at the defaults (discount 0.9, strength 4, 8 trials), instead of every
    prompt ever seen (200,000 after 2,000 updates of 100 new prompts, the oldest
    weighing 3e-92, 11.6 MB in each checkpoint). Pruning runs when the entries have
    doubled since the last pruning (O(1) amortised per prompt observed), so at most twice
    as many are held, and a checkpoint carries them. With ``discount = 1`` nothing fades:
    every prompt seen is kept (bounded by the data set).

    Attributes:
        discount: factor on every prompt's counts per update, in (0, 1] (1: never forget).
        strength: the head's weight in pseudo-outcomes when blending (> 0).
        tolerance: the most a dropped entry may move a blended prediction (a probability,
            >= 0; 0 keeps every entry).
    """

    discount: float = 0.9
    strength: float = 4.0
    tolerance: float = EVIDENCE_TOLERANCE
    _counts: dict[Hashable, tuple[float, float, int]] = field(default_factory=dict)  # key -> (s, n, tick)
    _tick: int = 0
    _pruned_size: int = 0  # entries left by the last pruning

    def __post_init__(self) -> None:
        if not 0 < self.discount <= 1:
            raise ValueError(f"evidence discount must lie in (0, 1], got {self.discount!r}")
        if not self.strength > 0:
            raise ValueError(f"evidence strength must be > 0, got {self.strength!r}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"evidence tolerance must lie in [0, 1), got {self.tolerance!r}")

    def __len__(self) -> int:
        return len(self._counts)

    def tick(self) -> None:
        """One update has passed: every prompt's evidence fades by ``discount`` (and the entries
        that can no longer matter are dropped, once they have doubled since the last pruning)."""
        self._tick += 1
        if len(self._counts) >= max(2 * self._pruned_size, MIN_PRUNE_ENTRIES):
            self.prune()

    def prune(self) -> int:
        """Drop every entry whose faded trials are below ``tolerance * strength`` (class
        docstring); returns how many were dropped."""
        floor = self.tolerance * self.strength
        if floor > 0 and self.discount < 1:
            gone = [key for key, (_, n, tick) in self._counts.items()
                    if n * self.discount ** (self._tick - tick) < floor]  # underflows to 0.0, never to NaN
            for key in gone:
                del self._counts[key]
        else:
            gone = []
        self._pruned_size = len(self._counts)
        return len(gone)

    def counts(self, keys: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray]:
        """Discounted ``(successes, trials)`` per key, shape (n,) each (0 for a prompt never seen,
        or whose trials faded below ``tolerance * strength``)."""
        s, n = np.zeros(len(keys)), np.zeros(len(keys))
        for i, key in enumerate(keys):
            if key in self._counts:
                si, ni, tick = self._counts[key]
                fade = self.discount ** (self._tick - tick)
                s[i], n[i] = si * fade, ni * fade
        return s, n

    def observe(self, keys: Sequence[Hashable], successes: Sequence[float], trials: Sequence[float]) -> None:
        """Add outcomes: ``successes[i]`` of ``trials[i]`` fresh rollouts of prompt ``keys[i]``."""
        s_new, n_new = np.asarray(successes, dtype=float), np.asarray(trials, dtype=float)
        if not len(keys) == len(s_new) == len(n_new):
            raise ValueError(f"evidence lengths differ: {len(keys)} keys, {len(s_new)} successes, {len(n_new)} trials")
        if (n_new < 0).any() or (s_new < 0).any() or (s_new > n_new).any():
            raise ValueError("evidence needs 0 <= successes <= trials")
        s_old, n_old = self.counts(keys)
        for key, s, n in zip(keys, s_old + s_new, n_old + n_new):
            self._counts[key] = (float(s), float(n), self._tick)

    def blend(self, keys: Sequence[Hashable], head: np.ndarray) -> np.ndarray:
        """:func:`blend_evidence` of the head's predictions with each key's evidence."""
        s, n = self.counts(keys)
        return blend_evidence(head, s, n, self.strength)

    def state_dict(self) -> dict[str, Any]:
        return {"discount": self.discount, "strength": self.strength, "tolerance": self.tolerance,
                "tick": self._tick, "pruned_size": self._pruned_size, "counts": dict(self._counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state of :meth:`state_dict` (one written before pruning existed keeps the default
        tolerance, and is pruned at its next update)."""
        self.discount, self.strength, self._tick = state["discount"], state["strength"], state["tick"]
        self.tolerance = state.get("tolerance", EVIDENCE_TOLERANCE)
        self._pruned_size = state.get("pruned_size", 0)
        self._counts = dict(state["counts"])


def prompt_key(context: Any) -> str:
    """The key a prompt's evidence is kept under: a hash of its text (``context.prompt``)."""
    return hashlib.blake2b(context.prompt.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def with_prompt_evidence(evidence: Any, contexts: Sequence[Any], head: np.ndarray) -> np.ndarray:
    """``head`` with every prompt-level context (depth 0, no history) blended with its evidence."""
    out = np.asarray(head, dtype=float).copy()
    roots = [i for i, c in enumerate(contexts) if c.depth == 0 and not c.history]
    if roots and len(evidence):
        out[roots] = evidence.blend([prompt_key(contexts[i]) for i in roots], out[roots])
    return out


def regress_head(head: Any, optimizer: Any, x: np.ndarray, y: np.ndarray, w: np.ndarray, steps: int,
                 device: str) -> float:
    """``steps`` full-batch optimiser steps of weighted binary cross-entropy of ``head(x)`` against
    soft targets ``y`` (weights ``w`` normalised to sum 1); returns the last loss.

    Shapes: ``x`` (n, d) float32 features, ``y`` and ``w`` (n,)."""
    import torch

    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device)
    yt = torch.from_numpy(y).float().to(device)
    wt = torch.from_numpy(w / max(w.sum(), 1e-12)).float().to(device)
    loss = torch.zeros(())
    for _ in range(steps):
        logits = head(xt)[:, 0]
        loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, yt, reduction="none") * wt).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())
