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
   a plain number in ``e`` notation (``1.2e-3``) is rewritten as ``1.2\\times10^{-3}``,
   which math-verify's LaTeX parser understands, and every percent sign is dropped
   (rule 4).
4. **Percent is a unit, not a scale** (:func:`drop_percent`): ``\\%``, ``%`` and the
   words ``percent``/``percentage``/``pct`` (bare or in ``\\text{}``/``\\mathrm{}``) are
   removed from the gold and the candidate alike, so ``5\\%`` means 5: it matches the
   golds ``5`` and ``5\\%``, never ``0.05`` or ``\\frac{1}{20}``. This is the MATH
   convention (Hendrycks' ``strip_string``, PRM800K's grader, DeepScaleR's reward, whose
   corpus the paper trains on). math-verify alone reads an integer percent both ways
   (``5\\%`` equals 5 and 0.05) and a decimal one as a fraction (``2.5\\%`` equals 0.025
   only): a policy unsure of the scale would add ``%`` and be paid for either gold. One
   reading for every answer means that no answer is equivalent to two golds that
   differ; we keep the one that pays the answers of "what percent" questions written
   with or without the sign.

Equivalence (:func:`verify_equivalent`): both sides are wrapped in ``\\boxed{}`` and
parsed by math-verify with ``LatexExtractionConfig`` then ``ExprExtractionConfig``;
``verify(gold, candidate)`` is called **gold first** (it is deliberately asymmetric: e.g.
a gold ``x=3`` accepts ``3``). math-verify's own normalisation handles ``\\text{}``,
units, ``\\dfrac``, ``\\$``, thousands separators, intervals, sets and tuples (percent
never reaches it: rule 4).

