"""The claims table: missing results never count as agreement; every rule can agree, disagree, or say
inconclusive; README regeneration."""

import json

import numpy as np
import pytest

from copes_lib import claims, stats
from copes_lib.config import REPO_ROOT


def _scores(metric, nested=False, **arms):
    arms = {k: np.asarray(v, dtype=float) for k, v in arms.items()}
    return {metric: stats.ScoreSet(metric, arms, {k: tuple(range(len(v))) for k, v in arms.items()}, nested)}


def _binary(rng, rate, seeds=5, problems=600):
    """0/1 scores; each problem has its own difficulty, shared by every arm built from the same rng state."""
    return (rng.random((seeds, problems)) < rate).astype(float)


def _row(summaries, claim_id):
    return next(r for r in claims.judge_claims(summaries) if r["claim"] == claim_id)


def _verdict(summaries, claim_id):
    return _row(summaries, claim_id)["verdict"]


MATH_05 = {"gain_recovery_copes": 0.5, "gain_recovery_es": 0.2, "gain_recovery_lora_grpo": 0.3,
           "base_val_accuracy": 0.4, "full_grpo_best_val_accuracy": 0.5,
           "es_steps_to_match_copes": 12, "budget_steps": 8}


def test_every_claim_is_missing_without_results():
    rows = claims.judge_claims({})
    assert rows and all(r["verdict"] == claims.MISSING for r in rows)


def test_partial_keys_are_missing_not_agreement():
    row = _row({"05_fixed_budget_math": {"gain_recovery_copes": 0.9}}, "A1")
    assert row["verdict"] == claims.MISSING and "gain_recovery_es" in row["ours"]


def test_without_per_problem_scores_a_statistical_claim_is_inconclusive():
    row = _row({"05_fixed_budget_math": MATH_05}, "A1")
    assert row["verdict"] == claims.INCONCLUSIVE and claims.NO_SCORES in row["ours"]
    assert "0.5" in row["ours"]  # the point figures are still shown


def test_beats_rule_agrees_does_not_and_inconclusive():
    rng = np.random.default_rng(0)

    def a1(copes, es):
        return _verdict({"05_fixed_budget_math": {**MATH_05, claims.SCORES: _scores(
            "val_accuracy_at_budget", copes=copes, es=es)}}, "A1")

    strong, weak = _binary(rng, 0.6), _binary(rng, 0.4)
    assert a1(strong, weak) == claims.AGREES
    assert a1(weak, strong) == claims.OPPOSITE  # the opposite, significant
    small_a, small_b = _binary(rng, 0.45, seeds=2, problems=40), _binary(rng, 0.4, seeds=2, problems=40)
    assert a1(small_a, small_b) == claims.INCONCLUSIVE  # too small a study to say anything
    # the same problems solved, a handful of flips: an effect of half the paper's size (0.5 x 0.246 x 0.1
    # = 1.2 points) is ruled out -> "does not"
    same = _binary(rng, 0.5, seeds=5, problems=3000)
    flipped = same.copy()
    flipped[np.arange(5), np.arange(5)] = 1 - flipped[np.arange(5), np.arange(5)]
    assert a1(flipped, same) == claims.DISAGREES
    assert "no effect (equivalent)" in _row({"05_fixed_budget_math": {**MATH_05, claims.SCORES: _scores(
        "val_accuracy_at_budget", copes=flipped, es=same)}}, "A1")["ours"]


def test_one_seed_arm_is_inconclusive():
    rng = np.random.default_rng(1)
    scores = _scores("val_accuracy_at_budget", copes=_binary(rng, 0.7), lora_grpo=_binary(rng, 0.2, seeds=1))
    row = _row({"05_fixed_budget_math": {**MATH_05, claims.SCORES: scores}}, "A3")
    assert row["verdict"] == claims.INCONCLUSIVE and "5/1 seeds" in row["power"]
    assert "1 seed" in row["reason"]


def test_a_significant_opposite_with_a_one_seed_reference_is_shown_provisional():
    """A3's case: CoPES significantly below a one-seed LoRA-GRPO must not hide as inconclusive."""
    rng = np.random.default_rng(11)
    scores = _scores("val_accuracy_at_budget", copes=_binary(rng, 0.3), lora_grpo=_binary(rng, 0.6, seeds=1))
    summaries = {"05_fixed_budget_math": {**MATH_05, claims.SCORES: scores}}
    row = _row(summaries, "A3")
    assert row["verdict"] == claims.OPPOSITE
    assert "wrong side" in row["reason"] and "provisional" in row["reason"]
    # and the summary's list of significant results states it, whichever way it points
    lines = claims.significant_results(summaries)
    assert any("copes_vs_lora_grpo (A3)" in line and "OTHER way" in line for line in lines)
    md = claims.to_markdown(claims.judge_claims(summaries), "cpu", significant=lines)
    assert "copes_vs_lora_grpo (A3)" in md.split("whichever way it points")[1]


def test_a_null_reads_inconclusive_with_its_reason():
    rng = np.random.default_rng(12)
    same = _binary(rng, 0.5, seeds=3, problems=200)
    other = _binary(rng, 0.5, seeds=3, problems=200)
    row = _row({"05_fixed_budget_math": {**MATH_05, claims.SCORES: _scores(
        "val_accuracy_at_budget", copes=same, es=other)}}, "A1")
    assert row["verdict"] == claims.INCONCLUSIVE and row["reason"].startswith("interval spans 0")


def test_every_row_has_a_reason():
    rng = np.random.default_rng(13)
    summaries = {**_ablations(rng, 0.6, 0.4, 0.4), **_factorial(rng), **_sandbox(rng, pre=-0.02)}
    rows = claims.judge_claims(summaries)
    assert all(r["reason"] for r in rows), [r["claim"] for r in rows if not r["reason"]]
    md = claims.to_markdown(rows, "cpu")
    assert "| verdict | reason | power |" in md


def _a1_effect(rng=None):
    rng = rng or np.random.default_rng(7)
    return _scores("val_accuracy_at_budget", copes=_binary(rng, 0.6), es=_binary(rng, 0.4))


def test_es_steps_rule_accounts_for_horizon_and_validation_grid():
    scores = _a1_effect()

    def a2(**s):
        return _verdict({"05_fixed_budget_math": {**MATH_05, "es_long_n_seeds": 3, claims.SCORES: scores, **s}}, "A2")

    assert a2(es_steps_to_match_copes=None) == claims.INCONCLUSIVE  # never reached, horizon unknown
    assert a2(es_steps_to_match_copes=None, es_long_steps=16) == claims.INCONCLUSIVE  # 2x < 3x
    assert a2(es_steps_to_match_copes=None, es_long_steps=24) == claims.AGREES
    assert a2(es_steps_to_match_copes=24, val_every=4) == claims.AGREES  # crossing in (20, 24]: >= 2.5x
    assert a2(es_steps_to_match_copes=12, val_every=4) == claims.PARTLY  # (8, 12]: more, but < 2x
    assert a2(es_steps_to_match_copes=20, val_every=8) == claims.INCONCLUSIVE  # (12, 20] straddles 2x
    assert a2(es_steps_to_match_copes=12) == claims.INCONCLUSIVE  # grid unknown
    assert a2(es_steps_to_match_copes=8, val_every=4) == claims.DISAGREES


def test_es_steps_rule_needs_an_a1_effect_and_three_long_seeds():
    """Under the null A2 would read 'partly' from noise about half the time: it is gated on A1."""
    rng = np.random.default_rng(8)
    base = {**MATH_05, "es_steps_to_match_copes": 24, "val_every": 4, "es_long_n_seeds": 3}
    effect = {**base, claims.SCORES: _a1_effect(rng)}
    assert _verdict({"05_fixed_budget_math": effect}, "A2") == claims.AGREES
    null = {**base, claims.SCORES: _scores("val_accuracy_at_budget", copes=_binary(rng, 0.5, 3, 100),
                                           es=_binary(rng, 0.5, 3, 100))}
    row = _row({"05_fixed_budget_math": null}, "A2")
    assert row["verdict"] == claims.INCONCLUSIVE and "A1 shows no effect" in row["reason"]
    one_seed = _row({"05_fixed_budget_math": {**effect, "es_long_n_seeds": 1}}, "A2")
    assert one_seed["verdict"] == claims.INCONCLUSIVE and "1 long ES seed" in one_seed["reason"]
    assert "would read agrees" in one_seed["reason"]


def _ablations(rng, k4, k1, k8, **others):
    arms = {"k4": _binary(rng, k4), "k1": _binary(rng, k1), "k8": _binary(rng, k8)}
    arms.update({arm: _binary(rng, rate) for arm, rate in others.items()})
    return {"06_copes_ablations": {"val_accuracy_k1": k1, "val_accuracy_k4": k4, "val_accuracy_k8": k8,
                                   "val_accuracy_indep_z": others.get("indep_z", 0.0),
                                   "val_accuracy_es_sqrtk_alpha": others.get("es_sqrtk_alpha", 0.0),
                                   "base_val_accuracy": 0.4, claims.SCORES: _scores("val_accuracy_at_budget", **arms)},
            "05_fixed_budget_math": MATH_05}


