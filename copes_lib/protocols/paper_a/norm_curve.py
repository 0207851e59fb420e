"""The norm curve of notebook 06 (docs/regime.md R12, "The curve (norm sweep)"): validation accuracy at the
budget against mean update norm for standard ES and CoPES (K = 4) at several step sizes, and whether CoPES
lies above ES's curve at its own norm (claim A7-curve).

CoPES's update is about sqrt(K) times standard ES's at the same alpha, so a single norm-matched ES arm (A7)
compares CoPES with ES at one step size only. The curve places both methods on a common axis, the update
norm each run measured (``es/update_norm``, mean over steps, then over seeds): ES at alpha x ES_MULTIPLIERS,
CoPES at alpha x COPES_MULTIPLIERS, ES's sigma, the same budget and the same paired seeds (seed i: noise seed
ES_SEED + i, batch seed BATCH_SEED + i, as every arm of 06). The paper has no such curve.

The registered rule (judged by ``claims.paper_a.curve_verdict``, shared with the claims table): at CoPES's
headline norm (K = 4 at alpha x 1), CoPES minus ES's curve interpolated linearly in log-norm between its two
bracketing points, with a 95% interval from the seeds x units bootstrap of both arms (each bracketing point
resampled); no extrapolation outside ES's measured range. Choices the rule leaves open, fixed here:

- ES's points are ordered by their measured mean norm (not by multiplier): the curve is a function of the
  norm. A point whose mean norm is 0 (no update at all) has no place on a log axis and is left out of the
  curve (the table keeps it).
- The interpolation weight is fixed at the measured mean norms; the bootstrap resamples the accuracies only.
  Resampling the norms too would move the bracketing pair between replicates.
- The bootstrap is ``stats.hierarchical_bootstrap`` on CoPES's scores against the interpolated ES scores
  (1 - t) ES_low + t ES_high, seed by seed: the seeds are paired, so one draw of seeds and one draw of units
  (then problems within them) resamples all three arms jointly, and each bracketing point with it.
- With one seed per point (the smoke profile) the seed noise is not measured: the claim reads as every paper-A
  claim does then (docs/statistics.md S5).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from copes_lib import stats
from copes_lib.claims.paper_a import curve_margin, curve_verdict
from copes_lib.claims.verdicts import AGREES, DISAGREES, INCONCLUSIVE, OPPOSITE, Context
from copes_lib.protocols.params import AblationParams

# docs/regime.md R12: the registered step-size multipliers (of ES's alpha) and CoPES's K
ES_MULTIPLIERS = (1.0, math.sqrt(2), 2.0, 2 * math.sqrt(2), 4.0)
COPES_MULTIPLIERS = (0.5, 1 / math.sqrt(2), 1.0, math.sqrt(2), 2.0)
COPES_SUBSPACES = 4
HEADLINE = 1.0  # CoPES's headline point: K = 4 at ES's alpha (06's k4)
METRIC = "norm_curve_val_accuracy"  # the curve's per-seed per-problem scores in 06's scores.npz
NOT_MEASURED = "not measured"
READINGS = (AGREES, OPPOSITE, DISAGREES, INCONCLUSIVE, NOT_MEASURED)  # norm_curve_verdict's values
_MULTIPLIER_WORDS = {1.0: "1", math.sqrt(2): "sqrt(2)", 2.0: "2", 2 * math.sqrt(2): "2 sqrt(2)", 4.0: "4",
                     0.5: "1/2", 1 / math.sqrt(2): "1/sqrt(2)"}


def point_name(method: str, multiplier: float) -> str:
    """A curve point's arm name (lower-case snake_case, for ``stats.save_scores`` and the summary keys).

    >>> point_name("es", math.sqrt(2)), point_name("copes", 0.5)
    ('es_x1p414', 'copes_x0p500')
    """
    return f"{method}_x{multiplier:.3f}".replace(".", "p")


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    """One point of the curve: a method at alpha x ``multiplier``, its seeds' mean update norms and accuracies."""

    method: str  # "es" or "copes"
    multiplier: float
    norms: tuple[float, ...]  # per seed: mean update norm over the run's steps
    accuracy: tuple[float, ...]  # per seed: validation accuracy at the budget (mean of the per-problem scores)
    shared_with: str = ""  # the 06 arm whose runs these are ("k1", "k4", "es_sqrtk_alpha", ...), "" if new
    low: float | None = None  # 95% interval of the mean accuracy: seeds x latent units x problems within units
    high: float | None = None  # (the same bootstrap as the rule's; None where not computed)

    @property
    def name(self) -> str:
        return point_name(self.method, self.multiplier)

    @property
    def mean_norm(self) -> float:
        return float(np.mean(self.norms))


