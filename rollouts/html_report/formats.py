"""Number formats of the HTML report: one per kind of number, used everywhere (the tests use them too).

Each takes whatever ``report.json`` holds and gives text; anything that is not a finite number
(missing, ``null``, a string, a boolean) is shown as ``—``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

OUTCOMES = ("resolved", "unresolved", "masked")


def num(value: Any) -> float | None:
    """``value`` if it is a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _shown(value: Any, text: Callable[[float], str]) -> str:
    v = num(value)
    return "—" if v is None else text(v)


def fmt_rate(value: Any) -> str:
    """A fraction as a percentage with one decimal: 0.5 -> ``50.0%``."""
    return _shown(value, lambda v: f"{v * 100:.1f}%")


def fmt_int(value: Any) -> str:
    """A count with thousands separators: 1234 -> ``1,234``."""
    return _shown(value, lambda v: f"{v:,}" if isinstance(v, int) else f"{v:,.1f}")


def fmt_cost(value: Any) -> str:
    """US dollars with four decimals: 0.0123 -> ``$0.0123``."""
    return _shown(value, lambda v: f"${v:,.4f}")


def fmt_seconds(value: Any) -> str:
    """Seconds with one decimal: 12.34 -> ``12.3``."""
    return _shown(value, lambda v: f"{v:,.1f}")


def fmt_cpu(value: Any) -> str:
    """CPU seconds with three decimals (an environment's are often under 0.1 s): 0.0812 -> ``0.081``."""
    return _shown(value, lambda v: f"{v:,.3f}")


def fmt_mib(value: Any) -> str:
    """Bytes in MiB, whole: 33951744 -> ``32 MiB``."""
    return _shown(value, lambda v: f"{v / 2**20:,.0f} MiB")


def fmt_ci(value: Any) -> str:
    """A confidence interval ``[low, high]`` as two percentages: ``9.0% – 91.0%``."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(num(x) is not None for x in value):
        return f"{fmt_rate(value[0])} – {fmt_rate(value[1])}"
    return "—"


def raw(value: Any) -> str:
    """The raw JSON value for a ``data-value`` attribute (``null`` for what JSON cannot hold)."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return "null"


def outcome_class(outcome: Any) -> str:
    """The CSS class of an outcome's badge and bar: ``o-resolved``, ..., ``o-other`` for anything else."""
    return f"o-{outcome}" if outcome in OUTCOMES else "o-other"
