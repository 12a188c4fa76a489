"""Where a series changed: least-squares splits of a stretch of values. Pure functions.

One split point `k` divides `values` into `values[:k]` and `values[k:]`; the best split
is the one whose two pieces fit their own model with the least squared error (a mean for a
level shift, a line for a change of trend) or, for a change of noise, the greatest
likelihood of two variances. `k` is the index of the first value after the change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Values = Sequence[float] | npt.NDArray[np.float64]


def mean_shift(values: Values, min_size: int = 1) -> int | None:
    """The split of `values` into two pieces, each at least `min_size` long, with the
    least total squared error about each piece's mean (None: too few values)."""
    y = np.asarray(values, dtype=np.float64)
    n = len(y)
    if n < 2 * max(1, min_size):
        return None
    y = y - y.mean()
    c1 = np.cumsum(y)
    c2 = np.cumsum(y * y)
    k = np.arange(1, n, dtype=np.float64)  # left sizes
    left_sse = c2[:-1] - c1[:-1] ** 2 / k
    right_sum = c1[-1] - c1[:-1]
    right_sse = (c2[-1] - c2[:-1]) - right_sum**2 / (n - k)
    sse = left_sse + right_sse
    lo, hi = max(1, min_size), n - max(1, min_size)
    return lo + int(np.argmin(sse[lo - 1 : hi]))


def _line_sse(y: np.ndarray) -> float:
    """Squared error about the least-squares line (0 for fewer than 3 values)."""
    n = len(y)
    if n < 3:
        return 0.0
    x = np.arange(n, dtype=np.float64)
    x -= x.mean()
    yc = y - y.mean()
    sxx = float(x @ x)
    sxy = float(x @ yc)
    return max(0.0, float(yc @ yc) - sxy * sxy / sxx)


def trend_shift(values: Values, min_size: int = 3) -> int | None:
    """The split into two pieces (each at least `min_size` long) whose own least-squares
    lines leave the least squared error: where a flat series began to rise, or a rising
    one flattened (None: too few values)."""
    y = np.asarray(values, dtype=np.float64)
    n = len(y)
    m = max(2, min_size)
    if n < 2 * m:
        return None
    best, best_k = math.inf, None
    for k in range(m, n - m + 1):
        sse = _line_sse(y[:k]) + _line_sse(y[k:])
        if sse < best:
            best, best_k = sse, k
    return best_k


def variance_shift(values: Values, min_size: int = 3) -> int | None:
    """The split where the step-to-step noise changed: of the first differences, the split
    with the greatest likelihood of two normal variances (k_1 log s_1^2 + k_2 log s_2^2
    least). The index is into `values` (a difference i is the change from i to i + 1)."""
    y = np.asarray(values, dtype=np.float64)
    d = np.diff(y)
    n = len(d)
    m = max(2, min_size)
    if n < 2 * m:
        return None
    d = d - d.mean()
    floor = 1e-12 * max(1.0, float(np.abs(d).max(initial=0.0))) ** 2
    best, best_k = math.inf, None
    for k in range(m, n - m + 1):
        left, right = d[:k], d[k:]
        cost = k * math.log(max(float(left.var()), floor)) + (n - k) * math.log(
            max(float(right.var()), floor)
        )
        if cost < best:
            best, best_k = cost, k
    return None if best_k is None else best_k + 1


def _slope(y: np.ndarray) -> float:
    x = np.arange(len(y), dtype=np.float64)
    x -= x.mean()
    return float(x @ (y - y.mean()) / (x @ x))


def trend_onset(
    values: Values, rising: bool, min_size: int = 3, explained: float = 0.5
) -> int | None:
    """Where the trend of `values` changed, if it clearly did: the `trend_shift` split,
    kept only when two lines leave at most `1 - explained` of one line's squared error and
    the later line is steeper (`rising`) or flatter (not `rising`) than the earlier."""
    y = np.asarray(values, dtype=np.float64)
    k = trend_shift(y, min_size)
    if k is None:
        return None
    one = _line_sse(y)
    if one <= 1e-12 * max(1.0, float(np.abs(y).max(initial=0.0))) ** 2:
        return None  # a straight line: no change inside
    if _line_sse(y[:k]) + _line_sse(y[k:]) > (1 - explained) * one:
        return None
    before, after = _slope(y[:k]), _slope(y[k:])
    if (after <= before) if rising else (after >= before):
        return None
    return k


def variance_onset(values: Values, min_size: int = 3, ratio: float = 2.0) -> int | None:
    """Where the step-to-step noise of `values` rose, if it clearly did: the
    `variance_shift` split, kept only when the later differences' variance is at least
    `ratio` times the earlier's."""
    y = np.asarray(values, dtype=np.float64)
    k = variance_shift(y, min_size)
    if k is None:
        return None
    d = np.diff(y)
    left, right = d[: k - 1], d[k - 1 :]
    if len(left) < 2 or len(right) < 2 or float(right.var()) < ratio * float(left.var()):
        return None
    return k