@dataclasses.dataclass(frozen=True)
class NormCurve:
    """The curve and the verdict of the registered rule (``claims.paper_a.curve_verdict``)."""

    points: tuple[CurvePoint, ...]
    verdict: str
    reason: str
    n_seeds: int
    n_units: int
    n_units_effective: float
    margin: float | None
    copes_norm: float
    copes_accuracy: float
    bracket: tuple[float, float] | None  # ES multipliers of the two bracketing points (None: out of range)
    es_at_copes_norm: float | None = None  # ES's curve interpolated at CoPES's norm
    diff: float | None = None  # CoPES - ES's curve there
    ci95: tuple[float, float] | None = None
    ci90: tuple[float, float] | None = None

    def frame(self):
        """The curve as a table: one row per point, its mean norm and accuracy with its 95% interval over seeds x
        latent units x problems within units (``units``: how many)."""
        import pandas as pd

        rows = []
        for p in self.points:
            rows.append({"method": "CoPES (K = 4)" if p.method == "copes" else "standard ES",
                         "alpha x": _MULTIPLIER_WORDS.get(p.multiplier, f"{p.multiplier:.3g}"),
                         "mean update norm": p.mean_norm, "val accuracy": float(np.mean(p.accuracy)),
                         "95% low": p.low, "95% high": p.high, "seeds": len(p.accuracy), "units": self.n_units,
                         "runs shared with": p.shared_with or "-"})
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, Any]:
        """06's summary keys of the curve (finite numbers, strings, booleans or None)."""
        pair = lambda ci, i: None if ci is None else float(ci[i])  # noqa: E731
        es_norms = [p.mean_norm for p in self.points if p.method == "es" and p.mean_norm > 0]
        out = {"norm_curve_verdict": self.verdict, "norm_curve_reason": self.reason, "norm_curve_diff": self.diff,
               "norm_curve_ci95_low": pair(self.ci95, 0), "norm_curve_ci95_high": pair(self.ci95, 1),
               "norm_curve_ci90_low": pair(self.ci90, 0), "norm_curve_ci90_high": pair(self.ci90, 1),
               "norm_curve_units": self.n_units, "norm_curve_units_effective": self.n_units_effective,
               "norm_curve_seeds": self.n_seeds, "norm_curve_margin": self.margin,
               "norm_curve_copes_norm": self.copes_norm, "norm_curve_copes_accuracy": self.copes_accuracy,
               "norm_curve_es_at_copes_norm": self.es_at_copes_norm, "norm_curve_bracketed": self.bracket is not None,
               "norm_curve_bracket_low": pair(self.bracket, 0), "norm_curve_bracket_high": pair(self.bracket, 1),
               "norm_curve_es_norm_min": min(es_norms, default=None),
               "norm_curve_es_norm_max": max(es_norms, default=None)}
        for p in self.points:
            out[f"norm_curve_norm_{p.name}"] = p.mean_norm
            out[f"norm_curve_accuracy_{p.name}"] = float(np.mean(p.accuracy))
        return out


def not_measured_summary() -> dict[str, Any]:
    """06's summary keys when the curve is off (NORM_CURVE_SEEDS 0): claim A7-curve then reads missing."""
    return {"norm_curve_verdict": NOT_MEASURED, "norm_curve_seeds": 0, "norm_curve_copes_norm": None,
            "norm_curve_reason": "NORM_CURVE_SEEDS = 0: the curve was not run"}


def _check_multipliers(name: str, values: Sequence[float], registered: Sequence[float]) -> tuple[float, ...]:
    values = tuple(float(v) for v in values)
    if len(values) < 2 or not all(math.isfinite(v) and v > 0 for v in values) or any(
            b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name} = {values} must be at least 2 strictly ascending positive multipliers of alpha "
                         f"(registered in docs/regime.md R12: {tuple(round(v, 4) for v in registered)})")
    return values


