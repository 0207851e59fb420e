"""Small statistics used across the paper-A experiments: pass@k, intervals, paired tests, budgets.

>>> round(pass_at_k(n=4, c=2, k=1), 3)
0.5
>>> round(gain_recovery(method=0.8, base=0.5, reference=0.9), 3)
0.75
>>> first_step_reaching([0, 8, 16, 24], [0.40, 0.44, 0.47, 0.52], 0.47)
16
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021) for n samples with c correct."""
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got k={k}")
    if n - c < k:
        return 1.0
    # product form avoids huge binomials
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_curve(correct_counts: Sequence[int], n: int) -> np.ndarray:
    """Mean unbiased pass@k over problems for k = 1..n (index k-1)."""
    return np.array([np.mean([pass_at_k(n, c, k) for c in correct_counts]) for k in range(1, n + 1)])


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval across seeds; with one value the interval is (nan, nan)."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(_st.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Paired comparison of a - b across seeds: mean, t-interval, t statistic and two-sided p."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    diff = a - b
    mean, low, high = mean_ci(diff, level)
    if len(diff) < 2 or np.all(diff == diff[0]):
        t, p = math.nan, math.nan
    else:
        t, p = (float(v) for v in _st.ttest_rel(a, b))
    return {"mean": mean, "low": low, "high": high, "t": t, "p": p, "n": float(len(diff))}


def gain_recovery(method: float, base: float, reference: float) -> float:
    """(method - base) / (reference - base): the share of the reference's gain a method recovers."""
    if reference == base:
        raise ValueError("the reference run did not move from the base: gain recovery is undefined")
    return (method - base) / (reference - base)


def first_step_reaching(steps: Sequence[int], values: Sequence[float], target: float) -> int | None:
    """The first step whose value is >= target, or None if the curve never gets there."""
    for step, value in zip(steps, values, strict=True):
        if value >= target:
            return int(step)
    return None
