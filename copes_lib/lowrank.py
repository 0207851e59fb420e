"""Low-rank ES noise (EGGROLL, arXiv 2511.16652) and its population-batched forward on shared weights.

With ``ESConfig.noise_rank = r > 0`` member i's noise on a weight matrix W (out x in) is

    E_i = A_i B_i^T / sqrt(r),   A_i ~ N(0, 1)^(out x r),  B_i ~ N(0, 1)^(in x r),

replayed from the member's seed and the tensor's index (``factors``; ``noise="paper_correlated"``
drops the tensor index as the full-rank noise does). A member is theta + sigma_k E_i; the batched
forward never forms E_i: a Linear computes x W^T + sigma_k (x B_i) A_i^T / sqrt(r) per row, an
Embedding W[ids] + sigma_k A_i[ids] B_i^T / sqrt(r) (a tied lm_head is the same tensor, the same E_i).
The update is ES's own (``ES.update``): the fitness-weighted sum of the members' E_i (full rank as a
sum of N rank-r terms) accumulated chunk by chunk into the fp32 master; ``ES.noise`` returns the dense
E_i on a chunk, so perturb / restore / update / the sequential backend are the full-rank code paths.

What is perturbed (docs/lowrank_es.md#what-is-perturbed):
- the 2-D weights of ``nn.Linear`` and ``nn.Embedding`` modules (every projection of Qwen3, Llama and
  Qwen3.5, its Gated-DeltaNet in/out projections included);
- every other parameter is FROZEN in low-rank mode (RMSNorm / gated-norm weights, biases, Qwen3.5's
  depthwise conv1d, A_log, dt_bias): it gets no noise and no update. EGGROLL perturbs vectors with
  full-rank noise; freezing them keeps the batched forward to Linear/Embedding only.

CoPES x low-rank (docs/lowrank_es.md#copes-x-low-rank): in low-rank mode a chunk is a block of whole
output rows of one matrix (``max(1, chunk_size // in)`` rows; the full-rank chunks are element ranges
that may cut a row). Subspace k's noise on a matrix is E_i with the rows outside k's chunks zeroed,
i.e. A_i masked by rows: still rank <= r, still one x B_i A_i^T per member. The paper (and EGGROLL)
have no such combination; this is the suite's choice.

Departures from EGGROLL: Gaussian A, B (as the paper) but the scale 1/sqrt(r) is applied to sigma,
the update is ES's z-scored mean (the suite's, docs/paper_a_copes.md#a2-copes) not EGGROLL's
fitness shaping, vectors are frozen (above), and there is no antithetic sampling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from copes_lib.config import ConfigError


def matrix_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> module name of every 2-D weight of an nn.Linear / nn.Embedding (tied: one entry)."""
    out: dict[int, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)) and module.weight.dim() == 2:
            out.setdefault(id(module.weight), name)
    return out


def check_rank(model: nn.Module, rank: int) -> None:
    """ConfigError when ``rank`` exceeds the smaller side of some perturbed matrix."""
    names = matrix_names(model)
    matrices = [(names[id(p)], p) for p in model.parameters() if id(p) in names]
    if not matrices:
        raise ConfigError("ESConfig.noise_rank > 0 needs nn.Linear / nn.Embedding weights; this model has none "
                          "(valid: noise_rank = 0, full-rank noise)")
    smallest = min(min(p.shape) for _, p in matrices)
    for name, p in matrices:
        if rank > min(p.shape):
            raise ConfigError(
                f"ESConfig.noise_rank = {rank} exceeds min(out, in) = {min(p.shape)} of {name}.weight "
                f"{tuple(p.shape)}; valid range for this model: 0 (full-rank) or 1..{smallest}")


