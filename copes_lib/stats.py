"""Statistics for every claim: pass@k, intervals, the seeds x problems noise model, Holm, TOST, MDE.

>>> round(pass_at_k(n=4, c=2, k=1), 3)
0.5
>>> round(gain_recovery(method=0.8, base=0.5, reference=0.9), 3)
0.75
>>> first_step_reaching([0, 8, 16, 24], [0.40, 0.44, 0.47, 0.52], 0.47)
16
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _st():
    """scipy.stats, imported on first use: it costs 1-3 s, which every notebook kernel would pay at start
    (copes_lib.protocols imports this module) whether or not it runs a test."""
    from scipy import stats

    return stats


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


def slope_interval(x: Sequence[float], y: Sequence[float], lows: Sequence[float] | None = None,
                   highs: Sequence[float] | None = None, z: float = 1.96
                   ) -> tuple[float, float, float | None, float | None]:
    """Least-squares slope and intercept of ``y`` over ``x``, and the slope's interval from per-point
    intervals ``lows`` / ``highs`` (each read as a +-z standard-error interval; points independent, so
    their variances add); without per-point intervals the slope's bounds are None.

    >>> [round(v, 4) for v in slope_interval([0, 1, 2], [0.0, 1.0, 2.0], [-0.196, 0.804, 1.804],
    ...                                      [0.196, 1.196, 2.196])]  # se 0.1 each: half-width 1.96 * 0.1 / sqrt(2)
    [1.0, 0.0, 0.8614, 1.1386]
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx = x - x.mean()
    sxx = float((dx ** 2).sum())
    slope = float((dx * y).sum() / sxx)
    intercept = float(y.mean() - slope * x.mean())
    if lows is None or highs is None:
        return slope, intercept, None, None
    se = (np.asarray(highs, dtype=float) - np.asarray(lows, dtype=float)) / (2 * z)
    half = z * float(math.sqrt(((dx ** 2) * se ** 2).sum()) / sxx)
    return slope, intercept, slope - half, slope + half


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t interval across seeds; with one value the interval is (nan, nan)."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(_st().t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
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
        t, p = (float(v) for v in _st().ttest_rel(a, b))
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


# ============================================================================ claims' statistics
# Every claim compares two methods evaluated on the SAME problems, each trained with several seeds:
# a score array of shape (seeds, problems) per method (0/1 accuracy, F1, a per-chunk log-PPL...).
# Two sources of noise move the difference of the means: the training seed (a rerun trains another
# model) and the evaluation set (another draw of problems scores differently). A t-test over seed means
# counts only the first; a test over problems with one seed counts only the second.
#
# The model: score[s, p] = mu + seed_s + problem_p + residual_sp (a crossed random-effects design,
# applied to the per-cell difference when seeds are paired). The variance of the grand mean is
#     Var = sigma_seed^2 / S + sigma_problem^2 / P + sigma_residual^2 / (S P),
# estimated from the two-way ANOVA mean squares (MS_seed, MS_problem, MS_residual) as
#     se^2 = [MS_seed + max(0, MS_problem - MS_residual)] / (S P),
# i.e. the paired t-test over seed means (MS_seed / (S P) = var(seed means) / S) plus the problem-sampling
# variance it ignores. Degrees of freedom by Satterthwaite; S - 1 when the problem term is zero, so the
# test never claims more certainty than the seeds allow. With 3 to 5 seeds this is better calibrated
# than a percentile bootstrap over seeds (which has 10 to 126 distinct seed resamples and shrinks the
# seed variance by (S - 1) / S); the two-level bootstrap below is kept as a cross-check (same se for
# many seeds, tested) and for statistics that are not means.

ALPHA = 0.05
POWER = 0.8
EFFECT, EQUIVALENT, INCONCLUSIVE, OPPOSITE = "effect", "no effect (equivalent)", "inconclusive", "opposite"


def _as_scores(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=float)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(f"{name} must be a (seeds, problems) array, got shape {np.shape(x)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds non-finite scores")
    return arr


def _mean_squares(d: np.ndarray) -> tuple[float, float, float]:
    """Two-way ANOVA (no replication) mean squares of a (S, P) array: seed, problem, residual (nan if
    a factor has one level)."""
    s, p = d.shape
    grand, rows, cols = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_seed = p * float(((rows - grand) ** 2).sum()) / (s - 1) if s > 1 else math.nan
    ms_prob = s * float(((cols - grand) ** 2).sum()) / (p - 1) if p > 1 else math.nan
    if s > 1 and p > 1:
        resid = d - rows[:, None] - cols[None, :] + grand
        ms_res = float((resid ** 2).sum()) / ((s - 1) * (p - 1))
    else:
        ms_res = math.nan
    return ms_seed, ms_prob, ms_res


def _satterthwaite(terms: list[tuple[float, float]]) -> float:
    """df of a sum of (variance term, its df) pairs."""
    total = sum(t for t, _ in terms)
    denom = sum(t * t / df for t, df in terms if t != 0)
    return total * total / denom if denom > 0 else math.inf


