"""The preflight of docs/preflight.md: verdicts, bad input, the graded prior, and a base that must fail."""

from __future__ import annotations

import math

import pytest

from copes_lib.config import ConfigError
from copes_lib.protocols.testbed import preflight as pf
from copes_lib.substrate import WarmStartConfig, graded_rates, latent_trace_mix
from copes_lib.tasks.protocol import Task
from copes_lib.tasks.regime import CRITERIA, criterion_for

GOOD = {"G1": 0.8, "G2": 0.5, "E1": 0.7, "E2": 0.0, "R": 0.3, "R_low": 0.2, "R_high": 0.4, "U": 0.3}


def test_judge_holds_and_fails_by_the_registered_floors():
    criterion = pf.PreflightCriterion()
    assert pf.judge(GOOD, criterion)["met"]
    for pid, bad in (("G1", 0.49), ("G2", 0.24), ("E1", 0.49), ("E2", 0.125), ("R", 0.14), ("U", 0.51)):
        verdict = pf.judge({**GOOD, pid: bad}, criterion)
        assert verdict["verdicts"][pid] == "fails" and verdict["failed"] == [pid] and not verdict["met"]


def test_reference_gain_needs_an_interval_above_zero():
    assert pf.judge({**GOOD, "R_low": -0.01}, pf.PreflightCriterion())["verdicts"]["R"] == "fails"


def test_unmeasured_precondition_never_holds():
    verdict = pf.judge({**GOOD, "E1": None, "E2": math.nan}, pf.PreflightCriterion())
    assert verdict["verdicts"]["E1"] == verdict["verdicts"]["E2"] == "not measured"
    assert verdict["failed"] == ["E1", "E2"] and not verdict["met"]


@pytest.mark.parametrize("field", ["min_varied_groups", "min_protocol_groups", "min_members_differ",
                                   "max_tied_steps", "min_reference_gain", "max_top_unit_gain_share",
                                   "top_unit_fraction"])
def test_a_floor_outside_its_range_names_the_field(field):
    with pytest.raises(ConfigError, match=field):
        pf.PreflightCriterion(**{field: 1.5})


def test_bad_settings_name_the_parameter():
    with pytest.raises(ConfigError, match="sigma_ladder"):
        pf.PreflightSettings(sigma_ladder="0.02,0.01")
    with pytest.raises(ConfigError, match="sigma_ladder"):
        pf.PreflightSettings(sigma_ladder="a,b")
    with pytest.raises(ConfigError, match="prompts"):
        pf.PreflightSettings(prompts=10, batch_size=4)


def test_not_actionable_reason_names_the_failed_preconditions():
    assert pf.not_actionable_reason({"preflight_met": False, "preflight_failed": ["math G1", "math R"]}) == \
        "not actionable: math G1, math R"
    assert pf.not_actionable_reason({"preflight_met": True}) is None
    assert pf.not_actionable_reason({}) is None  # an older summary: never measured


def _tasks(names, copies=1):
    return [Task(f"{n}{i}", "math", f"{n} has 3 eggs. How many eggs does {n} have?", ("3",), 1,
                 reference="<python>print(3)</python><output>3</output><answer>\\boxed{3}</answer>", unit_id=n)
            for n in names for i in range(copies)]


def test_unit_spread_counts_the_share_of_the_top_units():
    """U: a gain carried by one unit of ten fails the registered rule; the same gain over every unit holds."""
    units = [f"u{i}" for i in range(10) for _ in range(2)]
    concentrated = [1.0 if u == "u0" else 0.0 for u in units]
    spread = [0.5] * len(units)
    assert pf.unit_spread(concentrated, units)["top_share"] == 1.0
    assert pf.unit_spread(spread, units)["top_share"] == pytest.approx(0.1)
    assert math.isnan(pf.unit_spread([0.0] * 20, units)["top_share"])  # no gain: U not measured
    criterion = pf.PreflightCriterion()
    assert pf.judge({**GOOD, "U": pf.unit_spread(concentrated, units)["top_share"]}, criterion)["failed"] == ["U"]
    with pytest.raises(ValueError, match="unit ids"):
        pf.unit_spread([1.0], ["a", "b"])


