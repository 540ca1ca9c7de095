"""Recall@k of the gold passages of multi-hop questions (the offline set's retrieval report).

For a question with gold passages ``g_1 .. g_H`` and hop queries ``q_1 .. q_H`` (the
query a reader would issue once the previous hops are known, e.g. for "In which country
was P born?": ``q_1`` = the question, ``q_2`` = "In which country is <P's birth city>?"):

* ``hop recall@k`` = mean over questions and hops of ``[g_h in top-k(q_h)]``;
* ``hop1`` / ``hop2`` = the same restricted to the first / second hop;
* ``hop2_from_question@k`` = fraction of questions whose *second* gold passage is in the
  top-k of the question alone, and ``all_gold_from_question@k`` the fraction with *all*
  gold passages there. Low values say the questions need a second search: the second
  passage cannot be found from the question's words.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

from retrieval_index.protocol import Searcher


def hop_recall(searcher: Searcher, questions: Sequence[dict[str, Any]], k: int = 3,
               batch_size: int = 128) -> dict[str, Any]:
    """Recall@k of gold passages per hop (see the module docstring).

    Args:
        searcher: any :class:`Searcher`.
        questions: dicts with ``question`` and ``metadata.gold_ids`` / ``metadata.hop_queries``.
        k: the cut-off.
        batch_size: queries per ``search`` call.

    Returns:
        ``{"k", "questions", "hop_recall", "hop1", "hop2", "hop2_from_question",
        "all_gold_from_question", "by_type": {type: {"hop1", "hop2", "hop2_from_question",
        "all_gold_from_question", "n"}}}``.
    """
    if not questions:
        raise ValueError("hop_recall needs at least one question")
    jobs: list[tuple[int, int, str, str]] = []  # (question index, hop, query, gold id)
    for i, q in enumerate(questions):
        meta = q.get("metadata", {})
        gold, hops = meta.get("gold_ids"), meta.get("hop_queries")
        if not gold or not hops or len(gold) != len(hops):
            raise ValueError(f"question {q.get('id', i)!r} needs metadata.gold_ids and hop_queries of equal length")
        jobs += [(i, h, query, g) for h, (query, g) in enumerate(zip(hops, gold))]
    queries = [j[2] for j in jobs] + [q["question"] for q in questions]
    top: list[set[str]] = []
    for lo in range(0, len(queries), batch_size):
        top += [{hit.id for hit in hits} for hits in searcher.search(queries[lo: lo + batch_size], k)]
    hop_hits: dict[int, list[bool]] = defaultdict(list)
    per_type: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for (i, h, _, g), found in zip(jobs, top):
        hop_hits[h].append(g in found)
        per_type[questions[i]["metadata"].get("type", "?")][f"hop{h + 1}"].append(g in found)
    all_from_question, hop2_from_question = [], []
    for q, found in zip(questions, top[len(jobs):]):
        gold = q["metadata"]["gold_ids"]
        ok = all(g in found for g in gold)
        all_from_question.append(ok)
        per_type[q["metadata"].get("type", "?")]["all_gold_from_question"].append(ok)
        if len(gold) > 1:
            hop2_from_question.append(gold[1] in found)
            per_type[q["metadata"].get("type", "?")]["hop2_from_question"].append(gold[1] in found)

    def mean(xs: Sequence[bool]) -> float:
        return sum(xs) / len(xs) if xs else float("nan")

    every = [x for xs in hop_hits.values() for x in xs]
    return {
        "k": k,
        "questions": len(questions),
        "hop_recall": mean(every),
        "hop1": mean(hop_hits[0]),
        "hop2": mean(hop_hits[1]),
        "hop2_from_question": mean(hop2_from_question),
        "all_gold_from_question": mean(all_from_question),
        "by_type": {t: {name: mean(v) for name, v in d.items()} | {"n": len(d["all_gold_from_question"])}
                    for t, d in sorted(per_type.items())},
    }


def format_recall(results: dict[str, dict[str, Any]]) -> str:
    """A markdown table of :func:`hop_recall` results keyed by retriever name."""
    k = next(iter(results.values()))["k"]
    lines = [f"| retriever | questions | hop recall@{k} | hop 1 | hop 2 | hop 2 from the question alone | "
             "all gold from the question alone |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['questions']} | {r['hop_recall']:.3f} | {r['hop1']:.3f} | {r['hop2']:.3f} | "
                     f"{r['hop2_from_question']:.3f} | {r['all_gold_from_question']:.3f} |")
    types = sorted({t for r in results.values() for t in r["by_type"]})
    nan = float("nan")
    lines += ["", "| type | " + " | ".join(f"{n}: hop 1 / hop 2 / hop 2 from the question" for n in results) + " |",
              "|---|" + "---:|" * len(results)]
    for t in types:
        cells = []
        for r in results.values():
            d = r["by_type"].get(t, {})
            cells.append(f"{d.get('hop1', nan):.2f} / {d.get('hop2', nan):.2f} / {d.get('hop2_from_question', nan):.2f}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
