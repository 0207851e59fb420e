"""Parameters of the paper-B notebooks 10-13. Defaults are the cpu profile's values.

Notebooks 11 and 12 share :class:`MoloraCellParams`, so a cell with equal settings (e.g. notebook
11's R0 run and notebook 12's B3 cell at seed SEED) is the same cache entry and runs once.
Both use the substrate notebook 10 builds under the same profile
(:func:`copes_lib.protocols.paper_b.molora_cells.substrate_for_profile`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from copes_lib.config import ConfigError, NotebookParams, param
from copes_lib.molora.adapt import CellConfig
from copes_lib.molora.lifecycle import LifecycleConfig
from copes_lib.molora.lm import SubstrateConfig
from copes_lib.molora.pool import PoolConfig
from copes_lib.molora.routers import RouterConfig
from copes_lib.molora.sandbox import RoutingSandboxConfig


def _check_device(device: str) -> None:
    if not (device == "cpu" or device == "mps" or device.startswith("cuda")):
        raise ConfigError(f"DEVICE = {device!r} is not valid; use 'cpu', 'cuda', 'cuda:N' or 'mps'")


@dataclass(frozen=True)
class MoloraSubstrateParams(NotebookParams):
    """10_molora_substrate: corpus, tokenizer, widened substrate pre-training."""

    NOTEBOOK = "10_molora_substrate"

    CORPUS_SOURCE: str = param("debian", "debian: fetch and clean real text via apt-get download; "
                                         "sample: the committed sample (offline)", choices=("debian", "sample"))
    MAX_CHARS_PER_DOMAIN: int = param(2_000_000, "character budget per domain (0: everything)", ge=0)
    VOCAB_SIZE: int = param(4096, "byte-level BPE vocabulary (paper: 32,000)", ge=300)
    D_MODEL: int = param(256, "hidden size (paper: 1536)", ge=8)
    N_LAYERS: int = param(2, "decoder layers (paper: likely 3-4)", ge=1)
    N_HEADS: int = param(4, "attention heads", ge=1)
    N_KV_HEADS: int = param(2, "key/value heads", ge=1)
    INTERMEDIATE: int = param(768, "MLP width", ge=8)
    SEQ_LEN: int = param(128, "tokens per window", ge=8)
    BATCH_PER_DOMAIN: int = param(4, "sequences per domain per batch", ge=1)
    STEPS: int = param(800, "pre-training steps", ge=1)
    LR: float = param(2e-3, "AdamW peak learning rate", gt=0)
    WARMUP: int = param(50, "warm-up steps", ge=0)
    EVAL_WINDOWS: int = param(64, "test windows per domain", ge=1)
    DEVICE: str = param("cpu", "torch device: cpu, cuda, cuda:N (the gpu profile sets cuda)")

    def check(self) -> None:
        _check_device(self.DEVICE)

    def substrate_config(self) -> SubstrateConfig:
        return SubstrateConfig(
            corpus_source=self.CORPUS_SOURCE, max_chars_per_domain=self.MAX_CHARS_PER_DOMAIN,
            vocab_size=self.VOCAB_SIZE, d_model=self.D_MODEL, n_layers=self.N_LAYERS, n_heads=self.N_HEADS,
            n_kv_heads=self.N_KV_HEADS, intermediate=self.INTERMEDIATE, seq_len=self.SEQ_LEN,
            batch_per_domain=self.BATCH_PER_DOMAIN, steps=self.STEPS, lr=self.LR, warmup=self.WARMUP,
            eval_windows=self.EVAL_WINDOWS, seed=self.SEED)


@dataclass(frozen=True)
class MoloraCellParams(NotebookParams):
    """Settings shared by every adapter cell of notebooks 11 and 12."""

    STEPS: int = param(300, "adapter steps per cell (paper: 25,000)", ge=1)
    N_SLOTS: int = param(16, "LoRA slots (paper: 16)", ge=2)
    RANK: int = param(8, "LoRA rank per slot", ge=1)
    LORA_ALPHA: float = param(16.0, "LoRA alpha (update scaled by alpha / rank)", gt=0)
    TARGETS: str = param("q_proj,v_proj,up_proj,down_proj", "targeted linear layers")
    LR: float = param(1e-3, "AdamW learning rate of the pool", gt=0)
    ROUTER_LR: float = param(1e-3, "AdamW learning rate of the router", gt=0)
    BATCH_PER_DOMAIN: int = param(4, "sequences per domain per batch", ge=1)
    LOG_EVERY: int = param(25, "steps between gate-share records", ge=1)
    EVAL_WINDOWS: int = param(64, "test windows per domain for the final balanced log-PPL", ge=1)
    FLOOR_MIN: float = param(0.0, "R1 floor lower bound, in [0, 1)", ge=0, lt=1)
    FLOOR_MAX: float = param(0.1, "R1 floor upper bound, in [0, 1)", ge=0, lt=1)
    T_START: float = param(2.0, "R1 temperature at step 0", gt=0)
    T_END: float = param(0.5, "R1 temperature at the end of the anneal (over STEPS)", gt=0)
    GATE_NORM: str = param("init_mass", "R1 gate normalisation against the magnitude confound",
                           choices=("init_mass", "none", "sum"))
    DEVICE: str = param("cpu", "torch device: cpu, cuda, cuda:N (the gpu profile sets cuda)")

    def check(self) -> None:
        _check_device(self.DEVICE)
        if self.FLOOR_MIN > self.FLOOR_MAX:
            raise ConfigError(f"FLOOR_MIN = {self.FLOOR_MIN} must be <= FLOOR_MAX = {self.FLOOR_MAX}")

    def cell(self, router: str, scope: str = "e0", use_lifecycle: bool = False, seed: int | None = None,
             life: LifecycleConfig | None = None, **overrides) -> CellConfig:
        """The CellConfig of one cell; ``overrides`` replace CellConfig/RouterConfig fields by name."""
        router_fields = {f.name for f in dataclasses.fields(RouterConfig)}
        router_over = {k: overrides.pop(k) for k in list(overrides) if k in router_fields}
        router_cfg = RouterConfig(kind=router, floor_min=self.FLOOR_MIN, floor_max=self.FLOOR_MAX,
                                  t_start=self.T_START, t_end=self.T_END, anneal_steps=self.STEPS,
                                  gate_norm=self.GATE_NORM, **router_over)
        values = dict(
            pool=PoolConfig(n_slots=self.N_SLOTS, rank=self.RANK, alpha=self.LORA_ALPHA, targets=self.TARGETS),
            router=router_cfg, scope=scope, use_lifecycle=use_lifecycle, steps=self.STEPS, lr=self.LR,
            router_lr=self.ROUTER_LR, batch_per_domain=self.BATCH_PER_DOMAIN, log_every=self.LOG_EVERY,
            eval_windows=self.EVAL_WINDOWS, seed=self.SEED if seed is None else seed)
        if life is not None:
            values["life"] = life
        values.update(overrides)
        if "steps" in overrides:  # the anneal always spans the run
            values["router"] = dataclasses.replace(router_cfg, anneal_steps=overrides["steps"])
        return CellConfig(**values)


@dataclass(frozen=True)
class MoloraRouterParams(MoloraCellParams):
    """11_molora_router: R0 vs R1 gate dynamics and the R0 collapse map."""

    NOTEBOOK = "11_molora_router"

    MAP_STEPS: int = param(150, "adapter steps of each collapse-map run", ge=1)
    MAP_ROUTER_LR_MULTIPLIERS: str = param("1,30,167", "collapse map: router learning rate x ROUTER_LR "
                                                       "(167: 25,000 / MAP_STEPS, the AdamW distance of the "
                                                       "paper's steps; docs/molora_regime.md#m3-the-map)")
    MAP_INPUT_SCALES: str = param("1,10,100", "collapse map: multipliers on the R0 embedding-mean input")
    LONG_STEPS_MULTIPLIER: int = param(2, "collapse map: one extra R0 run this many times longer "
                                          "(training-length axis)", ge=1)

    def check(self) -> None:
        super().check()
        for name in ("MAP_ROUTER_LR_MULTIPLIERS", "MAP_INPUT_SCALES"):
            try:
                values = self.floats(name)
            except ValueError as err:
                raise ConfigError(f"{name} = {getattr(self, name)!r} must be comma-separated numbers") from err
            if not values or min(values) <= 0:
                raise ConfigError(f"{name} = {getattr(self, name)!r} must list positive numbers")

    def floats(self, name: str) -> list[float]:
        return [float(v) for v in getattr(self, name).split(",") if v.strip()]


@dataclass(frozen=True)
class MoloraFactorialParams(MoloraCellParams):
    """12_molora_factorial: the chain B3, +R, +R+E, +R+E+L, one off-chain cell, paired t-tests."""

    NOTEBOOK = "12_molora_factorial"

    N_SEEDS: int = param(3, "seeds per cell (paper: 3); seeds are SEED, SEED+1, ...", ge=2)
    EVOLVE_EVERY: int = param(50, "M: adapter steps between evolution events", ge=1)
    FITNESS_WINDOWS: int = param(4, "validation windows per domain for leave-one-out fitness", ge=1)
    DEATHS: int = param(2, "slots culled per evolution event", ge=1)
    GRACE_STEPS: int = param(100, "minimum age (steps) before a slot may die", ge=0)
    INHERIT_ALPHA: float = param(0.5, "alpha of the blend of a dying slot into its neighbour", ge=0, le=1)
    MUTATION_SCALE: float = param(0.1, "relative SVD-mutation noise", ge=0)
    REALLOC_NOISE: float = param(0.1, "router-row copy noise (x row std)", ge=0)
    ALPHA0_COUNTERFACTUAL: bool = param(False, "also run +R+E+L with inheritance alpha 0 (the paper "
                                               "counterfactual); off in cpu for time")
    COLLAPSE_ROUTER_LR_X: float = param(30.0, "collapsing setting of the second router contrast: router "
                                              "learning rate x ROUTER_LR, both routers "
                                              "(docs/molora_regime.md#m4-the-router-contrast-in-a-collapsing-setting)",
                                        gt=0)
    COLLAPSE_INPUT_SCALE: float = param(100.0, "collapsing setting: multiplier on R0's embedding-mean input "
                                               "(R1 keeps its hidden-state input at scale 1)", gt=0)

    def check(self) -> None:
        super().check()
        if self.DEATHS >= self.N_SLOTS:
            raise ConfigError(f"DEATHS = {self.DEATHS} must be smaller than N_SLOTS = {self.N_SLOTS}")

    def collapsing_cell(self, router: str, seed: int) -> CellConfig:
        """B3 (collapsing) or +R (collapsing): no lifecycle, the router learning rate x COLLAPSE_ROUTER_LR_X,
        R0's input x COLLAPSE_INPUT_SCALE (R1's hidden-state input is not R0's, so it keeps scale 1)."""
        scale = self.COLLAPSE_INPUT_SCALE if router == "r0" else 1.0
        return self.cell(router, "e0", False, seed=seed, router_lr=self.ROUTER_LR * self.COLLAPSE_ROUTER_LR_X,
                         input_scale=scale)

    def life(self, inherit_alpha: float | None = None) -> LifecycleConfig:
        return LifecycleConfig(deaths=self.DEATHS, grace_steps=self.GRACE_STEPS,
                               inherit_alpha=self.INHERIT_ALPHA if inherit_alpha is None else inherit_alpha,
                               mutation_scale=self.MUTATION_SCALE, realloc_noise=self.REALLOC_NOISE)


