"""Paper B in its regime (docs/molora_regime.md): the collapse metric on known gate distributions, the map's
cells and readings, and the router contrast in the collapsing setting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from copes_lib import runs
from copes_lib.molora import metrics
from copes_lib.molora.lm import SubstrateConfig, pretrain
from copes_lib.protocols.paper_b import factorial, molora_cells
from copes_lib.protocols.paper_b.molora_params import MoloraFactorialParams, MoloraRouterParams


# --------------------------------------------------------------------------- the collapse metric
def _shares_of(mass: torch.Tensor) -> torch.Tensor:
    return metrics.gate_shares(mass)


@pytest.mark.parametrize(("distribution", "monopoly", "level"), [
    ([1.0] + [0.0] * 15, 1, "collapsed"),                      # one slot does everything
    ([0.25] * 4 + [0.0] * 12, 4, "collapsed"),                 # the paper's 4 of 16
    ([0.2] * 5 + [0.0] * 11, 5, "partly collapsed"),
    ([0.125] * 8 + [0.0] * 8, 8, "partly collapsed"),
    ([1 / 16] * 16, 15, "spread"),                              # 15/16 >= 0.9: the default cpu R0
])
def test_collapse_metric_on_known_gate_distributions(distribution, monopoly, level):
    # every token routes with the same proportions: the shares are that distribution
    mass = torch.tensor(distribution).expand(3, 5, 16)
    shares = _shares_of(mass)
    assert shares.tolist() == pytest.approx(distribution)
    assert metrics.monopoly_count(shares) == monopoly
    assert metrics.collapse_level(metrics.monopoly_count(shares), 16) == level
    # m <= k exactly when the top-k share reaches 0.9
    assert (metrics.top_share(shares, 4) >= 0.9 - 1e-6) == (monopoly <= 4)


def test_collapse_is_measured_on_token_mass_not_on_each_token():
    # each token commits to one slot (token entropy 0) but tokens spread over all 16: not collapsed
    mass = torch.eye(16).repeat(2, 1).view(2, 16, 16)
    shares = _shares_of(mass)
    assert metrics.token_entropy(mass) == pytest.approx(0.0, abs=1e-6)
    assert metrics.collapse_level(metrics.monopoly_count(shares), 16) == "spread"
    # 90% of the tokens on slots 0-2, the rest spread: collapsed (3 slots)
    skewed = torch.zeros(100, 16)
    skewed[:90, :3] = torch.eye(3).repeat(30, 1)
    skewed[90:] = torch.eye(16)[:10]
    assert metrics.monopoly_count(_shares_of(skewed)) == 3


def test_collapse_level_and_steps_to_collapse():
    assert [metrics.collapse_level(m, 8) for m in (2, 3, 4, 5)] == ["collapsed", "partly collapsed",
                                                                     "partly collapsed", "spread"]
    history = [{"step": 25, "moe/monopoly_slots": 15}, {"step": 50, "moe/monopoly_slots": 6},
               {"step": 75, "moe/monopoly_slots": 4}, {"step": 100, "moe/monopoly_slots": 5}]
    assert metrics.steps_to_collapse(history, 16) == 75
    assert metrics.steps_to_collapse(history[:2], 16) is None
    with pytest.raises(ValueError, match="monopoly"):
        metrics.collapse_level(17, 16)
    with pytest.raises(ValueError, match="k = 0"):
        metrics.top_share([0.5, 0.5], k=0)


# --------------------------------------------------------------------------- the map's cells
def test_paper_matched_rate_is_on_the_cpu_grid():
    params = MoloraRouterParams()
    assert molora_cells.paper_matched_lr_x(params.MAP_STEPS) == pytest.approx(25_000 / 150)
    assert any(abs(lr - 25_000 / params.MAP_STEPS) <= 0.01 * 25_000 / params.MAP_STEPS
               for lr in params.floats("MAP_ROUTER_LR_MULTIPLIERS"))


def test_collapsing_cells_share_the_maps_cache_entry():
    """Seed 0's B3 (collapsing) at the cpu profile's 150 steps is notebook 11's map run at (x30, x100)."""
    router_nb = MoloraRouterParams()
    factorial_nb = MoloraFactorialParams(STEPS=router_nb.MAP_STEPS)
    map_cell = router_nb.cell("r0", steps=router_nb.MAP_STEPS, router_lr=router_nb.ROUTER_LR * 30, input_scale=100.0)
    b3c = factorial_nb.collapsing_cell("r0", seed=0)
    assert b3c.effective() == map_cell.effective()
    rc = factorial_nb.collapsing_cell("r1", seed=0)
    assert rc.router.kind == "r1" and rc.router.input_scale == 1.0  # R1's input is not R0's
    assert rc.router_lr == b3c.router_lr == pytest.approx(30 * factorial_nb.ROUTER_LR)
    assert not b3c.use_lifecycle and not rc.use_lifecycle
    cells = factorial.cell_configs(factorial_nb, [0, 1])
    assert cells["B3 (collapsing)"][1] == factorial_nb.collapsing_cell("r0", seed=1)


