"""EM / F1 against hand-computed values under the official HotpotQA definitions (48 cases), against
the official script's own functions (transcribed below), and the training reward's documented
departure for golds that normalise to nothing (issue 44)."""

from __future__ import annotations

import pytest

from environments.wiki_qa.metrics import (
    best_exact_match,
    best_f1,
    exact_match,
    f1_precision_recall,
    f1_score,
    normalize_answer,
)

TWO_THIRDS_F1 = 2 * 0.5 * 1 / 1.5  # precision 1/2, recall 1 (or the reverse)

# (prediction, gold or gold aliases, EM, F1), each computed by hand
CASES = [
    ("Paris", "Paris", 1, 1.0),
    ("paris", "Paris", 1, 1.0),
    ("The Paris", "Paris", 1, 1.0),
    ("Paris.", "Paris", 1, 1.0),
    ("  Paris  ", "Paris", 1, 1.0),
    ("Paris, France", "Paris", 0, TWO_THIRDS_F1),
    ("France", "Paris", 0, 0.0),
    ("a cat", "the cat", 1, 1.0),
    ("an apple", "apple", 1, 1.0),
    ("theater", "the ater", 0, 0.0),  # "the" is removed only as a whole word
    ("Annie", "annie", 1, 1.0),
    ("yes", "yes", 1, 1.0),
    ("Yes.", "yes", 1, 1.0),
    ("yes", "no", 0, 0.0),
    ("no", "no way", 0, 0.0),  # yes/no rule: a shared token earns nothing
    ("no way", "no", 0, 0.0),
    ("noanswer", "no answer", 0, 0.0),
    ("no answer", "noanswer", 0, 0.0),
    ("noanswer", "noanswer", 1, 1.0),
    ("yes it is", "yes", 0, 0.0),
    ("Yes", "Yes!", 1, 1.0),
    ("1992", "1992", 1, 1.0),
    ("in 1992", "1992", 0, TWO_THIRDS_F1),
    ("1,992", "1992", 1, 1.0),
    ("3.5", "35", 1, 1.0),  # punctuation is deleted, digits join (the official quirk)
    ("New York City", "New York", 0, 0.8),
    ("York New", "New York", 0, 1.0),  # F1 is a bag of tokens
    ("the", "a", 1, 0.0),  # both normalise to "": the official script's EM 1 and F1 0
    ("", "Paris", 0, 0.0),
    ("Barack Obama", "Obama", 0, TWO_THIRDS_F1),
    ("Obama", "Barack Obama", 0, TWO_THIRDS_F1),
    ("Barack Hussein Obama", "Barack Obama", 0, 0.8),
    ("the the cat", "cat cat", 0, TWO_THIRDS_F1),
    ("cat cat cat", "cat", 0, 0.5),  # counts clip: 1 common token, precision 1/3
    ("O'Neil", "ONeil", 1, 1.0),
    ("rock-and-roll", "rock and roll", 0, 0.0),
    ("U.S.A.", "USA", 1, 1.0),
    ("café", "cafe", 0, 0.0),  # no unicode folding
    ("Pierre\u2013Loti", "PierreLoti", 0, 0.0),  # an en dash is not ASCII punctuation
    ("Federation of Kroskgraen", ["Kroskgraen", "Federation of Kroskgraen"], 1, 1.0),
    ("Kroskgraen Federation", ["Kroskgraen", "Federation of Kroskgraen"], 0, 0.8),  # max(2/3, 0.8)
    ("NYC", ["New York City", "NYC"], 1, 1.0),
    ("No", ["no"], 1, 1.0),
    (None, ["Paris"], 0, 0.0),
    ("The Beatles", ["Beatles", "the beatles band"], 1, 1.0),
    ("New\tYork\n", "new york", 1, 1.0),
    ("Los Angeles, California", ["Los Angeles"], 0, 0.8),
    ("no", ["yes", "no"], 1, 1.0),
]


def test_the_table_has_at_least_40_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("prediction,golds,em,f1", CASES)
def test_em_and_f1_match_hand_computed_values(prediction, golds, em, f1):
    assert best_exact_match(prediction, golds) == em
    assert best_f1(prediction, golds) == pytest.approx(f1, abs=1e-12)


def test_precision_and_recall():
    assert f1_precision_recall("New York City", "New York") == pytest.approx((0.8, 2 / 3, 1.0))
    assert f1_precision_recall("Obama", "Barack Obama") == pytest.approx((TWO_THIRDS_F1, 1.0, 0.5))
    assert f1_precision_recall("no", "no way") == (0.0, 0.0, 0.0)


