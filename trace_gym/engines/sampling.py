"""The HF engine's sampling rule as pure functions: no model, no transformers.

- :func:`process_logits`: the sampling distribution, ``logits / T`` -> top-k -> top-p ->
  ``log_softmax`` (float32); its entry for the sampled token is the reported logprob.
- :func:`row_seed`: the seed of one completion's own ``torch.Generator``, from
  ``(seed, prefix index, sample index)``, so a completion does not depend on its batch mates.
- :func:`inverse_cdf`: one token per row from one uniform per row (batched: each row's
  generator draws a single number a step, not a vocabulary of exponentials).
- :class:`StopStrings`: the stop-string rule (the same as vLLM's).

Used by the decode loop of :class:`trace_gym.engines.hf.HFEngine`, which re-exports them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["process_logits", "row_seed", "inverse_cdf", "StopStrings"]


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


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Sample row ``r`` of ``probs`` by inverting its CDF at ``uniforms[r]``.

    Args:
        probs: ``[R, V]`` non-negative weights (need not sum to 1; zeros are never drawn).
        uniforms: ``[R]`` draws in ``[0, 1)``.
        block: tokens per block of the two-level search (a CDF over block sums, then one
            block's own CDF: about 8x faster than a float64 cumsum over the vocabulary).

    Returns:
        ``[R]`` int64: the smallest ``i`` with ``cumsum(probs[r])[i] > uniforms[r] * sum(probs[r])``,
        the sums in float64 (a vocabulary of 10^5 entries loses no mass to rounding).
    """
    rows, vocab = probs.shape
    pad = (-vocab) % block
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).reshape(rows, -1, block)
    sums = blocks.sum(-1, dtype=torch.float64)  # [R, blocks]
    cdf = sums.cumsum(-1)
    target = uniforms.double() * cdf[:, -1]
    # the first block whose CDF passes the target (u < 1: one always does, and it has mass)
    b = torch.searchsorted(cdf, target[:, None], right=True)[:, 0].clamp_(max=cdf.shape[1] - 1)
    before = torch.where(b > 0, cdf.gather(1, (b - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    inner = blocks[torch.arange(rows, device=probs.device), b]  # [R, block]
    i = torch.searchsorted(before[:, None] + inner.double().cumsum(-1), target[:, None], right=True)[:, 0]
    # rounding may step past the block's last token with mass: never onto a zero
    last = torch.where(inner > 0, torch.arange(block, device=probs.device), -1).amax(-1)
    return b * block + torch.minimum(i, last)


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
