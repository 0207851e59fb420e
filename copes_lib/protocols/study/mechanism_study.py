"""Notebook 09's mechanism measurement at a base (docs/mechanism.md#m1-what-is-measured) and its summary:
the held-out fitness change along ES's, CoPES's and the GRPO gradient's one-step directions against
random directions of the same norm, d_eff, rho^2 N / (d_eff + N - 1) against ES's measured per-step
efficiency, and the five registered verdicts (docs/mechanism.md#m2-predictions-and-rules)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from copes_lib.es_objective import AgentObjective
from copes_lib.protocols.study.base import (
    _Z95,
    ScaleStudyParams,
    Substrate,
    _cached_json,
    _finite,
    budget_efficiency,
    es_arm_config,
    gain_recovery,
)


class _Fitness:
    """mechanism.Fitness over an es.AgentObjective at one step: its greedy mean paper reward on that
    step's prompt batch (one member, or ``population_fitness``'s stacked members)."""

    def __init__(self, objective: AgentObjective, step: int):
        self.objective, self.step = objective, step

    def fitness(self, model) -> float:
        return self.objective.fitness(model, self.step)

    def rows_per_member(self) -> int:
        return self.objective.rows_per_member(self.step)

    def population_fitness(self, model, n_members: int, row_hook) -> list[float]:
        return self.objective.population_fitness(model, self.step, n_members, row_hook)


class _HeldOut(AgentObjective):
    """ES's fitness on fixed held-out problems: every "batch" is all of them, greedy."""

    def batch(self, step: int) -> list:
        return list(self.train_tasks)


def heldout_fitness(sub: Substrate, n_problems: int) -> _Fitness:
    """Greedy mean paper reward on the first ``n_problems`` validation problems (no update saw them)."""
    greedy = dataclasses.replace(sub.rollout_config, temperature=0.0, top_p=1.0)
    tasks = sub.val_tasks[:n_problems]
    return _Fitness(_HeldOut(sub.tokenizer, sub.env, tasks, tasks, greedy, len(tasks), 0), step=0)


def rewarded_nll(model, tokenizer, env, tasks, rollout_config, *, group_size: int, seed: int, rollout_fn=None):
    """(loss_fn, info): the negative log-likelihood (mean over model-written tokens) of the base's
    REWARDED trajectories among ``group_size`` samples (temperature 1, GRPO's) per task: the surrogate
    whose curvature d_eff measures (docs/mechanism.md#m1-what-is-measured). loss_fn is None when no
    trajectory was rewarded."""
    import torch

    from copes_lib import grpo

    if rollout_fn is None:
        from copes_lib.rollout import rollout as rollout_fn
    sample = dataclasses.replace(rollout_config, temperature=1.0, top_p=1.0)
    with torch.no_grad():
        batch = rollout_fn(model, tokenizer, [t for t in tasks for _ in range(group_size)], env, sample, seed)
    keep = [i for i, r in enumerate(batch.rewards) if r > 0 and sum(batch.model_mask[i]) > 0]
    info = {"trajectories": len(batch.rewards), "rewarded": len(keep)}
    if not keep:
        return None, info
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
    packed = grpo.pack([batch.prompt_ids[i] for i in keep], [batch.completion_ids[i] for i in keep],
                       [batch.model_mask[i] for i in keep], int(pad), next(model.parameters()).device)
    info["tokens"] = int(packed.completion_mask.sum())

    def loss_fn(m):
        was = m.training
        m.eval()
        try:
            logps, _ = grpo.completion_logprobs(m, packed, 1.0)
        finally:
            m.train(was)
        return -(logps * packed.completion_mask).sum() / packed.completion_mask.sum()

    def logits_fn(m):
        """Logits of the scored (model-written) positions, equal weights: the GGN of the same NLL."""
        was = m.training
        m.eval()
        try:
            out = m(input_ids=packed.input_ids, attention_mask=packed.attention_mask,
                    position_ids=packed.position_ids, use_cache=False)
        finally:
            m.train(was)
        z = out.logits[:, packed.prompt_width - 1:-1][packed.completion_mask > 0]
        return z, torch.full((z.shape[0],), 1.0 / z.shape[0], device=z.device)

    loss_fn.logits_fn = logits_fn  # the Gauss-Newton curvature of the same objective (docs/mechanism.md#m5-added-after-the-first-run)
    return loss_fn, info


