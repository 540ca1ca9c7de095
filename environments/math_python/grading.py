"""Final-answer extraction and math-verify equivalence, run in a sandboxed worker.

Extraction rules (:func:`extract_boxed_answer`):

1. The answer is the content of the **last** ``\\boxed{...}`` or ``\\fbox{...}`` in the
   response (braces balanced; ``\\boxed 5`` without braces takes the next token, less
   trailing ``.,;:``).
   Earlier boxes are ignored, so a model may revise its answer.
2. A response without a box has no answer (reward 0) under the default
   ``extraction="boxed"``. ``extraction="boxed_or_last_number"`` (for tiny models that
   rarely box, e.g. the offline CPU default) falls back to the last number in the
   response (:func:`extract_last_number`: an optionally signed integer, decimal or
   ``a/b`` fraction).
3. Before comparison (:func:`normalize_answer`) surrounding ``$``/``\\(\\)`` and
   whitespace are stripped, a gold given as a list is joined with ``", "`` (a single
   item is used as is), digit-group spaces are dropped (``1\\,000``, ``1{,}000`` -> ``1000``),
   and a plain number in ``e`` notation (``1.2e-3``) is rewritten as ``1.2\\times10^{-3}``,
   which math-verify's LaTeX parser understands.

Equivalence (:func:`verify_equivalent`): both sides are wrapped in ``\\boxed{}`` and
parsed by math-verify with ``LatexExtractionConfig`` then ``ExprExtractionConfig``;
``verify(gold, candidate)`` is called **gold first** (it is deliberately asymmetric: e.g.
a gold ``x=3`` accepts ``3``). math-verify's own normalisation handles ``\\text{}``,
units, ``\\dfrac``, percent, ``\\$``, thousands separators, intervals, sets and tuples.

:class:`Grader` runs that comparison in a persistent sandboxed :class:`Kernel` (sympy's
parser evaluates strings, and a pathological expression may not terminate): one call
costs milliseconds; a call that exceeds ``timeout_s`` kills the worker, counts as not
equivalent, and the next call starts a fresh worker.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from environments.math_python.sandbox import Kernel, KernelError, KernelLimits

_BOX = re.compile(r"\\(?:boxed|fbox)\s*(\{)|\\boxed[ \t]+([^\s$]+)")
_DIGIT_GROUP = re.compile(r"(?<=\d)(?:\\,|\\!|\\;|\\ |\{,\})(?=\d{3}(?!\d))")
_SCI = re.compile(r"^([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)[eE]([+-]?\d+)$")
_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))

#: Candidates longer than this (characters) are not parsed: graded as wrong.
MAX_ANSWER_CHARS = 1000


def extract_boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{}`` / ``\\fbox{}`` in ``text`` (``None`` if none)."""
    answer = None
    for m in _BOX.finditer(text):
        if m.group(2) is not None:
            answer = m.group(2).rstrip(".,;:")  # "\boxed 7." ends a sentence
            continue
        depth, i = 1, m.end(1)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            answer = text[m.end(1): i - 1]
    return None if answer is None else answer.strip()


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:/\d+)?(?![\w])")

#: Answer extraction modes of :meth:`Grader.grade`.
EXTRACTIONS = ("boxed", "boxed_or_last_number")


def extract_last_number(text: str) -> str | None:
    """The last plain number in ``text`` (``-3``, ``2.5``, ``7/2``), or ``None``."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def normalize_answer(answer: Any) -> str:
    """A gold or candidate answer as one LaTeX string (rules in the module docstring)."""
    if isinstance(answer, (list, tuple)):
        parts = [normalize_answer(a) for a in answer]
        return parts[0] if len(parts) == 1 else ", ".join(parts)
    text = str(answer).strip()
    boxed = extract_boxed_answer(text) if "\\boxed" in text or "\\fbox" in text else None
    if boxed is not None:
        text = boxed
    changed = True
    while changed:
        changed = False
        for left, right in _DELIMS:
            if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text, changed = text[len(left): len(text) - len(right)].strip(), True
    text = _DIGIT_GROUP.sub("", text)
    m = _SCI.match(text)
    if m:
        text = f"{m.group(1)}\\times10^{{{int(m.group(2))}}}"
    return text


def verify_equivalent(gold: str, candidate: str, timeout_s: int = 5) -> bool:
    """math-verify equivalence of two normalised answers, gold first (in this process)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=timeout_s)
    cand_parsed = parse("\\boxed{" + candidate + "}", extraction_config=config, parsing_timeout=timeout_s)
    if not gold_parsed or not cand_parsed:
        return False
    return bool(verify(gold_parsed, cand_parsed, timeout_seconds=timeout_s))


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one response.

    Attributes:
        correct: the extracted answer is equivalent to the gold.
        extracted: the last boxed answer as written (``None`` when there is none).
        gold: the normalised gold.
        reason: ``equivalent``, ``not_equivalent``, ``no_boxed_answer``, ``too_long``,
            ``timeout`` or ``grader_error: ...``.
    """

    correct: bool
    extracted: str | None
    gold: str
    reason: str

    def info(self) -> dict:
        return {"correct": self.correct, "extracted": self.extracted, "gold": self.gold, "reason": self.reason}


_WORKER_SETUP = f"""
import json
import sys
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))!r})
from environments.math_python.grading import verify_equivalent as _verify
def _grade(gold, candidate, timeout_s):
    try:
        print(json.dumps({{"equal": _verify(gold, candidate, timeout_s)}}))
    except Exception as exc:  # math-verify's own timeout or parse failure: not equivalent
        print(json.dumps({{"equal": False, "error": type(exc).__name__ + ": " + str(exc)[:200]}}))