def test_base_shape_judges_targets_one_to_four():
    rates, margins, g = [0.5] * 10, [float(i) / 10 for i in range(10)], [i / 10 for i in range(10)]
    ok = pf.base_shape(margins, rates, g, strict_tail=0.2, lenient_tail=0.9, strict_band=(0.05, 0.492), min_lenient=0.55)
    assert ok["targets_met"] and ok["targets_judged"] == ["1", "2", "3", "4"]
    low = pf.base_shape(margins, rates, g, strict_tail=0.004, lenient_tail=0.92, strict_band=(0.05, 0.492),
                        min_lenient=0.55)  # seed 2 of P7: greedy strict collapsed
    assert low["failed_targets"] == ["1"] and not low["targets_met"]
    flat = pf.base_shape(margins, rates, list(reversed(g)))  # margins against g: the key was not learned
    assert flat["failed_targets"] == ["4"] and flat["targets_judged"] == ["3", "4"]


def test_graded_rates_are_evenly_spaced_and_seeded():
    tasks = _tasks(["Ada", "Bo", "Cy", "Di", "Ed"])
    rates = graded_rates(tasks, 0.02, 0.70, seed=0)
    assert sorted(rates.values()) == pytest.approx([0.02, 0.19, 0.36, 0.53, 0.70])
    assert rates == graded_rates(tasks, 0.02, 0.70, seed=0)
    assert any(graded_rates(tasks, 0.02, 0.70, seed=s) != rates for s in range(1, 5))


def test_graded_mix_keeps_each_unit_at_its_rate():
    tasks = _tasks(["Ada", "Bo"], copies=2000)
    rates = graded_rates(tasks, 0.1, 0.6, seed=3)
    mixed, n_paper = latent_trace_mix(tasks, 0.0, seed=3, prior="graded", graded=(0.1, 0.6))
    for unit, rate in rates.items():
        kept = [t for t in mixed if t.unit_id == unit and t.reference.endswith("</answer>")]
        assert abs(len(kept) / 2000 - rate) < 0.04
    assert n_paper == sum(t.reference.endswith("</answer>") for t in mixed)


def test_graded_prior_bad_input():
    with pytest.raises(ConfigError, match="graded_low"):
        WarmStartConfig(graded_low=0.5, graded_high=0.3)
    with pytest.raises(ConfigError, match="graded_high"):
        WarmStartConfig(graded_high=1.0)
    with pytest.raises(ConfigError, match="unit"):
        graded_rates([], 0.1, 0.5, seed=0)
    with pytest.raises(ConfigError, match="graded_high_qa"):
        WarmStartConfig(graded_low=0.6, graded_high=0.7, graded_high_qa=0.55)
    from copes_lib.protocols.params import SubstrateNotebookParams

    with pytest.raises(ConfigError, match="WARM_GRADED_LOW"):
        SubstrateNotebookParams(WARM_GRADED_LOW=0.8, WARM_GRADED_HIGH=0.7)


def test_graded_base_has_its_own_strict_bound_and_others_keep_theirs():
    assert criterion_for("math", "graded").max_strict == 0.492
    assert criterion_for("qa", "graded").max_strict == 0.30
    assert criterion_for("math", "cued") == CRITERIA["math"] and criterion_for("qa", None) == CRITERIA["qa"]


def test_warm_start_key_separates_graded_and_decay():
    from copes_lib.substrate import _warm_config

    latent = WarmStartConfig(protocol="latent", latent_prior="graded")
    assert _warm_config(latent, "math", 0) != _warm_config(WarmStartConfig(protocol="latent", latent_prior="cued"),
                                                           "math", 0)
    assert "lr_decay" not in _warm_config(WarmStartConfig(protocol="latent", latent_prior="cued"), "math", 0)
    assert _warm_config(latent, "math", 0) != _warm_config(WarmStartConfig(protocol="latent", latent_prior="graded",
                                                                           lr_decay=0.25), "math", 0)


