"""EM / F1 against hand-computed values under the official HotpotQA definitions (48 cases)."""

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
    ("the", "a", 0, 0.0),  # both normalise to "": the gold is compared raw (the official script says EM 1)
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


@pytest.mark.parametrize("prediction,gold,em,f1", [
    ("", "The The", 0.0, 0.0),        # the official script: EM 1 (both normalise to "")
    ("the", "The The", 0.0, 2 / 3),   # one of the band's two tokens
    ("!!!", "A", 0.0, 0.0),
    ("The The", "The The", 1.0, 1.0),  # the official script: F1 0
    ("the the.", "The The", 0.0, 0.5),  # punctuation is kept for such a gold: "the." is another token
    ("Paris.", "paris", 1.0, 1.0),     # a gold with words left is normalised as before
])
def test_a_gold_that_normalises_to_nothing_is_compared_raw(prediction, gold, em, f1):
    from environments.wiki_qa.metrics import best_exact_match, best_f1

    assert best_exact_match(prediction, [gold]) == em
    assert best_f1(prediction, [gold]) == pytest.approx(f1)