LADDER = (0.3, 0.1, 0.03, 0.01)  # fractions of ES's norm at which the GRPO direction is also evaluated


def mechanism(params: ScaleStudyParams, sub: Substrate, model=None) -> dict[str, Any]:
    """The mechanism measurement at the base of one cell (docs/mechanism.md#m1-what-is-measured):
    ES's, CoPES's and the GRPO gradient's one-step directions on ES step 1's prompts against
    ``MECH_RANDOM`` random directions of ES's update norm (held-out fitness), the linear share rho^2
    of ES's fitness (antithetic pairs), d_eff of the rewarded trajectories' NLL, the prediction.
    ``model``: the base to measure at (default ``sub.model``; any base model of ``sub``'s shape,
    e.g. another regime's warm start). Cached; the result is JSON (timings included)."""
    import time

    from copes_lib import mechanism as mech
    from copes_lib.es import checksum

    model = sub.model if model is None else model
    # "version": what the measurement contains (cache keys do not cover code): bump it when that changes
    key = {**sub.key, "base_checksum": checksum(model), "version": 3,
           "mech": {k: getattr(params, k) for k in ("MECH_RANDOM", "MECH_HELDOUT", "MECH_GROUP", "MECH_PROBES",
                                                    "MECH_POWER_ITERS", "MECH_NLL_BATCHES", "MECH_FD_EPS", "POPULATION", "SUBSPACES",
                                                    "SIGMA", "ALPHA", "CHUNK_SIZE", "BACKEND", "BATCH_SIZE",
                                                    "BATCH_SEED", "ES_SEED", "SEED")}}

    def compute():
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        step = 1
        updates = {arm: mech.es_update_vector(model, sub.objective, es_arm_config(params, arm, 0), step)[0]
                   for arm in ("es", "copes_paper")}
        tasks = sub.objective.batch(step)
        grad, grad_info = mech.grpo_direction(model, sub.tokenizer, sub.env, tasks, sub.rollout_config,
                                            group_size=params.MECH_GROUP, seed=params.SEED + 1000,
                                            micro_batch_size=params.MICRO_BATCH)
        updates["grpo"] = grad
        times["updates_s"] = time.perf_counter() - t0
        norms = {k: float(v.norm()) for k, v in updates.items()}
        # a zero update (every member tied: z-scores 0; every GRPO group tied) has no direction to test
        nonzero = {k: v for k, v in updates.items() if norms[k] > 0}
        # the common length: ES's step; if ES's update is zero, CoPES's / sqrt(K) (ES's expected length)
        norm = norms["es"] or norms["copes_paper"] / math.sqrt(params.SUBSPACES) or None
        t0 = time.perf_counter()
        test = (mech.direction_test(model, heldout_fitness(sub, params.MECH_HELDOUT), nonzero, norm=norm,
                                    n_random=params.MECH_RANDOM, seed=params.SEED,
                                    members_per_batch=params.MECH_MEMBERS_PER_BATCH) if norm else None)
        times["direction_test_s"] = time.perf_counter() - t0
        # added after the first run (docs/mechanism.md#m5-added-after-the-first-run): at ES's norm the raw
        # GRPO gradient overshoots (its curvature is far above a random direction's); shorter steps show
        # whether it carries signal. Exploratory: no random distribution per length, no rule.
        t0 = time.perf_counter()
        ladder = (mech.norm_ladder(model, heldout_fitness(sub, params.MECH_HELDOUT), updates["grpo"],
                                   [norm * f for f in LADDER], members_per_batch=params.MECH_MEMBERS_PER_BATCH)
                  if norm and norms["grpo"] > 0 else None)
        times["grpo_ladder_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        plus, minus = mech.antithetic_fitness(model, _Fitness(sub.objective, step), sigma=params.SIGMA,
                                              members=params.POPULATION, seed=params.SEED,
                                              members_per_batch=params.MECH_MEMBERS_PER_BATCH)
        share = mech.linear_share(plus, minus, seed=params.SEED)
        times["linear_share_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # the surrogate needs rewarded trajectories: a base that rarely earns the reward (a latent map base)
        # may have none in step 1's batch, so later ES batches are sampled until one has (MECH_NLL_BATCHES)
        for nll_step in range(step, step + params.MECH_NLL_BATCHES):
            loss_fn, nll_info = rewarded_nll(model, sub.tokenizer, sub.env, sub.objective.batch(nll_step),
                                             sub.rollout_config, group_size=params.MECH_GROUP,
                                             seed=params.SEED + 2000 + nll_step - step)
            if loss_fn is not None:
                break
        nll_info["nll_batches"] = nll_step - step + 1
        # d_eff is computed at the base; the surrogate's gradient there says how far from its own optimum
        # the base is (a Hessian far from a minimum can be indefinite, reported as d_eff None)
        no_surrogate = {"d_eff": None, "d_eff_low": None, "d_eff_high": None,
                        "undefined_reason": f"no rewarded trajectory in {params.MECH_NLL_BATCHES} ES batch(es)"}
        curvature = (mech.effective_rank(model, loss_fn, probes=params.MECH_PROBES, iters=params.MECH_POWER_ITERS,
                                         seed=params.SEED, eps=params.MECH_FD_EPS)
                     if loss_fn is not None else dict(no_surrogate))
        curvature.update(nll_info)
        times["curvature_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ggn = (mech.effective_rank(model, hvp=mech.softmax_ggn_vp(model, loss_fn.logits_fn, params.MECH_FD_EPS),
                                   probes=params.MECH_PROBES, iters=params.MECH_POWER_ITERS, seed=params.SEED)
               if loss_fn is not None else dict(no_surrogate))
        times["curvature_ggn_s"] = time.perf_counter() - t0
        return {"direction_test": test, "linear_share": share, "plus": plus.tolist(), "minus": minus.tolist(),
                "curvature": curvature, "curvature_ggn": ggn, "grpo_ladder": ladder, "grpo_gradient": grad_info,
                "norms": norms,
                "population": params.POPULATION, "times": times}

    return _cached_json(params, "scale_mechanism", key, compute)


