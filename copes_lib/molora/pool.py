"""A pool of S LoRA slots ("experts") on a frozen decoder, run as stacked tensors, exportable to PEFT.

Paper B has 16 LoRA slots on a frozen substrate, mixed by a router. Each slot spans every targeted
linear layer of every block (a slot is one whole LoRA adapter). For a target layer with weight W
(out x in) the pool holds ``A`` of shape (in, S, r) and ``B`` of shape (S, r, out); with per-token
mixing weights w (tokens x S) the layer computes

    y = x W^T + scaling * ((x A.view(in, S*r)) * w.repeat_interleave(r)) B.view(S*r, out)

i.e. two matrix products for all S slots together (no Python loop over slots). Slot s alone, with a
one-hot weight, is the standard LoRA update ``scaling * B_s^T A_s^T`` (peft's lora_B @ lora_A), which
is what :func:`export_peft` writes. Initialisation as in LoRA/peft: A Kaiming-uniform, B zero.

The pool attaches to the substrate with forward hooks (the substrate's modules stay untouched and
frozen); the mixing weights for the next forward are set with ``with pool.gated(weights): ...``
(``None`` = adapters off, used for the router's first pass). Departure: the paper does not say which
layers its adapters target or their rank; ours are parameters (default rank 8 on q, v, up, down).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path

import torch
from torch import nn

from copes_lib.config import Config, ConfigError, param


@dataclasses.dataclass(frozen=True)
class PoolConfig(Config):
    """Shape of the adapter pool."""

    n_slots: int = param(16, "number of LoRA slots (paper: 16)", ge=1)
    rank: int = param(8, "LoRA rank r of every slot (paper: not stated)", ge=1)
    alpha: float = param(16.0, "LoRA alpha; the update is scaled by alpha / rank as in peft", gt=0)
    targets: str = param("q_proj,v_proj,up_proj,down_proj",
                         "comma-separated names of the targeted linear layers (paper: not stated)")

    def check(self) -> None:
        if not self.target_names:
            raise ConfigError("PoolConfig.targets must name at least one linear layer, e.g. 'q_proj,v_proj'")

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.targets.split(",") if t.strip())

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def target_modules(model: nn.Module, targets: tuple[str, ...]) -> dict[str, nn.Linear]:
    """{qualified name: nn.Linear} of the decoder-block linears whose last name part is in ``targets``."""
    found = {name: mod for name, mod in model.named_modules()
             if isinstance(mod, nn.Linear) and name.split(".")[-1] in targets and ".layers." in f".{name}"}
    missing = set(targets) - {name.split(".")[-1] for name in found}
    if missing:
        valid = sorted({n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(f"PoolConfig.targets {sorted(missing)} match no linear layer; valid names: {valid}")
    return found


class AdapterPool(nn.Module):
    """S stacked LoRA slots hooked onto the target linears of ``model`` (which stays frozen).

    Usage (``weights``: (batch, seq, 16), e.g. a router's output)::

        pool = AdapterPool(model, PoolConfig(n_slots=16, rank=8), seed=0)
        with pool.gated(weights):
            logits = model(input_ids=ids).logits
    """

    def __init__(self, model: nn.Module, cfg: PoolConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.modules_by_name = target_modules(model, cfg.target_names)
        ref = next(model.parameters())
        generator = torch.Generator().manual_seed(seed)
        self.keys = {}  # module name -> parameter key (ParameterDict keys may not contain dots)
        self.A, self.B = nn.ParameterDict(), nn.ParameterDict()
        for name, linear in self.modules_by_name.items():
            if cfg.rank > min(linear.in_features, linear.out_features):
                raise ConfigError(
                    f"PoolConfig.rank = {cfg.rank} is larger than layer {name} "
                    f"({linear.out_features} x {linear.in_features}); use rank <= "
                    f"{min(linear.in_features, linear.out_features)}")
            key = name.replace(".", "__")
            self.keys[name] = key
            self.A[key] = nn.Parameter(self._init_a(linear.in_features, cfg.n_slots, generator).to(ref))
            self.B[key] = nn.Parameter(torch.zeros(cfg.n_slots, cfg.rank, linear.out_features).to(ref))
        self._weights: torch.Tensor | None = None
        self._hooks = [linear.register_forward_hook(self._hook(name))
                       for name, linear in self.modules_by_name.items()]

    def _init_a(self, fan_in: int, n_slots: int, generator: torch.Generator) -> torch.Tensor:
        # peft: kaiming_uniform_(a=sqrt(5)) on lora_A, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        bound = 1.0 / math.sqrt(fan_in)
        return (torch.rand(fan_in, n_slots, self.cfg.rank, generator=generator) * 2 - 1) * bound

    # ------------------------------------------------------------------ forward
    @contextlib.contextmanager
    def gated(self, weights: torch.Tensor | None):
        """Mix the slots with per-token ``weights`` (batch, seq, S) in forwards run inside the block."""
        if weights is not None and weights.shape[-1] != self.cfg.n_slots:
            raise ValueError(f"weights have {weights.shape[-1]} slots; the pool has {self.cfg.n_slots}")
        previous, self._weights = self._weights, weights
        try:
            yield self
        finally:
            self._weights = previous

    def _hook(self, name: str):
        key = None

        def hook(module, inputs, output):
            nonlocal key
            if self._weights is None:
                return output
            key = key or self.keys[name]
            return output + self.delta(key, inputs[0], self._weights)

        return hook

    def delta(self, key: str, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The mixed LoRA update of one layer: two batched matmuls over all slots at once."""
        if weights.shape[:-1] != x.shape[:-1]:
            raise ValueError(f"gate weights {tuple(weights.shape)} do not match the layer input "
                             f"{tuple(x.shape)}: one weight vector per token is needed")
        a, b = self.A[key], self.B[key]
        n_in, n_slots, rank = a.shape
        tokens = x.reshape(-1, n_in)
        hidden = (tokens @ a.reshape(n_in, n_slots * rank)).view(-1, n_slots, rank)
        hidden = hidden * weights.reshape(-1, n_slots, 1).to(hidden.dtype)
        out = hidden.reshape(-1, n_slots * rank) @ b.reshape(n_slots * rank, -1)
        return (out * self.cfg.scaling).view(*x.shape[:-1], -1)

    def remove(self) -> None:
        """Detach the hooks: the substrate is back to its bare self."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # ------------------------------------------------------------------ per-slot views (lifecycle)
    def slot_delta(self, slot: int) -> dict[str, torch.Tensor]:
        """{module name: scaling * B_s^T A_s^T} (out x in): slot ``slot``'s full weight update."""
        return {name: self.cfg.scaling * (self.A[key][:, slot, :] @ self.B[key][slot]).T
                for name, key in self.keys.items()}

    @torch.no_grad()
    def set_slot_delta(self, slot: int, deltas: dict[str, torch.Tensor], generator: torch.Generator) -> None:
        """Write rank-r factors of ``deltas`` (truncated SVD, split as sqrt(S) on each side) into a slot.

        A zero update would leave A = B = 0, a slot no gradient can revive; such a slot gets a fresh
        LoRA initialisation instead (A random, B zero).
        """
        r = self.cfg.rank
        for name, key in self.keys.items():
            delta = deltas[name].float() / self.cfg.scaling
            u, s, vh = torch.linalg.svd(delta, full_matrices=False)
            root = s[:r].sqrt()
            if root.max() < 1e-12:
                self.A[key][:, slot, :] = self._init_a(delta.shape[1], 1, generator)[:, 0].to(self.A[key])
                self.B[key][slot] = 0.0
                continue
            self.B[key][slot] = (u[:, :r] * root).T.to(self.B[key])
            self.A[key][:, slot, :] = (root[:, None] * vh[:r]).T.to(self.A[key])

    def slot_similarity(self) -> torch.Tensor:
        """(S, S) cosine similarity of the slots' full updates (all layers concatenated)."""
        with torch.no_grad():
            flat = torch.stack([torch.cat([d.flatten() for d in self.slot_delta(s).values()])
                                for s in range(self.cfg.n_slots)])
            norms = flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
            return (flat / norms) @ (flat / norms).T

    def slot_parameters(self):
        """(parameter, slot dimension) pairs, for per-slot optimizer-state resets."""
        for key in self.A:
            yield self.A[key], 1
            yield self.B[key], 0


# --------------------------------------------------------------------------- PEFT export
def export_peft(pool: AdapterPool, slot: int, folder: str | Path) -> Path:
    """Write slot ``slot`` as a standard PEFT LoRA adapter (adapter_config.json + safetensors)."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    if not 0 <= slot < pool.cfg.n_slots:
        raise ValueError(f"slot = {slot} is out of range; valid slots: 0..{pool.cfg.n_slots - 1}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = LoraConfig(r=pool.cfg.rank, lora_alpha=pool.cfg.alpha, lora_dropout=0.0, bias="none",
                        target_modules=list(pool.cfg.target_names), task_type="CAUSAL_LM")
    config.save_pretrained(str(folder))
    tensors = {}
    for name, key in pool.keys.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = pool.A[key][:, slot, :].T.contiguous().detach().cpu()
        tensors[f"base_model.model.{name}.lora_B.weight"] = pool.B[key][slot].T.contiguous().detach().cpu()
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    (folder / "molora_slot.json").write_text(json.dumps({"slot": slot}) + "\n")
    return folder
