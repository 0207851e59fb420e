"""Leave-one-out fitness of each adapter slot, with global (E0) or per-domain (E1) evaluation scope.

For each slot s, the validation NLL of every domain is measured with the router's weights as they
are and again with slot s's weight set to zero (not renormalised: the slot's contribution is
removed, the others keep theirs). The loss increase ``drop[s, d] = nll_without_s[d] - nll[d]`` is
how much domain d needs slot s (positive = the slot helps).

- E0, global scope: fitness_s = mean over domains of drop[s, d] (the pooled, domain-balanced
  validation set: equal windows per domain, so this is the token mean).
- E1, per-domain scope: fitness_s = max over domains of drop[s, d]: a slot essential to one domain
  survives even if it is useless to the others.

Departure: the abstract says only "global vs per-domain leave-one-out"; the max aggregation of E1 is
our choice, stated in notebook 12. Fitness only matters through the lifecycle (who dies, who is
cloned); without the lifecycle the scope changes nothing.
"""

from __future__ import annotations

import torch

from copes_lib.molora.lm import lm_loss

SCOPES = ("e0", "e1")


@torch.no_grad()
def leave_one_out_drops(model, pool, router, windows: dict[str, torch.Tensor], step: int = 0) -> torch.Tensor:
    """(S, D) loss increase per slot and domain when that slot's weight is zeroed."""
    n_slots = pool.cfg.n_slots
    drops = torch.zeros(n_slots, len(windows))
    for d, rows in enumerate(windows.values()):
        rows = rows.to(next(model.parameters()).device)
        ids, targets = rows[:, :-1], rows[:, 1:]
        weights = router(router.features(model, pool, ids), step)
        with pool.gated(weights):
            base = lm_loss(model(input_ids=ids).logits, targets).mean()
        for s in range(n_slots):
            masked = weights.clone()
            masked[..., s] = 0.0
            with pool.gated(masked):
                drops[s, d] = lm_loss(model(input_ids=ids).logits, targets).mean() - base
    return drops


def scope_fitness(drops: torch.Tensor, scope: str) -> torch.Tensor:
    """(S,) fitness from the (S, D) drops: E0 = mean over domains, E1 = max over domains.

    >>> scope_fitness(torch.tensor([[0.1, 0.0], [0.0, 0.3]]), "e1").tolist()
    [0.10000000149011612, 0.30000001192092896]
    """
    if scope == "e0":
        return drops.mean(dim=1)
    if scope == "e1":
        return drops.max(dim=1).values
    raise ValueError(f"scope = {scope!r} is not valid; valid values: {list(SCOPES)}")