def test_k_sweep_rule():
    rng = np.random.default_rng(2)
    assert _verdict(_ablations(rng, 0.6, 0.4, 0.4), "A4") == claims.AGREES
    assert _verdict(_ablations(rng, 0.6, 0.4, 0.6), "A4") == claims.PARTLY
    assert _verdict(_ablations(rng, 0.4, 0.6, 0.6), "A4") == claims.OPPOSITE
    noisy = _ablations(rng, 0.5, 0.5, 0.5)
    for arm in ("k1", "k4", "k8"):
        noisy["06_copes_ablations"][claims.SCORES]["val_accuracy_at_budget"].arms[arm] = _binary(rng, 0.5, 2, 30)
        noisy["06_copes_ablations"][claims.SCORES]["val_accuracy_at_budget"].seeds[arm] = (0, 1)
    assert _verdict(noisy, "A4") == claims.INCONCLUSIVE


def test_holm_runs_over_the_notebooks_whole_family():
    rng = np.random.default_rng(3)
    alone = _ablations(rng, 0.5, 0.5, 0.5, es_sqrtk_alpha=0.5)
    full = _ablations(rng, 0.5, 0.5, 0.5, es_sqrtk_alpha=0.5, k2=0.5, indep_z=0.5, es_2sigma=0.5,
                      copes_matched_step=0.5)
    assert "alpha 0.05/3" in _row(alone, "A7")["power"]  # k1, k8 and es_sqrtk_alpha
    assert "alpha 0.05/7" in _row(full, "A7")["power"]
    # the same A7 data: its Holm p can only grow with the family
    s = full["06_copes_ablations"][claims.SCORES]["val_accuracy_at_budget"]
    ctx = claims.Context("06_copes_ablations", full)
    c = ctx.family()["k4_vs_es_sqrtk_alpha"]
    assert c.p_holm >= c.p and c.family_size == 7 and s.arms["k4"].shape == (5, 600)


def test_a7_the_norm_matched_control_is_judged_against_a1s_margin():
    """docs/regime.md R12: CoPES (k4) vs ES at sqrt(K) x alpha, margin 0.5 x A1's paper share x our gain;
    agrees on an effect, does not when an effect of that size is ruled out, opposite the other way."""
    from copes_lib import paper

    assert paper.EFFECT_SHARE_A["k4_vs_es_sqrtk_alpha"] == paper.EFFECT_SHARE_A["copes_vs_es"]
    rng = np.random.default_rng(11)

    def summaries(k4, sqrtk):
        s = _ablations(rng, 0.5, 0.5, 0.5, es_sqrtk_alpha=0.5)
        s["06_copes_ablations"].pop("base_val_accuracy")  # the gain is 05's: 0.9 - 0.4
        s["06_copes_ablations"][claims.SCORES]["val_accuracy_at_budget"].arms.update(k4=k4, es_sqrtk_alpha=sqrtk)
        s["05_fixed_budget_math"] = {**MATH_05, "full_grpo_best_val_accuracy": 0.9}  # margin 0.5 x 0.246 x 0.5
        return s

    k4 = _binary(rng, 0.6)
    near = k4.copy()
    near[:, :6] = 1 - near[:, :6]  # 1% of the problems differ: inside the margin (6.2 points)
    assert _verdict(summaries(k4, near), "A7") == claims.DISAGREES
    assert _verdict(summaries(k4, _binary(rng, 0.4)), "A7") == claims.AGREES
    assert _verdict(summaries(_binary(rng, 0.4), _binary(rng, 0.6)), "A7") == claims.OPPOSITE
    wide = summaries(k4[:2, :40], near[:2, :40])  # 2 seeds x 40 problems: too few to rule the margin out
    for arm in ("k1", "k8"):
        ss = wide["06_copes_ablations"][claims.SCORES]["val_accuracy_at_budget"]
        ss.arms[arm] = ss.arms[arm][:2, :40]
    for ss in wide["06_copes_ablations"][claims.SCORES].values():
        ss.seeds.update({arm: (0, 1) for arm in ss.arms})
    assert _verdict(wide, "A7") == claims.INCONCLUSIVE


def test_a7_qa_the_norm_matched_control_on_qa_is_gated_by_qa_and_shares_a8s_family():
    """docs/regime.md R12: A7-qa (CoPES vs ES at sqrt(K) x alpha on test F1) is gated by QA's criterion, Holm
    runs over 07's family with A8, and its margin is 0.5 x A8's paper share x our QA gain."""
    from copes_lib import paper

    assert claims.gate_task("A7-qa") == "qa" and claims.gate_task("A7") == "math"
    assert paper.EFFECT_SHARE_A["copes_vs_es_sqrtk_alpha_f1"] == paper.EFFECT_SHARE_A["copes_vs_es_f1"]
    rng = np.random.default_rng(5)

    def rows(copes, sqrtk, qa=True):
        arms = {"copes": copes, "es": _binary(rng, 0.5), "es_sqrtk_alpha": sqrtk}
        return _rows({"01_substrate_and_agent": {"regime_criterion_met_math": True, "regime_criterion_met_qa": qa,
                                                 claims.GATE_RULE_KEY: claims.GATE_RULE},
                      "07_multihop_qa": {"f1_copes": float(copes.mean()), "f1_es": 0.5,
                                         "f1_es_sqrtk_alpha": float(sqrtk.mean()), "f1_base": 0.3, "f1_full_grpo": 0.9,
                                         claims.SCORES: _scores("test_f1", **arms)}})

    copes = _binary(rng, 0.7)
    near = copes.copy()
    near[:, :3] = 1 - near[:, :3]  # 0.5% of the problems differ: inside the margin (2.4 points)
    assert rows(copes, near)["A7-qa"]["verdict"] == claims.DISAGREES
    ahead = rows(copes, _binary(rng, 0.5))
    assert ahead["A7-qa"]["verdict"] == claims.AGREES and "alpha 0.05/2" in ahead["A7-qa"]["power"]
    assert "alpha 0.05/2" in ahead["A8"]["power"]  # one family: A8 and A7-qa
    assert rows(_binary(rng, 0.4), _binary(rng, 0.7))["A7-qa"]["verdict"] == claims.OPPOSITE
    gated = rows(copes, _binary(rng, 0.5), qa=False)
    assert gated["A7-qa"]["verdict"] == claims.NOT_IN_REGIME and "would read agrees" in gated["A7-qa"]["reason"]
    assert rows(copes, near)["A7"]["verdict"] == claims.MISSING  # 06 did not run: A7 (math) is its own claim


def test_memory_claim_needs_the_papers_convention():
    s = {"qwen35_4b_es_gib_at_128k": 12.7757, "qwen35_4b_full_grpo_gib_at_128k": 453.4374,
         "qwen35_4b_lora_grpo_gib_at_128k": 402.55, "qwen35_4b_es_gib_at_128k_exact": 12.6797}
    assert _verdict({"08_memory_and_gpu_hours": s}, "A9") == claims.AGREES
    # the exact-GiB value (0.8% off) no longer passes the tolerance
    assert _verdict({"08_memory_and_gpu_hours": {**s, "qwen35_4b_es_gib_at_128k": 12.6797}}, "A9") == claims.PARTLY
    assert _verdict({"08_memory_and_gpu_hours": {**s, "qwen35_4b_es_gib_at_128k_exact": 12.78}},
                    "A9") == claims.INCONCLUSIVE  # both conventions match: the check cannot tell them apart
    assert _verdict({"08_memory_and_gpu_hours": {"qwen35_4b_es_gib_at_128k": 20.0,
                                                 "qwen35_4b_full_grpo_gib_at_128k": 100.0,
                                                 "qwen35_4b_lora_grpo_gib_at_128k": 100.0}}, "A9") == claims.DISAGREES


def _factorial(rng, router=0.01, lifecycle=-0.01, full_vs_b3=None, scope=0.0, seed_sd=0.002, seeds=5, windows=200):
    """Per-seed per-window log-PPL of the cells: window difficulty shared, each cell-seed its own training
    noise; effects given as Delta = ref - test (positive = the test cell is better)."""
    window = rng.normal(3.6, 0.3, windows)

    def cell(offset):
        return (window[None, :] + rng.normal(0.0, seed_sd, (seeds, 1)) + offset
                + rng.normal(0.0, 0.002, (seeds, windows)))

    full = router + lifecycle if full_vs_b3 is None else full_vs_b3
    b3, r, r_e_l = cell(0.0), cell(-router), cell(-full)  # lower log-PPL = better
    r_e = r.copy()  # the chain's +R+E is the same computation as +R
    r_l_e0 = cell(-full + scope)
    summary = {"delta_router": router, "delta_lifecycle": lifecycle, "delta_full_vs_b3": full,
               "delta_eval_scope": scope}
    summary[claims.SCORES] = _scores("log_ppl", b3=b3, r=r, r_e=r_e, r_e_l=r_e_l, r_l_e0=r_l_e0)
    return {"12_molora_factorial": summary}


