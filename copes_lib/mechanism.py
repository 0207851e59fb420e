"""Mechanism measurements with power (issue 22, item 6; beyond the papers): does an update direction
move held-out fitness more than a random direction of the same length, how many directions does the
objective's curvature use (d_eff), and what per-step efficiency does that predict for ES?

Registered predictions and the rules that judge them: docs/mechanism.md#m2-predictions-and-rules.

1. **Direction test** (``direction_test``). For an update u (ES, CoPES, a GRPO gradient, any flat
   vector in ``model.parameters()`` order), the held-out fitness change Delta(u) = f(theta + u) - f(theta)
   is compared with the changes along ``n_random`` seeded Gaussian directions rescaled to the same
   norm. The update's z-score and tail p-value in that distribution say whether it is better than
   chance; unlike the cosine of two 1.4M-dimensional estimates (chance spread 1/sqrt(d) ~ 8.5e-4,
   70x above the largest cosine a perfect N = 16 estimator could show), this test's power does not
   shrink with d: to first order Delta(v) = g . v, a random direction's Delta has spread R |g| / sqrt(d)
   and ES's update has z ~ rho sqrt(N) (``predicted_z``), whatever d is.
2. **Curvature and d_eff** (``effective_rank``). d_eff = tr(H) / lambda_max(H) (MeZO's "local
   effective rank", arXiv 2305.17333, Assumption 1 and its tr(H) / ||H||_op form), with tr(H) from
   Hutchinson's estimator (Rademacher probes, E[z^T H z] = tr H) and lambda_max from power iteration,
   both on Hessian-vector products of a differentiable surrogate ``loss_fn(model)``. Which surrogate
   is the caller's choice (notebook 09: the negative log-likelihood of the base's rewarded
   trajectories; docs/mechanism.md#m1-what-is-measured says why that one).
3. **Linear share rho^2** (``linear_share``): how much of the members' fitness spread is the
   first-order signal sigma g . eps, from antithetic pairs (odd part = linear + odd terms, even part
   = curvature + the discontinuities of greedy decoding).
4. **Prediction** (``predicted_efficiency``): ES's per-step gain as a fraction of a gradient step's,
   each at its best step size, rho^2 N / (d_eff + N - 1) (MeZO's n / (r + n - 1) with the fitness's
   linear share rho^2 in front).

How this departs from the cited papers, and why:
- MeZO (arXiv 2305.17333) bounds ZO-SGD's slowdown on a smooth loss with exact (noise-free) two-point
  differences; ES here z-scores discrete 0/1 rewards of greedy rollouts, so a member's fitness is not
  the smooth f it perturbs. rho^2 is our addition for that: with rho = 1 the prediction is MeZO's.
  rho^2 from antithetic pairs is an UPPER bound on the linear share (odd non-linear terms count as
  signal), so the prediction is an upper bound too.
- MeZO's r is defined on the Hessian of the loss being minimised; the reward of greedy decoding has
  no Hessian (it is piecewise constant), so d_eff is measured on a differentiable surrogate the
  caller names, not on the reward itself.
- Hessian-vector products are central finite differences of gradients ((g(theta + h v) - g(theta - h v))
  / 2h, exact for quadratics up to rounding), not double backward: they work for every model that
  has a backward pass (no second-order attention kernels needed). lambda_max is power iteration's
  Rayleigh quotient (largest |eigenvalue|; a lower bound on it after finitely many iterations, so
  d_eff is biased UP by at most the non-convergence; ``converged`` reports the last relative change).
- Intrinsic dimension (Aghajanyan et al., arXiv 2012.13255: the smallest random subspace in which
  training reaches 90% of its gain) is NOT measured: one GRPO run per subspace size does not fit the
  cpu budget. The curvature route estimates the same quantity's local counterpart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from copes_lib import es as es_engine
from copes_lib import grpo as grpo_engine
from copes_lib.config import ConfigError
from copes_lib.es_backends import make_backend
from copes_lib.sampling import DIRECTION_TAG, mix_seed


# =========================================================================== flat parameter vectors
def flat_parameters(model: nn.Module) -> torch.Tensor:
    """theta as one fp32 vector in ``model.parameters()`` order (tied parameters once, as ES)."""
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _split(model: nn.Module, vector: torch.Tensor) -> list[torch.Tensor]:
    """``vector`` cut into views shaped like the model's parameters."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if vector.numel() != total:
        raise ConfigError(f"direction has {vector.numel()} elements; the model has {total} parameters")
    out, start = [], 0
    for p in params:
        out.append(vector[start:start + p.numel()].view(p.shape))
        start += p.numel()
    return out


