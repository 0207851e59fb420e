"""Notebook 01's reading of the warm-start seeds checked before the run (copes_lib.protocols.testbed.prerun_seed_check):
a synthetic results/preflight/<profile>.json in a temporary folder, in the format `make preflight SEEDS=...`
writes."""

import json

import pytest

from copes_lib import runs
from copes_lib.protocols.testbed import prerun_seed_check as psc
from copes_lib.substrate import WarmStartConfig

GOOD = {"G1": 0.9, "G2": 0.8, "E1": 0.6, "E2": 0.0, "R": 0.4, "R_low": 0.2, "R_high": 0.6, "U": 0.3}
RECIPE = WarmStartConfig()


def _entry(seed, *, met=True, failed=(), strict=0.25, lenient=0.95, rho=0.9, digest=None):
    entry = {"values": GOOD, "verdicts": {p: "holds" for p in psc.PRECONDITIONS}, "met": met, "failed": list(failed),
             "sigma": 0.01, "warm_seed": seed,
             "shape": {"strict_tail": strict, "lenient_tail": lenient, "margin_g_spearman": rho,
                       "failed_targets": [t.split()[-1] for t in failed if t.startswith("shape")]}}
    return {**entry, "base_digest": digest} if digest else entry


def _write(root, kinds, seeds, recipe=RECIPE):
    import dataclasses

    record = {"profile": "cpu", "recipe": json.loads(json.dumps(dataclasses.asdict(recipe), default=str)),
              "git": {"git_sha": "a" * 40, "git_dirty": False}, "seeds": seeds, "written_utc": "2026-12-03T08:00:00+00:00",
              "kinds": kinds}
    (root / "preflight").mkdir(parents=True, exist_ok=True)
    (root / "preflight" / "cpu.json").write_text(json.dumps(record))


def _bases(strict=0.25, digest="d0"):
    return {"math": {"digest": digest, "strict_tail": strict, "lenient_tail": 0.95},
            "qa": {"digest": None, "strict_tail": 0.2, "lenient_tail": 0.95}}


def test_every_seed_met_and_the_runs_base_agrees(tmp_path):
    kinds = {f"{k} seed {s}": _entry(s, strict=0.25 if k == "math" else 0.2, digest="d0" if (k, s) == ("math", 0) else None)
             for k in ("math", "qa") for s in range(5)}
    kinds["qa seed 4"]["shape"]["margin_g_spearman"] = None  # not measured: stays None, the summary stays flat
    _write(tmp_path, kinds, [0, 1, 2, 3, 4])
    result = psc.check("cpu", 0, _bases(), recipe=RECIPE, root=tmp_path)
    assert result["met"] is True and result["failed"] == [] and result["run_seed_checked"]
    assert result["seeds"] == {"math": [0, 1, 2, 3, 4], "qa": [0, 1, 2, 3, 4]}
    assert result["comparisons"]["math"]["compared"] == ["digest", "strict_tail", "lenient_tail"]
    assert result["comparisons"]["qa"]["compared"] == ["strict_tail", "lenient_tail"]  # no digest on either side
    keys = psc.summary_keys(result)
    assert keys["prerun_seed_check_met"] is True and keys["prerun_seed_check_seeds"] == [0, 1, 2, 3, 4]
    assert keys["prerun_seed_check_math_run_base"] == keys["prerun_seed_check_qa_run_base"] == "agrees"
    assert keys["prerun_seed_check_recipe_matches"] is True and keys["prerun_seed_check_math_seed4_strict_tail"] == 0.25
    assert keys["prerun_seed_check_file"].endswith("cpu.json") and keys["prerun_seed_check_commit"] is None  # untracked
    text = "\n".join(result["lines"])
    assert "math: seeds 0, 1, 2, 3, 4" in text and "every checked seed met" in text and "agrees" in text
    assert len(psc.table(result)) == 10 and keys["prerun_seed_check_qa_seed4_margin_g_spearman"] is None
    runs.check_summary(keys)


def test_one_failed_seed_fails_the_check_and_a_different_base_is_reported_not_failed(tmp_path):
    kinds = {f"math seed {s}": _entry(s, digest=f"d{s}") for s in range(5)}
    kinds["math seed 2"] = _entry(2, met=False, failed=["shape seed 2: targets 1,4"], strict=0.004, rho=0.28)
    _write(tmp_path, kinds, [0, 1, 2, 3, 4])
    result = psc.check("cpu", 0, {"math": _bases(strict=0.2, digest="other")["math"]}, recipe=RECIPE, root=tmp_path)
    assert result["met"] is False and result["failed"] == ["math seed 2: shape seed 2: targets 1,4"]
    comparison = result["comparisons"]["math"]
    assert comparison["agreement"] == "differs" and comparison["differing"] == ["digest", "strict_tail"]
    assert "0.2000" in comparison["text"] and "0.2500" in comparison["text"]
    text = "\n".join(result["lines"])
    assert "NOT every checked seed met" in text and "DIFFERS" in text and "CPU vendor" in text
    keys = psc.summary_keys(result)
    assert [keys[f"prerun_seed_check_math_seed{s}_met"] for s in range(5)] == [True, True, False, True, True]
    assert keys["prerun_seed_check_math_seed2_margin_g_spearman"] == 0.28
    runs.check_summary(keys)  # flat, as run.finish needs it


