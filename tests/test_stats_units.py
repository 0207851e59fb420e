"""Cluster-aware intervals: problems that share a latent unit are not independent draws, so every claim's
interval and test resamples or models the units (with seeds, and problems within units); the power
analysis plans units, seeds and problems from a pilot's variance components."""

import numpy as np
import pytest

from copes_lib import claims, stats


def _clustered(rng, units=24, per_unit=20, seeds=3, unit_sd=0.3):
    """Two arms on the same problems whose difference is carried by the units: each unit its own effect
    (mean 0 over the population of units), each problem a 0/1 score."""
    ids = np.repeat(np.arange(units), per_unit).astype(str)
    effect = rng.normal(0.0, unit_sd, units)
    base = rng.uniform(0.3, 0.7, units)
    rate_a = np.clip(base + effect, 0, 1)
    a = (rng.random((seeds, units * per_unit)) < np.repeat(rate_a, per_unit)).astype(float)
    b = (rng.random((seeds, units * per_unit)) < np.repeat(base, per_unit)).astype(float)
    return a, b, ids


def test_unit_aware_intervals_cover_where_problem_level_ones_do_not():
    rng = np.random.default_rng(1)
    hits = {"problems": 0, "units": 0}
    reps = 200
    for _ in range(reps):
        a, b, ids = _clustered(rng)
        for key, units in (("problems", None), ("units", ids)):
            c = stats.compare(a, b, units=units)
            hits[key] += c.low <= 0 <= c.high  # the population effect is 0 (symmetric unit effects)
    assert hits["units"] / reps >= 0.90
    assert hits["problems"] / reps <= 0.85  # 24 units of 20 problems read as 480 independent problems


def test_without_a_unit_effect_units_cost_little():
    rng = np.random.default_rng(2)
    ids = np.repeat(np.arange(100), 5).astype(str)
    a, b = (rng.random((5, 500)) < 0.6).astype(float), (rng.random((5, 500)) < 0.5).astype(float)
    naive, unit = stats.compare(a, b), stats.compare(a, b, units=ids)
    assert unit.estimate == pytest.approx(naive.estimate)
    assert unit.se == pytest.approx(naive.se, rel=0.25)
    assert (unit.n_units, unit.n_units_effective, unit.n_problems) == (100, 100.0, 500)
    assert naive.n_units is None


def test_unit_columns_keep_the_mean_with_unequal_units():
    rng = np.random.default_rng(3)
    ids = np.array(list("aaaaabbbcd" * 3))
    x = rng.random((2, ids.size))
    codes, sizes = stats.unit_codes(ids, ids.size)
    cols = stats.to_unit_columns(x, codes, sizes)
    assert cols.shape == (2, 4) and cols.mean() == pytest.approx(x.mean())
    assert stats.effective_units(sizes) < 4
    with pytest.raises(ValueError, match="one unit id per problem column"):
        stats.unit_codes(ids[:-1], ids.size)


def test_the_cluster_bootstrap_agrees_with_the_model():
    rng = np.random.default_rng(4)
    a, b, ids = _clustered(rng, units=60, per_unit=8, seeds=5)
    model = stats.compare(a, b, units=ids)
    boot = stats.compare(a, b, units=ids, method="bootstrap", n_boot=3000)
    assert boot.se == pytest.approx(model.se, rel=0.3)
    assert boot.se > stats.compare(a, b, method="bootstrap", n_boot=3000).se  # units widen it


