"""Paper B, finding 3: a synthetic sandbox with known answers for "when does evolving the routing pay?".

The paper (docs/paper_b_molora.md#b3-sandbox) reports that evolutionary search on the ROUTING channel of a mixture of LoRA
adapters helps only when the adapters are already pre-aligned to the tasks, and ties, underperforms
or degrades the gradient solution otherwise. This module builds a problem where the optimum is known
and measures that claim.

The problem (every draw from an explicit seed):
- SyntheticSubstrate: a frozen random two-layer tanh MLP ``y = W2 tanh(W1 x + b1) + b2``.
- T tasks. Task t owns a ground-truth rank-r delta ``dW*_t = B*_t A*_t`` on ``W1``. The rows of
  ``A*_t`` span a private block of an orthonormal basis of the input space.
- Inputs ``x = m u_t + z``, ``z ~ N(0, I)``: the task mean ``m u_t`` makes the task identifiable from
  the input (a linear router separates tasks almost perfectly for the default ``m``).
- Targets ``y = f(x; W1 + dW*_t) + sigma * eps``. The optimum is therefore known: the true deltas with
  one-hot routing to the input's task. Its loss on the test set is the noise floor, and every
  reported excess loss is ``test loss - oracle test loss``.

The model: T adapter slots ``B_k A_k`` stacked on ``W1``, mixed per input by independent sigmoid gates
``g_k(x) = sigmoid(w_k . x / sqrt(d) + c_k)`` (the paper's R1 router has independent sigmoid gates,
too). ``W1_eff(x) = W1 + sum_k g_k(x) B_k A_k``.

Adapter regimes (the start point every optimiser shares):
- ``aligned`` with alignment ``a`` in [0, 1]: with ``c = sqrt(a)``, ``s = sqrt(1 - a)``,
  ``A_k = c A*_k + s Aperp_k`` and ``B_k = c B*_k + s Bperp_k``, where ``Aperp_k`` spans a block of the
  input space orthogonal to every true delta and task mean, and ``Bperp_k`` is random, orthogonal to
  every true ``B*_t`` and of the same norm; then a small relative Gaussian noise on both factors.
  Without the noise, ``B_k A_k`` has Frobenius cosine exactly ``a`` with ``B*_k A*_k`` and the same
  norm. ``prealigned`` is ``a = 1``; ``misaligned`` is ``a = 0``: every adapter is orthogonal to every
  true delta on both sides, so no slot carries information about any task and routing accuracy
  against the known assignment is at chance. Rotating only the input side is not enough: a slot that
  keeps its task's output factor ``B*_k`` reproduces that task's curvature-induced mean shift through
  the tanh, and evolution found and used it (routing accuracy 0.44 against chance 0.25 in a first
  version). A mere permutation of the true deltas is not misalignment either: a learned router
  relabels slots for free.
- ``random``: Gaussian factors of the true deltas' scale in random subspaces.
- ``scratch`` (co-trained): LoRA's init, ``A`` Gaussian, ``B = 0``.

Optimisers, at an equal budget of function evaluations (one forward pass over the training set =
1 evaluation; a gradient step = 3, the usual forward + backward ~ 3 forwards rule):
- ``gradient``: full-batch Adam on adapters and router together.
- ``evolution``: CMA-ES (the ``cma`` package, Hansen's reference implementation, pinned) on the router's
  parameters only; adapters stay fixed. Why CMA-ES: it is the standard, well-maintained derivative-free
  optimiser for continuous problems of ~100 dimensions, adapts its own step size and covariance (no
  learning rate to tune), and is invariant to monotone transforms of the fitness. The suite's own
  ES engine (``copes_lib.es``) is built for billions of parameters with a fixed sigma; on a ~100-dim
  router it would be a weaker evolutionary baseline, and the claim deserves the strongest one.
- ``hybrid`` (the paper's "learning while evolving"): each generation CMA-ES evaluates a population of
  routers with the CURRENT adapters, then the adapters take a few Adam steps under CMA-ES's mean router.

Metrics: excess test loss over the oracle, routing accuracy (argmax gate vs the input's task) against
the known assignment (slot k <-> task k, meaningful for the aligned family) and after the best
one-to-one relabelling of slots (Hungarian; the only meaningful one for random / scratch adapters),
function evaluations and wall time.

How this departs from the paper: the paper's substrate is a ~150M-parameter decoder LM on real text
and its evolutionary system also runs an adapter lifecycle (death, inheritance, SVD mutation); here
the substrate is a small frozen MLP with synthetic tasks, evolution acts on the routing channel only,
with CMA-ES (the paper's evolutionary operator is not published), the router reads the input rather
than post-stack hidden states, and it has no learnable floor or temperature anneal. The module is
self-contained (its own small stacked-adapter mixture) rather than reusing ``copes_lib.molora``'s pool
and routers, which target the language-model substrate.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from copes_lib import stats
from copes_lib.config import Config, ConfigError, param

REGIMES = ("prealigned", "random", "misaligned", "cotrained")
OPTIMISERS = ("gradient", "evolution", "hybrid")
EVALS_PER_GRAD_STEP = 3  # forward + backward ~ 3 forward passes


# --------------------------------------------------------------------------- configs
@dataclass(frozen=True)
class RoutingSandboxConfig(Config):
    """One sandbox problem and the optimisers' settings (all sizes small: it runs on one CPU thread)."""

    num_tasks: int = param(4, "number of tasks T, also the number of adapter slots", ge=2)
    input_dim: int = param(24, "input dimension d; needs d >= T * (1 + 2 * rank)", ge=2)
    hidden_dim: int = param(32, "hidden width of the frozen MLP substrate", ge=2)
    output_dim: int = param(8, "output dimension of the substrate", ge=1)
    rank: int = param(2, "rank r of each task's true delta and of each adapter", ge=1)
    task_mean_scale: float = param(8.0, "norm m of the task-identifying mean; larger = easier routing", gt=0.0)
    delta_scale: float = param(1.0, "std of the pre-activation change a true delta causes", gt=0.0)
    noise_std: float = param(0.1, "target noise sigma; the oracle's loss is ~sigma^2", ge=0.0)
    train_per_task: int = param(128, "training inputs per task", ge=4)
    test_per_task: int = param(256, "test inputs per task", ge=4)
    adapter_noise: float = param(0.1, "relative noise on aligned adapters' factors (pre-aligned is not exact)",
                                 ge=0.0)
    budget_evals: int = param(3000, "function evaluations per run (a gradient step costs 3)", ge=30)
    grad_lr: float = param(1e-2, "Adam learning rate of gradient descent (adapters and router)", gt=0.0)
    cma_sigma0: float = param(1.0, "CMA-ES initial step size on the router parameters", gt=0.0)
    cma_popsize: int = param(0, "CMA-ES population size; 0 = cma's default 4 + 3 ln(dim)", ge=0)
    hybrid_grad_steps: int = param(4, "adapter Adam steps per CMA-ES generation in the hybrid", ge=1)
    device: str = param("cpu", "torch device")
    dtype: str = param("float32", "torch dtype", choices=("float32", "float64"))

    def check(self) -> None:
        needed = self.num_tasks * (1 + 2 * self.rank)
        if self.input_dim < needed:
            raise ConfigError(
                f"RoutingSandboxConfig.input_dim = {self.input_dim} is too small: the task means, true deltas and "
                f"wrong subspaces need num_tasks * (1 + 2 * rank) = {needed} orthogonal directions"
            )
        if self.budget_evals < self.min_budget_evals:
            raise ConfigError(
                f"RoutingSandboxConfig.budget_evals = {self.budget_evals} buys fewer than 2 hybrid generations "
                f"(each costs popsize + 3 * hybrid_grad_steps); it must be >= {self.min_budget_evals}"
            )

    @property
    def min_budget_evals(self) -> int:
        popsize = self.cma_popsize or 4 + int(3 * math.log(self.router_dim))
        return 2 * (popsize + EVALS_PER_GRAD_STEP * self.hybrid_grad_steps)

    @property
    def router_dim(self) -> int:
        return self.num_tasks * (self.input_dim + 1)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


