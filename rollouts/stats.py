"""Intervals for resolved rates: one run's (Wilson's score interval) and the difference of two runs
on the same tasks (Newcombe's paired interval, built from Wilson's)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959964


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default): sound at 0/n and n/n, unlike the
    normal approximation."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class PairedDifference:
    """Two runs' outcomes on the same ``n`` tasks: ``both`` resolved, ``only_a``, ``only_b``,
    ``neither``; ``difference`` is A's resolved rate minus B's, ``ci95`` its interval."""

    n: int
    both: int
    only_a: int
    only_b: int
    neither: int
    difference: float
    ci95: tuple[float, float]


def paired_difference(a: Sequence[bool], b: Sequence[bool], z: float = Z95) -> PairedDifference:
    """The difference of two resolved rates on the same tasks (``a[i]``, ``b[i]``: task i resolved
    in run A, in run B), with Newcombe's interval for paired proportions (his method 10: Wilson
    intervals of each rate, joined through the correlation of the pairs), which, unlike two runs'
    intervals side by side, credits the pairing: a task both runs solve says nothing of which is
    better. Newcombe, R. G. (1998), Statistics in Medicine 17:2635-2650."""
    if len(a) != len(b):
        raise ValueError("paired outcomes need the same tasks in both runs")
    n = len(a)
    both = sum(x and y for x, y in zip(a, b, strict=True))
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    neither = n - both - only_a - only_b
    if n == 0:
        return PairedDifference(0, 0, 0, 0, 0, 0.0, (-1.0, 1.0))
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    l1, u1 = wilson(both + only_a, n, z)
    l2, u2 = wilson(both + only_b, n, z)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = (both * neither - only_a * only_b) / math.sqrt(margins) if margins else 0.0
    delta = p1 - p2
    low = delta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = delta + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return PairedDifference(n, both, only_a, only_b, neither, delta, (max(-1.0, low), min(1.0, high)))
