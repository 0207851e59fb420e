"""The two routers of paper B, both causal: R0 (softmax over embedding means) and R1 (sigmoid gates).

R0, the "old" router: a linear map of the causal prefix mean of the token embeddings (scaled by
``input_scale``), softmax over the S slots: zero-sum weights (they sum to 1).
R1, the "new" router: an independent sigmoid gate per slot, with a learnable per-slot floor bounded
in [floor_min, floor_max] and a temperature annealed linearly from t_start to t_end over
anneal_steps (and clamped to that interval), fed the causal prefix mean of the post-stack hidden
states of the frozen substrate from a first, adapter-free pass (two passes, as X-LoRA does):

    gate_s = floor_s + (1 - floor_s) * sigmoid(logit_s / T)

Causality: the weights at position t depend on tokens 0..t only (prefix means; the substrate's
attention is causal), so no gate sees the token it helps to predict or any later one.

The gate-magnitude confound (docs/prior_measurements.md#gate-magnitude-confound): softmax weights sum to 1, while S independent sigmoid
gates start near S/2 = 8. We NORMALISE: by default (``gate_norm="init_mass"``) R1's gates are
multiplied by the constant 1 / (S * g0), g0 the gate value at initialisation, so both routers start
with total weight 1 and the same learning rate applies to both arms; the gates stay independent
(not zero-sum) and the total may drift in [S*floor_min, S] / (S * g0). ``"none"`` uses raw gates;
``"sum"`` divides by the per-token sum (that makes R1 zero-sum again). Departures: the paper states
neither where the pooling happens nor its floor/temperature values; ours are parameters.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from copes_lib.config import Config, ConfigError, param


@dataclasses.dataclass(frozen=True)
class RouterConfig(Config):
    """Which router, and its knobs."""

    kind: str = param("r0", "r0 = softmax over embedding prefix means; r1 = sigmoid gates on hidden states",
                      choices=("r0", "r1"))
    input_scale: float = param(1.0, "multiplier on the router's pooled input (collapse-map knob)", gt=0)
    floor_min: float = param(0.0, "R1: lower bound of the learnable per-slot gate floor, in [0, 1)", ge=0, lt=1)
    floor_max: float = param(0.1, "R1: upper bound of the learnable per-slot gate floor, in [0, 1)", ge=0, lt=1)
    t_start: float = param(2.0, "R1: temperature at step 0", gt=0)
    t_end: float = param(0.5, "R1: temperature after the anneal (bounded: T stays between t_start and t_end)",
                         gt=0)
    anneal_steps: int = param(400, "R1: steps of the linear temperature anneal", ge=1)
    gate_norm: str = param("init_mass", "R1: gate normalisation against the magnitude confound",
                           choices=("init_mass", "none", "sum"))

    def check(self) -> None:
        if self.floor_min > self.floor_max:
            raise ConfigError(f"RouterConfig.floor_min = {self.floor_min} must be <= floor_max = {self.floor_max}")


def causal_prefix_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of x[:, :t+1] at every position t (batch, seq, dim): the causal pooling of both routers."""
    counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
    return x.cumsum(dim=1) / counts


class SoftmaxRouter(nn.Module):
    """R0: softmax(W * input_scale * prefix_mean(embeddings) + b) over S slots."""

    kind = "r0"

    def __init__(self, d_model: int, n_slots: int, cfg: RouterConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(d_model, n_slots)
        _seeded_init(self.proj, seed)

    def features(self, model: nn.Module, pool, ids: torch.Tensor) -> torch.Tensor:
        """Pooled router input: causal prefix mean of the substrate's token embeddings."""
        with torch.no_grad():
            return causal_prefix_mean(model.get_input_embeddings()(ids))

    def forward(self, features: torch.Tensor, step: int = 0) -> torch.Tensor:
        return torch.softmax(self.proj(features * self.cfg.input_scale), dim=-1)

    def gate_mass(self, weights: torch.Tensor) -> torch.Tensor:
        """Per-token gate values as proportions (rows sum to 1), for shares and entropy."""
        return weights


class SigmoidRouter(nn.Module):
    """R1: independent sigmoid gates with a learnable bounded floor and a bounded temperature anneal."""

    kind = "r1"

    def __init__(self, d_model: int, n_slots: int, cfg: RouterConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(d_model, n_slots)
        _seeded_init(self.proj, seed)
        self.floor_logit = nn.Parameter(torch.zeros(n_slots))  # floor starts at the middle of its bounds
        g0 = self._floor().detach() + (1 - self._floor().detach()) * 0.5
        self.register_buffer("norm", 1.0 / (n_slots * g0.mean()))

    def _floor(self) -> torch.Tensor:
        return self.cfg.floor_min + (self.cfg.floor_max - self.cfg.floor_min) * torch.sigmoid(self.floor_logit)

    def temperature(self, step: int) -> float:
        c = self.cfg
        t = c.t_start + (c.t_end - c.t_start) * min(1.0, step / c.anneal_steps)
        return min(max(t, min(c.t_start, c.t_end)), max(c.t_start, c.t_end))

    def features(self, model: nn.Module, pool, ids: torch.Tensor) -> torch.Tensor:
        """First pass, adapters off: causal prefix mean of the post-stack (final-norm) hidden states."""
        with torch.no_grad(), pool.gated(None):
            hidden = model.model(input_ids=ids).last_hidden_state
        return causal_prefix_mean(hidden)

    def gates(self, features: torch.Tensor, step: int = 0) -> torch.Tensor:
        floor = self._floor()
        logits = self.proj(features * self.cfg.input_scale) / self.temperature(step)
        return floor + (1 - floor) * torch.sigmoid(logits)

    def forward(self, features: torch.Tensor, step: int = 0) -> torch.Tensor:
        gates = self.gates(features, step)
        if self.cfg.gate_norm == "init_mass":
            return gates * self.norm
        if self.cfg.gate_norm == "sum":
            return gates / gates.sum(dim=-1, keepdim=True)
        return gates

    def gate_mass(self, weights: torch.Tensor) -> torch.Tensor:
        return weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def _seeded_init(linear: nn.Linear, seed: int) -> None:
    # Small weights, zero bias: every slot starts with (nearly) the same weight, no slot favoured.
    generator = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * 0.02)
        linear.bias.zero_()


def make_router(cfg: RouterConfig, d_model: int, n_slots: int, seed: int = 0) -> nn.Module:
    """R0 or R1 by ``cfg.kind``. Both take ``features(model, pool, ids)`` then ``forward(features, step)``."""
    if cfg.kind == "r0":
        return SoftmaxRouter(d_model, n_slots, cfg, seed)
    return SigmoidRouter(d_model, n_slots, cfg, seed)


def router_rows(router: nn.Module):
    """(parameter, slot dimension) pairs: the per-slot rows copied on slot reallocation."""
    yield router.proj.weight, 0
    yield router.proj.bias, 0
    if isinstance(router, SigmoidRouter):
        yield router.floor_logit, 0