def _check_arms(name: str, scores: Sequence[Any], norms: Sequence[Any], n: int, shape: tuple[int, int] | None
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if len(scores) != n or len(norms) != n:
        raise ValueError(f"{name}_scores and {name}_norms must hold one entry per multiplier ({n}), got "
                         f"{len(scores)} and {len(norms)}")
    arrays, norm_rows = [], []
    for i, (x, v) in enumerate(zip(scores, norms, strict=True)):
        arr = np.asarray(x, dtype=float)
        if arr.ndim != 2 or arr.size == 0 or not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}_scores[{i}] must be a finite (seeds, problems) array, got shape {arr.shape}")
        if shape is not None and arr.shape != shape:
            raise ValueError(f"{name}_scores[{i}] has shape {arr.shape} (seeds, problems), the first ES point "
                             f"{shape}: every point needs the same paired seeds (seed i: noise seed ES_SEED + i, "
                             "batch seed BATCH_SEED + i) and the same validation problems")
        shape = arr.shape
        row = np.asarray(v, dtype=float).reshape(-1)
        if row.shape != (arr.shape[0],) or not np.all(np.isfinite(row)) or np.any(row < 0):
            raise ValueError(f"{name}_norms[{i}] must hold one finite mean update norm >= 0 per seed row "
                             f"({arr.shape[0]}), got {v!r}")
        arrays.append(arr)
        norm_rows.append(row)
    return arrays, norm_rows