def test_factorial_effect_and_no_effect_rules():
    rng = np.random.default_rng(4)
    assert _verdict(_factorial(rng), "B2") == claims.AGREES
    assert _verdict(_factorial(rng, router=-0.01), "B2") == claims.OPPOSITE
    assert _verdict(_factorial(rng), "B3") == claims.AGREES
    assert _verdict(_factorial(rng, lifecycle=0.01), "B3") == claims.OPPOSITE
    # B4 / B5: "no effect" agrees only inside the declared margin (0.5 x the paper's smallest significant
    # effect, 0.028 nats), never one derived from our own router effect
    assert _verdict(_factorial(rng, full_vs_b3=0.0), "B4") == claims.AGREES
    assert _verdict(_factorial(rng, full_vs_b3=0.02), "B4") == claims.DISAGREES
    assert _verdict(_factorial(rng, scope=0.0), "B5") == claims.AGREES
    assert _verdict(_factorial(rng, scope=0.02), "B5") == claims.DISAGREES
    # a null router effect does not shrink the margin: B5 still reads equivalence at +-0.014 nats
    null_router = _factorial(rng, router=0.0, lifecycle=0.0, scope=0.0)
    row = _row(null_router, "B5")
    assert row["verdict"] == claims.AGREES and "0.014" in row["reason"]
    assert _verdict(null_router, "B2") == claims.DISAGREES  # an effect of the paper's size ruled out
    # a significant difference, however small, contradicts "no effect"
    assert _verdict(_factorial(rng, router=0.002, scope=0.002, seed_sd=0.0002), "B5") == claims.DISAGREES
    noisy = _factorial(rng, router=0.01, scope=0.0, seed_sd=0.05, seeds=3, windows=20)
    assert _verdict(noisy, "B5") == claims.INCONCLUSIVE and _verdict(noisy, "B4") == claims.INCONCLUSIVE


def test_paper_b_margins_come_from_the_papers_effects():
    from copes_lib import paper

    assert paper.equivalence_margin_b("router") == pytest.approx(0.5 * 0.0426)
    assert paper.equivalence_margin_b("full_vs_b3") == pytest.approx(0.5 * 0.028)
    assert paper.equivalence_margin_b("eval_scope_with_lifecycle") == pytest.approx(0.5 * 0.028)


def _sandbox(rng, pre, elsewhere=0.2, sd=0.005, seeds=5):
    regimes = ("prealigned", "random", "misaligned", "cotrained")
    summary, scores = {}, {}
    for regime in regimes:
        diff = pre if regime == "prealigned" else elsewhere
        grad = rng.normal(0.05, 0.01, (seeds, 1))
        evo = grad + diff + rng.normal(0.0, sd, (seeds, 1))
        summary[f"evo_minus_grad_excess_loss_{regime}"] = diff
        scores.update(_scores(f"excess_loss_{regime}", nested=True, evolution=evo, gradient=grad))
    summary[claims.SCORES] = scores
    return {"13_molora_sandbox": summary}


def _region_map(wins):
    """A 3 alignments x 2 noise x 1 budget map; ``wins``: the (alignment, noise) cells evolution wins."""
    return [{"alignment": str(a), "adapter_noise": str(n), "budget_evals": "300",
             "outcome": "win" if (a, n) in wins else "loss"} for a in (0.0, 0.5, 1.0) for n in (0.0, 0.1)]


def test_sandbox_rule_reads_the_map():
    rng = np.random.default_rng(15)

    def b6(wins):
        s = _sandbox(rng, pre=+0.02)  # at the grid point evolution loses; the map decides
        s["13_molora_sandbox"][claims.REGION_MAP] = _region_map(wins)
        return _row(s, "B6")

    assert b6({(1.0, 0.0), (1.0, 0.1)})["verdict"] == claims.AGREES
    partly = b6({(1.0, 0.0)})
    assert partly["verdict"] == claims.PARTLY
    assert "holds where alignment 1, noise 0" in partly["reason"] and "fails where alignment 1, noise 0.1" in partly["reason"]
    assert b6({(1.0, 0.0), (0.5, 0.0)})["verdict"] == claims.PARTLY  # the "only" fails
    assert b6(set())["verdict"] == claims.DISAGREES
    assert b6({(0.5, 0.0)})["verdict"] == claims.DISAGREES


def test_load_summaries_attaches_a_matching_region_map(tmp_path):
    nb = tmp_path / "cpu" / "13_molora_sandbox"
    nb.mkdir(parents=True)
    cells = _region_map({(1.0, 0.0)})
    (nb / "region_map.csv").write_text("alignment,adapter_noise,budget_evals,outcome\n" + "".join(
        f"{c['alignment']},{c['adapter_noise']},{c['budget_evals']},{c['outcome']}\n" for c in cells))
    (nb / "summary.json").write_text(json.dumps({"map_cells": len(cells)}))
    assert len(claims.load_summaries("cpu", root=tmp_path)["13_molora_sandbox"][claims.REGION_MAP]) == 6
    (nb / "summary.json").write_text(json.dumps({"map_cells": 45}))  # a table from another run: not read
    assert claims.REGION_MAP not in claims.load_summaries("cpu", root=tmp_path)["13_molora_sandbox"]


def test_sandbox_rule():
    rng = np.random.default_rng(5)
    assert _verdict(_sandbox(rng, pre=-0.02), "B6") == claims.AGREES
    assert _verdict(_sandbox(rng, pre=-0.02, elsewhere=-0.02), "B6") == claims.PARTLY
    assert _verdict(_sandbox(rng, pre=+0.02), "B6") == claims.DISAGREES
    assert _verdict(_sandbox(rng, pre=-0.002, sd=0.05, seeds=3), "B6") == claims.INCONCLUSIVE


def test_update_readme_replaces_only_the_marked_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\nkeep me\n{claims.README_START}\nold table\n{claims.README_END}\ntail\n")
    assert claims.update_readme(readme, "new table\n")
    text = readme.read_text()
    assert "old table" not in text and "new table" in text
    assert text.startswith("# title\nkeep me\n") and text.endswith("tail\n")
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    assert not claims.update_readme(plain, "x")
    assert plain.read_text() == "no markers\n"


def test_results_pages_get_the_short_and_the_full_table(tmp_path):
    """99's WRITE_README: the README gets the short table (the papers' claims, our predictions counted),
    docs/results.md the full one with reasons and notebook links relative to docs/."""
    (tmp_path / "docs").mkdir()
    for page in ("README.md", claims.RESULTS_PAGE):
        (tmp_path / page).write_text(f"# {page}\nhand-written\n{claims.README_START}\nSTALE-TABLE\n{claims.README_END}\ntail\n")
    rows = claims.judge_claims({})
    assert claims.write_results_pages(tmp_path, rows, "cpu", significant=[]) == {"README.md": True,
                                                                                   claims.RESULTS_PAGE: True}
    readme, full = (tmp_path / "README.md").read_text(), (tmp_path / claims.RESULTS_PAGE).read_text()
    assert "STALE-TABLE" not in readme + full and "hand-written" in readme and readme.endswith("tail\n")
    assert "| claim | paper | what our data show | gate | verdict |" in readme and "| reason |" not in readme
    for claim in claims.CLAIMS:
        assert f"| {claim.claim_id}: " in readme and f"| {claim.claim_id} |" in full
    ours = [r["claim"] for r in rows if r["paper"] == claims.OURS]
    assert ours and f"Our {len(ours)} registered predictions" in readme
    assert not any(f"| {claim}: " in readme for claim in ours)
    assert "| verdict | reason | power |" in full and "](../notebooks/05_fixed_budget_math.ipynb)" in full
    assert "Every significant result" in full and "Every significant result" not in readme


def test_readme_table_keeps_every_cell_whole_with_a_glossary_first():
    rows = [{"claim": "A1", "paper": "A", "statement": "s", "paper_figure": "1", "ours": "word " * 40,
             "verdict": claims.AGREES, "reason": "r", "power": "", "notebook": "05_fixed_budget_math"}]
    md = claims.readme_markdown(rows, "cpu")
    assert "word " * 39 + "word" in md and "..." not in md
    glossary, header = md.index("**strict accuracy**"), md.index("| claim | paper | what our data show | gate | verdict |")
    assert glossary < header
    for term in ("strict accuracy", "lenient accuracy", "gain recovery", "s*", "gate", "units"):
        assert f"**{term}**" in md