def random_direction(dim: int, norm: float, seed: int) -> torch.Tensor:
    """A Gaussian direction of length ``norm`` (uniform on the sphere), from ``seed`` alone."""
    gen = torch.Generator().manual_seed(int(seed))
    v = torch.randn(dim, generator=gen, dtype=torch.float32)
    return v.mul_(norm / float(v.norm()))


def rescaled(vector: torch.Tensor, norm: float) -> torch.Tensor:
    n = float(vector.norm())
    if n == 0.0 or not math.isfinite(n):
        raise ConfigError(f"cannot rescale a direction of norm {n} to {norm}: the update is zero or not finite")
    return vector.float() * (norm / n)


# =========================================================================== fitness at theta + v
class Fitness(Protocol):
    """A fitness of the model as it is (held-out greedy reward, a quadratic, ...). ``population_fitness``
    (optional) scores ``n_members`` stacked members at once, rows member-major (``population.Population``)."""

    def fitness(self, model: nn.Module) -> float: ...


def perturbed_fitness(model: nn.Module, fitness: Fitness, directions: Iterable[torch.Tensor], *,
                      members_per_batch: int = 0) -> np.ndarray:
    """fitness(theta + v) for every v in ``directions`` (flat, ``model.parameters()`` order).

    ``members_per_batch > 0`` and a fitness with ``population_fitness`` / ``rows_per_member``: that
    many directions per batched forward (``population.Population``, as ES's batched backend);
    otherwise one at a time, in place, theta copied back exactly afterwards. The model ends unchanged.
    """
    directions = list(directions)
    batched = members_per_batch > 0 and hasattr(fitness, "population_fitness")
    params = list(model.parameters())
    values: list[float] = []
    if batched:
        from copes_lib.population import Population

        for start in range(0, len(directions), members_per_batch):
            group = directions[start:start + members_per_batch]
            parts = [_split(model, v.to(params[0].device)) for v in group]
            stacked = {id(p): torch.stack([p.detach() + part[j].to(p.dtype) for part in parts])
                       for j, p in enumerate(params)}
            with Population(model, stacked, fitness.rows_per_member()) as pop:
                values += [float(x) for x in fitness.population_fitness(model, len(group), pop.row_hook)]
        return np.asarray(values, dtype=np.float64)
    backup = [p.detach().clone() for p in params]
    try:
        for v in directions:
            with torch.no_grad():
                for p, b, part in zip(params, backup, _split(model, v.to(params[0].device))):
                    p.copy_(b + part.to(p.dtype))
            values.append(float(fitness.fitness(model)))
    finally:
        with torch.no_grad():
            for p, b in zip(params, backup):
                p.copy_(b)
    return np.asarray(values, dtype=np.float64)