def mechanism_summary(cell: dict[str, Any]) -> dict[str, Any]:
    """The mechanism's flat values and the five verdicts of docs/mechanism.md#m2-predictions-and-rules
    for one cell (keys without the cell's suffix; ``{}`` when the cell has no measurement)."""
    from copes_lib import mechanism as mech

    m = cell.get("mechanism")
    if not m:
        return {}
    test, share, curv = m["direction_test"], m["linear_share"], m["curvature"]
    ups, n = (test["updates"] if test else {}), m["population"]
    rnd = test["random"] if test else {}
    out: dict[str, Any] = {"mech_norm": test and test["norm"], "mech_n_random": test and test["n_random"],
                           "mech_heldout_base": test and test["base"], "mech_random_mean": rnd.get("mean"),
                           "mech_random_mean_low": _finite(rnd.get("mean_low")),
                           "mech_random_mean_high": _finite(rnd.get("mean_high")),
                           "mech_random_sd": rnd.get("sd")}
    for name in ("es", "copes_paper", "grpo"):
        row = ups.get(name)
        for stat in ("delta", "z", "z_low", "z_high", "percentile", "p_tail", "tail_low", "tail_high"):
            out[f"mech_{name}_{stat}"] = _finite(row[stat]) if row else None
    out["mech_rho2"], out["mech_rho2_low"], out["mech_rho2_high"] = share["rho2"], share["low"], share["high"]
    for k in ("d_eff", "d_eff_low", "d_eff_high", "trace", "lambda_max", "rewarded", "trajectories"):
        out[f"mech_{k}"] = curv.get(k)
    out["mech_power_converged"] = curv.get("power_converged")
    # exploratory, added after the first run (docs/mechanism.md#m5-added-after-the-first-run): no rule reads these
    ggn = m.get("curvature_ggn") or {}
    out["mech_d_eff_ggn"], out["mech_d_eff_ggn_low"], out["mech_d_eff_ggn_high"] = (
        ggn.get("d_eff"), ggn.get("d_eff_low"), ggn.get("d_eff_high"))
    ladder = m.get("grpo_ladder")
    if ladder:
        best = int(np.argmax(ladder["deltas"]))
        out["mech_grpo_ladder_best_delta"] = float(ladder["deltas"][best])
        out["mech_grpo_ladder_best_fraction"] = float(ladder["norms"][best] / test["norm"])
        out["mech_grpo_ladder_deltas"] = [float(d) for d in ladder["deltas"]]
    else:
        out["mech_grpo_ladder_best_delta"] = out["mech_grpo_ladder_best_fraction"] = None
        out["mech_grpo_ladder_deltas"] = None
    out["mech_predicted_z_es"] = mech.predicted_z(share["rho2"], n)
    bound = mech.predicted_z(share["high"], n)
    out["mech_z_bound"] = None if bound is None else bound + _Z95
    out["mech_predicted_efficiency"] = mech.predicted_efficiency(share["high"], n, curv.get("d_eff"))
    eff = budget_efficiency(cell, "es")
    out["mech_measured_efficiency"], out["mech_measured_efficiency_low"], out["mech_measured_efficiency_high"] = (
        eff["mean"], eff["low"], eff["high"])
    for name in ("es", "copes_paper"):
        ratio = mech.gain_ratio(test, name, "grpo") if "grpo" in ups and name in ups else {"ratio": None}
        out[f"mech_equal_norm_ratio_{name}"] = ratio["ratio"]
    out.update(mechanism_verdicts(out, grpo_gain=gain_recovery(cell, "es")["grpo_gain"]))
    out["mech_cost_s"] = float(sum(m["times"].values()))
    return out


