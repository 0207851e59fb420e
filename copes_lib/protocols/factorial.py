"""Paper B's factorial: the chain B3 -> +R -> +R+E -> +R+E+L, one off-chain cell, paired t-tests.

Cells (router, fitness scope, lifecycle):

| cell        | R  | E  | L   |
|-------------|----|----|-----|
| B3          | R0 | E0 | off |  the static baseline
| +R          | R1 | E0 | off |
| +R+E        | R1 | E1 | off |
| +R+E+L      | R1 | E1 | on  |  the full system
| +R+L (E0)   | R1 | E0 | on  |  OFF-CHAIN: the lifecycle with global fitness

The off-chain cell is (R1, E0, L) because in our system the fitness scope acts only through the
lifecycle (it decides who dies and who is cloned): without L, +R+E is the same computation as +R
(one cache entry; its contrast is exactly 0 by construction). With the off-chain cell, the scope
contrast can also be measured where it can act: +R+E+L vs +R+L (E0).

Each cell runs with seeds SEED..SEED+n-1; a seed fixes the pool/router initialisation and the batch
order, identical across cells, so the t-tests are paired (scipy.stats.ttest_rel, df = n - 1).
Delta = balanced log-PPL(reference) - balanced log-PPL(test), nats; positive = the factor helps.
Each contrast also carries the 95% t-interval of the mean paired difference (df = n - 1), drawn in
notebook 12's figure.
"""

from __future__ import annotations

import math

from scipy import stats

from copes_lib.stats import mean_ci

# The paper's Table (docs/paper_b_molora.md#b2-results): contrast -> (Delta nats, t, p); None where the paper gives none.
PAPER_B2 = {
    "router": (0.0426, 12.86, 0.006),
    "eval_scope": (0.0, None, None),
    "lifecycle": (-0.028, -4.46, 0.047),
    "full_vs_b3": (0.015, 1.94, 0.19),
    "inheritance_alpha0": (None, None, None),  # "sign-inconsistent (underpowered)"
}

# cell name -> (router kind, scope, lifecycle on)
CELLS = {
    "B3": ("r0", "e0", False),
    "+R": ("r1", "e0", False),
    "+R+E": ("r1", "e1", False),
    "+R+E+L": ("r1", "e1", True),
    "+R+L (E0)": ("r1", "e0", True),
}
ALPHA0_CELL = "+R+E+L alpha=0"
# cell name -> snake_case key for summary.json
CELL_KEYS = {"B3": "b3", "+R": "r", "+R+E": "r_e", "+R+E+L": "r_e_l", "+R+L (E0)": "r_l_e0", ALPHA0_CELL: "r_e_l_alpha0"}

# contrast -> (test cell, reference cell, what it measures)
CONTRASTS = {
    "router": ("+R", "B3", "router rewrite R (chain)"),
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
