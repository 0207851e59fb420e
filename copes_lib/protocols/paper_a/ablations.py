"""The CoPES ablations of Table 3 (notebook 06): the arms at fixed N and shared sigma / alpha, and
the paper's orderings read against ours.

Every contrast is k4 minus another arm, tested on per-seed per-problem validation scores with
``copes_lib.stats`` (seed and problem noise both counted) and Holm over the contrasts that were run:
the same family (``claims.FAMILIES``) and the same test as the claims table, so the notebook's reading
and the table agree."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from copes_lib import claims, stats
from copes_lib.protocols.params import ABLATION_KEYS, CLAIM_ARMS, AblationParams

__all__ = ["ABLATION_KEYS", "CLAIM_ARMS", "ablation_configs", "ablation_family", "ablation_reading", "arm_intervals",
           "arm_keys"]
METRIC = "val_accuracy_at_budget"


def ablation_configs(params: AblationParams, sigma: float, alpha: float, seed_index: int) -> dict[str, Any]:
    """The arms of Table 3 plus our two step-size controls (those in ``params.ARMS``), at fixed N and
    shared sigma / alpha."""
    k = params.SUBSPACES
    cfg = lambda **kw: params.es_config(seed_index=seed_index, **kw)  # noqa: E731
    arms = {
        "k1": cfg(subspaces=1, sigma=sigma, alpha=alpha),
        "k2": cfg(subspaces=2, sigma=sigma, alpha=alpha),
        "k4": cfg(subspaces=4, sigma=sigma, alpha=alpha),
        "k8": cfg(subspaces=8, sigma=sigma, alpha=alpha),
        "indep_z": cfg(subspaces=k, sigma=sigma, alpha=alpha, zscore="independent"),
        # the paper's control: sigma doubled, step unchanged (the update does not scale with sigma)
        "es_2sigma": cfg(subspaces=1, sigma=2 * sigma, alpha=alpha),
        # our controls: ES at CoPES's update norm, and CoPES at ES's
        "es_sqrtk_alpha": cfg(subspaces=1, sigma=sigma, alpha=math.sqrt(k) * alpha),
        "copes_matched_step": cfg(subspaces=k, sigma=sigma, alpha=alpha / math.sqrt(k)),
    }
    return {key: arms[key] for key in params.arms()}


def ablation_budget(params: AblationParams) -> tuple[int, str]:
    """(budget, note): BUDGET_STEPS when set, else notebook 05's rule on notebook 04's full GRPO run (its
    best validation step s*, capped at BUDGET_MAX: ``fixed_budget.budget_from``), so k1 and k4 are 05's
    ES and CoPES runs and 06 need not wait for 05 (it reads 04's summary, which its NEEDS guarantee)."""
    from copes_lib import runs
    from copes_lib.config import ConfigError
    from copes_lib.protocols.paper_a.fixed_budget import budget_from, budget_text

    if params.BUDGET_STEPS:
        return params.BUDGET_STEPS, f"budget fixed at {params.BUDGET_STEPS} steps by BUDGET_STEPS (paper: 16)"
    s04 = runs.load_summary(params.PROFILE, "04_grpo") or {}
    if s04.get("full_best_step") is None:
        raise ConfigError(f"BUDGET_STEPS = 0 takes the budget from notebook 04's full GRPO run, but "
                          f"results/{params.PROFILE}/04_grpo/summary.json has no full_best_step: run notebook 04 first "
                          "or set BUDGET_STEPS")
    s_star = int(s04["full_best_step"])
    budget = budget_from(params, s_star)
    return budget, budget_text(params, s_star, budget) + " (notebook 04's full GRPO run, 05's rule)"


def ablation_family(scores: dict[str, np.ndarray], seeds: list[int] | None = None,
                    units: list[str] | tuple[str, ...] | None = None) -> dict[str, stats.Comparison]:
    """k4 vs each other arm that was run (``claims.FAMILIES``'s order), Holm-corrected together.

    ``scores``: arm -> (seeds, problems) correctness at the budget, the same seeds (paired rows) and
    problems for every arm; an arm with fewer seeds (ARM_SEEDS) is paired with the other's first rows. The
    predicted sign is +1 (k4 higher) for every contrast, as in the claims. ``units``: each problem's latent
    unit (``fixed_budget.problem_units``), for cluster-aware intervals (docs/statistics.md S6)."""
    tests = []
    for contrast in claims.FAMILIES["06_copes_ablations"]:
        if contrast.a in scores and contrast.b in scores:
            n = min(len(scores[contrast.a]), len(scores[contrast.b]))
            tests.append(stats.compare(scores[contrast.a][:n], scores[contrast.b][:n], name=contrast.name,
                                       expected_sign=contrast.sign, paired_seeds=True, units=units))
    return {c.name.removeprefix("k4_vs_"): c for c in stats.holm_family(tests)}


def arm_intervals(per_seed: dict[str, list[float]], scores: dict[str, np.ndarray],
                  units: list[str] | tuple[str, ...] | None, *, level: float = 0.95,
                  n_boot: int = 2000) -> dict[str, dict[str, Any]]:
    """Each arm's validation accuracy at the budget with a cluster-aware interval (docs/statistics.md S6), as
    notebook 05's arms: ``mean`` is the seed mean of the logged accuracies (``per_seed``, as before), ``low`` /
    ``high`` the ``level`` interval of the per-problem ``scores`` (seeds, problems) from the seeds x latent units
    x problems-within-units bootstrap (``fixed_budget.mean_interval``; one seed: units and problems only), ``n``
    the seeds, ``units`` / ``units_effective`` the units it rests on (without ``units`` every problem is its own
    unit: ``unit_ids`` False), ``method`` how it resamples and ``over`` the phrase naming the units (``seeds x 128
    latent units``)."""
    from copes_lib.protocols.paper_a.fixed_budget import mean_interval, unit_counts, units_phrase

    out: dict[str, dict[str, Any]] = {}
    for arm, values in per_seed.items():
        x = np.atleast_2d(np.asarray(scores[arm], dtype=float))
        if len(values) != len(x):
            raise ValueError(f"arm {arm!r}: {len(values)} logged accuracies but {len(x)} seed rows of scores")
        n_units, effective, method = unit_counts(units, x.shape[1])
        _, low, high = mean_interval(x, level=level, n_boot=n_boot, units=units)
        out[arm] = {"mean": float(np.mean(values)), "low": low, "high": high, "n": len(values), "units": n_units,
                    "units_effective": effective, "unit_ids": units is not None, "method": method,
                    "over": f"seeds x {units_phrase(n_units, effective, units is not None)}"}
    return out


def arm_keys(val: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """06's per-arm summary keys from :func:`arm_intervals`: ``val_accuracy_<arm>`` (seed mean),
    ``val_accuracy_<arm>_ci_low`` / ``_ci_high`` (cluster-aware 95%; None where undefined) and
    ``val_accuracy_<arm>_units``; ``interval_units``, ``interval_units_effective``, ``interval_unit_ids`` and
    ``interval_method`` (the same for every arm: one set of validation problems)."""
    finite = lambda v: None if v is None or not math.isfinite(v) else float(v)  # noqa: E731
    out: dict[str, Any] = {}
    for arm, s in val.items():
        out.update({f"val_accuracy_{arm}": s["mean"], f"val_accuracy_{arm}_ci_low": finite(s["low"]),
                    f"val_accuracy_{arm}_ci_high": finite(s["high"]), f"val_accuracy_{arm}_units": s["units"]})
    if val:
        s = next(iter(val.values()))
        out.update(interval_units=s["units"], interval_units_effective=s["units_effective"],
                   interval_unit_ids=s["unit_ids"], interval_method=s["method"])
    return out


def ablation_reading(family: dict[str, stats.Comparison], norms: dict[str, float]) -> list[str]:
    """Plain sentences comparing each of the paper's Table-3 orderings (and our controls) with ours:
    the direction, the 95% interval (seed, latent-unit and problem noise), Holm's p over the family, the verdict."""
    what = {"k1": ("CoPES K=4 vs standard ES", "K=4 higher (MATH-500 88.3 vs 78.9)"),
            "k2": ("K=4 vs K=2", "K=4 higher (88.3 vs 86.0)"),
            "k8": ("K=4 vs K=8 (N_k small)", "K=4 far higher (88.3 vs 58.1)"),
            "indep_z": ("joint vs independent z-score", "joint higher (88.3 vs 87.7)"),
            "es_2sigma": ("CoPES vs ES with 2 sigma", "CoPES far higher (88.3 vs 65.3)"),
            "es_sqrtk_alpha": ("CoPES vs ES at CoPES's step size (our control)", "not tested"),
            "copes_matched_step": ("CoPES vs CoPES at ES's step size (our control)", "not tested")}
    lines = []
    for arm, c in family.items():
        title, paper_says = what[arm]
        direction = "higher than" if c.estimate > 0 else "lower than" if c.estimate < 0 else "equal to"
        over = f"{c.n_units} latent units" if c.n_units else f"{c.n_problems} problems as independent units"
        lines.append(f"{title}: k4 is {direction} {arm} by {100 * c.estimate:+.1f} points (95% interval "
                     f"[{100 * c.low:+.1f}, {100 * c.high:+.1f}] over seeds x {over}, Holm p = {c.p_holm:.2g} over {c.family_size} "
                     f"contrasts: {c.verdict}); the paper: {paper_says}.")
    if norms.get("k1"):
        lines.append("Mean update norm relative to standard ES: " + ", ".join(
            f"{k} {norms[k] / norms['k1']:.2f}x" for k in ABLATION_KEYS if k in norms) + ".")
    return lines
