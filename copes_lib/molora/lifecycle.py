"""Paper B's adapter lifecycle: death with a grace period, alpha-blend inheritance, SVD mutation,
slot reallocation. Every event is returned as a dict for the run's log.

One evolution event (every M adapter steps when the lifecycle is on):
1. Death: among slots older than ``grace_steps``, the ``deaths`` slots of lowest fitness die (never
   the fittest slot).
2. Inheritance: each dying slot d blends into its nearest surviving neighbour n (cosine of the full
   weight updates): dW_n <- (1 - alpha) dW_n + alpha dW_d, re-factorised to rank r by truncated SVD.
   ``alpha = 0`` is the paper's "no inheritance" counterfactual.
3. SVD mutation: the fittest slot b is cloned into the freed slot: dW_b = U S V^T per layer; U and V
   get Gaussian noise of relative size ``mutation_scale``, S a log-normal factor of the same size, and
   the product is re-factorised to rank r.
4. Slot reallocation: the router's row of slot d becomes b's row plus noise (``realloc_noise`` times
   the row's std); Adam restarts for slot d's adapter and router rows (moments and step counter to
   0, :class:`~copes_lib.molora.slot_adam.SlotAdamW`), so its next update is a fresh optimizer's
   first update. The slot's age restarts at 0.
The neighbour rewritten by inheritance restarts Adam the same way (its moments describe a weight
that no longer exists).

Departures: the abstract names these four mechanisms only; counts, alpha, noise sizes and the
grace period are our parameters (stated in notebook 12).
"""

from __future__ import annotations

import dataclasses

import torch

from copes_lib.config import Config, ConfigError, param
from copes_lib.molora.routers import router_rows
from copes_lib.molora.slot_adam import SlotAdamW


@dataclasses.dataclass(frozen=True)
class LifecycleConfig(Config):
    """Knobs of one evolution event."""

    deaths: int = param(2, "slots culled per evolution event (must be < number of slots)", ge=1)
    grace_steps: int = param(100, "a slot younger than this many adapter steps cannot die", ge=0)
    inherit_alpha: float = param(0.5, "alpha of the blend of a dying slot into its nearest neighbour "
                                      "(0 = no inheritance)", ge=0, le=1)
    mutation_scale: float = param(0.1, "relative noise on the parent's singular vectors and values", ge=0)
    realloc_noise: float = param(0.1, "noise on the copied router row, in units of the row's std", ge=0)

    def check_slots(self, n_slots: int) -> None:
        if self.deaths >= n_slots:
            raise ConfigError(f"LifecycleConfig.deaths = {self.deaths} must be smaller than the number of "
                              f"slots ({n_slots}): at least one slot has to survive")


def _perturbed(delta: torch.Tensor, rank: int, scale: float, generator: torch.Generator) -> torch.Tensor:
    """dW with its top-r singular vectors and values perturbed (the product; re-factorised by the pool)."""
    u, s, vh = torch.linalg.svd(delta.float(), full_matrices=False)
    u, s, vh = u[:, :rank], s[:rank], vh[:rank]
    u = u + scale * torch.randn(u.shape, generator=generator).to(u) / u.shape[0] ** 0.5
    vh = vh + scale * torch.randn(vh.shape, generator=generator).to(vh) / vh.shape[1] ** 0.5
    s = s * torch.exp(scale * torch.randn(s.shape, generator=generator).to(s))
    return (u * s) @ vh


def _reset_optimizer_rows(optimizer: SlotAdamW, pairs, slot: int) -> None:
    """Restart Adam (moments and step count) for ``slot``'s rows of each (tensor, slot dim) pair."""
    if not isinstance(optimizer, SlotAdamW):
        # zeroing a shared step counter's moments would give the reborn rows ~3-5x the step size
        raise TypeError(f"the lifecycle needs a SlotAdamW (per-slot step counters), got {type(optimizer).__name__}")
    for tensor, _ in pairs:
        optimizer.reset_slot(tensor, slot)


@torch.no_grad()
def evolve(pool, router, optimizer: SlotAdamW, fitness: torch.Tensor, ages: torch.Tensor, step: int,
           cfg: LifecycleConfig, generator: torch.Generator) -> list[dict]:
    """Run one evolution event in place (pool, router, optimizer state, ages); return its events."""
    n_slots = pool.cfg.n_slots
    cfg.check_slots(n_slots)
    best = int(torch.argmax(fitness))
    eligible = [s for s in range(n_slots) if ages[s] >= cfg.grace_steps and s != best]
    dying = sorted(eligible, key=lambda s: float(fitness[s]))[: cfg.deaths]
    events: list[dict] = []
    if not dying:
        return events
    similarity = pool.slot_similarity()
    for d in dying:
        events.append({"step": step, "event": "death", "slot": d, "fitness": float(fitness[d]),
                       "age": int(ages[d])})
        survivors = [s for s in range(n_slots) if s not in dying]
        neighbour = max(survivors, key=lambda s: float(similarity[d, s]))
        if cfg.inherit_alpha > 0:
            dying_delta, neighbour_delta = pool.slot_delta(d), pool.slot_delta(neighbour)
            blended = {k: (1 - cfg.inherit_alpha) * neighbour_delta[k] + cfg.inherit_alpha * dying_delta[k]
                       for k in dying_delta}
            pool.set_slot_delta(neighbour, blended, generator)
            _reset_optimizer_rows(optimizer, pool.slot_parameters(), neighbour)
        events.append({"step": step, "event": "inherit", "from": d, "into": neighbour,
                       "alpha": cfg.inherit_alpha, "cosine": float(similarity[d, neighbour])})
        parent = pool.slot_delta(best)
        child = {k: _perturbed(v, pool.cfg.rank, cfg.mutation_scale, generator) for k, v in parent.items()}
        pool.set_slot_delta(d, child, generator)
        events.append({"step": step, "event": "mutate", "parent": best, "child": d,
                       "parent_fitness": float(fitness[best])})
        for tensor, dim in router_rows(router):
            row = tensor.select(dim, best)
            spread = float(row.std()) if row.numel() > 1 else float(tensor.std())
            noise = torch.randn(row.shape, generator=generator) * cfg.realloc_noise * spread
            tensor.select(dim, d).copy_(row + noise.to(row))
        _reset_optimizer_rows(optimizer, pool.slot_parameters(), d)
        _reset_optimizer_rows(optimizer, router_rows(router), d)
        ages[d] = 0
        events.append({"step": step, "event": "realloc", "slot": d, "router_row_from": best})
    return events
