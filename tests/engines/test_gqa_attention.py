"""The HF engine's grouped-query attention kernel against repeat_kv + sdpa, and in the engine."""

from __future__ import annotations

import pytest
import torch

from trace_gym.engines.gqa_attention import NAME, gqa_attention, register
from trace_gym.types import SamplingParams


class _Module:  # what transformers' attention functions read off the layer
    def __init__(self, groups: int):
        self.num_key_value_groups = groups
        self.is_causal = True
        self.training = False


def _reference(query, key, value, mask, scale):
    """Every KV head repeated ``groups`` times (transformers' repeat_kv), then one sdpa call."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def _inputs(batch, heads, kv_heads, q_len, k_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, 16, generator=g)
    k = torch.randn(batch, kv_heads, k_len, 16, generator=g)
    v = torch.randn(batch, kv_heads, k_len, 16, generator=g)
    return q, k, v


def _ragged(batch, q_len, k_len, heads=1, seed=1):
    """Left padding of a random width per row plus causality over the last ``q_len`` keys."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, k_len - q_len, (batch, 1, 1, 1), generator=g)
    keys = torch.arange(k_len)[None, None, None, :]
    queries = torch.arange(q_len)[None, None, :, None] + (k_len - q_len)
    mask = (keys >= start) & (keys <= queries)
    return mask.expand(batch, heads, q_len, k_len).clone() if heads > 1 else mask


@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 2), (8, 1)])
def test_matches_repeated_heads_with_a_padding_mask(q_len, heads, kv_heads):
    q, k, v = _inputs(3, heads, kv_heads, q_len, 12)
    mask = _ragged(3, q_len, 12)
    out, weights = gqa_attention(_Module(heads // kv_heads), q, k, v, mask, scaling=0.25)
    assert weights is None and out.shape == (3, q_len, heads, 16)
    torch.testing.assert_close(out, _reference(q, k, v, mask, 0.25), atol=1e-5, rtol=1e-5)


def test_matches_with_a_per_head_mask_and_a_batch_broadcast_mask():
    q, k, v = _inputs(2, 6, 2, 4, 10)
    per_head = _ragged(2, 4, 10, heads=6)
    per_head[:, 1, :, 0] = False  # heads differ: the fold must keep each head's own rows
    out, _ = gqa_attention(_Module(3), q, k, v, per_head, scaling=0.3)
    torch.testing.assert_close(out, _reference(q, k, v, per_head, 0.3), atol=1e-5, rtol=1e-5)
    shared = _ragged(1, 4, 10)  # [1, 1, Q, K]: one mask for the whole batch
    out, _ = gqa_attention(_Module(3), q, k, v, shared, scaling=0.3)
    torch.testing.assert_close(out, _reference(q, k, v, shared, 0.3), atol=1e-5, rtol=1e-5)


def test_decode_without_a_mask_and_the_cases_left_to_sdpa():
    q, k, v = _inputs(2, 6, 2, 1, 7)
    out, _ = gqa_attention(_Module(3), q, k, v, None, scaling=0.5)
    torch.testing.assert_close(out, _reference(q, k, v, None, 0.5), atol=1e-5, rtol=1e-5)
    # an unmasked causal prefill goes to transformers' sdpa: still the causal answer
    q, k, v = _inputs(2, 6, 2, 7, 7)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    out, _ = gqa_attention(_Module(3), q, k, v, None, scaling=0.5)
    torch.testing.assert_close(out, _reference(q, k, v, causal, 0.5), atol=1e-5, rtol=1e-5)
    # no grouping (heads == kv heads) and a float (additive) mask: sdpa's own path
    q, k, v = _inputs(2, 4, 4, 3, 6)
    additive = torch.where(_ragged(2, 3, 6), 0.0, float("-inf"))
    out, _ = gqa_attention(_Module(1), q, k, v, additive, scaling=0.5)
    torch.testing.assert_close(out, _reference(q, k, v, additive, 0.5), atol=1e-5, rtol=1e-5)


def test_register_names_the_kernel_for_transformers():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert register() == NAME
    assert AttentionInterface._global_mapping[NAME] is gqa_attention
    assert NAME in AttentionMaskInterface._global_mapping


def _turns(engine):
    """A padded batch, then each row's next turn from the prefix cache: tokens of both calls."""
    tok = engine.tokenizer
    first = [tok.encode("Hello there, how are"), tok.encode("One"), tok.encode("The quick brown fox jumps over")]
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=4)
    a = engine.generate(first, [1, 2, 1], greedy)
    second = [p + list(c[0].token_ids) + tok.encode(" and then") for p, c in zip(first, a)]
    b = engine.generate(second, 2, sampled)
    return [[c.token_ids for c in o] for o in a + b], [c.cached_tokens for o in b for c in o]


def test_engine_tokens_equal_sdpa_in_float32(tiny_model_path):
    from trace_gym.engines.hf import HFEngine

    ours = HFEngine(tiny_model_path, dtype="float32", device="cpu")
    base = HFEngine(tiny_model_path, dtype="float32", device="cpu", attention="sdpa")
    assert ours.model.config._attn_implementation == NAME
    assert base.model.config._attn_implementation == "sdpa"
    tokens, cached = _turns(ours)
    assert tokens == _turns(base)[0]
    assert min(cached) > 0  # the second turn decoded over cached, left-padded KV: the masked path ran


def test_engine_rejects_an_unknown_attention(tiny_model_path):
    from trace_gym.engines.hf import HFEngine

    with pytest.raises(ValueError, match="'flash'"):
        HFEngine(tiny_model_path, dtype="float32", device="cpu", attention="flash")
