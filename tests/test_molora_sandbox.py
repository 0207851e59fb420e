"""Tests of the synthetic sandbox (paper B, finding 3): known optimum, misalignment, determinism, configs."""

import math

import numpy as np
import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.molora import sandbox as sb
from copes_lib.protocols.notebooks import params_class
from copes_lib.protocols.paper_b.molora_params import SandboxNotebookParams

torch.set_num_threads(1)

# small and fast, but the same code path as the notebook
TINY = sb.RoutingSandboxConfig(train_per_task=64, test_per_task=64, budget_evals=600)


def test_oracle_is_the_noise_floor_and_adapters_matter():
    problem = sb.make_problem(TINY, seed=0)
    # the oracle's test loss is the empirical noise power, close to sigma^2
    assert problem.oracle_test_loss == pytest.approx(TINY.noise_std ** 2, rel=0.2)
    # without adapters the substrate is far from the optimum: the sandbox has something to learn
    assert problem.base_test_loss > 10 * problem.oracle_test_loss


def test_gradient_from_true_deltas_reaches_the_known_optimum():
    # enough data not to overfit the noise, enough steps for the router's gates to saturate
    cfg = sb.RoutingSandboxConfig(train_per_task=128, test_per_task=128, budget_evals=3000, adapter_noise=0.0)
    problem = sb.make_problem(cfg, seed=1)
    a, b = sb.make_adapters(problem, "prealigned", seed=1)
    assert torch.allclose(a, problem.true_a) and torch.allclose(b, problem.true_b)
    start = sb.evaluate_routing(problem, a, b, torch.zeros(cfg.router_dim))
    out = sb.run_gradient(problem, a, b, seed=1)
    end = sb.evaluate_routing(problem, out["a"], out["b"], out["router"])
    assert end["routing_accuracy"] == 1.0
    # excess over the known optimum ~0: below 2% of the gap the adapters close (and of the start)
    gap = problem.base_test_loss - problem.oracle_test_loss
    assert abs(end["excess_loss"]) < 0.02 * gap
    assert end["excess_loss"] < 0.05 * start["excess_loss"]


def test_misaligned_adapters_are_orthogonal_and_routing_is_at_chance():
    hits, trials, aligned_hits = 0, 0, 0
    for seed in range(25):
        problem = sb.make_problem(TINY, seed)
        a, b = sb.make_adapters(problem, "misaligned", seed)
        # every adapter is Frobenius-orthogonal to every true delta (up to the small adapter noise)
        assert sb.adapter_alignment(problem, a, b).abs().max() < 0.15
        # the construction without noise: exactly orthogonal, on each side separately too
        for wa, wb in ((problem.wrong_a, problem.wrong_b), (problem.wrong_a, problem.true_b),
                       (problem.true_a, problem.wrong_b)):
            assert sb.adapter_alignment(problem, wa, wb).abs().max() < 1e-5
        # the loss-optimal hard assignment of tasks to slots vs the known one (slot k <-> task k)
        best_slot = sb.hard_routing_losses(problem, a, b).argmin(dim=1)
        hits += int((best_slot == torch.arange(TINY.num_tasks)).sum())
        trials += TINY.num_tasks
        pa, pb = sb.make_adapters(problem, "prealigned", seed)
        aligned_hits += int((sb.hard_routing_losses(problem, pa, pb).argmin(dim=1)
                             == torch.arange(TINY.num_tasks)).sum())
    chance = 1 / TINY.num_tasks
    sd = math.sqrt(chance * (1 - chance) / trials)
    assert abs(hits / trials - chance) < 3 * sd, (hits, trials)
    assert aligned_hits == trials  # the same test sees perfect alignment when it is there


def test_evolution_cannot_recover_the_assignment_from_misaligned_adapters():
    # CMA-ES on the routing with misaligned adapters: accuracy against the known slot is at chance
    cfg = sb.RoutingSandboxConfig(train_per_task=48, test_per_task=48, budget_evals=300)
    accuracies = []
    for seed in range(8):
        problem = sb.make_problem(cfg, seed)
        a, b = sb.make_adapters(problem, "misaligned", seed)
        router = sb.run_evolution(problem, a, b, seed)["router"]
        accuracies.append(sb.evaluate_routing(problem, a, b, router)["routing_accuracy"])
    # 3 standard errors of a per-seed spread ~0.1 around chance (an input-only rotation gave ~0.44)
    assert abs(np.mean(accuracies) - 1 / cfg.num_tasks) < 0.12, accuracies