# =========================================================================== 1. the direction test
def tail_stats(delta: float, random_deltas: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Where ``delta`` falls among ``random_deltas``.

    ``z``: (delta - mean) / sd (sd with ddof 1) with an approximate interval (the z of a value against
    a mean and sd estimated from n draws has standard error sqrt(1/n + z^2 / (2(n - 1)))); ``percentile``:
    mid-rank percentage of random draws below delta; ``p_tail``: the one-sided permutation p-value
    (k + 1) / (n + 1), k = draws >= delta (is the update better than chance?); ``tail_low`` /
    ``tail_high``: Clopper-Pearson interval of P(random >= delta)."""
    from scipy import stats as st

    r = np.asarray(random_deltas, dtype=float)
    n = len(r)
    if n < 2:
        raise ConfigError(f"n_random = {n}: the direction test needs at least 2 random directions")
    mean, sd = float(r.mean()), float(r.std(ddof=1))
    z = (delta - mean) / sd if sd > 0 else (math.copysign(math.inf, delta - mean) if delta != mean else 0.0)
    q = st.norm.ppf(0.5 + level / 2)
    se = math.sqrt(1 / n + z * z / (2 * (n - 1))) if math.isfinite(z) else math.nan
    k = int((r >= delta).sum())
    ci = st.binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return {"delta": float(delta), "z": float(z), "z_low": float(z - q * se), "z_high": float(z + q * se),
            "percentile": float(100 * ((r < delta).mean() + 0.5 * (r == delta).mean())),
            "p_tail": (k + 1) / (n + 1), "tail_low": float(ci.low), "tail_high": float(ci.high)}


def direction_test(model: nn.Module, fitness: Fitness, updates: dict[str, torch.Tensor], *, norm: float,
                   n_random: int = 32, seed: int = 0, members_per_batch: int = 0,
                   level: float = 0.95) -> dict[str, Any]:
    """Held-out fitness change along each update (rescaled to ``norm``) vs along ``n_random`` random
    directions of that norm (seeded: direction j comes from ``seed`` and j alone).

    Every update is compared at ONE norm, so methods are compared per unit of step length (a CoPES
    update under the paper's protocol is ~sqrt(K) times ES's; here it gets ES's length). Returns
    ``base`` (f(theta)), ``norm``, ``random`` (the deltas, their mean with a t-interval, sd) and one
    ``tail_stats`` row per update. ``n_random`` >= 20 gives a permutation p-value that can reach 0.05."""
    from copes_lib.stats import mean_ci

    if n_random < 2:
        raise ConfigError(f"n_random = {n_random}: need at least 2 random directions (>= 20 for p < 0.05)")
    if not norm > 0 or not math.isfinite(norm):
        raise ConfigError(f"norm = {norm}: the common step length must be positive and finite")
    dim = n_parameters(model)
    names = list(updates)
    # theta itself goes through the same (batched or sequential) path as every direction, so a
    # path's rounding cannot shift all deltas at once
    directions = [torch.zeros(dim)] + [rescaled(updates[name], norm) for name in names]
    directions += [random_direction(dim, norm, _draw_seed(seed, j)) for j in range(n_random)]
    values = perturbed_fitness(model, fitness, directions, members_per_batch=members_per_batch)
    base, values = float(values[0]), values[1:] - values[0]
    random_deltas = values[len(names):]
    mean, low, high = mean_ci(random_deltas, level)
    return {"base": base, "norm": float(norm), "n_random": n_random,
            "random": {"deltas": random_deltas.tolist(), "mean": mean, "mean_low": low, "mean_high": high,
                       "sd": float(random_deltas.std(ddof=1))},
            "updates": {name: tail_stats(float(v), random_deltas, level) for name, v in zip(names, values)}}


def norm_ladder(model: nn.Module, fitness: Fitness, direction: torch.Tensor, norms: Sequence[float], *,
                members_per_batch: int = 0) -> dict[str, Any]:
    """Held-out fitness change along ``direction`` rescaled to each of ``norms`` (a line search
    without a choice): shows whether a direction that overshoots at one length gains at a shorter one.
    No random distribution per length (cost): read it beside ``direction_test``'s at its norm."""
    dim = n_parameters(model)
    directions = [torch.zeros(dim)] + [rescaled(direction, n) for n in norms]
    values = perturbed_fitness(model, fitness, directions, members_per_batch=members_per_batch)
    return {"norms": [float(n) for n in norms], "deltas": (values[1:] - values[0]).tolist(), "base": float(values[0])}


def _draw_seed(seed: int, j: int) -> int:
    return mix_seed(seed, DIRECTION_TAG, j)


def gain_ratio(result: dict[str, Any], name: str, reference: str, level: float = 0.95) -> dict[str, Any]:
    """Equal-norm efficiency of ``name`` relative to ``reference`` from one ``direction_test``:
    (Delta_name - mean_random) / (Delta_ref - mean_random) (to first order cos(u, g) / cos(u_ref, g):
    the random mean removes the curvature term shared by near-random directions). Its interval treats
    Delta_name's noise as one random draw's (sd of the random deltas) and Delta_ref as known; None
    unless the reference itself beats chance (z > the level's normal quantile): a ratio to a noise
    value is not an efficiency."""
    from scipy import stats as st

    rnd, ups = result["random"], result["updates"]
    q = float(st.norm.ppf(0.5 + level / 2))
    ref_gain = ups[reference]["delta"] - rnd["mean"]
    if not ups[reference]["z"] > q or ref_gain <= 0:
        return {"ratio": None, "low": None, "high": None, "reference_beats_chance": False}
    gain = ups[name]["delta"] - rnd["mean"]
    return {"ratio": gain / ref_gain, "low": (gain - q * rnd["sd"]) / ref_gain,
            "high": (gain + q * rnd["sd"]) / ref_gain, "reference_beats_chance": True}


# =========================================================================== 2. curvature and d_eff
def flat_gradient(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor]) -> torch.Tensor:
    """d loss_fn(model) / d theta as one fp32 vector; the model's .grad and requires_grad are left as found."""
    params = list(model.parameters())
    requires = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        grads = torch.autograd.grad(loss_fn(model), params, allow_unused=True)
    finally:
        for p, r in zip(params, requires):
            p.requires_grad_(r)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).detach().float().reshape(-1)
                      for g, p in zip(grads, params)])


