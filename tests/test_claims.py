"""The claims table: missing results never count as agreement; every rule can agree, disagree, or say
inconclusive; README regeneration."""

import json

import numpy as np
import pytest

from copes_lib import claims, stats


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
    assert a1(weak, strong) == claims.DISAGREES  # the opposite, significant
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


def test_es_steps_rule_accounts_for_horizon_and_validation_grid():
    def a2(**s):
        return _verdict({"05_fixed_budget_math": {**MATH_05, **s}}, "A2")

    assert a2(es_steps_to_match_copes=None) == claims.INCONCLUSIVE  # never reached, horizon unknown
    assert a2(es_steps_to_match_copes=None, es_long_steps=16) == claims.INCONCLUSIVE  # 2x < 3x
    assert a2(es_steps_to_match_copes=None, es_long_steps=24) == claims.AGREES
    assert a2(es_steps_to_match_copes=24, val_every=4) == claims.AGREES  # crossing in (20, 24]: >= 2.5x
    assert a2(es_steps_to_match_copes=12, val_every=4) == claims.PARTLY  # (8, 12]: more, but < 2x
    assert a2(es_steps_to_match_copes=20, val_every=8) == claims.INCONCLUSIVE  # (12, 20] straddles 2x
    assert a2(es_steps_to_match_copes=12) == claims.INCONCLUSIVE  # grid unknown
    assert a2(es_steps_to_match_copes=8, val_every=4) == claims.DISAGREES


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
    assert _verdict(_ablations(rng, 0.4, 0.6, 0.6), "A4") == claims.DISAGREES
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
    assert _verdict(_factorial(rng, router=-0.01), "B2") == claims.DISAGREES
    assert _verdict(_factorial(rng), "B3") == claims.AGREES
    assert _verdict(_factorial(rng, lifecycle=0.01), "B3") == claims.DISAGREES
    # B4 / B5: "no effect" agrees only inside +-0.5 x the router effect
    assert _verdict(_factorial(rng, full_vs_b3=0.0), "B4") == claims.AGREES
    assert _verdict(_factorial(rng, full_vs_b3=0.02), "B4") == claims.DISAGREES
    assert _verdict(_factorial(rng, scope=0.0), "B5") == claims.AGREES
    assert _verdict(_factorial(rng, scope=0.02), "B5") == claims.DISAGREES
    # an effect smaller than the old fixed 0.005 nats but as large as the router's: no longer "no effect"
    assert _verdict(_factorial(rng, router=0.002, scope=0.002, seed_sd=0.0002), "B5") == claims.DISAGREES
    noisy = _factorial(rng, router=0.01, scope=0.0, seed_sd=0.05, seeds=3, windows=20)
    assert _verdict(noisy, "B5") == claims.INCONCLUSIVE and _verdict(noisy, "B4") == claims.INCONCLUSIVE


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


def test_markdown_lists_every_claim_with_a_link_and_power():
    md = claims.to_markdown(claims.judge_claims({}), "cpu")
    assert "| verdict | power |" in md
    for claim in claims.CLAIMS:
        assert f"| {claim.claim_id} |" in md
        assert f"notebooks/{claim.notebook}.ipynb" in md


def test_markdown_rows_never_break_the_table():
    rows = [{"claim": "X", "paper": "A", "statement": "a | b", "paper_figure": "1", "ours": "|x|",
             "verdict": claims.AGREES, "power": "p|q", "notebook": "05_fixed_budget_math"}]
    line = claims.to_markdown(rows, "cpu").splitlines()[-1]
    assert line.count("|") == 8


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


@pytest.mark.parametrize(("verdict", "expected"), [(stats.EFFECT, claims.AGREES), (stats.OPPOSITE, claims.DISAGREES),
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
    assert rows["S2"]["verdict"] == claims.AGREES and rows["S3"]["verdict"] == claims.DISAGREES
    assert "slope 0.1 per decade" in rows["S2"]["ours"]
    # the same means inside wide per-size intervals: a line through noise decides nothing
    rows = {r["claim"]: r for r in claims.judge_claims(_trend_summary((-0.1, 0.0, 0.1), (0.5, 0.3, 0.1), 0.5))}
    assert rows["S2"]["verdict"] == rows["S3"]["verdict"] == claims.INCONCLUSIVE
    # recovery undefined at two sizes (GRPO gained nothing there): no trend from one point
    rows = {r["claim"]: r for r in claims.judge_claims(_trend_summary((-0.1, 0.0, 0.1), (None, None, 0.1), 0.02))}
    assert rows["S3"]["verdict"] == claims.INCONCLUSIVE and "defined at 1 of 3 sizes" in rows["S3"]["ours"]
