"""Recipe overlays (profiles/recipes/<name>.yaml, COPES_RECIPE / make RECIPE=): a candidate base design runs
only this way, laid over its one profile; a wrong name or profile is a one-line error naming the valid values."""

from __future__ import annotations

import subprocess

import pytest

from copes_lib import config
from copes_lib.config import REPO_ROOT, ConfigError
from copes_lib.protocols.notebooks import load_profile
from copes_lib.protocols.testbed.substrate_setup import substrate_params


def test_without_an_overlay_the_profile_stands(monkeypatch):
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    assert config.recipe_overlay("cpu") == {}
    assert substrate_params("cpu").PREFLIGHT_CALIBRATION_BATCHES == 4  # P8.11's value, the profile's own


def test_an_overlay_lays_its_values_over_its_profile(monkeypatch):
    monkeypatch.setenv(config.RECIPE_ENV, "p8.10")
    params = substrate_params("cpu")
    assert params.PREFLIGHT_CALIBRATION_BATCHES == 4 and params.WARM_LATENT_MATH_STEPS == 3000
    assert params.WARM_SUBJECT_TOKENS is True
    monkeypatch.setenv(config.RECIPE_ENV, "p8.7")
    assert substrate_params("cpu").PREFLIGHT_CALIBRATION_BATCHES == 2  # an overlay's value beats the profile's


def _design(profile):
    """What a base design is: the warm-start recipe with its data and the preflight's settings (P8.7 and P8.11
    share the warm-start config; P8.7's math failed by its sigma calibration, its QA on the standard data)."""
    from copes_lib.protocols.testbed import preflight_cli
    from copes_lib.protocols.testbed.preflight import PreflightCriterion
    from copes_lib.protocols.testbed.substrate_setup import use_profile_data
    from copes_lib.tasks import recipe_data

    params = substrate_params(profile)
    use_profile_data(profile)
    return preflight_cli.record_key(params.warm_start_config(), params.preflight_settings(), PreflightCriterion(),
                                    recipe_data(profile))


def test_the_cpu_default_holds_no_rejected_design(monkeypatch):
    """P8.7 failed its seed-0 check (docs/preflight.md P8.8): it is an overlay, not the default."""
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    default = _design("cpu")
    monkeypatch.setenv(config.RECIPE_ENV, "p8.7")
    assert _design("cpu") != default


@pytest.mark.parametrize(("name", "profile", "said"), [
    ("nope", "cpu", "RECIPE (COPES_RECIPE) = 'nope' is not a recipe overlay; valid values: ["),
    ("p8.10", "smoke", "RECIPE = 'p8.10' is an overlay of profile 'cpu', not 'smoke'; run it with PROFILE=cpu"),
])
def test_a_wrong_overlay_is_a_one_line_error(monkeypatch, name, profile, said):
    monkeypatch.setenv(config.RECIPE_ENV, name)
    with pytest.raises(ConfigError) as error:
        substrate_params(profile)
    assert said in str(error.value) and "\n" not in str(error.value)


def test_an_overlay_of_an_unknown_notebook_is_an_error(monkeypatch, tmp_path):
    (tmp_path / "bad.yaml").write_text("profile: cpu\nsections:\n  42_nothing: {SEED: 1}\n")
    monkeypatch.setattr(config, "RECIPE_DIR", tmp_path)
    monkeypatch.setenv(config.RECIPE_ENV, "bad")
    with pytest.raises(ConfigError, match="unknown notebook '42_nothing'"):
        load_profile("cpu")  # the runner's reading: every section must be a notebook of the suite


def test_make_exports_the_recipe():
    out = subprocess.run(["make", "-n", "-o", "venv", "preflight", "RECIPE=p8.10", "KINDS=math"], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "--kinds math" in out
    shown = subprocess.run(["make", "-s", "--eval", "show:\n\t@echo $$COPES_RECIPE", "show", "RECIPE=p8.10"],
                           cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "p8.10"


def _record_names():
    return sorted(p.stem for p in (REPO_ROOT / "results" / "preflight").glob("*.json"))


@pytest.mark.parametrize("name", _record_names())
def test_each_committed_check_is_the_check_of_its_recipe_today(monkeypatch, name):
    """results/preflight/<profile>[-<recipe>].json stays the check its recipe makes now: the same warm-start recipe
    (data included), preflight settings and criterion (preflight_cli.record_key). Moving the default to another
    design must leave every overlay's record reproducible, and the default's record must be the default's."""
    from copes_lib.protocols.testbed import preflight_cli

    profile, _, recipe = name.partition("-")
    if recipe:
        monkeypatch.setenv(config.RECIPE_ENV, recipe)
    else:
        monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    key = _design(profile)
    # the check RECORD=1 makes: a record of another recipe, settings or criterion is an error naming what differs
    assert preflight_cli.earlier_record(REPO_ROOT / "results" / "preflight" / f"{name}.json", key)


def test_the_cpu_default_passed_its_registered_check():
    """A design is the default only after its check passed (issue 47 decision 3): results/preflight/cpu.json holds
    every seed the default registers, per kind, each met with nothing failed."""
    from copes_lib import runs
    from copes_lib.protocols.testbed import prerun_seed_check

    record = runs.read_json(REPO_ROOT / "results" / "preflight" / "cpu.json")
    rows = {(r["kind"], r["seed"]): r for r in prerun_seed_check.seed_rows(record)}
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(config.RECIPE_ENV, raising=False)
        registered = substrate_params("cpu").check_seeds()
    for kind, seeds in registered.items():
        for seed in seeds:
            row = rows.get((kind, seed))
            assert row is not None, f"cpu.json: {kind} seed {seed} is registered but not recorded"
            assert row["met"] is True and row["failed"] == [], f"cpu.json: {kind} seed {seed} failed {row['failed']}"