def test_the_readme_says_what_the_data_show_and_the_gate_apart():
    rows = {r["claim"]: r for r in _gated_rows()}
    a1, a8, a9 = rows["A1"], rows["A8"], rows["A9"]
    assert a1["data"].startswith("effect: CoPES - ES +") and "600 problems as independent units" in a1["data"]
    assert a1["gate"] == "open: math's criterion and preflight met" and a1["verdict"] == claims.AGREES
    # A8's data show an effect, but its gate (QA's criterion) is closed: both are said, apart
    assert a8["data"].startswith("effect: CoPES - ES +") and a8["gate"] == "closed: qa's regime criterion not met"
    assert a8["verdict"] == claims.NOT_IN_REGIME and a9["gate"] == "none"
    md = claims.readme_markdown(list(rows.values()), "cpu")
    line = next(x for x in md.splitlines() if x.startswith("| A8: "))
    assert "| effect: CoPES - ES" in line and "| closed: qa's regime criterion not met | not in regime |" in line
    assert "..." not in md


def test_markdown_lists_every_claim_with_a_link_and_power():
    md = claims.to_markdown(claims.judge_claims({}), "cpu")
    assert "| verdict | reason | power |" in md
    for claim in claims.CLAIMS:
        assert f"| {claim.claim_id} |" in md
        assert f"notebooks/{claim.notebook}.ipynb" in md


def test_markdown_rows_never_break_the_table():
    rows = [{"claim": "X", "paper": "A", "statement": "a | b", "paper_figure": "1", "ours": "|x|",
             "verdict": claims.AGREES, "reason": "r|s", "power": "p|q", "notebook": "05_fixed_budget_math"}]
    line = claims.to_markdown(rows, "cpu").splitlines()[-1]
    assert line.count("|") == 10


def test_load_summaries_attaches_scores(tmp_path):
    nb = tmp_path / "cpu" / "05_fixed_budget_math"
    nb.mkdir(parents=True)
    rng = np.random.default_rng(6)
    stats.save_scores(nb, "val_accuracy_at_budget", {"copes": _binary(rng, 0.6), "es": _binary(rng, 0.4)},
                      list(range(5)))
    (nb / "summary.json").write_text('{"gain_recovery_copes": 0.5, "scores_sha256": "stale"}')
    assert claims.SCORES not in claims.load_summaries("cpu", root=tmp_path)["05_fixed_budget_math"]
    (nb / "summary.json").write_text(json.dumps({"gain_recovery_copes": 0.5,
                                                 "scores_sha256": stats.scores_digest(nb)}))
    summaries = claims.load_summaries("cpu", root=tmp_path)
    ss = summaries["05_fixed_budget_math"][claims.SCORES]["val_accuracy_at_budget"]
    assert ss.arms["copes"].shape == (5, 600)
    assert _verdict({"05_fixed_budget_math": {**MATH_05, **summaries["05_fixed_budget_math"]}}, "A1") == claims.AGREES


@pytest.mark.parametrize("claim", [c.claim_id for c in claims.CLAIMS])
def test_every_claim_has_a_family_or_a_deterministic_rule(claim):
    c = next(x for x in claims.CLAIMS if x.claim_id == claim)
    assert c.notebook in claims.FAMILIES or c.notebook in ("08_memory_and_gpu_hours", "11_molora_router")


# --------------------------------------------------------------------------- the scale study (ours, notebook 09)
def _scale_summary(verdict: str, slope_gap: float, slope_es: float, sizes: int = 3) -> dict:
    return {"09_scale_study": {
        "largest_size_tag": "cpu", "n_sizes": sizes, "n_params_cpu": 1_370_000,
        "copes_paper_minus_es_cpu": 0.012, "copes_paper_minus_es_low_cpu": 0.002,
        "copes_paper_minus_es_high_cpu": 0.022, "copes_paper_minus_es_verdict_cpu": verdict,
        "copes_paper_minus_es_slope_per_decade": slope_gap, "gain_recovery_es_slope_per_decade": slope_es}}


@pytest.mark.parametrize(("verdict", "expected"), [(stats.EFFECT, claims.AGREES), (stats.OPPOSITE, claims.OPPOSITE),
                                                   (stats.INCONCLUSIVE, claims.INCONCLUSIVE)])
def test_scale_claim_s1_follows_the_tested_verdict(verdict, expected):
    rows = {r["claim"]: r for r in claims.judge_claims(_scale_summary(verdict, 0.01, 0.02))}
    assert rows["S1"]["verdict"] == expected and "+1.2 points" in rows["S1"]["ours"]


def _trend_summary(gaps, recoveries, half_width):
    """Per-size estimates at 1e4, 1e5, 1e6 parameters (None: undefined there), each +- half_width."""
    summary = {"sizes": ["a", "b", "c"], "largest_size_tag": "c", "n_sizes": 3}
    for tag, n, gap, rec in zip("abc", (1e4, 1e5, 1e6), gaps, recoveries):
        summary[f"n_params_{tag}"] = n
        for metric, value in (("copes_paper_minus_es", gap), ("gain_recovery_es", rec)):
            summary[f"{metric}_{tag}"] = value
            summary[f"{metric}_low_{tag}"] = None if value is None else value - half_width
            summary[f"{metric}_high_{tag}"] = None if value is None else value + half_width
    return {"09_scale_study": summary}


def test_scale_trend_claims_can_fail_and_say_inconclusive():
    # a clear rise of the gap, a clear fall of recovery: agrees / does not
    rows = {r["claim"]: r for r in claims.judge_claims(_trend_summary((-0.1, 0.0, 0.1), (0.5, 0.3, 0.1), 0.02))}
    assert rows["S2"]["verdict"] == claims.AGREES and rows["S3"]["verdict"] == claims.OPPOSITE
    assert "slope 0.1 per decade" in rows["S2"]["ours"]
    # the same means inside wide per-size intervals: a line through noise decides nothing
    rows = {r["claim"]: r for r in claims.judge_claims(_trend_summary((-0.1, 0.0, 0.1), (0.5, 0.3, 0.1), 0.5))}
    assert rows["S2"]["verdict"] == rows["S3"]["verdict"] == claims.INCONCLUSIVE
    # recovery undefined at two sizes (GRPO gained nothing there): no trend from one point
    rows = {r["claim"]: r for r in claims.judge_claims(_trend_summary((-0.1, 0.0, 0.1), (None, None, 0.1), 0.02))}
    assert rows["S3"]["verdict"] == claims.INCONCLUSIVE and "defined at 1 of 3 sizes" in rows["S3"]["ours"]


# --------------------------------------------------------------------------- one data set, one verdict
def test_shared_arrays_get_one_test_and_one_verdict():
    """06's K = 1 / K = 4 arrays are 05's es / copes: A1 and A4's K4-K1 must be the same test."""
    rng = np.random.default_rng(20)
    copes, es = _binary(rng, 0.52), _binary(rng, 0.5)
    summaries = _ablations(rng, 0.5, 0.5, 0.5)
    s06 = summaries["06_copes_ablations"][claims.SCORES]["val_accuracy_at_budget"]
    s06.arms["k4"], s06.arms["k1"] = copes.copy(), es.copy()
    summaries["05_fixed_budget_math"] = {**MATH_05, claims.SCORES: _scores("val_accuracy_at_budget", copes=copes, es=es)}
    families = claims.Families(summaries)
    a1 = families.family("05_fixed_budget_math")["copes_vs_es"]
    k4_k1 = families.family("06_copes_ablations")["k4_vs_k1"]
    assert k4_k1 is a1 and k4_k1.margin == a1.margin  # one test, one margin
    assert families.family("06_copes_ablations")["k4_vs_k8"].family_size == 1  # k4_vs_k1 left 06's family
    assert families.shared("06_copes_ablations", "k4_vs_k1").notebook == "05_fixed_budget_math"
    a4 = _row(summaries, "A4")
    assert "same score arrays as 05_fixed_budget_math's copes_vs_es (A1)" in a4["reason"]
    assert f"K4-K1 {claims._stat(a1, 100, ' pts')}" in a4["ours"]
    # different arrays: tested separately
    s06.arms["k1"] = _binary(rng, 0.5)
    assert claims.Families(summaries).shared("06_copes_ablations", "k4_vs_k1") is None