def test_run_collapse_map_runs_every_grid_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path)
    tiny = SubstrateConfig(corpus_source="sample", max_chars_per_domain=0, vocab_size=400, d_model=32, n_layers=2,
                           n_heads=2, n_kv_heads=1, intermediate=64, seq_len=32, batch_per_domain=2, steps=3,
                           warmup=1, eval_windows=4)
    torch.manual_seed(0)
    sub = pretrain(tiny, log_every=100)
    params = MoloraRouterParams(PROFILE="smoke", MAP_STEPS=2, LOG_EVERY=1, EVAL_WINDOWS=2, BATCH_PER_DOMAIN=1,
                                N_SLOTS=4, RANK=2, MAP_ROUTER_LR_MULTIPLIERS="1,100", MAP_INPUT_SCALES="1,300")
    seen = []
    grid = molora_cells.run_collapse_map("smoke", sub, params, on_row=seen.append)
    assert list(grid) == [(1.0, 1.0), (1.0, 300.0), (100.0, 1.0), (100.0, 300.0)]
    assert [(r["router_lr_x"], r["input_scale"]) for r in seen] == list(grid)
    assert all(r["steps"] == 2 and r["collapse_level"] in metrics.COLLAPSE_LEVELS for r in seen)
    for (lr_x, scale), result in grid.items():
        assert result["config"]["router_lr"] == pytest.approx(params.ROUTER_LR * lr_x)
        assert result["config"]["router"]["input_scale"] == scale and len(result["history"]) == 2
    # the same settings again come from the cache: the map resumes after an interruption
    again = molora_cells.run_collapse_map("smoke", sub, params)
    assert all(again[k]["balanced_log_ppl"] == grid[k]["balanced_log_ppl"] for k in grid)


def _grid(counts: dict[tuple, int]) -> dict[tuple, dict]:
    return {key: {"monopoly_slots": m} for key, m in counts.items()}


def test_map_readings_p1_and_p2():
    history = [{"step": s, "moe/monopoly_slots": m} for s, m in ((25, 15), (50, 14), (75, 15))]
    monotone = _grid({(1.0, 1.0): 15, (1.0, 100.0): 13, (167.0, 1.0): 12, (167.0, 100.0): 3})
    out = molora_cells.map_readings(monotone, [history], 16, 150)
    assert out["prediction_p1_monotone"] == "holds" and out["p1_rises"] == ""
    assert out["monopoly_slots_r0_paper_matched"] == 12
    assert out["prediction_p2_paper_budget_alone_no_collapse"] == "holds"
    rising = _grid({(1.0, 1.0): 10, (1.0, 100.0): 13, (167.0, 1.0): 4, (167.0, 100.0): 3})
    out = molora_cells.map_readings(rising, [history + [{"step": 100, "moe/monopoly_slots": 3},
                                                        {"step": 125, "moe/monopoly_slots": 9}]], 16, 150)
    assert out["prediction_p1_monotone"] == "fails"
    assert "scale 100 at lr x1" in out["p1_rises"] and "steps in run 0" in out["p1_rises"]
    assert out["prediction_p2_paper_budget_alone_no_collapse"] == "fails"  # 4 of 16 at x167, scale 1
    assert molora_cells.map_readings(rising, [], 16, 6)["prediction_p2_paper_budget_alone_no_collapse"] == \
        "not on the grid"


