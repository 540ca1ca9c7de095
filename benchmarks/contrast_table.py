"""Where does a small policy find contrast? SmolLM2-135M's success rate over an env
family's difficulty knobs (issue 45), as the knob tables of ``docs/environments/*.md``.

Each setting is one ``trace-gym bank record`` run with R = 8 roots and no continuations
(``continuations=0``): a small bank whose prompts are uniform groups of 8. The table
reads those banks back: per setting the prompts, the episodes' success rate (reward >=
0.5, :data:`trace_gym.tree.SUCCESS_THRESHOLD`) with its Wilson interval over episodes,
the share of prompts whose group of 8 is mixed (some succeed, some fail) with its Wilson
interval over prompts, the mean reward and its spread (standard deviation over episodes,
and the share of episodes paid a partial reward, strictly between 0 and 1), and the
recording's seconds per prompt::

    python benchmarks/contrast_table.py wiki_qa                  # record what is missing, print the table
    python benchmarks/contrast_table.py bfcl --only single_call_f1,single_call_f1_examples
    python benchmarks/contrast_table.py wiki_qa --table-only     # read the banks there, record nothing
    python benchmarks/contrast_table.py wiki_qa --table-only --also bank=trace_gym/banks/data/wiki_qa_smollm2.jsonl.gz

Banks go to ``--out`` (default ``runs/contrast/<family>/<setting>.jsonl.gz``); a killed
run resumes (``bank record`` resumes a bank; a complete one is skipped). Stop a run as a
process group (``kill -- -PGID``): the ``bank record`` it started keeps writing otherwise,
and a rerun beside it would be a second writer of the same file (the reader then refuses
the file: a prompt recorded twice). Recording runs on ``TRACE_GYM_THREADS`` threads
(default 1 here: the box is shared). A stopped recording is tabulated from the prompts it
wrote, its seconds from its run lines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Agent limits of every QA setting unless the setting says otherwise: a turn ends at the
#: first closing tag (the env's stop strings), so 64 tokens hold a query or a short answer.
QA_AGENT = {"max_turns": 3, "max_turn_tokens": 64, "max_episode_tokens": 1536, "temperature": 1.0}
#: The F1 reward (half F1 below a whole match), so the table shows the reward spread; its
#: success (reward >= 0.5) is EM up to word order.
QA_ENV = {"reward": "f1"}
#: The bank's temperature (the lowest measured; 1.0 gives no success at all).
QA_T03 = {**QA_AGENT, "temperature": 0.3}
#: BFCL: a call turn, then a turn without calls ends the user turn (one retry left).
BFCL_AGENT = {"max_turns": 3, "max_turn_tokens": 96, "max_episode_tokens": 2048, "temperature": 0.7}
#: Every function of the involved classes: prompts of 4-9k tokens (SmolLM2's context is 8,192).
BFCL_LONG = {**BFCL_AGENT, "max_episode_tokens": 8192}
SINGLE_CALL = {"tier": "single_call", "functions": 1}
FEW_SHOT = {"few_shot": True}
EXAMPLES = {"call_examples": True}

#: family -> setting name -> (prompts, env kwargs, task-loader kwargs, agent limits), in the
#: order they run. The family's own defaults (registry.ENV_FAMILIES) apply under these.
SETTINGS: dict[str, dict[str, tuple[int, dict, dict, dict]]] = {
    "wiki_qa": {
        "family_default": (16, QA_ENV, {}, QA_AGENT),
        "single_hop": (16, QA_ENV, {"single_hop_share": 1.0}, QA_AGENT),
        "single_hop_t07": (16, QA_ENV, {"single_hop_share": 1.0}, {**QA_AGENT, "temperature": 0.7}),
        "single_hop_t03": (16, QA_ENV, {"single_hop_share": 1.0}, QA_T03),
        # one knob at a time around the bank setting (single-hop, few-shot, T = 0.3, 3 turns, scale 1)
        "single_hop_t03_no_few_shot": (16, {**QA_ENV, "few_shot": False}, {"single_hop_share": 1.0}, QA_T03),
        "single_hop_t03_scale01": (16, {**QA_ENV, "offline_scale": 0.1}, {"single_hop_share": 1.0, "scale": 0.1},
                                   QA_T03),
        "single_hop_t03_2turns": (16, QA_ENV, {"single_hop_share": 1.0}, {**QA_T03, "max_turns": 2}),
        "half_single_hop_t03": (16, QA_ENV, {"single_hop_share": 0.5}, QA_T03),
        "two_hop_t03": (16, QA_ENV, {"single_hop_share": 0.0}, {**QA_T03, "max_turns": 4}),
        # the candidate bank setting, on 48 prompts: an interval on the mixed share that can clear 10 %
        "single_hop_t03_48": (48, QA_ENV, {"single_hop_share": 1.0}, QA_T03),
    },
    "bfcl": {
        "single_call_f1": (16, {}, SINGLE_CALL, BFCL_AGENT),
        "single_call_f1_few_shot": (16, FEW_SHOT, SINGLE_CALL, BFCL_AGENT),
        "single_call_f1_few_shot_t10": (16, FEW_SHOT, SINGLE_CALL, {**BFCL_AGENT, "temperature": 1.0}),
        "single_call_f1_examples": (16, EXAMPLES, SINGLE_CALL, BFCL_AGENT),
        "single_call_f1_examples_t03": (16, EXAMPLES, SINGLE_CALL, {**BFCL_AGENT, "temperature": 0.3}),
        "single_call_f4_examples": (16, EXAMPLES, {**SINGLE_CALL, "functions": 4}, BFCL_AGENT),
        "single_call_f0_examples": (10, EXAMPLES, {**SINGLE_CALL, "functions": 0}, BFCL_LONG),
        # whole entries: 2-7 user turns, each a call step and a reply, so up to 14 agent turns
        "family_default": (8, {}, {}, {**BFCL_LONG, "max_turns": 8}),
    },
}
#: R: every setting's uniform group size.
ROOTS = 8


def record(family: str, name: str, out: Path, setting: tuple[int, dict, dict, dict]) -> None:
    """Record (or resume) one setting's bank with ``trace-gym bank record``."""
    prompts, env_kwargs, task_kwargs, agent = setting
    args = [sys.executable, "-m", "trace_gym.cli", "bank", "record", "--env", family, "--out", str(out),
            "--prompts", str(prompts), "--roots", str(ROOTS), "--continuations", "0", "--batch-prompts", "4",
            "--progress", "false", "--env-kwargs", json.dumps(env_kwargs), "--task-kwargs", json.dumps(task_kwargs),
            *[f"{key}={value}" for key, value in agent.items()]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACE_GYM_THREADS": os.environ.get("TRACE_GYM_THREADS", "1")}
    print(f"[{time.strftime('%H:%M:%S')}] {family}/{name}: {' '.join(args[2:])}", flush=True)
    subprocess.run(args, check=True, env=env, cwd=ROOT)


def row(path: Path, group: int = ROOTS, family: str = "") -> dict[str, Any]:
    """One table row from a setting's bank (see the module docstring); for ``bfcl`` also
    what the first actions were (:func:`first_calls`)."""
    import numpy as np

    from trace_gym.banks import iter_prompts
    from trace_gym.banks.format import read_footer
    from trace_gym.banks.stats import mixed_without_replacement
    from trace_gym.report import wilson_bounds

    footer = read_footer(path)
    rewards, mixed, prompts, errors = [], [], 0, 0
    calls: dict[str, int] = {}
    for record in iter_prompts(path, verify=footer is not None):  # a stopped recording: the prompts it wrote
        prompts += 1
        leaves = [r for r in record.roots if r["turns"]]
        errors += len(record.roots) - len(leaves)
        if family == "bfcl":
            for kind in first_calls(record.data["task"], leaves):
                calls[kind] = calls.get(kind, 0) + 1
        rewards += [float(r["reward"]) for r in leaves]
        wins = sum(bool(r["success"]) for r in leaves)
        mixed.append(mixed_without_replacement(wins, len(leaves), group) if len(leaves) >= group else 0.0)
    r = np.asarray(rewards)
    successes = int((r >= 0.5).sum())
    footer = footer or {}
    share = float(np.mean(mixed)) if mixed else math.nan
    return {"prompts": prompts, "episodes": len(r), "errors": errors, "successes": successes,
            "success_rate": successes / len(r) if len(r) else math.nan,
            "success_ci": wilson_bounds(successes / len(r), len(r)) if len(r) else (math.nan, math.nan),
            "mixed_share": share, "mixed_ci": wilson_bounds(share, prompts) if prompts else (math.nan, math.nan),
            "mean_reward": float(r.mean()) if len(r) else math.nan, "reward_std": float(r.std()) if len(r) else math.nan,
            "partial_share": float(((r > 0) & (r < 1)).mean()) if len(r) else math.nan,
            "seconds_per_prompt": footer.get("seconds", recorded_seconds(path)) / max(prompts, 1),
            "complete": bool(footer), "first_calls": calls}


#: What a BFCL episode's first action was: no call BFCL can decode, a call of a function the
#: ground truth calls, or calls of other functions only.
FIRST_CALLS = ("no call", "right function", "other function")


def first_calls(task: Mapping[str, Any], leaves: list[Mapping[str, Any]]) -> list[str]:
    """One of :data:`FIRST_CALLS` per episode, decoded as the env decodes actions."""
    from environments.bfcl.parsing import decode, parse_ground_truth_call

    gold = {parse_ground_truth_call(call)[0] for turn in task["answer"] for call in turn}
    kinds = []
    for leaf in leaves:
        names = {call.name for call in decode(leaf["turns"][0]["action"]).calls}
        kinds.append("no call" if not names else "right function" if names & gold else "other function")
    return kinds


def recorded_seconds(path: Path) -> float:
    """Seconds a bank without a footer (a stopped recording) spent on the prompts it wrote:
    per run, from the run's start to its last prompt written."""
    import gzip

    starts, last = {}, {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            if obj.get("kind") == "run":
                starts[obj["run"]] = obj["started_at"]
            elif obj.get("kind") == "prompt":
                last[obj["run"]] = max(last.get(obj["run"], 0.0), obj["written_at"])
    return sum(last[r] - starts[r] for r in last if r in starts)


def markdown(rows: Mapping[str, dict[str, Any]]) -> str:
    """The knob table (percentages; intervals are 95 % Wilson)."""
    lines = ["| setting | prompts x roots | success rate [95 % CI] | mixed share, G = 8 [95 % CI] | mean reward "
             "(std; partial share) | s/prompt |", "|---|---:|---|---|---|---:|"]
    empty = [name for name, x in rows.items() if not x["prompts"]]
    rows = {name: x for name, x in rows.items() if x["prompts"]}
    for name, x in rows.items():
        lo, hi = x["success_ci"]
        mlo, mhi = x["mixed_ci"]
        notes = ([] if x["complete"] else ["stopped"]) + ([f"{x['errors']} without a turn"] if x["errors"] else [])
        shape = f"{x['prompts']} x {ROOTS}" + (" (" + "; ".join(notes) + ")" if notes else "")
        lines.append(f"| `{name}` | {shape} | {100 * x['success_rate']:.1f} % [{100 * lo:.1f}, "
                     f"{100 * hi:.1f}] | {100 * x['mixed_share']:.1f} % [{100 * mlo:.1f}, {100 * mhi:.1f}] | "
                     f"{x['mean_reward']:.3f} ({x['reward_std']:.3f}; {100 * x['partial_share']:.0f} %) | "
                     f"{x['seconds_per_prompt']:.0f} |")
    if empty:
        lines += ["", "Started, no prompt written (not tabulated): " + ", ".join(f"`{n}`" for n in empty) + "."]
    if any(x.get("first_calls") for x in rows.values()):
        lines += ["", "First actions (share of episodes; decoded as the env decodes them):", "",
                  "| setting | " + " | ".join(FIRST_CALLS) + " |", "|---|" + "---:|" * len(FIRST_CALLS)]
        for name, x in rows.items():
            n = sum(x["first_calls"].values())
            if n:
                lines.append(f"| `{name}` | " + " | ".join(f"{100 * x['first_calls'].get(k, 0) / n:.0f} %"
                                                         for k in FIRST_CALLS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", choices=sorted(SETTINGS))
    ap.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    ap.add_argument("--out", default="", help="folder of the banks (default runs/contrast/<family>)")
    ap.add_argument("--table-only", action="store_true", help="record nothing; tabulate the banks there")
    ap.add_argument("--json", default="", help="also write the rows as JSON here")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=BANK",
                    help="tabulate another bank of the family as a row (its roots; e.g. the shipped bank)")
    args = ap.parse_args(argv)
    settings = SETTINGS[args.family]
    names = [n for n in args.only.split(",") if n] or list(settings)
    unknown = [n for n in names if n not in settings]
    if unknown:
        print(f"unknown setting(s) {unknown} of {args.family}; expected some of {list(settings)}", file=sys.stderr)
        return 2
    also = []
    for item in args.also:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            print(f"--also wants NAME=BANK with an existing bank file, got {item!r}", file=sys.stderr)
            return 2
        also.append((name, Path(path)))
    folder = Path(args.out or ROOT / "runs" / "contrast" / args.family)
    folder.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in names:
        path = folder / f"{name}.jsonl.gz"
        if not args.table_only:
            record(args.family, name, path, settings[name])
        if path.exists():
            rows[name] = row(path, family=args.family)
    for name, path in also:
        rows[name] = row(path, family=args.family)
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