def test_units_travel_with_the_scores_and_the_claims_show_them(tmp_path):
    rng = np.random.default_rng(5)
    a, b, ids = _clustered(rng, units=30, per_unit=10, seeds=3)
    stats.save_scores(tmp_path, "val_accuracy_at_budget", {"copes": a, "es": b}, [0, 1, 2], units=ids)
    ss = stats.load_scores(tmp_path)["val_accuracy_at_budget"]
    assert ss.units == tuple(ids)
    c = ss.compare("copes", "es")
    assert c.n_units == 30 and c.se == pytest.approx(stats.compare(a, b, units=ids).se)
    assert "over 30 units" in claims._stat(c, 100, " pts")
    no_units = stats.compare(a, b)
    assert "300 problems as independent units (no unit ids saved)" in claims._stat(no_units, 100, " pts")
    with pytest.raises(ValueError, match="one unit id per problem column"):
        stats.save_scores(tmp_path, "other", {"copes": a}, [0, 1, 2], units=ids[:5])


def test_gain_recovery_resamples_units():
    rng = np.random.default_rng(6)
    a, b, ids = _clustered(rng, units=24, per_unit=20, seeds=3, unit_sd=0.2)
    ref = np.clip(b + (rng.random(b.shape) < 0.5), 0, 1)
    arms = {"method": a, "base": b[:1], "full_grpo": ref[:1]}
    seeds = {k: tuple(range(len(v))) for k, v in arms.items()}
    flat = stats.gain_recovery_interval(stats.ScoreSet("m", arms, seeds), "method")
    clustered = stats.gain_recovery_interval(stats.ScoreSet("m", arms, seeds, units=tuple(ids)), "method")
    assert clustered.estimate == pytest.approx(flat.estimate)
    assert clustered.high - clustered.low > flat.high - flat.low
    assert "24 units" in clustered.note


def test_variance_components_and_the_power_plan():
    rng = np.random.default_rng(7)
    n_units, per_unit, seeds = 80, 6, 4
    ids = np.repeat(np.arange(n_units), per_unit).astype(str)
    d = (0.05 + rng.normal(0, 0.03, seeds)[:, None] + np.repeat(rng.normal(0, 0.2, n_units), per_unit)[None]
         + rng.normal(0, 0.1, n_units * per_unit)[None] + rng.normal(0, 0.1, (seeds, n_units * per_unit)))
    vc = stats.variance_components(d, np.zeros_like(d), ids)
    assert vc.between_unit == pytest.approx(0.04, rel=0.4) and vc.within_unit == pytest.approx(0.01, rel=0.4)
    assert vc.residual == pytest.approx(0.01, rel=0.2)
    plan = stats.units_needed(vc, 0.05, seeds=5, problems_per_unit=4)
    # the plan is the smallest: one unit fewer no longer decides at the margin
    se_less = np.sqrt(vc.variance_of_mean(5, plan.units - 1, 4))
    assert stats.minimum_detectable_effect(se_less, plan.units - 2) > 0.05 >= plan.mde
    assert plan.problems == plan.units * 4
    assert stats.units_needed(vc, 0.05, seeds=5, problems_per_unit=16).units <= plan.units  # more problems help
    # the seed term does not shrink with units: a tiny margin cannot be reached at any number of units
    assert stats.units_needed(stats.VarianceComponents(0.01, 0.01, seed=0.01), 0.01, seeds=2,
                              problems_per_unit=4).units is None
    grid = stats.power_plan(vc, 0.05, seeds=(3, 5), problems_per_unit=(2, 4))
    assert len(grid) == 4 and all(p.units is not None for p in grid)


@pytest.mark.parametrize("power", [0, 1, 1.5, -0.2])
def test_a_power_target_outside_0_1_is_a_clear_error(power):
    vc = stats.VarianceComponents(0.01, 0.01, 0.0)
    with pytest.raises(ValueError, match=r"power must be in \(0, 1\)"):
        stats.units_needed(vc, 0.05, seeds=3, problems_per_unit=4, power=power)
    with pytest.raises(ValueError, match=r"power must be in \(0, 1\)"):
        stats.power_plan(vc, 0.05, power=power)


def test_negative_variance_components_are_refused():
    with pytest.raises(ValueError, match="between_unit must be a finite variance >= 0"):
        stats.VarianceComponents(-0.1, 0.0, 0.0)
