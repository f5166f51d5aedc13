"""Spaces for text environments that hold what programs really print."""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces

# What sample() draws from; contains() accepts any Unicode (gymnasium's Text only holds its charset).
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n\téß日本語→✓"


class UnicodeText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` holding any Unicode string of ``min_length``..``max_length``
    characters, the empty string included (tool output is often empty).

    Text cannot travel through Gymnasium's shared memory (strings are immutable and the buffer
    holds charset indices), so vector environments need ``AsyncVectorEnv(..., shared_memory=False)``.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length=max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

