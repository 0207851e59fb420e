"""Paper B's factorial: the chain B3 -> +R -> +R+E -> +R+E+L, one off-chain cell, paired t-tests.

Cells (router, fitness scope, lifecycle):

| cell        | R  | E  | L   |
|-------------|----|----|-----|
| B3          | R0 | E0 | off |  the static baseline
| +R          | R1 | E0 | off |
| +R+E        | R1 | E1 | off |
| +R+E+L      | R1 | E1 | on  |  the full system
| +R+L (E0)   | R1 | E0 | on  |  OFF-CHAIN: the lifecycle with global fitness
| B3 (collapsing) | R0 | E0 | off | router lr x COLLAPSE_ROUTER_LR_X, R0's input x COLLAPSE_INPUT_SCALE
| +R (collapsing) | R1 | E0 | off | router lr x COLLAPSE_ROUTER_LR_X

The off-chain cell is (R1, E0, L) because in our system the fitness scope acts only through the
lifecycle (it decides who dies and who is cloned): without L, +R+E is the same computation as +R
(one cache entry; its contrast is exactly 0 by construction). With the off-chain cell, the scope
contrast can also be measured where it can act: +R+E+L vs +R+L (E0).

The two collapsing cells repeat the router contrast where the softmax router collapses (paper B's
precondition, which the default settings never reach in the miniature): see
docs/molora_regime.md#m4-the-router-contrast-in-a-collapsing-setting, whose predictions
:func:`collapsing_summary` reads.

Each cell runs with seeds SEED..SEED+n-1; a seed fixes the pool/router initialisation and the batch
order, identical across cells, so the t-tests are paired (scipy.stats.ttest_rel, df = n - 1).
Delta = balanced log-PPL(reference) - balanced log-PPL(test), nats; positive = the factor helps.
Each contrast also carries the 95% t-interval of the mean paired difference (df = n - 1), drawn in
notebook 12's figure (:func:`copes_lib.protocols.plots.plot_factorial`). :func:`factorial_summary` builds
notebook 12's summary.json keys and :func:`window_scores` the per-window scores the claims read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from copes_lib import stats as suite_stats
from copes_lib.molora import metrics
from copes_lib.stats import mean_ci

# The paper's Table (docs/paper_b_molora.md#b2-results): contrast -> (Delta nats, t, p); None where the paper gives none.
PAPER_B2 = {
    "router": (0.0426, 12.86, 0.006),
    "eval_scope": (0.0, None, None),
    "lifecycle": (-0.028, -4.46, 0.047),
    "full_vs_b3": (0.015, 1.94, 0.19),
    "inheritance_alpha0": (None, None, None),  # "sign-inconsistent (underpowered)"
}
# the paper's router contrast was measured where its R0 had collapsed: it is the analogue of ours there
PAPER_B2["router_collapsing"] = PAPER_B2["router"]

# cell name -> (router kind, scope, lifecycle on)
CELLS = {
    "B3": ("r0", "e0", False),
    "+R": ("r1", "e0", False),
    "+R+E": ("r1", "e1", False),
    "+R+E+L": ("r1", "e1", True),
    "+R+L (E0)": ("r1", "e0", True),
}
ALPHA0_CELL = "+R+E+L alpha=0"
# cell name -> router kind of the router contrast in the collapsing setting (MoloraFactorialParams.collapsing_cell)
COLLAPSING_CELLS = {"B3 (collapsing)": "r0", "+R (collapsing)": "r1"}
# cell name -> snake_case key for summary.json
CELL_KEYS = {"B3": "b3", "+R": "r", "+R+E": "r_e", "+R+E+L": "r_e_l", "+R+L (E0)": "r_l_e0", ALPHA0_CELL: "r_e_l_alpha0",
             "B3 (collapsing)": "b3_collapsing", "+R (collapsing)": "r_collapsing"}

# contrast -> (test cell, reference cell, what it measures)
CONTRASTS = {
    "router": ("+R", "B3", "router rewrite R (chain)"),
    "router_collapsing": ("+R (collapsing)", "B3 (collapsing)", "router rewrite R where R0 collapses"),
    "eval_scope": ("+R+E", "+R", "evaluation scope E (chain; inert without L)"),
    "eval_scope_with_lifecycle": ("+R+E+L", "+R+L (E0)", "evaluation scope E with the lifecycle on (off-chain)"),
    "lifecycle": ("+R+E+L", "+R+E", "lifecycle L (chain)"),
    "lifecycle_global_scope": ("+R+L (E0)", "+R", "lifecycle L under E0 (off-chain)"),
    "full_vs_b3": ("+R+E+L", "B3", "full system vs static baseline B3"),
    "inheritance_alpha0": ("+R+E+L", ALPHA0_CELL, "alpha-blend inheritance vs alpha = 0"),
}


def cell_configs(params, seeds: list[int]) -> dict[str, list]:
    """{cell name: [CellConfig per seed]} from notebook 12's parameters (MoloraFactorialParams)."""
    out = {}
    for name, (router, scope, life_on) in CELLS.items():
        out[name] = [params.cell(router, scope, life_on, seed=s, life=params.life(),
                                 evolve_every=params.EVOLVE_EVERY, fitness_windows=params.FITNESS_WINDOWS)
                     for s in seeds]
    if params.ALPHA0_COUNTERFACTUAL:
        out[ALPHA0_CELL] = [params.cell("r1", "e1", True, seed=s, life=params.life(inherit_alpha=0.0),
                                        evolve_every=params.EVOLVE_EVERY, fitness_windows=params.FITNESS_WINDOWS)
                            for s in seeds]
    for name, router in COLLAPSING_CELLS.items():
        out[name] = [params.collapsing_cell(router, seed=s) for s in seeds]
    return out


