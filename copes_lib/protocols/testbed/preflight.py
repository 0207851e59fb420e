"""Preflight: can the testbed show a difference between methods? (docs/preflight.md)

A base can meet the regime criterion (docs/regime.md#r2-the-base-regime-criterion) and still give no method
anything to act on: if its answer form is a deterministic function of the prompt, GRPO's sampled groups
have no reward variance and ES's perturbed members tie the base. This module measures the registered
preconditions of docs/preflight.md#p1-the-preconditions on the base and settings a run will use, on the
tuning split, in minutes:

- **G1 / G2** (:func:`sampled_groups`): share of prompts whose G samples at GRPO's temperature vary in
  reward (G1), and vary in answer form (G2); also each prompt's sampled protocol rate (a histogram);
- **sigma** (:func:`calibrate_sigma`): the run's ES sigma, calibrated on the base by its effect
  (docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op, rule 1), and the member-spread curve;
- **E1** (:func:`member_spread`): at that sigma, share of (member, batch) pairs whose greedy fitness
  differs from the base's;
- **E2** (:func:`es_pilot`): share of steps of a short standard-ES pilot on which every member tied;
- **R** (:func:`grpo_pilot`): a short full-GRPO pilot's strict gain on the tuning split, paired;
- **U** (:func:`unit_spread`): the share of R's gain carried by the top 10% of latent units
  (docs/preflight.md#p84-the-gain-is-spread-over-units-precondition-u);
- the graded base's shape (:func:`decision_margins`, :func:`base_shape`): the logit margin of the reward's
  answer form over the latent one at the final turn's first token, and P2's targets, which gate on every
  warm-start seed the run uses (:func:`seed_shape`; docs/preflight.md#p85-the-bases-targets-gate-on-every-seed-the-run-uses).

:func:`judge` turns the values into per-precondition verdicts against :class:`PreflightCriterion`;
:func:`run_preflight` does everything for one task kind and caches it. Nothing here chooses a setting by
how a method then does on validation: the tuning split is used, and the floors were registered first.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from copes_lib import runs
from copes_lib.config import Config, ConfigError, param
from copes_lib.protocols.params import PreflightSettings

#: The preconditions' ids, in the order of docs/preflight.md#p1-the-preconditions.
PRECONDITIONS = ("G1", "G2", "E1", "E2", "R", "U")
#: What each precondition says, for messages and tables.
MEANING = {"G1": "GRPO can learn (groups with reward variance)",
           "G2": "the variance includes the answer protocol",
           "E1": "ES can see (members whose fitness differs from the base's)",
           "E2": "ES's pilot updates (steps without all members tied)",
           "R": "the reference acts (a short full-GRPO pilot gains)",
           "U": "the gain is spread over units (the top 10% of units carry at most half of R's gain)"}


@dataclasses.dataclass(frozen=True)
class PreflightCriterion(Config):
    """The registered floors (docs/preflight.md#p1-the-preconditions). Changing one is a change of that page."""

    min_varied_groups: float = param(0.50, "G1: share of sampled groups with non-zero reward std at least this",
                                     ge=0.0, le=1.0)
    min_protocol_groups: float = param(0.25, "G2: share of groups mixing the reward's answer form and another at "
                                       "least this", ge=0.0, le=1.0)
    min_members_differ: float = param(0.50, "E1: share of (member, batch) fitnesses differing from the base's at "
                                      "least this", ge=0.0, le=1.0)
    max_tied_steps: float = param(0.10, "E2: share of ES pilot steps with every member tied at most this",
                                  ge=0.0, le=1.0)
    min_reference_gain: float = param(0.15, "R: the GRPO pilot's strict tuning gain at least this (and its paired "
                                      "95% interval above 0)", ge=0.0, le=1.0)
    max_top_unit_gain_share: float = param(0.50, "U: share of R's gain carried by the top top_unit_fraction of latent "
                                           "units at most this, in (0, 1]", gt=0.0, le=1.0)
    top_unit_fraction: float = param(0.10, "U: the fraction of units (ranked by their summed gain) whose share is "
                                     "judged, in (0, 1]", gt=0.0, le=1.0)


# --------------------------------------------------------------------------- G1 / G2
def in_protocol(text: str) -> bool:
    r"""Whether a trajectory takes the reward's answer form (answer block and boxed value: r_f = 0).

    >>> in_protocol(r"<answer>\boxed{5}</answer>"), in_protocol("Answer: 5")
    (True, False)
    """
    from copes_lib.tasks.rewards import format_reward_value

    return format_reward_value(text) == 0.0


def sampled_groups(model, tokenizer, tasks: Sequence, env, rollout_config, *, group_size: int = 8,
                   temperature: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """Roll every task out ``group_size`` times at ``temperature`` (GRPO's rollouts) and return per prompt
    its rewards' std, its sampled protocol rate and whether its group mixes the reward's form with another;
    ``varied_share`` (G1) and ``protocol_mixed_share`` (G2) over prompts."""
    from copes_lib.rollout import rollout

    config = dataclasses.replace(rollout_config, temperature=temperature)
    repeated = [t for t in tasks for _ in range(group_size)]
    with torch.no_grad():
        batch = rollout(model, tokenizer, repeated, env, config, seed=seed)
    rewards = np.asarray(batch.rewards, dtype=float).reshape(len(tasks), group_size)
    form = np.asarray([in_protocol(t) for t in batch.model_texts], dtype=float).reshape(len(tasks), group_size)
    rate = form.mean(1)
    varied = rewards.std(1) > 0
    mixed = (rate > 0) & (rate < 1)
    return {"task_ids": [t.id for t in tasks], "reward_std": rewards.std(1).tolist(), "protocol_rate": rate.tolist(),
            "varied_share": float(varied.mean()), "protocol_mixed_share": float(mixed.mean()),
            "protocol_rate_mean": float(rate.mean())}


# --------------------------------------------------------------------------- ES: sigma, E1, E2
def _objective_on(objective, tasks: Sequence, batch_size: int):
    """A copy of an ES objective whose step batches are drawn from ``tasks``."""
    other = copy.copy(objective)
    other.train_tasks, other.batch_size = list(tasks), batch_size
    return other


def differing_share(model, objective, *, sigma: float, members: int, steps: Sequence[int], seed: int) -> dict:
    """Per step (a prompt batch), the share of ``members`` standard-ES members (K = 1, noise seeded by
    ``seed``) whose greedy fitness differs from the unperturbed model's on the same batch."""
    from copes_lib.es import ES, ESConfig, member_rewards

    es = ES(model, ESConfig(population=members, subspaces=1, sigma=sigma, alpha=sigma / 2, seed=seed,
                            chunk_size=2**20))
    shares = []
    for step in steps:
        base = objective.fitness(model, step)
        rewards = member_rewards(es, es.plan(step), objective).ravel()
        shares.append(float(np.mean(rewards != base)))
    return {"sigma": sigma, "per_batch": shares, "share": float(np.mean(shares)), "min_share": float(min(shares))}


def calibrate_sigma(model, objective, settings: PreflightSettings, min_share: float) -> dict[str, Any]:
    """The run's sigma by docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op rule 1: the smallest
    of the ladder at which at least ``min_share`` of ``calibration_members`` members differ from the base on
    every one of ``calibration_batches`` training batches; None when no rung does. Every rung is measured
    (the member-spread curve over sigma)."""
    steps = list(range(1, settings.calibration_batches + 1))
    curve = [differing_share(model, objective, sigma=s, members=settings.calibration_members, steps=steps,
                             seed=settings.seed + 1) for s in settings.ladder()]
    chosen = next((row["sigma"] for row in curve if row["min_share"] >= min_share), None)
    return {"sigma": chosen, "curve": curve}


def member_spread(model, objective, tuning: Sequence, settings: PreflightSettings, sigma: float) -> dict:
    """E1: fresh members (another noise seed than the calibration's) on the tuning prompts."""
    tuned = _objective_on(objective, tuning, settings.batch_size)
    steps = list(range(1, len(tuning) // settings.batch_size + 1))
    return differing_share(model, tuned, sigma=sigma, members=settings.members, steps=steps, seed=settings.seed + 2)


def es_pilot(model, objective, settings: PreflightSettings, sigma: float) -> dict[str, Any]:
    """E2: ``pilot_steps`` steps of standard ES (alpha = sigma / 2) on a copy of ``model``; per step whether
    every member earned the same fitness (a zero update) and the mean member fitness."""
    from copes_lib.es import ES, ESConfig, es_step

    pilot = copy.deepcopy(model)
    es = ES(pilot, ESConfig(population=settings.members, subspaces=1, sigma=sigma, alpha=sigma / 2,
                            seed=settings.seed + 3))
    tied, fitness = [], []
    for step in range(1, settings.pilot_steps + 1):
        result = es_step(es, step, objective)
        tied.append(bool(np.all(result.rewards == result.rewards.flat[0])))
        fitness.append(float(np.mean(result.rewards)))
    del pilot
    return {"tied": tied, "tied_share": float(np.mean(tied)), "mean_fitness": fitness}


# --------------------------------------------------------------------------- R
def strict_scores(model, tokenizer, tasks: Sequence, env, rollout_config, seed: int = 0) -> list[float]:
    """Per problem 1.0 where the greedy trajectory earns the reward fully (docs/regime.md#r2-the-base-regime-criterion)."""
    from copes_lib.rollout import evaluate
    from copes_lib.tasks.regime import strict_correctness

    with torch.no_grad():
        result = evaluate(model, tokenizer, list(tasks), env, rollout_config, seed=seed, return_batches=True)
    texts = [t for b in result["batches"] for t in b.model_texts]
    answers = [task.answers for b in result["batches"] for task in b.tasks]
    return strict_correctness(None, texts, answers, env.kind)


def grpo_pilot(profile: str, agent, tuning: Sequence, settings: PreflightSettings, base_strict: Sequence[float],
               *, force: bool = False) -> dict[str, Any]:
    """R: full GRPO for ``pilot_steps`` steps at the registered default rate (cached like 04's runs), then its
    strict tuning score per problem against the base's, paired (mean and 95% interval over problems)."""
    from copes_lib.protocols.paper_a.grpo_arm import grpo_config, grpo_params, grpo_policy, grpo_run

    lr = settings.grpo_lr or grpo_params(profile).FULL_LR
    config = grpo_config(profile, use_lora=False, lr=lr, steps=settings.pilot_steps, patience=0)
    objective = copy.copy(agent.objective)
    objective.val_tasks = list(tuning)
    run = grpo_run(profile, dataclasses.replace(agent, objective=objective), config, label="preflight grpo",
                   force=force)
    policy = grpo_policy(run, "final")
    after = strict_scores(policy, objective.tokenizer, tuning, objective.env, objective.rollout_config)
    diff = np.asarray(after, dtype=float) - np.asarray(base_strict, dtype=float)
    half = 1.96 * diff.std(ddof=1) / math.sqrt(len(diff)) if len(diff) > 1 else math.nan
    return {"lr": lr, "steps": settings.pilot_steps, "base_strict": float(np.mean(base_strict)),
            "pilot_strict": float(np.mean(after)), "gain": float(diff.mean()), "gain_low": float(diff.mean() - half),
            "gain_high": float(diff.mean() + half), "per_problem_gain": diff.tolist(),
            "unit_ids": [t.unit_id for t in tuning]}


def unit_spread(gains: Sequence[float], unit_ids: Sequence[str], top_fraction: float = 0.10) -> dict[str, Any]:
    """U: per-problem gains summed per latent unit, units ranked by that sum, and the share of the total gain
    the top ``top_fraction`` of units (at least one) carry; ``top_share`` is nan when the total gain is not
    above 0 (nothing to spread).

    >>> r = unit_spread([1, 1, 0, 0, 1, 0, 0, 0, 0, 0], list("aabbcdefgh"), 0.1)
    >>> r["units"], r["top_units"], round(r["top_share"], 3)
    (8, 1, 0.667)
    """
    if len(gains) != len(unit_ids):
        raise ValueError(f"{len(gains)} gains for {len(unit_ids)} unit ids")
    per_unit: dict[str, float] = {}
    for gain, unit in zip(gains, unit_ids):
        per_unit[unit] = per_unit.get(unit, 0.0) + float(gain)
    ranked = sorted(per_unit.values(), reverse=True)
    top = max(1, math.ceil(top_fraction * len(ranked)))
    total = float(sum(ranked))
    share = float(sum(ranked[:top]) / total) if total > 0 else math.nan
    return {"units": len(ranked), "top_units": top, "total_gain": total, "top_share": share,
            "units_gaining": sum(v > 0 for v in ranked)}


# --------------------------------------------------------------------------- the base's shape
def decision_margins(model, tokenizer, tasks: Sequence, max_context: int) -> list[float]:
    """Per task, logit(``<answer>``) - logit(first token of ``Answer``) at the first model token of the final
    turn, teacher-forced on the gold trace (prompt, tool calls and observations as the rollout sees them).
    Positive: the base prefers the reward's answer form there."""
    from copes_lib.rollout import encode
    from copes_lib.substrate import LATENT_ANSWER, encode_trace
    from copes_lib.tasks.protocol import ANSWER_OPEN

    answer_id = tokenizer.convert_tokens_to_ids(ANSWER_OPEN)
    latent_id = encode(tokenizer, LATENT_ANSWER.split(" ")[0])[0]
    margins = []
    with torch.no_grad():
        for task in tasks:
            ids, mask = encode_trace(tokenizer, task, max_context)
            starts = [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]
            if not starts:
                raise ValueError(f"task {task.id}: its gold trace has no model-written turn")
            decision = starts[-1]
            logits = model(input_ids=torch.tensor([ids[:decision]], device=model.device)).logits[0, -1]
            margins.append(float(logits[answer_id] - logits[latent_id]))
    return margins


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (nan when either side is constant)."""
    from scipy.stats import spearmanr

    if len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return float(spearmanr(x, y).statistic)


def base_shape(margins: Sequence[float], rates: Sequence[float], g: Sequence[float] | None, *,
               strict_tail: float | None = None, lenient_tail: float | None = None,
               strict_band: tuple[float, float] | None = None, min_lenient: float | None = None) -> dict[str, Any]:
    """The graded base's registered targets (docs/preflight.md#p2-the-graded-base-the-new-headline-base-design,
    read as docs/preflight.md#p83-a-bases-accuracy-is-read-over-its-last-curve-points): 3, the share of prompts
    whose sampled protocol rate is strictly inside (0, 1) (>= 0.5); 4, median |margin| (<= 2.0) and the margin's
    Spearman correlation with g(unit) (>= 0.5; nan and not judged without a graded prior); 1 and 2, when the
    curve's tail means are given, greedy strict inside ``strict_band`` and lenient >= ``min_lenient``.
    ``failed_targets`` lists the targets missed; a target without its values is not judged."""
    rates = np.asarray(rates, dtype=float)
    inside = float(np.mean((rates > 0) & (rates < 1)))
    median_abs = float(np.median(np.abs(margins)))
    rho = spearman(list(margins), list(g)) if g is not None else math.nan
    verdicts = {"3": inside >= 0.5, "4": median_abs <= 2.0 and (g is None or rho >= 0.5)}
    if strict_tail is not None and strict_band is not None:
        verdicts["1"] = strict_band[0] <= strict_tail <= strict_band[1]
    if lenient_tail is not None and min_lenient is not None:
        verdicts["2"] = lenient_tail >= min_lenient
    failed = sorted(t for t, ok in verdicts.items() if not ok)
    return {"rates_inside_share": inside, "margin_median_abs": median_abs, "margin_g_spearman": rho,
            "strict_tail": strict_tail, "lenient_tail": lenient_tail, "targets_judged": sorted(verdicts),
            "failed_targets": failed, "targets_met": not failed}


def shape_bands(kind: str, prior: str | None) -> tuple[tuple[float, float], float]:
    """(strict band of target 1, lenient floor of target 2) of ``kind``'s criterion for ``prior`` (P4)."""
    from copes_lib.tasks.regime import criterion_for

    c = criterion_for(kind, prior)
    return (c.min_strict, c.max_strict), c.min_lenient


def seed_shape(profile: str, kind: str, seed: int, settings: PreflightSettings, *, prior: str | None,
               recipe=None) -> dict[str, Any]:
    """P2's targets 1-4 on warm-start ``seed``'s base of ``kind`` (trained first when not cached): targets 1-2
    from its curve's tail means (:func:`copes_lib.substrate.tail_mean`), 3-4 from ``settings.prompts`` tuning
    prompts (G1's sampling, teacher-forced margins)."""
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.rollout import make_env
    from copes_lib.substrate import tail_mean, unit_rates, warm_rollout_config, warm_start
    from copes_lib.tasks import TUNING_SPLIT, load_tasks

    recipe = recipe or substrate_config(profile)
    model, tokenizer, info = warm_start(profile, kind, seed, config=recipe)
    prompts = load_tasks(profile, kind, TUNING_SPLIT)[: settings.prompts]
    with make_env(kind, profile) as env:
        groups = sampled_groups(model, tokenizer, prompts, env, warm_rollout_config(recipe),
                                group_size=settings.group_size, temperature=settings.temperature, seed=settings.seed)
    margins = decision_margins(model, tokenizer, prompts, recipe.max_context)
    g = None
    if prior == "graded":
        rates = unit_rates(load_tasks(profile, kind, "train"), recipe, kind, seed)
        g = [rates.get(t.unit_id, math.nan) for t in prompts]
    band, min_lenient = shape_bands(kind, prior)
    shape = base_shape(margins, groups["protocol_rate"], g, strict_tail=tail_mean(info["curve"], "val_strict")["mean"],
                       lenient_tail=tail_mean(info["curve"], "val_lenient")["mean"], strict_band=band,
                       min_lenient=min_lenient)
    return {**shape, "seed": seed, "G1": groups["varied_share"], "G2": groups["protocol_mixed_share"]}


# --------------------------------------------------------------------------- verdicts
def judge(values: dict[str, Any], criterion: PreflightCriterion) -> dict[str, Any]:
    """Per precondition ``holds`` / ``fails`` / ``not measured`` from measured ``values`` (keys ``G1`` ...
    ``R_low``; a missing or nan value is not measured), ``met`` (all hold) and ``failed`` (ids that fail or
    were not measured).

    >>> v = {"G1": 0.9, "G2": 0.1, "E1": 0.6, "E2": 0.0, "R": 0.3, "R_low": 0.2, "U": 0.3}
    >>> r = judge(v, PreflightCriterion())
    >>> r["verdicts"]["G2"], r["met"], r["failed"]
    ('fails', False, ['G2'])
    """
    def value(name: str) -> float | None:
        v = values.get(name)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    rules = {"G1": lambda v: v >= criterion.min_varied_groups,
             "G2": lambda v: v >= criterion.min_protocol_groups,
             "E1": lambda v: v >= criterion.min_members_differ,
             "E2": lambda v: v <= criterion.max_tied_steps,
             "R": lambda v: v >= criterion.min_reference_gain and (value("R_low") or -1.0) > 0,
             "U": lambda v: v <= criterion.max_top_unit_gain_share}
    verdicts = {}
    for pid in PRECONDITIONS:
        v = value(pid)
        verdicts[pid] = "not measured" if v is None else ("holds" if rules[pid](v) else "fails")
    failed = [p for p in PRECONDITIONS if verdicts[p] != "holds"]
    return {"verdicts": verdicts, "met": not failed, "failed": failed}


def not_actionable_reason(summary01: dict[str, Any]) -> str | None:
    """``not actionable: <ids>`` when notebook 01's summary says the preflight failed; None when it was met
    or never measured (an older summary)."""
    if summary01.get("preflight_met") is False:
        failed = summary01.get("preflight_failed") or []
        return "not actionable: " + ", ".join(failed) if failed else "not actionable"
    return None


# --------------------------------------------------------------------------- one task kind
def run_preflight(profile: str, kind: str, settings: PreflightSettings, criterion: PreflightCriterion, *,
                  prior: str | None = None, graded: tuple[float, float] | None = None, warm_seed: int = 0,
                  shape_seeds: Sequence[int] | None = None, force: bool = False, log=print) -> dict[str, Any]:
    """Every measurement of docs/preflight.md for ``kind`` on warm-start ``warm_seed``'s base, cached under
    ``cache/<profile>/preflight-<kind>/`` (key: settings, criterion, the base's checksum, the tuning ids).
    Returns the values, the per-precondition verdicts, the calibrated sigma, the curves, the base's shape and its
    digest (``base_digest``, :func:`copes_lib.protocols.testbed.base_digest.state_digest`; what notebook 01 compares with).
    P2's targets gate (docs/preflight.md#p85-the-bases-targets-gate-on-every-seed-the-run-uses) on ``warm_seed``
    and on every seed of ``shape_seeds`` (None: the seeds notebook 01 also trains for ``kind``, math's spread
    seeds); a missed target adds ``shape seed <s>: targets <ids>`` to ``failed``. ``graded`` is kept for
    callers; the rates come from the profile's recipe per kind (:func:`copes_lib.substrate.graded_range`)."""
    from copes_lib.es import checksum
    from copes_lib.protocols.paper_a.es_arm import load_agent, tuning_agent
    from copes_lib.protocols.testbed.base_digest import state_digest
    from copes_lib.protocols.testbed.substrate_setup import run_seeds, substrate_config
    from copes_lib.substrate import tail_mean, unit_rates, warm_rollout_config, warm_start_folder
    from copes_lib.tasks import TUNING_SPLIT, load_tasks

    if shape_seeds is None:
        shape_seeds = [s for s in run_seeds(profile, kind) if s != warm_seed]
    agent = load_agent(profile, kind, seed=warm_seed, batch_size=settings.batch_size)
    tuning_all = load_tasks(profile, kind, TUNING_SPLIT)
    if settings.prompts > len(tuning_all):
        raise ConfigError(f"PREFLIGHT_PROMPTS = {settings.prompts}: the {profile} tuning split of {kind} holds "
                          f"{len(tuning_all)} problems; choose a multiple of the batch size up to that")
    tuned = tuning_agent(agent, min(settings.tuning_problems, len(tuning_all)), "PREFLIGHT_TUNING_PROBLEMS")
    tuning = tuned.objective.val_tasks
    prompts = tuning_all[: settings.prompts]
    key = runs.cache_key({"settings": settings.to_dict(), "criterion": criterion.to_dict(), "kind": kind,
                          "substrate_checksum": checksum(agent.model), "prior": prior, "graded": graded,
                          "design": "P8", "shape_seeds": list(shape_seeds)},
                         [t.id for t in tuning])
    folder = runs.cache_dir(profile, f"preflight-{kind}", key)
    if not force and (folder / "preflight.json").exists():
        cached = runs.read_json(folder / "preflight.json")
        return {**cached, "base_digest": cached.get("base_digest") or state_digest(agent.model), "cached": True}
    import time

    started = time.perf_counter()

    model, objective = agent.model, agent.objective
    env, tokenizer, rcfg = objective.env, objective.tokenizer, objective.rollout_config
    log(f"[preflight {kind}] G1/G2: {len(prompts)} prompts x {settings.group_size} samples at T = {settings.temperature}")
    groups = sampled_groups(model, tokenizer, prompts, env, rcfg, group_size=settings.group_size,
                            temperature=settings.temperature, seed=settings.seed)
    log(f"[preflight {kind}] sigma calibration over {settings.ladder()}")
    calibration = calibrate_sigma(model, objective, settings, criterion.min_members_differ)
    sigma = calibration["sigma"]
    spread = pilot = None
    if sigma is not None:
        log(f"[preflight {kind}] E1 at sigma {sigma}; E2: {settings.pilot_steps} ES steps")
        spread = member_spread(model, objective, prompts, settings, sigma)
        pilot = es_pilot(model, objective, settings, sigma)
    log(f"[preflight {kind}] R: {settings.pilot_steps} full-GRPO steps, strict on {len(tuning)} tuning problems")
    base_strict = strict_scores(model, tokenizer, tuning, env, rcfg)
    reference = grpo_pilot(profile, tuned, tuning, settings, base_strict, force=force)
    recipe = substrate_config(profile)
    margins = decision_margins(model, tokenizer, prompts, recipe.max_context)
    g = None
    if prior == "graded":
        rates = unit_rates(load_tasks(profile, kind, "train"), recipe, kind, warm_seed)
        g = [rates.get(t.unit_id, math.nan) for t in prompts]
    spread_units = unit_spread(reference["per_problem_gain"], reference["unit_ids"], criterion.top_unit_fraction)
    values = {"G1": groups["varied_share"], "G2": groups["protocol_mixed_share"],
              "E1": spread["share"] if spread else None, "E2": pilot["tied_share"] if pilot else None,
              "R": reference["gain"], "R_low": reference["gain_low"], "R_high": reference["gain_high"],
              "U": spread_units["top_share"]}
    verdict = judge(values, criterion)
    folder_warm, complete = warm_start_folder(profile, kind, warm_seed, config=recipe)
    curve = runs.read_json(folder_warm / "info.json").get("curve", []) if complete else []
    band, min_lenient = shape_bands(kind, prior)
    shape = base_shape(margins, groups["protocol_rate"], g, strict_band=band, min_lenient=min_lenient,
                       strict_tail=tail_mean(curve, "val_strict")["mean"] if len(curve) > 1 else None,
                       lenient_tail=tail_mean(curve, "val_lenient")["mean"] if len(curve) > 1 else None)
    seed_shapes = {warm_seed: {**shape, "seed": warm_seed}}
    for other in shape_seeds:
        log(f"[preflight {kind}] P2's targets on warm-start seed {other}")
        seed_shapes[other] = seed_shape(profile, kind, other, settings, prior=prior, recipe=recipe)
    gated = prior == "graded"  # P2's targets are the graded base's (cued / homogeneous / paper: reported only)
    for s, sh in seed_shapes.items():
        if gated and sh["failed_targets"]:
            verdict["failed"].append(f"shape seed {s}: targets {','.join(sh['failed_targets'])}")
    verdict["met"] = not verdict["failed"]
    notes = []
    if sigma is None:
        notes.append(f"E1/E2: no sigma of the ladder {settings.ladder()} made {criterion.min_members_differ:.0%} of "
                     "members differ from the base on every calibration batch")
    out = {"kind": kind, "values": values, **verdict, "sigma": sigma, "alpha": None if sigma is None else sigma / 2,
           "calibration": calibration["curve"], "groups": groups, "spread": spread, "pilot": pilot,
           "reference": reference, "units": spread_units, "margins": margins, "g": g, "shape": shape,
           "seed_shapes": {str(k): v for k, v in seed_shapes.items()}, "warm_seed": warm_seed,
           "notes": notes, "settings": settings.to_dict(), "criterion": criterion.to_dict(),
           "rollout": warm_rollout_config(recipe).to_dict(), "seconds": time.perf_counter() - started,
           "base_digest": state_digest(model)}  # the base measured: notebook 01 compares its own with it
    runs.atomic_write_json(folder / "preflight.json", out)
    return {**out, "cached": False}


def summary_keys(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Flat ``preflight_*`` keys of notebook 01's summary from :func:`run_preflight`'s reports per kind."""
    out: dict[str, Any] = {}
    failed = []
    for kind, r in reports.items():
        for pid in PRECONDITIONS:
            out[f"preflight_{kind}_{pid.lower()}"] = r["values"].get(pid)
            out[f"preflight_{kind}_{pid.lower()}_verdict"] = r["verdicts"].get(pid, "not measured")
        out[f"preflight_{kind}_r_low"] = r["values"].get("R_low")
        out[f"preflight_{kind}_r_high"] = r["values"].get("R_high")
        out[f"preflight_{kind}_sigma"] = r["sigma"]
        out[f"preflight_{kind}_met"] = r["met"]
        for name, value in r["shape"].items():
            out[f"preflight_{kind}_{name}"] = value
        for seed, shape in (r.get("seed_shapes") or {}).items():
            out[f"preflight_{kind}_shape_seed{seed}_failed_targets"] = shape["failed_targets"]
        failed += [f"{kind} {p}" for p in r["failed"]]
    out = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in out.items()}  # flat JSON: no nan
    out["preflight_met"] = not failed
    out["preflight_failed"] = failed
    return out


def table(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (kind, precondition): measured value, floor, verdict, what it means and the paper's analogue."""
    floors = {"G1": ">= {min_varied_groups}", "G2": ">= {min_protocol_groups}", "E1": ">= {min_members_differ}",
              "E2": "<= {max_tied_steps}", "R": ">= {min_reference_gain}, 95% low > 0",
              "U": "top {top_unit_fraction} of units <= {max_top_unit_gain_share} of R's gain"}
    paper = {"G1": "base 49.2% val -> +42 points in 16 GRPO steps", "G2": "GSM8K 9.2 -> 94 in 16 steps (form)",
             "E1": "ES@16 77.6 from 49.2: members must differ", "E2": "no tied steps reported",
             "R": "full GRPO +42 val points in 16 steps", "U": "(ours: a contrast of many units, not a few cues)"}
    rows = []
    for kind, r in reports.items():
        for pid in PRECONDITIONS:
            value = r["values"].get(pid)
            if pid == "R" and value is not None:
                value = f"{value:+.3f} [{r['values']['R_low']:+.3f}, {r['values']['R_high']:+.3f}]"
            rows.append({"kind": kind, "precondition": pid, "meaning": MEANING[pid], "ours": value,
                         "floor": floors[pid].format(**{**PreflightCriterion().to_dict(), **r["criterion"]}),
                         "verdict": r["verdicts"].get(pid, "not measured"),
                         "paper's analogue": paper[pid]})
    return rows


def plot(reports: dict[str, dict[str, Any]]):
    """Per kind: the histogram of per-prompt sampled protocol rates, and the member-spread curve over sigma
    (share of members differing from the base: the mean over the calibration's batches and the lowest batch,
    which is what the rule reads) with the E1 floor, the calibrated sigma and E1's own measurement there."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 2, figsize=(10, 3.2 * len(reports)), squeeze=False)
    for (left, right), (kind, r) in zip(axes, reports.items()):
        rates = (r.get("groups") or {}).get("protocol_rate")
        if rates is not None:
            group = int(r["settings"]["group_size"])  # a rate is k / G: one bar per k (fixed-width bins leave gaps)
            left.hist(rates, bins=(np.arange(group + 2) - 0.5) / group, color="tab:blue", edgecolor="white")
        else:  # a record written before the rates were kept
            left.text(0.5, 0.5, "per-prompt rates not recorded", ha="center", va="center", transform=left.transAxes)
        left.set_xlabel(f"per-prompt sampled protocol rate (G = {r['settings']['group_size']}, T = "
                        f"{r['settings']['temperature']})")
        left.set_ylabel("prompts")
        left.set_title(f"{kind}: G1 {r['values']['G1']:.2f}, G2 {r['values']['G2']:.2f}")
        sigmas = [row["sigma"] for row in r["calibration"]]
        right.plot(sigmas, [row["share"] for row in r["calibration"]], marker="o", label="members differing (mean)")
        lowest = [row.get("min_share") for row in r["calibration"]]
        if None not in lowest:
            right.plot(sigmas, lowest, marker=".", ls="--", color="tab:blue", alpha=0.6,
                       label="lowest calibration batch (the rule)")
        right.axhline(r["criterion"]["min_members_differ"], color="grey", ls=":", label="E1 floor")
        if r["sigma"] is not None:
            right.axvline(r["sigma"], color="green", ls="--", label=f"calibrated sigma {r['sigma']:g}")
            if r["values"].get("E1") is not None:  # fresh members on the tuning prompts: the precondition itself
                right.plot([r["sigma"]], [r["values"]["E1"]], marker="D", color="tab:red", ls="none",
                           label=f"E1 {r['values']['E1']:.2f}, E2 {r['values']['E2']:.2f}")
        right.set_xscale("log")
        right.minorticks_off()  # the ladder's own values as ticks: log minor labels overlap
        right.set_xticks(sigmas, [f"{v:g}" for v in sigmas], rotation=30, fontsize=8)
        right.set_ylim(-0.02, 1.02)
        right.set_xlabel("sigma")
        right.set_ylabel("share of members")
        right.set_title(f"{kind}: ES member spread over sigma")
        right.legend(fontsize=8, loc="upper left")  # the curve rises to the right: its upper left is empty
    fig.tight_layout()
    return fig


#: what a record keeps of each (kind, seed)'s report: enough to judge, tabulate and plot it without the cache
RECORDED = ("values", "verdicts", "met", "failed", "sigma", "alpha", "shape", "seed_shapes", "units", "warm_seed",
            "calibration", "notes", "settings", "criterion", "seconds", "base_digest")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m copes_lib.protocols.testbed.preflight --profile cpu [--kinds math,qa]`` (``make preflight``): the
    preflight of notebook 01 on the profile's cached base (trained first if missing), with 01's PREFLIGHT_*
    parameters, before any experiment: prints the table, writes ``reports/preflight/<profile>.json`` and
    ``.png`` (``--record``: the committed ``results/preflight/<profile>[-<recipe>].json`` and its figure, to which
    the measured seeds are added: a (kind, seed) the record already holds for the same recipe is not measured
    again, and a record of another recipe is an error, never overwritten). Exit 0 when every
    precondition holds (or the profile does not enforce them), 2 when not actionable, 1 on an error
    (:mod:`copes_lib.protocols.testbed.preflight_cli`)."""
    import argparse
    import datetime
    import json

    from copes_lib import threads
    from copes_lib.config import active_recipe
    from copes_lib.protocols.testbed import preflight_cli
    from copes_lib.protocols.testbed.substrate_setup import substrate_params, use_profile_data
    from copes_lib.tasks import recipe_data

    parser = preflight_cli.ArgumentParser(prog="python -m copes_lib.protocols.testbed.preflight", description=main.__doc__)
    preflight_cli.add_options(parser)
    parser.add_argument("--profile", default="cpu", choices=("smoke", "cpu"))
    parser.add_argument("--kinds", default="", help="comma-separated task kinds; default: 01's PREFLIGHT_KINDS")
    parser.add_argument("--force", action="store_true", help="measure again, ignoring the cached preflight")
    parser.add_argument("--seeds", default="", help="comma-separated warm-start seeds, a full preflight on each seed's "
                        "base (docs/preflight.md#p85-the-bases-targets-gate-on-every-seed-the-run-uses: 0,1,2,3,4 before "
                        "a run); default: 01's SEED, with P2's targets on the run's other seeds")
    parser.add_argument("--jobs", type=int, default=1, help="measure this many (kind, seed) pairs at once, each in its "
                        "own process (one thread each; `make preflight JOBS=2` on 2 cores), then tabulate them together")
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # a --jobs worker
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: an integer >= 1 expected (the processes measuring at once)")
    if args.measure_only:  # a worker of measure_in_parallel: it ends with the process that started it
        from copes_lib.substrate import exit_with_parent

        exit_with_parent()
    try:
        seeds = [int(v) for v in args.seeds.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: comma-separated integers >= 0 expected, e.g. 0,1,2,3,4")
    if any(v < 0 for v in seeds) or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds {args.seeds!r}: distinct integers >= 0 expected, e.g. 0,1,2,3,4")
    params = substrate_params(args.profile)
    if args.kinds:
        params = dataclasses.replace(params, PREFLIGHT_KINDS=args.kinds)
    warm = params.warm_start_config()
    settings, criterion = params.preflight_settings(), PreflightCriterion()
    path, figure = preflight_cli.output_paths(args.profile, args.record)
    use_profile_data(args.profile)  # the QA data variant, which the record names
    key = preflight_cli.record_key(warm, settings, criterion, recipe_data(args.profile))
    earlier = preflight_cli.earlier_record(path, key) if args.record and not args.measure_only else {}
    pairs = [(kind, seed) for kind in params.preflight_kinds() for seed in seeds or [params.SEED]]
    label = (lambda kind, seed: f"{kind} seed {seed}") if seeds else (lambda kind, seed: kind)
    done = [pair for pair in pairs if label(*pair) in earlier and not args.force]
    if done:  # resumable: what the record already holds for this recipe is not measured again
        print(f"already recorded in {path.name} for this recipe, not measured again: "
              f"{', '.join(label(*pair) for pair in done)} (--force / FORCE=1 measures them again)")
    pairs = [pair for pair in pairs if pair not in done]
    if args.jobs > 1 and len(pairs) > 1:  # workers fill the cache; the loop below then reads it
        preflight_cli.measure_in_parallel(args.profile, pairs, args.jobs, seeded=bool(seeds), force=args.force)
        args.force = False
    reports = {}
    with threads.fixed_threads():
        for kind, seed in pairs:
            reports[label(kind, seed)] = run_preflight(
                args.profile, kind, settings, criterion, prior=warm.latent_prior if warm.protocol == "latent" else None,
                graded=(warm.graded_low, warm.graded_high), warm_seed=seed, shape_seeds=[] if seeds else None,
                force=args.force)
    if args.measure_only:
        return preflight_cli.EXIT_HOLDS
    git = runs.git_state()
    written = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    measured = {name: {**{k: r[k] for k in RECORDED if k in r}, "groups": {"protocol_rate": r["groups"]["protocol_rate"]},
                       "recorded_git": git.get("git_sha"), "recorded_utc": written}
                for name, r in reports.items()}
    entries = {**earlier, **json.loads(json.dumps(measured, default=str))}
    preflight_cli.print_table(table(entries), MEANING)
    out = {"profile": args.profile, "recipe_name": active_recipe(), **key, "git": git,
           "threads": threads.thread_info(),
           "seeds": sorted({int(label.rsplit(" seed ", 1)[1]) if " seed " in label else r.get("warm_seed", params.SEED)
                            for label, r in entries.items()}),
           "written_utc": written, "kinds": entries}
    runs.atomic_write_json(path, out)
    figure.parent.mkdir(parents=True, exist_ok=True)
    plot(entries).savefig(figure, dpi=110)
    failed = {kind: r["failed"] for kind, r in entries.items()}
    failed = {k: v for k, v in failed.items() if v}
    return preflight_cli.finish(args.profile, failed, path, figure, record=args.record,
                                enforce=params.PREFLIGHT_ENFORCE, strict=args.strict)


__all__ = ["main", "table", "plot", "PRECONDITIONS", "MEANING", "PreflightCriterion", "PreflightSettings", "in_protocol", "sampled_groups",
           "differing_share", "calibrate_sigma", "member_spread", "es_pilot", "strict_scores", "grpo_pilot",
           "decision_margins", "spearman", "base_shape", "shape_bands", "seed_shape", "unit_spread", "judge", "not_actionable_reason", "run_preflight",
           "summary_keys"]


if __name__ == "__main__":
    from copes_lib.protocols.testbed.preflight_cli import guarded

    raise SystemExit(guarded(main))
