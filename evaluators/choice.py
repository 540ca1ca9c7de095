"""Multiple-choice suites, the paper's out-of-domain evaluation: MMLU-Pro, ARC-Challenge, GPQA-diamond.

Each loader reads the rows users download from the hub, in that schema, from a local file
(``load_tasks(name, path=...)``: ``.jsonl``, ``.parquet``, ``.json`` or a folder holding
``{split}.<ext>``; :func:`trace_gym.env.datafiles.load_rows`) or the hub itself (through the
``datasets`` package):

================  =======================  ==============  =====  ================================  =======
suite             hub id                   config          split  fields read                       options
================  =======================  ==============  =====  ================================  =======
``mmlu_pro``      TIGER-Lab/MMLU-Pro       -               test   question, options, answer_index   up to 10
                                                                  (or answer), category
``arc_c``         allenai/ai2_arc          ARC-Challenge   test   question, choices.text,           3-5
                                                                  choices.label, answerKey          (mostly 4)
``gpqa_diamond``  Idavidrein/gpqa          gpqa_diamond    train  Question, Correct Answer,         4
                                                                  Incorrect Answer 1..3
================  =======================  ==============  =====  ================================  =======

A task's ``prompt`` is the question, its options lettered ``A.``, ``B.``, ... one a line,
and the instruction to put the letter in ``\\boxed{}`` (:func:`format_prompt`; zero-shot);
its ``answer`` is the gold letter; ``metadata`` keeps the options as shown, the gold option's
text and the row's own descriptive fields (MMLU-Pro's ``category`` and ``src``, GPQA's
``High-level domain`` and ``Subdomain``). The episodes run in MathPython with a
:class:`~environments.math_python.choice.ChoiceGrader` (:func:`env_kwargs`).

- **MMLU-Pro**: the gold is ``answer_index`` (``answer``, the letter, must agree when both
  are given); options ``"N/A"`` are dropped, as MMLU-Pro's own evaluation does.
- **ARC**: options are lettered by position, whatever their labels (``"1"``-``"4"`` in some
  rows, ``"A"``-``"E"`` in others); the gold is the position of ``answerKey`` among the labels.
- **GPQA** ships the correct answer apart from the three incorrect ones. The four are
  shown in an order fixed per question (:func:`gpqa_order`): sorted by
  ``sha256("trace_gym/gpqa/" + question + "/" + i)``, i = 0 for the correct answer: the same
  on every run and machine (no salted ``hash()``, no RNG stream), and the gold letter
  uniform over A-D across questions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

from trace_gym.env.datafiles import load_rows
from trace_gym.types import Task

#: Option letters in order (the same as :data:`environments.math_python.choice.LETTERS`,
#: repeated here so that the suite table imports nothing of the env package).
LETTERS = "ABCDEFGHIJ"

#: What a row becomes: (question, options in the order shown, index of the gold option, metadata).
Parsed = tuple[str, list[str], int, dict[str, Any]]


@dataclass(frozen=True)
class ChoiceDataset:
    """Where a multiple-choice set lives and how one of its rows becomes a task.

    Attributes:
        hub_id, config, split: ``datasets.load_dataset(hub_id, config, split=split)``.
        max_options: most options a row may have (its letters: ``LETTERS[:max_options]``).
        parse: ``parse(row, index) -> (question, options, gold index, metadata)``.
        id_field: the row's own id (the task id is ``<name>/<id>``, else ``<name>/<index>``).
    """

    hub_id: str
    config: str | None
    split: str
    max_options: int
    parse: Callable[[Mapping[str, Any], int], Parsed]
    id_field: str

    @property
    def letters(self) -> str:
        return LETTERS[: self.max_options]


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (from parquet or ``datasets``) as Python values."""
    return value.tolist() if hasattr(value, "tolist") else value


def _field(name: str, row: Mapping[str, Any], index: int, key: str) -> Any:
    if key not in row:
        raise ValueError(f"{name} row {index} has no {key!r} field (fields: {sorted(row)})")
    return _plain(row[key])


def _safe(text: str) -> str:
    """``text`` stripped, with any lone surrogate (a ``\\ud800`` escape in a JSON file) written
    as ``\\udXXX``, so that the prompt always encodes as UTF-8."""
    return text.strip().encode("utf-8", "backslashreplace").decode("utf-8")


