"""Which other ecosystems' task families teach SmolLM2-135M something: measured outcomes.

For each candidate env id (reasoning-gym datasets at chosen difficulties, GEM games) this
runs what a user runs, ``trace-gym eval --suite <id>`` with sampled answers, and prints
from its JSON and transcripts: success rate with its interval, the share of *mixed*
tasks (some samples succeed, some fail: the only tasks a group-relative update or a
tree strategy learns from), and the turns an episode visits. The table in
``docs/ecosystem.md`` ("Measured") comes from this script::

    python benchmarks/ecosystem_task_families.py --tasks 16 --samples 4

Baseline it names: the shipped ``math_python`` default family, measured the same way in
the same run (its first row).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

#: (env id, env kwargs) measured; the first is the baseline
CANDIDATES: list[tuple[str, dict]] = [
    ("math_python", {}),
    ("reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1", {"few_shot": True}),
    ("reasoning_gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1", {"few_shot": True}),
    ("reasoning_gym:letter_counting?min_words=3&max_words=5", {"few_shot": True}),
    ("reasoning_gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1", {"few_shot": True,
                                                                                    "max_attempts": 3}),
    ("gem:game:GuessTheNumber-v0-easy", {}),
    ("gem:game:GuessTheNumber-v0-easy", {"few_shot": True}),
    ("gem:game:Mastermind-v0-easy", {}),
    ("gem:game:Mastermind-v0-easy", {"few_shot": True}),
]


def measure(env_id: str, env_kwargs: dict, args: argparse.Namespace, out: Path) -> dict:
    """One ``trace-gym eval`` of ``env_id``; returns its table row."""
    folder = out / str(abs(hash((env_id, json.dumps(env_kwargs, sort_keys=True)))))
    cmd = [sys.executable, "-m", "trace_gym.cli", "eval", "--policy", args.policy, "--suite", env_id,
           f"limit={args.tasks}", f"samples={args.samples}", "temperature=1.0", f"engine={args.engine}",
           f"max_turns={args.max_turns}", f"max_turn_tokens={args.max_turn_tokens}", "max_episode_tokens=3072",
           "heldout_fraction=0", f"env_kwargs={json.dumps(env_kwargs)}", f"out={folder}",
           "--dump-episodes", str(args.tasks * args.samples)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    (result,) = json.loads((folder / "results.json").read_text())
    per_task = result["per_task"].values()
    mixed = sum(0 < sum(r >= 0.5 for r in rewards) < len(rewards) for rewards in per_task)
    turns = [len(json.loads(line)["turns"]) for line in Path(result["episode_file"]).read_text().splitlines()]
    low, high = result["accuracy_ci"]
    return {"env": env_id, "kwargs": env_kwargs, "tasks": result["tasks"], "samples": result["samples"],
            "success": result["accuracy"], "ci": (low, high), "mixed": mixed, "mean_reward": result["mean_reward"],
            "turns": sum(turns) / max(len(turns), 1), "multi_turn": sum(t > 1 for t in turns) / max(len(turns), 1),
            "seconds": seconds}


def table(rows: list[dict]) -> str:
    lines = ["| env id | env kwargs | tasks x samples | success % [95 % CI] | mixed tasks | mean reward | "
             "mean turns | episodes > 1 turn | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["ci"]
        lines.append(f"| `{r['env']}` | `{json.dumps(r['kwargs'])}` | {r['tasks']} x {r['samples']} | "
                     f"{100 * r['success']:.1f} [{100 * low:.1f}, {100 * high:.1f}] | {r['mixed']} / {r['tasks']} | "
                     f"{r['mean_reward']:.3f} | {r['turns']:.2f} | {100 * r['multi_turn']:.0f} % | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-turn-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/ecosystem_families")
    parser.add_argument("--only", default="", help="comma-separated substrings of env ids to measure")
    args = parser.parse_args()
    out = Path(args.out)
    chosen = [c for c in CANDIDATES if not args.only or any(s in c[0] for s in args.only.split(","))]
    rows = []
    for env_id, env_kwargs in chosen:
        rows.append(measure(env_id, env_kwargs, args, out))
        print(f"measured {env_id} {env_kwargs}: success {rows[-1]['success']:.3f}, mixed {rows[-1]['mixed']}",
              file=sys.stderr)
    print(f"## SmolLM2-135M ({args.policy}) on other ecosystems' task families: T = 1.0, {args.samples} samples "
          f"per task, max {args.max_turns} turns x {args.max_turn_tokens} tokens; baseline: the first row\n")
    print(table(rows))
    (out / "families.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