def _central_difference(model: nn.Module, v: torch.Tensor, eps: float,
                        evaluate: Callable[[nn.Module], torch.Tensor]) -> torch.Tensor:
    """(f(theta + h v) - f(theta - h v)) / 2h with f = ``evaluate``, h = eps / |v|; theta is restored
    exactly (from a copy) afterwards, whatever ``evaluate`` raises."""
    params = list(model.parameters())
    h = eps / float(v.norm())
    backup = [p.detach().clone() for p in params]
    values = []
    try:
        for sign in (1.0, -1.0):
            with torch.no_grad():
                for p, b, part in zip(params, backup, _split(model, v.to(params[0].device))):
                    p.copy_(b + (sign * h) * part.to(p.dtype))
            values.append(evaluate(model))
    finally:
        with torch.no_grad():
            for p, b in zip(params, backup):
                p.copy_(b)
    return (values[0] - values[1]) / (2 * h)


def finite_difference_hvp(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor],
                          eps: float = 1e-3) -> Callable[[torch.Tensor], torch.Tensor]:
    """v -> H v, H the Hessian of ``loss_fn`` at the model's current theta, by central differences of
    gradients with a step of length ``eps`` along v: (g(theta + h v) - g(theta - h v)) / 2h, h = eps / |v|.
    Exact for a quadratic up to rounding; theta is restored exactly after every product."""
    if not eps > 0:
        raise ConfigError(f"eps = {eps}: the finite-difference step must be positive")

    def hvp(v: torch.Tensor) -> torch.Tensor:
        return _central_difference(model, v, eps, lambda m: flat_gradient(m, loss_fn))

    return hvp


