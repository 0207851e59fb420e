"""The norm curve of notebook 06 and its claim A7-curve (docs/regime.md R12, "The curve (norm sweep)"):
interpolation in log-norm, bracketing, every verdict of the registered rule on synthetic scores, bad input,
the points that are 06's arms (the same configs, so their cached runs are reused) and the claims-table row."""

import math

import numpy as np
import pytest

from copes_lib import claims, paper
from copes_lib.config import ConfigError
from copes_lib.protocols import params
from copes_lib.protocols.paper_a import ablations, norm_curve

UNITS = [f"u{i // 4}" for i in range(400)]  # 100 latent units of 4 problems


def _binary(rng, rate, seeds=3, problems=400):
    return (rng.random((seeds, problems)) < rate).astype(float)


def _norms(value, seeds=3):
    return [value] * seeds


def _curve(copes_head, es_low, es_high, *, copes_norm=2.0, es_norm=(1.0, 8.0), margin=0.1, units=UNITS, **kw):
    """A two-point ES curve (alpha x 1 and 2) and a two-point CoPES curve whose headline (x 1) is ``copes_head``."""
    seeds = copes_head.shape[0]
    return norm_curve.judge_curve([es_low, es_high], [_norms(es_norm[0], seeds), _norms(es_norm[1], seeds)],
                                  [copes_head, copes_head], [_norms(copes_norm, seeds), _norms(2 * copes_norm, seeds)],
                                  units=units, margin=margin, es_multipliers=(1.0, 2.0), copes_multipliers=(1.0, 2.0),
                                  n_boot=500, **kw)


def test_interpolation_is_linear_in_log_norm():
    # ES at norms 1 and 8 with accuracies 0.3 and 0.6; CoPES at norm 2: t = log 2 / log 8 = 1/3, so ES's curve
    # there is 0.3 + 0.3 / 3 = 0.4 (linear in the norm itself it would be 0.3 + 0.3 / 7 = 0.343)
    es_low, es_high = np.full((3, 400), 0.3), np.full((3, 400), 0.6)
    curve = _curve(np.full((3, 400), 0.5), es_low, es_high)
    assert curve.bracket == (1.0, 2.0)
    assert curve.es_at_copes_norm == pytest.approx(0.4) and curve.diff == pytest.approx(0.1)
    assert curve.copes_norm == 2.0 and curve.copes_accuracy == pytest.approx(0.5)
    assert curve.n_seeds == 3 and curve.n_units == 100
    # a norm on a point reads that point; the registered five-point ES curve brackets between its neighbours
    assert norm_curve._bracket([1.0, 2.0, 4.0], 1.0) == (0, 1, 0.0)
    assert norm_curve._bracket([1.0, 2.0, 4.0], 4.0) == (1, 2, 1.0)
    j_lo, j_hi, t = norm_curve._bracket([1.0, 2.0, 4.0, 8.0], 2 * math.sqrt(2))
    assert (j_lo, j_hi) == (1, 2) and t == pytest.approx(0.5)


def test_es_points_are_ordered_by_their_measured_norm_and_a_zero_norm_is_left_out():
    # the larger multiplier measured the smaller norm: the curve follows the norms; a point that never moved
    # (norm 0) has no place on a log axis
    es = [np.full((2, 8), 0.6), np.full((2, 8), 0.2), np.full((2, 8), 0.9)]
    copes = [np.full((2, 8), 0.5)] * 2
    curve = norm_curve.judge_curve(es, [[4.0, 4.0], [1.0, 1.0], [0.0, 0.0]], copes, [[2.0, 2.0], [3.0, 3.0]],
                                   units=list("aabbccdd"), margin=None, es_multipliers=(1.0, 2.0, 4.0),
                                   copes_multipliers=(1.0, 2.0), n_boot=50)
    assert curve.bracket == (2.0, 1.0)  # from the point at norm 1 (alpha x 2) to the one at norm 4 (alpha x 1)
    assert curve.es_at_copes_norm == pytest.approx(0.4)
    assert curve.summary()["norm_curve_es_norm_min"] == 1.0