# ---------------------------------------------------------------------------- latent units (clusters)
# On the miniature testbed problems are not independent draws: problems that share a latent unit (the
# subject name the warm start's prior keys on, ``Task.unit_id``) behave alike, so a method's gain can sit
# on a few units. With unit ids the problem axis is replaced by the unit axis: each unit's column is its
# linearised share of the mean (the ultimate-cluster / ratio-estimator linearisation:
# (unit total - estimate x unit size) / mean unit size + estimate, whose mean over units is the grand
# mean), and the crossed model above then runs over seeds x units. The unit term carries the variance
# between units AND the problems' sampling noise within them (a unit's total includes it), so the
# interval counts seeds, units and problems within units; df come from the number of units, not problems.
# With equal unit sizes a column is just the unit's mean.


def unit_codes(units: Sequence[Any], n_problems: int) -> tuple[np.ndarray, np.ndarray]:
    """(code of each problem's unit in 0..U-1, problems per unit) from one unit id per problem column."""
    ids = np.asarray(list(units)).astype(str)
    if ids.shape != (n_problems,):
        raise ValueError(f"units must give one unit id per problem column ({n_problems}), got {ids.size}")
    _, codes, sizes = np.unique(ids, return_inverse=True, return_counts=True)
    return codes.reshape(-1), sizes


def effective_units(sizes: Sequence[int]) -> float:
    """Kish's effective number of units, (sum n_u)^2 / sum n_u^2: the number of equal units that would give
    the same precision (equal to the unit count when every unit holds as many problems).

    >>> effective_units([4, 4, 4, 4]), round(effective_units([13, 1, 1, 1]), 2)
    (4.0, 1.49)
    """
    n = np.asarray(sizes, dtype=float)
    return float(n.sum() ** 2 / (n ** 2).sum())