_verify("x^2 + 1/2", "0.5 + x^{{2}}", 5)  # warm the parsers up inside the start-up allowance
"""


class Grader:
    """Grades answers in a persistent sandboxed worker; thread-safe.

    Args:
        timeout_s: wall-clock seconds per comparison before the worker is killed.
        isolate: sandbox the worker like a code kernel (own uid, no network).
    """

    _shared: "Grader | None" = None
    _shared_lock = threading.Lock()

    def __init__(self, timeout_s: float = 10.0, isolate: bool = True):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.isolate = isolate
        self.limits = KernelLimits(cell_timeout_s=self.timeout_s, cpu_time_s=10**7, memory_mb=2048,
                                   output_bytes=4096, startup_timeout_s=120.0)
        self._kernel: Kernel | None = None
        self._owner = os.getpid()
        self._lock = threading.Lock()

    @classmethod
    def shared(cls) -> "Grader":
        """One grader per host process (made on first use)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared._owner != os.getpid():
                cls._shared = cls()
            return cls._shared

    def _worker(self) -> Kernel:
        if self._kernel is None or not self._kernel.alive or self._owner != os.getpid():
            self._owner = os.getpid()
            kernel = Kernel(self.limits, isolate=self.isolate, preload=("sympy", "math_verify"))
            kernel.start(0)
            setup = kernel.execute(_WORKER_SETUP, timeout=self.limits.startup_timeout_s)
            if setup.status != "ok":
                kernel.close()
                raise KernelError(f"grader worker setup failed: {setup.error}")
            self._kernel = kernel
        return self._kernel

    def equivalent(self, gold: str, candidate: str) -> tuple[bool, str]:
        """(equal, reason) for two normalised answers."""
        if len(candidate) > MAX_ANSWER_CHARS:
            return False, "too_long"
        inner = max(1, int(self.timeout_s / 2))
        with self._lock:
            result = self._worker().execute(f"_grade({gold!r}, {candidate!r}, {inner})")
        if result.status == "timeout":
            return False, "timeout"
        if result.status != "ok":
            return False, f"grader_error: {result.error_name}"
        try:
            reply = json.loads(result.stdout.text().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return False, f"grader_error: unreadable reply {result.stdout.text()[:100]!r}"
        if "error" in reply:
            return False, f"grader_error: {reply['error']}"
        return bool(reply["equal"]), "equivalent" if reply["equal"] else "not_equivalent"

    def grade(self, response: str, gold: Any, extraction: str = "boxed") -> GradeResult:
        """Extract the final answer of ``response`` (see :data:`EXTRACTIONS`) and compare
        it with ``gold``."""
        if extraction not in EXTRACTIONS:
            raise ValueError(f"extraction must be one of {EXTRACTIONS}, got {extraction!r}")
        gold_text = normalize_answer(gold)
        extracted = extract_boxed_answer(response)
        if extracted is None and extraction == "boxed_or_last_number":
            extracted = extract_last_number(response)
        if extracted is None:
            return GradeResult(False, None, gold_text, "no_boxed_answer")
        correct, reason = self.equivalent(gold_text, normalize_answer(extracted))
        return GradeResult(correct, extracted, gold_text, reason)

    def grade_many(self, pairs: Sequence[tuple[str, Any]]) -> list[GradeResult]:
        return [self.grade(response, gold) for response, gold in pairs]

    def close(self) -> None:
        with self._lock:
            if self._kernel is not None:
                self._kernel.close()
                self._kernel = None
