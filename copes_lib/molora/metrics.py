"""Paper B's metrics: balanced log-perplexity, Delta, gate shares, monopoly count, entropy, specialisation.

Balanced log-PPL = the equal-weight mean over domains of each domain's log perplexity (its mean
next-token NLL in nats) = log of the geometric mean of the per-domain perplexities; the paper
replaced an arithmetic mean of perplexities, which had given a wrong conclusion.
Delta = logPPL_ref - logPPL_test in nats: positive means the test arm is better.
Gate shares: each slot's fraction of the total gate mass (tokens' gate proportions, averaged).
Monopoly count: the fewest slots that together carry >= 90% of the gate mass (paper's R0: 4 of 16).
Collapse level (declared in docs/molora_regime.md#m2-collapse-metric): collapsed when the monopoly count is
at most S / 4, partly collapsed up to S / 2, spread above.
"""

from __future__ import annotations

import math

import torch


def balanced_log_ppl(nll_by_domain: dict[str, float]) -> float:
    """Equal-weight mean over domains of log PPL (mean NLL, nats).

    >>> round(balanced_log_ppl({"code": 1.0, "prose": 3.0}), 6)
    2.0
    """
    if not nll_by_domain:
        raise ValueError("balanced_log_ppl needs at least one domain")
    return sum(nll_by_domain.values()) / len(nll_by_domain)


def arithmetic_ppl(nll_by_domain: dict[str, float]) -> float:
    """The aggregator the paper corrected: arithmetic mean of per-domain perplexities (for contrast)."""
    return sum(math.exp(v) for v in nll_by_domain.values()) / len(nll_by_domain)


def delta(ref_log_ppl: float, test_log_ppl: float) -> float:
    """Delta = logPPL_ref - logPPL_test (nats); positive = test is better."""
    return ref_log_ppl - test_log_ppl


def gate_shares(mass: torch.Tensor) -> torch.Tensor:
    """(S,) share of gate mass per slot from per-token proportions ``mass`` (..., S)."""
    total = mass.reshape(-1, mass.shape[-1]).float().sum(dim=0)
    return total / total.sum().clamp_min(1e-12)


def monopoly_count(shares: torch.Tensor | list[float], mass: float = 0.9) -> int:
    """Fewest slots whose shares add up to at least ``mass``.

    >>> monopoly_count([0.5, 0.3, 0.15, 0.05])
    3
    >>> monopoly_count([0.25] * 4)
    4
    """
    if not 0 < mass <= 1:
        raise ValueError(f"mass = {mass} must be in (0, 1]")
    ordered = sorted((float(s) for s in shares), reverse=True)
    total = sum(ordered)
    running = 0.0
    for k, share in enumerate(ordered, start=1):
        running += share
        if running >= mass * total - 1e-6:  # float32 shares: 0.7 + 0.2 < 0.9
            return k
    return len(ordered)


def top_share(shares: torch.Tensor | list[float], k: int = 4) -> float:
    """Summed share of the ``k`` largest slots; ``monopoly_count(shares) <= k`` iff this is >= 0.9.

    >>> round(top_share([0.1, 0.5, 0.3, 0.1], k=2), 6)
    0.8
    """
    if k < 1:
        raise ValueError(f"k = {k} must be >= 1")
    return float(sum(sorted((float(s) for s in shares), reverse=True)[:k]))


COLLAPSE_LEVELS = ("collapsed", "partly collapsed", "spread")


def collapse_level(monopoly: int, n_slots: int) -> str:
    """'collapsed' (m <= S/4, the paper's 4 of 16), 'partly collapsed' (m <= S/2) or 'spread'.

    >>> [collapse_level(m, 16) for m in (3, 4, 5, 8, 9)]
    ['collapsed', 'collapsed', 'partly collapsed', 'partly collapsed', 'spread']
    """
    if n_slots < 1 or not 1 <= monopoly <= n_slots:
        raise ValueError(f"monopoly = {monopoly} must be in 1..n_slots = {n_slots}")
    if monopoly <= n_slots / 4:
        return COLLAPSE_LEVELS[0]
    return COLLAPSE_LEVELS[1] if monopoly <= n_slots / 2 else COLLAPSE_LEVELS[2]


def steps_to_collapse(history: list[dict], n_slots: int) -> int | None:
    """First logged step whose training-window monopoly count is collapsed (<= S/4); None if never."""
    for row in history:
        if collapse_level(int(row["moe/monopoly_slots"]), n_slots) == COLLAPSE_LEVELS[0]:
            return int(row["step"])
    return None


def routing_entropy(shares: torch.Tensor) -> float:
    """Entropy (nats) of the aggregate share distribution; log(S) = perfectly even use of all slots."""
    p = shares.float().clamp_min(1e-12)
    return float(-(p * p.log()).sum())


def token_entropy(mass: torch.Tensor) -> float:
    """Mean per-token routing entropy (nats): low = each token commits to few slots."""
    p = mass.reshape(-1, mass.shape[-1]).float().clamp_min(1e-12)
    return float(-(p * p.log()).sum(dim=1).mean())


def domain_slot_matrix(mass: torch.Tensor, domain_of_row: torch.Tensor, n_domains: int) -> torch.Tensor:
    """(D, S): each domain's share of gate mass per slot (rows sum to 1). ``mass`` is (B, T, S)."""
    rows = []
    for d in range(n_domains):
        selected = mass[domain_of_row == d]
        rows.append(gate_shares(selected) if len(selected) else torch.zeros(mass.shape[-1]))
    return torch.stack(rows)


def specialisation(matrix: torch.Tensor) -> float:
    """Mutual information I(domain; slot) in nats of the (D, S) share matrix with equal domain weights.

    0 = every domain uses the slots alike; log(D) = each slot serves exactly one domain.
    """
    joint = matrix.float() / matrix.shape[0]
    slot = joint.sum(dim=0, keepdim=True)
    domain = joint.sum(dim=1, keepdim=True)
    ratio = joint / (domain * slot).clamp_min(1e-12)
    return float((joint * ratio.clamp_min(1e-12).log()).sum())
