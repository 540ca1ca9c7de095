"""``python -m evaluators.qa``: score prediction files per dataset, with the average table.

Example::

    python -m evaluators.qa hotpotqa=out/hotpotqa.jsonl 2wiki=out/2wiki.jsonl \\
        musique=out/musique.jsonl bamboogle=out/bamboogle.jsonl --out reports/qa

Each file is JSONL (FlashRAG / Search-R1 output): ``{"id", "pred" | "prediction", "golden_answers"}``.
"""

from __future__ import annotations

import argparse
import sys

from evaluators.qa.score import load_predictions, markdown, score, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluators.qa", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", metavar="DATASET=FILE", help="predictions of one dataset")
    parser.add_argument("--out", help="directory for qa_scores.json and qa_scores.md")
    args = parser.parse_args(argv)
    results = {}
    for item in args.files:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"expected DATASET=FILE, got {item!r}")
        results[name] = load_predictions(path)
    scores = score(results)
    print(markdown(scores))
    if args.out:
        json_path, md_path = write_report(scores, args.out)
        print(f"\nwrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
