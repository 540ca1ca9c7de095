"""HF engine: batching, branching, prefix cache, seeds, stop rules, logprobs, weight updates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trace_gym.engines import RolloutEngine, check_generate_args, make_engine
from trace_gym.engines.hf import StopStrings, process_logits
from trace_gym.engines.prefix_cache import PrefixKVCache, common_prefix_len
from trace_gym.types import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture()
def engine(tiny_engine):
    tiny_engine.prefix_cache.clear()
    return tiny_engine


def prompts(engine):
    tok = engine.tokenizer
    return [
        tok.encode("Hello there, how are"),
        tok.encode("One"),
        tok.encode("The quick brown fox jumps over the lazy dog and then"),
    ]


# ---------------------------------------------------------------- pure helpers, hand-computed


def test_process_logits_by_hand():
    logits = torch.tensor([[math.log(4.0), math.log(3.0), math.log(2.0), math.log(1.0)]])
    # temperature 1, no truncation: p = [.4, .3, .2, .1]
    assert torch.allclose(process_logits(logits, 1.0).exp(), torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    # top-k 2: renormalise the two largest -> [4/7, 3/7, 0, 0]
    assert torch.allclose(process_logits(logits, 1.0, top_k=2).exp(), torch.tensor([[4 / 7, 3 / 7, 0, 0]]))
    # top-p 0.65: .4 < .65, .4 + .3 >= .65 -> keep two tokens; top-p 0.4 -> just the first
    assert torch.allclose(process_logits(logits, 1.0, top_p=0.65).exp(), torch.tensor([[4 / 7, 3 / 7, 0, 0]]))
    assert torch.allclose(process_logits(logits, 1.0, top_p=0.4).exp(), torch.tensor([[1.0, 0, 0, 0]]))
    # temperature 0.5 squares the odds: [16, 9, 4, 1] / 30
    assert torch.allclose(process_logits(logits, 0.5).exp(), torch.tensor([[16, 9, 4, 1]]) / 30.0)
    # greedy reports the plain log-softmax
    assert torch.allclose(process_logits(logits, 0.0), torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])))


def test_common_prefix_len():
    assert common_prefix_len(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix_len(np.array([1, 2]), np.array([1, 2, 3])) == 2
    assert common_prefix_len(np.array([], dtype=np.int64), np.array([1])) == 0


def _kv_of(tokens):
    """Fake one-layer KV whose values are the token ids: 1 head, dim 1, float32 (8 bytes/token)."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, -1, 1)
    return lambda start: [(t[:, start:].clone(), -t[:, start:].clone())]


def test_prefix_cache_shares_segments_and_evicts_leaves():
    cache = PrefixKVCache(max_bytes=8 * 12)
    prompt = [1, 2, 3, 4]
    cache.put(np.array(prompt), _kv_of(prompt))
    cache.put(np.array(prompt + [5, 6]), _kv_of(prompt + [5, 6]))  # completion 1: stores 2 tokens
    cache.put(np.array(prompt + [7]), _kv_of(prompt + [7]))  # completion 2: stores 1 token
    assert len(cache) == 3 and cache.nbytes == 8 * (4 + 2 + 1)
    cache.put(np.array([1, 2]), _kv_of([1, 2]))  # covered by an entry: not stored
    assert len(cache) == 3
    entry, lcp = cache.lookup(np.array(prompt + [5, 9]))
    assert lcp == 5 and entry.tokens.tolist() == prompt + [5, 6]
    keys, values = cache.gather(entry, 5)[0]
    assert keys.flatten().tolist() == [1, 2, 3, 4, 5] and values.flatten().tolist() == [-1, -2, -3, -4, -5]
    # a sibling branch off completion 1 shares 5 tokens: it stores only its own 2
    cache.put(np.array(prompt + [5, 9, 9]), _kv_of(prompt + [5, 9, 9]))
    assert cache.nbytes == 8 * 9
    assert cache.gather(cache.lookup(np.array(prompt + [5, 9, 9]))[0], 7)[0][0].flatten().tolist() == prompt + [5, 9, 9]
    # over budget (12 tokens): only leaves go, least recently used first; the prompt stays
    cache.put(np.array([8, 8, 8, 8]), _kv_of([8, 8, 8, 8]))
    assert cache.nbytes <= 8 * 12
    assert cache.lookup(np.array(prompt + [7]))[1] == 4  # completion 2 (LRU leaf) was evicted
    assert cache.lookup(np.array(prompt + [5, 9, 9]))[1] == 7