@pytest.mark.slow
def test_preflight_fails_on_a_base_whose_protocol_is_deterministic():
    """The smoke base is trained on paper-protocol traces only: its answer form is (nearly) fixed per prompt,
    with decision margins far beyond P2's 2 logits, a 2-step GRPO pilot cannot gain, the preflight is not met,
    and the summary keys say which preconditions failed."""
    settings = pf.PreflightSettings(prompts=8, group_size=4, members=4, batch_size=4, sigma_ladder="0.01,0.04,0.16",
                                    calibration_members=4, calibration_batches=1, pilot_steps=2, tuning_problems=16)
    report = pf.run_preflight("smoke", "math", settings, pf.PreflightCriterion(), log=lambda *_: None)
    assert report["groups"]["protocol_rate_mean"] >= 0.75 and report["shape"]["margin_median_abs"] > 2.0
    assert "4" in report["shape"]["failed_targets"] and not report["met"]
    assert report["verdicts"]["R"] == "fails" and report["verdicts"]["U"] == "not measured"  # no gain to spread
    keys = pf.summary_keys({"math": report})
    assert keys["preflight_met"] is False and {f"math {p}" for p in report["failed"]} == set(keys["preflight_failed"])
    assert "math R" in keys["preflight_failed"] and keys["preflight_math_u_verdict"] == "not measured"
    assert len(report["calibration"]) == 3 and all(0 <= row["share"] <= 1 for row in report["calibration"])
    assert report["units"]["units"] == 16  # the 16 tuning problems: one subject each


def test_runner_skips_the_kind_whose_enforced_preflight_failed_in_01(tmp_path):
    """Issue 47 decision 3: a failed preflight of one kind closes that kind only (the runner then skips the
    notebooks on its base, tests/test_runner.py); not enforced (smoke), met, or a 01 that failed closes nothing."""
    from copes_lib import cli, runs

    folder = tmp_path / "cpu" / "01_substrate_and_agent"
    folder.mkdir(parents=True)
    ok = {"status": "ok"}
    runs.atomic_write_json(folder / "summary.json", {"preflight_enforced": True, "preflight_met": False,
                                                     "preflight_math_met": False, "preflight_qa_met": True,
                                                     "preflight_failed": ["math G2"]})
    closed = cli.closed_after("cpu", "01_substrate_and_agent", ok, tmp_path)
    assert list(closed) == ["math"] and "math G2" in closed["math"] and "docs/preflight.md" in closed["math"]
    assert cli.closed_after("cpu", "02_standard_es", ok, tmp_path) == {}
    assert cli.closed_after("cpu", "01_substrate_and_agent", {"status": "failed"}, tmp_path) == {}  # no new summary
    runs.atomic_write_json(folder / "summary.json", {"preflight_enforced": True, "preflight_met": False,
                                                     "preflight_failed": ["qa R"]})  # before per-kind keys: both
    assert sorted(cli.closed_after("cpu", "01_substrate_and_agent", ok, tmp_path)) == ["math", "qa"]
    runs.atomic_write_json(folder / "summary.json", {"preflight_enforced": False, "preflight_met": False,
                                                     "preflight_math_met": False})
    assert cli.closed_after("cpu", "01_substrate_and_agent", ok, tmp_path) == {}  # smoke: reported, not enforced
    runs.atomic_write_json(folder / "summary.json", {"preflight_enforced": True, "preflight_met": True,
                                                     "preflight_math_met": True, "preflight_qa_met": True})
    assert cli.closed_after("cpu", "01_substrate_and_agent", ok, tmp_path) == {}