def _bracket(norms: Sequence[float], target: float) -> tuple[int, int, float] | None:
    """(index below, index above, weight t of the upper one) of the two points of a curve whose norms bracket
    ``target``, interpolating linearly in log-norm; None when ``target`` lies outside their range. ``norms``
    ascending and > 0."""
    if target <= 0 or target < norms[0] or target > norms[-1]:
        return None
    j = max(0, min(int(np.searchsorted(norms, target, side="right")) - 1, len(norms) - 2))
    lo, hi = norms[j], norms[j + 1]
    t = 0.5 if hi == lo else (math.log(target) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return j, j + 1, float(t)


def _point_interval(x: np.ndarray, units: Sequence[Any], n_boot: int, seed: int) -> tuple[float, float]:
    """95% interval of one point's mean accuracy: seeds x latent units x problems within units (the rule's
    bootstrap, on one arm); with one seed, units and problems only."""
    reps = stats.hierarchical_bootstrap(x, np.zeros((1, x.shape[1])), n_boot=n_boot, seed=seed, paired_seeds=False,
                                        units=units)
    low, high = np.quantile(reps, [0.025, 0.975])
    return float(low), float(high)


def judge_curve(es_scores: Sequence[Any], es_norms: Sequence[Any], copes_scores: Sequence[Any],
                copes_norms: Sequence[Any], *, units: Sequence[Any], margin: float | None,
                es_multipliers: Sequence[float] = ES_MULTIPLIERS,
                copes_multipliers: Sequence[float] = COPES_MULTIPLIERS, headline: float = HEADLINE,
                shared_with: dict[str, str] | None = None, n_boot: int = 2000, seed: int = 0) -> NormCurve:
    """The curve and the verdict of docs/regime.md R12's rule.

    ``es_scores[i]`` / ``copes_scores[j]``: the (seeds, problems) per-problem validation scores at the budget of
    ES at alpha x ``es_multipliers[i]`` and CoPES at alpha x ``copes_multipliers[j]``, the same paired seeds
    (rows) and problems (columns) for every point; ``es_norms[i]`` / ``copes_norms[j]``: each seed's mean update
    norm. ``units``: each problem's latent unit (docs/statistics.md S6). ``margin``: A7's equivalence margin
    (None: unknown, so "does not" cannot be read). ``headline``: CoPES's multiplier at which the rule is read.
    ``shared_with``: point name -> the 06 arm whose runs it reuses (shown in the table)."""
    es_m = _check_multipliers("es_multipliers", es_multipliers, ES_MULTIPLIERS)
    copes_m = _check_multipliers("copes_multipliers", copes_multipliers, COPES_MULTIPLIERS)
    if headline not in copes_m:
        raise ValueError(f"headline = {headline} must be one of copes_multipliers {copes_m}")
    if margin is not None and not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be > 0 or None (A7's margin unknown), got {margin}")
    es, es_n = _check_arms("es", es_scores, es_norms, len(es_m), None)
    copes, copes_n = _check_arms("copes", copes_scores, copes_norms, len(copes_m), es[0].shape)
    _, sizes = stats.unit_codes(units, es[0].shape[1])  # one unit id per problem column, or a clear error
    shared_with = shared_with or {}
    points = tuple(CurvePoint(method, m, tuple(map(float, n)), tuple(map(float, x.mean(axis=1))),
                              shared_with.get(point_name(method, m), ""), *_point_interval(x, units, n_boot, seed))
                   for method, ms, xs, ns in (("es", es_m, es, es_n), ("copes", copes_m, copes, copes_n))
                   for m, x, n in zip(ms, xs, ns, strict=True))
    head = copes[copes_m.index(headline)]
    base = dict(points=points, n_seeds=int(head.shape[0]), n_units=int(len(sizes)),
                n_units_effective=stats.effective_units(sizes), margin=margin,
                copes_norm=float(copes_n[copes_m.index(headline)].mean()), copes_accuracy=float(head.mean()))
    placed = sorted((float(n.mean()), i) for i, n in enumerate(es_n) if n.mean() > 0)
    found = _bracket([n for n, _ in placed], base["copes_norm"]) if len(placed) >= 2 else None
    if found is None:
        verdict, why = curve_verdict(None, None, margin, bracketed=False, seeds=base["n_seeds"])
        span = f"{placed[0][0]:.3g}-{placed[-1][0]:.3g}" if placed else "none (no ES point moved)"
        return NormCurve(**base, verdict=verdict, bracket=None,
                         reason=f"{why} (CoPES's norm {base['copes_norm']:.3g}; ES's norms {span})")
    j_lo, j_hi, t = found
    i_lo, i_hi = placed[j_lo][1], placed[j_hi][1]
    es_there = (1 - t) * es[i_lo] + t * es[i_hi]
    reps = stats.hierarchical_bootstrap(head, es_there, n_boot=n_boot, seed=seed, paired_seeds=True, units=units)
    ci95 = tuple(float(v) for v in np.quantile(reps, [0.025, 0.975]))
    ci90 = tuple(float(v) for v in np.quantile(reps, [0.05, 0.95]))
    verdict, why = curve_verdict(ci95, ci90, margin, bracketed=True, seeds=base["n_seeds"])
    return NormCurve(**base, verdict=verdict, reason=why, bracket=(es_m[i_lo], es_m[i_hi]),
                     es_at_copes_norm=float(es_there.mean()), diff=float(head.mean() - es_there.mean()),
                     ci95=ci95, ci90=ci90)


def curve_configs(params: AblationParams, sigma: float, alpha: float, seed_index: int) -> dict[str, Any]:
    """point name -> the ESConfig of that point at seed ``seed_index``: ES (K = 1) and CoPES (K = 4) at ES's
    sigma and alpha x the registered multipliers. Built as 06's arms are (``ablations.ablation_configs``), so a
    point that is an arm (ES x 1 = k1, CoPES x 1 = k4, ES x 2 = es_sqrtk_alpha at K = 4, CoPES x 1/2 =
    copes_matched_step) has the identical config and its cached run is reused."""
    cfg = lambda k, m: params.es_config(seed_index=seed_index, subspaces=k, sigma=sigma, alpha=m * alpha)  # noqa: E731
    return {**{point_name("es", m): cfg(1, m) for m in ES_MULTIPLIERS},
            **{point_name("copes", m): cfg(COPES_SUBSPACES, m) for m in COPES_MULTIPLIERS}}


def registered_margin(profile: str, base_val_accuracy: float) -> tuple[float | None, str]:
    """(A7's margin, where it came from): from notebook 05's reference gain when 05's summary is on the same base
    (its ``base_val_accuracy`` equals 06's), else None. 06 runs beside 05, so 05's summary may not exist yet or
    be an earlier run's; the claims table (A7-curve) always applies the margin of the run it judges."""
    from copes_lib import runs

    s05 = runs.load_summary(profile, "05_fixed_budget_math") or {}
    if s05.get("base_val_accuracy") is None or abs(float(s05["base_val_accuracy"]) - base_val_accuracy) > 1e-9:
        return None, ("no margin here (notebook 05's summary is absent or from another base): the claims table's "
                      "A7-curve applies A7's margin")
    margin = curve_margin(Context("06_copes_ablations", {"05_fixed_budget_math": s05}))
    return margin, ("A7's margin from notebook 05's reference gain" if margin is not None else
                    "no margin: notebook 05's summary has no reference gain")


def run_curve(params: AblationParams, agent: Any, sigma: float, alpha: float, budget: int,
              arm_runs: dict[str, list[Any]], arm_scores: dict[str, np.ndarray], *, units: Sequence[Any],
              margin: float | None) -> tuple[NormCurve, dict[str, np.ndarray]]:
    """Run (or take from the cache) every point of the curve for NORM_CURVE_SEEDS paired seeds and judge it.

    A point whose config and seed equal a run of 06's arms (``arm_runs``, ``arm_scores``: the notebook's) takes
    that run and its scores; any other is trained with ``es_arm.es_run`` (cached like every 06 run) and scored
    with ``decoding.greedy_scores``, checked against the logged validation accuracy as 06's arms are.
    Returns the judged curve and point name -> (seeds, problems) scores, for ``stats.save_scores``."""
    from copes_lib.protocols import histories
    from copes_lib.protocols.paper_a import decoding, es_arm

    n_val = len(agent.objective.val_tasks)
    scores: dict[str, list[np.ndarray]] = {}
    norms: dict[str, list[float]] = {}
    shared: dict[str, str] = {}
    for i in range(params.NORM_CURVE_SEEDS):
        seeded = es_arm.seeded_agent(agent, params.BATCH_SEED + i)
        for name, config in curve_configs(params, sigma, alpha, i).items():
            arm = next((a for a, rs in arm_runs.items() if len(rs) > i and rs[i].config == config), None)
            if arm is not None:
                run, row = arm_runs[arm][i], arm_scores[arm][i]
                shared[name] = arm
            else:
                run = es_arm.es_run(seeded, config, steps=budget, val_every=params.VAL_EVERY,
                                    label=f"curve {name} seed {i}", force=params.FORCE, seed_index=i)
                row = decoding.greedy_scores(params, seeded, es_arm.es_model(agent, run), seeded.objective.val_tasks,
                                             label=f"curve {name} seed {i} at step {budget}")
                logged = histories.val_at(run.history, budget)
                if logged is None or abs(row.mean() - logged) > 2 / n_val:
                    raise RuntimeError(f"curve point {name} seed {i}: per-problem accuracy {row.mean():.4f} does not "
                                       f"match the logged validation accuracy {logged} at step {budget}")
            scores.setdefault(name, []).append(row)
            norms.setdefault(name, []).append(histories.mean_update_norm(run.history))
    arrays = {name: np.stack(rows) for name, rows in scores.items()}
    pick = lambda method, ms: [arrays[point_name(method, m)] for m in ms]  # noqa: E731
    pick_norms = lambda method, ms: [norms[point_name(method, m)] for m in ms]  # noqa: E731
    curve = judge_curve(pick("es", ES_MULTIPLIERS), pick_norms("es", ES_MULTIPLIERS),
                        pick("copes", COPES_MULTIPLIERS), pick_norms("copes", COPES_MULTIPLIERS),
                        units=units, margin=margin, shared_with=shared, seed=params.SEED)
    return curve, arrays


def plot_norm_curve(curve: NormCurve, *, budget: int):
    """Accuracy at the budget against mean update norm (log x axis): both curves, each point's seed mean with
    its 95% interval over seeds x latent units (``CurvePoint.low`` / ``high``), CoPES's headline point starred and
    ES's curve interpolated there."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for method, colour, label in (("es", "tab:blue", "standard ES"), ("copes", "tab:orange", "CoPES (K = 4)")):
        pts = sorted((p for p in curve.points if p.method == method and p.mean_norm > 0), key=lambda p: p.mean_norm)
        x = [p.mean_norm for p in pts]
        y = [float(np.mean(p.accuracy)) for p in pts]
        yerr = np.array([[max(m - p.low, 0.0), max(p.high - m, 0.0)] if p.low is not None else [0.0, 0.0]
                         for m, p in zip(y, pts)]).T.reshape(2, -1)
        ax.errorbar(x, y, yerr=yerr, fmt="o-", color=colour, capsize=3, label=f"{label}, alpha x "
                    + ", ".join(_MULTIPLIER_WORDS.get(p.multiplier, f"{p.multiplier:.3g}") for p in pts))
    if curve.copes_norm > 0:
        ax.plot([curve.copes_norm], [curve.copes_accuracy], "*", ms=16, color="tab:orange", mec="k",
                label="CoPES's headline (alpha x 1)")
        ax.axvline(curve.copes_norm, color="gray", ls=":", lw=1)
    if curve.es_at_copes_norm is not None:
        ax.plot([curve.copes_norm], [curve.es_at_copes_norm], "D", mfc="none", color="tab:blue",
                label="ES's curve there (log-norm interpolation)")
    ax.set_xscale("log")
    ax.set_xlabel("mean update norm (es/update_norm, mean over steps and seeds; log)")
    ax.set_ylabel(f"validation accuracy @ {budget} steps")
    diff = ("" if curve.diff is None else f": {100 * curve.diff:+.1f} pts [{100 * curve.ci95[0]:+.1f}, "
            f"{100 * curve.ci95[1]:+.1f}]")
    ax.set_title(f"A7-curve, CoPES - ES's curve at CoPES's norm{diff} -> {curve.verdict}\n"
                 f"({curve.n_seeds} paired seed(s) per point; error bars: 95% over seeds x {curve.n_units} units)")
    ax.legend(fontsize=7)
    return fig
