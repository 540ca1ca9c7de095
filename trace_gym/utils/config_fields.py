"""What a config field declares beside its help, and the check of a value against it.

A field is declared once (:mod:`trace_gym.config`): its type in the annotation, and in its
metadata (:func:`doc`) its help text, the range of a number (an :class:`Interval`, written
``[1, 1000000]``: finite bounds also declare the value finite, and NaN lies in no interval)
and, for a path the command writes to, whether it is a file or a folder. The loader holds
every value it reads to this (:func:`declared_problem`), and :func:`check_declared` holds a
config built in Python to the same.

Only the standard library: a leaf the loader and every config module import.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any, Callable

#: Deepest nesting of a dict-valued key (``env_kwargs``...) and of a YAML file.
MAX_CONFIG_DEPTH = 32
#: Largest count of anything a config sizes (roots, candidates, tasks, groups): past it the work
#: would not fit in memory or time, so a typo such as 10**15 is refused instead of run.
MAX_COUNT = 1_000_000
#: The range of every seed (numpy's and torch's seeds are unsigned; 32 bits are plenty).
SEEDS = "[0, 4294967295]"
#: What an output field holds: a file path or a folder path (checked when a command starts).
OUTPUT_KINDS = ("file", "folder")


@dataclasses.dataclass(frozen=True)
class Interval:
    """A declared range of a number field, written as in mathematics: ``[1, 1000000]``,
    ``(0, 1]``, ``[0, inf)``. A square bracket includes its bound, a round one excludes it;
    NaN lies in no interval, and infinity only behind a square ``inf`` bracket, so finite
    bounds declare the value finite."""

    low: float
    high: float
    low_open: bool
    high_open: bool
    text: str

    @classmethod
    def parse(cls, text: str) -> "Interval":
        m = re.fullmatch(r"\s*([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])\s*", text)
        if m is None:
            raise ValueError(f"an interval is written [a, b], (a, b], [a, b) or (a, b), got {text!r}")
        low, high = float(m.group(2)), float(m.group(3))
        if math.isnan(low) or math.isnan(high) or low > high:
            raise ValueError(f"interval {text!r} is empty")
        return cls(low, high, m.group(1) == "(", m.group(4) == ")", text.strip())

    def __contains__(self, x: float) -> bool:
        above = x > self.low if self.low_open else x >= self.low
        below = x < self.high if self.high_open else x <= self.high
        return bool(above and below)

    @property
    def finite(self) -> bool:
        """Whether every value in the interval is finite (no bound is an included infinity)."""
        return (math.isfinite(self.low) or self.low_open) and (math.isfinite(self.high) or self.high_open)

    def __str__(self) -> str:
        return self.text


def doc(text: str | Callable[[], str], *, within: str | None = None, output: str | None = None) -> dict[str, Any]:
    """Field metadata: the help text, and what the loader checks the value against.

    Args:
        text: the help text (``--help``), or a function that writes it when help is shown (a
            list of names that plugins and the face add to after import).
        within: the range of a number (every item of a tuple of numbers), an
            :class:`Interval` in its written form (``"[1, 1000000]"``); ``None`` passes any
            value of the type (strings, bools).
        output: ``"file"`` or ``"folder"``: the value is a path the command writes to; it
            must not be empty, and :func:`trace_gym.runs.output_paths.check_config_outputs`
            checks it when the command starts.
    """
    meta: dict[str, Any] = {"help": text}
    if within is not None:
        meta["within"] = Interval.parse(within)
    if output is not None:
        if output not in OUTPUT_KINDS:
            raise ValueError(f"output must be one of {OUTPUT_KINDS}, got {output!r}")
        meta["output"] = output
    return meta


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a one-line error message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def nesting_depth_over(value: Any, max_depth: int) -> bool:
    """Whether the lists and dicts of ``value`` nest more than ``max_depth`` levels (iterative:
    a value too deep to recurse into is measured without recursion)."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > max_depth:
                return True
            todo += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return False


def _number_word(tp: Any) -> str:
    """``an int`` or ``a finite number`` / ``a number``: what a declared range holds."""
    kinds = {a for a in (typing.get_args(tp) or (tp,)) if a is not type(None) and a is not Ellipsis}
    return "an int" if kinds == {int} else "a number"


def declared_problem(f: dataclasses.Field, tp: Any, value: Any) -> str | None:
    """Why an already-typed ``value`` breaks what field ``f`` declares (its range, or an
    empty output path), as ``expected ..., got ...``; ``None`` when it keeps to it."""
    within = f.metadata.get("within")
    if within is not None and value is not None:
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and item not in within:
                word = _number_word(tp)
                if word == "a number" and within.finite:
                    word = "a finite number"
                each = "every item to be " if isinstance(value, tuple) else ""
                return f"expected {each}{word} in {within}, got {shown(item)}"
    kind = f.metadata.get("output")
    if kind is not None and isinstance(value, str) and not value.strip():
        return f"expected a {kind} path, got {value!r} (empty)"
    return None


def check_declared(cfg: Any, prefix: str = "") -> None:
    """Hold a built config (one made in Python, not read by the loader) to what its fields
    declare; ``ValueError`` naming the first field that breaks it (``pool_size: expected ...``;
    ``prefix`` names a section's keys as the command line does, ``trainer.``)."""
    types_ = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        problem = declared_problem(f, types_[f.name], getattr(cfg, f.name))
        if problem is not None:
            raise ValueError(f"{prefix}{f.name}: {problem}")
