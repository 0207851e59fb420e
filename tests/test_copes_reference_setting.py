"""Notebook 03 reads nothing of notebook 02: its arms at ES's setting run at the registered default
(docs/preflight.md P3 rule 1), so the runner may run 03 beside 02 (docs/cost.md, the P8.7 recipe against the
2-hour bound, plan item 2)."""

import json
from pathlib import Path

import nbformat

from copes_lib import cli, runs
from copes_lib.config import REPO_ROOT
from copes_lib.protocols.notebooks import NEEDS
from copes_lib.protocols.paper_a import es_arm
from copes_lib.protocols.params import CoPESNotebookParams

NOTEBOOK_03 = REPO_ROOT / "notebooks" / "03_copes.ipynb"


def _write_summary(root: Path, notebook: str, summary: dict) -> None:
    folder = root / "smoke" / notebook
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary))


def test_the_registered_setting_is_01s_calibrated_sigma_with_half_of_it_as_alpha(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path)
    params = CoPESNotebookParams(PROFILE="smoke", SIGMA=0.01, ALPHA=0.003)
    sigma, alpha, source = es_arm.registered_setting(params)
    assert (sigma, alpha) == (0.01, 0.003) and "SIGMA and ALPHA" in source  # 01 has not run: the parameters
    _write_summary(tmp_path, "01_substrate_and_agent", {"preflight_math_sigma": 0.04, "preflight_qa_sigma": None})
    sigma, alpha, source = es_arm.registered_setting(params)
    assert (sigma, alpha) == (0.04, 0.02) and "calibrated" in source  # P3 rule 1: alpha = sigma / 2
    assert sigma == es_arm.registered_sigma(params)[0]  # the sigma both sweeps are centred on
    qa = CoPESNotebookParams(PROFILE="smoke", SIGMA=0.01, ALPHA=0.003, TASK_KIND="qa")
    assert es_arm.registered_setting(qa)[:2] == (0.01, 0.003)  # the qa calibration found none


def test_the_registered_setting_ignores_02s_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path)
    params = CoPESNotebookParams(PROFILE="smoke")
    _write_summary(tmp_path, "01_substrate_and_agent", {"preflight_math_sigma": 0.02})
    before = es_arm.registered_setting(params)
    _write_summary(tmp_path, "02_standard_es", {"chosen_sigma": 0.08, "chosen_alpha": 0.04})
    assert es_arm.registered_setting(params) == before == (0.02, 0.01, before[2])


def test_notebook_03_reads_nothing_of_notebook_02():
    """Whatever 02 has or has not written, 03's output is the same: no timing-dependent reads."""
    code = "\n".join(c.source for c in nbformat.read(NOTEBOOK_03, as_version=4).cells if c.cell_type == "code")
    assert "02_standard_es" not in code and "chosen_sigma" not in code
    assert "es_arm.registered_setting(P)" in code  # ES's setting comes from the registered default


def test_the_runner_lets_03_run_beside_02():
    assert NEEDS["03_copes"] == ("01_substrate_and_agent",)
    stems = ["01_substrate_and_agent", "02_standard_es", "03_copes", "04_grpo", "05_fixed_budget_math"]
    waiting = cli.needs([Path(s + ".ipynb") for s in stems])
    assert waiting["03_copes"] == {"01_substrate_and_agent"} and waiting["02_standard_es"] == {"01_substrate_and_agent"}
    assert {"02_standard_es", "03_copes"} <= waiting["05_fixed_budget_math"]  # 05 reads 02's choice and 03's own best