def test_alignment_interpolates_between_misaligned_and_prealigned():
    cfg = sb.RoutingSandboxConfig(train_per_task=16, test_per_task=16, adapter_noise=0.0)
    problem = sb.make_problem(cfg, 0)
    cosines = []
    for alignment in (0.0, 0.5, 1.0):
        a, b = sb.make_adapters(problem, "aligned", 0, alignment=alignment)
        cosines.append(float(sb.adapter_alignment(problem, a, b).diag().mean()))
    assert cosines == pytest.approx([0.0, 0.5, 1.0], abs=1e-5)


def test_evolution_routes_prealigned_adapters_and_leaves_them_fixed():
    problem = sb.make_problem(TINY, 2)
    a, b = sb.make_adapters(problem, "prealigned", 2)
    out = sb.run_evolution(problem, a, b, seed=2)
    assert out["a"] is a and out["b"] is b and out["function_evals"] <= TINY.budget_evals
    result = sb.evaluate_routing(problem, a, b, out["router"])
    start = sb.evaluate_routing(problem, a, b, torch.zeros(TINY.router_dim))
    assert result["excess_loss"] < 0.5 * start["excess_loss"]
    assert result["routing_accuracy"] > 0.9


def test_same_seed_same_numbers():
    first = sb.run_sandbox_cell(TINY, "random", "hybrid", seed=3)
    second = sb.run_sandbox_cell(TINY, "random", "hybrid", seed=3)
    other = sb.run_sandbox_cell(TINY, "random", "hybrid", seed=4)
    for key in ("excess_loss", "routing_accuracy", "function_evals", "oracle_test_loss"):
        assert first[key] == second[key]
    assert first["excess_loss"] != other["excess_loss"]


def test_budgets_are_respected_and_comparable():
    rows = [sb.run_sandbox_cell(TINY, "cotrained", opt, seed=0) for opt in sb.OPTIMISERS]
    evals = [r["function_evals"] for r in rows]
    assert all(e <= TINY.budget_evals for e in evals)
    assert min(evals) > 0.8 * TINY.budget_evals
    assert rows[0]["grad_steps"] == TINY.budget_evals // sb.EVALS_PER_GRAD_STEP


def test_crossing_point_and_boundary():
    al = np.array([0.0, 0.5, 1.0])
    assert sb.crossing_point(al, np.array([1.0, 1.0, -1.0])) == pytest.approx(0.75)
    assert sb.crossing_point(al, np.array([-1.0, -1.0, -1.0])) == 0.0
    assert sb.crossing_point(al, np.array([-1.0, 1.0, 1.0])) is None
    # a dip below zero in the middle does not count: evo must stay better up to alignment 1
    assert sb.crossing_point(al, np.array([-1.0, 1.0, -1.0])) == pytest.approx(0.75)
    rows = [{"alignment": x, "optimiser": opt, "seed": s,
             "excess_loss": (1.0 - 2 * x + 0.01 * s) if opt == "evolution" else 0.0}
            for x in (0.0, 0.5, 1.0) for opt in ("evolution", "gradient") for s in range(5)]
    out = sb.alignment_boundary(rows, bootstrap=200)
    assert 0.5 < out["alignment_boundary"] < 0.52
    assert out["alignment_boundary_low"] <= out["alignment_boundary"] <= out["alignment_boundary_high"]


def _map_rows(diff):
    """Synthetic map rows with evolution - gradient excess loss = diff(alignment, noise, budget) + seed noise."""
    return [{"regime": "aligned", "alignment": al, "adapter_noise": nl, "budget_evals": bu, "seed": s,
             "optimiser": opt,
             "excess_loss": 1.0 + (diff(al, nl, bu) + 0.001 * (s - 2) if opt == "evolution" else 0.0)}
            for al in (0.0, 0.5, 1.0) for nl in (0.0, 0.1) for bu in (100, 1000)
            for opt in ("evolution", "gradient") for s in range(5)]


def test_region_map_verdict_finds_the_known_region():
    # evolution wins where alignment >= 0.5 and noise == 0, and at alignment 1 with any noise at 100
    # evaluations; it loses at alignment 0; ties (a mean of 0 with seed noise) elsewhere
    def diff(al, nl, bu):
        if al == 0.0:
            return 0.5
        if nl == 0.0 or (al == 1.0 and bu == 100):
            return -0.5
        return 0.0
    cells = sb.region_table(_map_rows(diff))
    assert len(cells) == 12 and all(c["seeds"] == 5 for c in cells)
    outcome = {(c["alignment"], c["adapter_noise"], c["budget_evals"]): c["outcome"] for c in cells}
    assert outcome[(0.0, 0.0, 100)] == "loss" and outcome[(1.0, 0.1, 1000)] == "tie"
    region = sb.claim_region(cells)
    assert region["wins"] == 5 and region["win_fraction"] == pytest.approx(5 / 12)
    assert region["min_alignment"] == 0.5 and region["max_noise"] == 0.1
    assert region["budgets_with_wins"] == [100, 1000]
    assert region["win_tails"][100] == {0.0: 0.5, 0.1: 1.0}
    assert region["win_tails"][1000] == {0.0: 0.5, 0.1: None}
    assert region["monotone"] and region["holds_somewhere"]
    sentence = sb.region_sentence(region)
    assert "5 of 12" in sentence and "alignment >= 0.5" in sentence and "noise <= 0.1" in sentence


