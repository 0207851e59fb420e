"""How good is one population's estimate of the update direction? (issue 18, beyond the paper)

CoPES's premise (docs/paper_a_copes.md, A2) is that splitting the parameters into K
subspaces gives a better estimate of the ascent direction per evaluated member than full-space ES. This
module measures that directly, at FIXED parameters and on ONE prompt batch, without training:

1. ``es_update_vector``: the update u = alpha * sum_k P_k g_k that ``es.ES`` would apply at a step,
   as one flat vector. It runs ES's own plan (partition + member seeds), backend evaluation, z-score
   and update (``ES.plan``, ``backend.evaluate``, ``ES.standardize``, ``ES.update``); only the update
   is written into zero tensors instead of theta, so the model is never changed and the vector is
   exactly the step ES would take (a test checks it against ``es.es_step``).
2. Two populations with different noise seeds (``ESConfig.seed``; for CoPES the partition changes
   with it too) on the same step, i.e. the same prompt batch, are two independent estimates of the
   same direction: their cosine is the agreement of the estimator (1 = noiseless, ~0 = pure noise).
3. ``grpo_direction``: the GRPO policy gradient on rollouts of the same prompts (grpo's group
   advantages, packing and loss; ratio 1, no KL term since the reference equals the policy at this
   point), the descent direction of the GRPO loss = the ascent direction of the sampled reward.
   Two GRPO estimates with different sampling seeds give the reference's own agreement (a ceiling:
   an ES estimate cannot agree with a noisy reference better than the reference agrees with itself,
   up to the difference in objectives).

The cosine is invariant to alpha, so "equal update norm" (ES with sqrt(K) x alpha) does not change
it; at equal norm what differs is the step along the reference direction, ||u|| cos(u, g), which
``summarize_agreement`` reports as ``aligned_step``.

Departures, and why: the ES objective is the GREEDY reward (the paper's ES fitness) while the GRPO
gradient is that of the reward of SAMPLED trajectories (temperature 1, the paper's GRPO rollouts), so
the two directions need not coincide even without noise; the GRPO direction is the raw gradient, not
the AdamW step GRPO would take (AdamW rescales coordinates). On the toy quadratic (``es_objective.toy_quadratic``)
the true gradient is known and ``true_gradient_quadratic`` gives it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from copes_lib import es as es_engine
from copes_lib import grpo as grpo_engine
from copes_lib.es_backends import make_backend
from copes_lib.es_objective import QuadraticObjective
from copes_lib.sampling import mix_seed


# --------------------------------------------------------------------------- vectors
def flat_parameters(model: nn.Module) -> torch.Tensor:
    """theta as one fp32 vector, in ``model.parameters()`` order (tied parameters once, as ES)."""
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b) in float64; nan when either vector is zero (an estimate with no signal)."""
    a, b = a.double(), b.double()
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        return math.nan
    return float(a @ b) / (na * nb)


def es_update_vector(model: nn.Module, objective: Any, config: es_engine.ESConfig, step: int,
                     backend: Any = None) -> tuple[torch.Tensor, np.ndarray]:
    """(u, rewards): the flat update ``es.ES`` would apply at ``step`` and the members' rewards (K, N_k).

    The model is left unchanged: members are evaluated (and restored) by the backend as in training,
    then ``ES.update`` writes the step into zero tensors instead of theta (its master copy).
    """
    engine = es_engine.ES(model, config)
    backend = backend or make_backend(engine)
    try:
        plan = engine.plan(step)
        rewards = backend.evaluate(engine, plan, objective)
    finally:
        backend.close()
    es_engine.check_rewards(rewards)
    rhat = engine.standardize(rewards)
    # ES.update adds the step to its fp32 master (and refreshes the compute weights from it): point both
    # at the same zero tensors, so the step lands there and theta is never touched
    zeros = [torch.zeros_like(p, dtype=torch.float32) for p in engine.params]
    engine.params, engine.master = zeros, zeros
    engine.update(plan, rhat)
    return torch.cat([p.reshape(-1) for p in zeros]), rewards


