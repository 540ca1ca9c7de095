"""Rollout engines on this machine: throughput and the cost of a k-way continuation.

Two measurements per engine, printed as one markdown table: ``hf`` (the HF engine with
its grouped-query attention kernel, :mod:`trace_gym.engines.gqa_attention`), ``hf-sdpa``
(the same engine on transformers' own ``sdpa`` attention: the baseline the kernel is
checked against, side by side) and ``vllm``:

1. **Throughput**: ``P`` chat prompts x ``S`` samples x ``T`` new tokens (EOS ignored so
   every engine generates the same number of tokens), temperature 1, after one warm-up
   call. Reported as generated tokens per second of ``generate``.
2. **k-way continuation**: a long context (a prompt plus a generated history, ~``L``
   tokens) is continued ``k`` ways with ``C`` new tokens each, (a) right after the context
   was generated once (its KV is in the engine's prefix cache, one request with n = k)
   and (b) without prefix caching: k single requests, each after emptying the cache, so
   every continuation re-encodes the whole context (the run fails if this baseline
   reports any cached prefix token). Reported: seconds of each, the prefix tokens
   served from cache, and the saving.

Checks (PASS/FAIL, exit 1 on FAIL):

- ``hf`` generates at least 1.1x ``hf-sdpa``'s tok/s in both measurements (``--plant
  no-fold`` routes the kernel back to ``sdpa`` to show it fails);
- with ``--dtypes float32,bfloat16`` (each engine runs once per dtype): ``dtype="auto"``
  (:func:`trace_gym.engines.dtypes.auto_dtype`) names, per engine, the dtype whose
  throughput was higher here (``--plant inverted-dtype`` makes ``auto`` name the other one).

Usage::

    python benchmarks/bench_engines.py                      # hf-sdpa, hf, vllm; defaults below
    python benchmarks/bench_engines.py --engines hf,hf-sdpa --json runs/bench_engines.json
    python benchmarks/bench_engines.py --engines hf,vllm --dtypes float32,bfloat16   # the auto dtype's check

Numbers depend on machine load: on the shared 2-core box run it when nothing else runs,
and keep ``--threads 1`` (OpenMP threads spin-wait on each other under contention).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_gym.types import SamplingParams  # noqa: E402

TOPICS = ["the sea", "a lighthouse", "prime numbers", "a lost key", "the moon", "bread", "a violin", "winter"]


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."}],
            add_generation_prompt=True, return_dict=False,
        )
        for i in range(count)
    ]


def reset_cache(engine) -> None:
    engine.reset_prefix_cache()


def bench_engine(kind: str, model_path: Path, args: argparse.Namespace, dtype: str = "auto") -> dict:
    from trace_gym.engines import make_engine

    t0 = time.perf_counter()
    extra = {"cpu_threads": args.threads} if kind == "vllm" else {}
    if kind.startswith("hf"):
        extra = {"attention": "sdpa" if kind == "hf-sdpa" else "gqa", "num_threads": args.threads}
    engine = make_engine(kind.split("-")[0], model_path, ignore_eos=True, dtype=dtype, **extra)
    load_s = time.perf_counter() - t0
    tok = engine.tokenizer
    prompts = chat_prompts(tok, args.prompts)

    # 1. throughput
    engine.generate(prompts[:2], [2, 2], SamplingParams(max_tokens=8, temperature=1.0, seed=0))  # warm-up
    reset_cache(engine)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1)
    t0 = time.perf_counter()
    out = engine.generate(prompts, [args.samples] * len(prompts), sampling)
    gen_s = time.perf_counter() - t0
    generated = sum(len(c.token_ids) for cs in out for c in cs)

    # 2. k-way continuation from a long context
    history = engine.generate([prompts[0]], [1], SamplingParams(max_tokens=args.context, temperature=0.0))[0][0]
    context = prompts[0] + list(history.token_ids) + tok.encode(
        "<|im_end|>\n<|im_start|>user\nNow continue the story.<|im_end|>\n<|im_start|>assistant\n")
    branch = SamplingParams(max_tokens=args.continuation_tokens, temperature=1.0, seed=2)
    engine.generate([context], [1], SamplingParams(max_tokens=1, temperature=0.0))  # context KV into the cache
    t0 = time.perf_counter()
    warm = engine.generate([context], [args.k], branch)[0]
    warm_s = time.perf_counter() - t0
    # the baseline without prefix caching: every continuation re-encodes the whole
    # context from an empty cache (one request each; n = k would share the prefill)
    cold_s, cold = 0.0, []
    for j in range(args.k):
        reset_cache(engine)
        t0 = time.perf_counter()
        cold += engine.generate([context], [1], dataclasses.replace(branch, seed=branch.seed + j))[0]
        cold_s += time.perf_counter() - t0
    engine.close()
    cached_cold = [c.cached_tokens or 0 for c in cold]
    if any(cached_cold):
        raise RuntimeError(f"{kind}: the re-encode baseline reused {cached_cold} cached prefix tokens after "
                           "reset_prefix_cache(); it would not be a cold re-encode")
    return {
        "engine": kind, "dtype": dtype, "load_s": load_s,
        "throughput": {"prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens,
                       "generated_tokens": generated, "seconds": gen_s, "tokens_per_s": generated / gen_s},
        "continuation": {"context_tokens": len(context), "k": args.k, "new_tokens": args.continuation_tokens,
                         "cached_s": warm_s, "cached_tokens": warm[0].cached_tokens,
                         "reencode_s": cold_s, "reencode_cached_tokens": sum(cached_cold),
                         "saving": 1 - warm_s / cold_s},
    }


def markdown(results: list[dict]) -> str:
    lines = [
        "| engine | dtype | load s | tok/s (PxSxT) | k-way cont. cached s | cont. tok/s | cached prefix tok | re-encode s "
        "| saving |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        th, co = r["throughput"], r["continuation"]
        lines.append(
            f"| {r['engine']} | {r['dtype']} | {r['load_s']:.1f} | {th['tokens_per_s']:.0f} "
            f"({th['prompts']}x{th['samples']}x{th['max_tokens']}) | {co['cached_s']:.2f} | "
            f"{co['k'] * co['new_tokens'] / co['cached_s']:.0f} | "
            f"{co['cached_tokens']}/{co['context_tokens']} | {co['reencode_s']:.2f} | {co['saving']:.0%} |"
        )
    return "\n".join(lines)


def auto_dtype_check(results: list[dict], inverted: bool = False) -> list[tuple[str, str]]:
    """Per engine measured in both float32 and bfloat16: PASS when ``auto_dtype("cpu")``
    (``inverted``: the other dtype, the planted bug) is the one with the higher throughput."""
    from trace_gym.engines.dtypes import auto_dtype

    picked = auto_dtype("cpu")
    if inverted:
        picked = "float32" if picked == "bfloat16" else "bfloat16"
    verdicts = []
    for kind in dict.fromkeys(r["engine"] for r in results):
        rate = {r["dtype"]: r["throughput"]["tokens_per_s"] for r in results if r["engine"] == kind}
        if {"float32", "bfloat16"} <= rate.keys():
            faster = max(("float32", "bfloat16"), key=rate.get)
            verdicts.append(("PASS" if picked == faster else "FAIL",
                             f"{kind}: dtype auto is {picked} on this CPU; measured float32 {rate['float32']:.0f} vs "
                             f"bfloat16 {rate['bfloat16']:.0f} tok/s ({faster} faster)"))
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="model name or folder")
    parser.add_argument("--engines", default="hf-sdpa,hf,vllm",
                        help="comma-separated: hf, hf-sdpa (transformers' sdpa attention), vllm")
    parser.add_argument("--prompts", type=int, default=8, help="P: prompts in the throughput run")
    parser.add_argument("--samples", type=int, default=4, help="S: samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=128, help="T: new tokens per sample")
    parser.add_argument("--context", type=int, default=448, help="L: generated history before branching (tokens)")
    parser.add_argument("--k", type=int, default=4, help="k: continuations per branch point")
    parser.add_argument("--continuation-tokens", type=int, default=16, help="C: new tokens per continuation")
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads (process-wide)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--dtypes", default="auto",
                        help="comma-separated dtypes each engine runs in (auto, float32, bfloat16)")
    parser.add_argument("--plant", choices=["no-fold", "inverted-dtype"], default=None,
                        help="break the checked kernel on purpose: the check must FAIL")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.engines.split(",") if k.strip()]
    unknown = sorted(set(kinds) - {"hf", "hf-sdpa", "vllm"})
    if unknown:
        parser.error(f"--engines: unknown kind(s) {unknown}; choose from hf, hf-sdpa, vllm")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = sorted(set(dtypes) - {"auto", "float32", "bfloat16"})
    if bad or not dtypes:
        parser.error(f"--dtypes: unknown dtype(s) {bad or dtypes}; choose from auto, float32, bfloat16")
    if args.plant == "no-fold":  # the kernel never registered: the hf arm loads transformers' sdpa
        import trace_gym.engines.gqa_attention as gqa

        gqa.register = lambda: "sdpa"

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs to stdout; keep the table clean
    import torch

    torch.set_num_threads(args.threads)
    from trace_gym.models import resolve_model

    model_path = resolve_model(args.model)
    results = []
    for kind in kinds:
        for dtype in dtypes:
            results.append(bench_engine(kind, model_path, args, dtype))
            print(f"done: {kind} ({dtype})", file=sys.stderr, flush=True)
    print(markdown(results))
    failed = False
    by = {r["engine"]: r for r in results if r["dtype"] == dtypes[0]}
    auto = auto_dtype_check(results, args.plant == "inverted-dtype")
    for verdict, line in auto:
        print(f"\n{verdict}: {line}")
        failed = failed or verdict == "FAIL"
    if "hf" in by and "hf-sdpa" in by:
        ours, base = by["hf"], by["hf-sdpa"]
        th = ours["throughput"]["tokens_per_s"] / base["throughput"]["tokens_per_s"]
        co = base["continuation"]["cached_s"] / ours["continuation"]["cached_s"]
        failed = failed or min(th, co) < 1.1
        print(f"\n{'FAIL' if failed else 'PASS'}: hf's attention kernel vs transformers' sdpa: throughput {th:.2f}x, "
              f"k-way continuation {co:.2f}x (goal >= 1.10x both)")
    if args.json:
        meta = {"model": str(model_path), "threads": args.threads, "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
