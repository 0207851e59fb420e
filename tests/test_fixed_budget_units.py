"""Notebook 05's intervals are cluster-aware (docs/statistics.md S6): CoPES - ES, the arms' means at the budget and
pass@k resample the latent units and the problems within them and report the unit count; and 05 says loudly when it
retrains full GRPO instead of reusing notebook 04's runs (docs/reference.md R4)."""

import types

import numpy as np
import pytest

from copes_lib.protocols import params
from copes_lib.protocols.paper_a import fixed_budget
from copes_lib.tasks import load_tasks

UNITS, PER_UNIT, SEEDS = 24, 20, 5


def _unit_effect(seed=0):
    """ES and CoPES (two protocols) on 24 units of 20 problems, 5 paired seeds: CoPES's whole edge sits on 3 units
    (every problem there solved by CoPES, 30% by ES); elsewhere both arms share each problem's score."""
    rng = np.random.default_rng(seed)
    units = np.repeat([f"U{u:02d}" for u in range(UNITS)], PER_UNIT)
    rate = np.repeat(rng.uniform(0.1, 0.9, UNITS), PER_UNIT)
    es = (rng.random((SEEDS, units.size)) < rate).astype(float)
    copes = es.copy()
    carried = np.isin(units, ["U00", "U01", "U02"])
    es[:, carried] = (rng.random((SEEDS, carried.sum())) < 0.3).astype(float)
    copes[:, carried] = 1.0
    arms = {"es": es, "copes": copes, "copes_paper_protocol": copes, "copes_tuned_protocol": copes[:2]}
    return arms, tuple(units)


def test_copes_minus_es_is_wider_over_units_and_reports_their_count():
    arms, units = _unit_effect()
    over_units = fixed_budget.budget_intervals(arms, units, ["paper", "tuned"], "paper")
    independent = fixed_budget.budget_intervals(arms, None, ["paper", "tuned"], "paper")
    width = lambda s, sfx="": s[f"copes_minus_es_ci_high{sfx}"] - s[f"copes_minus_es_ci_low{sfx}"]  # noqa: E731
    assert width(over_units) > 2 * width(independent)  # a few units carry the edge: problems are not independent
    assert over_units["copes_minus_es_units"] == over_units["interval_units"] == UNITS
    assert over_units["copes_minus_es_units_effective"] == pytest.approx(UNITS)
    assert independent["copes_minus_es_units"] == UNITS * PER_UNIT and not independent["interval_unit_ids"]
    # the headline's keys are its protocol's; a control runs its first seeds and gets its own interval
    assert over_units["copes_minus_es_ci_low"] == over_units["copes_minus_es_ci_low_paper_protocol"]
    assert width(over_units, "_tuned_protocol") > width(independent, "_tuned_protocol")
    for s in (over_units, independent):
        assert s["copes_minus_es_ci_low"] <= s["copes_minus_es_val_accuracy"] <= s["copes_minus_es_ci_high"]
        assert s["copes_minus_es_val_accuracy"] == pytest.approx(arms["copes"].mean() - arms["es"].mean())
    # the arms' means too: the bootstrap over units is wider than the one over problems
    mean_width = lambda s, key: s[f"{key}_ci_high"] - s[f"{key}_ci_low"]  # noqa: E731
    assert mean_width(over_units, "val_accuracy_es_at_budget") > mean_width(independent, "val_accuracy_es_at_budget")
    assert over_units["val_accuracy_copes_at_budget_units_tuned_protocol"] == UNITS


def test_the_comparison_table_and_the_reading_show_the_units():
    arms, units = _unit_effect()
    intervals = fixed_budget.budget_intervals(arms, units, ["paper"], "paper")
    compare = {"paper": {"es": {"mean": 0.5, "n": SEEDS}, "copes": {"mean": 0.6, "n": SEEDS},
                         "es_vals": [0.5] * SEEDS, "copes_vals": [0.6] * SEEDS, "gain_recovery_es": 0.2,
                         "gain_recovery_copes": 0.4, "copes_minus_es": {"mean": 0.1, "p": 0.01, "n": SEEDS}}}
    p = params.FixedBudgetParams(PROFILE="smoke")
    settings = {"es_sigma": 0.01, "es_alpha": 0.005, "copes_sigma": 0.01, "copes_alpha": 0.005}
    frame = fixed_budget.comparison_frame(p, settings, compare, intervals)
    assert list(frame["units"]) == [f"{UNITS} latent units"] * 3
    assert all(f"over {UNITS} units" in text for text in frame["95% CI"])
    (line,) = [x for x in fixed_budget.protocol_reading(compare, "paper", intervals) if "CoPES - ES" in x]
    assert f"{UNITS} latent units" in line and "paired t" not in line


def test_pass_at_k_intervals_resample_units():
    rng = np.random.default_rng(3)
    units = np.repeat([f"U{u}" for u in range(16)], 8)
    counts = np.repeat(rng.integers(0, 9, 16), 8)  # every problem of a unit alike: the units are the sample
    results = {"m": {"correct_counts": counts.tolist(), "samples": 8}}
    by_unit = fixed_budget.pass_at_k_intervals(results, units=tuple(units))
    by_problem = fixed_budget.pass_at_k_intervals(results)
    assert (by_unit["high"] - by_unit["low"]).iloc[0] > 1.5 * (by_problem["high"] - by_problem["low"]).iloc[0]
    assert set(by_unit["units"]) == {16} and set(by_problem["units"]) == {128}
    with pytest.raises(ValueError, match="units"):
        fixed_budget.pass_at_k_intervals(results, units=tuple(units[:10]))


def test_05_says_so_when_it_retrains_the_full_grpo_reference():
    """R4: 05 reuses 04's full-GRPO runs where they validated on 05's problems; where not (smoke: 04's N_VAL 4,
    05's VAL_PROBLEMS 8) it trains its own, and must say so: a warning naming both parameters, and summary keys."""
    val = load_tasks("smoke", "math", "val")
    p = params.FixedBudgetParams(PROFILE="smoke", VAL_PROBLEMS=8)
    agent = types.SimpleNamespace(objective=types.SimpleNamespace(val_tasks=val[:8]))
    with pytest.warns(fixed_budget.ReferenceRetrainedWarning, match="N_VAL = 4.*VAL_PROBLEMS = 8"):
        keys = fixed_budget.reference_reuse(p, agent)
    assert keys["reference_retrained"] is True and "VAL_HOLDOUT" in keys["reference_retrained_reason"]
    same = types.SimpleNamespace(objective=types.SimpleNamespace(val_tasks=val[:4]))
    assert fixed_budget.reference_reuse(p, same) == {"reference_retrained": False, "reference_retrained_reason": None}
