"""Percentiles and the median-of-repetitions summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; `sorted_values` must be sorted."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def distribution(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds of values in seconds."""
    ordered = sorted(v * 1000 for v in values_s)
    return {
        "p50": percentile(ordered, 0.50),
        "p95": percentile(ordered, 0.95),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1] if ordered else math.nan,
    }


def median(values: Sequence[float]) -> float:
    return percentile(sorted(values), 0.5)
