"""AdamW with one step counter per adapter slot, so a reborn slot restarts Adam from its first step.

The pool stacks its S slots in shared tensors (``A``: (in, S, r), ``B``: (S, r, out)) and the router
keeps one row per slot. When the lifecycle replaces a slot (mutation into a freed slot) or rewrites
one (the blend of inheritance), that slot's history is meaningless and Adam must start over for its
rows only. Zeroing its moments is not enough: Adam's bias correction divides by 1 - beta^t with the
*tensor's* step count t, which after hundreds of steps is ~1, so the reset rows would take steps
of several times the normal size (measured: 4.9x on the first step, 3.1x on average over the next
50). Here t is kept per slot. For every parameter element of slot s, with g its gradient and t_s the
number of steps since slot s was (re)born (torch.optim.AdamW's equations, t replaced by t_s):

    p   <- p (1 - lr * weight_decay)                       (decoupled weight decay)
    m   <- beta1 m + (1 - beta1) g
    v   <- beta2 v + (1 - beta2) g^2
    p   <- p - lr / (1 - beta1^t_s) * m / (sqrt(v) / sqrt(1 - beta2^t_s) + eps)

``reset_slot`` sets m = v = 0 and t_s = 0 for one slot of one parameter: the slot's next update is
exactly a fresh AdamW's first update, and the other slots' updates are untouched. Parameters
without a slot dimension keep one counter, as in torch.optim.AdamW. Departure: paper B does not
say how the optimizer treats reborn slots; restarting their Adam state is our choice.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class SlotAdamW(torch.optim.Optimizer):
    """AdamW with per-slot step counters for the parameters named in ``slot_dims``.

    Usage::

        optimizer = SlotAdamW([{"params": pool.parameters(), "lr": 1e-3}],
                              slot_dims=list(pool.slot_parameters()))
        ...
        optimizer.reset_slot(pool.B[key], dim=0, slot=3)
    """

    def __init__(self, params, slot_dims: Iterable[tuple[torch.Tensor, int]] = (), lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"SlotAdamW needs lr > 0, eps > 0, weight_decay >= 0 and betas in [0, 1); "
                             f"got lr={lr}, eps={eps}, weight_decay={weight_decay}, betas={betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        # keyed by the tensor itself (hashed by identity), as torch's optimizer state is
        self.slot_dims = {tensor: dim for tensor, dim in slot_dims}

    def _step_shape(self, p: torch.Tensor) -> tuple[int, ...]:
        """Shape of p's step counter: p's slot dimension kept, every other dimension 1 (broadcasts)."""
        if p not in self.slot_dims:
            return ()
        dim = self.slot_dims[p]
        return tuple(p.shape[d] if d == dim else 1 for d in range(p.dim()))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    # float64 counters: beta^t is computed in double, as torch does with its Python float
                    state["step"] = torch.zeros(self._step_shape(p), dtype=torch.float64, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                step, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                step += 1
                p.mul_(1 - lr * group["weight_decay"])
                m.lerp_(p.grad, 1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                step_size = (lr / (1 - beta1 ** step)).to(p.dtype)
                bias_correction2_sqrt = (1 - beta2 ** step).sqrt().to(p.dtype)
                denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
                p.sub_(step_size * m / denom)
        return loss

    @torch.no_grad()
    def reset_slot(self, tensor: torch.Tensor, slot: int) -> None:
        """Restart Adam for one slot of ``tensor``: moments and step counter of that slot to 0."""
        if tensor not in self.slot_dims:
            raise KeyError(f"tensor of shape {tuple(tensor.shape)} was not given a slot dimension "
                           "(SlotAdamW(slot_dims=...)); its optimizer state cannot be reset per slot")
        state = self.state.get(tensor)
        if not state:  # no step taken yet: nothing to forget
            return
        dim = self.slot_dims[tensor]
        for name in ("exp_avg", "exp_avg_sq", "step"):
            state[name].select(dim, slot).zero_()