def test_normalisation_steps():
    assert normalize_answer("The  Quick, Brown FOX!") == "quick brown fox"
    assert normalize_answer("An ant and a bee") == "ant and bee"
    assert normalize_answer("theatre the") == "theatre"
    assert exact_match("A Tale", "tale") == 1.0 and f1_score("tale", "A Tale") == 1.0


def test_gold_answers_are_checked():
    with pytest.raises(ValueError, match="at least one gold"):
        best_exact_match("x", [])
    with pytest.raises(TypeError, match="must be strings"):
        best_f1("x", [1992])


# golds that normalise to nothing: (prediction, gold, official EM, official F1, reward EM, reward F1), by hand
NOTHING_LEFT = [
    ("", "The The", 1, 0.0, 0.0, 0.0),            # official: "" == "" pays EM; no token, no F1
    ("the", "The The", 1, 0.0, 0.0, 2 / 3),       # the reward: one of the band's two tokens
    ("!!!", "A", 1, 0.0, 0.0, 0.0),
    ("The The", "The The", 1, 0.0, 1.0, 1.0),     # the right answer: official F1 0, the reward pays it
    ("the the.", "The The", 1, 0.0, 0.0, 0.5),    # the reward keeps punctuation for such a gold
    ("The The band", "The The", 0, 0.0, 0.0, 0.8),
    ("Paris.", "paris", 1, 1.0, 1.0, 1.0),        # a gold with words left: reward and metric agree
    ("no", "No!", 1, 1.0, 1.0, 1.0),
    ("no way", "no", 0, 0.0, 0.0, 0.0),           # the yes/no rule holds in the reward too
]


@pytest.mark.parametrize("prediction,gold,em,f1,reward_em,reward_f1", NOTHING_LEFT)
def test_a_gold_that_normalises_to_nothing_scores_as_the_official_script_and_the_reward_departs(
        prediction, gold, em, f1, reward_em, reward_f1):
    from environments.wiki_qa import metrics

    assert metrics.best_exact_match(prediction, [gold]) == em and metrics.best_f1(prediction, [gold]) == f1
    assert metrics.em_reward(prediction, [gold]) == reward_em
    assert metrics.reward_f1(prediction, [gold]) == pytest.approx(reward_f1)
    assert metrics.f1_reward(prediction, [gold]) == pytest.approx(1.0 if reward_f1 == 1 else reward_f1 / 2)


# ---------------------------------------------------------------------- the official script, verbatim
def _official_normalize_answer(s):  # hotpot_evaluate_v1.py
    import re
    import string

    def remove_articles(text):
        return re.sub(r'\b(a|an|the)\b', ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _official_f1_score(prediction, ground_truth):  # hotpot_evaluate_v1.py
    from collections import Counter

    normalized_prediction = _official_normalize_answer(prediction)
    normalized_ground_truth = _official_normalize_answer(ground_truth)
    ZERO_METRIC = (0, 0, 0)
    if normalized_prediction in ['yes', 'no', 'noanswer'] and normalized_prediction != normalized_ground_truth:
        return ZERO_METRIC
    if normalized_ground_truth in ['yes', 'no', 'noanswer'] and normalized_prediction != normalized_ground_truth:
        return ZERO_METRIC
    prediction_tokens = normalized_prediction.split()
    ground_truth_tokens = normalized_ground_truth.split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return ZERO_METRIC
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1, precision, recall


def _official_exact_match_score(prediction, ground_truth):  # hotpot_evaluate_v1.py
    return (_official_normalize_answer(prediction) == _official_normalize_answer(ground_truth))


def test_every_case_scores_as_the_official_script_does():
    import random

    words = ["the", "a", "an", "The", "yes", "no", "noanswer", "Paris", "paris,", "!!!", "U.S.", "", " ", "cat",
             "no-answer", "A.", "théâtre", "1,992", "\t"]
    rng = random.Random(0)
    pairs = [(p, g) for p, golds, _em, _f1 in CASES if p is not None for g in ([golds] if isinstance(golds, str) else golds)]
    pairs += [(p, g) for p, g, *_ in NOTHING_LEFT]
    pairs += [(" ".join(rng.choices(words, k=rng.randint(0, 4))), " ".join(rng.choices(words, k=rng.randint(0, 4))))
              for _ in range(2000)]
    for prediction, gold in pairs:
        assert exact_match(prediction, gold) == float(_official_exact_match_score(prediction, gold)), (prediction, gold)
        assert f1_precision_recall(prediction, gold) == pytest.approx(_official_f1_score(prediction, gold)), \
            (prediction, gold)