def _fake_report(values):
    verdict = pf.judge(values, pf.PreflightCriterion())
    return {"values": values, **verdict, "sigma": 0.01, "alpha": 0.005, "shape": {"targets_met": True},
            "calibration": [{"sigma": 0.005, "share": 0.3}, {"sigma": 0.01, "share": 0.6}], "notes": [],
            "groups": {"protocol_rate": [0.1, 0.5, 0.9]}, "settings": {"group_size": 8, "temperature": 1.0},
            "criterion": pf.PreflightCriterion().to_dict(), "seconds": 1.0, "cached": False}


@pytest.mark.parametrize("values,exit_code", [(GOOD, 0), ({**GOOD, "G2": 0.0}, 2)])
def test_make_preflight_writes_its_measurement_and_exits_2_when_not_actionable(tmp_path, monkeypatch, capsys,
                                                                               values, exit_code):
    """`make preflight` (python -m copes_lib.protocols.testbed.preflight): the table, the JSON and the figure, and an
    exit status a script can act on."""
    from copes_lib import runs

    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path / "figures")
    seen = []
    monkeypatch.setattr(pf, "run_preflight", lambda profile, kind, *a, **kw: seen.append((profile, kind, kw["prior"]))
                        or _fake_report(values))
    assert pf.main(["--profile", "cpu", "--kinds", "math,qa", "--record"]) == exit_code
    assert seen == [("cpu", "math", "graded"), ("cpu", "qa", "graded")]  # the cpu base's registered prior
    written = runs.read_json(tmp_path / "results" / "preflight" / "cpu.json")
    assert set(written["kinds"]) == {"math", "qa"} and written["kinds"]["math"]["values"]["G1"] == values["G1"]
    assert (tmp_path / "figures" / "preflight" / "cpu.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert ("every precondition holds" in out) == (exit_code == 0) and ("math G2" in out or "'G2'" in out) == bool(exit_code)
    with pytest.raises(SystemExit):
        pf.main(["--profile", "gpu"])  # not a choice: argparse names the valid ones


def test_make_preflight_seeds_runs_one_full_preflight_per_warm_start_seed(tmp_path, monkeypatch, capsys):
    """`make preflight SEEDS=0,1,2,3,4` (docs/preflight.md#p85-the-bases-targets-gate-on-every-seed-the-run-uses):
    one preflight per kind and seed, each on that seed's base; a shape target missed on one seed fails the whole."""
    from copes_lib import runs

    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path / "figures")
    seen = []

    def fake(profile, kind, *a, **kw):
        seen.append((kind, kw["warm_seed"], kw["shape_seeds"]))
        report = _fake_report(GOOD)
        if kw["warm_seed"] == 2:
            report = {**report, "failed": ["shape seed 2: targets 1"], "met": False}
        return report

    monkeypatch.setattr(pf, "run_preflight", fake)
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "0,1,2", "--record"]) == 2
    assert seen == [("math", 0, []), ("math", 1, []), ("math", 2, [])]
    written = runs.read_json(tmp_path / "results" / "preflight" / "cpu.json")
    assert written["seeds"] == [0, 1, 2] and set(written["kinds"]) == {"math seed 0", "math seed 1", "math seed 2"}
    assert "shape seed 2" in capsys.readouterr().out
    for bad in ("0,a", "1,1", "-1"):
        with pytest.raises(SystemExit):
            pf.main(["--profile", "cpu", "--seeds", bad])


@pytest.mark.slow
def test_seed_shape_reads_one_seeds_base():
    """P2's targets on one warm-start seed's base (the smoke base, cached by the test above): targets 1-2 from the
    curve's tail, 3-4 from sampled groups and margins; without a graded prior the Spearman is not judged."""
    settings = pf.PreflightSettings(prompts=8, group_size=4, members=4, batch_size=4)
    shape = pf.seed_shape("smoke", "math", 0, settings, prior=None)
    assert shape["seed"] == 0 and shape["targets_judged"] == ["1", "2", "3", "4"]
    assert math.isnan(shape["margin_g_spearman"]) and 0.0 <= shape["strict_tail"] <= 1.0
    assert shape["targets_met"] == (not shape["failed_targets"])
