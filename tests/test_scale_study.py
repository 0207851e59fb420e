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
    ({"MECH_POPULATION": 4}, "MECH_POPULATION = 4"),
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
            "mechanism": [{"arm": "es", "agreement": 0.1, "cos_reference": 0.05, "update_norm": 1.0},
                          {"arm": "copes", "agreement": 0.2, "cos_reference": math.nan, "update_norm": 2.0},
                          {"arm": "reference", "agreement": 0.5, "cos_reference": math.nan, "update_norm": 3.0}]}


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


def test_log_fit_recovers_a_line_and_needs_two_points():
    fit = ss.log_fit([1e5, 1e6, 1e7], [0.1, 0.2, 0.3], at=1e9)
    assert math.isclose(fit["slope_per_decade"], 0.1) and math.isclose(fit["at"], 0.5)
    assert ss.log_fit([1e5, 1e6], [0.1, None])["at"] is None


def test_cell_summary_is_flat_and_scores_round_trip(tmp_path):
    p = params()
    cell = synthetic_cell(np.random.default_rng(1))
    summary = ss.cell_summary(p, cell, "cpu_large")
    runs.check_summary({k: v for k, v in summary.items()})
    assert summary["agreement_copes_cpu_large"] == 0.2 and summary["cos_grpo_copes_cpu_large"] is None
    assert summary["grpo_self_agreement_cpu_large"] == 0.5
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