def to_unit_columns(x: np.ndarray, codes: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """(seeds, problems) -> (seeds, units): each unit's linearised share of the grand mean (see above); the
    mean of the result equals the mean of ``x``.

    >>> to_unit_columns(np.array([[1.0, 0.0, 1.0, 1.0]]), np.array([0, 0, 1, 1]), np.array([2, 2]))
    array([[0.5, 1. ]])
    """
    totals = np.zeros((x.shape[0], len(sizes)))
    np.add.at(totals.T, codes, x.T)
    estimate = float(x.mean())
    mean_size = x.shape[1] / len(sizes)
    return (totals - estimate * sizes[None, :]) / mean_size + estimate


@dataclasses.dataclass(frozen=True)
class NoiseModel:
    """The standard error of mean(a) - mean(b) and what went into it."""

    estimate: float
    se: float
    df: float
    n_seeds: tuple[int, int]
    n_problems: int
    paired_seeds: bool
    seed_noise_counted: bool  # False when an arm has one seed: its training noise is not measured
    problem_noise_counted: bool  # False with one problem column (nested designs collapse to seed means)
    components: dict[str, float]  # variance of the estimate from each source
    n_units: int | None = None  # latent units the problems fall in (None: no unit ids, problems as units)
    n_units_effective: float | None = None  # Kish's effective number of units (effective_units)


def seed_problem_model(a: Any, b: Any, *, paired_seeds: bool | None = None, nested: bool = False,
                       units: Sequence[Any] | None = None) -> NoiseModel:
    """se and df of mean(a) - mean(b) for (seeds, problems) score arrays on the same problems.

    Seeds are paired (row i of a with row i of b) when both arms have the same number of seeds, unless
    ``paired_seeds=False``. ``nested=True`` is for designs where each seed draws its own problems (the
    sandbox): problems are then not shared across seeds, each seed's mean already carries its
    evaluation noise, and the test is over seed means. ``units`` (one latent-unit id per problem column)
    makes the model cluster-aware: seeds x units, with the problems' noise within units counted in the
    unit term (:func:`to_unit_columns`); ``n_problems`` stays the problem count, ``n_units`` says how
    many units the df and the interval rest on.
    """
    a, b = _as_scores(a, "a"), _as_scores(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must score the same problems, got {a.shape[1]} and {b.shape[1]} columns")
    if units is not None and not nested:
        codes, sizes = unit_codes(units, a.shape[1])
        a_cols, b_cols = to_unit_columns(a, codes, sizes), to_unit_columns(b, codes, sizes)
        model = seed_problem_model(a_cols, b_cols, paired_seeds=paired_seeds)
        components = {"seed": model.components["seed"], "unit": model.components["problem"]}
        return dataclasses.replace(model, n_problems=a.shape[1], components=components, n_units=len(sizes),
                                   n_units_effective=effective_units(sizes))
    if nested:
        a, b = a.mean(axis=1, keepdims=True), b.mean(axis=1, keepdims=True)
    (sa, p), sb = a.shape, b.shape[0]
    if paired_seeds is None:
        paired_seeds = sa == sb
    if paired_seeds and sa != sb:
        raise ValueError(f"paired seeds need equal seed counts, got {sa} and {sb}")
    estimate = float(a.mean() - b.mean())
    if paired_seeds:
        ms_seed, ms_prob, ms_res = _mean_squares(a - b)
        # E[MS_seed] = P sigma_seed^2 + sigma_res^2 >= sigma_res^2: with few seeds MS_seed can come out
        # near 0 by chance (two seeds with equal means), which would claim a certainty the residual
        # noise alone denies; MS_res is its floor.
        if sa > 1 and p > 1:
            ms_seed = max(ms_seed, ms_res)
        seed_var = ms_seed / (sa * p) if sa > 1 else 0.0
        prob_var = 0.0
        if p > 1:  # with one seed the problem term is var(column means) / P, the residual inseparable
            prob_var = max(0.0, ms_prob - (ms_res if sa > 1 else 0.0)) / (sa * p)
        terms = [(seed_var, sa - 1)] if sa > 1 else []
        if prob_var > 0:
            terms += [(ms_prob / (sa * p), p - 1)]
            if sa > 1:
                terms += [(-ms_res / (sa * p), (sa - 1) * (p - 1))]
        components = {"seed": seed_var, "problem": prob_var}
    else:
        parts = {name: _mean_squares(x) for name, x in (("a", a), ("b", b))}
        parts = {name: (max(ms[0], ms[2]) if x.shape[0] > 1 and p > 1 else ms[0], ms[1], ms[2])
                 for (name, ms), x in zip(parts.items(), (a, b))}  # the same floor as above, per arm
        seed_var = sum(ms[0] / (x.shape[0] * p) for ms, x in ((parts["a"], a), (parts["b"], b)) if x.shape[0] > 1)
        cols = a.mean(axis=0) - b.mean(axis=0)
        resid = sum(ms[2] / (x.shape[0] * p) for ms, x in ((parts["a"], a), (parts["b"], b))
                    if x.shape[0] > 1 and p > 1)
        col_var = float(cols.var(ddof=1)) / p if p > 1 else 0.0
        prob_var = max(0.0, col_var - resid)
        terms = [(ms[0] / (x.shape[0] * p), x.shape[0] - 1) for ms, x in ((parts["a"], a), (parts["b"], b))
                 if x.shape[0] > 1]
        if prob_var > 0:
            terms += [(col_var, p - 1)]
        components = {"seed": seed_var, "problem": prob_var}
    se = math.sqrt(seed_var + prob_var)
    df = _satterthwaite(terms) if terms else math.inf
    if sa > 1 and sb > 1:
        df = max(df, min(sa, sb) - 1)  # the floor the seeds alone allow (Satterthwaite can dip below)
    return NoiseModel(estimate, se, df, (sa, sb), p, bool(paired_seeds), sa > 1 and sb > 1, p > 1, components)


def problem_weights(rng: np.random.Generator, n_problems: int, n_boot: int,
                    units: Sequence[Any] | None = None) -> np.ndarray:
    """(n_boot, problems) resampling counts: problems drawn with replacement; with ``units``, units drawn
    with replacement and, within each drawn unit, its problems drawn with replacement (a two-stage
    cluster bootstrap: c draws of a unit of n problems = n c problem draws from it)."""
    if units is None:
        return rng.multinomial(n_problems, np.full(n_problems, 1.0 / n_problems), size=n_boot)
    codes, sizes = unit_codes(units, n_problems)
    n_units = len(sizes)
    draws = rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n_boot)  # (n_boot, U)
    weights = np.zeros((n_boot, n_problems), dtype=np.int64)
    for u in range(n_units):
        members = np.flatnonzero(codes == u)
        weights[:, members] = rng.multinomial(draws[:, u] * sizes[u], np.full(sizes[u], 1.0 / sizes[u]))
    return weights


def hierarchical_bootstrap(a: Any, b: Any, *, n_boot: int = 2000, seed: int = 0,
                           paired_seeds: bool | None = None, units: Sequence[Any] | None = None) -> np.ndarray:
    """Replicates of mean(a) - mean(b) under two-level resampling: seeds and problems are drawn with
    replacement, independently (the crossed "pigeonhole" bootstrap, Owen 2007), problems jointly for
    both arms (they are the same problems), seeds jointly when paired; with ``units`` the problems are
    drawn by unit (:func:`problem_weights`: units, then problems within units), so three levels. Seeded;
    vectorised as counts: a replicate's mean is w_seed @ scores @ w_problem / (S sum(w_problem))."""
    a, b = _as_scores(a, "a"), _as_scores(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must score the same problems, got {a.shape[1]} and {b.shape[1]} columns")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    (sa, p), sb = a.shape, b.shape[0]
    paired_seeds = sa == sb if paired_seeds is None else paired_seeds
    rng = np.random.default_rng(seed)
    w_prob = problem_weights(rng, p, n_boot, units)
    total = w_prob.sum(axis=1)
    w_a = rng.multinomial(sa, np.full(sa, 1.0 / sa), size=n_boot)
    if paired_seeds:
        if sa != sb:
            raise ValueError(f"paired seeds need equal seed counts, got {sa} and {sb}")
        return np.einsum("bs,sp,bp->b", w_a, a - b, w_prob) / (sa * total)
    w_b = rng.multinomial(sb, np.full(sb, 1.0 / sb), size=n_boot)
    return (np.einsum("bs,sp,bp->b", w_a, a, w_prob) / (sa * total)
            - np.einsum("bs,sp,bp->b", w_b, b, w_prob) / (sb * total))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone, capped at 1); nan stays nan and is not counted."""
    p = np.asarray(p_values, dtype=float)
    out = np.full_like(p, math.nan)
    valid = np.flatnonzero(~np.isnan(p))
    m, running = len(valid), 0.0
    for rank, i in enumerate(valid[np.argsort(p[valid], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def minimum_detectable_effect(se: float, df: float = math.inf, *, alpha: float = ALPHA,
                              power: float = POWER) -> float:
    """The smallest true difference a two-sided level-alpha test detects with the given power:
    (t_{1-alpha/2} + t_{power}) x se (the usual normal-theory approximation, Student t with df)."""
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha} and {power}")
    if not math.isfinite(se) or df <= 0:
        return math.nan
    dist = _st().t(df) if math.isfinite(df) else _st().norm
    return float((dist.ppf(1 - alpha / 2) + dist.ppf(power)) * se)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """mean(a) - mean(b) with both noise sources counted, and its verdict.

    verdict: ``effect`` (Holm-adjusted p < alpha, in the expected direction), ``opposite`` (significant,
    the other way), ``no effect (equivalent)`` (not significant and the (1 - 2 alpha) interval lies inside
    +-margin: TOST), else ``inconclusive``. A study that cannot measure seed noise (one seed in an arm) is
    inconclusive whatever its p. ``mde`` is at ``power`` and the Bonferroni level alpha / family size
    (Holm's strictest step), so it is what the family could detect for sure.
    """

    name: str
    estimate: float
    low: float  # (1 - alpha) two-sided interval
    high: float
    se: float
    df: float
    p: float
    p_holm: float
    mde: float
    verdict: str
    reason: str
    expected_sign: int = 1
    margin: float | None = None
    paper_effect: float | None = None  # the paper's effect in our units, if it has one
    tost_p: float | None = None
    n_seeds: tuple[int, int] = (0, 0)
    n_problems: int = 0
    seed_noise_counted: bool = True
    n_units: int | None = None  # latent units the interval rests on (None: no unit ids; problems as units)
    n_units_effective: float | None = None
    family_size: int = 1
    alpha: float = ALPHA
    power: float = POWER

    def describe(self, scale: float = 1.0, unit: str = "") -> str:
        f = lambda x: f"{x * scale:+.3g}{unit}"  # noqa: E731
        return (f"{self.name}: {f(self.estimate)} [{f(self.low)}, {f(self.high)}], p = {self.p:.2g}, "
                f"Holm p = {self.p_holm:.2g} ({self.family_size} tests); MDE {self.mde * scale:.3g}{unit} "
                f"at {self.power:.0%} power; {self.n_seeds[0]}/{self.n_seeds[1]} seeds x {self.n_problems} "
                f"problems -> {self.verdict}")


def _decide(c: Comparison) -> Comparison:
    alpha, m = c.alpha, max(1, c.family_size)
    mde = minimum_detectable_effect(c.se, c.df, alpha=alpha / m, power=c.power)
    width = c.high - c.low
    if not c.seed_noise_counted:
        verdict, reason = INCONCLUSIVE, "one training seed in an arm: seed noise is not measured"
    elif c.se == 0:
        # a difference with no variance at all (every seed and problem differ alike) says nothing about
        # the noise a rerun would meet: decide nothing rather than claim certainty
        verdict = INCONCLUSIVE
        reason = ("no variance at all (identical computations?)" if c.estimate == 0 else
                  "no variance in the scores: the noise cannot be estimated")
        if c.estimate == 0 and c.margin is not None and c.margin > 0:
            verdict, reason = EQUIVALENT, "identical scores: zero difference, zero variance"
    elif c.p_holm < alpha:
        verdict = EFFECT if c.estimate * c.expected_sign > 0 else OPPOSITE
        reason = f"Holm p = {c.p_holm:.2g} < {alpha}"
    elif c.tost_p is not None and c.tost_p < alpha:
        verdict, reason = EQUIVALENT, f"TOST p = {c.tost_p:.2g}: within +-{c.margin:.3g}"
    else:
        verdict = INCONCLUSIVE
        reason = f"Holm p = {c.p_holm:.2g}; interval width {width:.3g}"
        if c.paper_effect is not None and width > abs(c.paper_effect):
            reason += f" wider than the paper's effect {abs(c.paper_effect):.3g}"
        if c.margin is not None:
            reason += f"; not inside the equivalence margin +-{c.margin:.3g}"
        reason += f"; MDE {mde:.3g}"
    return dataclasses.replace(c, mde=mde, verdict=verdict, reason=reason)


def compare(a: Any, b: Any, *, name: str = "a - b", expected_sign: int = 1, margin: float | None = None,
            paper_effect: float | None = None, alpha: float = ALPHA, power: float = POWER,
            paired_seeds: bool | None = None, nested: bool = False, method: str = "model",
            n_boot: int = 2000, seed: int = 0, units: Sequence[Any] | None = None) -> Comparison:
    """Compare two methods scored on the same problems: a, b are (seeds, problems) arrays.

    ``expected_sign`` is the sign the claim predicts for mean(a) - mean(b); ``margin`` (> 0, in score
    units, declared before the run) enables the equivalence test; ``paper_effect`` (score units) is
    reported beside the interval. ``method``: ``model`` (crossed random effects, t with Satterthwaite df;
    the default) or ``bootstrap`` (two-level percentile bootstrap; see :func:`hierarchical_bootstrap`).
    ``units`` (one latent-unit id per problem column) makes the interval and test cluster-aware: seeds x
    units with the problems within units (:func:`seed_problem_model`; the bootstrap resamples units, then
    problems within them). The verdict is for a family of one; pass a family through :func:`holm_family`.
    """
    if expected_sign not in (1, -1):
        raise ValueError(f"expected_sign must be +1 or -1, got {expected_sign}")
    if margin is not None and not margin > 0:
        raise ValueError(f"margin must be > 0 (or None), got {margin}")
    if method not in ("model", "bootstrap"):
        raise ValueError(f"method must be 'model' or 'bootstrap', got {method!r}")
    model = seed_problem_model(a, b, paired_seeds=paired_seeds, nested=nested, units=units)
    est, se, df = model.estimate, model.se, model.df
    if method == "bootstrap":
        reps = hierarchical_bootstrap(a, b, n_boot=n_boot, seed=seed, paired_seeds=paired_seeds,
                                      units=None if nested else units)
        se, df = float(reps.std(ddof=1)), math.inf
        low, high = (float(v) for v in np.quantile(reps, [alpha / 2, 1 - alpha / 2]))
        p = min(1.0, 2 * min(float(np.mean(reps <= 0)), float(np.mean(reps >= 0))))
        tost_p = None
        if margin is not None:
            tost_p = max(float(np.mean(reps <= -margin)), float(np.mean(reps >= margin)))
    else:
        dist = _st().t(df) if math.isfinite(df) else _st().norm
        if se > 0:
            half = float(dist.ppf(1 - alpha / 2)) * se
            low, high = est - half, est + half
            p = float(2 * dist.sf(abs(est) / se))
            tost_p = None if margin is None else float(max(dist.sf((est + margin) / se),
                                                           dist.sf((margin - est) / se)))
        else:  # no variation at all in the scores: the test cannot estimate its noise, so it decides nothing
            low = high = est
            p = 1.0
            tost_p = None if margin is None else 1.0
    c = Comparison(name=name, estimate=est, low=low, high=high, se=se, df=df, p=p, p_holm=p, mde=math.nan,
                   verdict="", reason="", expected_sign=expected_sign, margin=margin, paper_effect=paper_effect,
                   tost_p=tost_p, n_seeds=model.n_seeds, n_problems=model.n_problems,
                   seed_noise_counted=model.seed_noise_counted, alpha=alpha, power=power,
                   n_units=model.n_units, n_units_effective=model.n_units_effective)
    return _decide(c)


def holm_family(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The same comparisons with Holm-adjusted p-values over the family, and their verdicts redone."""
    adjusted = holm([c.p for c in comparisons])
    return [_decide(dataclasses.replace(c, p_holm=ph, family_size=len(comparisons)))
            for c, ph in zip(comparisons, adjusted, strict=True)]


def planned_mde(a: Any, b: Any, *, n_seeds: int | None = None, n_problems: int | None = None,
                alpha: float = ALPHA, power: float = POWER, nested: bool = False) -> float:
    """The MDE of mean(a) - mean(b) for a study of n_seeds x n_problems (default: the observed sizes),
    with the variance components measured on a, b (paired seeds)."""
    a, b = _as_scores(a, "a"), _as_scores(b, "b")
    if nested:
        a, b = a.mean(axis=1, keepdims=True), b.mean(axis=1, keepdims=True)
    s, p = a.shape
    if b.shape != a.shape:
        raise ValueError(f"planned_mde needs paired arrays of equal shape, got {a.shape} and {b.shape}")
    if s < 2:
        raise ValueError("planned_mde needs >= 2 seeds to measure seed noise")
    n_s, n_p = n_seeds or s, n_problems or p
    if n_s < 2 or n_p < 1:
        raise ValueError(f"planned study needs n_seeds >= 2 and n_problems >= 1, got {n_s} and {n_p}")
    ms_seed, ms_prob, ms_res = _mean_squares(a - b)
    var_res = ms_res if p > 1 else 0.0
    var_seed = max(0.0, ms_seed - var_res) / p  # sigma_seed^2
    var_prob = max(0.0, ms_prob - var_res) / s if p > 1 else 0.0
    if p == 1:  # seed means only: their variance is all we can project
        var_seed = ms_seed
        n_p = 1
    se2 = var_seed / n_s + var_prob / n_p + var_res / (n_s * n_p)
    # expected mean squares of the planned design, for its df
    e_seed = var_res + n_p * var_seed
    e_prob = var_res + n_s * var_prob
    terms = [(e_seed / (n_s * n_p), n_s - 1)]
    if var_prob > 0 and n_p > 1:
        terms += [(e_prob / (n_s * n_p), n_p - 1), (-var_res / (n_s * n_p), (n_s - 1) * (n_p - 1))]
    df = max(_satterthwaite(terms), n_s - 1)
    return minimum_detectable_effect(math.sqrt(se2), df, alpha=alpha, power=power)


def power_note(a: Any, b: Any, *, n_seeds: int | None = None, n_problems: int | None = None,
               scale: float = 1.0, unit: str = "", alpha: float = ALPHA, power: float = POWER,
               nested: bool = False, units: Sequence[Any] | None = None) -> str:
    """One line for a notebook: the MDE of this comparison (and, given n_seeds / n_problems, of a planned
    study), with the share of variance from seeds vs problems; with ``units`` the MDE is the cluster-aware
    one (seeds x units, problems within them) and a planned study keeps the units and their sizes."""
    a_arr, b_arr = _as_scores(a, "a"), _as_scores(b, "b")
    if nested:
        a_arr, b_arr = a_arr.mean(axis=1, keepdims=True), b_arr.mean(axis=1, keepdims=True)
        units = None
    s, p = a_arr.shape
    model = seed_problem_model(a_arr, b_arr, units=units)
    now = minimum_detectable_effect(model.se, model.df, alpha=alpha, power=power)
    total = sum(model.components.values())
    where = f"{s} seeds x {p} problems" + (f" in {model.n_units} units" if model.n_units else "")
    if total <= 0 and not np.any(a_arr - b_arr):
        return (f"power: undefined: with {where} the two arms' per-problem scores are identical "
                "(no variance), so the noise and the smallest detectable difference cannot be estimated")
    share = model.components["seed"] / total if total > 0 else math.nan
    text = (f"power: with {where} the smallest difference detectable at {power:.0%} power "
            f"(alpha {alpha}) is {now * scale:.3g}{unit}; seeds carry {share:.0%} of the variance")
    if s < 2:
        return text.split(";")[0] + " (one seed: seed noise is not measured, so this is a lower bound)"
    if (n_seeds or n_problems) and units is not None and b_arr.shape == a_arr.shape:
        vc = variance_components(a_arr, b_arr, units)
        n_units = model.n_units or 1
        per_unit = max(1, round((n_problems or p) / n_units))
        se = math.sqrt(vc.variance_of_mean(n_seeds or s, n_units, per_unit))
        planned = minimum_detectable_effect(se, max(n_units - 1, 1), alpha=alpha, power=power)
        text += f"; with {n_seeds or s} seeds x {n_units} units x {per_unit} problems each: {planned * scale:.3g}{unit}"
    elif n_seeds or n_problems:
        planned = planned_mde(a_arr, b_arr, n_seeds=n_seeds, n_problems=n_problems, alpha=alpha, power=power)
        text += f"; with {n_seeds or s} seeds x {n_problems or p} problems: {planned * scale:.3g}{unit}"
    return text


# ---------------------------------------------------------------------------- power analysis over units
@dataclasses.dataclass(frozen=True)
class VarianceComponents:
    """The variance components of a per-problem difference score (method a - method b), from a pilot:

    d[s, p] = mu + seed_s + unit_u(p) + problem_p + residual_sp, with variances ``seed`` (a training seed's
    shift, shared by every problem), ``between_unit`` (a unit's shift, shared by its problems and seeds),
    ``within_unit`` (a problem's own shift inside its unit) and ``residual`` (seed x problem). The mean
    over S seeds, U units and m problems per unit then has variance
    seed / S + between_unit / U + within_unit / (U m) + residual / (S U m)."""

    between_unit: float
    within_unit: float
    seed: float
    residual: float = 0.0

    def __post_init__(self) -> None:
        for name in ("between_unit", "within_unit", "seed", "residual"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite variance >= 0, got {value}")

    def variance_of_mean(self, seeds: int, units: int, problems_per_unit: int) -> float:
        return (self.seed / seeds + self.between_unit / units + self.within_unit / (units * problems_per_unit)
                + self.residual / (seeds * units * problems_per_unit))


def variance_components(a: Any, b: Any, units: Sequence[Any]) -> VarianceComponents:
    """Method-of-moments estimates of :class:`VarianceComponents` from a pilot: a, b (seeds, problems) with
    paired seeds (row i of each), ``units`` one id per problem column. residual = the two-way ANOVA
    residual mean square; within_unit = the pooled within-unit variance of the problems' seed means less
    residual / S; between_unit = the variance of the unit means less their expected within-unit part;
    seed = the variance of the seed means less residual / P. Negative estimates are set to 0."""
    a, b = _as_scores(a, "a"), _as_scores(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"variance_components needs paired arrays of equal shape, got {a.shape} and {b.shape}")
    d = a - b
    s, p = d.shape
    codes, sizes = unit_codes(units, p)
    _, _, ms_res = _mean_squares(d)
    residual = ms_res if s > 1 and p > 1 else 0.0
    cols = d.mean(axis=0)
    unit_means = np.bincount(codes, weights=cols) / sizes
    within_ss = float(((cols - unit_means[codes]) ** 2).sum())
    within_df = p - len(sizes)
    within = max(0.0, within_ss / within_df - residual / s) if within_df > 0 else 0.0
    between = 0.0
    if len(sizes) > 1:
        expected_within = float(np.mean(within / sizes + residual / (s * sizes)))
        between = max(0.0, float(unit_means.var(ddof=1)) - expected_within)
    seed = max(0.0, float(d.mean(axis=1).var(ddof=1)) - residual / p) if s > 1 else 0.0
    return VarianceComponents(between_unit=between, within_unit=within, seed=seed, residual=residual)


@dataclasses.dataclass(frozen=True)
class DesignPlan:
    """The smallest number of units that decides at ``margin`` for a given number of seeds and problems per
    unit: its minimum detectable effect is <= margin (:func:`units_needed`)."""

    seeds: int
    problems_per_unit: int
    units: int | None  # None: no number of units up to max_units is enough (the seed term alone is too large)
    mde: float  # at that many units (at max_units when None)
    problems: int | None  # units x problems_per_unit


def _check_power(power: float, alpha: float) -> None:
    if not (isinstance(power, (int, float)) and 0 < power < 1):
        raise ValueError(f"power must be in (0, 1) (the probability of detecting an effect of the margin's size), "
                         f"got {power!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def units_needed(components: VarianceComponents, margin: float, *, seeds: int, problems_per_unit: int,
                 power: float = POWER, alpha: float = ALPHA, max_units: int = 100_000) -> DesignPlan:
    """The fewest units U such that a two-sided level-``alpha`` test of the mean difference, over ``seeds``
    seeds x U units x ``problems_per_unit`` problems, detects an effect of ``margin`` with probability
    ``power``: (t_{1-alpha/2} + t_power; df = U - 1) x se(U) <= margin, se from ``components``. The same se
    decides an equivalence test at +-margin with about that power when the true effect is 0. The seed term
    does not shrink with U: when it alone exceeds the margin no U is enough (``units`` None)."""
    _check_power(power, alpha)
    if not margin > 0:
        raise ValueError(f"margin must be > 0 (in score units), got {margin}")
    if seeds < 1 or problems_per_unit < 1:
        raise ValueError(f"seeds and problems_per_unit must be >= 1, got {seeds} and {problems_per_unit}")

    def mde(u: int) -> float:
        se = math.sqrt(components.variance_of_mean(seeds, u, problems_per_unit))
        return minimum_detectable_effect(se, max(u - 1, 1), alpha=alpha, power=power)

    if mde(max_units) > margin:
        return DesignPlan(seeds, problems_per_unit, None, mde(max_units), None)
    low, high = 2, max_units  # mde falls with U: bisect for the first U with mde <= margin
    if mde(low) <= margin:
        high = low
    while low < high:
        mid = (low + high) // 2
        if mde(mid) <= margin:
            high = mid
        else:
            low = mid + 1
    return DesignPlan(seeds, problems_per_unit, high, mde(high), high * problems_per_unit)


def power_plan(components: VarianceComponents, margin: float, *, seeds: Sequence[int] = (3, 5, 8),
               problems_per_unit: Sequence[int] = (2, 4, 8), power: float = POWER, alpha: float = ALPHA,
               max_units: int = 100_000) -> list[DesignPlan]:
    """:func:`units_needed` over a grid of seeds x problems per unit, fewest seeds first (a seed is a training
    run, a problem one evaluation), then fewest problems; designs no number of units can rescue last."""
    plans = [units_needed(components, margin, seeds=s, problems_per_unit=m, power=power, alpha=alpha,
                          max_units=max_units) for s in seeds for m in problems_per_unit]
    return sorted(plans, key=lambda d: (d.units is None, d.seeds, d.problems or 0))


@dataclasses.dataclass(frozen=True)
class GainRecovery:
    """(mean(method) - mean(base)) / (mean(reference) - mean(base)) with a percentile interval."""

    estimate: float
    low: float  # nan where the reference's gain is not established (its replicates reach 0)
    high: float
    note: str  # which noise sources the interval counts, and which it cannot


def gain_recovery_interval(scores: ScoreSet, method: str, *, base: str = "base", reference: str = "full_grpo",
                           level: float = 0.95, n_boot: int = 2000, seed: int = 0,
                           units: Sequence[Any] | None = None) -> GainRecovery:
    """Gain recovery of ``method`` with every noise source the design has: problems are resampled jointly
    for every arm (they are the same problems), each arm's seeds independently (its own training noise:
    the method's, and the reference's when it ran several seeds). An arm with one seed contributes no
    seed noise, and the note says so (the interval is then a lower bound on the true spread). Where a
    replicate's reference gain is <= 0 the ratio is undefined; when more than the interval's tail of
    replicates are, the interval is unbounded (nan). Where the reference's own gain is <= 0 the estimate
    is nan too (a ratio of two losses is not a recovery), with a note saying so. With unit ids (``units``,
    else the score set's own) problems are resampled by unit, then within units (:func:`problem_weights`)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    units = scores.units if units is None else units
    arms = {name: _as_scores(scores.arms[name], name) for name in (method, base, reference)}
    p = arms[method].shape[1]
    rng = np.random.default_rng(seed)
    w_prob = problem_weights(rng, p, n_boot, units)
    total = w_prob.sum(axis=1)
    means = {}
    for name, x in arms.items():
        s = x.shape[0]
        w_seed = rng.multinomial(s, np.full(s, 1.0 / s), size=n_boot) if s > 1 else np.ones((n_boot, 1))
        means[name] = np.einsum("bs,sp,bp->b", w_seed, x, w_prob) / (s * total)
    gain = means[reference] - means[base]
    point_gain = float(arms[reference].mean() - arms[base].mean())
    estimate = float((arms[method].mean() - arms[base].mean()) / point_gain) if point_gain > 0 else math.nan
    tail = (1 - level) / 2
    ok = gain > 0
    if np.mean(~ok) > tail or point_gain <= 0:
        low = high = math.nan
    else:
        ratio = (means[method][ok] - means[base][ok]) / gain[ok]
        low, high = (float(v) for v in np.quantile(ratio, [tail, 1 - tail]))
    one_seed = [name for name, x in arms.items() if x.shape[0] == 1 and name != base]
    note = ("interval over problems and seeds" if units is None else
            f"interval over {len(set(map(str, units)))} units, problems within them and seeds")
    if point_gain <= 0:
        note = f"undefined: the reference's gain over the base is {point_gain:+.3g} (not above 0)"
    if one_seed:
        note += f"; {', '.join(one_seed)} ran 1 seed: its seed noise is not measured, the interval is a lower bound"
    return GainRecovery(estimate, low, high, note)


# ============================================================================ per-problem score files
SCORES_FILE = "scores.npz"
_NAME = re.compile(r"^[a-z0-9_]+$")
_SEP = "::"


@dataclasses.dataclass(frozen=True)
class ScoreSet:
    """One metric's per-seed per-problem scores for each arm of a notebook."""

    metric: str
    arms: dict[str, np.ndarray]  # arm -> (seeds, problems)
    seeds: dict[str, tuple[int, ...]]  # arm -> the seed of each row
    nested: bool = False  # each seed draws its own problems (columns are not shared across seeds)
    units: tuple[str, ...] | None = None  # latent-unit id of each problem column (None: not recorded)

    def compare(self, a: str, b: str, **kwargs: Any) -> Comparison:
        """compare() of arm a against arm b; seeds are paired when both arms used the same seed list;
        cluster-aware over the score set's latent units when it records them."""
        for arm in (a, b):
            if arm not in self.arms:
                raise KeyError(f"metric {self.metric!r} has no arm {arm!r}; arms: {sorted(self.arms)}")
        kwargs.setdefault("paired_seeds", self.seeds[a] == self.seeds[b])
        kwargs.setdefault("nested", self.nested)
        kwargs.setdefault("units", self.units)
        return compare(self.arms[a], self.arms[b], **kwargs)


def save_scores(out_dir: str | Path, metric: str, arms: dict[str, Any], seeds: dict[str, Sequence[int]] |
                Sequence[int], *, nested: bool = False, units: Sequence[Any] | None = None) -> Path:
    """Add one metric's per-seed per-problem scores to ``<out_dir>/scores.npz`` (atomic write).

    ``arms``: arm name -> array (seeds, problems), every arm on the same problems in the same column
    order; ``seeds``: the seed of each row, one list for all arms or one per arm (rows with the same seed
    in two arms are paired); ``units``: the latent-unit id of each problem column (``Task.unit_id``), so
    the claims' intervals can resample units (:func:`compare`). Names are lower-case snake_case. A metric
    already in the file is refused: results are never silently overwritten.
    """
    if not _NAME.match(metric):
        raise ValueError(f"metric must be lower-case snake_case, got {metric!r}")
    if not arms:
        raise ValueError("arms is empty: nothing to save")
    seeds_by_arm = seeds if isinstance(seeds, dict) else {arm: seeds for arm in arms}
    entries: dict[str, np.ndarray] = {}
    n_problems = None
    for arm, values in arms.items():
        if not _NAME.match(arm):
            raise ValueError(f"arm names must be lower-case snake_case, got {arm!r}")
        arr = _as_scores(values, f"arms[{arm!r}]")
        if n_problems is not None and arr.shape[1] != n_problems:
            raise ValueError(f"arm {arm!r} scores {arr.shape[1]} problems, others {n_problems}")
        n_problems = arr.shape[1]
        if arm not in seeds_by_arm:
            raise ValueError(f"seeds has no entry for arm {arm!r}")
        arm_seeds = np.asarray(list(seeds_by_arm[arm]), dtype=np.int64)
        if arm_seeds.shape != (arr.shape[0],):
            raise ValueError(f"arm {arm!r} has {arr.shape[0]} seed rows but {arm_seeds.size} seeds")
        entries[f"{metric}{_SEP}{arm}"] = arr
        entries[f"{metric}{_SEP}{arm}{_SEP}seeds"] = arm_seeds
    entries[f"{metric}{_SEP}{_SEP}nested"] = np.asarray(bool(nested))
    if units is not None:
        unit_codes(units, n_problems)  # one id per problem column, or a clear error
        entries[f"{metric}{_SEP}{_SEP}units"] = np.asarray([str(u) for u in units])
    path = Path(out_dir) / SCORES_FILE
    existing: dict[str, np.ndarray] = {}
    if path.exists():
        with np.load(path) as f:
            existing = {k: f[k] for k in f.files}
        if any(k.split(_SEP)[0] == metric for k in existing):
            raise FileExistsError(f"{path} already holds metric {metric!r}; save each metric once per run")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, **existing, **entries)
    os.replace(tmp, path)
    return path


def scores_digest(out_dir: str | Path) -> str | None:
    """sha256 of ``<out_dir>/scores.npz`` (None if absent). A notebook records it in its summary as
    ``scores_sha256`` after its last save_scores, so a scores file left by an earlier run is never read
    as this run's."""
    path = Path(out_dir) / SCORES_FILE
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def load_scores(out_dir: str | Path) -> dict[str, ScoreSet] | None:
    """metric -> ScoreSet from ``<out_dir>/scores.npz``; None when the notebook saved none."""
    path = Path(out_dir) / SCORES_FILE
    if not path.exists():
        return None
    with np.load(path) as f:
        data = {k: f[k] for k in f.files}
    out: dict[str, ScoreSet] = {}
    for key in sorted(data):
        parts = key.split(_SEP)
        if len(parts) != 2 or not parts[1]:
            continue
        metric, arm = parts
        if metric not in out:
            units = data.get(f"{metric}{_SEP}{_SEP}units")
            out[metric] = ScoreSet(metric, {}, {}, bool(data.get(f"{metric}{_SEP}{_SEP}nested", False)),
                                   None if units is None else tuple(str(u) for u in units))
        out[metric].arms[arm] = data[key]
        out[metric].seeds[arm] = tuple(int(s) for s in data[f"{key}{_SEP}seeds"])
    return out
