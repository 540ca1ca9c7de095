"""How the embedding predictor's memory knobs were chosen: measured where the predictor is used.

Every row is ``bench --bank math_python_smollm2`` (TRACE and uniform, the same warm-up slice,
seeds and pools) with one setting of the predictor's ``predictor_kwargs``, over two passes
of the bank (6 steps of 64 candidates from 192 measurable prompts) so that a prompt's own
evidence can matter in the second pass. Columns: TRACE's predictor quality in the bench
(pooled, and the mixed-vs-pure AUC in each pass), then TRACE's headline metrics and its
paired difference against uniform.

Baseline named: ``last batch`` (the predictor before this change: the head regressed on
the current step's samples only, no per-prompt evidence), side by side with the default.
Check: the default's AUC beats the baseline's by a paired interval that excludes zero
(``--plant last-batch`` makes the default the baseline: the check must FAIL).

Usage: ``python benchmarks/bench_predictor_memory.py [--seeds 10] [--bank math_python_smollm2]
[--plant last-batch] [--json out.json]``; about 4 minutes on the 2-core box.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from trace_gym.bench.bank import run_bank_bench

from trace_gym.bench.config import BankBenchConfig
from trace_gym.bench.checks import METRICS, interval_text, paired
from trace_gym.commands.bank import bank_path
from trace_gym.report import markdown_table, pm
from trace_gym.strategies import shaped_strategies

#: The previous predictor: the current batch only (a half-life far below one update), no evidence.
LAST_BATCH = {"replay_half_life": 1e-3, "evidence_strength": 1e9}
SETTINGS: dict[str, dict] = {
    "last batch (baseline)": LAST_BATCH,
    "default": {},
    "memory, no evidence": {"evidence_strength": 1e9},
    "half-life 2": {"replay_half_life": 2.0},
    "half-life inf": {"replay_half_life": math.inf},
    "evidence strength 1": {"evidence_strength": 1.0},
    "evidence strength 16": {"evidence_strength": 16.0},
    "evidence discount 1.0": {"evidence_discount": 1.0},
    "steps 5": {"steps_per_update": 5},
    "steps 50": {"steps_per_update": 50},
    "lr 1e-3": {"lr": 1e-3},
    "lr 1e-2": {"lr": 1e-2},
}


def run(bank: str, seeds: int, kwargs: dict) -> dict:
    cfg = BankBenchConfig(bank=bank, seeds=seeds, steps=6, strategies=("uniform", "trace"),
                          oracle_upper_bound=False, predictor_kwargs=kwargs)
    table = shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                              continuations_per_root=cfg.continuations_per_root)
    return run_bank_bench(cfg, table)


def row(name: str, res: dict) -> list:
    t = res["strategies"]["trace"]
    curve = t["by_step"]
    passes = [sum(p["mixed_auc"] for p in curve[i:i + 3]) / 3 for i in (0, 3)]
    diff = paired(res["strategies"], "trace", "uniform", METRICS["effective_ratio"])
    return [name, t["prompt_spearman"], t["mixed_auc"], passes[0], passes[1], t["brier"], t["level_error"],
            pm(t["effective_ratio"], t["effective_ratio_ci"]), t["mixed_prompts"], interval_text(diff),
            f"{100 * t['exhausted_share']:.1f} %"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", default="math_python_smollm2")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated setting names (default: all)")
    ap.add_argument("--plant", choices=("last-batch",), help="make the default the baseline (the check must FAIL)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    bank = str(bank_path(args.bank))
    settings = dict(SETTINGS)
    if args.plant:
        settings["default"] = LAST_BATCH
    names = [n for n in settings if not args.only or n in args.only.split(",") or n in (
        "last batch (baseline)", "default")]
    results, start = {}, time.perf_counter()
    for name in names:
        results[name] = run(bank, args.seeds, settings[name])
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(f"## Predictor memory on {args.bank}, in the bench ({args.seeds} seeds x 6 steps, 2 passes; "
          f"{time.perf_counter() - start:.0f} s)\n")
    print(markdown_table(["setting", "Spearman", "AUC", "AUC pass 1", "AUC pass 2", "Brier", "level err",
                          "TRACE eff. ratio", "TRACE mixed/step", "TRACE - uniform (eff. ratio)", "exhausted"],
                         [row(n, r) for n, r in results.items()]))
    base, default = (results[n]["strategies"]["trace"]["per_rep"] for n in ("last batch (baseline)", "default"))
    auc = {"default": {"per_rep": [{"mixed_auc": r["mixed_auc"]} for r in default]},
           "base": {"per_rep": [{"mixed_auc": r["mixed_auc"]} for r in base]}}
    for k in auc:
        auc[k]["mixed_auc"] = sum(r["mixed_auc"] for r in auc[k]["per_rep"]) / len(auc[k]["per_rep"])
    from trace_gym.bench.checks import Metric

    diff = paired(auc, "default", "base", Metric("mixed_auc", "AUC", 0.0, 1.0))
    status = "PASS" if diff["shown"] == 1 else "FAIL"
    print(f"\n{status}: the default predictor separates mixed from pure prompts better than the last-batch baseline "
          f"(AUC difference {interval_text(diff)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({n: r["strategies"] for n, r in results.items()}, f, indent=1, default=str)
    return 0 if status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
