"""The HF engine's sampling rule as pure functions: no model, no transformers.

- :func:`process_logits`: the sampling distribution, ``logits / T`` -> top-k -> top-p ->
  ``log_softmax`` (float32); its entry for the sampled token is the reported logprob.
- :func:`row_seed`: the seed of one completion's own ``torch.Generator``, from
  ``(seed, prefix index, sample index)``, so a completion does not depend on its batch mates.
- :class:`StopStrings`: the stop-string rule (the same as vLLM's).

Used by the decode loop of :class:`trace_gym.engines.hf.HFEngine`, which re-exports them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["process_logits", "row_seed", "StopStrings"]


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the sampling distribution.

    Args:
        logits: ``[R, V]`` raw next-token logits.
        temperature: ``> 0`` scales logits; ``0`` (greedy) returns the plain log-softmax.
        top_k: keep the ``top_k`` largest logits (ties at the k-th value kept); ``<= 0`` off.
        top_p: keep the smallest set of most likely tokens whose mass reaches ``top_p``.

    Returns:
        ``[R, V]`` float32 log-probabilities, ``-inf`` outside the support.
    """
    z = logits.float()
    if temperature == 0:
        return torch.log_softmax(z, dim=-1)
    z = z / temperature
    vocab = z.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p  # the first token always has mass_before 0: kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def row_seed(seed: int, prefix_index: int, sample_index: int) -> int:
    """The generator seed of completion ``sample_index`` of prefix ``prefix_index``."""
    return int(np.random.SeedSequence([seed, prefix_index, sample_index]).generate_state(1, np.uint64)[0] >> 1)


class StopStrings:
    """Detects the first stop string in a growing completion.

    Rule (same as vLLM): after each sampled token, the completion's text (decoded with
    ``skip_special_tokens=True``) is searched; the first token whose decoding makes any stop
    string appear ends the completion and is kept whole. Only a tail window of tokens is
    decoded: a stop string of ``c`` characters spans at most ``4c`` byte-level tokens.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.window = 4 * max((len(s) for s in self.stops), default=0) + 4

    def hit(self, token_ids: Sequence[int]) -> bool:
        if not self.stops:
            return False
        text = self.tokenizer.decode(list(token_ids[-self.window:]), skip_special_tokens=True)
        return any(s in text for s in self.stops)