def test_stop_strings_rule(engine):
    tok = engine.tokenizer
    stopper = StopStrings(tok, ["lazy"])
    ids = tok.encode("The quick brown fox jumps over the lazy dog")
    first = next(t for t in range(1, len(ids) + 1) if stopper.hit(ids[:t]))
    assert "lazy" in tok.decode(ids[:first]) and "lazy" not in tok.decode(ids[: first - 1])


def test_check_generate_args_names_bad_values():
    with pytest.raises(ValueError, match="n has 1 entries but there are 2"):
        check_generate_args([[1], [2]], [1], vocab_size=10, max_model_len=100)
    with pytest.raises(ValueError, match=r"prefixes\[1\] is empty"):
        check_generate_args([[1], []], 1, vocab_size=10, max_model_len=100)
    with pytest.raises(ValueError, match="token id 12 outside"):
        check_generate_args([[1, 12]], 1, vocab_size=10, max_model_len=100)
    with pytest.raises(ValueError, match="context limit is 3"):
        check_generate_args([[1, 2, 3]], 1, vocab_size=10, max_model_len=3)
    with pytest.raises(ValueError, match=r"n\[0\] must be >= 0"):
        check_generate_args([[1]], [-1], vocab_size=10, max_model_len=100)


# ---------------------------------------------------------------- engine behaviour


def test_make_engine_hf_satisfies_protocol(tiny_model_path):
    engine = make_engine("hf", tiny_model_path, dtype="float32")
    assert isinstance(engine, RolloutEngine) and engine.weights_version == 0
    engine.close()
    with pytest.raises(ValueError, match="unknown engine kind 'tpu'"):
        make_engine("tpu", tiny_model_path)


def test_greedy_batched_equals_unbatched(engine):
    ps = prompts(engine)
    batched = engine.generate(ps, [1, 1, 1], GREEDY)
    # again with every prefix cached by the call above (the cached-KV + padding layout)
    again = engine.generate(ps, [1, 1, 1], GREEDY)
    assert [c[0].token_ids for c in again] == [c[0].token_ids for c in batched]
    assert [c[0].cached_tokens for c in again] == [len(p) - 1 for p in ps]
    for p, got in zip(ps, batched):
        engine.prefix_cache.clear()
        alone = engine.generate([p], [1], GREEDY)[0][0]
        assert got[0].token_ids == alone.token_ids
        assert np.allclose(got[0].logprobs, alone.logprobs, atol=1e-4)


def test_n_samples_per_prefix(engine):
    ps = prompts(engine)
    out = engine.generate(ps, [2, 0, 3], SamplingParams(max_tokens=5, temperature=1.0, seed=0))
    assert [len(c) for c in out] == [2, 0, 3]
    for completion in out[0] + out[2]:
        assert 1 <= len(completion.token_ids) <= 5
        assert len(completion.logprobs) == len(completion.token_ids)
        assert completion.finish_reason in ("stop", "length")
        assert completion.text == engine.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    # a k-way branch encodes its prefix once: prefill = the 2 + 3 distinct-prefix tokens only
    assert engine.last_stats["prefill_tokens"] == len(ps[0]) + len(ps[2])


def test_seeds_reproducible_and_independent_of_batch(engine):
    ps = prompts(engine)
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=123)
    first = engine.generate(ps, [3, 1, 2], sampling)
    engine.prefix_cache.clear()
    second = engine.generate(ps, [3, 1, 2], sampling)
    assert [[c.token_ids for c in cs] for cs in first] == [[c.token_ids for c in cs] for cs in second]
    alone = engine.generate(ps[:1], [3], sampling)  # same (seed, prefix 0, sample j): same draws
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in first[0]]
    other = engine.generate(ps, [3, 1, 2], SamplingParams(max_tokens=8, temperature=1.0, seed=124))
    assert [[c.token_ids for c in cs] for cs in other] != [[c.token_ids for c in cs] for cs in first]
    assert len({c.token_ids for c in first[0]}) > 1  # the n samples of one prefix differ