def _text(name: str, row: Mapping[str, Any], index: int, key: str) -> str:
    value = _field(name, row, index, key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} row {index}: {key!r} must be a non-empty string, got {value!r}")
    return _safe(value)


def _options(name: str, index: int, key: str, value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(o, str) for o in value):
        raise ValueError(f"{name} row {index}: {key!r} must be a list of strings, got {value!r}")
    return [_safe(o) for o in value]


def _extra(row: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The row's descriptive fields that are present and JSON-serialisable."""
    out = {}
    for key in keys:
        value = _plain(row.get(key))
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        if value is not None:
            out[key] = value
    return out


def parse_mmlu_pro(row: Mapping[str, Any], index: int) -> Parsed:
    """A TIGER-Lab/MMLU-Pro row (``question``, ``options``, ``answer``, ``answer_index``, ``category``)."""
    name = "mmlu_pro"
    question = _text(name, row, index, "question")
    options = _options(name, index, "options", _field(name, row, index, "options"))
    if len(options) > len(LETTERS):
        raise ValueError(f"{name} row {index} has {len(options)} options; expected 2 to {len(LETTERS)}")
    letter = row.get("answer")
    gold = row.get("answer_index")
    if gold is None:
        if not isinstance(letter, str) or len(letter.strip()) != 1 or letter.strip().upper() not in LETTERS:
            raise ValueError(f"{name} row {index} has neither 'answer_index' nor a letter 'answer' "
                             f"(fields: {sorted(row)})")
        gold = LETTERS.index(letter.strip().upper())
    if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(options):
        raise ValueError(f"{name} row {index}: 'answer_index' must be an index into its {len(options)} options, "
                         f"got {gold!r}")
    if isinstance(letter, str) and letter.strip() and letter.strip().upper() != LETTERS[gold]:
        raise ValueError(f"{name} row {index}: 'answer' {letter!r} disagrees with 'answer_index' {gold} "
                         f"({LETTERS[gold]!r})")
    if options[gold] == "N/A":
        raise ValueError(f"{name} row {index}: the gold option (index {gold}) is 'N/A'")
    kept = [i for i, o in enumerate(options) if o != "N/A"]  # MMLU-Pro's own evaluation drops them
    return (question, [options[i] for i in kept], kept.index(gold),
            _extra(row, ("category", "src", "question_id")))


def parse_arc(row: Mapping[str, Any], index: int) -> Parsed:
    """An allenai/ai2_arc row (``question``, ``choices: {"text": [...], "label": [...]}``, ``answerKey``)."""
    name = "arc_c"
    question = _text(name, row, index, "question")
    choices = _field(name, row, index, "choices")
    if not isinstance(choices, Mapping) or "text" not in choices or "label" not in choices:
        raise ValueError(f"{name} row {index}: 'choices' must be {{'text': [...], 'label': [...]}}, got {choices!r}")
    texts = _options(name, index, "choices.text", _plain(choices["text"]))
    labels = [str(label).strip() for label in _plain(choices["label"])]
    if len(labels) != len(texts):
        raise ValueError(f"{name} row {index}: {len(texts)} choices.text but {len(labels)} choices.label")
    key = str(_field(name, row, index, "answerKey")).strip()
    if key not in labels:
        raise ValueError(f"{name} row {index}: answerKey {key!r} is none of the labels {labels}")
    return question, texts, labels.index(key), _extra(row, ("id",))


def gpqa_order(question: str, n: int = 4) -> list[int]:
    """The order GPQA's ``n`` answers are shown in (0: the correct one, 1..3: ``Incorrect
    Answer 1..3``): sorted by ``sha256("trace_gym/gpqa/<question>/<i>")``. A function of the
    question text alone, stable across runs, machines and Python versions."""
    return sorted(range(n), key=lambda i: hashlib.sha256(f"trace_gym/gpqa/{question}/{i}".encode()).digest())


def parse_gpqa(row: Mapping[str, Any], index: int) -> Parsed:
    """An Idavidrein/gpqa row (``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ...)."""
    name = "gpqa_diamond"
    question = _text(name, row, index, "Question")
    answers = [_text(name, row, index, key) for key in
               ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")]
    order = gpqa_order(question)
    return (question, [answers[i] for i in order], order.index(0),
            _extra(row, ("Record ID", "High-level domain", "Subdomain")))


#: The multiple-choice sets by suite name.
DATASETS: dict[str, ChoiceDataset] = {
    "mmlu_pro": ChoiceDataset("TIGER-Lab/MMLU-Pro", None, "test", 10, parse_mmlu_pro, "question_id"),
    "arc_c": ChoiceDataset("allenai/ai2_arc", "ARC-Challenge", "test", 5, parse_arc, "id"),
    "gpqa_diamond": ChoiceDataset("Idavidrein/gpqa", "gpqa_diamond", "train", 4, parse_gpqa, "Record ID"),
}


def format_prompt(question: str, options: list[str]) -> str:
    """The zero-shot prompt: the question, the lettered options, and where the letter goes.

    >>> print(format_prompt("2 + 2 = ?", ["3", "4"]))
    2 + 2 = ?
    <BLANKLINE>
    A. 3
    B. 4
    <BLANKLINE>
    Answer with the letter of the correct option (A-B) in \\boxed{}.
    """
    lines = "\n".join(f"{LETTERS[i]}. {option}" for i, option in enumerate(options))
    return (f"{question}\n\n{lines}\n\n"
            f"Answer with the letter of the correct option (A-{LETTERS[len(options) - 1]}) in \\boxed{{}}.")


def rows_to_tasks(name: str, rows: Iterable[Mapping[str, Any]]) -> list[Task]:
    """Rows of dataset ``name`` (a key of :data:`DATASETS`) in its hub schema, as tasks.

    Raises:
        ValueError: a row without a needed field, with a malformed one, or with more
            options than the set's letters (the message names the row).
    """
    spec = DATASETS[name]
    tasks = []
    for index, row in enumerate(rows):
        question, options, gold, metadata = spec.parse(row, index)
        if not 2 <= len(options) <= spec.max_options:
            raise ValueError(f"{name} row {index} has {len(options)} options; expected 2 to {spec.max_options}")
        ident = row.get(spec.id_field)
        ident = index if ident is None or ident == "" else ident
        tasks.append(Task(id=f"{name}/{ident}", prompt=format_prompt(question, options), answer=LETTERS[gold],
                          source=name, metadata={"question": question, "options": options,
                                                 "gold_text": options[gold], **metadata}))
    return tasks


def load_tasks(name: str, path: str | None = None, limit: int | None = None, split: str | None = None) -> list[Task]:
    """Tasks of the multiple-choice set ``name`` from ``path`` (a local file or folder in
    the hub schema) or, with ``path`` None, from the hub; the first ``limit`` rows only.

    Raises:
        ValueError: an unknown name or a malformed row (named).
        ImportError: no ``path`` and no ``datasets`` package.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown multiple-choice set {name!r}; expected one of {sorted(DATASETS)}")
    spec = DATASETS[name]
    rows = load_rows(name, path, split or spec.split, spec.hub_id, spec.config, limit,
                     local_hint=f"rows in the hub schema of {spec.hub_id}: docs/evaluation.md lists the "
                                "fields read")
    return rows_to_tasks(name, rows)


class _ChoiceEnvKwargs(Mapping):
    """MathPython's keyword arguments for a choice suite, ``{"grader": ChoiceGrader(letters)}``,
    built when read: the grader's module loads the math env package (about 1 s of sympy),
    which the suite table (``trace-gym eval --help``) must not pay."""

    def __init__(self, letters: str):
        self.letters = letters

    def _kwargs(self) -> dict[str, Any]:
        from environments.math_python.choice import ChoiceGrader

        return {"grader": ChoiceGrader(self.letters)}

    def __getitem__(self, key: str) -> Any:
        return self._kwargs()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("grader",))

    def __len__(self) -> int:
        return 1

    def __repr__(self) -> str:
        return f"{{'grader': ChoiceGrader({self.letters!r})}}"


def env_kwargs(name: str) -> Mapping[str, Any]:
    """The MathPython keyword arguments of suite ``name``: a choice grader over its letters
    (the Python tool stays, as in training; the system prompt is the math env's own)."""
    return _ChoiceEnvKwargs(DATASETS[name].letters)