:class:`Grader` runs the comparison in a persistent sandboxed worker (sympy's parser
evaluates strings, and a pathological expression may not terminate), forked in
milliseconds from a fork server that has math-verify imported and warmed up; a call
costs about a millisecond. The worker never sees the project or any task data: it gets
the gold and the candidate as two strings. A call that exceeds ``timeout_s`` kills the
worker and counts as not equivalent (the answer's fault). A worker that died or cannot
start (an infrastructure fault: the machine killed it, the fork server died...) is
replaced by a fresh one and the answer regraded; if no worker could grade it after
``attempts`` tries, the result is an *infrastructure error* (``GradeResult.infra_error``):
its reward was not computed, and a trainer must exclude the episode instead of counting
it as wrong. One exception: a worker that dies *while grading this answer* on two
attempts was killed by the answer (a pathological expression), and the answer is wrong
(``grader_crashed``); otherwise a policy could learn to dodge wrong answers by crashing
the grader, since excluded episodes carry no penalty.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from environments.math_python.sandbox import Kernel, KernelError, KernelLimits
from environments.math_python.zygote import ForkServer

_BOX = re.compile(r"\\(?:boxed|fbox)\s*(\{)|\\boxed[ \t]+([^\s$]+)")
_DIGIT_GROUP = re.compile(r"(?<=\d)(?:\\,|\\!|\\;|\\ |\{,\})(?=\d{3}(?!\d))")
_SCI = re.compile(r"^([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)[eE]([+-]?\d+)$")
_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_PERCENT_WORD = r"(?:\\?%|percentage|percent|pct)"
#: a percent sign or word, bare or in a text wrapper (linear: every branch starts with a fixed character)
_PERCENT = re.compile(r"(?:\\(?:text|textrm|textnormal|mathrm|mbox|operatorname)\s*"
                      r"\{\s*" + _PERCENT_WORD + r"\s*\}|\\%|%|\b(?:percentage|percent|pct)\b)")

#: Candidates longer than this (characters) are not parsed: graded as wrong.
MAX_ANSWER_CHARS = 1000


def _closing_braces(text: str) -> dict[int, int]:
    """``{position of a "{": position of its "}"}`` for every balanced pair, in one pass."""
    closing, open_ = {}, []
    for i, ch in enumerate(text):
        if ch == "{":
            open_.append(i)
        elif ch == "}" and open_:
            closing[open_.pop()] = i
    return closing


def extract_boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{}`` / ``\\fbox{}`` in ``text`` whose braces close
    (``None`` if none). Linear in ``len(text)``: the braces are matched once, not per box."""
    answer, closing = None, None
    for m in _BOX.finditer(text):
        if m.group(2) is not None:
            answer = m.group(2).rstrip(".,;:")  # "\boxed 7." ends a sentence
            continue
        closing = _closing_braces(text) if closing is None else closing
        end = closing.get(m.end(1) - 1)
        if end is not None:
            answer = text[m.end(1): end]
    return None if answer is None else answer.strip()


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:/\d+)?(?![\w])")

#: Answer extraction modes of :meth:`Grader.grade`.
EXTRACTIONS = ("boxed", "boxed_or_last_number")


def extract_last_number(text: str) -> str | None:
    """The last plain number in ``text`` (``-3``, ``2.5``, ``7/2``), or ``None``."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def drop_percent(text: str) -> str:
    """``text`` without its percent signs and words (rule 4 of the module docstring):
    ``5\\%``, ``5 \\text{ percent}``, ``5\\,\\%`` -> ``5``."""
    return _PERCENT.sub("", text).strip()


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
    text = _DIGIT_GROUP.sub("", drop_percent(text))
    m = _SCI.match(text)
    if m:
        text = f"{m.group(1)}\\times10^{{{int(m.group(2))}}}"
    return text


#: The grader worker's code: sent as source to the sandboxed fork server (which must not
#: import this project), and also run here by :func:`verify_equivalent`.
WORKER_SOURCE = """
import json as _json


def verify_equivalent(gold, candidate, timeout_s=5):
    \"\"\"math-verify equivalence of two normalised answers, gold first (in this process).\"\"\"
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold_parsed = parse("\\\\boxed{" + gold + "}", extraction_config=config, parsing_timeout=timeout_s)
    cand_parsed = parse("\\\\boxed{" + candidate + "}", extraction_config=config, parsing_timeout=timeout_s)
    if not gold_parsed or not cand_parsed:
        return False
    return bool(verify(gold_parsed, cand_parsed, timeout_seconds=timeout_s))


def _grade(gold, candidate, timeout_s):
    try:
        print(_json.dumps({"equal": verify_equivalent(gold, candidate, timeout_s)}))
    except Exception as exc:  # math-verify's own timeout or parse failure: not equivalent
        print(_json.dumps({"equal": False, "error": type(exc).__name__ + ": " + str(exc)[:200]}))
"""
#: Run once in the fork server: warms math-verify's parsers for every worker.
WORKER_WARMUP = WORKER_SOURCE + 'verify_equivalent("x^2 + 1/2", "0.5 + x^{2}", 5)\n'

_LOCAL: dict = {}


def verify_equivalent(gold: str, candidate: str, timeout_s: int = 5) -> bool:
    """math-verify equivalence of two normalised answers, gold first (in this process)."""
    if not _LOCAL:
        exec(compile(WORKER_SOURCE, "<grader worker>", "exec"), _LOCAL)
    return _LOCAL["verify_equivalent"](gold, candidate, timeout_s)


@dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one response.

    Attributes:
        correct: the extracted answer is equivalent to the gold.
        extracted: the last boxed answer as written (``None`` when there is none).
        gold: the normalised gold.
        reason: ``equivalent``, ``not_equivalent``, ``no_boxed_answer``, ``too_long``,
            ``timeout``, ``grader_error: ...`` (math-verify failed on the answer),
            ``grader_crashed: ...`` (the answer killed the worker twice) or
            ``infrastructure_error: ...``.
        infra_error: the verdict could not be computed (no worker could grade it):
            ``correct`` is False but means nothing; exclude the episode.
        attempts: workers used (more than 1 when a worker died and it was regraded).
    """

    correct: bool
    extracted: str | None
    gold: str
    reason: str
    infra_error: bool = False
    attempts: int = 1

    def info(self) -> dict:
        return {"correct": self.correct, "extracted": self.extracted, "gold": self.gold, "reason": self.reason,
                "infra_error": self.infra_error, "attempts": self.attempts}


class Grader:
    """Grades answers in a persistent sandboxed worker, replaced whenever it dies; thread-safe.

    Args:
        timeout_s: wall-clock seconds per comparison before the worker is killed.
        isolate: sandbox the worker like code kernels (own uid, no network, no project).
        attempts: workers tried per answer when workers die (infrastructure faults).
        server: the fork server of the workers; default: the process-wide one.
    """

    _shared: "Grader | None" = None

    def __init__(self, timeout_s: float = 10.0, isolate: bool = True, attempts: int = 2,
                 server: ForkServer | None = None):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.timeout_s = float(timeout_s)
        self.isolate, self.attempts = isolate, attempts
        self.limits = KernelLimits(cell_timeout_s=self.timeout_s, cpu_time_s=10**7, memory_mb=2048,
                                   output_bytes=4096, startup_timeout_s=120.0)
        self.server = server or ForkServer.shared(isolate=isolate, preload=("sympy", "math_verify"),
                                                  warmup=WORKER_WARMUP)
        self._worker: Kernel | None = None
        self._busy = self._starting = False
        self._lock = threading.Lock()

    @classmethod
    def shared(cls) -> "Grader":
        """One grader per host process (its fork server is per process already)."""
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    def start_background(self) -> None:
        """Start the worker (and its fork server: ~2 s of imports) in a background
        thread, so that the first grading does not wait for it."""
        if self._starting or self.worker_pid is not None:
            return
        self._starting = True
        threading.Thread(target=self._warm, daemon=True, name="grader-start").start()

    def _warm(self) -> None:
        try:
            with self._lock:
                if self._worker is None or not self._worker.alive:
                    self._worker = Kernel(self.limits, server=self.server, seed=0)
                    self._worker.wait_ready()
        except KernelError:
            self._worker = None  # the first grading tries again, and reports it if it must
        finally:
            self._starting = False

    @property
    def worker_pid(self) -> int | None:
        """The worker's pid (``None`` before the first grading or after it died)."""
        worker = self._worker
        return worker.pid if worker is not None and worker.alive else None

    @property
    def grading(self) -> bool:
        """Whether the worker is grading right now."""
        return self._busy

    def _attempt(self, gold: str, candidate: str) -> tuple[bool | None, str]:
        """One worker's verdict: (equal, reason), or (None, why) when the worker failed."""
        inner = max(1, int(self.timeout_s / 2))
        with self._lock:
            try:
                if self._worker is None or not self._worker.alive:
                    self._worker = Kernel(self.limits, server=self.server, seed=0)
                self._worker.wait_ready()
            except KernelError as exc:
                self._worker = None
                return None, f"no grader worker: {exc}"
            self._busy = True
            try:
                result = self._worker.execute(f"_grade({gold!r}, {candidate!r}, {inner})")
            finally:
                self._busy = False
        if result.status == "timeout":
            return False, "timeout"
        if result.status != "ok":
            return None, f"grader worker {result.status}: {result.error}"
        try:
            reply = json.loads(result.stdout.text().strip().splitlines()[-1])
            equal = reply["equal"]
        except (ValueError, IndexError, KeyError, TypeError):
            return None, f"unreadable grader reply {result.stdout.text()[:100]!r}"
        if "error" in reply:
            return False, f"grader_error: {reply['error']}"
        return bool(equal), "equivalent" if equal else "not_equivalent"

    def equivalent_result(self, gold: str, candidate: str) -> tuple[bool, str, bool, int]:
        """(equal, reason, infra_error, attempts) for two normalised answers."""
        if len(candidate) > MAX_ANSWER_CHARS:
            return False, "too_long", False, 0
        why, crashes = "", 0
        for attempt in range(1, self.attempts + 1):
            equal, reason = self._attempt(gold, candidate)
            if equal is not None:
                return equal, reason, False, attempt
            why = reason
            crashes += reason.startswith("grader worker crashed")
        if crashes >= 2:  # it died *on this answer* every time: the answer's doing, not the machine's
            return False, f"grader_crashed: {why}", False, self.attempts
        return False, f"infrastructure_error: {why}", True, self.attempts

    def equivalent(self, gold: str, candidate: str) -> tuple[bool, str]:
        """(equal, reason) for two normalised answers."""
        equal, reason, _, _ = self.equivalent_result(gold, candidate)
        return equal, reason

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
        correct, reason, infra, attempts = self.equivalent_result(gold_text, normalize_answer(extracted))
        return GradeResult(correct, extracted, gold_text, reason, infra, attempts)

    def grade_many(self, pairs: Sequence[tuple[str, Any]]) -> list[GradeResult]:
        return [self.grade(response, gold) for response, gold in pairs]

    def close(self) -> None:
        """Kill the worker (the fork server is shared by the process)."""
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None