# --------------------------------------------------------------------------- not in regime
@pytest.mark.parametrize("met", [True, False, None])
def test_not_in_regime_gates_the_method_claims(met):
    rng = np.random.default_rng(21)
    summaries = {"05_fixed_budget_math": {**MATH_05, claims.SCORES: _a1_effect(rng)}}
    if met is not None:
        summaries["01_substrate_and_agent"] = {"regime_criterion_met": met}
    rows = {r["claim"]: r for r in claims.judge_claims(summaries)}
    if met is False:
        assert rows["A1"]["verdict"] == claims.NOT_IN_REGIME
        assert "regime_criterion_met is false" in rows["A1"]["reason"] and "would read agrees" in rows["A1"]["reason"]
    else:
        assert rows["A1"]["verdict"] == claims.AGREES
    assert rows["A4"]["verdict"] == claims.MISSING  # missing keys stay missing


@pytest.mark.parametrize("met", [None, True, False])
def test_a_failed_preflight_makes_the_method_claims_not_actionable(met):
    rng = np.random.default_rng(21)
    summaries = {"05_fixed_budget_math": {**MATH_05, claims.SCORES: _a1_effect(rng)},
                 "01_substrate_and_agent": {"regime_criterion_met": True}}
    if met is not None:
        summaries["01_substrate_and_agent"].update(preflight_met=met, preflight_failed=[] if met else ["math G1"])
    rows = {r["claim"]: r for r in claims.judge_claims(summaries)}
    if met is False:
        assert rows["A1"]["verdict"] == claims.NOT_ACTIONABLE
        assert "math G1" in rows["A1"]["reason"] and "would read agrees" in rows["A1"]["reason"]
    else:
        assert rows["A1"]["verdict"] == claims.AGREES
    assert rows["A4"]["verdict"] == claims.MISSING


def _gated(math=None, qa=None, combined=None, rule=claims.GATE_RULE, **extra):
    """A1 (math) with an effect, A8 (QA) with an effect, R8 (a math prediction) that agrees, and 01's gates
    (``rule``: the gate rule 01 recorded; None: a summary written before R10, which records none)."""
    rng = np.random.default_rng(21)
    s01 = {k: v for k, v in (("regime_criterion_met_math", math), ("regime_criterion_met_qa", qa),
                             ("regime_criterion_met", combined), (claims.GATE_RULE_KEY, rule)) if v is not None}
    return {r["claim"]: r for r in claims.judge_claims({
        "01_substrate_and_agent": {**s01, **extra},
        "05_fixed_budget_math": {**MATH_05, "prediction_R8_value": 0.03, "prediction_R8_low": 0.01,
                                 "prediction_R8_high": 0.05, claims.SCORES: _a1_effect(rng)},
        "07_multihop_qa": {"f1_copes": 0.7, "f1_es": 0.6,
                           claims.SCORES: _scores("test_f1", copes=_binary(rng, 0.7), es=_binary(rng, 0.5))}})}


def _gated_rows():
    return list(_gated(math=True, qa=False, combined=False).values())


def test_each_claim_is_gated_by_its_own_tasks_criterion():
    # the committed cpu run's case: math met, QA missed -> math claims judged, A8 gated
    rows = _gated(math=True, qa=False, combined=False)
    assert rows["A1"]["verdict"] == claims.AGREES and rows["R8"]["verdict"] == claims.AGREES
    assert rows["A8"]["verdict"] == claims.NOT_IN_REGIME
    assert "regime_criterion_met_qa is false" in rows["A8"]["reason"] and "would read agrees" in rows["A8"]["reason"]
    # math missed, QA met -> the other way round
    rows = _gated(math=False, qa=True, combined=False)
    assert {rows[c]["verdict"] for c in ("A1", "R8")} == {claims.NOT_IN_REGIME}
    assert "regime_criterion_met_math is false" in rows["A1"]["reason"]
    assert rows["A8"]["verdict"] == claims.AGREES
    # a summary written before the per-task keys: the combined key gates every gated claim
    rows = _gated(combined=False)
    assert {rows[c]["verdict"] for c in ("A1", "A8", "R8")} == {claims.NOT_IN_REGIME}
    # a run registered under the combined rule keeps it even though it also wrote per-task keys (the committed
    # graded-base run): a rule registered after a run is not applied to it
    rows = _gated(math=True, qa=False, combined=False, rule=None)
    assert {rows[c]["verdict"] for c in ("A1", "A8", "R8")} == {claims.NOT_IN_REGIME}
    assert "regime_criterion_met is false" in rows["A1"]["reason"]
    assert rows["A1"]["gate"] == "closed: the combined math and QA regime criterion not met"
    assert rows["A9"]["verdict"] == claims.MISSING  # ungated claims are untouched
    assert claims.gate_task("A1-math500") == "math" and claims.gate_task("A8-2wiki") == "qa"
    assert claims.gate_task("R1") is None and claims.gate_task("B2") is None


def test_the_preflight_gates_per_task_too():
    rows = _gated(math=True, qa=True, preflight_math_met=True, preflight_qa_met=False,
                  preflight_met=False, preflight_failed=["qa G2"])
    assert rows["A1"]["verdict"] == claims.AGREES
    assert _gated(math=True, qa=True, preflight_math_met=True, preflight_qa_met=False, preflight_met=False,
                  preflight_failed=["qa G2"], rule=None)["A1"]["verdict"] == claims.NOT_ACTIONABLE
    assert rows["A8"]["verdict"] == claims.NOT_ACTIONABLE and "qa G2" in rows["A8"]["reason"]
    rows = _gated(math=True, qa=True, preflight_math_met=False, preflight_qa_met=True,
                  preflight_met=False, preflight_failed=["math E1"])
    assert rows["A1"]["verdict"] == claims.NOT_ACTIONABLE and "math E1" in rows["A1"]["reason"]
    assert "qa" not in rows["A1"]["reason"].split(";")[0] and rows["A8"]["verdict"] == claims.AGREES


def test_a_gate_naming_an_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match=r"task must be one of math, qa .*got 'code'"):
        claims.regime_key("code")
    from copes_lib.claims.table import _regime_gate

    with pytest.raises(ValueError, match="task must be one of math, qa"):
        _regime_gate({}, "gsm8k")


def test_the_notebooks_regime_context_reads_its_own_task(tmp_path, monkeypatch):
    from copes_lib import runs
    from copes_lib.protocols.paper_a import fixed_budget

    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path)
    folder = tmp_path / "smoke" / "01_substrate_and_agent"
    folder.mkdir(parents=True)
    runs.atomic_write_json(folder / "summary.json", {"regime_criterion_met": False, "regime_criterion_met_math": True,
                                                     "regime_criterion_met_qa": False, "warm_protocol": "latent"})
    math, qa = fixed_budget.regime_context("smoke"), fixed_budget.regime_context("smoke", "qa")
    assert math["regime_criterion_met"] is True and "in regime for math" in math["regime_note"]
    assert qa["regime_criterion_met"] is False and "NOT IN REGIME for qa" in qa["regime_note"]
    with pytest.raises(ValueError, match="task must be one of math, qa"):
        fixed_budget.regime_context("smoke", "QA")


# --------------------------------------------------------------------------- intervals with every noise source
def test_gain_recovery_interval_counts_the_reference_and_the_problems():
    rng = np.random.default_rng(22)
    base = _binary(rng, 0.4, seeds=1, problems=400)
    ss = stats.ScoreSet("m", {"base": base, "es": _binary(rng, 0.45, 5, 400), "full_grpo": _binary(rng, 0.6, 1, 400)},
                        {"base": (0,), "es": tuple(range(5)), "full_grpo": (42,)})
    one = stats.gain_recovery_interval(ss, "es")
    assert one.low < one.estimate < one.high and "full_grpo ran 1 seed" in one.note
    ss3 = stats.ScoreSet("m", {**ss.arms, "full_grpo": _binary(rng, 0.6, 3, 400)},
                         {**ss.seeds, "full_grpo": (42, 43, 44)})
    three = stats.gain_recovery_interval(ss3, "es")
    assert "1 seed" not in three.note and three.high - three.low > 0
    flat = stats.ScoreSet("m", {**ss.arms, "full_grpo": base.copy()}, {**ss.seeds})
    assert np.isnan(stats.gain_recovery_interval(flat, "es").low)  # no reference gain: unbounded


# --------------------------------------------------------------------------- docs cannot drift
def test_statistics_doc_holds_the_rules_of_claims_py():
    from copes_lib.config import REPO_ROOT

    text = (REPO_ROOT / "docs" / "statistics.md").read_text()
    block = text.split(claims.RULES_START)[1].split(claims.RULES_END)[0]
    assert block == "\n" + claims.rules_markdown(), (
        "docs/statistics.md is out of date: run python -c 'from copes_lib import claims; "
        "claims.update_docs(\"docs/statistics.md\")'")
    for verdict in claims.VERDICTS:
        assert f"`{verdict}`" in block