def paired_test(test: list[float], ref: list[float]) -> dict:
    """Delta = mean(ref - test), its 95% t-interval and the paired t-test; t and p are None when undefined
    (zero variance)."""
    if len(test) != len(ref) or len(test) < 2:
        raise ValueError(f"paired test needs two equal-length lists of >= 2 values, got {len(test)} and {len(ref)}")
    diffs = [r - t for r, t in zip(ref, test)]
    delta, low, high = mean_ci(diffs)
    result = stats.ttest_rel(ref, test)
    t, p = float(result.statistic), float(result.pvalue)
    return {"delta": delta, "low": low, "high": high, "t": t if math.isfinite(t) else None,
            "p": p if math.isfinite(p) else None, "df": len(diffs) - 1, "diffs": diffs}


def contrast_table(log_ppl: dict[str, list[float]]) -> list[dict]:
    """One row per contrast whose two cells were run: ours beside the paper's (Delta, t, p)."""
    rows = []
    for name, (test, ref, what) in CONTRASTS.items():
        if test not in log_ppl or ref not in log_ppl:
            continue
        ours = paired_test(log_ppl[test], log_ppl[ref])
        paper = PAPER_B2.get(name, (None, None, None))
        rows.append({"contrast": name, "test": test, "reference": ref, "measures": what,
                     "delta_nats": ours["delta"], "delta_low": ours["low"], "delta_high": ours["high"],
                     "t": ours["t"], "p": ours["p"], "df": ours["df"],
                     "paper_delta_nats": paper[0], "paper_t": paper[1], "paper_p": paper[2]})
    return rows


# =========================================================================== notebook 12's summary
# contrast name in CONTRASTS -> its summary.json key stem (the claims read delta_<stem>, p_<stem>, ...)
SUMMARY_CONTRASTS = {"router": "router", "router_collapsing": "router_collapsing", "lifecycle": "lifecycle", "full_vs_b3": "full_vs_b3",
                     "eval_scope_with_lifecycle": "eval_scope", "lifecycle_global_scope": "lifecycle_global_scope",
                     "inheritance_alpha0": "inheritance_alpha0"}