def test_stop_string_and_stop_token(engine):
    tok = engine.tokenizer
    p = prompts(engine)[0]
    free = engine.generate([p], [1], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=()))[0][0]
    ids = list(free.token_ids)
    stop = tok.decode(ids[4:6], skip_special_tokens=True).strip() or tok.decode(ids[5:6])
    # expected: the first token at which the decoded completion contains the stop string
    want = next(t for t in range(1, len(ids) + 1) if stop in tok.decode(ids[:t], skip_special_tokens=True))
    got = engine.generate([p], [1], SamplingParams(max_tokens=12, temperature=0.0, stop=(stop,)))[0][0]
    assert got.finish_reason == "stop" and list(got.token_ids) == ids[:want]
    assert stop in got.text
    stop_id = ids[3]
    got = engine.generate([p], [1], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop_id,)))[0][0]
    assert got.finish_reason == "stop" and list(got.token_ids) == ids[: ids.index(stop_id) + 1]
    length = engine.generate([p], [1], SamplingParams(max_tokens=3, temperature=0.0))[0][0]
    assert length.finish_reason == "length" and len(length.token_ids) == 3


def test_cached_tokens_on_continuation_match_fresh_encoding(engine, tiny_model_path):
    tok = engine.tokenizer
    p = prompts(engine)[2]
    turn1 = engine.generate([p], [1], GREEDY)[0][0]
    assert turn1.cached_tokens == 0
    turn2_prefix = p + list(turn1.token_ids) + tok.encode(" and the next observation")
    turn2 = engine.generate([turn2_prefix], [3], GREEDY)[0]
    # the completion's KV was cached: only its last token and the observation are encoded
    assert all(c.cached_tokens == len(p) + len(turn1.token_ids) - 1 for c in turn2)
    fresh = make_engine("hf", tiny_model_path, dtype="float32", prefix_cache_bytes=0)
    want = fresh.generate([turn2_prefix], [1], GREEDY)[0][0]
    assert turn2[0].token_ids == want.token_ids and want.cached_tokens == 0
    assert np.allclose(turn2[0].logprobs, want.logprobs, atol=1e-4)
    fresh.close()


def test_logprobs_equal_model_log_softmax_at_temperature_one(engine):
    ps = prompts(engine)
    out = engine.generate(ps, [2, 1, 1], SamplingParams(max_tokens=6, temperature=1.0, seed=7))
    model = engine.model
    for p, completions in zip(ps, out):
        for c in completions:
            seq = torch.tensor([p + list(c.token_ids)])
            with torch.no_grad():
                logp = torch.log_softmax(model(seq).logits[0].float(), dim=-1)
            want = [logp[len(p) - 1 + t, tok].item() for t, tok in enumerate(c.token_ids)]
            assert np.allclose(c.logprobs, want, atol=1e-4)
            assert np.allclose(engine.score([p + list(c.token_ids)], start=len(p))[0], want, atol=1e-4)


def test_top_k_one_is_greedy_with_zero_logprob(engine):
    p = prompts(engine)[0]
    greedy = engine.generate([p], [1], GREEDY)[0][0]
    top1 = engine.generate([p], [2], SamplingParams(max_tokens=12, temperature=0.7, top_k=1, seed=0))[0]
    assert all(c.token_ids == greedy.token_ids for c in top1)
    assert all(lp == 0.0 for c in top1 for lp in c.logprobs)


def test_score_checks_start(engine):
    with pytest.raises(ValueError, match=r"start\[0\] = 0 must be in \[1, 3\]"):
        engine.score([[1, 2, 3]], start=0)
    got = engine.score([[1, 2, 3], [4, 5, 6, 7, 8]], start=[1, 3])
    assert [len(g) for g in got] == [2, 2]