@dataclass(frozen=True)
class SandboxNotebookParams(NotebookParams):
    """Parameters of notebooks/13_molora_sandbox.ipynb (defaults = the cpu profile)."""

    NOTEBOOK = "13_molora_sandbox"

    NUM_SEEDS: int = param(5, "seeds per cell (problem, adapters and optimiser all reseeded)", ge=1)
    NUM_TASKS: int = param(4, "number of tasks T, also the number of adapter slots", ge=2)
    INPUT_DIM: int = param(24, "input dimension; at least T * (1 + 2 * RANK)", ge=2)
    HIDDEN_DIM: int = param(32, "hidden width of the frozen substrate", ge=2)
    RANK: int = param(2, "rank of true deltas and adapters", ge=1)
    TRAIN_PER_TASK: int = param(128, "training inputs per task", ge=4)
    TEST_PER_TASK: int = param(256, "test inputs per task", ge=4)
    ADAPTER_NOISE: float = param(0.1, "relative noise on pre-aligned adapters", ge=0.0)
    BUDGET_EVALS: int = param(3000, "function evaluations per run (a gradient step costs 3)", ge=30)
    GRAD_LR: float = param(1e-2, "Adam learning rate of gradient descent", gt=0.0)
    CMA_SIGMA0: float = param(1.0, "CMA-ES initial step size", gt=0.0)
    HYBRID_GRAD_STEPS: int = param(4, "adapter steps per CMA-ES generation in the hybrid", ge=1)
    ALIGNMENT_POINTS: int = param(9, "alignment values in the sweep, evenly spaced over [0, 1]", ge=2)
    NOISE_POINTS: int = param(3, "pre-aligned adapter noise levels, evenly spaced over [0, ADAPTER_NOISE]",
                              ge=2)
    BOOTSTRAP: int = param(2000, "bootstrap resamples of seeds for the boundary's interval", ge=100)
    DEVICE: str = param("cpu", "torch device")

    def sandbox_config(self) -> RoutingSandboxConfig:
        return RoutingSandboxConfig(
            num_tasks=self.NUM_TASKS, input_dim=self.INPUT_DIM, hidden_dim=self.HIDDEN_DIM, rank=self.RANK,
            train_per_task=self.TRAIN_PER_TASK, test_per_task=self.TEST_PER_TASK,
            adapter_noise=self.ADAPTER_NOISE, budget_evals=self.BUDGET_EVALS, grad_lr=self.GRAD_LR,
            cma_sigma0=self.CMA_SIGMA0, hybrid_grad_steps=self.HYBRID_GRAD_STEPS, device=self.DEVICE,
        )

    def check(self) -> None:
        self.sandbox_config()  # surfaces cross-field errors (input_dim, budget) at load time

    @property
    def seeds(self) -> list[int]:
        return [self.SEED + i for i in range(self.NUM_SEEDS)]

    @property
    def alignments(self) -> list[float]:
        return [round(float(v), 6) for v in np.linspace(0.0, 1.0, self.ALIGNMENT_POINTS)]

    @property
    def noise_levels(self) -> list[float]:
        return [round(float(v), 6) for v in np.linspace(0.0, self.ADAPTER_NOISE, self.NOISE_POINTS)]