def softmax_ggn_vp(model: nn.Module, logits_fn: Callable[[nn.Module], tuple[torch.Tensor, torch.Tensor]],
                   eps: float = 1e-3) -> Callable[[torch.Tensor], torch.Tensor]:
    """v -> G v, G the generalized Gauss-Newton matrix of a weighted softmax cross-entropy
    sum_i w_i CE(z_i(theta), y_i) at the model's theta: G = sum_i w_i J_i^T (diag p_i - p_i p_i^T) J_i,
    J_i = dz_i / dtheta. ``logits_fn(model)`` returns (z, w): the logits (M, V) of the M scored
    positions and their weights (M,). G is positive semi-definite by construction (unlike the
    Hessian away from a minimum) and equals the Hessian's part that survives where the model fits
    (the dropped term is sum_i w_i (p_i - onehot(y_i)) . d^2 z_i / dtheta^2). J v is a central finite
    difference of logits along v (two forwards, step length ``eps``); J^T u one backward at theta."""
    if not eps > 0:
        raise ConfigError(f"eps = {eps}: the finite-difference step must be positive")

    def logits_at(m: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return logits_fn(m)[0].float()

    def gvp(v: torch.Tensor) -> torch.Tensor:
        jv = _central_difference(model, v, eps, logits_at)

        def loss_fn(m):
            z, w = logits_fn(m)
            p = torch.softmax(z.detach().float(), dim=-1)
            u = w.detach().float()[:, None] * (p * jv - p * (p * jv).sum(-1, keepdim=True))
            return (z.float() * u).sum()

        return flat_gradient(model, loss_fn)

    return gvp


def hutchinson_trace(hvp: Callable[[torch.Tensor], torch.Tensor], dim: int, probes: int, seed: int = 0,
                     level: float = 0.95) -> dict[str, Any]:
    """tr(H) ~ mean over Rademacher probes z of z^T H z (Hutchinson 1989), with a t-interval over probes."""
    from copes_lib.stats import mean_ci

    if probes < 2:
        raise ConfigError(f"probes = {probes}: Hutchinson's estimator needs at least 2 probes for an interval")
    gen = torch.Generator().manual_seed(int(seed))
    values = []
    for _ in range(probes):
        z = torch.randint(0, 2, (dim,), generator=gen, dtype=torch.float32).mul_(2).sub_(1)
        values.append(float(z.double() @ hvp(z).double()))
    mean, low, high = mean_ci(values, level)
    return {"trace": mean, "low": low, "high": high, "values": values}


def power_iteration(hvp: Callable[[torch.Tensor], torch.Tensor], dim: int, iters: int, seed: int = 0,
                    tol: float = 1e-3) -> dict[str, Any]:
    """The largest-|lambda| eigenvalue of H (Rayleigh quotient of power iteration), stopping when it
    changes by less than ``tol`` (relative) or after ``iters`` products; ``converged`` says which."""
    if iters < 1:
        raise ConfigError(f"iters = {iters}: power iteration needs at least 1 product")
    gen = torch.Generator().manual_seed(int(seed))
    v = torch.randn(dim, generator=gen, dtype=torch.float32)
    v /= v.norm()
    history, change = [], math.inf
    for _ in range(iters):
        hv = hvp(v)
        history.append(float(v.double() @ hv.double()))
        norm = float(hv.norm())
        if norm == 0.0:
            break
        v = hv / norm
        if len(history) >= 2:
            change = abs(history[-1] - history[-2]) / max(abs(history[-1]), 1e-30)
            if change < tol:
                break
    return {"eigenvalue": history[-1], "iterations": len(history), "relative_change": change,
            "converged": change < tol, "history": history}


def effective_rank(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor] | None = None, *,
                   probes: int = 16, iters: int = 20, seed: int = 0, eps: float = 1e-3,
                   hvp: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   level: float = 0.95) -> dict[str, Any]:
    """d_eff = tr(H) / lambda_max(H) at the model's theta (MeZO's local effective rank), H the Hessian
    of ``loss_fn`` (or the given ``hvp``). The interval is Hutchinson's trace interval over
    lambda_max (the power-iteration value taken as known). d_eff is None when tr(H) <= 0,
    lambda_max <= 0 or the trace estimate is below lambda_max (impossible for a PSD H; d_eff < 1): H
    is then not positive semi-definite in the sense the effective rank needs (a saddle of the
    surrogate), or the probes too few, which the returned trace and eigenvalue show
    (``undefined_reason`` names which)."""
    if hvp is None:
        if loss_fn is None:
            raise ConfigError("effective_rank needs loss_fn (a differentiable surrogate) or hvp")
        hvp = finite_difference_hvp(model, loss_fn, eps)
    dim = n_parameters(model)
    trace = hutchinson_trace(hvp, dim, probes, seed, level)
    top = power_iteration(hvp, dim, iters, seed + 1)
    lam = top["eigenvalue"]
    # a PSD H has tr(H) >= lambda_max: an estimate below it is an indefinite H (or too few probes)
    ok = trace["trace"] > 0 and lam > 0 and trace["trace"] >= lam
    d_eff = trace["trace"] / lam if ok else None
    reason = (None if ok else "tr(H) <= 0" if not trace["trace"] > 0 else "lambda_max <= 0" if not lam > 0
              else "tr(H) below lambda_max (H indefinite, or too few probes)")
    low = max(trace["low"] / lam, 1.0) if ok and math.isfinite(trace["low"]) else None
    high = min(trace["high"] / lam, float(dim)) if ok and math.isfinite(trace["high"]) else None
    return {"d_eff": d_eff, "d_eff_low": low, "d_eff_high": high, "undefined_reason": reason, "trace": trace["trace"],
            "trace_low": trace["low"], "trace_high": trace["high"], "trace_values": trace["values"],
            "lambda_max": lam, "power_iterations": top["iterations"], "power_converged": top["converged"],
            "power_relative_change": top["relative_change"], "dim": dim}


