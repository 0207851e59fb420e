"""Notebook 09's tables and its summary: the sizes at a glance, the warm-start axis, gain recovery and the
CoPES - ES gap per size, the mechanism per size, the map, and the flat ``summary.json`` built from them
(which keys it holds: the notebook's opening cell)."""

from __future__ import annotations

import math
from typing import Any

from copes_lib import stats
from copes_lib.protocols.study.base import (
    ScaleStudyParams,
    cell_units,
    es_family_arms,
    gain_recovery,
    gap,
    grpo_horizon_accuracy,
    scores,
    slug,
    unit_count,
)
from copes_lib.protocols.study.map_study import (
    MAP_ARMS,
    MAP_LOWRANK_ARMS,
    MAP_PRECONDITIONS,
    map_bases,
    map_tag,
)
from copes_lib.protocols.study.size_axis import cell_summary

# the mechanism's values worth reading side by side (the verdicts are shown in a table of their own)
MECHANISM_COLUMNS = ("size", "params", "mech_es_z", "mech_copes_paper_z", "mech_grpo_z", "mech_es_p_tail",
                     "mech_grpo_p_tail", "mech_grpo_ladder_best_delta", "mech_grpo_ladder_best_fraction", "mech_rho2",
                     "mech_d_eff", "mech_d_eff_ggn", "mech_predicted_efficiency", "mech_measured_efficiency",
                     "mech_cost_s")


def size_overview(params: ScaleStudyParams, cells: dict[str, dict[str, Any]]):
    """One row per size: parameters, warm-start steps, and every arm's mean validation accuracy at the
    budget (full GRPO also at its horizon)."""
    import pandas as pd

    return pd.DataFrame([{"size": s, "params": c["n_params"], "warm_steps": c["warm_steps"],
                          "base": scores(c, "base").mean(), "grpo": scores(c, "grpo").mean(),
                          "grpo_horizon": grpo_horizon_accuracy(c),
                          **{arm: scores(c, arm).mean() for arm in es_family_arms(params)}}
                         for s, c in cells.items()])


def warm_axis_table(params: ScaleStudyParams, cells: dict[str, dict[str, Any]], warm_cells: dict[str, dict[str, Any]]):
    """The warm-start axis at ``WARM_AXIS_SIZE``: 01's recipe, then the under-trained and converged bases,
    each with its steps, base accuracy, full GRPO's gain and every arm's gain recovery."""
    import pandas as pd

    bases = [("01's recipe", cells[params.WARM_AXIS_SIZE])] * bool(params.WARM_AXIS_SIZE) + list(warm_cells.items())
    return pd.DataFrame([
        {"base": label, "warm_steps": c["warm_steps"], "base_val": scores(c, "base").mean(),
         "grpo_gain": gain_recovery(c, "es")["grpo_gain"],
         **{f"recovery_{arm}": gain_recovery(c, arm)["mean"] for arm in es_family_arms(params)}}
        for label, c in bases])


def size_table(params: ScaleStudyParams, cells: dict[str, dict[str, Any]]):
    """Per size: the latent units its intervals rest on, each arm's gain recovery (fraction of full GRPO's gain,
    95% interval over seeds, latent units and problems within units) and each protocol's CoPES - ES gap (the
    same noise, seeds paired)."""
    import pandas as pd

    rows = []
    for size, c in cells.items():
        n_units, effective = unit_count(c)
        row = {"size": size, "params": c["n_params"], "units": n_units, "effective units": effective}
        for arm in es_family_arms(params):
            rec = gain_recovery(c, arm)
            row[f"recovery_{arm}"] = rec["mean"]
            row[f"recovery_{arm}_ci"] = (rec["low"], rec["high"])
        for protocol in params.protocols():
            row[f"gap_{protocol}"] = gap(c, protocol).describe(scale=100, unit=" pt")
        rows.append(row)
    return pd.DataFrame(rows)


def mechanism_table(cells: dict[str, dict[str, Any]], mech_by_size: dict[str, dict[str, Any]]):
    """The mechanism per size (docs/mechanism.md#m2-predictions-and-rules): values and the five verdicts,
    one row per size where it was measured."""
    import pandas as pd

    return pd.DataFrame([{"size": s, "params": cells[s]["n_params"], **m} for s, m in mech_by_size.items() if m])


def map_table(params: ScaleStudyParams, map_bases: dict[tuple[str, float | None], dict[str, Any]],
              map_keys: dict[str, Any]):
    """One row per map cell (regime, p, N): the latent units its intervals rest on (a cued base's are its cue
    letters), the base's and full GRPO's strict accuracy, each arm's Delta S, Delta L and gain recovery, and the
    contrasts (CoPES - ES, ES - shuffled, CoPES - ES at sqrt(K) alpha, low rank - full rank)."""
    import pandas as pd

    def row(regime: str, p: float | None, n: int) -> dict[str, Any]:
        base, cell = map_tag(regime, p), map_tag(regime, p, n)
        return {"regime": regime, "p": p, "N": n, "K": params.map_subspaces(n),
                "units": map_keys.get(f"map_units_{base}"),
                "base strict": map_keys[f"map_base_strict_{base}"],
                "base lenient": map_keys[f"map_base_lenient_{base}"],
                "GRPO strict": map_keys[f"map_grpo_strict_{base}"],
                **{f"{arm} {k}": map_keys.get(f"map_{arm}_{k}_{cell}")
                   for arm in (*MAP_ARMS, *MAP_LOWRANK_ARMS) for k in ("delta_s", "delta_l", "gain_recovery")},
                "copes - es": map_keys.get(f"map_copes_minus_es_{cell}"),
                "es - shuffled": map_keys.get(f"map_es_minus_es_shuffled_{cell}"),
                "copes - es sqrt(K) alpha": map_keys.get(f"map_copes_minus_es_sqrtk_{cell}"),
                **{f"{low} - {full}": map_keys.get(f"map_{low}_minus_{full}_{cell}")
                   for low, full in MAP_LOWRANK_ARMS.items()}}

    return pd.DataFrame([row(regime, p, n) for (regime, p), b in map_bases.items() for n in b["cells"]])