@pytest.mark.parametrize("copes_norm", [0.5, 9.0, 0.0])
def test_a_copes_norm_outside_es_range_is_inconclusive(copes_norm):
    rng = np.random.default_rng(1)
    curve = _curve(_binary(rng, 0.9), _binary(rng, 0.2), _binary(rng, 0.2), copes_norm=copes_norm)
    assert curve.verdict == claims.INCONCLUSIVE and curve.bracket is None and curve.diff is None
    assert "no extrapolation" in curve.reason
    keys = curve.summary()
    assert keys["norm_curve_bracketed"] is False and keys["norm_curve_ci95_low"] is None


def test_each_verdict_of_the_rule():
    rng = np.random.default_rng(7)
    es = _binary(rng, 0.5)
    ahead = _curve(_binary(rng, 0.8), es, _binary(rng, 0.5))
    assert ahead.verdict == claims.AGREES and ahead.ci95[0] > 0
    behind = _curve(_binary(rng, 0.2), es, _binary(rng, 0.5))
    assert behind.verdict == claims.OPPOSITE and behind.ci95[1] < 0
    same = es.copy()
    same[:, :4] = 1 - same[:, :4]  # 1% of the problems differ: inside +-0.1
    level = _curve(same, es, es)
    assert level.verdict == claims.DISAGREES and -0.1 < level.ci90[0] and level.ci90[1] < 0.1
    assert level.ci95[0] <= 0 <= level.ci95[1]
    # the same data without a margin cannot rule an effect out
    assert _curve(same, es, es, margin=None).verdict == claims.INCONCLUSIVE
    # few units: the interval spans 0 and is wider than the margin
    few = [f"u{i // 4}" for i in range(16)]
    wide = _curve(_binary(rng, 0.55, problems=16), _binary(rng, 0.5, problems=16), _binary(rng, 0.5, problems=16),
                  units=few, margin=0.05)
    assert wide.verdict == claims.INCONCLUSIVE and wide.ci95[0] < 0 < wide.ci95[1]
    assert wide.n_units == 4


def test_units_widen_the_interval():
    # the effect sits on a few units: resampling units (the rule's bootstrap) is wider than resampling problems
    rng = np.random.default_rng(3)
    es = _binary(rng, 0.5)
    copes = es.copy()
    copes[:, :40] = 1.0  # 10 of 100 units carry all of it
    clustered = _curve(copes, es, es)
    independent = _curve(copes, es, es, units=[f"p{i}" for i in range(400)])
    width = lambda c: c.ci95[1] - c.ci95[0]  # noqa: E731
    assert width(clustered) > 1.5 * width(independent)
    assert clustered.n_units == 100 and independent.n_units == 400


def test_one_seed_per_point_does_not_agree():
    rng = np.random.default_rng(2)
    es = _binary(rng, 0.3, seeds=1)
    up = _curve(_binary(rng, 0.9, seeds=1), es, es)
    assert up.verdict == claims.INCONCLUSIVE and "1 seed" in up.reason
    down = _curve(_binary(rng, 0.05, seeds=1), _binary(rng, 0.8, seeds=1), _binary(rng, 0.8, seeds=1))
    assert down.verdict == claims.OPPOSITE and "provisional" in down.reason


def test_bad_input_names_the_parameter():
    rng = np.random.default_rng(0)
    x = _binary(rng, 0.5)
    args = dict(es_scores=[x, x], es_norms=[_norms(1.0), _norms(2.0)], copes_scores=[x, x],
                copes_norms=[_norms(1.5), _norms(3.0)], units=UNITS, margin=0.1, copes_multipliers=(1.0, 2.0))
    with pytest.raises(ValueError, match="es_multipliers"):
        norm_curve.judge_curve(**args, es_multipliers=(2.0, 1.0))
    with pytest.raises(ValueError, match="copes_multipliers"):
        norm_curve.judge_curve(**{**args, "copes_multipliers": (1.0, 1.0)}, es_multipliers=(1.0, 2.0))
    with pytest.raises(ValueError, match=r"copes_scores\[1\].*paired seeds"):
        norm_curve.judge_curve(**{**args, "copes_scores": [x, x[:2]]}, es_multipliers=(1.0, 2.0))
    with pytest.raises(ValueError, match=r"es_scores and es_norms"):
        norm_curve.judge_curve(**args, es_multipliers=(1.0, 2.0, 4.0))
    with pytest.raises(ValueError, match=r"es_norms\[0\]"):
        norm_curve.judge_curve(**{**args, "es_norms": [[1.0, 1.0], _norms(2.0)]}, es_multipliers=(1.0, 2.0))
    with pytest.raises(ValueError, match="headline"):
        norm_curve.judge_curve(**args, es_multipliers=(1.0, 2.0), headline=0.5)
    with pytest.raises(ValueError, match="margin"):
        norm_curve.judge_curve(**{**args, "margin": 0.0}, es_multipliers=(1.0, 2.0))
    with pytest.raises(ValueError, match="units"):
        norm_curve.judge_curve(**{**args, "units": UNITS[:10]}, es_multipliers=(1.0, 2.0))