def test_update_weights(tiny_model_path):
    engine = make_engine("hf", tiny_model_path, dtype="float32")
    p = prompts(engine)[0]
    before = engine.generate([p], [1], GREEDY)[0][0]
    assert len(engine.prefix_cache) > 0
    params = {k: v.detach().clone() for k, v in engine.model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in params.items()}
    engine.update_weights(new.items(), version=3)
    assert engine.weights_version == 3 and len(engine.prefix_cache) == 0
    assert engine.generate([p], [1], GREEDY)[0][0].token_ids != before.token_ids
    engine.update_weights(params.items(), version=4)
    assert engine.generate([p], [1], GREEDY)[0][0].token_ids == before.token_ids
    with pytest.raises(KeyError, match="'model.nope.weight' is not a parameter"):
        engine.update_weights([("model.nope.weight", torch.zeros(1))], version=5)
    name = "model.norm.weight"
    with pytest.raises(ValueError, match=f"'{name}' has shape \\(3,\\)"):
        engine.update_weights([(name, torch.zeros(3))], version=5)
    engine.close()


def test_auto_falls_back_to_hf_when_vllm_is_missing(monkeypatch, tiny_model_path, caplog):
    import importlib.util

    import trace_gym.engines as engines

    # a device whose measured choice is vllm (CUDA's entry; on CPU auto is hf without asking)
    monkeypatch.setitem(engines.AUTO_BY_DEVICE, "cpu", "vllm")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    with caplog.at_level("WARNING"):
        engine = make_engine("auto", tiny_model_path, dtype="float32")
    assert type(engine).__name__ == "HFEngine"
    assert "vllm is not installed" in caplog.text
    engine.close()


def test_chunked_prefill_matches_one_pass(engine, tiny_model_path):
    ps = prompts(engine)
    want = engine.generate(ps, [1, 1, 1], GREEDY)
    chunked = make_engine("hf", tiny_model_path, dtype="float32", prefill_chunk=3, prefix_cache_bytes=0)
    got = chunked.generate(ps, [1, 1, 1], GREEDY)
    assert chunked.last_stats["forward_passes"] > engine.last_stats["forward_passes"]
    for w, g in zip(want, got):
        assert w[0].token_ids == g[0].token_ids
        assert np.allclose(w[0].logprobs, g[0].logprobs, atol=1e-4)
    chunked.close()


def _brute_inverse_cdf(probs, u):
    cdf = torch.cumsum(probs.double(), -1)
    return torch.tensor([int(torch.nonzero(cdf[r] > u[r].double() * cdf[r, -1])[0]) for r in range(len(u))])


def test_inverse_cdf_matches_brute_force_and_never_draws_a_zero():
    from trace_gym.engines.sampling import inverse_cdf

    g = torch.Generator().manual_seed(0)
    for vocab, block in [(1000, 256), (49152, 256), (7, 4), (5, 256)]:
        probs = torch.rand(64, vocab, generator=g) ** 4
        probs[probs < 0.3] = 0.0  # masked tokens (top-k / top-p) inside blocks
        probs[:8, vocab // 2:] = 0.0  # whole masked tail: the last blocks empty
        probs[:, 0] += 1e-3  # every row keeps some mass
        u = torch.rand(64, generator=g)
        u[:4] = torch.tensor([0.0, 1 - 2**-24, 0.5, 1 - 2**-24])  # the ends of [0, 1)
        got = inverse_cdf(probs, u, block=block)
        assert torch.equal(got, _brute_inverse_cdf(probs, u)), (vocab, block)
        assert bool((probs.gather(1, got[:, None]) > 0).all())


def test_inverse_cdf_frequencies_follow_the_probabilities():
    from trace_gym.engines.sampling import inverse_cdf

    probs = torch.tensor([[0.1, 0.0, 0.2, 0.3, 0.0, 0.4]]).expand(20000, 6)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(inverse_cdf(probs, u, block=4), minlength=6).double() / 20000
    assert counts[1] == 0 and counts[4] == 0
    # 4 standard errors of a binomial share at n = 20000 is at most 0.0142
    assert torch.allclose(counts, probs[0].double(), atol=0.0142)
