"""Notebook 12's summary, scores and figure, built in the protocol layer (copes_lib.protocols.paper_b.factorial)."""

import matplotlib
import numpy as np
import pytest

from copes_lib.protocols import plots
from copes_lib.protocols.paper_b import factorial
from copes_lib.protocols.paper_b.molora_params import MoloraFactorialParams

matplotlib.use("Agg")


def _results(seeds, offsets, deaths=1):
    """Fake cell results: per-seed window NLLs whose mean is the balanced log-PPL, as evaluate_pool returns."""
    params = MoloraFactorialParams()
    cells = factorial.cell_configs(params, seeds)
    results = {}
    for name, configs in cells.items():
        results[name] = []
        for k, cfg in enumerate(configs):
            windows = [4.0 + offsets.get(name, 0.0) + 0.01 * k + d for d in (-0.1, 0.0, 0.1)]
            life_on = cfg.use_lifecycle
            results[name].append({"balanced_log_ppl": float(np.mean(windows)), "window_nll": windows,
                                  "windows_per_domain": 1, "monopoly_slots": 15 if name == "B3" else 12, "shares": [1 / 16] * 16,
                                  "events": [{"event": "death"}] * (deaths if life_on else 0)})
    return cells, results


def test_factorial_summary_reads_the_contrasts_and_cells():
    seeds = [0, 1, 2]
    offsets = {"B3": 0.05, "+R": 0.0, "+R+E": 0.0, "+R+E+L": 0.02, "+R+L (E0)": 0.03}
    cells, results = _results(seeds, offsets)
    for name, rs in results.items():  # seed noise, not shared by B3, so the router's t-test is defined
        for r, eps in zip(rs, [0.0, 0.003, 0.001] if name == "B3" else [0.0, 0.001, -0.002]):
            r["window_nll"] = [v + eps for v in r["window_nll"]]
            r["balanced_log_ppl"] = float(np.mean(r["window_nll"]))
    rows = factorial.contrast_table(factorial.log_ppl_by_cell(results))
    summary = factorial.factorial_summary(results, rows, seeds, steps=12)
    b3 = [r["balanced_log_ppl"] for r in results["B3"]]
    r1 = [r["balanced_log_ppl"] for r in results["+R"]]
    assert summary["delta_router"] == pytest.approx(np.mean(np.subtract(b3, r1)))
    assert summary["delta_router_low"] < summary["delta_router"] < summary["delta_router_high"]
    assert summary["delta_eval_scope_chain"] == 0.0  # +R+E is +R without the lifecycle
    # the with-lifecycle scope contrast carries the eval_scope keys the claims read
    assert summary["delta_eval_scope"] == pytest.approx(0.01)
    assert summary["delta_lifecycle"] == pytest.approx(-0.02)
    assert "delta_inheritance_alpha0" not in summary  # its cell was not run
    assert summary["lifecycle_deaths"] == 2 * len(seeds)
    assert summary["monopoly_slots_b3"] == 15.0 and summary["monopoly_slots_full"] == 12.0
    assert summary["balanced_log_ppl_per_seed_b3"] == b3 and summary["n_seeds"] == 3
    assert summary["steps_per_cell"] == 12 and summary["seeds"] == seeds
    lines = factorial.paper_comparison(rows)
    assert any(line.startswith("router") and "same sign as" in line for line in lines)
    assert any(line.startswith("lifecycle ") and "same sign as" in line for line in lines)
    per_seed = factorial.per_seed_rows(cells, results)
    assert len(per_seed) == len(cells) * len(seeds) and {r["deaths"] for r in per_seed} == {0, 1}


def test_undefined_statistics_become_none_and_plot_draws():
    seeds = [0, 1]
    offsets = {"B3": 0.0, "+R": 0.0, "+R+E": 0.0, "+R+E+L": 0.0, "+R+L (E0)": 0.0}
    _, results = _results(seeds, offsets)
    rows = factorial.contrast_table(factorial.log_ppl_by_cell(results))
    summary = factorial.factorial_summary(results, rows, seeds, steps=4)
    assert summary["delta_router"] == 0.0 and summary["t_router"] is None and summary["p_router"] is None
    fig = plots.plot_factorial(rows, factorial.log_ppl_by_cell(results), seeds)
    assert len(fig.axes) == 2 and fig.axes[0].get_title().startswith("Contrasts, 2 seeds")


def test_window_scores_are_balanced_or_refused():
    seeds = [0, 1]
    _, results = _results(seeds, {})
    scores = factorial.window_scores(results)
    assert set(scores) == {factorial.CELL_KEYS[n] for n in [*factorial.CELLS, *factorial.COLLAPSING_CELLS]}
    assert scores["b3"].shape == (2, 3)
    assert factorial.router_power_note(scores, 1).endswith("one seed: seed noise not measured")
    results["+R"][1]["balanced_log_ppl"] += 0.01  # no longer the plain mean of its windows
    with pytest.raises(ValueError, match=r"cell \+R"):
        factorial.window_scores(results)
