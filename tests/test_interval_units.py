"""The intervals notebooks 06 and 07 write themselves are cluster-aware (docs/statistics.md S6), as 05's and 09's:
07's test-F1 keys (``f1_ci_*``, CoPES - ES), 06's per-arm accuracies (Table 3, the figure, the summary) and its
norm curve's points resample the seeds, the latent units and the problems within them and report how many units;
a file without unit ids counts every problem as its own unit and says so."""

import numpy as np
import pytest

from copes_lib.protocols import ablations, fixed_budget, norm_curve, tables

UNITS, PER_UNIT, SEEDS = 24, 20, 5
UNIT_IDS = tuple(np.repeat([f"U{u:02d}" for u in range(UNITS)], PER_UNIT))
CARRIERS = np.isin(UNIT_IDS, ["U00", "U01", "U02"])  # the units that carry CoPES's whole edge


def _clustered_f1(seed=0):
    """Per-problem test F1 of 24 units x 20 problems, 5 paired seeds: a unit's problems are alike (its own mean F1,
    shared by every arm and seed), a little seed and problem noise; CoPES's edge sits on 3 units."""
    rng = np.random.default_rng(seed)
    unit_mean = np.repeat(rng.uniform(0.1, 0.9, UNITS), PER_UNIT)
    problem = np.clip(unit_mean + rng.normal(0, 0.03, unit_mean.size), 0, 1)

    def arm(shift=0.0, seeds=SEEDS):
        noise = rng.normal(0, 0.02, (seeds, problem.size))
        return np.clip(problem + np.where(CARRIERS, shift, 0.0) + noise, 0, 1)
    return {"es": arm(), "copes": arm(0.6), "es_sqrtk_alpha": arm(), "base": arm(seeds=1), "full_grpo": arm(seeds=1)}


def _width(keys, low, high):
    return keys[high] - keys[low]


def test_07s_f1_keys_resample_units_and_name_them():
    f1 = _clustered_f1()
    over_units = fixed_budget.qa_f1_intervals(f1, UNIT_IDS)
    independent = fixed_budget.qa_f1_intervals(f1, None)
    for m in f1:  # every method's mean F1: much wider over 24 units than over 480 problems taken as independent
        assert _width(over_units, f"f1_ci_low_{m}", f"f1_ci_high_{m}") > 2 * _width(independent, f"f1_ci_low_{m}",
                                                                                   f"f1_ci_high_{m}"), m
        assert over_units[f"f1_units_{m}"] == UNITS and independent[f"f1_units_{m}"] == UNITS * PER_UNIT
        assert over_units[f"f1_ci_low_{m}"] <= f1[m].mean() <= over_units[f"f1_ci_high_{m}"]
    d, d_flat = "copes_minus_es_f1_ci_low", "copes_minus_es_f1_ci_high"
    assert _width(over_units, d, d_flat) > 2 * _width(independent, d, d_flat)  # the edge sits on 3 units
    assert over_units["copes_minus_es_f1"] == pytest.approx(f1["copes"].mean() - f1["es"].mean())
    assert over_units["copes_minus_es_f1_ci_low"] <= over_units["copes_minus_es_f1"] <= over_units[d_flat]
    assert over_units["copes_minus_es_f1_units"] == over_units["f1_interval_units"] == UNITS
    assert over_units["copes_minus_es_f1_units_effective"] == pytest.approx(UNITS)
    assert over_units["f1_interval_unit_ids"] is True and independent["f1_interval_unit_ids"] is False
    assert "latent units" in over_units["f1_interval_method"]
    assert "problems as independent units" in independent["f1_interval_method"]
    # the flat test calls a 3-unit edge significant; the unit-aware one is less sure of it
    assert independent["copes_minus_es_f1_p"] < over_units["copes_minus_es_f1_p"]
    with pytest.raises(ValueError, match="units"):
        fixed_budget.qa_f1_intervals(f1, UNIT_IDS[:10])


def _clustered_accuracy(seed=1):
    """0/1 validation scores of 24 units x 20 problems: each unit has its own solve rate, shared by every arm."""
    rng = np.random.default_rng(seed)
    rate = np.repeat(rng.uniform(0.05, 0.95, UNITS), PER_UNIT)
    scores = {arm: (rng.random((n, rate.size)) < rate).astype(float) for arm, n in (("k1", 5), ("k4", 5), ("k8", 2))}
    per_seed = {arm: [float(row.mean()) for row in x] for arm, x in scores.items()}  # the logged accuracies
    return per_seed, scores


def test_06s_arm_intervals_resample_units_and_name_them():
    per_seed, scores = _clustered_accuracy()
    val = ablations.arm_intervals(per_seed, scores, UNIT_IDS)
    flat = ablations.arm_intervals(per_seed, scores, None)
    for arm in scores:
        assert val[arm]["high"] - val[arm]["low"] > 2 * (flat[arm]["high"] - flat[arm]["low"]), arm
        assert val[arm]["mean"] == pytest.approx(np.mean(per_seed[arm])) == flat[arm]["mean"]
        assert (val[arm]["units"], flat[arm]["units"], val[arm]["n"]) == (UNITS, UNITS * PER_UNIT, len(per_seed[arm]))
    assert val["k4"]["over"] == f"seeds x {UNITS} latent units"
    assert flat["k4"]["over"] == f"seeds x {UNITS * PER_UNIT} problems as independent units (no unit ids)"
    keys = ablations.arm_keys(val)
    assert keys["val_accuracy_k8"] == pytest.approx(np.mean(per_seed["k8"]))
    assert (keys["val_accuracy_k8_ci_low"], keys["val_accuracy_k8_ci_high"]) == (val["k8"]["low"], val["k8"]["high"])
    assert keys["val_accuracy_k1_units"] == keys["interval_units"] == UNITS and keys["interval_unit_ids"] is True
    assert ablations.arm_keys(flat)["interval_unit_ids"] is False
    t3 = tables.table3_frame(val, {arm: 1.0 for arm in scores}).set_index("variant")
    assert t3.loc["K=4 (default)", "interval over"] == f"seeds x {UNITS} latent units"
    with pytest.raises(ValueError, match="k1"):
        ablations.arm_intervals({**per_seed, "k1": per_seed["k1"][:2]}, scores, UNIT_IDS)


def test_06s_norm_curve_points_resample_units_and_name_them():
    _, scores = _clustered_accuracy(2)
    es = [scores["k1"], scores["k1"][::-1]]
    copes = [scores["k4"], scores["k4"][::-1]]
    norms = lambda v: [[v] * 5, [2 * v] * 5]  # noqa: E731

    def judge(units):
        return norm_curve.judge_curve(es, norms(1.0), copes, norms(1.5), units=units, margin=None,
                                      es_multipliers=(1.0, 2.0), copes_multipliers=(1.0, 2.0), n_boot=500)
    curve, flat = judge(UNIT_IDS), judge([str(i) for i in range(len(UNIT_IDS))])  # every problem its own unit
    for p, q in zip(curve.points, flat.points, strict=True):
        assert p.high - p.low > 2 * (q.high - q.low), p.name
        assert p.low <= np.mean(p.accuracy) <= p.high
    frame = curve.frame()
    assert set(frame["units"]) == {UNITS} and set(flat.frame()["units"]) == {UNITS * PER_UNIT}
    assert list(frame["95% low"]) == [p.low for p in curve.points]