def _number(value: Any) -> float | None:
    """A table value as a float, None where undefined (None or NaN)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def deaths(result: dict) -> int:
    """Slots culled in one cell's run (its lifecycle events)."""
    return sum(e["event"] == "death" for e in result["events"])


def per_seed_rows(cells: dict[str, list], results: dict[str, list[dict]]) -> list[dict]:
    """One row per cell x seed (cells.csv): the factor levels, balanced log-PPL, monopoly count, deaths."""
    return [{"cell": name, "seed": cfg.seed, "router": cfg.router.kind, "scope": cfg.scope,
             "lifecycle": cfg.use_lifecycle, "balanced_log_ppl": r["balanced_log_ppl"],
             "monopoly_slots": r["monopoly_slots"], "deaths": deaths(r)}
            for name in cells for cfg, r in zip(cells[name], results[name])]


def log_ppl_by_cell(results: dict[str, list[dict]]) -> dict[str, list[float]]:
    """{cell name: balanced log-PPL per seed}, the input of :func:`contrast_table`."""
    return {name: [r["balanced_log_ppl"] for r in rs] for name, rs in results.items()}


def factorial_summary(results: dict[str, list[dict]], contrasts: list[dict], seeds: list[int],
                      steps: int) -> dict[str, Any]:
    """Notebook 12's summary.json keys from its cells' results and :func:`contrast_table`'s rows.

    Per contrast of ``SUMMARY_CONTRASTS`` that was run: ``delta_<stem>``, ``t_``, ``p_``, ``_low``, ``_high``
    (None where undefined); ``delta_eval_scope_chain`` (0 by construction); per cell the mean and per-seed
    balanced log-PPL; the monopoly count of B3 and of the full system; the deaths over all cells.
    """
    by_name = {row["contrast"]: row for row in contrasts}
    summary: dict[str, Any] = {"n_seeds": len(seeds), "steps_per_cell": steps}
    for name, stem in SUMMARY_CONTRASTS.items():
        row = by_name.get(name)
        if row is None or _number(row["delta_nats"]) is None:
            continue
        summary[f"delta_{stem}"] = _number(row["delta_nats"])
        summary[f"t_{stem}"] = _number(row["t"])
        summary[f"p_{stem}"] = _number(row["p"])
        summary[f"delta_{stem}_low"] = _number(row["delta_low"])
        summary[f"delta_{stem}_high"] = _number(row["delta_high"])
    summary["delta_eval_scope_chain"] = _number(by_name["eval_scope"]["delta_nats"]) if "eval_scope" in by_name else None
    summary["seeds"] = list(seeds)
    log_ppl = log_ppl_by_cell(results)
    for name in results:
        summary[f"balanced_log_ppl_{CELL_KEYS[name]}"] = float(np.mean(log_ppl[name]))
        summary[f"balanced_log_ppl_per_seed_{CELL_KEYS[name]}"] = [float(v) for v in log_ppl[name]]
    summary["monopoly_slots_b3"] = float(np.mean([r["monopoly_slots"] for r in results["B3"]]))
    summary["monopoly_slots_full"] = float(np.mean([r["monopoly_slots"] for r in results["+R+E+L"]]))
    summary["lifecycle_deaths"] = int(sum(deaths(r) for rs in results.values() for r in rs))
    summary["windows_per_domain"] = int(results["B3"][0]["windows_per_domain"])
    return summary


def paper_comparison(contrasts: list[dict]) -> list[str]:
    """One line per contrast the paper gives a Delta for: ours, its p, and whether the signs agree."""
    lines = []
    for row in contrasts:
        paper = _number(row["paper_delta_nats"])
        if paper is None:
            continue
        p, paper_p = _number(row["p"]), _number(row["paper_p"])
        p_text = "undefined" if p is None else f"{p:.3f}"
        paper_p_text = "-" if paper_p is None else f"{paper_p:.3f}"
        if paper == 0:
            same = "paper: ~0;"
        else:
            same = "same sign as" if np.sign(row["delta_nats"]) == np.sign(paper) else "NOT the sign of"
        lines.append(f"{row['contrast']:12s} ours Delta {row['delta_nats']:+.4f} nats (p = {p_text}), {same} the "
                     f"paper's {paper:+.4f} (p = {paper_p_text})")
    return lines


