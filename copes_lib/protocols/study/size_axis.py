"""Notebook 09's size axis: every arm at one (size, warm start) (``run_cell``), the trend over sizes
with the 4B rule (``slope_test``; docs/mechanism.md#m3-the-4b-extrapolation-rule) and a cell's summary
keys and per-problem scores."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from copes_lib.protocols.study.base import (
    NOTEBOOK,
    QWEN35_4B_PARAMS,
    ScaleStudyParams,
    Substrate,
    _finite,
    base_scores,
    cell_units,
    es_arm,
    es_family_arms,
    gain_recovery,
    gap,
    grpo_arm,
    grpo_horizon_accuracy,
    scores,
    substrate_units,
    unit_count,
)
from copes_lib.protocols.study.mechanism_study import mechanism, mechanism_summary


def run_cell(params: ScaleStudyParams, sub: Substrate, *, with_mechanism: bool = True, log=print) -> dict[str, Any]:
    """Every arm at one (size, warm start): {"base", "grpo": [...], arm: [...], "mechanism": rows, "units": each
    validation problem's latent unit (``Substrate.units``: the cached scores carry none, so they come from the
    tasks), which every interval of the cell resamples}."""
    cell: dict[str, Any] = {"size": sub.size, "warm_steps": sub.warm_steps, "n_params": sub.n_params,
                            "base": base_scores(params, sub),
                            "units": list(substrate_units(params, sub) or ())}
    log(f"[{NOTEBOOK}] {sub.size} ({sub.n_params:,} params, warm {sub.warm_steps}): base "
        f"{cell['base']['accuracy']:.3f}")
    cell["grpo"] = [grpo_arm(params, sub, g) for g in range(params.GRPO_SEEDS)]
    for arm in es_family_arms(params):
        cell[arm] = [es_arm(params, sub, arm, s, cell["base"]["accuracy"]) for s in range(params.SEEDS)]
        log(f"[{NOTEBOOK}] {sub.size} {arm}: mean val {np.mean([r['accuracy'] for r in cell[arm]]):.3f}")
    cell["mechanism"] = mechanism(params, sub) if with_mechanism and params.MECH_RANDOM else None
    return cell


def slope_test(n_params: list[float], values: list[float | None], lows: list[float | None] | None = None,
               highs: list[float | None] | None = None, at: float = QWEN35_4B_PARAMS,
               min_points: int = 4) -> dict[str, Any]:
    """The least-squares line value = a + b log10(params) over the sizes with a finite value, the
    slope's 95% interval from the per-size 95% intervals (sizes are independent models, so their
    variances add: claims S2 / S3's rule), and the 4B extrapolation rule of
    docs/mechanism.md#m3-the-4b-extrapolation-rule: ``at`` (the value at ``at`` parameters) only when
    ``min_points`` sizes back the line AND the slope's interval excludes 0, else None
    (``extrapolation_allowed`` False). Without per-size intervals the slope has none and no
    extrapolation is allowed."""
    lows = lows if lows is not None else [None] * len(values)
    highs = highs if highs is not None else [None] * len(values)
    points = [(math.log10(n), v, lo, hi) for n, v, lo, hi in zip(n_params, values, lows, highs)
              if v is not None and math.isfinite(v)]
    out: dict[str, Any] = {"slope_per_decade": None, "slope_low": None, "slope_high": None, "intercept": None,
                           "at": None, "n_points": len(points), "extrapolation_allowed": False}
    if len(points) < 2:
        return out
    from copes_lib import stats

    x, y = [p[0] for p in points], [p[1] for p in points]
    slope, intercept, _, _ = stats.slope_interval(x, y)
    out.update(slope_per_decade=slope, intercept=intercept)
    if all(p[2] is not None and p[3] is not None and math.isfinite(p[2]) and math.isfinite(p[3]) for p in points):
        _, _, low, high = stats.slope_interval(x, y, [p[2] for p in points], [p[3] for p in points])
        out.update(slope_low=low, slope_high=high)
        allowed = len(points) >= min_points and (out["slope_low"] > 0 or out["slope_high"] < 0)
        out["extrapolation_allowed"] = bool(allowed)
        if allowed:
            out["at"] = float(intercept + slope * math.log10(at))
    return out


def cell_summary(params: ScaleStudyParams, cell: dict[str, Any], tag: str) -> dict[str, Any]:
    """The flat summary keys of one cell, suffixed ``_<tag>``."""
    n_units, effective = unit_count(cell)  # what every interval of the cell rests on (problems without unit ids)
    s: dict[str, Any] = {"n_params": cell["n_params"], "warm_steps": cell["warm_steps"],
                         "units": n_units, "units_effective": effective,
                         "base_val_accuracy": float(scores(cell, "base").mean()),
                         "grpo_val_accuracy": float(scores(cell, "grpo").mean()),
                         "grpo_horizon_val_accuracy": grpo_horizon_accuracy(cell)}
    for arm in es_family_arms(params):
        s[f"{arm}_val_accuracy"] = float(scores(cell, arm).mean())
        rec = gain_recovery(cell, arm)
        s[f"gain_recovery_{arm}"], s[f"gain_recovery_{arm}_low"], s[f"gain_recovery_{arm}_high"] = (
            rec["mean"], rec["low"], rec["high"])
        s[f"update_norm_{arm}"] = float(np.mean([r["mean_update_norm"] for r in cell[arm]]))
    for protocol in params.protocols():
        c = gap(cell, protocol)
        s[f"copes_{protocol}_minus_es"] = c.estimate
        s[f"copes_{protocol}_minus_es_low"] = _finite(c.low)
        s[f"copes_{protocol}_minus_es_high"] = _finite(c.high)
        s[f"copes_{protocol}_minus_es_p"] = _finite(c.p)
        s[f"copes_{protocol}_minus_es_verdict"] = c.verdict
    s.update(mechanism_summary(cell))
    return {f"{k}_{tag}": v for k, v in s.items()}


def scores_digest(out_dir: str | Path) -> str | None:
    """sha256 of ``<out_dir>/scores.npz`` (``stats.scores_digest``): the summary's ``scores_sha256``."""
    from copes_lib import stats

    return stats.scores_digest(out_dir)


def save_cell_scores(params: ScaleStudyParams, out_dir: str | Path, cell: dict[str, Any], tag: str) -> None:
    """Per-seed per-problem scores of a cell as metric ``val_accuracy_at_budget_<tag>`` (stats contract), with
    each problem's latent unit."""
    from copes_lib import stats

    arms = {arm: scores(cell, arm) for arm in ["base", "grpo", *es_family_arms(params)]}
    seeds = {"base": [0], "grpo": [42 + g for g in range(params.GRPO_SEEDS)],
             **{arm: [params.ES_SEED + s for s in range(params.SEEDS)] for arm in es_family_arms(params)}}
    stats.save_scores(out_dir, f"val_accuracy_at_budget_{tag}", arms, seeds, units=cell_units(cell))