def map_preflight_table(params: ScaleStudyParams, map_keys: dict[str, Any]):
    """One row per map base: its strict and lenient accuracy, each measured precondition's value and verdict
    (docs/preflight.md#p1-the-preconditions: G1, G2, E1 with its calibrated sigma; E1 also at the map's SIGMA),
    R's analogue (full GRPO's strict gain at MAP_GRPO_STEPS, 95% interval) and the preconditions that fail.
    Empty without a map preflight."""
    import pandas as pd

    if not map_keys.get("map_preflight"):
        return pd.DataFrame({"base": []})
    rows = []
    for regime, p in map_bases(params):
        t = map_tag(regime, p)
        row: dict[str, Any] = {"base": t, "strict": map_keys.get(f"map_base_strict_{t}"),
                               "lenient": map_keys.get(f"map_base_lenient_{t}")}
        for pid in MAP_PRECONDITIONS:
            row[pid] = map_keys.get(f"map_preflight_{pid.lower()}_{t}")
            row[f"{pid} verdict"] = map_keys.get(f"map_preflight_{pid.lower()}_verdict_{t}")
        row["sigma"] = map_keys.get(f"map_preflight_sigma_{t}")
        row[f"E1 at SIGMA {params.SIGMA:g}"] = map_keys.get(f"map_preflight_e1_map_sigma_{t}")
        row["R analogue"] = map_keys.get(f"map_preflight_r_analogue_{t}")
        row["R analogue 95%"] = (map_keys.get(f"map_preflight_r_analogue_low_{t}"),
                                 map_keys.get(f"map_preflight_r_analogue_high_{t}"))
        row["R analogue verdict"] = map_keys.get(f"map_preflight_r_analogue_verdict_{t}")
        row["fails"] = ", ".join(map_keys.get(f"map_preflight_failed_{t}") or []) or "-"
        rows.append(row)
    return pd.DataFrame(rows)


def tagged_cells(cells: dict[str, dict[str, Any]], warm_cells: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every cell by the suffix of its summary keys: the sizes (:func:`slug`), then the warm-start axis."""
    return {**{slug(size): c for size, c in cells.items()}, **warm_cells}


def study_summary(params: ScaleStudyParams, cells: dict[str, dict[str, Any]], warm_cells: dict[str, dict[str, Any]],
                  fits: dict[str, dict[str, Any]], map_keys: dict[str, Any]) -> dict[str, Any]:
    """The flat summary: the largest size's headline keys (read by the claims S1-S3), every slope test with
    the 4B rule (docs/mechanism.md#m3-the-4b-extrapolation-rule), every cell's keys, the map's keys and
    predictions, and the power note; non-finite numbers become None. ``scores_sha256`` is added by the
    notebook once the scores are saved."""
    sizes = list(cells)
    last = sizes[-1]
    n_params = [cells[s]["n_params"] for s in sizes]
    headline_gap = f"copes_{params.protocols()[0]}_minus_es"
    summary = {
        "n_sizes": len(sizes),
        "largest_size_tag": slug(last),  # the suffix of the largest size's keys (read by the claims)
        "params_smallest": n_params[0],
        "params_largest": n_params[-1],
        f"gain_recovery_es_{slug(last)}": gain_recovery(cells[last], "es")["mean"],
        f"gain_recovery_copes_paper_{slug(last)}": (gain_recovery(cells[last], "copes_paper")["mean"]
                                                    if "paper" in params.protocols() else None),
        f"{headline_gap}_{slug(last)}": gap(cells[last], params.protocols()[0]).estimate,
        f"{headline_gap}_slope_per_decade": fits.get(headline_gap, {}).get("slope_per_decade"),
        "budget_steps": params.STEPS,
        "n_seeds": params.SEEDS,
        "grpo_seeds": params.GRPO_SEEDS,
        "population": params.POPULATION,
        "subspaces": params.SUBSPACES,
        "val_problems": len(next(iter(cells.values()))["base"]["scores"]),
        "sizes": sizes,
    }
    for key, fit in fits.items():
        summary[f"{key}_slope_per_decade"] = fit["slope_per_decade"]
        summary[f"{key}_slope_low"], summary[f"{key}_slope_high"] = fit["slope_low"], fit["slope_high"]
        summary[f"{key}_fit_points"] = fit["n_points"]
        summary[f"{key}_extrapolation_allowed"] = fit["extrapolation_allowed"]
        summary[f"{key}_extrapolated_4b"] = fit["at"]  # None unless >= 4 sizes and a slope interval excluding 0
    for tag, c in tagged_cells(cells, warm_cells).items():
        summary.update(cell_summary(params, c, tag))
    summary.update(map_keys)  # the map and prediction_R2/R5/R6/R7 (docs/mechanism.md#m6-the-map-of-where-es-and-copes-work)
    a, b = scores(cells[last], f"copes_{params.protocols()[0]}"), scores(cells[last], "es")
    units = cell_units(cells[last])  # the MDE over the latent units, as every interval of the cell
    summary["power_note"] = (stats.power_note(a, b, n_seeds=max(params.SEEDS, 8), scale=100, unit=" points",
                                              units=units)
                             if params.SEEDS >= 2 else stats.power_note(a, b, scale=100, unit=" points", units=units))
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
