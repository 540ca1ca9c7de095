"""Exact match and token F1 of short answers: the official HotpotQA evaluation script's, and the
training reward built on them.

**The metrics** (:func:`exact_match`, :func:`f1_precision_recall`, :func:`best_exact_match`,
:func:`best_f1`; what ``evaluators/qa`` reports, so its numbers compare with published
ones) are exactly those of HotpotQA's ``hotpot_evaluate_v1.py``:

* **Normalisation** (``normalize_answer``, SQuAD's): lower-case; delete every ASCII
  punctuation character (``string.punctuation``); replace the whole words ``a``, ``an``,
  ``the`` by a space; collapse whitespace.
* **EM** = 1 when the normalised prediction equals the normalised gold, else 0.
* **F1** over whitespace tokens of the normalised strings: with ``c`` the size of the
  multiset intersection, precision ``c / len(pred)``, recall ``c / len(gold)``,
  F1 ``2 P R / (P + R)``; 0 when ``c = 0``.
* **yes/no/noanswer rule**: when either normalised string is ``yes``, ``no`` or
  ``noanswer`` and the two differ, F1, precision and recall are all 0 (so "no" earns
  nothing against "no way", although they share a token).
* **Aliases**: with several gold answers (FlashRAG's ``golden_answers``), each metric
  is the maximum over them, as Search-R1 and FlashRAG score (HotpotQA has one gold).

So a gold with nothing left after normalisation (only articles and punctuation: the band
"The The") gets EM 1 from every answer that normalises to nothing ("", "the", "!!!"),
and F1 0 from every answer, the right one included: that is the official number.

**The training reward** (:func:`em_reward`, :func:`f1_reward`: the env's ``reward="em"``
and ``reward="f1"``) departs from the metrics in two documented ways, both so that the
policy is paid for the right answer and never for a wrong one:

* **a gold that normalises to nothing** is compared, for the reward only, with both
  strings lower-cased and whitespace collapsed, punctuation and articles kept: "the the"
  matches "The The", "" and "the" do not (the official EM would pay an empty answer);
* **the F1 reward is not F1**: an episode succeeds when its reward is at least 0.5
  (``trace_gym.tree.SUCCESS_THRESHOLD``), and F1 pays a hedge over that line against each
  gold it hedges between ("Paris London" scores 0.667 against "Paris" and against
  "London"), or an answer that says less than either ("John" scores 0.667 against "John
  Smith" and "John Brown"). So the reward is 1.0 for an answer whose words are exactly
  those of a gold alias (F1 = 1: EM up to word order) and half its best F1 otherwise:
  partial credit, still graded by overlap, always below the success line. No answer can
  then succeed against two golds that differ (as bags of words). A precision
  requirement alone would not do: it refuses "Paris London" but still pays "John" both
  ways. Search-R1 avoids the question by rewarding EM.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA answer normalisation (see the module docstring)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0 (the official script's ``exact_match_score``)."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_precision_recall(prediction: str, gold: str) -> tuple[float, float, float]:
    """Token ``(F1, precision, recall)`` of one prediction against one gold answer (the official
    script's ``f1_score``, yes/no/noanswer rule included)."""
    return _f1_of(normalize_answer(prediction), normalize_answer(gold))


def _f1_of(pred: str, ref: str) -> tuple[float, float, float]:
    """``(F1, precision, recall)`` of two strings already compared as they are."""
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0, 0.0, 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 of one prediction against one gold answer."""
    return f1_precision_recall(prediction, gold)[0]


def _golds(golds: str | Iterable[str]) -> list[str]:
    out = [golds] if isinstance(golds, str) else list(golds)
    if not out:
        raise ValueError("need at least one gold answer, got none")
    for g in out:
        if not isinstance(g, str):
            raise TypeError(f"gold answers must be strings, got {type(g).__name__}: {g!r:.80}")
    return out


def best_exact_match(prediction: str | None, golds: str | Iterable[str]) -> float:
    """EM maximised over gold aliases (a missing prediction scores 0)."""
    golds = _golds(golds)
    return 0.0 if prediction is None else max(exact_match(prediction, g) for g in golds)


def best_f1(prediction: str | None, golds: str | Iterable[str]) -> float:
    """F1 maximised over gold aliases (a missing prediction scores 0)."""
    golds = _golds(golds)
    return 0.0 if prediction is None else max(f1_score(prediction, g) for g in golds)


# ---------------------------------------------------------------------- the training reward
def _reward_compared(prediction: str, gold: str) -> tuple[str, str]:
    """The two strings the reward compares: both normalised, or, for a gold that normalises to
    nothing ("The The", "A"), both lower-cased with whitespace collapsed (module docstring)."""
    ref = normalize_answer(gold)
    if ref:
        return normalize_answer(prediction), ref
    return " ".join(prediction.lower().split()), " ".join(gold.lower().split())


def em_reward(prediction: str | None, golds: str | Iterable[str]) -> float:
    """The EM reward: EM maximised over gold aliases, a gold that normalises to nothing compared
    lower-cased (module docstring); a missing prediction scores 0."""
    golds = _golds(golds)
    if prediction is None:
        return 0.0
    return max(float(pred == ref) for pred, ref in (_reward_compared(prediction, g) for g in golds))


def reward_f1(prediction: str | None, golds: str | Iterable[str]) -> float:
    """Token F1 maximised over gold aliases, a gold that normalises to nothing compared
    lower-cased (module docstring); a missing prediction scores 0."""
    golds = _golds(golds)
    if prediction is None:
        return 0.0
    return max(_f1_of(*_reward_compared(prediction, g))[0] for g in golds)


def f1_reward(prediction: str | None, golds: str | Iterable[str]) -> float:
    """The F1 reward (module docstring): 1.0 when the answer has F1 = 1 with a gold alias
    (:func:`reward_f1`), else half its best F1 (below 0.5); a missing prediction scores 0."""
    f1 = reward_f1(prediction, golds)
    return 1.0 if f1 == 1.0 else f1 / 2
