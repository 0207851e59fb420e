"""A1's and A7's equivalence margin uses the reference the gain recoveries use: 05's seed-mean full-GRPO best
(docs/reference.md#r4-notebook-05s-references-carry-every-seed-registered-2026-12-03), not seed 0's."""

import numpy as np
import pytest

from copes_lib import claims, paper, stats
from copes_lib.claims import verdicts

# seed 0's best is 0.5 (a gain of 0.1 over the base), the mean of the three seeds' bests 0.9 (a gain of 0.5)
MATH_05 = {"gain_recovery_copes": 0.5, "gain_recovery_es": 0.2, "gain_recovery_lora_grpo": 0.3,
           "base_val_accuracy": 0.4, "full_grpo_best_val_accuracy": 0.5, "full_grpo_reference_val_accuracy": 0.9,
           "full_grpo_best_val_accuracy_seeds": [0.5, 1.0, 1.2], "es_steps_to_match_copes": 12, "budget_steps": 8}


def _scores(**arms):
    arms = {k: np.asarray(v, dtype=float) for k, v in arms.items()}
    return {"val_accuracy_at_budget": stats.ScoreSet("val_accuracy_at_budget", arms,
                                                     {k: tuple(range(len(v))) for k, v in arms.items()})}


def _near_pair(seed=0):
    """Two arms that differ on 40 of 600 problems: inside a margin of 6.2 points, not of 1.2."""
    rng = np.random.default_rng(seed)
    a = (rng.random((5, 600)) < 0.6).astype(float)
    b = a.copy()
    b[:, :40] = 1 - b[:, :40]
    return a, b


def test_the_margin_reads_the_seed_mean_reference():
    ctx = verdicts.Context("05_fixed_budget_math", {"05_fixed_budget_math": MATH_05})
    effect, margin = verdicts._scales(ctx, verdicts.Contrast("copes_vs_es", "val_accuracy_at_budget", "copes", "es"))
    gain = 0.9 - 0.4
    assert effect == pytest.approx(paper.EFFECT_SHARE_A["copes_vs_es"] * gain)
    assert margin == pytest.approx(paper.EQUIVALENCE_FRACTION * paper.EFFECT_SHARE_A["copes_vs_es"] * gain)
    # 06 (A7) has no full-GRPO keys of its own: it reads 05's, the same seed-mean reference
    ctx06 = verdicts.Context("06_copes_ablations", {"05_fixed_budget_math": MATH_05,
                                                    "06_copes_ablations": {"base_val_accuracy": 0.4}})
    _, margin06 = verdicts._scales(ctx06, verdicts.Contrast("k4_vs_es_sqrtk_alpha", "val_accuracy_at_budget",
                                                            "k4", "es_sqrtk_alpha"))
    assert margin06 == pytest.approx(paper.EQUIVALENCE_FRACTION * paper.EFFECT_SHARE_A["k4_vs_es_sqrtk_alpha"] * gain)


def test_a_summary_without_the_seed_mean_key_falls_back_to_seed_0s_best():
    old = {k: v for k, v in MATH_05.items() if k != "full_grpo_reference_val_accuracy"}
    ctx = verdicts.Context("05_fixed_budget_math", {"05_fixed_budget_math": old})
    assert verdicts.math_reference_gain(ctx) == pytest.approx(0.5 - 0.4)


def test_a1_and_a7_verdicts_follow_the_seed_mean_margin():
    """The same scores read 'does not' (an effect of the paper's size ruled out) against the seed-mean reference's
    margin (6.2 points), and would not against seed 0's (1.2 points): the verdict depends on the reference."""
    copes, es = _near_pair()
    a1 = {"05_fixed_budget_math": {**MATH_05, claims.SCORES: _scores(copes=copes, es=es)}}
    row = next(r for r in claims.judge_claims(a1) if r["claim"] == "A1")
    assert row["verdict"] == claims.DISAGREES, row
    seed0 = {"05_fixed_budget_math": {**{k: v for k, v in MATH_05.items() if k != "full_grpo_reference_val_accuracy"},
                                      claims.SCORES: _scores(copes=copes, es=es)}}
    assert next(r for r in claims.judge_claims(seed0) if r["claim"] == "A1")["verdict"] == claims.INCONCLUSIVE

    rng = np.random.default_rng(1)
    others = {arm: (rng.random((5, 600)) < 0.5).astype(float) for arm in ("k1", "k8")}
    a7 = {"05_fixed_budget_math": MATH_05,
          "06_copes_ablations": {"val_accuracy_k1": 0.5, "val_accuracy_k4": 0.6, "val_accuracy_k8": 0.5,
                                 "val_accuracy_es_sqrtk_alpha": 0.6,
                                 claims.SCORES: _scores(k4=copes, es_sqrtk_alpha=es, **others)}}
    assert next(r for r in claims.judge_claims(a7) if r["claim"] == "A7")["verdict"] == claims.DISAGREES
