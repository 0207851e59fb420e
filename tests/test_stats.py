import dataclasses
import math
from itertools import combinations

import numpy as np
import pytest
from scipy import stats as _st

from copes_lib import stats


def test_pass_at_k_matches_brute_force():
    n, c = 6, 2
    outcomes = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(combinations(range(n), k))
        brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
        assert stats.pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="k must be"):
        stats.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c must be"):
        stats.pass_at_k(4, 5, 1)


def test_mean_ci_and_paired_difference():
    mean, low, high = stats.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and low < 2.0 < high
    assert math.isnan(stats.mean_ci([1.0])[1])
    d = stats.paired_difference([1.0, 2.0, 3.5], [0.5, 1.0, 2.0])
    assert d["mean"] == pytest.approx(1.0) and d["p"] < 0.2
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_difference([1.0], [1.0, 2.0])


def test_gain_recovery_and_first_step():
    assert stats.gain_recovery(0.88, 0.492, 0.9147) == pytest.approx(0.918, abs=1e-3)
    with pytest.raises(ValueError, match="undefined"):
        stats.gain_recovery(0.5, 0.4, 0.4)
    assert stats.first_step_reaching([0, 8], [0.1, 0.2], 0.5) is None


# ------------------------------------------------------------------ the seeds x problems noise model
def _simulate(rng, effect=0.0, seeds=5, problems=200, seed_sd=0.3, interaction_sd=1.0, problem_sd=1.5):
    """0/1 scores of two methods on the same problems. Each method's logit = problem difficulty
    (shared) + a method x problem interaction (drawn with the problem set: the evaluation-set noise)
    + a per-seed offset (the training-seed noise); ``effect`` is added to method a's logit."""
    difficulty = rng.normal(0.0, problem_sd, problems)
    out = []
    for shift in (effect, 0.0):
        logit = (difficulty + rng.normal(0.0, interaction_sd, problems))[None, :] \
            + rng.normal(0.0, seed_sd, (seeds, 1)) + shift
        out.append((rng.random((seeds, problems)) < 1 / (1 + np.exp(-logit))).astype(float))
    return out


def test_a_real_effect_is_found_in_the_expected_direction():
    a, b = _simulate(np.random.default_rng(1), effect=0.8, seed_sd=0.1)
    c = stats.compare(a, b, name="a - b")
    assert c.verdict == stats.EFFECT and c.low > 0 and c.p < 0.01
    assert stats.compare(a, b, expected_sign=-1).verdict == stats.OPPOSITE


def test_null_false_positive_rate_is_near_alpha_while_a_seed_only_test_is_not():
    rng = np.random.default_rng(2026)
    ours, seeds_only = [], []
    for _ in range(200):
        # near-deterministic problems (as with greedy decoding) and little seed noise: the A4 situation
        a, b = _simulate(rng, problems=150, seed_sd=0.05, problem_sd=6.0, interaction_sd=2.0)
        ours.append(stats.compare(a, b).p < 0.05)
        seeds_only.append(stats.paired_difference(a.mean(axis=1), b.mean(axis=1))["p"] < 0.05)
    assert 0.01 <= np.mean(ours) <= 0.08
    # the t-test over seed means ignores the evaluation-set noise: far above alpha in the same sims
    assert np.mean(seeds_only) > 0.15


def test_a_too_small_study_is_inconclusive_not_no_effect():
    a, b = _simulate(np.random.default_rng(3), effect=0.3, seeds=2, problems=30)
    c = stats.compare(a, b, margin=0.05, paper_effect=0.1)
    assert c.verdict == stats.INCONCLUSIVE
    assert "wider than the paper's effect" in c.reason and c.mde > 0.1


def test_one_seed_is_inconclusive_whatever_the_p():
    a, b = _simulate(np.random.default_rng(4), effect=2.0, seeds=1, problems=400)
    c = stats.compare(a, b)
    assert c.p < 1e-6 and c.verdict == stats.INCONCLUSIVE and "seed noise" in c.reason


def test_tost_declares_equivalence_only_when_the_interval_sits_inside_the_margin():
    rng = np.random.default_rng(5)
    base = rng.normal(0.0, 1.0, (6, 400))
    b = base + rng.normal(0.0, 0.05, base.shape)
    a = base + rng.normal(0.0, 0.05, base.shape) + 0.002
    c = stats.compare(a, b, margin=0.02, alpha=0.05)
    assert c.verdict == stats.EQUIVALENT
    low90, high90 = c.estimate + np.array([-1, 1]) * _st.t.ppf(0.95, c.df) * c.se
    assert -0.02 < low90 and high90 < 0.02  # TOST at alpha = the (1 - 2 alpha) interval inside +-margin
    tight = stats.compare(a, b, margin=0.9 * max(abs(low90), abs(high90)))
    wide = stats.compare(a, b, margin=1.1 * max(abs(low90), abs(high90)))
    assert tight.verdict == stats.INCONCLUSIVE and wide.verdict == stats.EQUIVALENT
    assert stats.compare(a, b).verdict == stats.INCONCLUSIVE  # without a declared margin: never "no effect"


def test_holm_matches_a_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005, float("nan")]
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, 1 x 0.04
    # -> 0.04 raised to the running max 0.06
    adjusted = stats.holm(p)
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(adjusted[4])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([0.02, 0.9]) == pytest.approx([0.04, 0.9])