# --------------------------------------------------------------------------- the collapsing contrast
def _cells(b3c_monopoly: list[int], shift: float) -> dict[str, list[dict]]:
    """Fake results: the default router contrast ~0, the collapsing one ``shift`` nats in R1's favour."""
    noise = [0.0, 0.0004, -0.0003, 0.0002, -0.0001]
    base = {"B3": 0.0, "+R": 0.0, "B3 (collapsing)": shift, "+R (collapsing)": 0.0}
    out = {}
    for name, offset in base.items():
        out[name] = []
        for k, eps in enumerate(noise):
            own = eps if name in ("B3", "B3 (collapsing)") else -eps / 2
            m = b3c_monopoly[k] if name == "B3 (collapsing)" else 15
            out[name].append({"balanced_log_ppl": 3.64 + offset + own, "monopoly_slots": m,
                              "shares": [1.0 / 16] * 16})
    return out


def test_collapsing_summary_reads_the_predictions():
    results = _cells([3, 2, 4, 3, 9], shift=0.003)
    out = factorial.collapsing_summary(results, 16, 30.0, 100.0)
    assert out["collapsed_seeds_b3_collapsing"] == 4 and out["r0_collapsed_in_collapsing_setting"]
    assert out["monopoly_slots_b3_collapsing"] == pytest.approx(np.mean([3, 2, 4, 3, 9]))
    assert out["prediction_p3_in_regime"] == "holds"
    assert out["prediction_p4_router_helps_where_collapsed"] == "holds"
    assert out["prediction_p5_more_than_default"] == "holds"
    assert out["prediction_p6_below_0p01_nats"] == "holds"
    assert out["delta_router_collapsing_minus_default"] == pytest.approx(0.003)
    big = factorial.collapsing_summary(_cells([3] * 5, shift=0.05), 16, 30.0, 100.0)
    assert big["prediction_p6_below_0p01_nats"] == "fails"
    none = factorial.collapsing_summary(_cells([3, 9, 12, 4, 15], shift=0.003), 16, 30.0, 100.0)
    assert none["prediction_p3_in_regime"] == "fails" and not none["r0_collapsed_in_collapsing_setting"]
    assert {none[k] for k in ("prediction_p4_router_helps_where_collapsed", "prediction_p5_more_than_default",
                              "prediction_p6_below_0p01_nats")} == {"not in regime"}


def test_cpu_profile_shares_cells_between_11_and_12():
    """The cpu profile's cost note relies on these being one cache entry each (profiles/cpu.yaml)."""
    from copes_lib.config import build, profile_params

    router_nb = build(MoloraRouterParams, {**profile_params("cpu", MoloraRouterParams), "PROFILE": "cpu"})
    factorial_nb = build(MoloraFactorialParams, {**profile_params("cpu", MoloraFactorialParams), "PROFILE": "cpu"})
    cells = factorial.cell_configs(factorial_nb, [factorial_nb.SEED])
    assert router_nb.cell("r0").effective() == cells["B3"][0].effective()
    assert router_nb.cell("r1").effective() == cells["+R"][0].effective()
    lr_x, scale = factorial_nb.COLLAPSE_ROUTER_LR_X, factorial_nb.COLLAPSE_INPUT_SCALE
    assert lr_x in router_nb.floats("MAP_ROUTER_LR_MULTIPLIERS") and scale in router_nb.floats("MAP_INPUT_SCALES")
    for (x, s), cell in {(1.0, 1.0): cells["B3"][0], (lr_x, scale): cells["B3 (collapsing)"][0]}.items():
        mapped = router_nb.cell("r0", steps=router_nb.MAP_STEPS, router_lr=router_nb.ROUTER_LR * x, input_scale=s)
        assert mapped.effective() == cell.effective()
