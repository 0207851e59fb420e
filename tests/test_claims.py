"""The claims table: missing results never count as agreement; verdict rules; README regeneration."""

from copes_lib import claims


def _summaries(**by_notebook):
    return {nb: dict(values) for nb, values in by_notebook.items()}


def test_every_claim_is_missing_without_results():
    rows = claims.judge_claims({})
    assert rows and all(r["verdict"] == claims.MISSING for r in rows)


def test_partial_keys_are_missing_not_agreement():
    rows = claims.judge_claims(_summaries(**{"05_fixed_budget_math": {"gain_recovery_copes": 0.9}}))
    row = next(r for r in rows if r["claim"] == "A1")
    assert row["verdict"] == claims.MISSING
    assert "gain_recovery_es" in row["ours"]


def test_direction_and_significance_rules():
    base = {"gain_recovery_copes": 0.8, "gain_recovery_es": 0.6}
    row = lambda s: next(r for r in claims.judge_claims({"05_fixed_budget_math": s}) if r["claim"] == "A1")  # noqa: E731
    assert row(base)["verdict"] == claims.PARTLY  # a direction without a significance test
    assert row({**base, "copes_minus_es_significant": True})["verdict"] == claims.AGREES
    assert row({**base, "copes_minus_es_significant": False})["verdict"] == claims.PARTLY
    assert row({"gain_recovery_copes": 0.5, "gain_recovery_es": 0.6})["verdict"] == claims.DISAGREES


def test_router_claim_needs_sign_and_significance():
    def verdict(delta, p):
        rows = claims.judge_claims({"12_molora_factorial": {"delta_router": delta, "p_router": p}})
        return next(r for r in rows if r["claim"] == "B2")["verdict"]

    assert verdict(0.01, 0.01) == claims.AGREES
    assert verdict(0.01, 0.3) == claims.PARTLY
    assert verdict(-0.01, 0.01) == claims.DISAGREES


def test_memory_claim_within_one_percent():
    s = {"qwen35_4b_es_gib_at_128k": 12.78, "qwen35_4b_full_grpo_gib_at_128k": 453.44,
         "qwen35_4b_lora_grpo_gib_at_128k": 402.55}
    rows = claims.judge_claims({"08_memory_and_gpu_hours": s})
    assert next(r for r in rows if r["claim"] == "A9")["verdict"] == claims.AGREES
    s["qwen35_4b_es_gib_at_128k"] = 20.0
    rows = claims.judge_claims({"08_memory_and_gpu_hours": s})
    assert next(r for r in rows if r["claim"] == "A9")["verdict"] == claims.PARTLY


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


def test_markdown_lists_every_claim_with_a_link():
    md = claims.to_markdown(claims.judge_claims({}), "cpu")
    for claim in claims.CLAIMS:
        assert f"| {claim.claim_id} |" in md
        assert f"notebooks/{claim.notebook}.ipynb" in md


def test_none_is_missing_except_where_it_is_a_result():
    rows = claims.judge_claims({"05_fixed_budget_math": {"gain_recovery_copes": None, "gain_recovery_es": 0.5,
                                                         "es_steps_to_match_copes": None, "budget_steps": 8}})
    by_id = {r["claim"]: r for r in rows}
    assert by_id["A1"]["verdict"] == claims.MISSING
    assert by_id["A2"]["verdict"] == claims.AGREES and "never reached" in by_id["A2"]["ours"]


def test_markdown_rows_never_break_the_table():
    rows = [{"claim": "X", "paper": "A", "statement": "a | b", "paper_figure": "1", "ours": "|x|",
             "verdict": claims.AGREES, "notebook": "05_fixed_budget_math"}]
    line = claims.to_markdown(rows, "cpu").splitlines()[-1]
    assert line.count("|") == 7


def test_k_sweep_agrees_only_with_both_wins_significant():
    s = {"val_accuracy_k1": 0.40, "val_accuracy_k4": 0.43, "val_accuracy_k8": 0.41}
    verdict = lambda extra: next(r for r in claims.judge_claims({"06_copes_ablations": {**s, **extra}})  # noqa: E731
                                 if r["claim"] == "A4")["verdict"]
    assert verdict({}) == claims.PARTLY  # no test: direction only
    assert verdict({"k4_minus_k1_significant": True, "k4_minus_k8_significant": False}) == claims.PARTLY
    assert verdict({"k4_minus_k1_significant": True, "k4_minus_k8_significant": True}) == claims.AGREES
    assert verdict({"val_accuracy_k4": 0.39, "k4_minus_k1_significant": True,
                    "k4_minus_k8_significant": True}) == claims.DISAGREES


def test_sandbox_claim_uses_the_interval_not_the_sign():
    def verdict(pre_high, **others):
        s = {"evo_minus_grad_excess_loss_prealigned": -0.01, "evo_minus_grad_excess_loss_prealigned_high": pre_high}
        for regime in ("random", "misaligned", "cotrained"):
            s[f"evo_minus_grad_excess_loss_{regime}"] = others.get(regime, 0.2)
            s[f"evo_minus_grad_excess_loss_{regime}_high"] = others.get(regime, 0.2) + 0.05
        return next(r for r in claims.judge_claims({"13_molora_sandbox": s}) if r["claim"] == "B6")["verdict"]

    assert verdict(-0.001) == claims.AGREES  # interval below 0 with pre-aligned adapters only
    assert verdict(+0.004) == claims.PARTLY  # negative mean, interval includes 0: does not "help"
    assert verdict(+0.004, cotrained=-0.2) == claims.DISAGREES
