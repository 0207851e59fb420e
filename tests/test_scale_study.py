"""09's study glue on synthetic cells (no model): parameters, gain recovery, the gap, the log fit,
flat summaries and the per-problem score file. The notebook itself runs in tests/test_notebooks.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from copes_lib import runs, stats
from copes_lib.config import ConfigError, build
from copes_lib.protocols import scale_study as ss


def params(**kw):
    return build(ss.ScaleStudyParams, {"PROFILE": "smoke", "SIZES": "smoke,cpu", "WARM_AXIS_SIZE": "smoke", **kw})


@pytest.mark.parametrize("bad, message", [
    ({"SIZES": "smoke,huge"}, "unknown sizes ['huge']"),
    ({"SIZES": "smoke,smoke"}, "names a size twice"),
    ({"WARM_AXIS_SIZE": "cpu-large"}, "WARM_AXIS_SIZE"),
    ({"PROTOCOLS": "paper,tuned"}, "PROTOCOLS"),
    ({"POPULATION": 10}, "POPULATION = 10"),
    ({"MECH_RANDOM": 1}, "MECH_RANDOM = 1"),
    ({"MECH_HELDOUT": 200, "VAL_PROBLEMS": 100}, "MECH_HELDOUT = 200 exceeds VAL_PROBLEMS = 100"),
])
def test_bad_parameters_name_themselves(bad, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        params(**bad)


def test_every_profile_validates_and_gpu_uses_the_cpu_recipe():
    for profile in ("smoke", "cpu", "gpu"):
        from copes_lib.protocols.notebooks import profile_problems

        assert profile_problems(profile, ["09_scale_study"]) == {}
    assert ss.data_profile(params(PROFILE="gpu")) == "cpu"
    assert ss.data_profile(params()) == "smoke"


def synthetic_cell(rng, base=0.4, grpo=0.6, es=0.45, copes=0.5, seeds=5, problems=200, n_params=1000):
    def arm(p, n):
        return [{"scores": (rng.random(problems) < p).astype(float).tolist(), "accuracy": p,
                 "mean_update_norm": 1.0} for _ in range(n)]
    grpo_runs = arm(grpo, 1)
    for r in grpo_runs:
        r["horizon_scores"] = r["scores"]
    return {"size": "x", "warm_steps": 10, "n_params": n_params, "base": arm(base, 1)[0], "grpo": grpo_runs,
            "es": arm(es, seeds), "copes_paper": arm(copes, seeds), "copes_step_matched": arm(es, seeds),
            "mechanism": synthetic_mechanism()}


def synthetic_mechanism(es_z=0.5, copes_z=0.8, grpo_z=6.0, rho2=(0.3, 0.1, 0.5), d_eff=500.0, n=16):
    """What scale_study.mechanism returns, with chosen z-scores (random deltas: mean 0, sd 0.01)."""
    from copes_lib import mechanism as mech

    random = [0.01 * x for x in np.random.default_rng(0).standard_normal(32)]
    random = [r - float(np.mean(random)) for r in random]
    sd = float(np.std(random, ddof=1))
    updates = {name: mech.tail_stats(z * sd, random) for name, z in
               (("es", es_z), ("copes_paper", copes_z), ("grpo", grpo_z))}
    return {"direction_test": {"base": 0.4, "norm": 1.5, "n_random": 32,
                               "random": {"deltas": random, "mean": 0.0, "mean_low": -0.004, "mean_high": 0.004,
                                          "sd": sd},
                               "updates": updates},
            "linear_share": {"rho2": rho2[0], "low": rho2[1], "high": rho2[2], "members": n},
            "curvature": {"d_eff": d_eff, "d_eff_low": d_eff and d_eff / 2, "d_eff_high": d_eff and d_eff * 2,
                          "trace": 10.0, "lambda_max": 10.0 / (d_eff or 1.0), "power_converged": True, "rewarded": 5,
                          "trajectories": 64},
            "population": n, "times": {"updates_s": 1.0, "direction_test_s": 2.0}}


def test_gain_recovery_and_gap_follow_the_scores():
    rng = np.random.default_rng(0)
    cell = synthetic_cell(rng)
    base, grpo = ss.scores(cell, "base").mean(), ss.scores(cell, "grpo").mean()
    rec = ss.gain_recovery(cell, "es")
    assert math.isclose(rec["mean"], (ss.scores(cell, "es").mean() - base) / (grpo - base))
    assert rec["low"] < rec["mean"] < rec["high"]
    comparison = ss.gap(cell, "paper")
    assert math.isclose(comparison.estimate, ss.scores(cell, "copes_paper").mean() - ss.scores(cell, "es").mean())
    assert comparison.verdict == "effect"  # 5 points on 5 x 200 problems
    # no GRPO gain: recovery undefined, not a division by ~0
    flat = synthetic_cell(rng, grpo=0.0)
    assert ss.gain_recovery(flat, "es")["mean"] is None


def test_slope_test_recovers_a_line_and_extrapolates_only_with_four_sizes_and_a_slope_excluding_zero():
    n_params = [1e5, 1e6, 1e7, 1e8]
    line = [0.1, 0.2, 0.3, 0.4]
    tight = ss.slope_test(n_params, line, [v - 0.01 for v in line], [v + 0.01 for v in line], at=1e9)
    assert math.isclose(tight["slope_per_decade"], 0.1) and tight["slope_low"] > 0
    assert tight["extrapolation_allowed"] and math.isclose(tight["at"], 0.5)
    three = ss.slope_test(n_params[:3], line[:3], [v - 0.01 for v in line[:3]], [v + 0.01 for v in line[:3]], at=1e9)
    assert not three["extrapolation_allowed"] and three["at"] is None and three["slope_low"] > 0  # 3 sizes: no 4B
    wide = ss.slope_test(n_params, line, [v - 1 for v in line], [v + 1 for v in line], at=1e9)
    assert wide["slope_low"] < 0 < wide["slope_high"] and wide["at"] is None  # interval spans 0: no 4B
    bare = ss.slope_test(n_params, line)  # no per-size intervals: a slope, no interval, no extrapolation
    assert bare["slope_low"] is None and bare["at"] is None
    assert ss.slope_test([1e5, 1e6], [0.1, None])["slope_per_decade"] is None


def test_mechanism_verdicts_follow_the_registered_rules():
    cell = synthetic_cell(np.random.default_rng(2))
    v = ss.mechanism_summary(cell)
    assert v["mech_power_verdict"] == "powered"  # GRPO z 6, p_tail 1/33
    assert v["mech_es_chance_verdict"] == "at chance" and v["mech_copes_vs_es_verdict"] == "tie"
    assert math.isclose(v["mech_z_bound"], math.sqrt(0.5 * 16) + 1.959963984540054)
    assert v["mech_es_bound_verdict"] == "within bound"
    assert math.isclose(v["mech_predicted_efficiency"], 0.5 * 16 / (500 + 15))
    eff = ss.budget_efficiency(cell, "es")
    base, grpo = ss.scores(cell, "base").mean(), ss.scores(cell, "grpo").mean()
    assert math.isclose(eff["mean"], (ss.scores(cell, "es").mean() - base) / (grpo - base))
    # rule 5: the prediction against the measured interval
    expected = ("consistent" if eff["low"] <= v["mech_predicted_efficiency"] <= eff["high"] else
                "ES below prediction" if eff["high"] < v["mech_predicted_efficiency"] else "ES above prediction")
    assert v["mech_efficiency_verdict"] == expected
    # an ES update far above its first-order bound, CoPES far below it; GRPO not in the tail
    cell["mechanism"] = synthetic_mechanism(es_z=9.0, copes_z=0.0, grpo_z=0.0)
    v = ss.mechanism_summary(cell)
    assert v["mech_es_bound_verdict"] == "above bound" and v["mech_es_chance_verdict"] == "beats chance"
    assert v["mech_copes_vs_es_verdict"] == "ES higher" and v["mech_power_verdict"] == "unpowered"
    assert v["mech_equal_norm_ratio_es"] is None  # the GRPO direction does not beat chance: no ratio
    # no GRPO gain: no reference; no d_eff: efficiency undefined
    flat = synthetic_cell(np.random.default_rng(3), grpo=0.0)
    flat["mechanism"] = synthetic_mechanism(d_eff=None)
    v = ss.mechanism_summary(flat)
    assert v["mech_power_verdict"] == "no reference" and v["mech_efficiency_verdict"] == "undefined"
    assert ss.mechanism_summary({**flat, "mechanism": None}) == {}


def test_cell_summary_is_flat_and_scores_round_trip(tmp_path):
    p = params()
    cell = synthetic_cell(np.random.default_rng(1))
    summary = ss.cell_summary(p, cell, "cpu_large")
    runs.check_summary({k: v for k, v in summary.items()})
    assert summary["mech_power_verdict_cpu_large"] == "powered" and summary["mech_d_eff_cpu_large"] == 500.0
    assert not any(k.startswith(("agreement_", "cos_grpo_", "cos_chance_sd", "grpo_self_agreement")) for k in summary)
    assert {"copes_paper_minus_es_verdict_cpu_large", "gain_recovery_copes_step_matched_low_cpu_large"} <= set(summary)
    ss.save_cell_scores(p, tmp_path, cell, "cpu_large")
    loaded = stats.load_scores(tmp_path)["val_accuracy_at_budget_cpu_large"]
    assert loaded.arms["es"].shape == (p.SEEDS, 200)
    np.testing.assert_array_equal(loaded.arms["copes_paper"], ss.scores(cell, "copes_paper"))
    assert ss.scores_digest(tmp_path) is not None


def test_warm_axis_bases_train_exactly_their_steps(monkeypatch):
    """With 01's stopping rule on, a longer cap stops where 01's recipe stops (the cpu run's
    "converged" base was 01's base again): the axis's bases switch the rule off."""
    from copes_lib import substrate

    seen = []

    class Recorded(Exception):
        pass

    def fake_warm_start(profile, kind, seed=0, *, config, **kw):
        seen.append(config)
        raise Recorded

    monkeypatch.setattr(substrate, "warm_start", fake_warm_start)
    for warm_steps in (None, 8):
        with pytest.raises(Recorded):
            ss.load_substrate(params(), "smoke", warm_steps=warm_steps)
    recipe, axis = seen
    assert recipe.math_target > 0 and recipe.model_size == "smoke"
    assert axis.math_target == 0.0 and axis.math_steps == 8 and axis.model_size == "smoke"


def test_rewarded_nll_is_the_likelihood_of_rewarded_trajectories_and_has_an_effective_rank():
    """On the GRPO tests' tiny Qwen3 and toy sampler: the surrogate keeps only rewarded trajectories,
    its curvature has a positive trace and a d_eff between 1 and the dimension; no reward, no surrogate."""
    import dataclasses

    from copes_lib import mechanism as mech
    from tests.test_grpo import ToyRolloutConfig, tiny_model, toy_rollout

    model = tiny_model()
    loss_fn, info = ss.rewarded_nll(model, None, None, list(range(4)), ToyRolloutConfig(), group_size=8, seed=0,
                                    rollout_fn=toy_rollout)
    assert info["trajectories"] == 32 and 0 < info["rewarded"] < 32
    loss = float(loss_fn(model))
    assert 0 < loss < 20
    r = mech.effective_rank(model, loss_fn, probes=4, iters=8, seed=0, eps=1e-2)
    # at a random initialisation the NLL's Hessian is indefinite: either no d_eff, or one in [1, d]
    assert math.isfinite(r["trace"]) and (r["d_eff"] is None or 1 <= r["d_eff"] <= r["dim"])

    def unrewarded(*args, **kw):
        return dataclasses.replace(toy_rollout(*args, **kw), rewards=[0.0] * 32)

    none, info = ss.rewarded_nll(model, None, None, list(range(4)), ToyRolloutConfig(), group_size=8, seed=0,
                                 rollout_fn=unrewarded)
    assert none is None and info["rewarded"] == 0


def test_the_scale_study_stays_in_the_skill_gap_regime(monkeypatch):
    """01's cpu base is the latent-protocol one (docs/regime.md); 09 keeps the paper-protocol recipe
    (its cache entries and cost) until its map adds the regime axis."""
    from copes_lib import substrate
    from copes_lib.protocols.substrate_setup import substrate_config

    seen = []

    class Recorded(Exception):
        pass

    def fake_warm_start(profile, kind, seed=0, *, config, **kw):
        seen.append(config)
        raise Recorded

    monkeypatch.setattr(substrate, "warm_start", fake_warm_start)
    with pytest.raises(Recorded):
        ss.load_substrate(params(PROFILE="cpu", SIZES="tiny,cpu", WARM_AXIS_SIZE=""), "tiny")
    assert substrate_config("cpu").protocol == "latent" and seen[0].protocol == "paper"
