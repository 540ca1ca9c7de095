"""Gymnasium spaces for text actions and chat-message observations.

An agent env's action is the model's raw text for one turn and its observation is a
list of :class:`~trace_gym.types.Message`. Gymnasium's built-in ``Text`` space limits
the charset, so these two small spaces say exactly what is allowed.
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

from trace_gym.types import ROLES, Message

_SAMPLE_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"


class TextAction(spaces.Space[str]):
    """Any ``str`` of at most ``max_length`` characters (unicode allowed).

    ``sample()`` draws printable ASCII text, enough to exercise an env's parser with
    inputs that are almost always malformed.
    """

    def __init__(self, max_length: int = 65536, seed: int | np.random.Generator | None = None):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=length)
        return "".join(_SAMPLE_ALPHABET[i] for i in idx)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextAction(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextAction) and other.max_length == self.max_length


class ChatObservation(spaces.Space[list]):
    """A list of :class:`Message` with valid roles and ``str`` content."""

    def __init__(self, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        return [Message("user", TextAction(seed=int(self.np_random.integers(2**31))).sample())]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, Message) and m.role in ROLES and isinstance(m.content, str) for m in x
        )

    def __repr__(self) -> str:
        return "ChatObservation()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ChatObservation)

