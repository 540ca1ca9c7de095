"""String hints for one-line errors: a leaf module every layer may import.

:func:`did_you_mean` turns a mistyped name into ``"; did you mean X?"`` so that an error
names the bad value and its closest known neighbours (a key, a flag, a model, an env id).
"""

from __future__ import annotations

from typing import Iterable

import re

__all__ = ["did_you_mean", "check_name", "NAME_PATTERN"]

#: What a registered name (strategy, predictor) may be: a letter or ``_``, then up to 63 of
#: letters, digits, ``_``, ``.`` and ``-`` (it becomes a table row, a flag value, a file name).
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest (up to 3) of ``known`` (difflib), else ``""``."""
    import difflib

    near = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {', '.join(near)}?" if near else ""


def check_name(kind: str, name: object) -> str:
    """``name`` when it matches :data:`NAME_PATTERN`, else ``ValueError`` naming ``kind`` and the value."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"a {kind} name must be a letter or _ then up to 63 letters, digits, _, . or -; "
                         f"got {name!r:.80}")
    return name