def mechanism_verdicts(v: dict[str, Any], grpo_gain: float) -> dict[str, str]:
    """Rules 1-5 of docs/mechanism.md#m2-predictions-and-rules on a cell's ``mechanism_summary`` values."""
    out = {}
    if grpo_gain <= 0 or v["mech_grpo_p_tail"] is None:
        out["mech_power_verdict"] = "no reference"
    else:
        out["mech_power_verdict"] = "powered" if v["mech_grpo_p_tail"] < 0.05 else "unpowered"
    for name in ("es", "copes_paper"):
        p, z = v[f"mech_{name}_p_tail"], v[f"mech_{name}_z"]
        out[f"mech_{name}_chance_verdict"] = ("undefined" if p is None else "beats chance" if p < 0.05
                                              else "at chance")  # undefined: a zero update (members tied)
        bound = v["mech_z_bound"]
        out[f"mech_{name}_bound_verdict"] = ("undefined" if bound is None or z is None else
                                            "above bound" if z > bound else "within bound")
    ze, zc = v["mech_es_z"], v["mech_copes_paper_z"]
    diff = None if ze is None or zc is None else zc - ze
    out["mech_copes_vs_es_verdict"] = ("undefined" if diff is None else "CoPES higher" if diff > _Z95 * math.sqrt(2)
                                       else "ES higher" if diff < -_Z95 * math.sqrt(2) else "tie")
    pred, low, high = v["mech_predicted_efficiency"], v["mech_measured_efficiency_low"], v["mech_measured_efficiency_high"]
    if pred is None or low is None or high is None:
        out["mech_efficiency_verdict"] = "undefined"
    else:
        out["mech_efficiency_verdict"] = ("consistent" if low <= pred <= high else
                                          "ES below prediction" if high < pred else "ES above prediction")
    return out