def test_holm_family_can_remove_a_significance():
    a, b = _simulate(np.random.default_rng(6), effect=0.8, seed_sd=0.1)
    single = dataclasses.replace(stats.compare(a, b, name="x"), p=0.02, p_holm=0.02)
    nulls = [dataclasses.replace(single, name=f"null{i}", p=0.5) for i in range(6)]
    family = stats.holm_family([single, *nulls])
    assert family[0].p_holm == pytest.approx(0.14) and family[0].family_size == 7
    assert family[0].verdict == stats.INCONCLUSIVE and stats.holm_family([single])[0].verdict == stats.EFFECT
    assert family[0].mde > stats.holm_family([single])[0].mde  # the MDE is at alpha / family size


def test_mde_shrinks_with_more_seeds_and_problems():
    a, b = _simulate(np.random.default_rng(7), effect=0.2, seeds=4, problems=200)
    now = stats.planned_mde(a, b)
    assert stats.planned_mde(a, b, n_seeds=16) < now
    assert stats.planned_mde(a, b, n_problems=1000) < now
    assert stats.planned_mde(a, b, n_seeds=16, n_problems=1000) < stats.planned_mde(a, b, n_seeds=16)
    note = stats.power_note(a, b, n_seeds=10, scale=100, unit=" points")
    assert "4 seeds x 200 problems" in note and "with 10 seeds x 200 problems" in note


def test_bootstrap_agrees_with_the_model_when_seeds_are_many():
    a, b = _simulate(np.random.default_rng(8), effect=0.3, seeds=25, problems=300, seed_sd=0.4)
    model = stats.compare(a, b)
    boot = stats.compare(a, b, method="bootstrap", n_boot=2000, seed=0)
    assert boot.se == pytest.approx(model.se, rel=0.2)
    assert boot.estimate == model.estimate and boot.verdict == model.verdict
    reps1 = stats.hierarchical_bootstrap(a, b, n_boot=50, seed=3)
    assert np.array_equal(reps1, stats.hierarchical_bootstrap(a, b, n_boot=50, seed=3))  # seeded


def test_nested_designs_test_over_seed_means():
    rng = np.random.default_rng(9)
    a, b = rng.normal(0.1, 1.0, (5, 50)), rng.normal(0.0, 1.0, (5, 50))
    c = stats.compare(a, b, nested=True)
    t = stats.paired_difference(a.mean(axis=1), b.mean(axis=1))
    assert c.p == pytest.approx(t["p"]) and c.df == 4


def test_scores_round_trip_and_refuse_overwrite(tmp_path):
    rng = np.random.default_rng(10)
    arms = {"es": rng.random((3, 8)), "copes": rng.random((3, 8)), "grpo": rng.random((1, 8))}
    stats.save_scores(tmp_path, "val_accuracy", arms, {"es": [1, 2, 3], "copes": [1, 2, 3], "grpo": [7]})
    stats.save_scores(tmp_path, "test_f1", {"es": rng.random((2, 4))}, [1, 2], nested=True)
    loaded = stats.load_scores(tmp_path)
    assert set(loaded) == {"val_accuracy", "test_f1"} and loaded["test_f1"].nested
    assert np.array_equal(loaded["val_accuracy"].arms["copes"], arms["copes"])
    assert loaded["val_accuracy"].seeds["grpo"] == (7,)
    assert loaded["val_accuracy"].compare("copes", "grpo").verdict == stats.INCONCLUSIVE  # one GRPO seed
    with pytest.raises(FileExistsError, match="val_accuracy"):
        stats.save_scores(tmp_path, "val_accuracy", {"es": arms["es"]}, [1, 2, 3])
    with pytest.raises(ValueError, match="snake_case"):
        stats.save_scores(tmp_path, "x", {"+R": arms["es"]}, [1, 2, 3])
    with pytest.raises(ValueError, match="seed rows"):
        stats.save_scores(tmp_path, "y", {"es": arms["es"]}, [1, 2])
    with pytest.raises(ValueError, match="same problems"):
        stats.compare(arms["es"], rng.random((3, 9)))
    assert stats.load_scores(tmp_path / "nowhere") is None


def test_two_seeds_with_equal_means_do_not_claim_certainty():
    """Two seeds whose means happen to coincide gave MS_seed = 0 and, with no problem term, se = 0 and
    p = 0: an "effect" from 2 seeds x 4 problems. The residual noise floors the seed term."""
    a = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    b = np.zeros_like(a)
    c = stats.compare(a, b, name="degenerate")
    assert c.se > 0 and c.p > 0.05 and c.verdict != stats.EFFECT


def test_scores_without_any_variation_decide_nothing():
    c = stats.compare(np.ones((3, 4)), np.zeros((3, 4)), name="constant", margin=0.5)
    assert c.verdict == stats.INCONCLUSIVE


def test_power_is_undefined_not_zero_when_the_arms_do_not_vary():
    same = np.zeros((5, 64))
    same[:, :5] = 1.0  # every seed solves the same 5 problems, in both arms
    note = stats.power_note(same, same.copy(), n_seeds=10, scale=100, unit=" points")
    assert note.startswith("power: undefined") and "0 points" not in note
    other = same.copy()
    other[0, 10] = 1.0
    assert "smallest difference detectable" in stats.power_note(other, same)


def test_gain_recovery_is_undefined_when_the_reference_lost():
    base = np.full((1, 40), 0.5)
    reference = np.full((2, 40), 0.4)  # the reference lost 10 points
    method = np.full((3, 40), 0.45)  # lost 5: no "50% recovery"
    rec = stats.gain_recovery_interval(stats.ScoreSet("x", {"m": method, "base": base, "ref": reference},
                                                      {"m": (0, 1, 2), "base": (0,), "ref": (0, 1)}),
                                       "m", base="base", reference="ref")
    assert math.isnan(rec.estimate) and math.isnan(rec.low) and rec.note.startswith("undefined")