def test_region_map_verdict_without_wins_and_a_non_monotone_region():
    none = sb.claim_region(sb.region_table(_map_rows(lambda al, nl, bu: 0.5)))
    assert none["wins"] == 0 and not none["holds_somewhere"] and none["min_alignment"] is None
    assert "none of the 12 cells" in sb.region_sentence(none)
    # a win at alignment 0.5 lost at alignment 1: not monotone, and no win tail at that noise
    odd = sb.claim_region(sb.region_table(_map_rows(lambda al, nl, bu: -0.5 if al == 0.5 else 0.5)))
    assert not odd["monotone"] and not odd["holds_somewhere"]
    assert all(start is None for tails in odd["win_tails"].values() for start in tails.values())


def test_region_map_reuses_identical_cells_and_runs_the_rest():
    cfg = sb.RoutingSandboxConfig(train_per_task=16, test_per_task=16, budget_evals=120)
    seeds = [0]
    reused = [sb.run_sandbox_cell(cfg, "aligned", opt, 0, alignment=1.0) for opt in sb.MAP_OPTIMISERS]
    rows = sb.region_map(cfg, seeds, [0.0, 1.0], [cfg.adapter_noise], [cfg.budget_evals], reuse=reused)
    assert len(rows) == 4 and all(r["regime"] == "aligned" for r in rows)
    at_one = [r for r in rows if r["alignment"] == 1.0]
    assert [r["wall_s"] for r in at_one] == [r["wall_s"] for r in reused]  # taken, not rerun
    fresh = sb.run_sandbox_cell(cfg, "aligned", "evolution", 0, alignment=0.0)
    assert next(r for r in rows if r["alignment"] == 0.0 and r["optimiser"] == "evolution")[
        "excess_loss"] == fresh["excess_loss"]
    assert sb.map_budgets(sb.RoutingSandboxConfig(budget_evals=3000)) == [300, 900, 3000]
    assert sb.map_budgets(cfg) == [120]  # 12 and 36 buy fewer than 2 generations


@pytest.mark.parametrize("bad", [
    {"input_dim": 10},  # fewer directions than means + true + wrong subspaces need
    {"num_tasks": 1},
    {"noise_std": -0.1},
    {"dtype": "float16"},
    {"budget_evals": 40},  # fewer than 2 hybrid generations
])
def test_bad_config_values_raise(bad):
    with pytest.raises(ConfigError):
        sb.RoutingSandboxConfig(**bad)


def test_bad_regime_optimiser_alignment_raise():
    problem = sb.make_problem(TINY, 0)
    with pytest.raises(ValueError, match="regime"):
        sb.make_adapters(problem, "aligned-ish", 0)
    with pytest.raises(ValueError, match="alignment"):
        sb.make_adapters(problem, "aligned", 0, alignment=1.5)
    with pytest.raises(ValueError, match="optimiser"):
        sb.run_sandbox_cell(TINY, "random", "adam", 0)


def test_notebook_params_are_registered_and_checked():
    cls = params_class("13_molora_sandbox")
    assert cls is SandboxNotebookParams
    assert cls().sandbox_config() == sb.RoutingSandboxConfig()  # cpu defaults agree with the library's
    with pytest.raises(ConfigError, match="INPUT_DIM|input_dim"):
        cls(INPUT_DIM=8)
    with pytest.raises(ConfigError, match="NUM_SEEDS"):
        cls(NUM_SEEDS=0)


def test_hand_written_adam_matches_torch():
    gen = torch.Generator().manual_seed(0)
    ours = torch.randn(5, 3, generator=gen).requires_grad_(True)
    theirs = ours.detach().clone().requires_grad_(True)
    opt_ours, opt_theirs = sb.Adam([ours], lr=1e-2), torch.optim.Adam([theirs], lr=1e-2)
    for _ in range(30):
        for p, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad()
            (torch.sin(p) * p).sum().backward()
            opt.step()
    assert torch.allclose(ours, theirs, atol=1e-5)
