"""09's study glue on synthetic cells (no model): parameters, gain recovery, the gap, the log fit,
flat summaries and the per-problem score file. The notebook itself runs in tests/test_notebooks.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from copes_lib import runs, stats
from copes_lib.config import ConfigError, build
from copes_lib.protocols import study as ss


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


class Recorded(Exception):
    """Raised by the recording warm start: the test only wants the configs it was called with."""


def recorded_warm_starts(monkeypatch) -> list:
    """substrate.warm_start replaced by one that records its config and stops (no training)."""
    from copes_lib import substrate

    seen = []

    def fake_warm_start(profile, kind, seed=0, *, config, **kw):
        seen.append(config)
        raise Recorded

    monkeypatch.setattr(substrate, "warm_start", fake_warm_start)
    return seen


def test_warm_axis_bases_train_exactly_their_steps(monkeypatch):
    """With 01's stopping rule on, a longer cap stops where 01's recipe stops (the cpu run's
    "converged" base was 01's base again): the axis's bases switch the rule off."""
    seen = recorded_warm_starts(monkeypatch)
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
    """01's cpu base is the latent-protocol one (docs/regime.md); 09's scale axis keeps the paper-protocol
    recipe (its cache entries and cost); the map adds the latent regime."""
    from copes_lib.protocols.testbed.substrate_setup import substrate_config

    seen = recorded_warm_starts(monkeypatch)
    with pytest.raises(Recorded):
        ss.load_substrate(params(PROFILE="cpu", SIZES="tiny,cpu", WARM_AXIS_SIZE=""), "tiny")
    assert substrate_config("cpu").protocol == "latent" and seen[0].protocol == "paper"


# ----------------------------------------------------------------------------------------- the map
def map_params(**kw):
    return params(**{"MAP_SIZE": "tiny", "MAP_PRIORS": "0,0.1,0.3", "MAP_POPULATIONS": "20,40,80",
                     "MAP_SUBSPACES": 0, "MAP_CONTROL_POPULATIONS": "40", "MAP_HEADLINE_P": 0.1,
                     "MAP_HEADLINE_N": 40, "BACKEND": "batched", "CHUNK_SIZE": 8, **kw})


@pytest.mark.parametrize("bad, message", [
    ({"MAP_POPULATIONS": "10,40,80"}, "MAP_POPULATIONS = '10,40,80' with MAP_SUBSPACES = 0: N = [10] give CoPES N_k"),
    ({"MAP_POPULATIONS": "20,40,80", "MAP_SUBSPACES": 4}, "N = [20] give CoPES N_k = N / K < 10"),
    ({"MAP_POPULATIONS": "40,45,80"}, "N = [45] give CoPES N_k"),
    ({"MAP_SUBSPACES": 1}, "MAP_SUBSPACES = 1 is standard ES"),
    ({"MAP_CONTROL_POPULATIONS": "40,160"}, "MAP_CONTROL_POPULATIONS = '40,160': [160] not in"),
    ({"MAP_PRIORS": "0,0.5,1.0"}, "out of range: [1.0]"),
    ({"MAP_PRIORS": "0,-0.1,0.1"}, "out of range: [-0.1]"),
    ({"MAP_PRIORS": "0.1,0.3"}, "with 0 included"),
    ({"MAP_HEADLINE_P": 0.2}, "MAP_HEADLINE_P = 0.2 must be one of MAP_PRIORS"),
    ({"MAP_HEADLINE_N": 50}, "MAP_HEADLINE_N = 50 must be one of MAP_POPULATIONS"),
    ({"MAP_POPULATIONS": "80,40"}, "small to large"),
    ({"MAP_REGIMES": "latent,protocol"}, "MAP_REGIMES = 'latent,protocol': valid values are ['latent', 'graded', "
                                          "'homogeneous', 'skill_gap']"),
    ({"MAP_REGIMES": "graded,graded"}, "MAP_REGIMES = 'graded,graded': valid values"),
    ({"MAP_SIZE": "huge"}, "MAP_SIZE = 'huge'"),
    ({"BACKEND": "sequential"}, "BACKEND = 'sequential'"),
])
def test_map_grid_errors_name_the_parameter(bad, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        map_params(**bad)


def test_map_grid_and_tags():
    p = map_params()
    assert ss.map_bases(p) == [("latent", 0.0), ("latent", 0.1), ("latent", 0.3), ("graded", None),
                               ("homogeneous", 0.1), ("skill_gap", None)]
    assert ss.map_bases(map_params(MAP_REGIMES="latent,skill_gap")) == [("latent", 0.0), ("latent", 0.1),
                                                                       ("latent", 0.3), ("skill_gap", None)]
    # the contrasts need no latent row; the homogeneous base sits at the headline p
    assert ss.map_bases(map_params(MAP_REGIMES="homogeneous,graded", MAP_HEADLINE_P=0.3, MAP_LOWRANK_CELLS="")) == [
        ("homogeneous", 0.3), ("graded", None)]
    assert ss.map_tag("latent", 0.1, 40) == "latent_p0_1_n40" and ss.map_tag("skill_gap", None, 160) == "skill_gap_n160"
    assert ss.map_tag("latent", 0.0) == "latent_p0"
    assert ss.map_tag("graded", None) == "graded" and ss.map_tag("graded", None, 20) == "graded_n20"
    assert ss.map_tag("homogeneous", 0.1, 40) == "homogeneous_p0_1_n40"
    assert len({ss.map_tag(*b) for b in ss.map_bases(p)}) == 6  # every base its own keys
    assert [p.map_subspaces(n) for n in p.map_populations()] == [2, 4, 8]  # N_k = 10 throughout
    assert map_params(MAP_SUBSPACES=2).map_subspaces(80) == 2
    assert map_params(MAP_CONTROL_POPULATIONS="").map_control_populations() == [20, 40, 80]
    assert ss.map_bases(params(MAP_SIZE="")) == []  # no map: nothing to validate, nothing to run


class LinearRegression:
    """Fitness -mean((X W^T - Y)^2) of an nn.Linear on fixed rows; batched over members (Population)."""

    def __init__(self, d=8, rows=16, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(rows, d, generator=gen)
        self.y = self.x @ torch.randn(d, d, generator=gen).T
        self.calls = []

    def rows_per_member(self, step):
        return len(self.x)

    def fitness(self, model, step):
        return -float(((model(self.x) - self.y) ** 2).mean())

    @torch.no_grad()
    def population_fitness(self, model, step, n_members, row_hook):
        row_hook(list(range(n_members * len(self.x))))
        out = model(self.x.repeat(n_members, 1)).reshape(n_members, len(self.x), -1)
        values = (-((out - self.y) ** 2).mean(dim=(1, 2))).tolist()
        self.calls.append(values)
        return values

    def validate(self, model):
        return {"score": self.fitness(model, 0)}

    def gradient(self, model):
        model.zero_grad()
        (-((model(self.x) - self.y) ** 2).mean()).backward()
        return model.weight.grad.flatten().clone()


def one_update(config, objective, seed=0):
    from copes_lib.es import ES, es_step
    from copes_lib.es_backends import make_backend

    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 8, bias=False)
    before = model.weight.detach().flatten().clone()
    es = ES(model, config)
    result = es_step(es, 1, objective, make_backend(es))
    return model.weight.detach().flatten() - before, result, model


def test_shuffled_fitness_permutes_the_rewards_and_its_update_is_uncorrelated_with_the_true_one():
    p = map_params(SIGMA=0.05, ALPHA=0.05)
    cos_true, cos_shuffled, cos_between = [], [], []
    for s in range(12):
        truth = LinearRegression(seed=s)
        u_true, _, _ = one_update(ss.map_arm_config(p, "es", 40, s), truth)
        inner = LinearRegression(seed=s)
        shuffled = ss.ShuffledFitness(inner, seed=s)
        u_shuf, _, _ = one_update(ss.map_arm_config(p, "es_shuffled", 40, s), shuffled)
        # the wrapper hands ES a permutation of the very values the objective computed, not the identity
        values = inner.calls[-1]
        perm = shuffled.permutation(1, len(values))
        assert sorted(np.asarray(values)[perm]) == sorted(values) and not np.array_equal(perm, np.arange(len(values)))
        torch.manual_seed(s)
        start = torch.nn.Linear(8, 8, bias=False)
        grad = truth.gradient(start)
        cos = torch.nn.functional.cosine_similarity
        cos_true.append(float(cos(u_true, grad, dim=0)))
        cos_shuffled.append(float(cos(u_shuf, grad, dim=0)))
        cos_between.append(float(cos(u_shuf, u_true, dim=0)))
    # the true update follows the gradient; the shuffled one does not, and is unrelated to the true one
    # (chance |cos| in 64 dimensions ~ 1/8 per draw, ~0.036 for a mean of 12)
    assert np.mean(cos_true) > 0.5
    assert abs(np.mean(cos_shuffled)) < 0.12 and abs(np.mean(cos_between)) < 0.12


def test_sqrtk_alpha_control_has_sqrtk_times_es_update_norm_and_copes_length():
    p = map_params(SIGMA=0.05, ALPHA=0.05)
    ratios_es, ratios_copes = [], []
    for s in range(6):
        u_es, r_es, _ = one_update(ss.map_arm_config(p, "es", 40, s), LinearRegression(seed=s))
        u_k, r_k, _ = one_update(ss.map_arm_config(p, "es_sqrtk", 40, s), LinearRegression(seed=s))
        _, r_c, _ = one_update(ss.map_arm_config(p, "copes", 40, s), LinearRegression(seed=s))
        ratios_es.append(r_k.update_norm / r_es.update_norm)
        ratios_copes.append(r_k.update_norm / r_c.update_norm)
        # same noise and rewards: the same direction, sqrt(K) times longer
        assert float(torch.nn.functional.cosine_similarity(u_es, u_k, dim=0)) == pytest.approx(1.0, abs=1e-5)
    assert ratios_es == pytest.approx([2.0] * 6, rel=1e-4)  # sqrt(K), K = 4
    assert np.mean(ratios_copes) == pytest.approx(1.0, abs=0.25)  # CoPES's own step length, in expectation
    assert ss.map_arm_config(p, "copes", 40, 0).subspaces == 4 and ss.map_arm_config(p, "es_sqrtk", 40, 0).subspaces == 1


def synthetic_map_base(rng, regime, p, pops=(20, 40, 80), base_strict=0.1, base_lenient=0.6, grpo_strict=0.5,
                       es_strict=0.2, copes_strict=0.25, problems=200, seeds=3, d_eff=50.0):
    def runs(strict, lenient, n):
        return [{"strict": (rng.random(problems) < strict).astype(float).tolist(),
                 "lenient": (rng.random(problems) < lenient).astype(float).tolist(),
                 "scores": [0.0] * problems, "mean_update_norm": 1.0, "mean_step_s": 0.1} for _ in range(n)]
    base = runs(base_strict, base_lenient, 1)[0]
    base["criterion"] = {"met": True}
    grpo = runs(grpo_strict, base_lenient, 3)
    for r in grpo:
        r["horizon_strict"], r["horizon_lenient"] = r["strict"], r["lenient"]
    cells = {n: {"es": runs(es_strict, base_lenient, seeds), "copes": runs(copes_strict, base_lenient, seeds)}
             for n in pops}
    cells[40].update(es_shuffled=runs(base_strict, base_lenient, seeds), es_sqrtk=runs(es_strict, base_lenient, seeds))
    return {"regime": regime, "p": p, "n_params": 45280, "warm_steps": 10, "converged": True, "base": base,
            "grpo": grpo, "cells": cells, "mechanism": {"curvature": {"d_eff": d_eff}}}


def test_map_summary_writes_the_prediction_keys_and_they_follow_the_scores(tmp_path):
    rng = np.random.default_rng(0)
    p = map_params()
    bases = {("latent", 0.0): synthetic_map_base(rng, "latent", 0.0, es_strict=0.1),
             ("latent", 0.1): synthetic_map_base(rng, "latent", 0.1, es_strict=0.3),
             ("latent", 0.3): synthetic_map_base(rng, "latent", 0.3, es_strict=0.45),
             ("skill_gap", None): synthetic_map_base(rng, "skill_gap", None, es_strict=0.1)}
    s = ss.map_summary(p, bases)
    for r in ("R2", "R5", "R6", "R7"):
        for part in ("value", "low", "high"):
            assert f"prediction_{r}_{part}" in s
    assert s["prediction_R2_low"] < s["prediction_R2_value"] < s["prediction_R2_high"]
    assert abs(s["prediction_R2_value"]) < 0.05  # ES at p = 0 gained nothing in these scores
    assert s["prediction_R5_low"] > 0  # latent recovery 0.5 vs skill gap 0
    assert s["prediction_R6_low"] > 0 and s["prediction_R6_points"] == 3  # recovery rises with p
    assert s["prediction_R7_points"] == 12 and s["prediction_R7_low"] <= s["prediction_R7_value"] <= s["prediction_R7_high"]
    assert s["map_es_gain_recovery_latent_p0_3_n40"] == pytest.approx(0.9, abs=0.15)
    assert s["map_es_minus_es_shuffled_latent_p0_3_n40"] > 0 and "map_es_minus_es_shuffled_latent_p0_3_n80" not in s
    assert s["map_subspaces_latent_p0_1_n80"] == 8
    assert s["map_base_strict_skill_gap"] == pytest.approx(0.1, abs=0.05)
    assert "map_es_delta_protocol_low_latent_p0_1_n80" in s
    ss.save_map_scores(p, tmp_path, bases)
    loaded = stats.load_scores(tmp_path)
    assert loaded["map_strict_latent_p0_1_n40"].arms["es"].shape == (3, 200)
    assert set(loaded["map_lenient_skill_gap_n40"].arms) == {"base", "full_grpo", *ss.MAP_ARMS}
    assert set(loaded["map_lenient_skill_gap_n80"].arms) == {"base", "full_grpo", "es", "copes"}


def test_line_fit_recovers_a_slope_and_its_interval():
    fit = ss.line_fit([0.0, 0.1, 0.3], [0.0, 0.1, 0.3], [-0.05, 0.05, 0.25], [0.05, 0.15, 0.35])
    assert fit["slope"] == pytest.approx(1.0) and fit["low"] > 0 and fit["n_points"] == 3
    assert ss.line_fit([1.0], [1.0], [0.0], [2.0])["slope"] is None


def test_map_bases_use_the_latent_recipe_with_their_prior_and_the_skill_gap_base_the_paper_recipe(monkeypatch):
    """The scale axis stays in the skill-gap regime; the map's latent bases are 01's latent recipe at
    MAP_SIZE with their own p and MAP_LATENT_STEPS, its skill-gap base 01's paper recipe; the graded base is
    01's graded recipe (its rates and decaying rate), the homogeneous base the homogeneous prior at the headline
    p with the cued bases' constant rate."""
    import dataclasses

    from copes_lib.protocols.testbed.substrate_setup import substrate_config, substrate_params

    seen = recorded_warm_starts(monkeypatch)
    p = map_params(PROFILE="cpu", SIZES="tiny,cpu", WARM_AXIS_SIZE="")
    for regime, prior in ss.map_bases(p):
        with pytest.raises(Recorded):
            ss.load_map_base(p, regime, prior)
    latent, graded, homogeneous, skill = seen[1], seen[3], seen[4], seen[5]
    assert (latent.protocol, latent.latent_p, latent.latent_math_steps, latent.model_size) == ("latent", 0.1, 1500,
                                                                                             "tiny")
    assert (skill.protocol, skill.model_size) == ("paper", "tiny") and skill.math_target > 0  # 01's stopping rule
    # the cued bases' configs are those of before the new rows: 01's recipe with the cued prior, constant rate
    recipe = substrate_config("cpu")
    for config, q in zip(seen[:3], (0.0, 0.1, 0.3)):
        assert config == dataclasses.replace(recipe, latent_prior="cued", lr_decay=0.0, model_size="tiny",
                                             protocol="latent", latent_p=q, latent_math_steps=1500)
    p01 = substrate_params("cpu")
    assert (graded.protocol, graded.latent_prior, graded.graded_low, graded.graded_high, graded.lr_decay,
            graded.latent_math_steps, graded.model_size) == ("latent", "graded", p01.WARM_GRADED_LOW,
                                                             p01.WARM_GRADED_HIGH, p01.WARM_LR_DECAY, 1500, "tiny")
    assert graded.lr_decay == 0.25 and (graded.graded_low, graded.graded_high) == (0.02, 0.70)  # docs/preflight.md P2
    assert (homogeneous.protocol, homogeneous.latent_prior, homogeneous.latent_p, homogeneous.lr_decay,
            homogeneous.latent_math_steps) == ("latent", "homogeneous", 0.1, 0.0, 1500)
    # under smoke 01 trains the paper recipe (lr_decay 0 in its config): the graded base still takes 01's rate
    with pytest.raises(Recorded):
        ss.load_map_base(map_params(), "graded", None)
    assert seen[-1].latent_prior == "graded" and seen[-1].lr_decay == substrate_params("smoke").WARM_LR_DECAY > 0
    for bad, message in (({"prior": "graded", "latent_p": 0.1}, "takes no latent_p"),
                         ({"prior": "homogeneous"}, "needs latent_p"), ({"prior": "flat", "latent_p": 0.1}, "valid")):
        with pytest.raises(ConfigError, match=message):
            ss.load_substrate(p, "tiny", **bad)


def test_map_base_cache_keys_of_the_cued_bases_are_unchanged(monkeypatch):
    """A base's ``Substrate.key`` is the prefix of every cache key of its arms: the cued bases keep the fields
    they had before the graded and homogeneous rows (no ``latent_prior``), the new bases add theirs."""
    import types

    from copes_lib import rollout, substrate

    def fake_warm_start(profile, kind, seed=0, *, config, **kw):
        torch.manual_seed(0)
        return torch.nn.Linear(2, 2), None, {"steps": config.latent_math_steps}

    monkeypatch.setattr(substrate, "warm_start", fake_warm_start)
    monkeypatch.setattr(rollout, "make_env", lambda kind, profile: types.SimpleNamespace(kind=kind))
    p = map_params(PROFILE="cpu", SIZES="tiny,cpu", WARM_AXIS_SIZE="", VAL_PROBLEMS=4, MECH_HELDOUT=4)
    keys = {b: ss.load_map_base(p, *b).key for b in ss.map_bases(p) if b[0] != "skill_gap"}
    old = {"profile", "data_profile", "size", "warm_steps", "substrate_checksum", "val_ids", "rollout", "protocol",
           "latent_p"}
    for q in (0.0, 0.1, 0.3):
        assert set(keys[("latent", q)]) == old and keys[("latent", q)]["latent_p"] == q
        assert keys[("latent", q)] == ss.load_substrate(p, "tiny", latent_p=q).key  # the default prior is the cued one
    assert keys[("graded", None)]["latent_prior"] == "graded" and keys[("graded", None)]["lr_decay"] == 0.25
    assert set(keys[("graded", None)]) == old | {"latent_prior", "lr_decay", "graded_low", "graded_high"}
    assert keys[("homogeneous", 0.1)]["latent_prior"] == "homogeneous"
    assert runs.cache_key(keys[("homogeneous", 0.1)]) != runs.cache_key(keys[("latent", 0.1)])


# ----------------------------------------------------------------------------- low rank on the map
@pytest.mark.parametrize("bad, message", [
    ({"MAP_LOWRANK_RANK": -1}, "MAP_LOWRANK_RANK"),
    ({"MAP_LOWRANK_RANK": 17}, "MAP_LOWRANK_RANK = 17 exceeds the smaller side 16"),  # tiny: k/v are 16 x 32
    ({"MAP_LOWRANK_CELLS": "headline,corner"}, "MAP_LOWRANK_CELLS = 'headline,corner': valid values"),
    ({"MAP_LOWRANK_CELLS": "headline,headline"}, "each once"),
    ({"MAP_REGIMES": "latent", "MAP_LOWRANK_CELLS": "headline,skill_gap"}, "['skill_gap'] need(s) the regime"),
])
def test_lowrank_errors_name_the_parameter(bad, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        map_params(**bad)


def test_lowrank_cells_and_configs_carry_the_rank_and_full_rank_configs_are_unchanged():
    p = map_params(MAP_LOWRANK_RANK=4, MAP_LOWRANK_CELLS="headline,skill_gap")
    assert p.map_lowrank_cells() == [("latent", 0.1, 40), ("skill_gap", None, 40)]
    assert map_params(MAP_LOWRANK_CELLS="p0").map_lowrank_cells() == [("latent", 0.0, 40)]
    assert map_params(MAP_LOWRANK_RANK=0).map_lowrank_cells() == [] and map_params(MAP_LOWRANK_CELLS="").map_lowrank_cells() == []
    off = map_params(MAP_LOWRANK_RANK=0)
    for arm in ss.MAP_ARMS:  # the full-rank arms: no noise_rank, the same config as with the low-rank arms off
        cfg = ss.map_arm_config(p, arm, 40, 1)
        assert cfg.noise_rank == 0 and "noise_rank" not in cfg.to_dict()
        assert cfg.to_dict() == ss.map_arm_config(off, arm, 40, 1).to_dict()
    for low, full in ss.MAP_LOWRANK_ARMS.items():
        lo, fu = ss.map_arm_config(p, low, 40, 1), ss.map_arm_config(p, full, 40, 1)
        assert lo.noise_rank == 4 and lo.to_dict()["noise_rank"] == 4
        # everything but the rank is the paired full-rank arm's (seed included: paired)
        assert {k: v for k, v in lo.to_dict().items() if k != "noise_rank"} == fu.to_dict()
    assert ss.map_arm_config(p, "copes_lowrank", 40, 0).subspaces == 4 and ss.map_arm_config(p, "es_lowrank", 40, 0).subspaces == 1
    with pytest.raises(ConfigError, match="MAP_LOWRANK_RANK"):
        ss.map_arm_config(off, "es_lowrank", 40, 0)


def test_lowrank_arms_run_only_in_their_cells_and_full_rank_cache_keys_do_not_change(monkeypatch):
    """run_map_base with the cache replaced by a recorder: which arms ran where, and with which keys."""
    import types

    recorded = []

    def fake_cached(params, name, key, compute):
        if name == "map_base":
            return {"scores": [0.0, 1.0], "strict": [0.0, 1.0], "lenient": [1.0, 1.0], "criterion": {}}
        if name == "map_grpo":
            return {"horizon_strict": [1.0, 1.0]}
        if name == "map_preflight":
            return {"values": {"G1": 0.0, "G2": 0.0, "E1": None}, "sigma": None}
        recorded.append((params.MAP_LOWRANK_RANK, key["map_arm"], key["es"]["population"], key))
        return {"strict": [0.0, 1.0], "lenient": [1.0, 1.0]}

    monkeypatch.setattr(ss.map_study, "_cached_json", fake_cached)  # the map reads the cache through it
    sub = types.SimpleNamespace(key={"base": "b"}, n_params=1, warm_steps=1, warm_info={})
    for rank in (4, 0):
        p = map_params(MAP_LOWRANK_RANK=rank, MAP_MECHANISM=False, MAP_SEEDS=2, MAP_GRPO_SEEDS=1)
        for regime, prior in ss.map_bases(p):
            out = ss.run_map_base(p, sub, regime, prior, log=lambda *a: None)
            for n, cell in out["cells"].items():
                lowrank = rank and n == 40 and (regime, prior) in (("latent", 0.1), ("skill_gap", None))
                assert set(ss.MAP_LOWRANK_ARMS) <= set(cell) if lowrank else not set(ss.MAP_LOWRANK_ARMS) & set(cell)
    with_rank = [r for r in recorded if r[0] == 4]
    without = [r for r in recorded if r[0] == 0]
    assert sum(arm in ss.MAP_LOWRANK_ARMS for _, arm, _, _ in with_rank) == 2 * 2 * 2  # cells x arms x seeds
    assert all(key["es"]["noise_rank"] == 4 for _, arm, _, key in with_rank if arm in ss.MAP_LOWRANK_ARMS)
    # the full-rank arms' keys with the low-rank arms on are exactly those with them off
    assert [runs.cache_key(k) for _, arm, _, k in with_rank if arm in ss.MAP_ARMS] == [runs.cache_key(k)
                                                                                       for *_, k in without]


def test_lowrank_reading_follows_the_registered_rule():
    assert ss.lowrank_prediction(-0.01, 0.02) == "agrees"
    assert ss.lowrank_prediction(0.01, 0.04) == "agrees"  # inside the margin, even if it excludes 0
    assert ss.lowrank_prediction(0.02, 0.08) == "does not agree"
    assert ss.lowrank_prediction(-0.2, -0.06) == "does not agree"
    assert ss.lowrank_prediction(-0.1, 0.1) == "inconclusive"
    assert ss.lowrank_prediction(None, 0.01) == "inconclusive"


def lowrank_bases(seed: int, copes_lowrank_lost: bool) -> dict:
    """Four synthetic map bases whose two low-rank cells copy the full-rank arms (CoPES's optionally losing
    every strict point)."""
    rng = np.random.default_rng(seed)
    bases = {("latent", 0.0): synthetic_map_base(rng, "latent", 0.0, es_strict=0.1),
             ("latent", 0.1): synthetic_map_base(rng, "latent", 0.1, es_strict=0.3),
             ("latent", 0.3): synthetic_map_base(rng, "latent", 0.3, es_strict=0.45),
             ("skill_gap", None): synthetic_map_base(rng, "skill_gap", None, es_strict=0.1)}
    for key in (("latent", 0.1), ("skill_gap", None)):
        cell = bases[key]["cells"][40]
        cell["es_lowrank"] = [dict(r) for r in cell["es"]]  # identical to full rank: difference 0, no spread
        cell["copes_lowrank"] = [{**r, "strict": [0.0] * len(r["strict"])} if copes_lowrank_lost else dict(r)
                                 for r in cell["copes"]]
    return bases


def test_lowrank_summary_keys_follow_the_scores(tmp_path):
    p = map_params(MAP_LOWRANK_RANK=4)
    bases = lowrank_bases(1, copes_lowrank_lost=True)
    s = ss.map_summary(p, bases)
    for c in ("latent_p0_1_n40", "skill_gap_n40"):
        assert s[f"map_es_lowrank_minus_es_{c}"] == 0 and s[f"map_es_lowrank_minus_es_prediction_{c}"] == "agrees"
        assert s[f"map_copes_lowrank_minus_copes_high_{c}"] < -0.1
        assert s[f"map_copes_lowrank_minus_copes_prediction_{c}"] == "does not agree"
        assert s[f"map_es_lowrank_delta_s_{c}"] == pytest.approx(s[f"map_es_delta_s_{c}"])
        assert s[f"map_es_lowrank_gain_recovery_{c}"] == pytest.approx(s[f"map_es_gain_recovery_{c}"])
    assert "map_es_lowrank_delta_s_latent_p0_1_n80" not in s and "map_es_lowrank_minus_es_latent_p0_n40" not in s
    assert s["map_lowrank_cells"] == ["latent_p0_1_n40", "skill_gap_n40"] and s["map_lowrank_rank"] == 4
    assert s["map_lowrank_prediction"] == "does not agree"
    # R5's contrast with low-rank ES: the same scores as full-rank ES give R5's own value and interval
    assert s["prediction_R5_low"] > 0
    for part in ("value", "low", "high"):
        assert s[f"map_lowrank_R5_{part}"] == pytest.approx(s[f"prediction_R5_{part}"])
    # a cell where neither arm moved (constant fitness: both returned the base) is not judged, not "agrees"
    for r in (*bases[("skill_gap", None)]["cells"][40]["es"], *bases[("skill_gap", None)]["cells"][40]["es_lowrank"]):
        r["mean_update_norm"] = 0.0
    s = ss.map_summary(p, bases)
    assert s["map_es_lowrank_minus_es_prediction_skill_gap_n40"] == "not judged"
    assert s["map_es_lowrank_minus_es_prediction_latent_p0_1_n40"] == "agrees"
    ss.save_map_scores(p, tmp_path, bases)
    assert set(stats.load_scores(tmp_path)["map_strict_skill_gap_n40"].arms) == {"base", "full_grpo", *ss.MAP_ARMS,
                                                                                 *ss.MAP_LOWRANK_ARMS}


def test_lowrank_map_arm_learns_on_a_linear_model():
    """A real low-rank ES update from the map's config (rank 4 on an 8 x 8 matrix) follows the gradient."""
    p = map_params(SIGMA=0.05, ALPHA=0.05, MAP_LOWRANK_RANK=4)
    cos = []
    for s in range(6):
        truth = LinearRegression(seed=s)
        u, _, _ = one_update(ss.map_arm_config(p, "es_lowrank", 40, s), truth, seed=s)
        torch.manual_seed(s)
        grad = truth.gradient(torch.nn.Linear(8, 8, bias=False))
        cos.append(float(torch.nn.functional.cosine_similarity(u, grad, dim=0)))
    assert np.mean(cos) > 0.3, cos


def test_the_claims_table_reads_l4_from_what_map_summary_writes():
    from copes_lib import claims

    p = map_params(MAP_LOWRANK_RANK=4)
    bases = lowrank_bases(2, copes_lowrank_lost=False)

    def l4():
        s = ss.map_summary(p, bases)
        return s, next(r for r in claims.judge_claims({"09_scale_study": s}) if r["claim"] == "L4")

    s, row = l4()  # low rank identical to full rank everywhere: every reading agrees, as 09 reads it
    assert s["map_lowrank_prediction"] == "agrees" and row["verdict"] == claims.AGREES and "NOTE" not in row["reason"]
    bases[("skill_gap", None)]["cells"][40]["copes_lowrank"] = [
        {**r, "strict": [0.0] * len(r["strict"])} for r in bases[("skill_gap", None)]["cells"][40]["copes"]]
    s, row = l4()  # low-rank CoPES lost the gain in one cell
    assert s["map_lowrank_prediction"] == "does not agree" and row["verdict"] == claims.DISAGREES
    assert "skill_gap_n40 CoPES: excludes 0" in row["reason"] and "NOTE" not in row["reason"]
    for r in (*bases[("latent", 0.1)]["cells"][40]["es"], *bases[("latent", 0.1)]["cells"][40]["es_lowrank"]):
        r["mean_update_norm"] = 0.0
    bases[("skill_gap", None)]["cells"][40]["copes_lowrank"] = [dict(r) for r in bases[("skill_gap", None)]["cells"][40]["copes"]]
    s, row = l4()  # neither ES arm moved in the headline cell: 09 says not judged, the claim never agrees
    assert s["map_es_lowrank_minus_es_prediction_latent_p0_1_n40"] == "not judged"
    assert s["map_lowrank_prediction"] == "inconclusive" and row["verdict"] == claims.INCONCLUSIVE
    assert "latent_p0_1_n40 ES: not judged" in row["reason"] and "NOTE" not in row["reason"]


def test_a_map_bases_d_eff_falls_back_to_the_gauss_newton_one_and_says_why():
    """docs/mechanism.md#m6-the-map-of-where-es-and-copes-work (changed before the next map run): the
    Hessian's d_eff where defined, else the GGN's with its source, else None with the reason."""
    hessian = {"d_eff": 5.0, "d_eff_low": 4.0, "d_eff_high": 6.0, "undefined_reason": None}
    ggn = {"d_eff": 3.0, "d_eff_low": 2.0, "d_eff_high": 4.0}
    both = ss.base_d_eff({"mechanism": {"curvature": hessian, "curvature_ggn": ggn}})
    assert (both["d_eff"], both["source"], both["undefined_reason"]) == (5.0, "hessian", None)
    indefinite = {"d_eff": None, "undefined_reason": "tr(H) below lambda_max (H indefinite, or too few probes)"}
    fallback = ss.base_d_eff({"mechanism": {"curvature": indefinite, "curvature_ggn": ggn}})
    assert (fallback["d_eff"], fallback["low"], fallback["source"]) == (3.0, 2.0, "ggn")
    assert "indefinite" in fallback["undefined_reason"]
    none = {"d_eff": None, "undefined_reason": "no rewarded trajectory in 4 ES batch(es)"}
    missing = ss.base_d_eff({"mechanism": {"curvature": none, "curvature_ggn": dict(none)}})
    assert missing["d_eff"] is None and missing["source"] is None and "no rewarded" in missing["undefined_reason"]
    assert ss.base_d_eff({"mechanism": None})["undefined_reason"] == "no mechanism measurement"


def test_effective_rank_names_why_it_is_undefined():
    from copes_lib import mechanism as mech
    from tests.test_grpo import tiny_model

    model = tiny_model()
    dim = mech.n_parameters(model)
    negative = mech.effective_rank(model, hvp=lambda v: -v, probes=4, iters=4, seed=0)
    assert negative["d_eff"] is None and negative["undefined_reason"] == "tr(H) <= 0"
    identity = mech.effective_rank(model, hvp=lambda v: v, probes=4, iters=4, seed=0)
    assert identity["undefined_reason"] is None and identity["d_eff"] == pytest.approx(dim, rel=0.5)


# ----------------------------------------------------------------------------- the preflight per map base
def fake_preflight(g1=0.9, g2=0.1, e1=0.6, sigma=0.01):
    """What map_preflight returns (docs/preflight.md P1's G1, G2, E1; sigma None: no rung of the ladder worked)."""
    from copes_lib.protocols.testbed.preflight import PreflightCriterion

    return {"values": {"G1": g1, "G2": g2, "E1": e1 if sigma is not None else None}, "sigma": sigma,
            "e1_map_sigma": 0.2, "protocol_rate": [0.5], "protocol_rate_mean": 0.5,
            "criterion": PreflightCriterion().to_dict(), "cost_s": 1.0}


def test_map_summary_writes_the_preflight_keys_per_base_and_their_verdicts_follow_the_floors():
    rng = np.random.default_rng(3)
    p = map_params()
    bases = {b: synthetic_map_base(rng, *b, es_strict=0.2) for b in ss.map_bases(p)}
    bases[("latent", 0.1)]["preflight"] = fake_preflight(g1=0.9, g2=0.1, e1=0.6)
    bases[("graded", None)]["preflight"] = fake_preflight(g1=0.5, g2=0.25, e1=0.5)  # the floors themselves: hold
    bases[("homogeneous", 0.1)]["preflight"] = fake_preflight(g1=0.97, g2=0.9, sigma=None)
    bases[("skill_gap", None)]["preflight"] = fake_preflight()
    bases[("skill_gap", None)]["grpo"] = bases[("skill_gap", None)]["grpo"][:1]
    bases[("skill_gap", None)]["grpo"][0]["horizon_strict"] = bases[("skill_gap", None)]["base"]["strict"]
    s = ss.map_summary(p, bases)
    assert s["map_bases"] == ["latent_p0", "latent_p0_1", "latent_p0_3", "graded", "homogeneous_p0_1", "skill_gap"]
    t = "latent_p0_1"
    assert (s[f"map_preflight_g1_{t}"], s[f"map_preflight_g2_{t}"], s[f"map_preflight_e1_{t}"]) == (0.9, 0.1, 0.6)
    assert (s[f"map_preflight_g1_verdict_{t}"], s[f"map_preflight_g2_verdict_{t}"],
            s[f"map_preflight_e1_verdict_{t}"]) == ("holds", "fails", "holds")
    assert s[f"map_preflight_failed_{t}"] == ["G2"] and s[f"map_preflight_sigma_{t}"] == 0.01
    assert s["map_preflight_failed_graded"] == [] and s["map_preflight_e1_verdict_graded"] == "holds"
    # no sigma of the ladder made half the members differ: E1 fails (docs/preflight.md P3 rule 1), not "not measured"
    assert s["map_preflight_e1_homogeneous_p0_1"] is None and s["map_preflight_e1_verdict_homogeneous_p0_1"] == "fails"
    assert s["map_preflight_failed_homogeneous_p0_1"] == ["E1"]
    # R's analogue: full GRPO's strict gain at its horizon (synthetic: 0.1 -> 0.5), judged by R's floor
    assert s[f"map_preflight_r_analogue_{t}"] == pytest.approx(0.4, abs=0.1)
    assert s[f"map_preflight_r_analogue_low_{t}"] > 0.15 and s[f"map_preflight_r_analogue_verdict_{t}"] == "holds"
    assert s["map_preflight_r_analogue_skill_gap"] == 0 and s["map_preflight_r_analogue_verdict_skill_gap"] == "fails"
    # a base without a preflight writes none of its keys
    assert not any(k.startswith("map_preflight_") and k.endswith("_latent_p0") for k in s)
    table = ss.map_preflight_table(p, s)
    assert list(table["base"]) == s["map_bases"] and list(table["fails"])[1] == "G2"
    assert len(ss.map_preflight_table(map_params(MAP_PREFLIGHT=False), {"map_preflight": False})) == 0


def test_map_preflight_measures_g1_g2_e1_on_the_tuning_split_with_01s_settings(monkeypatch):
    """map_preflight calls preflight's own functions with notebook 01's PREFLIGHT_* settings of the profile (the
    calibration on training batches of 01's batch size, E1 on the tuning prompts at the calibrated sigma and at
    the map's SIGMA), caches per base, and leaves the base's objective as it was."""
    import types

    from copes_lib.protocols.testbed import preflight
    from copes_lib.protocols.testbed.substrate_setup import substrate_params
    from copes_lib.tasks import TUNING_SPLIT, load_tasks

    calls = {}
    monkeypatch.setattr(preflight, "sampled_groups", lambda model, tok, tasks, env, rcfg, **kw: calls.setdefault(
        "groups", (tasks, kw)) and {"varied_share": 0.75, "protocol_mixed_share": 0.5, "protocol_rate": [0.5],
                                    "protocol_rate_mean": 0.5})
    monkeypatch.setattr(preflight, "calibrate_sigma", lambda model, obj, settings, share: calls.setdefault(
        "calibrate", (obj.batch_size, settings, share)) and {"sigma": 0.04, "curve": []})
    spread = []
    monkeypatch.setattr(preflight, "member_spread", lambda model, obj, tasks, settings, sigma: spread.append(
        (tasks, sigma)) or {"share": 0.6 if sigma == 0.04 else 0.1})
    keys = []
    monkeypatch.setattr(ss.map_study, "_cached_json", lambda params, name, key, compute: keys.append((name, key))
                        or compute())
    p = map_params(SIGMA=0.02)
    objective = types.SimpleNamespace(batch_size=p.BATCH_SIZE, train_tasks=[])
    sub = types.SimpleNamespace(key={"base": "b"}, model=None, tokenizer=None, env=None, rollout_config=None,
                                objective=objective, n_params=1, warm_steps=1, warm_info={})
    out = ss.map_preflight(p, sub)
    settings = substrate_params("smoke").preflight_settings()
    prompts = load_tasks("smoke", "math", TUNING_SPLIT)[: settings.prompts]
    assert [t.id for t in calls["groups"][0]] == [t.id for t in prompts]
    assert calls["groups"][1] == {"group_size": settings.group_size, "temperature": settings.temperature,
                                  "seed": settings.seed}
    assert calls["calibrate"] == (settings.batch_size, settings, 0.5) and objective.batch_size == p.BATCH_SIZE
    assert [sigma for _, sigma in spread] == [0.04, 0.02]
    assert out["values"] == {"G1": 0.75, "G2": 0.5, "E1": 0.6} and out["e1_map_sigma"] == 0.1
    (name, key), = keys
    assert name == "map_preflight" and key["base"] == "b" and key["preflight"] == settings.to_dict()
    # no map preflight: run_map_base records none, and map_summary writes no preflight keys
    off = map_params(MAP_PREFLIGHT=False, MAP_MECHANISM=False, MAP_SEEDS=2, MAP_GRPO_SEEDS=1, MAP_LOWRANK_RANK=0)
    monkeypatch.setattr(ss.map_study, "_cached_json", lambda params, name, key, compute: {
        "map_base": {"scores": [0.0], "strict": [0.0], "lenient": [1.0], "criterion": {}},
        "map_grpo": {"horizon_strict": [1.0]}}.get(name, {"strict": [0.0], "lenient": [1.0]}))
    assert ss.run_map_base(off, sub, "graded", None, log=lambda *a: None)["preflight"] is None