def grpo_direction(model: nn.Module, tokenizer: Any, env: Any, tasks: Sequence[Any], rollout_config: Any, *,
                   group_size: int, seed: int, micro_batch_size: int = 16, temperature: float = 1.0,
                   rollout_fn: Any = None) -> tuple[torch.Tensor, dict[str, float]]:
    """(d, stats): minus the gradient of the GRPO loss (``grpo.grpo_loss``, ratio 1, no KL) on
    ``group_size`` sampled trajectories of each of ``tasks``; ``d`` is zero when every group's
    rewards are equal (no advantage). The model's weights are unchanged; its grads are cleared.
    ``rollout_fn`` defaults to ``copes_lib.rollout.rollout`` (tests pass a stand-in, as for grpo)."""
    if rollout_fn is None:
        from copes_lib.rollout import rollout as rollout_fn

    config = grpo_engine.GRPOConfig(group_size=group_size, prompt_batch_size=len(tasks),
                                    mini_batch_size=len(tasks), micro_batch_size=micro_batch_size,
                                    kl_coef=0.0, temperature=temperature)
    sample_config = dataclasses.replace(rollout_config, temperature=temperature, top_p=1.0)
    grouped = [t for t in tasks for _ in range(group_size)]
    batch = rollout_fn(model, tokenizer, grouped, env, sample_config, seed)
    rewards = torch.tensor(batch.rewards, dtype=torch.float32)
    advantages = grpo_engine.group_advantages(rewards, group_size, norm_by_std=config.norm_adv_by_std,
                                              eps=config.adv_eps)
    params = list(model.parameters())
    requires = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
        p.grad = None
    (micro,) = grpo_engine.mini_batches(batch, advantages, config, grpo_engine._pad_id(tokenizer),
                                        params[0].device)
    num_tokens = float(sum(packed.completion_mask.sum() for packed, _ in micro))
    num_seqs = float(sum(len(packed) for packed, _ in micro))
    was_training = model.training
    model.eval()
    try:
        for packed, adv in micro:
            logps, _ = grpo_engine.completion_logprobs(model, packed, temperature)
            loss, _ = grpo_engine.grpo_loss(logps, logps.detach(), None, adv, packed.completion_mask, config,
                                            num_tokens=num_tokens, num_seqs=num_seqs)
            loss.backward()
        direction = -torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1)
                                for p in params])
    finally:
        for p, r in zip(params, requires):
            p.grad = None
            p.requires_grad_(r)
        model.train(was_training)
    group_std = rewards.view(-1, group_size).std(dim=1)
    return direction, {"reward_mean": float(rewards.mean()),
                       "zero_std_group_frac": float((group_std == 0).float().mean())}


def true_gradient_quadratic(model: nn.Module, objective: QuadraticObjective) -> torch.Tensor:
    """The exact ascent direction of ``QuadraticObjective``: d/dtheta -mean((theta - t)^2)."""
    n = sum(t.numel() for t in objective.target)
    return torch.cat([(2.0 / n) * (t.float() - p.detach().float()).reshape(-1)
                      for p, t in zip(model.parameters(), objective.target)])


# --------------------------------------------------------------------------- the measurement
@dataclasses.dataclass(frozen=True)
class Arm:
    """One estimator: an ESConfig (population, K, sigma, alpha, backend) under a short name."""

    name: str
    config: es_engine.ESConfig


def population_estimates(model: nn.Module, objective: Any, arm: Arm, *, step: int, populations: int,
                         seed: int = 0) -> list[dict[str, Any]]:
    """``populations`` independent update estimates of ``arm`` at ``step`` (noise seeds seed, seed+1, ...)."""
    out = []
    for j in range(populations):
        config = dataclasses.replace(arm.config, seed=mix_seed(seed, j, 0xA6EE))
        vector, rewards = es_update_vector(model, objective, config, step)
        out.append({"vector": vector, "reward_std": float(np.std(rewards)), "norm": float(vector.norm())})
    return out


def pairwise_cosines(vectors: Sequence[torch.Tensor]) -> list[float]:
    return [cosine(a, b) for a, b in itertools.combinations(vectors, 2)]


def summarize_agreement(estimates: dict[str, list[dict[str, Any]]],
                        references: Sequence[torch.Tensor] = ()) -> list[dict[str, Any]]:
    """One row per arm: mean (and all) pairwise cosines between its populations, mean cosine with each
    reference direction, mean update norm and the step along the reference at that norm
    (``aligned_step`` = ||u|| cos(u, ref)); a final row ``reference`` holds the references' own
    pairwise agreement. Cosines are nan where a vector is zero; means skip nans (``n_*`` count them)."""
    rows = []
    for name, pops in estimates.items():
        vectors = [p["vector"] for p in pops]
        pair = pairwise_cosines(vectors)
        with_ref = [cosine(v, r) for v in vectors for r in references]
        norm = float(np.mean([p["norm"] for p in pops]))
        rows.append({"arm": name, "agreement": _nanmean(pair), "agreement_all": pair, "n_pairs": _count(pair),
                     "cos_reference": _nanmean(with_ref), "cos_reference_all": with_ref,
                     "n_reference": _count(with_ref), "update_norm": norm,
                     "aligned_step": norm * _nanmean(with_ref) if with_ref else math.nan})
    if len(references) >= 2:
        pair = pairwise_cosines(references)
        rows.append({"arm": "reference", "agreement": _nanmean(pair), "agreement_all": pair,
                     "n_pairs": _count(pair), "cos_reference": math.nan, "cos_reference_all": [],
                     "n_reference": 0, "update_norm": float(np.mean([float(r.norm()) for r in references])),
                     "aligned_step": math.nan})
    return rows


def _count(values: Sequence[float]) -> int:
    return int(sum(1 for v in values if math.isfinite(v)))


def _nanmean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


__all__ = ["flat_parameters", "cosine", "es_update_vector", "grpo_direction", "true_gradient_quadratic", "Arm",
           "population_estimates", "pairwise_cosines", "summarize_agreement"]
