"""Multiple-choice answers in the math env: one option letter, extracted and graded exactly.

The out-of-domain suites (MMLU-Pro, ARC-Challenge, GPQA-diamond; :mod:`evaluators.choice`)
run in :class:`~environments.math_python.env.MathPythonEnv` unchanged, with a
:class:`ChoiceGrader` as its ``grader``: the env hands the final response (the one without a
code block) to ``grader.grade(response, gold, extraction)`` as it does with the math grader,
and the reward is 1.0 when the response names exactly the gold letter.

Extraction (:func:`extract_choice`), on text that may be hostile (a megabyte, unbalanced
braces, NUL bytes): it reads a bounded tail, walks each box at most a bounded length, and
never raises.

1. Only the last :data:`MAX_SCAN_CHARS` (4,096) characters of the response are read: the
   answer is at the end, and a megabyte of output costs what 4 KB does.
2. The answer span is the content of the last closed ``\\boxed{...}`` / ``\\fbox{...}``
   (nested braces allowed; a box whose content runs past :data:`MAX_SPAN_CHARS`, 128
   characters, or never closes is skipped). Without one, the text after the last
   ``answer:``, ``answer is``, ``answer is:`` or ``answer =`` (any case, markdown ``**``
   allowed: ``The answer is (C)``, ``**Answer:** C``), to the end of its line and at most
   :data:`MAX_SPAN_CHARS`. Neither: ``no_answer``.
3. In the span, LaTeX text wrappers (``\\text``, ``\\textbf``, ``\\mathrm``, ``\\mathbf`` ...),
   braces, ``$`` and control characters (NUL ...) are dropped, then leading brackets,
   quotes, ``*`` and the words ``option`` / ``choice`` / ``letter`` are skipped; the span
   names a letter when what follows is a letter standing alone (``C``, ``(C)``, ``C.``,
   ``C) 42 kg``, ``c``) that is one of the suite's letters. A lower-case letter counts only
   when no word follows it (``the answer is a prime`` names no letter; ``the answer is b.``
   names B). Other LaTeX commands (``\\quad``, ``\\lor``) read as spaces.
3a. **Every letter listed after it is named too**, so that a hedge is never read as its
   first letter. After the letter, the span is read on through punctuation (brackets,
   ``|``, ``.``, ``-`` ...), joining words (``and``, ``or``, ``nor``, ``vs``, ``versus``,
   ``,`` ``;`` ``/`` ``&`` ``+`` ``|``) and fillers (``option``, ``maybe`` ...); a letter
   reached that way is named when it stands alone at the end of the span or before more
   punctuation (``A B``, ``(A)(B)``, ``A|B``, ``\\text{A}\\text{B}``, ``answer is (A) (B)``),
   or, right after the last letter, when it starts a run of capitals that ends there or at a
   joining word (``A B C D``, ``A B or C``; LaTeX's line break ``\\\\`` joins too:
   ``A\\\\B``),
   or, after a joining word, when it is a capital or a lone lower-case letter (``A or B
   is right``, ``A, or C``). Reading stops at the first other word, so the option's own
   text never adds a letter (``C. Vitamin A``, ``C, because D fails``, ``C. B is
   wrong`` name C alone). A span that is nothing but a run of two or more capitals
   (``AC``) names each of them.
4. Verdict (``GradeResult.reason``): ``correct`` (exactly one letter, the gold),
   ``wrong_letter`` (one other letter), ``several_letters`` (two or more different
   letters: ``\\boxed{A, C}``, ``answer: A or B``; reward 0, so hedging never pays),
   ``no_choice_letter`` (a box or phrase without a letter, e.g. ``\\boxed{42}``),
   ``no_answer``. Letters outside the ones a :class:`ChoiceGrader` was built with are no
   letters (``\\boxed{E}`` on a four-option question is ``no_choice_letter``).

A letter mentioned in prose is never taken by itself: in ``I think B is wrong, the answer
is C`` the phrase names C.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: Option letters, in order (MMLU-Pro has up to ten options).
LETTERS = "ABCDEFGHIJ"
#: Characters at the end of a response that extraction reads.
MAX_SCAN_CHARS = 4096
#: Longest box content or answer phrase (characters) that is read.
MAX_SPAN_CHARS = 128

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)[ \t]*\{")
_PHRASE = re.compile(r"\banswer\b[ \t*_]*(?:is\b[ \t*_]*:?|:|=)", re.IGNORECASE)
_WRAPPER = re.compile(r"\\(?:textbf|textit|textrm|texttt|text|mathrm|mathbf|mathit|mathsf|bf|rm|it)(?![A-Za-z])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f{}$]")  # control characters (NUL...), braces and $ read as spaces
_TOKEN = re.compile(r"[A-Za-z0-9]+|\S")
_OPENERS = frozenset("([<\"'`*")
_CLOSERS = frozenset(")]>\"'`*")
_COMMAND = re.compile(r"\\[A-Za-z]+")  # any other LaTeX command (\quad, \lor, \vee): a space
_LINE_BREAK = re.compile(r"\\\\")  # LaTeX's line break (A\\B): a joiner, not the command \B
_JOINERS = frozenset({",", ";", "/", "&", "+", "|", "and", "or", "nor", "vs", "versus"})
_LEAD_WORDS = frozenset({"option", "choice", "letter", ":"})
#: words skipped between two listed letters ("A or maybe option B")
_FILLERS = _LEAD_WORDS | {"maybe", "perhaps", "possibly", "probably", "also", "either", "else", "even"}


@dataclass(frozen=True)
class Choice:
    """What a response names.

    Attributes:
        letters: the distinct option letters named, upper case, in order of mention.
        span: the text they were read from (box content or the phrase's rest, at most
            :data:`MAX_SPAN_CHARS`); ``None`` when the response has no answer.
        source: ``"boxed"``, ``"phrase"`` or ``"none"``.
    """

    letters: tuple[str, ...]
    span: str | None
    source: str

    @property
    def letter(self) -> str | None:
        """The one letter named, or ``None`` (no letter, or several)."""
        return self.letters[0] if len(self.letters) == 1 else None


def _last_box(text: str) -> str | None:
    """Content of the last closed ``\\boxed{}`` / ``\\fbox{}`` whose content fits in
    :data:`MAX_SPAN_CHARS` (at most that many characters are walked per box)."""
    for m in reversed(list(_BOX_OPEN.finditer(text))):
        depth, start = 1, m.end()
        for i in range(start, min(len(text), start + MAX_SPAN_CHARS + 1)):
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


def _last_phrase(text: str) -> str | None:
    """The rest of the line after the last ``answer: / answer is`` (at most :data:`MAX_SPAN_CHARS`)."""
    last = None
    for last in _PHRASE.finditer(text):
        pass
    if last is None:
        return None
    return text[last.end(): last.end() + MAX_SPAN_CHARS].split("\n", 1)[0]


def letters_in_span(span: str, letters: str = LETTERS) -> tuple[str, ...]:
    """The distinct option letters (of ``letters``) that ``span`` names (rules 3 and 3a of
    the module docstring)."""
    span = _CONTROL.sub(" ", _COMMAND.sub(" ", _WRAPPER.sub(" ", _LINE_BREAK.sub(" / ", span))))
    toks = _TOKEN.findall(span)
    i = 0
    while i < len(toks) and (toks[i] in _OPENERS or toks[i].lower() in _LEAD_WORDS):
        i += 1
    if i == len(toks):
        return ()

    def letter(j: int) -> bool:  # toks[j] is one of the letters, as a word of its own
        return len(toks[j]) == 1 and toks[j].upper() in letters

    def alone(j: int) -> bool:  # ... and nothing but punctuation follows it
        return letter(j) and (j + 1 == len(toks) or not toks[j + 1][0].isalnum())

    def lone(j: int) -> bool:  # ... a capital, or alone (a lower-case "a" followed by a word is an article)
        return letter(j) and (toks[j].isupper() or alone(j))

    def listed(j: int, right_after: bool) -> bool:
        """... alone, or, right after the last letter, the first of capitals that end at
        punctuation or a joiner ("A B C D", "A B or C"; not "D. A and B are wrong")."""
        k = j
        while k < len(toks) and letter(k) and toks[k].isupper():
            k += 1
        return alone(j) or (right_after and k > j and (k == len(toks) or not toks[k][0].isalnum()
                                                       or toks[k].lower() in _JOINERS))

    first = toks[i]
    if len(first) > 1 and first.isalpha() and first.isupper() and set(first) <= set(letters) \
            and all(not t[0].isalnum() for t in toks[i + 1:]):
        return tuple(dict.fromkeys(first))  # "AC": a run of capitals and nothing else
    if not lone(i):
        return ()
    found, j = [first.upper()], i + 1
    while True:  # rule 3a: read on through punctuation, joiners and fillers to the next letter
        joined, after = False, j
        while j < len(toks) and (not toks[j][0].isalnum() or toks[j].lower() in _JOINERS | _FILLERS):
            joined = joined or toks[j].lower() in _JOINERS
            j += 1
        if j >= len(toks) or not (lone(j) if joined else listed(j, j == after)):
            break
        found.append(toks[j].upper())
        j += 1
    return tuple(dict.fromkeys(found))


def extract_choice(text: Any, letters: str = LETTERS) -> Choice:
    """The option letters a response names (rules 1-3 of the module docstring); never raises
    on any input (a non-``str`` response names nothing)."""
    if not isinstance(text, str):
        return Choice((), None, "none")
    tail = text[-MAX_SCAN_CHARS:]
    span = _last_box(tail)
    source = "boxed"
    if span is None:
        span, source = _last_phrase(tail), "phrase"
    if span is None:
        return Choice((), None, "none")
    return Choice(letters_in_span(span, letters), span.strip(), source)


def _check_letters(letters: str) -> str:
    if not isinstance(letters, str) or not letters or not letters.isascii() or not letters.isalpha() \
            or not letters.isupper() or len(set(letters)) != len(letters):
        raise ValueError(f"letters must be distinct upper-case ASCII letters such as 'ABCD', got {letters!r}")
    return letters


@dataclass(frozen=True)
class ChoiceGrader:
    """Grades a final response against a gold option letter; stands in for the math env's
    :class:`~environments.math_python.grading.Grader` (``MathPythonEnv(grader=...)``).

    Grading is a pure function of the text, run in this process: no worker, no sandbox,
    nothing to start or stop. Stateless, so one instance serves every env and thread.

    Args:
        letters: the option letters a response may name (``"ABCD"``; MMLU-Pro ``"ABCDEFGHIJ"``).
    """

    letters: str = LETTERS

    def __post_init__(self) -> None:
        _check_letters(self.letters)

    def grade(self, response: Any, gold: Any, extraction: str = "boxed") -> Any:
        """A :class:`~environments.math_python.grading.GradeResult` for ``response``:
        ``extracted`` is the one letter named (the span read, when it names none or several),
        ``gold`` the gold letter, ``reason`` one of rule 4's. ``extraction`` is the math env's
        ``answer_extraction``, passed by the env and ignored: choices have one rule.

        Raises:
            ValueError: ``gold`` is not one of ``letters`` (a data error, not the model's).
        """
        from environments.math_python.grading import GradeResult

        gold_letter = str(gold).strip().upper() if isinstance(gold, str) else ""
        if len(gold_letter) != 1 or gold_letter not in self.letters:
            raise ValueError(f"the gold of a choice task must be one of the letters {self.letters!r}, got {gold!r}")
        choice = extract_choice(response, self.letters)
        if choice.span is None:
            return GradeResult(False, None, gold_letter, "no_answer")
        if not choice.letters:
            return GradeResult(False, choice.span, gold_letter, "no_choice_letter")
        if len(choice.letters) > 1:
            return GradeResult(False, choice.span, gold_letter, "several_letters")
        correct = choice.letter == gold_letter
        return GradeResult(correct, choice.letter, gold_letter, "correct" if correct else "wrong_letter")

    def grade_many(self, pairs: Any) -> list[Any]:
        return [self.grade(response, gold) for response, gold in pairs]

    def start_background(self) -> None:
        """Nothing to start (the env calls this on the math grader to warm its worker)."""

    def close(self) -> None:
        """Nothing to stop."""
