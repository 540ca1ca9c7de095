"""BFCL v4 multi-turn evaluator: per-category and overall accuracy, JSON + markdown reports."""

from evaluators.bfcl.score import (
    CategoryScore,
    EntryResult,
    Scores,
    load_result_files,
    markdown,
    replay_results,
    run_ground_truth,
    run_policy,
    score,
    write_report,
)

__all__ = [
    "CategoryScore",
    "EntryResult",
    "Scores",
    "load_result_files",
    "markdown",
    "replay_results",
    "run_ground_truth",
    "run_policy",
    "score",
    "write_report",
]