def window_scores(results: dict[str, list[dict]]) -> dict[str, np.ndarray]:
    """{cell key: (seeds, windows) test NLL}: the same windows and seeds in every cell, equally many per
    domain, so a row's plain mean is that seed's balanced log-PPL (checked); the claims (B2-B5) test on these."""
    scores = {}
    for name, rs in results.items():
        rows = np.array([r["window_nll"] for r in rs], dtype=float)
        for row, r in zip(rows, rs):
            if abs(row.mean() - r["balanced_log_ppl"]) >= 1e-9:
                raise ValueError(f"cell {name}: mean window NLL {row.mean()} != balanced log-PPL "
                                 f"{r['balanced_log_ppl']}: the windows are not balanced over domains")
        scores[CELL_KEYS[name]] = rows
    return scores


def router_power_note(scores: dict[str, np.ndarray], n_seeds: int) -> str:
    """The minimum detectable router effect (B3 vs +R) now and at max(10, 2 n) seeds."""
    if n_seeds < 2:
        return "router (B3 vs +R): one seed: seed noise not measured"
    return "router (B3 vs +R): " + suite_stats.power_note(scores["b3"], scores["r"], n_seeds=max(10, 2 * n_seeds),
                                                         unit=" nats")


def collapsing_summary(results: dict[str, list[dict]], n_slots: int, lr_x: float, input_scale: float) -> dict[str, Any]:
    """The collapsing setting's keys and the readings of predictions P3-P6
    (docs/molora_regime.md#m5-predictions): whether B3 (collapsing) collapsed (m <= S/4) in a majority of
    seeds, and the paired difference of the two router contrasts (Delta_R,c - Delta_R) over the same seeds.

    A reading is "holds", "fails", or "not in regime" (P4-P6 where P3 fails)."""
    b3c, rc = results["B3 (collapsing)"], results["+R (collapsing)"]
    m_b3c = [r["monopoly_slots"] for r in b3c]
    collapsed = sum(metrics.collapse_level(m, n_slots) == "collapsed" for m in m_b3c)
    in_regime = collapsed > len(b3c) / 2
    log_ppl = log_ppl_by_cell(results)
    router_c = paired_test(log_ppl["+R (collapsing)"], log_ppl["B3 (collapsing)"])
    router_d = paired_test(log_ppl["+R"], log_ppl["B3"])
    gap = paired_test([0.0] * len(b3c), [c - d for c, d in zip(router_c["diffs"], router_d["diffs"])])

    def reading(ok: bool) -> str:
        return ("holds" if ok else "fails") if in_regime else "not in regime"

    return {"collapse_router_lr_x": lr_x, "collapse_input_scale": input_scale,
            "monopoly_slots_b3_collapsing": float(np.mean(m_b3c)),
            "monopoly_slots_r_collapsing": float(np.mean([r["monopoly_slots"] for r in rc])),
            "top4_share_b3_collapsing": float(np.mean([metrics.top_share(r["shares"]) for r in b3c])),
            "collapsed_seeds_b3_collapsing": int(collapsed), "r0_collapsed_in_collapsing_setting": bool(in_regime),
            "delta_router_collapsing_minus_default": gap["delta"], "delta_router_collapsing_minus_default_low": gap["low"],
            "delta_router_collapsing_minus_default_high": gap["high"], "p_router_collapsing_minus_default": gap["p"],
            "prediction_p3_in_regime": "holds" if in_regime else "fails",
            "prediction_p4_router_helps_where_collapsed": reading(router_c["low"] > 0),
            "prediction_p5_more_than_default": reading(gap["low"] > 0),
            "prediction_p6_below_0p01_nats": reading(router_c["high"] < 0.01)}
