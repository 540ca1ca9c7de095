"""Harness costs on the CPU default (SmolLM2-135M, math_python digit sums), in one run.

1. Generated tokens/s through the agent harness vs the raw engine on the same
   prompts, seeds and token limits (baseline: ``engine.generate`` called directly).
   The harness adds chat-template deltas, bookkeeping and env steps; its own overhead
   is the harness wall time minus its generation and env phases, per second of
   generation (goal <= 5 %).
2. A k-way continuation from a cached prefix vs re-encoding the prefix (baseline: the
   same call after the engine's prefix cache was cleared).
3. Predictor scoring + update time as a share of rollout time in one TRACE step
   (``collect`` with the embedding predictor).

Usage: ``python benchmarks/bench_harness.py [--engine auto|hf|vllm] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


def _clear_cache(engine) -> None:
    engine.reset_prefix_cache()


def bench_overhead(engine, make_env, tasks, samples: int, max_tokens: int, repeats: int) -> dict:
    from trace_gym.agent.loop import AgentConfig, AgentRunner
    from trace_gym.types import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)
    raw, harness, harness_own, bookkeeping = [], [], [], []
    for rep in range(repeats):
        runner = AgentRunner(engine, engine.tokenizer, make_env, sampling,
                             AgentConfig(max_turn_tokens=max_tokens, max_episode_tokens=4096, max_turns=1))
        episodes = [runner.start(t, seed=rep * 100 + j) for t in tasks for j in range(samples)]
        prefixes = [list(e.context) for e in episodes]
        _clear_cache(engine)
        t0 = time.perf_counter()
        # the runner's first generate call uses seed + 7919 (see AgentRunner._generate): same draws
        outs = engine.generate(prefixes, [1] * len(prefixes), replace(runner.sampling, seed=runner.sampling.seed + 7919))
        raw_s = time.perf_counter() - t0
        raw_tokens = sum(len(c.token_ids) for o in outs for c in o)
        _clear_cache(engine)
        t0 = time.perf_counter()
        runner.run(episodes)
        wall = time.perf_counter() - t0
        tokens = runner.ledger.generated_tokens
        env_s = runner.ledger.seconds.get("environment", 0.0)
        gen_s = runner.ledger.seconds.get("generation", 0.0)
        bookkeeping.append((wall - env_s - gen_s) / gen_s)  # the loop's own work per generation second
        raw.append(raw_tokens / raw_s)
        harness.append(tokens / wall)
        harness_own.append(tokens / (wall - env_s))
        runner.close()
    r, h, ho = statistics.median(raw), statistics.median(harness), statistics.median(harness_own)
    return {"raw_tok_s": r, "harness_tok_s": h, "harness_tok_s_without_env": ho,
            "overhead_total": r / h - 1.0, "overhead_harness_only": r / ho - 1.0,
            "bookkeeping": statistics.median(bookkeeping)}


def bench_continuation(engine, prefix: list[int], k: int, max_tokens: int, repeats: int) -> dict:
    from trace_gym.types import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1)
    cached, cold, hits = [], [], []
    for _ in range(repeats):
        _clear_cache(engine)
        t0 = time.perf_counter()
        engine.generate([prefix], [k], params)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()  # the prefix is now cached (it was just encoded)
        out = engine.generate([prefix], [k], params)
        cached.append(time.perf_counter() - t0)
        hits.append(min(c.cached_tokens or 0 for c in out[0]))
    c, r = statistics.median(cached), statistics.median(cold)
    return {"prefix_tokens": len(prefix), "k": k, "cached_ms": 1e3 * c, "reencode_ms": 1e3 * r,
            "speedup": r / c, "cached_tokens_reported": int(statistics.median(hits))}


def bench_predictor(engine, make_env, tasks, budget: float) -> dict:
    from trace_gym.agent.loop import AgentConfig, AgentRunner
    from trace_gym.predictor.kinds import EmbeddingPredictor
    from trace_gym.agent.rollout import collect
    from trace_gym.strategies import shaped_strategies
    from trace_gym.types import SamplingParams

    predictor = EmbeddingPredictor()
    runner = AgentRunner(engine, engine.tokenizer, make_env, SamplingParams(temperature=1.0, seed=2),
                         AgentConfig(max_turn_tokens=96, max_episode_tokens=2048, max_turns=3))
    strategy = shaped_strategies(["trace"], group_size=4, continuations_per_root=2)["trace"]
    batch = collect(tasks, strategy, predictor, runner, budget, np.random.default_rng(0))  # predictor update included
    runner.close()
    sec = batch.ledger.seconds
    rollout = sec.get("generation", 0.0) + sec.get("environment", 0.0)
    pred = sec.get("predictor_scoring", 0.0) + sec.get("predictor_update", 0.0)
    return {"rollout_s": rollout, "scoring_s": sec.get("predictor_scoring", 0.0),
            "update_s": sec.get("predictor_update", 0.0), "share": pred / (rollout + pred),
            "rollouts": batch.ledger.rollouts, "continuations": batch.ledger.continuations}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args(argv)


    import trace_gym  # noqa: F401
    from environments.math_python.generated import generate_digit_sums
    from trace_gym.engines import make_engine
    from trace_gym.registry import env_family

    make_env = env_family("math_python").make_env
    t0 = time.perf_counter()
    engine = make_engine(args.engine, "smollm2-135m")
    print(f"engine: {type(engine).__name__} (loaded in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    tasks = generate_digit_sums(args.prompts, seed=0)
    overhead = bench_overhead(engine, make_env, tasks, args.samples, args.max_tokens, args.repeats)
    env = make_env()
    obs, _ = env.unwrapped.reset(seed=0, options={"task": tasks[0]})
    env.close()
    from trace_gym.agent.chat import ChatRenderer

    prompt = ChatRenderer(engine.tokenizer).prompt(obs)
    filler = engine.tokenizer.encode(" The quick brown fox jumps over the lazy dog." * 90)
    prefix = prompt + filler[: max(0, 1024 - len(prompt))]
    cont = bench_continuation(engine, prefix, k=4, max_tokens=32, repeats=args.repeats)
    pred = bench_predictor(engine, make_env, generate_digit_sums(8, seed=1), budget=8)

    print(f"## Harness costs: {type(engine).__name__}, SmolLM2-135M, math_python digit sums\n")
    print("| measure | harness / cached | baseline | ratio |")
    print("|---|---|---|---|")
    print(f"| generated tok/s, {args.prompts}x{args.samples} episodes, {args.max_tokens} tokens | "
          f"{overhead['harness_tok_s_without_env']:.1f} (without env time; {overhead['harness_tok_s']:.1f} with) | "
          f"{overhead['raw_tok_s']:.1f} raw engine | overhead {100 * overhead['overhead_harness_only']:+.1f} % "
          f"({100 * overhead['overhead_total']:+.1f} % with env) |")
    print(f"| {cont['k']}-way continuation of a {cont['prefix_tokens']}-token prefix, 32 tokens | "
          f"{cont['cached_ms']:.0f} ms (cached prefix, {cont['cached_tokens_reported']} tokens reported cached) | "
          f"{cont['reencode_ms']:.0f} ms re-encoding | {cont['speedup']:.2f}x faster |")
    print(f"| predictor scoring + update in one TRACE step ({pred['rollouts']} roots + "
          f"{pred['continuations']} continuations) | {pred['scoring_s'] + pred['update_s']:.2f} s "
          f"(scoring {pred['scoring_s']:.2f}, update {pred['update_s']:.2f}) | {pred['rollout_s']:.1f} s rollout | "
          f"{100 * pred['share']:.1f} % of step |")
    print(f"| harness bookkeeping (rendering, records, scheduling) per second of generation | "
          f"{100 * overhead['bookkeeping']:.2f} % | - | - |")
    status = "PASS" if overhead["bookkeeping"] <= 0.05 else "FAIL"
    print(f"\n{status}: harness overhead {100 * overhead['bookkeeping']:.2f} % of generation time (goal <= 5 %), "
          f"measured inside the harness run. The raw-vs-harness tok/s line compares two separately timed runs "
          f"whose samples can differ in length, so on this shared 2-core machine it moves by +-20 % between runs.")
    if args.json:
        Path(args.json).write_text(json.dumps({"engine": type(engine).__name__, "overhead": overhead,
                                               "continuation": cont, "predictor": pred}, indent=2))
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
