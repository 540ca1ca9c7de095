"""Multi-hop QA evaluator: per-dataset and average EM/F1 (HotpotQA, 2Wiki, MuSiQue, Bamboogle)."""

from evaluators.qa.score import (
    SUITES,
    DatasetScore,
    QARecord,
    QAScores,
    QASuite,
    load_predictions,
    markdown,
    run_policy,
    score,
    score_records,
    write_report,
)

__all__ = ["SUITES", "DatasetScore", "QARecord", "QAScores", "QASuite", "load_predictions", "markdown",
           "run_policy", "score", "score_records", "write_report"]
