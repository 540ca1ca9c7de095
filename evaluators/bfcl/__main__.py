"""``python -m evaluators.bfcl``: score bfcl-eval result files, or the ground truth, per category.

Examples::

    python -m evaluators.bfcl --results result/my-model/multi_turn --out reports/bfcl
    python -m evaluators.bfcl --ground-truth --split eval --out reports/bfcl_gt
"""

from __future__ import annotations

import argparse
import sys

from environments.bfcl import data
from evaluators.bfcl.score import load_result_files, markdown, replay_results, run_ground_truth, score, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluators.bfcl", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--results", nargs="+", help="bfcl-eval result files (JSON lines) or directories of them")
    source.add_argument("--ground-truth", action="store_true", help="score the ground-truth calls (a sanity check)")
    parser.add_argument("--categories", nargs="+", default=list(data.CATEGORIES), choices=data.CATEGORIES)
    parser.add_argument("--split", default="all", choices=data.SPLITS, help="entries to keep (default: all)")
    parser.add_argument("--action-format", default="python", choices=["python", "tool_call"])
    parser.add_argument("--out", required=True, help="directory for bfcl_scores.json and bfcl_scores.md")
    args = parser.parse_args(argv)

    if args.ground_truth:
        results = run_ground_truth(args.categories, args.split, args.action_format)
    else:
        records = [
            r for r in load_result_files(args.results)
            if data.category_of(r["id"]) in args.categories and (args.split == "all" or data.split_of(r["id"]) == args.split)
        ]
        results = replay_results(records, args.action_format)
    scores = score(results)
    json_path, md_path = write_report(scores, args.out, results)
    print(markdown(scores))
    print(f"\nwrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