def test_a_missing_file_is_said_plainly_with_the_command(tmp_path, monkeypatch):
    monkeypatch.delenv("COPES_RECIPE", raising=False)
    result = psc.check("cpu", 0, _bases(), recipe=RECIPE, root=tmp_path)
    assert result["met"] is None and not result["exists"] and not result["run_seed_checked"]
    assert result["lines"] == [f"no pre-run seed check committed for this profile ({tmp_path}/preflight/cpu.json does "
                               "not exist): run make preflight PROFILE=cpu SEEDS=0,1,2,3,4 JOBS=2 RECORD=1"]
    keys = psc.summary_keys(result)
    assert keys["prerun_seed_check_file"] is None and keys["prerun_seed_check_seeds"] == []
    assert keys["prerun_seed_check_math_run_base"] == "not checked" and keys["prerun_seed_check_met"] is None
    loaded = psc.check("cpu", 0, _bases(), trained=False, root=tmp_path)  # gpu: a checkpoint has no warm-start seed
    assert loaded["met"] is None and "not trained" in loaded["lines"][0]


def test_the_runs_seed_absent_or_another_recipe_is_not_checked(tmp_path):
    _write(tmp_path, {f"math seed {s}": _entry(s) for s in (1, 2)}, [1, 2])
    result = psc.check("cpu", 0, {"math": _bases()["math"]}, recipe=RECIPE, root=tmp_path)
    assert result["met"] is True and not result["run_seed_checked"]
    assert result["comparisons"]["math"]["agreement"] == "not checked"
    assert any("seed 0 is not among the checked seeds of math: run make preflight" in line for line in result["lines"])
    # the same seeds measured on another recipe cover nothing of this run's base
    _write(tmp_path, {"math seed 0": _entry(0)}, [0], recipe=WarmStartConfig(latent_math_steps=3000))
    result = psc.check("cpu", 0, {"math": _bases()["math"]}, recipe=RECIPE, root=tmp_path)
    assert result["recipe_differences"] == ["latent_math_steps"] and not result["run_seed_checked"]
    assert psc.summary_keys(result)["prerun_seed_check_recipe_matches"] is False and result["met"] is None
    assert any("ANOTHER warm-start recipe" in line for line in result["lines"])


def test_a_single_seed_record_and_a_damaged_file(tmp_path):
    """`make preflight` without SEEDS labels its entries by kind alone; the seed is the entry's warm_seed."""
    _write(tmp_path, {"math": _entry(0)}, [0])
    rows = psc.check("cpu", 0, {"math": _bases()["math"]}, root=tmp_path)["rows"]
    assert [(r["kind"], r["seed"]) for r in rows] == [("math", 0)]
    _write(tmp_path, {"math": {k: v for k, v in _entry(0).items() if k != "warm_seed"}}, [])  # an older record
    assert "math: seed not recorded" in psc.check("cpu", 0, {"math": _bases()["math"]}, root=tmp_path)["lines"][0]
    (tmp_path / "preflight" / "cpu.json").write_text("{not json")
    result = psc.check("cpu", 0, {"math": _bases()["math"]}, root=tmp_path)
    assert result["met"] is None and "unreadable" in result["lines"][0]


@pytest.mark.parametrize("ours,theirs,expected", [
    ({"digest": "x", "strict_tail": 0.1, "lenient_tail": None}, {"base_digest": "x", "strict_tail": 0.1}, "agrees"),
    ({"digest": None, "strict_tail": None, "lenient_tail": None}, {"base_digest": "x", "strict_tail": 0.1},
     "not compared"),
    ({"digest": "x", "strict_tail": float("nan"), "lenient_tail": None}, {"base_digest": "y", "strict_tail": 0.1},
     "differs"),
])
def test_compare(ours, theirs, expected):
    assert psc.compare({"lenient_tail": None, **theirs}, **ours)["agreement"] == expected


def test_make_preflight_records_each_bases_digest_and_when_it_wrote(tmp_path, monkeypatch):
    """What the reader compares with: `make preflight SEEDS=... RECORD=1` keeps each seed's base digest (the report
    of run_preflight carries it) and the time it wrote the file."""
    from copes_lib.protocols.testbed import preflight as pf

    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path / "figures")

    def fake(profile, kind, *a, **kw):
        verdict = pf.judge(GOOD, pf.PreflightCriterion())
        return {"values": GOOD, **verdict, "sigma": 0.01, "alpha": 0.005, "warm_seed": kw["warm_seed"],
                "shape": {"strict_tail": 0.25, "lenient_tail": 0.95, "margin_g_spearman": 0.9, "failed_targets": []},
                "calibration": [{"sigma": 0.005, "share": 0.3}, {"sigma": 0.01, "share": 0.6}], "notes": [], "groups": {"protocol_rate": [0.5]},
                "settings": {"group_size": 8, "temperature": 1.0}, "criterion": pf.PreflightCriterion().to_dict(),
                "seconds": 1.0, "cached": True, "base_digest": f"digest-{kind}-{kw['warm_seed']}"}

    monkeypatch.setattr(pf, "run_preflight", fake)
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "0,1", "--record"]) == 0
    written = runs.read_json(tmp_path / "results" / "preflight" / "cpu.json")
    assert written["kinds"]["math seed 1"]["base_digest"] == "digest-math-1" and written["written_utc"].startswith("20")
    result = psc.check("cpu", 0, {"math": {"digest": "digest-math-0", "strict_tail": 0.25, "lenient_tail": 0.95}},
                       root=tmp_path / "results")
    assert result["comparisons"]["math"]["agreement"] == "agrees" and result["seeds"] == {"math": [0, 1]}


def test_under_a_recipe_overlay_the_check_reads_and_names_the_overlays_record(tmp_path, monkeypatch):
    monkeypatch.setenv("COPES_RECIPE", "p8.10")
    result = psc.check("cpu", 0, _bases(), recipe=RECIPE, root=tmp_path)
    assert result["lines"] == [f"no pre-run seed check committed for this profile ({tmp_path}/preflight/cpu-p8.10.json "
                               "does not exist): run make preflight PROFILE=cpu RECIPE=p8.10 SEEDS=0,1,2,3,4 JOBS=2 RECORD=1"]