# --------------------------------------------------------------------------- the problem
@dataclass
class SyntheticSubstrate:
    """The frozen random MLP ``y = w2 tanh(w1 x + b1) + b2``."""

    w1: torch.Tensor  # (H, d)
    b1: torch.Tensor  # (H,)
    w2: torch.Tensor  # (O, H)
    b2: torch.Tensor  # (O,)

    def forward(self, a: torch.Tensor, b: torch.Tensor, gates: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Output with gated adapters ``A (K,r,d)``, ``B (K,H,r)``; gates (N, K) or a population's (P, N, K)."""
        k, r, d = a.shape
        # sum_k g_k B_k (A_k x) = [B_1 .. B_K] (g * codes): one matmul each way, no per-sample loops
        codes = (x @ a.reshape(k * r, d).T).reshape(len(x), k, r)
        gated = (gates.unsqueeze(-1) * codes).flatten(-2)  # (..., N, K*r)
        pre = x @ self.w1.T + self.b1 + gated @ b.permute(1, 0, 2).reshape(-1, k * r).T
        return torch.tanh(pre) @ self.w2.T + self.b2


@dataclass
class Problem:
    """A frozen substrate, T true deltas, train/test data and the oracle's losses."""

    cfg: RoutingSandboxConfig
    substrate: SyntheticSubstrate
    true_a: torch.Tensor  # (T, r, d) orthonormal rows in task t's block
    true_b: torch.Tensor  # (T, H, r)
    wrong_a: torch.Tensor  # (T, r, d) orthonormal rows orthogonal to every true delta and task mean
    wrong_b: torch.Tensor  # (T, H, r) random, Frobenius-orthogonal to every true B*_t, same norms
    task_means: torch.Tensor  # (T, d)
    x_train: torch.Tensor
    y_train: torch.Tensor
    task_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    task_test: torch.Tensor
    oracle_test_loss: float  # the known optimum on the test set (empirical noise floor)
    base_test_loss: float  # the frozen substrate with no adapters


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _randn(gen: torch.Generator, *shape: int, cfg: RoutingSandboxConfig) -> torch.Tensor:
    # draw on CPU in float64 (device-independent numbers), then move
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(cfg.device, cfg.torch_dtype)


def one_hot_gates(tasks: torch.Tensor, num_tasks: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.nn.functional.one_hot(tasks, num_tasks).to(dtype)


def _sample_inputs(gen: torch.Generator, cfg: RoutingSandboxConfig, task_means: torch.Tensor,
                   per_task: int) -> tuple[torch.Tensor, torch.Tensor]:
    tasks = torch.arange(cfg.num_tasks).repeat_interleave(per_task).to(cfg.device)
    z = _randn(gen, len(tasks), cfg.input_dim, cfg=cfg)
    return task_means[tasks] + z, tasks


def make_problem(cfg: RoutingSandboxConfig, seed: int) -> Problem:
    """Draw the substrate, the true deltas, the data and the oracle's test loss from ``seed``."""
    gen = _gen(seed)
    t, d, h, o, r = cfg.num_tasks, cfg.input_dim, cfg.hidden_dim, cfg.output_dim, cfg.rank
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    basis = basis.T.to(cfg.device, cfg.torch_dtype)  # rows: an orthonormal basis of R^d
    # disjoint blocks of that basis: task means | true row spaces | wrong row spaces | rest
    task_means = cfg.task_mean_scale * basis[:t]
    true_a = basis[t: t + t * r].reshape(t, r, d)
    wrong_a = basis[t + t * r: t + 2 * t * r].reshape(t, r, d)
    true_b = _randn(gen, t, h, r, cfg=cfg) * (cfg.delta_scale / math.sqrt(r))
    # an output factor unrelated to any task: random, projected off the span of all true B*_t (the
    # same projection for every slot, so it favours no task), rescaled to the matching true norm
    true_flat = torch.linalg.qr(true_b.flatten(1).T.double())[0]  # (H*r, T) orthonormal
    wrong_flat = _randn(gen, t, h, r, cfg=cfg).flatten(1).double()
    wrong_flat = wrong_flat - (wrong_flat @ true_flat) @ true_flat.T
    wrong_flat = wrong_flat * (true_b.flatten(1).double().norm(dim=1) / wrong_flat.norm(dim=1))[:, None]
    wrong_b = wrong_flat.reshape(t, h, r).to(cfg.torch_dtype)
    substrate = SyntheticSubstrate(
        w1=_randn(gen, h, d, cfg=cfg) / math.sqrt(d + cfg.task_mean_scale ** 2),
        b1=0.1 * _randn(gen, h, cfg=cfg),
        w2=_randn(gen, o, h, cfg=cfg) / math.sqrt(h),
        b2=0.1 * _randn(gen, o, cfg=cfg),
    )
    data = {}
    for split, per_task in (("train", cfg.train_per_task), ("test", cfg.test_per_task)):
        x, tasks = _sample_inputs(gen, cfg, task_means, per_task)
        clean = substrate.forward(true_a, true_b, one_hot_gates(tasks, t, x.dtype), x)
        data[f"x_{split}"] = x
        data[f"y_{split}"] = clean + cfg.noise_std * _randn(gen, *clean.shape, cfg=cfg)
        data[f"task_{split}"] = tasks
    x, y = data["x_test"], data["y_test"]
    oracle = substrate.forward(true_a, true_b, one_hot_gates(data["task_test"], t, x.dtype), x)
    no_adapter = torch.zeros(len(x), t, dtype=x.dtype, device=x.device)
    base = substrate.forward(true_a, true_b, no_adapter, x)
    problem = Problem(cfg, substrate, true_a, true_b, wrong_a, wrong_b, task_means, **data,
                      oracle_test_loss=float(((oracle - y) ** 2).mean()),
                      base_test_loss=float(((base - y) ** 2).mean()))
    return problem


# --------------------------------------------------------------------------- adapters
def make_adapters(problem: Problem, regime: str, seed: int,
                  alignment: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The start adapters ``(A (T,r,d), B (T,H,r))`` of a regime.

    ``regime`` is one of :data:`REGIMES` or ``"aligned"`` with ``alignment`` in [0, 1]
    (``prealigned`` = aligned at 1, ``misaligned`` = aligned at 0).
    """
    cfg = problem.cfg
    if regime not in (*REGIMES, "aligned"):
        raise ValueError(f"regime = {regime!r} is not valid; valid values: {[*REGIMES, 'aligned']}")
    if regime == "prealigned":
        regime, alignment = "aligned", 1.0
    elif regime == "misaligned":
        regime, alignment = "aligned", 0.0
    gen = _gen(10_007 * seed + 17)
    t, d, h, r = cfg.num_tasks, cfg.input_dim, cfg.hidden_dim, cfg.rank
    if regime == "aligned":
        if alignment is None or not 0.0 <= alignment <= 1.0:
            raise ValueError(f"alignment = {alignment!r} must be a number in [0, 1] for regime 'aligned'")
        # rotate both factors by the angle whose cos^2 is `alignment`: the noiseless delta B_k A_k then
        # has Frobenius cosine exactly `alignment` with the true B*_k A*_k and the same norm
        c = math.sqrt(alignment)
        s = math.sqrt(1.0 - alignment)
        a = c * problem.true_a + s * problem.wrong_a
        b = c * problem.true_b + s * problem.wrong_b
        # relative noise: same expected Frobenius ratio on both factors
        a = a + cfg.adapter_noise * _randn(gen, t, r, d, cfg=cfg) / math.sqrt(d)
        b = b + cfg.adapter_noise * _randn(gen, t, h, r, cfg=cfg) * (cfg.delta_scale / math.sqrt(r))
        return a, b
    a = _randn(gen, t, r, d, cfg=cfg) / math.sqrt(d)  # rows of unit expected norm, like the true ones
    if regime == "random":
        return a, _randn(gen, t, h, r, cfg=cfg) * (cfg.delta_scale / math.sqrt(r))
    return a, torch.zeros(t, h, r, dtype=cfg.torch_dtype, device=cfg.device)  # cotrained: LoRA init


def adapter_alignment(problem: Problem, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(T slots, T tasks) cosine similarity of each adapter's delta B_k A_k with each true delta."""
    adapters = torch.einsum("khr,krd->khd", b, a).flatten(1)
    truths = torch.einsum("thr,trd->thd", problem.true_b, problem.true_a).flatten(1)
    norms = adapters.norm(dim=1, keepdim=True) * truths.norm(dim=1)[None]
    return (adapters @ truths.T) / norms.clamp_min(1e-12)


def hard_routing_losses(problem: Problem, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(T tasks, T slots) test loss of each task's inputs when routed fully to one slot."""
    t = problem.cfg.num_tasks
    out = torch.empty(t, t)
    for slot in range(t):
        gates = one_hot_gates(torch.full_like(problem.task_test, slot), t, problem.x_test.dtype)
        err = ((problem.substrate.forward(a, b, gates, problem.x_test) - problem.y_test) ** 2).mean(dim=1)
        for task in range(t):
            out[task, slot] = err[problem.task_test == task].mean()
    return out


# --------------------------------------------------------------------------- router
def router_gates(params: torch.Tensor, x: torch.Tensor, num_tasks: int) -> torch.Tensor:
    """Sigmoid gates from flat router parameters: (D,) -> (N, K), or a population (P, D) -> (P, N, K)."""
    d = x.shape[1]
    p = params.reshape(*params.shape[:-1], num_tasks, d + 1)
    logits = torch.einsum("...kd,nd->...nk", p[..., :d], x / math.sqrt(d)) + p[..., None, :, d]
    return torch.sigmoid(logits)


def routing_accuracy(gates: torch.Tensor, tasks: torch.Tensor, num_tasks: int) -> tuple[float, float]:
    """(accuracy against slot k <-> task k, accuracy after the best one-to-one slot relabelling)."""
    chosen = gates.argmax(dim=-1).cpu().numpy()
    truth = tasks.cpu().numpy()
    confusion = np.zeros((num_tasks, num_tasks))
    np.add.at(confusion, (truth, chosen), 1)
    from scipy.optimize import linear_sum_assignment  # here: a notebook kernel that never routes skips scipy

    rows, cols = linear_sum_assignment(-confusion)
    return float(np.trace(confusion) / len(truth)), float(confusion[rows, cols].sum() / len(truth))


def evaluate_routing(problem: Problem, a: torch.Tensor, b: torch.Tensor, router: torch.Tensor) -> dict[str, float]:
    """Test excess loss over the oracle and routing accuracies of one (adapters, router)."""
    with torch.no_grad():
        gates = router_gates(router, problem.x_test, problem.cfg.num_tasks)
        loss = float(((problem.substrate.forward(a, b, gates, problem.x_test) - problem.y_test) ** 2).mean())
    known, relabelled = routing_accuracy(gates, problem.task_test, problem.cfg.num_tasks)
    gap = problem.base_test_loss - problem.oracle_test_loss
    excess = loss - problem.oracle_test_loss
    return {"test_loss": loss, "excess_loss": excess, "excess_loss_normalised": excess / gap,
            "routing_accuracy": known, "routing_accuracy_relabelled": relabelled}


def _train_loss(problem: Problem, a, b, router) -> torch.Tensor:
    gates = router_gates(router, problem.x_train, problem.cfg.num_tasks)
    return ((problem.substrate.forward(a, b, gates, problem.x_train) - problem.y_train) ** 2).mean()


# --------------------------------------------------------------------------- optimisers
class Adam:
    """Plain Adam (Kingma & Ba 2015, bias-corrected, no weight decay), as in ``torch.optim.Adam``.

    Written out because ``torch.optim``'s first step imports ``torch._dynamo`` (~4 s), which would
    dominate the smoke profile; the update is the textbook one.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.m, self.v):
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v / (1 - b2 ** self.t)).sqrt_().add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / (1 - b1 ** self.t))


def _cma(cfg: RoutingSandboxConfig, seed: int) -> cma.CMAEvolutionStrategy:  # noqa: F821 (imported here)
    # imported here: cma pulls in scipy.stats and matplotlib (~2 s), paid by every notebook kernel that imports
    # the suite's parameters (copes_lib.protocols.paper_b.molora_params imports this module), though only 13 runs CMA-ES
    import cma

    opts = {"seed": 1 + seed, "verbose": -9, "verb_log": 0, "verb_disp": 0, "tolfun": 0, "tolx": 0,
            "tolfunhist": 0, "tolstagnation": 10**9, "tolflatfitness": 10**9}
    if cfg.cma_popsize:
        opts["popsize"] = cfg.cma_popsize
    # cma seeds numpy's global generator from opts["seed"]: runs are reproducible, not independent
    return cma.CMAEvolutionStrategy(np.zeros(cfg.router_dim), cfg.cma_sigma0, opts)


def _population_losses(problem: Problem, a, b, candidates: list[np.ndarray]) -> list[float]:
    cfg = problem.cfg
    params = torch.as_tensor(np.asarray(candidates), dtype=cfg.torch_dtype, device=cfg.device)
    with torch.no_grad():
        gates = router_gates(params, problem.x_train, cfg.num_tasks)
        pred = problem.substrate.forward(a, b, gates, problem.x_train)
        return ((pred - problem.y_train) ** 2).mean(dim=(1, 2)).tolist()


def run_gradient(problem: Problem, a: torch.Tensor, b: torch.Tensor, seed: int) -> dict[str, Any]:
    """Full-batch Adam on adapters and router (router starts at zero: every gate 0.5)."""
    cfg = problem.cfg
    a, b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    router = torch.zeros(cfg.router_dim, dtype=cfg.torch_dtype, device=cfg.device, requires_grad=True)
    opt = Adam([a, b, router], lr=cfg.grad_lr)
    steps = cfg.budget_evals // EVALS_PER_GRAD_STEP
    for _ in range(steps):
        opt.zero_grad()
        _train_loss(problem, a, b, router).backward()
        opt.step()
    return {"a": a.detach(), "b": b.detach(), "router": router.detach(),
            "function_evals": steps * EVALS_PER_GRAD_STEP, "grad_steps": steps, "generations": 0}


def run_evolution(problem: Problem, a: torch.Tensor, b: torch.Tensor, seed: int) -> dict[str, Any]:
    """CMA-ES on the router only; adapters fixed. Returns CMA-ES's final mean as the router."""
    cfg = problem.cfg
    es, evals, generations = _cma(cfg, seed), 0, 0
    while evals + es.popsize <= cfg.budget_evals:
        candidates = es.ask()
        es.tell(candidates, _population_losses(problem, a, b, candidates))
        evals += len(candidates)
        generations += 1
    router = torch.as_tensor(es.mean, dtype=cfg.torch_dtype, device=cfg.device)
    return {"a": a, "b": b, "router": router, "function_evals": evals, "grad_steps": 0,
            "generations": generations}


def run_hybrid(problem: Problem, a: torch.Tensor, b: torch.Tensor, seed: int) -> dict[str, Any]:
    """Learning while evolving: CMA-ES on the router with the current adapters, Adam on the adapters."""
    cfg = problem.cfg
    a, b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    opt = Adam([a, b], lr=cfg.grad_lr)
    es, evals, generations, steps = _cma(cfg, seed), 0, 0, 0
    per_generation = es.popsize + EVALS_PER_GRAD_STEP * cfg.hybrid_grad_steps
    while evals + per_generation <= cfg.budget_evals:
        candidates = es.ask()
        es.tell(candidates, _population_losses(problem, a.detach(), b.detach(), candidates))
        router = torch.as_tensor(es.mean, dtype=cfg.torch_dtype, device=cfg.device)
        for _ in range(cfg.hybrid_grad_steps):
            opt.zero_grad()
            _train_loss(problem, a, b, router).backward()
            opt.step()
        evals += per_generation
        generations += 1
        steps += cfg.hybrid_grad_steps
    router = torch.as_tensor(es.mean, dtype=cfg.torch_dtype, device=cfg.device)
    return {"a": a.detach(), "b": b.detach(), "router": router, "function_evals": evals,
            "grad_steps": steps, "generations": generations}


OPTIMISER_FNS = {"gradient": run_gradient, "evolution": run_evolution, "hybrid": run_hybrid}


def run_sandbox_cell(cfg: RoutingSandboxConfig, regime: str, optimiser: str, seed: int,
             alignment: float | None = None) -> dict[str, Any]:
    """One (regime, optimiser, seed) run from scratch: a flat row of metrics."""
    if optimiser not in OPTIMISER_FNS:
        raise ValueError(f"optimiser = {optimiser!r} is not valid; valid values: {list(OPTIMISER_FNS)}")
    problem = make_problem(cfg, seed)
    a, b = make_adapters(problem, regime, seed, alignment)
    start = evaluate_routing(problem, a, b, torch.zeros(cfg.router_dim, dtype=cfg.torch_dtype, device=cfg.device))
    t0 = time.perf_counter()
    out = OPTIMISER_FNS[optimiser](problem, a, b, seed)
    wall = time.perf_counter() - t0
    metrics = evaluate_routing(problem, out["a"], out["b"], out["router"])
    alignment = {"prealigned": 1.0, "misaligned": 0.0}.get(regime, alignment)
    return {"regime": regime, "optimiser": optimiser, "seed": seed,
            "alignment": alignment if alignment is not None else math.nan,
            **metrics, "start_excess_loss": start["excess_loss"],
            "oracle_test_loss": problem.oracle_test_loss, "base_test_loss": problem.base_test_loss,
            "adapter_noise": cfg.adapter_noise, "budget_evals": cfg.budget_evals,
            "function_evals": out["function_evals"], "grad_steps": out["grad_steps"],
            "generations": out["generations"], "wall_s": wall}


# --------------------------------------------------------------------------- experiments
def regime_grid(cfg: RoutingSandboxConfig, seeds: list[int], progress=None) -> list[dict[str, Any]]:
    """Every regime x optimiser x seed (the notebook's main table)."""
    cells = [(r, o, s) for r in REGIMES for o in OPTIMISERS for s in seeds]
    iterator = progress(cells, desc="regime grid") if progress else cells
    return [run_sandbox_cell(cfg, r, o, s) for r, o, s in iterator]


def alignment_sweep(cfg: RoutingSandboxConfig, seeds: list[int], alignments: list[float],
                    optimisers: tuple[str, ...] = OPTIMISERS, progress=None) -> list[dict]:
    """Aligned adapters at each alignment in ``alignments``, for each optimiser and seed."""
    cells = [(al, o, s) for al in alignments for o in optimisers for s in seeds]
    iterator = progress(cells, desc="alignment sweep") if progress else cells
    return [run_sandbox_cell(cfg, "aligned", o, s, alignment=al) for al, o, s in iterator]


def noise_sweep(cfg: RoutingSandboxConfig, seeds: list[int], noise_levels: list[float],
                optimisers: tuple[str, ...] = ("gradient", "evolution"), progress=None) -> list[dict]:
    """Pre-aligned adapters at each relative noise level: how exact must pre-alignment be?"""
    cells = [(nl, o, s) for nl in noise_levels for o in optimisers for s in seeds]
    iterator = progress(cells, desc="noise sweep") if progress else cells
    return [run_sandbox_cell(dataclasses.replace(cfg, adapter_noise=nl), "prealigned", o, s) for nl, o, s in iterator]


BUDGET_FRACTIONS = (0.1, 0.3)  # smaller budgets of the budget sweep, as fractions of budget_evals


def budget_sweep(cfg: RoutingSandboxConfig, seeds: list[int], fractions: tuple[float, ...] = BUDGET_FRACTIONS,
                 optimisers: tuple[str, ...] = ("gradient", "evolution"), progress=None) -> list[dict]:
    """Pre-aligned adapters at smaller budgets (those below the config's minimum are skipped)."""
    budgets = [int(f * cfg.budget_evals) for f in fractions if int(f * cfg.budget_evals) >= cfg.min_budget_evals]
    cells = [(bu, o, s) for bu in budgets for o in optimisers for s in seeds]
    iterator = progress(cells, desc="budget sweep") if progress else cells
    return [run_sandbox_cell(dataclasses.replace(cfg, budget_evals=bu), "prealigned", o, s) for bu, o, s in iterator]


MAP_OPTIMISERS = ("gradient", "evolution")


def map_budgets(cfg: RoutingSandboxConfig, fractions: tuple[float, ...] = BUDGET_FRACTIONS) -> list[int]:
    """The budget axis of the map: the smaller budgets that buy >= 2 generations, then the full one."""
    small = [int(f * cfg.budget_evals) for f in fractions]
    return sorted({b for b in small if b >= cfg.min_budget_evals} | {cfg.budget_evals})


def _map_key(alignment: float, noise: float, budget: int, optimiser: str, seed: int) -> tuple:
    return round(float(alignment), 6), round(float(noise), 6), int(budget), optimiser, int(seed)


def region_map(cfg: RoutingSandboxConfig, seeds: list[int], alignments: list[float], noise_levels: list[float],
               budgets: list[int], reuse: list[dict] = (), progress=None) -> list[dict]:
    """Evolution (routing only) and gradient on aligned adapters at every (alignment, adapter noise,
    budget) and seed: the map of where evolving the routing pays.

    Rows of ``reuse`` (e.g. the alignment sweep, run at ``cfg.adapter_noise`` and the full budget) with
    the same (alignment, noise, budget, optimiser, seed) are identical computations and are taken
    as they are. Every returned row has ``regime = "aligned"``.
    """
    done = {_map_key(r["alignment"], r["adapter_noise"], r["budget_evals"], r["optimiser"], r["seed"]): r
            for r in reuse if r["regime"] in ("aligned", "prealigned", "misaligned")}
    cells = [(al, nl, bu, o, s) for bu in budgets for nl in noise_levels for al in alignments
             for o in MAP_OPTIMISERS for s in seeds]
    iterator = progress(cells, desc="region map") if progress else cells
    rows = []
    for al, nl, bu, o, s in iterator:
        row = done.get(_map_key(al, nl, bu, o, s))
        if row is None:
            row = run_sandbox_cell(dataclasses.replace(cfg, adapter_noise=nl, budget_evals=bu), "aligned", o, s,
                           alignment=al)
        rows.append(dict(row, regime="aligned"))
    return rows


def run_experiment(cfg: RoutingSandboxConfig, seeds: list[int], alignments: list[float], noise_levels: list[float],
                   map_alignments: list[float] | None = None, progress=None) -> dict[str, list[dict]]:
    """The notebook's experiments: the regime grid, the alignment sweep and the region map.

    The sweep's end points (0 and 1) are the grid's misaligned / pre-aligned cells (identical by
    construction) and are reused; so are the map's cells at ``cfg.adapter_noise`` and the full
    budget. The noise and budget sweeps are slices of the map at alignment 1 (labelled
    ``prealigned``): at the full budget, and at ``cfg.adapter_noise``.
    """
    grid = regime_grid(cfg, seeds, progress)
    interior = [al for al in alignments if 0.0 < al < 1.0]
    sweep = alignment_sweep(cfg, seeds, interior, progress=progress)
    sweep += [dict(r, regime="aligned") for r in grid if r["regime"] in ("prealigned", "misaligned")
              and (r["alignment"] in alignments)]
    budgets = map_budgets(cfg)
    levels = sorted(set(noise_levels) | {cfg.adapter_noise})
    region = region_map(cfg, seeds, map_alignments or alignments, levels, budgets, reuse=sweep, progress=progress)
    top = [dict(r, regime="prealigned") for r in region if r["alignment"] == 1.0]
    noise = [r for r in top if r["budget_evals"] == cfg.budget_evals]
    budget = [r for r in top if r["adapter_noise"] == cfg.adapter_noise]
    return {"grid": grid, "sweep": sweep, "noise": noise, "budget": budget, "map": region}


def summary_table(rows: list[dict], by: tuple[str, ...],
                  metrics: tuple[str, ...] = ("excess_loss", "excess_loss_normalised", "routing_accuracy",
                                              "routing_accuracy_relabelled", "function_evals", "wall_s"),
                  ) -> list[dict[str, Any]]:
    """Mean and 95% t-interval across seeds of each metric, per group of ``by`` (flat rows)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, members in groups.items():
        row = dict(zip(by, key)) | {"seeds": len(members)}
        for m in metrics:
            mean, low, high = stats.mean_ci([r[m] for r in members])
            row |= {m: mean, f"{m}_low": low, f"{m}_high": high}
        out.append(row)
    return out


def evo_minus_grad(rows: list[dict], regime: str, evo: str = "evolution",
                   key: str = "excess_loss") -> dict[str, float]:
    """Paired (by seed) difference evo - gradient of ``key`` in one regime: mean, 95% t-interval, p."""
    def by_seed(opt: str) -> dict[int, float]:
        return {r["seed"]: r[key] for r in rows if r["regime"] == regime and r["optimiser"] == opt}
    e, g = by_seed(evo), by_seed("gradient")
    seeds = sorted(set(e) & set(g))
    if not seeds:
        raise ValueError(f"no paired seeds for regime {regime!r} and optimisers {evo!r}, 'gradient'")
    return stats.paired_difference([e[s] for s in seeds], [g[s] for s in seeds])


def claim_check(grid: list[dict], reading: str = "routing-only") -> dict[str, Any]:
    """Does paper B's B3 claim hold on the regime grid? Rule, decided before looking at numbers:

    "Evolution on routing helps" in a regime when the 95% interval of (evo - gradient) excess loss lies
    below 0; "underperforms, ties or degrades" when it does not. The claim holds when evo helps in the
    pre-aligned regime and in none of the others. ``reading="routing-only"`` (the primary one): evo =
    CMA-ES on the routing only for pre-aligned, random and misaligned adapters, and the hybrid for
    co-trained adapters (learned while evolving; routing-only search over LoRA-initialised adapters,
    B = 0, cannot change anything). ``reading="hybrid"``: evo = the hybrid in every regime (the paper's
    real system evolves while its adapters learn).
    """
    if reading not in ("routing-only", "hybrid"):
        raise ValueError(f"reading = {reading!r} is not valid; valid values: ['routing-only', 'hybrid']")
    use_hybrid = {reg: reading == "hybrid" or reg == "cotrained" for reg in REGIMES}
    diffs = {reg: evo_minus_grad(grid, reg, evo="hybrid" if use_hybrid[reg] else "evolution")
             for reg in REGIMES}
    helps = {reg: bool(d["high"] < 0) for reg, d in diffs.items()}
    holds = helps["prealigned"] and not any(helps[r] for r in REGIMES if r != "prealigned")
    return {"diffs": diffs, "helps": helps, "holds": holds}


def crossing_point(alignments: np.ndarray, diff: np.ndarray) -> float | None:
    """Smallest alignment from which ``diff`` (evo - grad) stays below 0 up to alignment 1.

    The tail where evo is better is found on the grid; its left end is refined by linear interpolation
    with the grid point before it. ``0.0`` if evo is better everywhere; None if not better even at 1.
    """
    order = np.argsort(alignments)
    al, df = np.asarray(alignments, float)[order], np.asarray(diff, float)[order]
    if df[-1] >= 0:
        return None
    i = len(df) - 1
    while i > 0 and df[i - 1] < 0:
        i -= 1
    if i == 0:
        return float(al[0])
    x0, x1, y0, y1 = al[i - 1], al[i], df[i - 1], df[i]
    return float(x0 + (x1 - x0) * y0 / (y0 - y1))


def alignment_boundary(rows: list[dict], evo: str = "evolution", bootstrap: int = 2000, seed: int = 0,
                       key: str = "excess_loss") -> dict[str, Any]:
    """Where evolution starts paying: the crossing of the seed-mean curve of ``evo`` - gradient ``key``.

    Estimate: the :func:`crossing_point` of the mean over seeds of (evo - grad) at each alignment.
    Interval: 2.5/97.5 percentiles of the same estimate over ``bootstrap`` resamples of seeds (with
    replacement); resamples with no crossing count as 1.0 (evo never better), and the share of them
    is reported. Also per-seed crossings, for reading the spread.
    """
    alignments = sorted({r["alignment"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    table = {(r["alignment"], r["optimiser"], r["seed"]): r[key] for r in rows}
    diff = np.array([[table[(al, evo, s)] - table[(al, "gradient", s)] for al in alignments]
                     for s in seeds])  # (seeds, alignments)
    al = np.array(alignments)
    point = crossing_point(al, diff.mean(axis=0))
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        pick = rng.integers(0, len(seeds), len(seeds))
        boots.append(crossing_point(al, diff[pick].mean(axis=0)))
    no_crossing = np.array([c is None for c in boots])
    filled = np.array([1.0 if c is None else c for c in boots])
    per_seed = [crossing_point(al, d) for d in diff]
    return {"alignment_boundary": point, "alignment_boundary_low": float(np.percentile(filled, 2.5)),
            "alignment_boundary_high": float(np.percentile(filled, 97.5)),
            "bootstrap_share_no_crossing": float(no_crossing.mean()),
            "per_seed": per_seed, "alignments": alignments, "mean_diff": diff.mean(axis=0).tolist(),
            "diff": diff.tolist()}


# --------------------------------------------------------------------------- the map's verdict
def region_table(rows: list[dict]) -> list[dict[str, Any]]:
    """Per (alignment, adapter noise, budget): evolution - gradient excess loss paired by seed, its 95%
    t-interval and the cell's outcome by the pre-stated rule: ``win`` when the interval lies below 0
    (evolution better), ``loss`` when above 0, ``tie`` otherwise (with one seed: the sign of the mean)."""
    table = {_map_key(r["alignment"], r["adapter_noise"], r["budget_evals"], r["optimiser"], r["seed"]):
             r["excess_loss"] for r in rows}
    cells = sorted({k[:3] for k in table})
    out = []
    for al, nl, bu in cells:
        seeds = sorted(k[4] for k in table if k[:3] == (al, nl, bu) and k[3] == "evolution"
                       and (al, nl, bu, "gradient", k[4]) in table)
        if not seeds:
            continue
        d = stats.paired_difference([table[(al, nl, bu, "evolution", s)] for s in seeds],
                                    [table[(al, nl, bu, "gradient", s)] for s in seeds])
        low, high = (d["mean"], d["mean"]) if len(seeds) < 2 else (d["low"], d["high"])
        outcome = "win" if high < 0 else "loss" if low > 0 else "tie"
        out.append({"alignment": al, "adapter_noise": nl, "budget_evals": bu, "seeds": len(seeds),
                    "evo_minus_grad": d["mean"], "evo_minus_grad_low": d["low"], "evo_minus_grad_high": d["high"],
                    "outcome": outcome})
    return out


def claim_region(cells: list[dict]) -> dict[str, Any]:
    """Where on the map the paper's claim ("evolving the routing pays with pre-aligned adapters") holds.

    Per budget and noise level, the win tail is the smallest alignment from which every cell up to the
    largest alignment is a win (None: no such tail). The region is summarised by its bounds: the
    smallest alignment and the largest noise of any win, and the budgets with wins. It is *monotone*
    when every win stays a win at a higher alignment and at a lower noise (same budget); only then
    does "alignment >= a and noise <= b" describe it without exceptions (per budget, a staircase).
    The claim holds somewhere when evolution wins in at least one cell at the largest alignment and
    in none at the smallest.
    """
    if not cells:
        raise ValueError("claim_region needs at least one map cell (region_table of an empty map?)")
    wins = [c for c in cells if c["outcome"] == "win"]
    alignments = sorted({c["alignment"] for c in cells})
    budgets = sorted({c["budget_evals"] for c in cells})
    levels = sorted({c["adapter_noise"] for c in cells})
    outcome = {(c["alignment"], c["adapter_noise"], c["budget_evals"]): c["outcome"] for c in cells}
    tails: dict[int, dict[float, float | None]] = {}
    for bu in budgets:
        tails[bu] = {}
        for nl in levels:
            start = None
            for al in reversed(alignments):
                if outcome.get((al, nl, bu)) != "win":
                    break
                start = al
            tails[bu][nl] = start
    win_keys = {(c["alignment"], c["adapter_noise"], c["budget_evals"]) for c in wins}
    monotone = all((al2, nl2, bu) in win_keys
                   for al, nl, bu in win_keys for al2 in alignments for nl2 in levels
                   if al2 >= al and nl2 <= nl and (al2, nl2, bu) in outcome)
    return {
        "cells": len(cells), "wins": len(wins),
        "win_fraction": len(wins) / len(cells),
        "loss_fraction": sum(c["outcome"] == "loss" for c in cells) / len(cells),
        "min_alignment": min((c["alignment"] for c in wins), default=None),
        "max_noise": max((c["adapter_noise"] for c in wins), default=None),
        "budgets_with_wins": sorted({c["budget_evals"] for c in wins}),
        "monotone": monotone,
        "win_tails": tails,
        "holds_somewhere": any(c["alignment"] == alignments[-1] for c in wins)
                           and not any(c["alignment"] == alignments[0] for c in wins),
    }


def region_sentence(region: dict[str, Any]) -> str:
    """The map's verdict in words, generated from :func:`claim_region` (no number typed by hand)."""
    if not region["wins"]:
        return (f"evolution (CMA-ES on the routing) beats gradient in none of the {region['cells']} cells of "
                "the map (alignment x adapter noise x budget): the paper's claim holds nowhere here")
    parts = []
    for bu, tails in region["win_tails"].items():
        found = [f"noise {nl:g}: alignment >= {start:g}" for nl, start in tails.items() if start is not None]
        if found:
            parts.append(f"at {bu} evaluations " + ", ".join(found))
    shape = ("the region is monotone (higher alignment and lower noise keep a win)" if region["monotone"]
             else "the region is not monotone (a win has a tie or a loss at a higher alignment or a lower noise)")
    return (f"evolution (CMA-ES on the routing) beats gradient in {region['wins']} of {region['cells']} cells "
            f"({region['win_fraction']:.0%}), only where alignment >= {region['min_alignment']:g} and adapter "
            f"noise <= {region['max_noise']:g}, at budgets {region['budgets_with_wins']}; win tails: "
            + ("; ".join(parts) if parts else "none reach the largest alignment") + f"; {shape}")


def config_dict(cfg: RoutingSandboxConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