def test_the_registered_points_and_the_arms_they_share():
    # docs/regime.md R12's multipliers, and the points that are 06's arms: identical configs, so the runs (and
    # their cache entries) are shared, never trained twice
    assert norm_curve.ES_MULTIPLIERS == pytest.approx((1, math.sqrt(2), 2, 2 * math.sqrt(2), 4))
    assert norm_curve.COPES_MULTIPLIERS == pytest.approx((0.5, 1 / math.sqrt(2), 1, math.sqrt(2), 2))
    p = params.AblationParams(ARMS=",".join(ablations.ABLATION_KEYS))
    for seed_index in (0, 2):
        arms = ablations.ablation_configs(p, 0.01, 0.005, seed_index)
        points = norm_curve.curve_configs(p, 0.01, 0.005, seed_index)
        assert len(points) == 10
        assert points["es_x1p000"] == arms["k1"] and points["copes_x1p000"] == arms["k4"]
        assert points["es_x2p000"] == arms["es_sqrtk_alpha"] and points["copes_x0p500"] == arms["copes_matched_step"]
        assert {c.sigma for c in points.values()} == {0.01} and {c.seed for c in points.values()} == {p.ES_SEED + seed_index}


def test_the_parameter_is_checked():
    assert params.AblationParams().NORM_CURVE_SEEDS == 3
    with pytest.raises(ConfigError, match="NORM_CURVE_SEEDS"):
        params.AblationParams(SEEDS=2, ARM_SEEDS=2, NORM_CURVE_SEEDS=3)
    assert params.AblationParams(NORM_CURVE_SEEDS=0).NORM_CURVE_SEEDS == 0


def _rows(s06, math_met=True):
    return {r["claim"]: r for r in claims.judge_claims({
        "01_substrate_and_agent": {"regime_criterion_met_math": math_met, "regime_criterion_met_qa": True,
                                   claims.GATE_RULE_KEY: claims.GATE_RULE},
        "05_fixed_budget_math": {"base_val_accuracy": 0.4, "full_grpo_best_val_accuracy": 0.9},
        "06_copes_ablations": s06})}


def test_the_claims_table_judges_a7_curve_with_a7s_margin_and_math_gate():
    rng = np.random.default_rng(7)
    es = _binary(rng, 0.5)
    near = es.copy()
    near[:, :4] = 1 - near[:, :4]
    # the notebook had no margin (05 not yet run), the table applies A7's: 0.5 x 0.246 x (0.9 - 0.4)
    level = _curve(near, es, es, margin=None)
    assert level.verdict == claims.INCONCLUSIVE
    row = _rows(level.summary())["A7-curve"]
    margin = paper.EQUIVALENCE_FRACTION * paper.EFFECT_SHARE_A["k4_vs_es_sqrtk_alpha"] * 0.5
    assert row["verdict"] == claims.DISAGREES and f"+-{100 * margin:.2g} pts" in row["reason"]
    assert "100 units" in row["ours"] and "3 seed(s)" in row["ours"]
    ahead = _curve(_binary(rng, 0.8), es, es).summary()
    assert _rows(ahead)["A7-curve"]["verdict"] == claims.AGREES
    gated = _rows(ahead, math_met=False)["A7-curve"]
    assert gated["verdict"] == claims.NOT_IN_REGIME and "would read agrees" in gated["reason"]
    assert claims.gate_task("A7-curve") == "math"
    off = _rows(norm_curve.not_measured_summary())["A7-curve"]
    assert off["verdict"] == claims.MISSING and "norm_curve_copes_norm" in off["ours"]
    outside = _rows(_curve(_binary(rng, 0.9), es, es, copes_norm=20.0).summary())["A7-curve"]
    assert outside["verdict"] == claims.INCONCLUSIVE and "outside" in outside["reason"]