# --------------------------------------------------------------------------- unreadable files name themselves
def test_an_empty_summary_is_named_with_what_to_do(tmp_path):
    nb = tmp_path / "cpu" / "05_fixed_budget_math"
    nb.mkdir(parents=True)
    (nb / "summary.json").write_text("")
    with pytest.raises(claims.UnreadableResultError) as info:
        claims.load_summaries("cpu", root=tmp_path)
    message = str(info.value)
    assert str(nb / "summary.json") in message and "empty" in message and "ONLY=05" in message
    problems = []
    assert claims.load_summaries("cpu", root=tmp_path, problems=problems) == {}
    assert len(problems) == 1 and str(nb / "summary.json") in problems[0]


# --------------------------------------------------------------------------- our registered predictions
def _rows(summaries):
    return {r["claim"]: r for r in claims.judge_claims(summaries)}


def test_our_rows_are_marked_ours_and_registered():
    from copes_lib import regime

    ids = [c.claim_id for c in claims.OUR_CLAIMS]
    assert ids[:8] == [p.prediction_id for p in regime.PREDICTIONS]
    assert all(c.paper == claims.OURS and c.statement.startswith("(ours)") for c in claims.OUR_CLAIMS)
    rows = _rows({})
    assert all(rows[i]["verdict"] == claims.MISSING and rows[i]["reason"] for i in ids)
    md = claims.rules_markdown()
    for p in regime.PREDICTIONS[1:]:  # the registered thresholds are the rule the doc states
        assert f"agrees if {p.agrees_if}; does not if {p.disagrees_if}" in md


def test_every_registered_threshold_parses_and_a_bad_one_is_named():
    from copes_lib import regime

    assert claims.parse_rule("slope interval lower bound > 0") == ("low", ">", 0.0)
    assert claims.parse_rule("> 0.15") == ("value", ">", 0.15)
    for p in regime.PREDICTIONS:
        claims.parse_rule(p.agrees_if), claims.parse_rule(p.disagrees_if)
    with pytest.raises(ValueError, match="about 0.1"):
        claims.parse_rule("about 0.1")


def _r1(strict, protocol="latent", **extra):
    return {"01_substrate_and_agent": {"regime_math_strict_accuracy": strict, "warm_protocol": protocol,
                                       "warm_latent_p": 0.1, **extra}}


def test_r1_reads_the_strict_accuracy_of_a_latent_base():
    assert _rows(_r1(0.02))["R1"]["verdict"] == claims.AGREES
    assert _rows(_r1(0.30))["R1"]["verdict"] == claims.DISAGREES
    assert _rows(_r1(0.10))["R1"]["verdict"] == claims.INCONCLUSIVE
    paper = _rows(_r1(0.41, protocol="paper"))["R1"]
    assert paper["verdict"] == claims.NOT_IN_REGIME and "not a latent-protocol base" in paper["reason"]
    # judged in regime or not: its quantity is one of the criterion's values
    assert _rows(_r1(0.02, regime_criterion_met=False))["R1"]["verdict"] == claims.AGREES
    # 01's own reading is shown when it differs (it should not)
    assert "NOTE: 01 recorded" in _rows(_r1(0.02, prediction_R1="does not"))["R1"]["reason"]
    missing = _rows({"01_substrate_and_agent": {"warm_protocol": "latent"}})["R1"]
    assert missing["verdict"] == claims.MISSING and "01_substrate_and_agent" in missing["reason"]
    assert "regime_math_strict_accuracy" in missing["reason"]


def _prediction(pid, value, low, high, met=None):
    nb = claims.REGIME_PREDICTION_NOTEBOOKS[pid]
    out = {nb: {f"prediction_{pid}_value": value, f"prediction_{pid}_low": low, f"prediction_{pid}_high": high}}
    if met is not None:
        out["01_substrate_and_agent"] = {"regime_criterion_met": met}
    return out


def test_r2_reads_its_interval_against_three_points():
    assert _rows(_prediction("R2", 0.01, 0.0, 0.02))["R2"]["verdict"] == claims.AGREES
    assert _rows(_prediction("R2", 0.05, 0.04, 0.06))["R2"]["verdict"] == claims.DISAGREES
    row = _rows(_prediction("R2", 0.02, 0.0, 0.05))["R2"]
    assert row["verdict"] == claims.INCONCLUSIVE and "upper bound 0.05 not < 0.03" in row["reason"]
    assert row["notebook"] == "09_scale_study"


@pytest.mark.parametrize("pid", ["R3", "R4", "R5", "R6", "R7", "R8"])
def test_sign_predictions_agree_disagree_inconclusive_missing_and_not_in_regime(pid):
    assert _rows(_prediction(pid, 0.03, 0.01, 0.05))[pid]["verdict"] == claims.AGREES
    assert _rows(_prediction(pid, -0.03, -0.05, -0.01))[pid]["verdict"] == claims.DISAGREES
    assert _rows(_prediction(pid, 0.01, -0.01, 0.03))[pid]["verdict"] == claims.INCONCLUSIVE
    undefined = _rows(_prediction(pid, None, None, None))[pid]
    assert undefined["verdict"] == claims.INCONCLUSIVE and "undefined" in undefined["reason"]
    gated = _rows(_prediction(pid, 0.03, 0.01, 0.05, met=False))[pid]
    assert gated["verdict"] == claims.NOT_IN_REGIME and "would read agrees" in gated["reason"]
    assert _rows(_prediction(pid, 0.03, 0.01, 0.05, met=True))[pid]["verdict"] == claims.AGREES
    nb = claims.REGIME_PREDICTION_NOTEBOOKS[pid]
    partial = _rows({nb: {f"prediction_{pid}_value": 0.03}})[pid]
    assert partial["verdict"] == claims.MISSING
    assert nb in partial["reason"] and f"prediction_{pid}_low" in partial["reason"]


def _molora(p1="holds", rises="", m_matched=13, collapsed=4, seeds=5, router_c=(0.004, 0.001, 0.007),
            gap=(0.003, 0.001, 0.005)):
    s11 = {"prediction_p1_monotone": p1, "p1_rises": rises, "n_slots": 16, "paper_matched_router_lr_x": 166.7,
           "monopoly_slots_r0_paper_matched": m_matched,
           "prediction_p2_paper_budget_alone_no_collapse": "not on the grid" if m_matched is None else
           ("holds" if m_matched > 4 else "fails")}
    s12 = {"n_seeds": seeds, "collapsed_seeds_b3_collapsing": collapsed,
           "r0_collapsed_in_collapsing_setting": collapsed > seeds / 2,
           "delta_router_collapsing": router_c[0], "delta_router_collapsing_low": router_c[1],
           "delta_router_collapsing_high": router_c[2], "delta_router_collapsing_minus_default": gap[0],
           "delta_router_collapsing_minus_default_low": gap[1], "delta_router_collapsing_minus_default_high": gap[2]}
    return {"11_molora_router": s11, "12_molora_factorial": s12}


def test_molora_map_predictions_p1_p2():
    rows = _rows(_molora())
    assert rows["P1"]["verdict"] == rows["P2"]["verdict"] == claims.AGREES
    rows = _rows(_molora(p1="fails", rises="lr x30 at scale 100", m_matched=3))
    assert rows["P1"]["verdict"] == claims.DISAGREES and "lr x30 at scale 100" in rows["P1"]["reason"]
    assert rows["P2"]["verdict"] == claims.DISAGREES and "collapsed" in rows["P2"]["reason"]
    off_grid = _rows(_molora(m_matched=None))["P2"]
    assert off_grid["verdict"] == claims.INCONCLUSIVE and "not on the map's grid" in off_grid["reason"]
    assert _rows({"11_molora_router": {"n_slots": 16}})["P1"]["verdict"] == claims.MISSING


def test_molora_collapsing_contrast_predictions_p3_to_p6():
    rows = _rows(_molora())
    assert [rows[p]["verdict"] for p in ("P3", "P4", "P5", "P6")] == [claims.AGREES] * 4
    # the whole interval on the other side: does not
    rows = _rows(_molora(router_c=(-0.004, -0.007, -0.001), gap=(-0.003, -0.005, -0.001)))
    assert rows["P4"]["verdict"] == rows["P5"]["verdict"] == claims.DISAGREES
    assert _rows(_molora(router_c=(0.03, 0.02, 0.04)))["P6"]["verdict"] == claims.DISAGREES
    # straddling the threshold: 12's binary reading would say fails; the data do not rule it out
    rows = _rows(_molora(router_c=(0.005, -0.001, 0.012), gap=(0.001, -0.002, 0.004)))
    assert rows["P4"]["verdict"] == rows["P5"]["verdict"] == rows["P6"]["verdict"] == claims.INCONCLUSIVE
    assert "straddles 0" in rows["P4"]["reason"] and "straddles 0.01" in rows["P6"]["reason"]
    # P3 fails: P4-P6 are not in regime (the data alone are kept in the reason), P3 itself does not
    rows = _rows(_molora(collapsed=2))
    assert rows["P3"]["verdict"] == claims.DISAGREES
    for p in ("P4", "P5", "P6"):
        assert rows[p]["verdict"] == claims.NOT_IN_REGIME and "would read agrees" in rows[p]["reason"]
    assert _rows({"12_molora_factorial": {"n_seeds": 5}})["P4"]["verdict"] == claims.MISSING