# =========================================================================== 3-4. rho^2 and the prediction
def antithetic_fitness(model: nn.Module, fitness: Fitness, *, sigma: float, members: int, seed: int = 0,
                       members_per_batch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(f(theta + sigma eps_i), f(theta - sigma eps_i)) for ``members`` seeded eps_i ~ N(0, I): ES's
    member perturbation (K = 1), in antithetic pairs."""
    if members < 2:
        raise ConfigError(f"members = {members}: the linear share needs at least 2 antithetic pairs")
    dim = n_parameters(model)
    eps = []
    for i in range(members):
        gen = torch.Generator().manual_seed(_draw_seed(seed, i))
        eps.append(torch.randn(dim, generator=gen, dtype=torch.float32).mul_(sigma))
    values = perturbed_fitness(model, fitness, eps + [-e for e in eps], members_per_batch=members_per_batch)
    return values[:members], values[members:]


def linear_share(plus: Sequence[float], minus: Sequence[float], *, bootstrap: int = 2000, seed: int = 0,
                 level: float = 0.95) -> dict[str, Any]:
    """rho^2 = Var(odd) / (Var(odd) + Var(even)) over antithetic pairs, odd = (f+ - f-) / 2 (the
    first-order term sigma g . eps and odd higher terms), even = (f+ + f-) / 2 (curvature and the
    non-smooth remainder); an UPPER bound on the first-order share. Percentile-bootstrap interval over
    pairs (seeded). None when every member scored the same (no spread to share)."""
    plus, minus = np.asarray(plus, dtype=float), np.asarray(minus, dtype=float)
    if plus.shape != minus.shape or len(plus) < 2:
        raise ConfigError(f"plus and minus need the same length >= 2, got {len(plus)} and {len(minus)}")
    odd, even = (plus - minus) / 2, (plus + minus) / 2

    def share(o: np.ndarray, e: np.ndarray) -> float:
        vo, ve = o.var(ddof=1), e.var(ddof=1)
        return vo / (vo + ve) if vo + ve > 0 else math.nan

    rho2 = share(odd, even)
    if not math.isfinite(rho2):
        return {"rho2": None, "low": None, "high": None, "members": len(plus)}
    rng = np.random.default_rng(seed)
    draws = [share(odd[idx], even[idx]) for idx in rng.integers(0, len(plus), (bootstrap, len(plus)))]
    draws = np.asarray([d for d in draws if math.isfinite(d)])
    low, high = np.quantile(draws, [0.5 - level / 2, 0.5 + level / 2])
    return {"rho2": float(rho2), "low": float(low), "high": float(high), "members": len(plus)}


def predicted_efficiency(rho2: float | None, population: int, d_eff: float | None) -> float | None:
    """ES's per-step gain as a fraction of a gradient step's, each at its best step size:
    rho^2 N / (d_eff + N - 1) (MeZO's n / (r + n - 1), with rho^2 in front); ~ rho^2 N / d_eff for
    d_eff >> N. None when an input is missing."""
    if rho2 is None or d_eff is None:
        return None
    return float(rho2) * population / (float(d_eff) + population - 1)


def predicted_z(rho2: float | None, population: int) -> float | None:
    """First-order z-score of an ES update (N members, K = 1) among random directions of its norm:
    cos(u, g) ~ rho sqrt(N / d) against a random direction's spread 1 / sqrt(d), so z ~ rho sqrt(N),
    independent of d. An upper bound where the held-out fitness's gradient differs from the training
    batch's (it multiplies by their cosine) or where greedy decoding's jumps widen the random spread."""
    if rho2 is None:
        return None
    return math.sqrt(max(float(rho2), 0.0) * population)


__all__ = ["flat_parameters", "n_parameters", "random_direction", "rescaled", "Fitness", "perturbed_fitness",
           "tail_stats", "direction_test", "norm_ladder", "gain_ratio", "flat_gradient", "finite_difference_hvp", "softmax_ggn_vp",
           "hutchinson_trace", "power_iteration", "effective_rank", "antithetic_fitness", "linear_share",
           "predicted_efficiency", "predicted_z"]


# --------------------------------------------------------------------------- the directions 09 measures
# ES's (or CoPES's) update and the GRPO gradient at fixed parameters, as flat vectors in
# ``model.parameters()`` order, for ``direction_test`` (once the estimator_agreement module's; its
# two-population cosine, which could not detect even a perfect estimator, is gone:
# docs/mechanism.md#m4-why-the-old-mechanism-test-could-not-find-anything).
def es_update_vector(model: nn.Module, objective: Any, config: es_engine.ESConfig, step: int,
                     backend: Any = None) -> tuple[torch.Tensor, np.ndarray]:
    """(u, rewards): the flat update ``es.ES`` would apply at ``step`` and the members' rewards (K, N_k).

    The model is left unchanged: members are evaluated (and restored) by the backend as in training,
    then ``ES.update`` writes the step into zero tensors instead of theta (its master copy).
    """
    engine = es_engine.ES(model, config)
    backend = backend or make_backend(engine)
    try:
        plan = engine.plan(step)
        rewards = backend.evaluate(engine, plan, objective)
    finally:
        backend.close()
    es_engine.check_rewards(rewards)
    rhat = engine.standardize(rewards)
    # ES.update adds the step to its fp32 master (and refreshes the compute weights from it): point both
    # at the same zero tensors, so the step lands there and theta is never touched
    zeros = [torch.zeros_like(p, dtype=torch.float32) for p in engine.params]
    engine.params, engine.master = zeros, zeros
    engine.update(plan, rhat)
    return torch.cat([p.reshape(-1) for p in zeros]), rewards


def grpo_direction(model: nn.Module, tokenizer: Any, env: Any, tasks: Sequence[Any], rollout_config: Any, *,
                   group_size: int, seed: int, micro_batch_size: int = 16, temperature: float = 1.0,
                   rollout_fn: Any = None) -> tuple[torch.Tensor, dict[str, float]]:
    """(d, stats): minus the gradient of the GRPO loss (``grpo.grpo_loss``, ratio 1, no KL) on
    ``group_size`` sampled trajectories of each of ``tasks``; ``d`` is zero when every group's
    rewards are equal (no advantage). The model's weights are unchanged; its grads are cleared.
    ``rollout_fn`` defaults to ``copes_lib.rollout.rollout`` (tests pass a stand-in, as for grpo)."""
    if rollout_fn is None:
        from copes_lib.rollout import rollout as rollout_fn

    config = grpo_engine.GRPOConfig(group_size=group_size, prompt_batch_size=len(tasks),
                                    mini_batch_size=len(tasks), micro_batch_size=micro_batch_size,
                                    kl_coef=0.0, temperature=temperature)
    sample_config = dataclasses.replace(rollout_config, temperature=temperature, top_p=1.0)
    grouped = [t for t in tasks for _ in range(group_size)]
    batch = rollout_fn(model, tokenizer, grouped, env, sample_config, seed)
    rewards = torch.tensor(batch.rewards, dtype=torch.float32)
    advantages = grpo_engine.group_advantages(rewards, group_size, norm_by_std=config.norm_adv_by_std,
                                              eps=config.adv_eps)
    params = list(model.parameters())
    requires = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
        p.grad = None
    (micro,) = grpo_engine.mini_batches(batch, advantages, config, grpo_engine._pad_id(tokenizer),
                                        params[0].device)
    num_tokens = float(sum(packed.completion_mask.sum() for packed, _ in micro))
    num_seqs = float(sum(len(packed) for packed, _ in micro))
    was_training = model.training
    model.eval()
    try:
        for packed, adv in micro:
            logps, _ = grpo_engine.completion_logprobs(model, packed, temperature)
            loss, _ = grpo_engine.grpo_loss(logps, logps.detach(), None, adv, packed.completion_mask, config,
                                            num_tokens=num_tokens, num_seqs=num_seqs)
            loss.backward()
        direction = -torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1)
                                for p in params])
    finally:
        for p, r in zip(params, requires):
            p.grad = None
            p.requires_grad_(r)
        model.train(was_training)
    group_std = rewards.view(-1, group_size).std(dim=1)
    return direction, {"reward_mean": float(rewards.mean()),
                       "zero_std_group_frac": float((group_std == 0).float().mean())}