def row_chunks(shape: Sequence[int], chunk_size: int) -> list[tuple[int, int]]:
    """Element ranges of blocks of whole output rows of an (out x in) matrix."""
    out_f, in_f = shape
    rows = max(1, chunk_size // in_f)
    return [(a * in_f, min(a + rows, out_f) * in_f) for a in range(0, out_f, rows)]


def factors(seed: int, shape: Sequence[int], rank: int, device, generator: torch.Generator,
            out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(A (out x r), B (in x r)) of one member on one matrix, fp32, regenerated from ``seed`` (``ES``
    mixes it from the member's seed, the tensor's index and a low-rank tag); ``out``: write them there."""
    generator.manual_seed(seed)
    a_out, b_out = out if out is not None else (None, None)
    a = torch.randn(shape[0], rank, generator=generator, device=device, dtype=torch.float32, out=a_out)
    b = torch.randn(shape[1], rank, generator=generator, device=device, dtype=torch.float32, out=b_out)
    return a, b


def dense_noise(a: torch.Tensor, b: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """E = A B^T / sqrt(r) on the element range [start, stop) of whole rows, flattened."""
    in_f = b.shape[0]
    return (a[start // in_f: stop // in_f] @ b.T).div_(math.sqrt(a.shape[1])).view(-1)


class LowRankPopulation:
    """Context manager that makes ``model`` evaluate G low-rank members at once on its shared weights.

    ``factors`` maps id(weight) -> (A (G, out, r), B (G, in, r)), member g's factors with the rows
    outside its subspace already zeroed in A; ``scale`` = sigma_k / sqrt(r). Only the Linear and
    Embedding modules whose weight is in ``factors`` are patched; the rollout's ``row_hook(rows)``
    (original row indices, called before every forward, also per row group inside Qwen3.5's row-exact
    linear attention) says which member each row belongs to: ``row // rows_per_member``.
    """

    def __init__(self, model: nn.Module, factors: dict[int, tuple[torch.Tensor, torch.Tensor]], scale: float,
                 rows_per_member: int):
        self.model, self.factors, self.scale, self.rows_per_member = model, factors, scale, rows_per_member
        self.modules = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))
                        and id(m.weight) in factors]
        self.members: torch.Tensor | None = None
        self.blocks: tuple[torch.Tensor | None, int] | None = None  # (members of the call or None: all, rows each)
        self.group = len(next(iter(factors.values()))[0]) if factors else 0
        self._device_members: dict[torch.device, torch.Tensor] = {}

    def row_hook(self, rows: list[int]) -> None:
        members = [r // self.rows_per_member for r in rows]
        self.members = torch.as_tensor(members, dtype=torch.long)
        self._device_members = {}
        # the common case: rows member-major, every member of the call with the same count c of rows;
        # then x is viewed as (members, c rows, ...) and only those members' factors are read (no gather
        # of one factor copy per row); all G members in order: the stacked factors themselves
        self.blocks = None
        c = members.count(members[0]) if members else 0
        if c and len(members) % c == 0:
            firsts = members[::c]
            if members == [m for m in firsts for _ in range(c)] and len(set(firsts)) == len(firsts):
                self.blocks = (None if firsts == list(range(self.group)) else torch.as_tensor(firsts), c)

    def __enter__(self) -> LowRankPopulation:
        for module in self.modules:
            module.forward = (self._linear_forward(module) if isinstance(module, nn.Linear)
                              else self._embedding_forward(module))
        return self

    def __exit__(self, *exc) -> None:
        for module in self.modules:
            del module.forward
        self.members = None

    def _rows(self, batch: int, device) -> torch.Tensor:
        if self.members is None or len(self.members) != batch:
            raise RuntimeError(
                f"LowRankPopulation: a forward call with batch {batch} came without a matching row_hook(rows) "
                f"(last rows: {None if self.members is None else len(self.members)}); the rollout must call "
                "row_hook before every forward")
        if device not in self._device_members:
            self._device_members[device] = self.members.to(device)
        return self._device_members[device]

    def _linear_forward(self, module: nn.Linear):
        a_all, b_all = self.factors[id(module.weight)]
        # once per step, so bmm reads them without a copy per call: A as (G, r, out); B as (G, r, in),
        # read through its transpose: x B_i as bmm(x, (B_i^T)^T) ran 2.8-3.9x faster than with B_i
        # stored (in, r) (one thread, 40 members, 1 and 64 tokens, in = 160 and 480; a few rows per
        # member made that product a fifth of a patched Linear's time)
        a_t = a_all.transpose(1, 2).contiguous()
        b_t = b_all.transpose(1, 2).contiguous()

        def forward(x: torch.Tensor) -> torch.Tensor:
            members = self._rows(x.shape[0], x.device)
            base = F.linear(x, module.weight, module.bias)
            if self.blocks is not None:
                pick, c = self.blocks
                a, b = (a_t, b_t) if pick is None else (a_t[pick.to(x.device)], b_t[pick.to(x.device)])
                xs = x.reshape(len(a), -1, x.shape[-1])  # (members, c rows x tokens, in)
            else:  # rows in any order: one factor copy per row
                a, b = a_t[members], b_t[members]
                xs = x.reshape(x.shape[0], -1, x.shape[-1])  # (rows, tokens, in)
            if b.dtype != x.dtype:  # a comparison, not a dispatched no-op .to() per call
                a, b = a.to(x.dtype), b.to(x.dtype)
            xb = torch.bmm(xs, b.transpose(1, 2))  # x B_i: (., ., r)
            # (x B_i) A_i^T added into the base output in one fused call: the delta's small ops cost more
            # than the base matmul at a few rows per member (profiled: docs/lowrank_es.md#l3-measured)
            base.view(xb.shape[0], xb.shape[1], -1).baddbmm_(xb, a, alpha=self.scale)
            return base

        return forward

    def _embedding_forward(self, module: nn.Embedding):
        a_all, b_all = self.factors[id(module.weight)]
        b_t = b_all.transpose(1, 2).contiguous()  # (G, r, dim)

        def forward(ids: torch.Tensor) -> torch.Tensor:
            members = self._rows(ids.shape[0], ids.device)
            base = F.embedding(ids, module.weight, module.padding_idx)
            flat = ids.reshape(ids.shape[0], -1)
            a_rows = a_all[members.unsqueeze(1), flat].to(base.dtype)  # (rows, tokens, r): A_i[ids]
            # + A_i[ids] B_i^T, fused: (rows, tokens, dim)
            base.view(flat.shape[0], flat.shape[1], -1).baddbmm_(a_rows, b_t[members].to(base.dtype), alpha=self.scale)
            return base

        return forward


__all__ = ["LowRankPopulation", "matrix_names", "check_rank", "row_chunks", "factors", "dense_noise"]