def test_the_collapsing_contrast_does_not_enlarge_the_factorials_holm_family():
    rng = np.random.default_rng(30)
    summaries = _factorial(rng)
    before = claims.Families(summaries).family("12_molora_factorial")["router"].family_size
    ss = summaries["12_molora_factorial"][claims.SCORES]["log_ppl"]
    ss.arms["b3_collapsing"], ss.arms["r_collapsing"] = ss.arms["b3"] + 0.01, ss.arms["r"]
    after = claims.Families(summaries).family("12_molora_factorial")
    assert "router_collapsing" not in after and after["router"].family_size == before


def _mech(sizes=("a", "b"), **per):
    """09's mechanism verdicts per size: per = {key: (verdict at a, verdict at b)}."""
    s = {"sizes": list(sizes), "n_sizes": len(sizes)}
    for key, verdicts in per.items():
        for tag, v in zip(sizes, verdicts):
            s[f"{key}_{tag}"] = v
    return {"09_scale_study": s}


def test_mechanism_rule_1_power():
    v = lambda *x: _rows(_mech(mech_power_verdict=x))["MECH1"]  # noqa: E731
    assert v("powered", "powered")["verdict"] == claims.AGREES
    assert v("powered", "no reference")["verdict"] == claims.AGREES  # only where GRPO gains
    row = v("powered", "unpowered")
    assert row["verdict"] == claims.DISAGREES and "b: unpowered" in row["reason"]
    assert v("no reference", "no reference")["verdict"] == claims.INCONCLUSIVE
    missing = _rows(_mech())["MECH1"]
    assert missing["verdict"] == claims.MISSING and "mech_power_verdict" in missing["reason"]
    assert "09_scale_study" in missing["reason"]
    # not gated by 01's regime (09 keeps the paper protocol)
    gated = _mech(mech_power_verdict=("powered", "powered"))
    gated["01_substrate_and_agent"] = {"regime_criterion_met": False}
    assert _rows(gated)["MECH1"]["verdict"] == claims.AGREES


def test_mechanism_rule_2_at_chance_needs_power():
    def v(es, copes, power=("powered", "powered")):
        return _rows(_mech(mech_es_chance_verdict=es, mech_copes_paper_chance_verdict=copes,
                           mech_power_verdict=power))["MECH2"]
    both = ("at chance", "at chance")
    assert v(both, both)["verdict"] == claims.AGREES
    unpowered = v(both, both, power=("powered", "unpowered"))
    assert unpowered["verdict"] == claims.INCONCLUSIVE and "unpowered" in unpowered["reason"]
    assert v(both, ("at chance", "beats chance"), power=("unpowered", "unpowered"))["verdict"] == claims.DISAGREES
    assert v(both, ("at chance", "undefined"))["verdict"] == claims.INCONCLUSIVE
    assert _rows(_mech())["MECH2"]["verdict"] == claims.MISSING


def test_mechanism_rules_3_to_5():
    def v(claim, **per):
        return _rows(_mech(**per))[claim]["verdict"]
    within = ("within bound", "within bound")
    assert v("MECH3", mech_es_bound_verdict=within, mech_copes_paper_bound_verdict=within) == claims.AGREES
    assert v("MECH3", mech_es_bound_verdict=within,
             mech_copes_paper_bound_verdict=("within bound", "above bound")) == claims.DISAGREES
    assert v("MECH3", mech_es_bound_verdict=within,
             mech_copes_paper_bound_verdict=("within bound", "undefined")) == claims.INCONCLUSIVE
    assert v("MECH4", mech_copes_vs_es_verdict=("tie", "tie")) == claims.AGREES
    assert v("MECH4", mech_copes_vs_es_verdict=("tie", "CoPES higher")) == claims.DISAGREES
    assert v("MECH4", mech_copes_vs_es_verdict=("tie", "undefined")) == claims.INCONCLUSIVE
    assert v("MECH5", mech_efficiency_verdict=("consistent", "ES below prediction")) == claims.AGREES
    assert v("MECH5", mech_efficiency_verdict=("consistent", "ES above prediction")) == claims.DISAGREES
    assert v("MECH5", mech_efficiency_verdict=("undefined", "undefined")) == claims.INCONCLUSIVE
    for claim in ("MECH3", "MECH4", "MECH5"):
        assert v(claim) == claims.MISSING


def _fit(points, low, high, shown, allowed=None):
    ok = points >= 4 and (low > 0 or high < 0)
    return {"sizes": ["a"], "gain_recovery_es_fit_points": points, "gain_recovery_es_slope_low": low,
            "gain_recovery_es_slope_high": high, "gain_recovery_es_extrapolated_4b": 0.7 if shown else None,
            "gain_recovery_es_extrapolation_allowed": ok if allowed is None else allowed}


def test_the_4b_extrapolation_rule():
    v = lambda **kw: _rows({"09_scale_study": _fit(**kw)})["MECH-4B"]  # noqa: E731
    assert v(points=3, low=0.1, high=0.2, shown=False)["verdict"] == claims.AGREES  # 3 sizes: no 4B value
    assert v(points=4, low=0.1, high=0.2, shown=True)["verdict"] == claims.AGREES
    row = v(points=3, low=0.1, high=0.2, shown=True)
    assert row["verdict"] == claims.DISAGREES and "gain_recovery_es (3 points" in row["reason"]
    assert v(points=5, low=-0.1, high=0.2, shown=True)["verdict"] == claims.DISAGREES  # slope spans 0
    assert v(points=4, low=0.1, high=0.2, shown=False, allowed=False)["verdict"] == claims.DISAGREES
    assert _rows({"09_scale_study": {"sizes": ["a"]}})["MECH-4B"]["verdict"] == claims.MISSING


def test_our_rows_render_in_the_markdown_table():
    summaries = {**_molora(), **_r1(0.02), **_mech(mech_power_verdict=("powered", "unpowered"))}
    md = claims.to_markdown(claims.judge_claims(summaries), "cpu", significant=[])
    for claim in ("R1", "P4", "MECH1", "MECH-4B"):
        assert f"| {claim} | (ours)" in md


def test_a_notebook_older_than_its_upstream_reads_stale(tmp_path):
    root = tmp_path / "results"
    for notebook, ended in (("01_substrate_and_agent", "2026-12-01T12:00:00+00:00"),
                            ("09_scale_study", "2026-11-30T20:00:00+00:00"),
                            ("10_molora_substrate", "2026-11-30T19:00:00+00:00")):
        folder = root / "cpu" / notebook
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"profile": "cpu", "notebook": notebook}))
        (folder / "manifest.json").write_text(json.dumps({"ended": ended}))
    summaries = claims.load_summaries("cpu", root)
    needs = {"09_scale_study": ("01_substrate_and_agent",), "01_substrate_and_agent": (), "10_molora_substrate": ()}
    stale = claims.stale_notebooks(summaries, needs)
    assert list(stale) == ["09_scale_study"] and "ONLY=09" in stale["09_scale_study"]
    assert "01_substrate_and_agent's (2026-12-01T12:00)" in stale["09_scale_study"]
    # transitively: 03 reads 02, 02 reads 01; 01 rewritten after 03 makes 03 stale too
    chain = {"03": {claims.WRITTEN: "2026-11-30T10:00"}, "02": {claims.WRITTEN: "2026-12-01T10:00"},
             "01": {claims.WRITTEN: "2026-12-01T11:00"}}
    assert set(claims.stale_notebooks(chain, {"03": ("02",), "02": ("01",)})) == {"03", "02"}
    # a claim of a stale notebook keeps what its data would read; missing stays missing; no needs: as before
    s1 = {**claims.load_summaries("cpu", REPO_ROOT / "results")["09_scale_study"],  # committed
          claims.WRITTEN: "2026-11-30T20:00"}
    rows = claims.judge_claims({"09_scale_study": s1, "01_substrate_and_agent": {claims.WRITTEN: "2026-12-01T12:00"}},
                               needs=needs)
    by_id = {r["claim"]: r for r in rows}
    assert all(r["verdict"] in (claims.STALE, claims.MISSING) for r in rows if r["notebook"] == "09_scale_study")
    assert by_id["S1"]["verdict"] == claims.STALE and "its data would read" in by_id["S1"]["reason"]
    assert all("predate" in r["reason"] for r in rows if r["verdict"] == claims.STALE)
    assert by_id["A1"]["verdict"] == claims.MISSING
    assert claims.STALE not in {r["verdict"] for r in claims.judge_claims({"09_scale_study": s1})}


