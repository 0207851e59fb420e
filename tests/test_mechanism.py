"""copes_lib.mechanism on known cases: a quadratic with a known Hessian (trace, top eigenvalue, d_eff),
a linear fitness (random directions centred at 0 with the predicted spread, the true gradient in the
far tail, ES's update near its predicted z), antithetic linear shares, batched = sequential."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from copes_lib import mechanism as mech
from copes_lib.config import ConfigError
from copes_lib.es import ESConfig
from copes_lib.es_objective import toy_quadratic


class Vector(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(dim))


class Linear:
    """fitness g . theta (no curvature): the gradient is g everywhere."""

    def __init__(self, g: torch.Tensor):
        self.g = g

    def fitness(self, model) -> float:
        return float(mech.flat_parameters(model) @ self.g)


def known_quadratic(dim=60, top=(5.0, 5.0, 5.0), rest=0.05, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    eig = torch.tensor(list(top) + [rest] * (dim - len(top)), dtype=torch.float64)
    a = (q * eig) @ q.T
    b = torch.randn(dim, generator=gen, dtype=torch.float64)
    return a, b, eig


def test_quadratic_hessian_trace_top_eigenvalue_and_d_eff_are_recovered():
    a, b, eig = known_quadratic()
    model = Vector(len(eig))
    with torch.no_grad():
        model.theta.normal_(generator=torch.Generator().manual_seed(3))
    loss = lambda m: 0.5 * m.theta.double() @ a @ m.theta.double() + b @ m.theta.double()  # noqa: E731
    theta0 = model.theta.detach().clone()
    r = mech.effective_rank(model, loss, probes=64, iters=50, seed=1)
    assert torch.equal(model.theta.detach(), theta0)  # the finite differences put theta back exactly
    true_trace, true_top = float(eig.sum()), float(eig.max())
    assert r["trace"] == pytest.approx(true_trace, rel=0.15)
    assert r["trace_low"] < true_trace < r["trace_high"]
    assert r["lambda_max"] == pytest.approx(true_top, rel=1e-2) and r["power_converged"]
    assert r["d_eff"] == pytest.approx(true_trace / true_top, rel=0.15)
    assert r["d_eff_low"] < true_trace / true_top < r["d_eff_high"]


def test_finite_difference_hvp_matches_the_matrix():
    a, b, eig = known_quadratic(dim=20)
    model = Vector(20)
    loss = lambda m: 0.5 * m.theta.double() @ a @ m.theta.double() + b @ m.theta.double()  # noqa: E731
    v = torch.randn(20, generator=torch.Generator().manual_seed(0))
    hv = mech.finite_difference_hvp(model, loss, eps=1e-2)(v)
    np.testing.assert_allclose(hv.numpy(), (a @ v.double()).numpy(), rtol=1e-3, atol=1e-4)


def test_indefinite_curvature_has_no_effective_rank():
    dim = 10
    diag = torch.tensor([-3.0] + [0.1] * (dim - 1))
    r = mech.effective_rank(Vector(dim), hvp=lambda v: diag * v, probes=8, iters=30)
    assert r["lambda_max"] == pytest.approx(-3.0, rel=1e-2) and r["d_eff"] is None


def test_random_directions_are_centred_at_zero_with_the_predicted_spread_and_the_gradient_is_in_the_tail():
    dim, norm, n = 400, 0.5, 64
    g = torch.randn(dim, generator=torch.Generator().manual_seed(1))
    model = Vector(dim)
    other = torch.randn(dim, generator=torch.Generator().manual_seed(2))
    other -= (other @ g) / (g @ g) * g  # orthogonal to the gradient: no first-order change at all
    r = mech.direction_test(model, Linear(g), {"gradient": g, "orthogonal": other}, norm=norm, n_random=n, seed=0)
    rnd = r["random"]
    assert rnd["mean_low"] < 0 < rnd["mean_high"]  # a flat (curvature-free) objective: centred at 0
    assert rnd["sd"] == pytest.approx(norm * float(g.norm()) / math.sqrt(dim), rel=0.25)
    grad = r["updates"]["gradient"]
    assert grad["delta"] == pytest.approx(norm * float(g.norm()), rel=1e-4)
    assert grad["p_tail"] == pytest.approx(1 / (n + 1)) and grad["percentile"] == 100.0
    assert grad["z"] > 10 and grad["tail_high"] < 0.06
    ortho = r["updates"]["orthogonal"]
    assert abs(ortho["delta"]) < 1e-4 and ortho["p_tail"] > 0.05 and abs(ortho["z"]) < 1
    assert torch.equal(model.theta.detach(), torch.zeros(dim))
    assert mech.gain_ratio(r, "orthogonal", "gradient")["ratio"] == pytest.approx(-rnd["mean"] / (
        grad["delta"] - rnd["mean"]), abs=1e-6)
    # seeded: the same seed gives the same random draws
    again = mech.direction_test(model, Linear(g), {"gradient": g}, norm=norm, n_random=n, seed=0)
    assert again["random"]["deltas"] == rnd["deltas"]


def test_an_es_update_lands_near_its_predicted_z_and_the_linear_share_is_one_for_a_linear_fitness():
    model, objective = toy_quadratic(seed=0)  # -mean((theta - t)^2) at theta = 0: nearly linear at small sigma

    class Held:
        def fitness(self, m):
            return objective.fitness(m, 0)

    population = 16
    config = ESConfig(population=population, subspaces=1, sigma=1e-3, alpha=1e-2, backend="sequential", seed=5)
    u, _ = mech.es_update_vector(model, objective, config, step=1)
    plus, minus = mech.antithetic_fitness(model, Held(), sigma=1e-3, members=population, seed=0)
    share = mech.linear_share(plus, minus)
    assert share["rho2"] == pytest.approx(1.0, abs=1e-3)
    r = mech.direction_test(model, Held(), {"es": u}, norm=float(u.norm()), n_random=48, seed=2)
    predicted = mech.predicted_z(share["rho2"], population)
    assert predicted == pytest.approx(4.0, rel=1e-3)
    assert abs(r["updates"]["es"]["z"] - predicted) < 2.5  # z ~ N(rho sqrt(N), ~1)
    assert r["updates"]["es"]["p_tail"] < 0.05


def test_linear_share_is_zero_for_a_pure_curvature_fitness():
    dim = 50
    model = Vector(dim)

    class Bowl:
        def fitness(self, m):
            return -float(m.theta.detach().pow(2).sum())

    plus, minus = mech.antithetic_fitness(model, Bowl(), sigma=0.1, members=12, seed=0)
    share = mech.linear_share(plus, minus)
    assert share["rho2"] == pytest.approx(0.0, abs=1e-9) and share["high"] < 1e-6
    assert mech.linear_share([1.0, 1.0], [1.0, 1.0])["rho2"] is None


def test_prediction_formula():
    assert mech.predicted_efficiency(1.0, 40, 41.0) == pytest.approx(0.5)
    assert mech.predicted_efficiency(0.25, 16, 1e6) == pytest.approx(0.25 * 16 / (1e6 + 15))
    assert mech.predicted_efficiency(None, 16, 10.0) is None and mech.predicted_z(None, 16) is None


def test_batched_and_sequential_perturbed_fitness_agree():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 1))
    inputs = torch.randn(3, 6)

    class Out:
        def fitness(self, m):
            with torch.no_grad():
                return float(m(inputs).mean())

        def rows_per_member(self):
            return len(inputs)

        def population_fitness(self, m, n_members, row_hook):
            row_hook(list(range(n_members * len(inputs))))
            with torch.no_grad():
                return m(inputs.repeat(n_members, 1)).view(n_members, -1).mean(1).tolist()

    dim = mech.n_parameters(model)
    dirs = [mech.random_direction(dim, 0.3, s) for s in range(5)]
    seq = mech.perturbed_fitness(model, Out(), dirs)
    bat = mech.perturbed_fitness(model, Out(), dirs, members_per_batch=2)
    np.testing.assert_allclose(seq, bat, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call, message", [
    (lambda: mech.direction_test(Vector(4), Linear(torch.ones(4)), {}, norm=1.0, n_random=1), "n_random = 1"),
    (lambda: mech.direction_test(Vector(4), Linear(torch.ones(4)), {}, norm=0.0), "norm = 0.0"),
    (lambda: mech.direction_test(Vector(4), Linear(torch.ones(4)), {"u": torch.zeros(4)}, norm=1.0), "norm 0.0"),
    (lambda: mech.hutchinson_trace(lambda v: v, 4, probes=1), "probes = 1"),
    (lambda: mech.power_iteration(lambda v: v, 4, iters=0), "iters = 0"),
    (lambda: mech.finite_difference_hvp(Vector(4), lambda m: m.theta.sum(), eps=0.0), "eps = 0.0"),
    (lambda: mech.perturbed_fitness(Vector(4), Linear(torch.ones(4)), [torch.zeros(3)]), "3 elements"),
    (lambda: mech.effective_rank(Vector(4)), "loss_fn"),
])
def test_bad_input_names_the_parameter(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_softmax_ggn_matches_the_explicit_gauss_newton_matrix_and_is_psd():
    torch.manual_seed(0)
    model = nn.Linear(4, 3, bias=False)
    x = torch.randn(5, 4)
    w = torch.full((5,), 0.2)

    def logits_fn(m):
        return m(x), w

    gvp = mech.softmax_ggn_vp(model, logits_fn, eps=0.1)  # logits are linear in W: any step is exact
    dim = mech.n_parameters(model)
    # explicit G = sum_i w_i J_i^T (diag p_i - p_i p_i^T) J_i; logits_i = W x_i, so J_i = I_3 kron x_i^T
    g = torch.zeros(dim, dim, dtype=torch.float64)
    with torch.no_grad():
        p = torch.softmax(model(x), -1).double()
    for i in range(5):
        j = torch.kron(torch.eye(3, dtype=torch.float64), x[i].double()[None])
        g += 0.2 * j.T @ (torch.diag(p[i]) - torch.outer(p[i], p[i])) @ j
    for seed in range(3):
        v = torch.randn(dim, generator=torch.Generator().manual_seed(seed))
        np.testing.assert_allclose(gvp(v).numpy(), (g @ v.double()).numpy(), rtol=1e-3, atol=1e-5)
    assert float(torch.linalg.eigvalsh(g).min()) > -1e-6  # PSD up to p's float32 rounding
    r = mech.effective_rank(model, hvp=gvp, probes=64, iters=60, seed=0)
    eig = torch.linalg.eigvalsh(g)
    assert r["lambda_max"] == pytest.approx(float(eig.max()), rel=0.02)
    assert r["trace"] == pytest.approx(float(eig.sum()), rel=0.2)


def test_an_indefinite_surrogate_with_trace_below_lambda_max_has_no_effective_rank():
    diag = torch.tensor([4.0, -3.0, 0.1, 0.1])  # tr 1.2 < lambda_max 4: no PSD matrix does that
    r = mech.effective_rank(Vector(4), hvp=lambda v: diag * v, probes=32, iters=40)
    assert r["lambda_max"] == pytest.approx(4.0, rel=1e-2) and r["d_eff"] is None


def test_norm_ladder_shows_a_gradient_that_overshoots_at_one_length_and_gains_at_a_shorter_one():
    dim = 10
    model = Vector(dim)

    class Sharp:  # f = g . theta - 50 |theta|^2: the gradient direction gains only for short steps
        g = torch.ones(dim)

        def fitness(self, m):
            t = m.theta.detach()
            return float(self.g @ t - 50 * (t @ t))

    r = mech.norm_ladder(model, Sharp(), Sharp.g, [1.0, 0.01])
    assert r["deltas"][0] < 0 < r["deltas"][1]
