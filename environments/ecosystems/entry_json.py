"""A reasoning-gym dataset entry as JSON and back (:func:`to_json`, :func:`from_json`).

An entry crosses two boundaries as JSON: into a task's metadata (a bank, a run dir) and
into the sandboxed scoring kernel (:mod:`environments.ecosystems.sandboxed_scoring`),
which cannot import the project and gets :func:`from_json`'s own source. So
:func:`from_json` uses only the tags and ``Mapping`` defined here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the tags of :func:`to_json` (a tuple; a dict whose keys are not all strings)
TUPLE_TAG, ITEMS_TAG = "__tuple__", "__items__"


def to_json(obj: Any, where: str = "entry") -> Any:
    """A JSON-serialisable form of a dataset entry that :func:`from_json` turns back into
    an equal object: tuples as ``{"__tuple__": [...]}``, dicts with non-string keys as
    ``{"__items__": [[k, v], ...]}``, numpy scalars as Python ones.

    Raises:
        TypeError: a value with no JSON form (a set, an array, an object), naming where.
    """
    import numpy as np

    if obj is None:
        return None
    for kind in (str, bool, int, float):  # bool before int; subclasses (np.str_, np.float64) as the base
        if isinstance(obj, kind):
            return kind(obj)
    if isinstance(obj, np.generic):
        return to_json(obj.item(), where)
    if isinstance(obj, list):
        return [to_json(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {TUPLE_TAG: [to_json(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (len(obj) == 1 and next(iter(obj)) in (TUPLE_TAG, ITEMS_TAG)):
            return {str(k): to_json(v, f"{where}[{k!r}]") for k, v in obj.items()}
        return {ITEMS_TAG: [[to_json(k, f"{where} key"), to_json(v, f"{where}[{k!r}]")] for k, v in obj.items()]}
    raise TypeError(f"{where} is a {type(obj).__name__}, which has no JSON form here")


def from_json(obj: Any) -> Any:
    """The inverse of :func:`to_json` (a fresh object: nothing is shared with ``obj``)."""
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    if isinstance(obj, Mapping):
        if len(obj) == 1 and TUPLE_TAG in obj:
            return tuple(from_json(v) for v in obj[TUPLE_TAG])
        if len(obj) == 1 and ITEMS_TAG in obj:
            return {from_json(k): from_json(v) for k, v in obj[ITEMS_TAG]}
        return {k: from_json(v) for k, v in obj.items()}
    return obj
