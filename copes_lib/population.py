"""Population-batched forward: every ES member of a step in ONE batched model call.

The batch is members x prompts. Each parameter gets a stacked copy of shape ``(G, *shape)`` (one
perturbed copy per member of the group); the Linear, Embedding and RMSNorm modules of the model are
patched, for the duration of a ``with Population(...)`` block, to pick for each batch row the weights
of the member that row belongs to. The rollout tells which rows are in each forward call through its
``row_hook(rows)`` (original batch-row indices); row ``r`` belongs to member ``r // rows_per_member``.

How it departs from the paper: the paper evaluates members one model at a time on GPUs (and spreads
them over GPUs). This is the EGGROLL-style lever (docs/paper_a_copes.md#a7-neighbours) but with full-rank noise, so memory is
G copies of the weights: use it for small models, or cap G with ``ESConfig.members_per_batch``.
Results match the sequential path up to float summation order (the test checks greedy tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from copes_lib.config import ConfigError


def _is_rmsnorm(module: nn.Module) -> bool:
    own = dict(module.named_parameters(recurse=False))
    return set(own) == {"weight"} and hasattr(module, "variance_epsilon")


def supported_modules(model: nn.Module) -> list[nn.Module]:
    """The modules to patch; raise ConfigError if some parameter lives in an unsupported module."""
    modules, unsupported = [], []
    for name, module in model.named_modules():
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)) or _is_rmsnorm(module):
            modules.append(module)
        else:
            unsupported.append(f"{name} ({type(module).__name__})")
    if unsupported:
        raise ConfigError(
            f"backend='batched' supports parameters in nn.Linear, nn.Embedding and RMSNorm modules only; "
            f"unsupported: {unsupported[:5]}. Use backend='sequential' or 'ray'."
        )
    return modules


class Population:
    """Context manager that makes ``model`` evaluate G members at once.

    ``stacked`` maps each parameter (by identity) to a tensor of shape (G, *param.shape): member g's
    full copy of that parameter. Tied parameters (an embedding reused as lm_head) are one entry.
    """

    def __init__(self, model: nn.Module, stacked: dict[int, torch.Tensor], rows_per_member: int):
        self.model, self.stacked, self.rows_per_member = model, stacked, rows_per_member
        self.modules = supported_modules(model)
        self.members: torch.Tensor | None = None  # member index of each row of the current call
        self._runs: tuple[torch.Tensor, list | None] | None = None  # (members, their _groups)

    # the rollout calls this before every forward with the original row indices of the call's rows
    def row_hook(self, rows: list[int]) -> None:
        self.members = torch.as_tensor([r // self.rows_per_member for r in rows], dtype=torch.long)
        self._runs = (self.members, self._groups(self.members))  # once per forward, not per patched module

    def __enter__(self) -> Population:
        for module in self.modules:
            if isinstance(module, nn.Linear):
                module.forward = self._linear_forward(module)
            elif isinstance(module, nn.Embedding):
                module.forward = self._embedding_forward(module)
            else:
                module.forward = self._rmsnorm_forward(module)
        return self

    def __exit__(self, *exc) -> None:
        for module in self.modules:
            del module.forward  # back to the class's forward
        self.members = None

    # ------------------------------------------------------------------ per-row weights
    def _rows(self, batch: int) -> torch.Tensor:
        if self.members is None or len(self.members) != batch:
            raise RuntimeError(
                f"Population: a forward call with batch {batch} came without a matching row_hook(rows) "
                f"(last rows: {None if self.members is None else len(self.members)}); the rollout must "
                "call row_hook before every forward"
            )
        return self.members

    def _weights(self, param: torch.Tensor) -> torch.Tensor:
        return self.stacked[id(param)]

    def _runs_of(self, members: torch.Tensor) -> list[tuple[int, int, int]] | None:
        """``_groups(members)``, computed once per row_hook (every patched module of a forward reads it)."""
        if self._runs is None or self._runs[0] is not members:
            self._runs = (members, self._groups(members))
        return self._runs[1]

    def _equal_runs(self, members: torch.Tensor) -> tuple[slice | list[int], int] | None:
        """(the members, as a slice of the stack when consecutive; rows each) when the rows come in equal
        runs of distinct members, else None."""
        runs = self._runs_of(members)
        if runs is None or len({stop - start for _, start, stop in runs}) != 1:
            return None
        first, ids = runs[0][0], [m for m, _, _ in runs]
        pick = slice(first, first + len(ids)) if ids == list(range(first, first + len(ids))) else ids
        return pick, runs[0][2] - runs[0][1]

    def _groups(self, members: torch.Tensor) -> list[tuple[int, int, int]] | None:
        """(member, start, stop) runs of consecutive rows, or None if rows are not grouped by member."""
        values = members.tolist()
        runs, start = [], 0
        for pos in range(1, len(values) + 1):
            if pos == len(values) or values[pos] != values[start]:
                runs.append((values[start], start, pos))
                start = pos
        if len({m for m, _, _ in runs}) != len(runs):
            return None
        return runs

    def _linear_forward(self, module: nn.Linear):
        def forward(x: torch.Tensor) -> torch.Tensor:
            members = self._rows(x.shape[0])
            weight = self._weights(module.weight)
            bias = self._weights(module.bias) if module.bias is not None else None
            runs = self._runs_of(members)
            if runs is None:  # rows interleaved: sort by member, compute, unsort
                order = torch.argsort(members, stable=True)
                saved = self.members
                self.members = members[order]
                try:
                    out = forward(x[order])
                finally:
                    self.members = saved
                return out[torch.argsort(order)]
            sizes = {stop - start for _, start, stop in runs}
            if len(sizes) == 1 and len(runs) > 1:
                # equal groups: one batched matmul over members
                first, ids = runs[0][0], [m for m, _, _ in runs]
                # consecutive members: a view of the stack, no copy of G weight matrices per call
                pick = (slice(first, first + len(ids)) if ids == list(range(first, first + len(ids)))
                        else torch.as_tensor(ids, device=x.device))
                xs = x.reshape(len(runs), -1, x.shape[-1])
                out = torch.bmm(xs, weight[pick].transpose(1, 2))
                if bias is not None:
                    out = out + bias[pick].unsqueeze(1)
                return out.reshape(*x.shape[:-1], weight.shape[1])
            parts = [F.linear(x[start:stop], weight[m], None if bias is None else bias[m])
                     for m, start, stop in runs]
            return torch.cat(parts, dim=0)

        return forward

    def _embedding_forward(self, module: nn.Embedding):
        def forward(ids: torch.Tensor) -> torch.Tensor:
            members = self._rows(ids.shape[0]).to(ids.device)
            weight = self._weights(module.weight)
            return weight[members.view(-1, *([1] * (ids.dim() - 1))), ids]

        return forward

    def _rmsnorm_forward(self, module: nn.Module):
        # the same arithmetic as transformers' Qwen3RMSNorm, with a per-row weight
        def forward(hidden: torch.Tensor) -> torch.Tensor:
            members = self._rows(hidden.shape[0])
            stack = self._weights(module.weight)
            dtype = hidden.dtype
            h = hidden.to(torch.float32)
            variance = h.pow(2).mean(-1, keepdim=True)
            h = h * torch.rsqrt(variance + module.variance_epsilon)
            equal = self._equal_runs(members)
            if equal is not None:
                # equal runs: each member's weight broadcast over its rows (the same products as a per-row
                # gather, without building it)
                pick, rows = equal
                weight = stack[pick] if isinstance(pick, slice) else stack[torch.as_tensor(pick, device=stack.device)]
                shaped = h.to(dtype).view(len(weight), rows, *hidden.shape[1:])
                return (weight.view(len(weight), *([1] * (hidden.dim() - 1)), weight.shape[-1])
                        * shaped).view(hidden.shape)
            weight = stack[members.to(hidden.device)]
            weight = weight.view(hidden.shape[0], *([1] * (hidden.dim() - 2)), weight.shape[-1])
            return weight * h.to(dtype)

        return forward
