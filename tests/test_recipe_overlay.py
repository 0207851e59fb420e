"""Recipe overlays (profiles/recipes/<name>.yaml, COPES_RECIPE / make RECIPE=): a candidate base design runs
only this way, laid over its one profile; a wrong name or profile is a one-line error naming the valid values."""

from __future__ import annotations

import subprocess

import pytest

from copes_lib import config
from copes_lib.config import REPO_ROOT, ConfigError
from copes_lib.protocols.notebooks import load_profile
from copes_lib.protocols.substrate_setup import substrate_params


def test_without_an_overlay_the_profile_stands(monkeypatch):
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    assert config.recipe_overlay("cpu") == {}
    assert substrate_params("cpu").PREFLIGHT_CALIBRATION_BATCHES == 2


def test_an_overlay_lays_its_values_over_its_profile(monkeypatch):
    monkeypatch.setenv(config.RECIPE_ENV, "p8.10")
    params = substrate_params("cpu")
    assert params.PREFLIGHT_CALIBRATION_BATCHES == 4 and params.WARM_LATENT_MATH_STEPS == 3000
    assert params.WARM_SUBJECT_TOKENS is True
    monkeypatch.setenv(config.RECIPE_ENV, "p8.7")
    assert substrate_params("cpu").PREFLIGHT_CALIBRATION_BATCHES == 2


def test_the_cpu_default_holds_no_rejected_design(monkeypatch):
    """P8.7 failed its seed-0 check (docs/preflight.md P8.8): it is an overlay now, not the default."""
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    default = substrate_params("cpu").warm_start_config()
    monkeypatch.setenv(config.RECIPE_ENV, "p8.7")
    assert substrate_params("cpu").warm_start_config() != default


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
