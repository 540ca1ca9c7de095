"""String hints for one-line errors: a leaf module every layer may import.

:func:`did_you_mean` turns a mistyped name into ``"; did you mean X?"`` so that an error
names the bad value and its closest known neighbours (a key, a flag, a model, an env id).
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest (up to 3) of ``known`` (difflib), else ``""``."""
    import difflib

    near = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {', '.join(near)}?" if near else ""