# --------------------------------------------------------------------------- L4: low rank on 09's map
L4_CELLS = ("latent_p0_1_n40", "skill_gap_n40")


def _l4(intervals=None, moved=True, recorded=None, cells=L4_CELLS, drop=()):
    """09's low-rank keys: intervals = {(cell, arm): (value, low, high)} (default +1 [-2, +3] pts everywhere);
    moved = False: no arm moved anywhere; recorded = 09's own per-cell reading; drop = keys to leave out."""
    s = {"map_lowrank_cells": list(cells), "map_lowrank_rank": 4, "map_lowrank_margin": 0.05}
    for c in cells:
        for low_arm, full, _ in claims.LOWRANK_PAIRS:
            value, low, high = (intervals or {}).get((c, low_arm), (0.01, -0.02, 0.03))
            d = f"map_{low_arm}_minus_{full}"
            s.update({f"{d}_{c}": value, f"{d}_low_{c}": low, f"{d}_high_{c}": high,
                      f"map_{low_arm}_update_norm_{c}": 1.0 if moved else 0.0,
                      f"map_{full}_update_norm_{c}": 1.0 if moved else 0.0})
            if recorded is not None:
                s[f"{d}_prediction_{c}"] = recorded
    return {"09_scale_study": {k: v for k, v in s.items() if k not in drop}}


def test_l4_reads_the_registered_margin_rule_per_cell_and_arm():
    agrees = _rows(_l4())["L4"]
    assert agrees["verdict"] == claims.AGREES and agrees["paper"] == claims.OURS
    assert agrees["ours"].count("-> agrees") == 4 and "skill_gap_n40 CoPES: +1.0 pts [-2.0, +3.0]" in agrees["ours"]
    assert "inside +-5 pts" in agrees["reason"] and agrees["notebook"] == "09_scale_study"
    # inside the margin even though it excludes 0: agrees (the rule asks "no practical change")
    assert _rows(_l4({("skill_gap_n40", "es_lowrank"): (0.02, 0.01, 0.04)}))["L4"]["verdict"] == claims.AGREES
    # one cell and arm excludes 0 outside the margin: does not, whatever the others read
    for bad in ((0.05, 0.02, 0.08), (-0.10, -0.20, -0.06), (-0.04, -0.07, -0.01)):
        row = _rows(_l4({("skill_gap_n40", "copes_lowrank"): bad}))["L4"]
        assert row["verdict"] == claims.DISAGREES, bad
        assert "skill_gap_n40 CoPES: excludes 0, not inside +-5 pts" in row["reason"]
    # holds 0 but wider than the margin: inconclusive; so is a cell without an interval
    wide = _rows(_l4({("latent_p0_1_n40", "es_lowrank"): (0.0, -0.08, 0.08)}))["L4"]
    assert wide["verdict"] == claims.INCONCLUSIVE and "holds 0 but is wider than +-5 pts" in wide["reason"]
    none = _rows(_l4({("latent_p0_1_n40", "es_lowrank"): (0.0, None, None)}))["L4"]
    assert none["verdict"] == claims.INCONCLUSIVE and "no interval" in none["reason"]
    # a "does not" outranks an inconclusive elsewhere (the registered overall row)
    mixed = _l4({("latent_p0_1_n40", "es_lowrank"): (0.0, -0.08, 0.08), ("skill_gap_n40", "es_lowrank"): (0.1, 0.06, 0.14)})
    assert _rows(mixed)["L4"]["verdict"] == claims.DISAGREES


def test_l4_not_judged_never_agrees():
    # neither arm moved: the difference is 0 by construction, an interval inside the margin is no evidence
    row = _rows(_l4({c: (0.0, 0.0, 0.0) for c in [(cell, a) for cell in L4_CELLS for a, _, _ in claims.LOWRANK_PAIRS]},
                    moved=False, recorded="not judged"))["L4"]
    assert row["verdict"] == claims.INCONCLUSIVE and "not judged" in row["reason"] and "NOTE" not in row["reason"]
    # one not-judged cell among agreeing ones keeps the overall row from agreeing
    one = _l4()
    one["09_scale_study"].update({"map_es_lowrank_update_norm_skill_gap_n40": 0.0, "map_es_update_norm_skill_gap_n40": 0.0})
    row = _rows(one)["L4"]
    assert row["verdict"] == claims.INCONCLUSIVE and "skill_gap_n40 ES: not judged" in row["reason"]
    # one arm moved: judged as usual
    one["09_scale_study"]["map_es_update_norm_skill_gap_n40"] = 0.3
    assert _rows(one)["L4"]["verdict"] == claims.AGREES


def test_l4_missing_and_09s_own_reading():
    assert _rows({})["L4"]["verdict"] == claims.MISSING
    partial = _rows(_l4(drop=("map_copes_lowrank_minus_copes_high_skill_gap_n40",)))["L4"]
    assert partial["verdict"] == claims.MISSING and "map_copes_lowrank_minus_copes_high_skill_gap_n40" in partial["reason"]
    assert _rows(_l4(drop=("map_es_update_norm_latent_p0_1_n40",)))["L4"]["verdict"] == claims.MISSING
    no_arms = _rows(_l4(cells=()))["L4"]
    assert no_arms["verdict"] == claims.MISSING and "ran no low-rank arms" in no_arms["reason"]
    # 09's own reading is shown where it differs from the rule's (it should not)
    assert "NOTE" not in _rows(_l4(recorded="agrees"))["L4"]["reason"]
    assert "NOTE: 09 read 'does not agree'" in _rows(_l4(recorded="does not agree"))["L4"]["reason"]
    # judged by the registered margin, not by a changed one 09 recorded
    changed = _l4({("skill_gap_n40", "es_lowrank"): (0.05, 0.02, 0.08)})
    changed["09_scale_study"]["map_lowrank_margin"] = 0.1
    row = _rows(changed)["L4"]
    assert row["verdict"] == claims.DISAGREES and "map_lowrank_margin 0.1" in row["power"]


def test_l4_is_not_gated_by_01s_regime_and_the_committed_cpu_summary_reads_missing():
    gated = _l4()
    gated["01_substrate_and_agent"] = {"regime_criterion_met": False}
    assert _rows(gated)["L4"]["verdict"] == claims.AGREES
    assert "L4 is not gated" in claims.rules_markdown() and "L4" not in claims.REGIME_CLAIMS
    committed = claims.load_summaries("cpu", REPO_ROOT / "results")["09_scale_study"]
    row = _rows({"09_scale_study": committed})["L4"]
    if "map_lowrank_cells" not in committed:  # the cpu run committed before the low-rank arms existed
        assert row["verdict"] == claims.MISSING and "map_lowrank_cells" in row["reason"]
    else:  # a cpu run with them is judged, never read as agreement without its keys
        assert row["verdict"] in (claims.AGREES, claims.DISAGREES, claims.INCONCLUSIVE, claims.MISSING)


def test_l4_rule_and_margin_are_09s():
    from copes_lib.protocols import study as scale_study

    assert claims.LOWRANK_MARGIN == scale_study.LOWRANK_MARGIN
    assert {a: b for a, b, _ in claims.LOWRANK_PAIRS} == scale_study.MAP_LOWRANK_ARMS
    words = {claims.AGREES: "agrees", claims.DISAGREES: "does not agree", claims.INCONCLUSIVE: "inconclusive"}
    grid = [-0.2, -0.06, -0.05, -0.049, -0.01, 0.0, 0.01, 0.049, 0.05, 0.06, 0.2]
    for low in grid:
        for high in [h for h in grid if h >= low]:
            assert words[claims.lowrank_reading(low, high, moved=True)[0]] == scale_study.lowrank_prediction(low, high)


def test_a_readme_with_a_terms_block_holds_the_glossary_once_there(tmp_path):
    rows = [{"claim": "A1", "paper": "A", "statement": "s", "paper_figure": "1", "ours": "o",
             "verdict": claims.AGREES, "reason": "r", "power": "", "notebook": "05_fixed_budget_math"}]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("<!-- results:start -->\n<!-- results:end -->\n")
    (tmp_path / "README.md").write_text("# x\n<!-- terms:start -->\nold\n<!-- terms:end -->\n\nstory\n\n"
                                        "<!-- results:start -->\n<!-- results:end -->\n")
    assert claims.write_results_pages(tmp_path, rows, "cpu", significant=[]) == {"README.md": True,
                                                                                 "docs/results.md": True}
    readme = (tmp_path / "README.md").read_text()
    assert readme.count("**strict accuracy**") == 1 and "old" not in readme
    assert readme.index("**strict accuracy**") < readme.index("story") < readme.index("| claim | paper |")
    for term in ("precondition", "regime criterion", "gate", "units"):
        assert f"**{term}**" in readme
    assert (tmp_path / "docs" / "results.md").read_text().count("**strict accuracy**") == 1
