"""The cpu run committed in 6180831 (the run of ba2d9ce): its A1 and A8 re-read with cluster-aware intervals
(docs/statistics.md S6). That run saved no unit ids, so the units are the cue of each problem rebuilt from the
run's own commit (tests/data/committed_cues_6180831.json). Its score files are kept beside the cues
(tests/data/run_6180831/: 05's and 07's scores.npz and the two values of 05's summary.json the margin needs, as
committed in 6180831), so these checks keep asserting after results/cpu holds a later run."""

import json
from pathlib import Path

import pytest

from copes_lib import stats

CUES = Path(__file__).parent / "data" / "committed_cues_6180831.json"
RUN = Path(__file__).parent / "data" / "run_6180831"


def _scores(notebook, metric):
    loaded = stats.load_scores(RUN / notebook)
    assert loaded and metric in loaded, f"{RUN / notebook} holds no {metric} scores"
    return loaded[metric]


def test_the_kept_files_are_the_run_the_cues_were_rebuilt_for():
    summary = json.loads((RUN / "05_fixed_budget_math" / "summary.json").read_text())
    assert summary["git_sha"].startswith("ba2d9ce") and summary["profile"] == "cpu"  # 6180831 committed it


def test_a1_on_the_committed_run_widens_when_its_24_cues_are_resampled():
    cues = json.loads(CUES.read_text())["math_val"]["cues"]
    ss = _scores("05_fixed_budget_math", "val_accuracy_at_budget")
    assert ss.units is None and len(cues) == ss.arms["copes"].shape[1] == 512
    problems = ss.compare("copes", "es")
    units = ss.compare("copes", "es", units=cues)
    boot = ss.compare("copes", "es", units=cues, method="bootstrap")
    assert units.n_units == 24 and units.estimate == pytest.approx(problems.estimate)
    width = lambda c: c.high - c.low  # noqa: E731
    # three of the 24 cues carry the contrast: the interval over cues is far wider than over problems
    assert width(units) > 2 * width(problems) and width(boot) > 2 * width(problems)
    print(f"A1 CoPES - ES {100 * problems.estimate:+.1f} pts: over 512 problems [{100 * problems.low:+.1f}, "
          f"{100 * problems.high:+.1f}], over 24 cues [{100 * units.low:+.1f}, {100 * units.high:+.1f}] "
          f"(bootstrap [{100 * boot.low:+.1f}, {100 * boot.high:+.1f}])")


def test_a8_on_the_committed_run_holds_over_its_20_cues():
    f1 = _scores("07_multihop_qa", "test_f1")
    cues = json.loads(CUES.read_text())["qa_test"]["cues"][: f1.arms["copes"].shape[1]]
    units = f1.compare("copes", "es", units=cues)
    assert units.n_units == 20 and units.low > 0  # spread across the cues: it holds either way


def test_the_committed_run_as_a_pilot_plans_a1s_units():
    from copes_lib import paper

    cues = json.loads(CUES.read_text())["math_val"]["cues"]
    ss = _scores("05_fixed_budget_math", "val_accuracy_at_budget")
    summary = json.loads((RUN / "05_fixed_budget_math" / "summary.json").read_text())
    margin = (paper.EQUIVALENCE_FRACTION * paper.EFFECT_SHARE_A["copes_vs_es"]
              * (summary["full_grpo_best_val_accuracy"] - summary["base_val_accuracy"]))
    vc = stats.variance_components(ss.arms["copes"], ss.arms["es"], cues)
    assert vc.between_unit > vc.within_unit > vc.seed  # the units, not the seeds, carry the noise
    five = stats.units_needed(vc, margin, seeds=5, problems_per_unit=4)
    three = stats.units_needed(vc, margin, seeds=3, problems_per_unit=4)
    assert five.units < three.units <= 128 and five.mde <= margin  # docs/statistics.md S6's worked example
