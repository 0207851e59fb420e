"""Notebook 09's map of where ES and CoPES work (docs/mechanism.md#m6-the-map-of-where-es-and-copes-work):
latent prior p x population N x regime, strict and lenient gains, the shuffled-fitness and sqrt(K)
alpha controls, the predictions R2 / R5 / R6 / R7, and low rank in its cells (L4,
docs/lowrank_es.md#l4-low-rank-on-the-map)."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from copes_lib.config import ConfigError
from copes_lib.protocols.study.base import (
    _Z95,
    MAP_REGIMES,
    NOTEBOOK,
    ScaleStudyParams,
    Substrate,
    _cached_json,
    _finite,
    cell_units,
    data_profile,
    load_substrate,
    score_problems,
    substrate_units,
    unit_count,
)
from copes_lib.protocols.study.mechanism_study import mechanism
from copes_lib.regime import LOWRANK_MARGIN
from copes_lib.regime import lowrank_reading as lowrank_prediction

MAP_ARMS = ("es", "copes", "es_shuffled", "es_sqrtk")  # the arms of every map cell
# the low-rank arms (docs/lowrank_es.md#l4-low-rank-on-the-map), in MAP_LOWRANK_CELLS only, each paired with
# its full-rank arm (same seeds, same prompt batches): low-rank ES, low-rank CoPES (ES's sigma and alpha)
MAP_LOWRANK_ARMS = {"es_lowrank": "es", "copes_lowrank": "copes"}
# docs/lowrank_es.md#l4-low-rank-on-the-map: the registered rule and margin (regime.LOWRANK_MARGIN,
# regime.lowrank_reading, imported above as lowrank_prediction) live with the other registered predictions


class ShuffledFitness:
    """The shuffled-fitness control: an objective whose member rewards are permuted across the members
    of each step (a fixed permutation per step, seeded by ``seed`` and the step), so an ES update made
    from them keeps every reward's value and spread but none of its link to the member's noise. What ES
    gains from it is what noise alone does at that step length. Everything else (the prompt batches,
    validation) is the wrapped objective's. Needs all members in one ``population_fitness`` call (the
    batched backend with ``members_per_batch`` 0): a permutation within a chunk would be a weaker control."""

    def __init__(self, objective, seed: int):
        self.objective, self.seed = objective, seed

    def __getattr__(self, name):  # batch, rows_per_member, validate, last_scores ...: the wrapped objective's
        return getattr(self.objective, name)

    def permutation(self, step: int, n: int) -> np.ndarray:
        from copes_lib.sampling import mix_seed

        return np.random.default_rng(mix_seed(self.seed, step)).permutation(n)

    def fitness(self, model, step: int) -> float:
        raise ConfigError("the shuffled-fitness control needs BACKEND 'batched' (a whole population per call)")

    def population_fitness(self, model, step: int, n_members: int, row_hook) -> list[float]:
        values = np.asarray(self.objective.population_fitness(model, step, n_members, row_hook), dtype=float)
        return values[self.permutation(step, n_members)].tolist()

    def validate(self, model) -> dict[str, float]:
        return self.objective.validate(model)


def map_arm_config(params: ScaleStudyParams, arm: str, population: int, seed_index: int):
    """ESConfig of a map arm at population N: ``es`` (K = 1), ``copes`` (K = ``map_subspaces(N)``, ES's sigma and
    alpha: the paper's protocol), ``es_shuffled`` (ES on shuffled rewards) and ``es_sqrtk`` (ES at
    sqrt(K) alpha: CoPES's update length with ES's estimator); ``es_lowrank`` / ``copes_lowrank``: ``es`` /
    ``copes`` with low-rank noise of rank ``MAP_LOWRANK_RANK`` (docs/lowrank_es.md#l4-low-rank-on-the-map).
    Built through ESConfig's constructor (options added to it later keep their defaults); the full-rank
    arms never pass ``noise_rank``, so their configs and cache keys are those of before the low-rank arms."""
    from copes_lib.es import ESConfig

    if arm not in (*MAP_ARMS, *MAP_LOWRANK_ARMS):
        raise ConfigError(f"map arm {arm!r}: valid values {[*MAP_ARMS, *MAP_LOWRANK_ARMS]}")
    if arm in MAP_LOWRANK_ARMS and not params.MAP_LOWRANK_RANK:
        raise ConfigError(f"map arm {arm!r} needs MAP_LOWRANK_RANK >= 1 (it is 0: no low-rank arms)")
    full = MAP_LOWRANK_ARMS.get(arm, arm)
    k = params.map_subspaces(population)
    alpha = params.ALPHA * math.sqrt(k) if full == "es_sqrtk" else params.ALPHA
    lowrank = {"noise_rank": params.MAP_LOWRANK_RANK} if arm in MAP_LOWRANK_ARMS else {}
    return ESConfig(population=population, subspaces=k if full == "copes" else 1, sigma=params.SIGMA, alpha=alpha,
                    chunk_size=params.CHUNK_SIZE, backend=params.BACKEND, members_per_batch=0,
                    seed=params.ES_SEED + seed_index, **lowrank)


def map_objective(params: ScaleStudyParams, sub: Substrate, arm: str, seed_index: int):
    """The objective a map arm trains on: the base's, or its shuffled-fitness control."""
    return (ShuffledFitness(sub.objective, seed=params.ES_SEED + 7919 * (seed_index + 1)) if arm == "es_shuffled"
            else sub.objective)


def map_base(params: ScaleStudyParams, sub: Substrate) -> dict[str, Any]:
    """A map base's greedy per-problem strict and lenient scores and its criterion values
    (docs/regime.md#r2-the-base-regime-criterion)."""
    from copes_lib.regime import measure_regime

    def compute():
        scores, result = score_problems(sub.model, sub.tokenizer, sub.val_tasks, sub.env, sub.rollout_config)
        greedy = dataclasses.replace(sub.rollout_config, temperature=0.0, top_p=1.0)
        regime = measure_regime(sub.model, sub.tokenizer, sub.val_tasks, sub.env, greedy)
        return {"scores": scores, "strict": result["strict_scores"], "lenient": result["lenient_scores"],
                "criterion": {k: v for k, v in regime.items() if isinstance(v, (bool, int, float)) or v is None}}

    return _cached_json(params, "map_base", sub.key, compute)


def map_es_arm(params: ScaleStudyParams, sub: Substrate, arm: str, population: int, seed_index: int,
               base: dict[str, Any]) -> dict[str, Any]:
    """One map arm's run of ``MAP_STEPS`` steps from a copy of the base: per-problem strict / lenient scores."""
    from copes_lib import runs
    from copes_lib.es_training import train_es

    config = map_arm_config(params, arm, population, seed_index)
    key = {**sub.key, "map_arm": arm, "es": config.to_dict(), "steps": params.MAP_STEPS,
           "batch_size": params.BATCH_SIZE, "batch_seed": params.BATCH_SEED}
    accuracy = float(np.mean(base["scores"]))

    def compute():
        folder = runs.cache_dir(params.PROFILE, "map_es_runs", runs.cache_key(key))
        history = train_es(copy.deepcopy(sub.model), map_objective(params, sub, arm, seed_index), config,
                           steps=params.MAP_STEPS, val_every=params.MAP_STEPS, run_dir=folder, resume=False,
                           base_validation={"score": accuracy, "accuracy": accuracy},
                           log_prefix=f"map {arm} N {population} seed {seed_index}").history
        trained = history[1:]
        obj = sub.objective
        return {"scores": list(obj.last_scores), "strict": list(obj.last_strict), "lenient": list(obj.last_lenient),
                "mean_update_norm": float(np.mean([r["es/update_norm"] for r in trained])),
                "mean_step_s": float(np.mean([r["time/step_s"] for r in trained]))}

    return _cached_json(params, "map_es", key, compute)


def map_grpo_arm(params: ScaleStudyParams, sub: Substrate, seed_index: int) -> dict[str, Any]:
    """Full GRPO from a map base to ``MAP_GRPO_STEPS``: strict / lenient per problem at the map's budget
    and at the horizon (the reference)."""
    from copes_lib import runs
    from copes_lib.grpo import GRPOConfig, train_grpo

    config = GRPOConfig(group_size=params.GROUP_SIZE, prompt_batch_size=params.GRPO_PROMPT_BATCH,
                        mini_batch_size=params.GRPO_PROMPT_BATCH, micro_batch_size=params.MICRO_BATCH,
                        lr=params.GRPO_LR, total_steps=params.MAP_GRPO_STEPS,
                        val_every=min(params.MAP_STEPS, params.MAP_GRPO_STEPS), seed=42 + seed_index)
    key = {**sub.key, "grpo": config.to_dict()}

    def compute():
        kept: list[dict[str, list[float]]] = []  # one entry per validation, in train_grpo's order

        def evaluate_fn(model, tokenizer, tasks, env, cfg, seed):
            scores, result = score_problems(model, tokenizer, tasks, env, cfg)
            kept.append({"scores": scores, "strict": result.pop("strict_scores"),
                         "lenient": result.pop("lenient_scores")})
            return result

        folder = runs.cache_dir(params.PROFILE, "map_grpo_runs", runs.cache_key(key))
        result = train_grpo(copy.deepcopy(sub.model), sub.tokenizer, sub.env, sub.objective.train_tasks,
                            sub.val_tasks, config, folder, rollout_config=sub.rollout_config, resume=False,
                            evaluate_fn=evaluate_fn)
        by_step = dict(zip(result.val_by_step, kept, strict=True))
        budget = by_step[min(params.MAP_STEPS, params.MAP_GRPO_STEPS)]
        horizon = by_step[params.MAP_GRPO_STEPS]
        return {**budget, "horizon_strict": horizon["strict"], "horizon_lenient": horizon["lenient"],
                "mean_step_s": float(np.mean([r["time/step_s"] for r in result.history[1:]]))}

    return _cached_json(params, "map_grpo", key, compute)


def map_bases(params: ScaleStudyParams) -> list[tuple[str, float | None]]:
    """(regime, p) of every map base, in ``MAP_REGIMES`` order: one latent (cued-prior) base per prior, one
    graded base (p does not apply: each cue value has its own rate), one homogeneous base at
    ``MAP_HEADLINE_P``, one skill-gap base (p does not apply)."""
    out: list[tuple[str, float | None]] = []
    for regime in params.map_regimes():
        if regime == "latent":
            out += [("latent", p) for p in params.map_priors()]
        elif regime == "homogeneous":
            out.append(("homogeneous", params.MAP_HEADLINE_P))
        else:
            out.append((regime, None))
    return out


def map_tag(regime: str, p: float | None, population: int | None = None) -> str:
    """A map cell's summary-key suffix: ``latent_p0_1_n40``, ``homogeneous_p0_1_n40``, ``graded_n40``,
    ``skill_gap_n40`` (a base: without ``_n``)."""
    tag = regime if p is None else f"{regime}_p{p:g}".replace(".", "_")
    return tag if population is None else f"{tag}_n{population}"


def load_map_base(params: ScaleStudyParams, regime: str, p: float | None) -> Substrate:
    """A map base at ``MAP_SIZE``: a latent-protocol warm start (cued prior at p; the graded prior; the
    homogeneous prior at p), or the skill-gap control (01's paper recipe, or exactly ``MAP_SKILL_STEPS`` steps)."""
    if regime == "latent":
        return load_substrate(params, params.MAP_SIZE, latent_p=p)
    if regime == "graded":
        return load_substrate(params, params.MAP_SIZE, prior="graded")
    if regime == "homogeneous":
        return load_substrate(params, params.MAP_SIZE, latent_p=p, prior="homogeneous")
    if regime == "skill_gap":
        return load_substrate(params, params.MAP_SIZE, warm_steps=params.MAP_SKILL_STEPS or None)
    raise ConfigError(f"map regime {regime!r}: valid values {list(MAP_REGIMES)}")


# the preconditions measured per map base (docs/mechanism.md#m6-the-map-of-where-es-and-copes-work): E2 and R need a
# pilot run each (8 ES steps, 8 full-GRPO steps at 01's settings) per base, which the map's budget does not hold;
# the map's own full-GRPO reference per base (MAP_GRPO_SEEDS x MAP_GRPO_STEPS) is R's analogue
MAP_PRECONDITIONS = ("G1", "G2", "E1")


def map_preflight_settings(params: ScaleStudyParams):
    """(PreflightSettings, PreflightCriterion) of the map's preflight: notebook 01's ``PREFLIGHT_*`` parameters of the
    profile whose data the map uses (:func:`data_profile`), and the registered floors."""
    from copes_lib.protocols.testbed.preflight import PreflightCriterion
    from copes_lib.protocols.testbed.substrate_setup import substrate_params

    return substrate_params(data_profile(params)).preflight_settings(), PreflightCriterion()


def map_preflight(params: ScaleStudyParams, sub: Substrate) -> dict[str, Any]:
    """G1 / G2 (:func:`preflight.sampled_groups`), the calibrated sigma (:func:`preflight.calibrate_sigma`) and E1
    (:func:`preflight.member_spread`) on one map base, on the tuning split, as notebook 01 measures them on its own
    base; E1 also at the map's own ``SIGMA`` (descriptive: the sigma the map's arms run at). Cached per base and
    settings."""
    from copes_lib.protocols.testbed import preflight
    from copes_lib.tasks import TUNING_SPLIT, load_tasks

    settings, criterion = map_preflight_settings(params)
    tuning = load_tasks(data_profile(params), "math", TUNING_SPLIT)
    if settings.prompts > len(tuning):
        raise ConfigError(f"PREFLIGHT_PROMPTS = {settings.prompts} (notebook 01's, read by 09's map preflight): the "
                          f"{data_profile(params)} tuning split holds {len(tuning)} math problems; valid: a multiple "
                          f"of PREFLIGHT_BATCH up to {len(tuning)}, or MAP_PREFLIGHT false")
    prompts = tuning[: settings.prompts]
    key = {**sub.key, "preflight": settings.to_dict(), "criterion": criterion.to_dict(), "map_sigma": params.SIGMA,
           "tuning_ids": [t.id for t in prompts]}

    def compute():
        t0 = time.perf_counter()
        # the calibration's batches are training batches of the preflight's size, as in notebook 01
        objective = copy.copy(sub.objective)
        objective.batch_size = settings.batch_size
        groups = preflight.sampled_groups(sub.model, sub.tokenizer, prompts, sub.env, sub.rollout_config,
                                          group_size=settings.group_size, temperature=settings.temperature,
                                          seed=settings.seed)
        calibration = preflight.calibrate_sigma(sub.model, objective, settings, criterion.min_members_differ)
        sigma = calibration["sigma"]
        spread = None if sigma is None else preflight.member_spread(sub.model, objective, prompts, settings, sigma)
        at_map_sigma = preflight.member_spread(sub.model, objective, prompts, settings, params.SIGMA)
        values = {"G1": groups["varied_share"], "G2": groups["protocol_mixed_share"],
                  "E1": spread["share"] if spread else None}
        return {"values": values, "sigma": sigma, "calibration": calibration["curve"],
                "protocol_rate": groups["protocol_rate"], "protocol_rate_mean": groups["protocol_rate_mean"],
                "e1_map_sigma": at_map_sigma["share"], "settings": settings.to_dict(),
                "criterion": criterion.to_dict(), "cost_s": time.perf_counter() - t0}

    return _cached_json(params, "map_preflight", key, compute)


def map_preflight_summary(params: ScaleStudyParams, base_run: dict[str, Any]) -> dict[str, Any]:
    """Flat preflight values of one map base (keys without the ``map_`` prefix and the base's tag): ``preflight_<g1|
    g2|e1>`` with ``_verdict`` (docs/preflight.md P1's floors; ``not measured`` where E1 had no calibrated sigma),
    ``preflight_sigma``, ``preflight_e1_map_sigma``, ``preflight_failed`` (the measured preconditions that fail),
    and R's analogue ``preflight_r_analogue`` (+ ``_low``, ``_high``, ``_verdict``): full GRPO's strict gain at
    ``MAP_GRPO_STEPS`` over the base on validation (seeds x latent units x problems within units), judged by R's
    floor. Empty without a preflight."""
    from copes_lib.protocols.testbed.preflight import PreflightCriterion, judge

    pre = base_run.get("preflight")
    if not pre:
        return {}
    reference = map_delta(base_run["base"], [{"strict": r["horizon_strict"]} for r in base_run["grpo"]], "strict",
                          units=cell_units(base_run))
    r_value, r_low, r_high = _finite(reference.estimate), _finite(reference.low), _finite(reference.high)
    verdict = judge({**pre["values"], "R": r_value, "R_low": r_low}, PreflightCriterion(**pre["criterion"]))
    if pre["sigma"] is None:  # no sigma of the ladder made enough members differ: E1 fails (docs/preflight.md P3, 1)
        verdict["verdicts"]["E1"] = "fails"
    out: dict[str, Any] = {}
    for pid in MAP_PRECONDITIONS:
        out[f"preflight_{pid.lower()}"] = pre["values"].get(pid)
        out[f"preflight_{pid.lower()}_verdict"] = verdict["verdicts"][pid]
    out.update(preflight_sigma=pre["sigma"], preflight_e1_map_sigma=pre["e1_map_sigma"],
               preflight_protocol_rate_mean=pre["protocol_rate_mean"],
               preflight_failed=[p for p in MAP_PRECONDITIONS if verdict["verdicts"][p] == "fails"],
               preflight_r_analogue=r_value, preflight_r_analogue_low=r_low, preflight_r_analogue_high=r_high,
               preflight_r_analogue_verdict=verdict["verdicts"]["R"], preflight_cost_s=pre.get("cost_s"))
    return out


def run_map_base(params: ScaleStudyParams, sub: Substrate, regime: str, p: float | None, log=print
                 ) -> dict[str, Any]:
    """Every cell of one map base: {"base", "grpo", "mechanism", "cells": {N: {arm: [runs]}}, "units", ...};
    ``units``: each validation problem's latent unit (``Substrate.units``, from the tasks: the cached scores carry
    none; a cued base's unit is its cue letter), which every interval of the base's cells resamples."""
    base = map_base(params, sub)
    out: dict[str, Any] = {"regime": regime, "p": p, "n_params": sub.n_params, "warm_steps": sub.warm_steps,
                           "converged": sub.warm_info.get("converged"), "base": base,
                           "units": list(substrate_units(params, sub, cued=regime == "latent") or ())}
    log(f"[{NOTEBOOK}] map {map_tag(regime, p)}: strict {np.mean(base['strict']):.3f} lenient "
        f"{np.mean(base['lenient']):.3f}")
    out["grpo"] = [map_grpo_arm(params, sub, g) for g in range(params.MAP_GRPO_SEEDS)]
    out["cells"] = {}
    lowrank_ns = [cn for cr, cp, cn in params.map_lowrank_cells() if (cr, cp) == (regime, p)]
    for n in params.map_populations():
        arms = MAP_ARMS if n in params.map_control_populations() else ("es", "copes")
        arms = (*arms, *MAP_LOWRANK_ARMS) if n in lowrank_ns else arms  # paired with es / copes: same seeds, batches
        out["cells"][n] = {arm: [map_es_arm(params, sub, arm, n, s, base) for s in range(params.MAP_SEEDS)]
                           for arm in arms}
        log(f"[{NOTEBOOK}] map {map_tag(regime, p, n)}: " + ", ".join(
            f"{arm} strict {np.mean([r['strict'] for r in rows]):.3f}" for arm, rows in out["cells"][n].items()))
    mech_params = dataclasses.replace(params, POPULATION=params.MAP_HEADLINE_N,
                                      SUBSPACES=params.map_subspaces(params.MAP_HEADLINE_N))
    out["mechanism"] = mechanism(mech_params, sub) if params.MAP_MECHANISM and params.MECH_RANDOM else None
    out["preflight"] = map_preflight(params, sub) if params.MAP_PREFLIGHT else None
    if out["preflight"]:
        log(f"[{NOTEBOOK}] map {map_tag(regime, p)} preflight: " + ", ".join(
            f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in out["preflight"]["values"].items())
            + f", sigma {out['preflight']['sigma']}")
    return out


def _rows(runs_: list[dict[str, Any]], metric: str) -> np.ndarray:
    return np.asarray([r[metric] for r in runs_], dtype=float)


def map_delta(base: dict[str, Any], runs_: list[dict[str, Any]], metric: str, *, units=None):
    """stats.compare of an arm's ``metric`` (strict, lenient, or ``protocol`` = strict - lenient per
    problem) against its base's: Delta S, Delta L, Delta S - Delta L; seeds x latent units x problems within
    units with ``units`` (the base's :func:`cell_units`), else seeds x problems."""
    from copes_lib import stats

    def pick(rows, m):
        return _rows(rows, "strict") - _rows(rows, "lenient") if m == "protocol" else _rows(rows, m)

    return stats.compare(pick(runs_, metric), pick([base], metric), name=f"delta {metric}", expected_sign=1,
                         paired_seeds=False, units=units)


def map_gain_recovery(base_run: dict[str, Any], runs_: list[dict[str, Any]]) -> dict[str, float | None]:
    """Strict gain recovery (arm - base) / (full GRPO at its horizon - base) with stats.gain_recovery_interval
    (the base's latent units, the problems within them and both arms' seeds resampled: GRPO's seed noise is
    inside the interval)."""
    from copes_lib import stats

    grpo = np.asarray([r["horizon_strict"] for r in base_run["grpo"]], dtype=float)
    arms = {"method": _rows(runs_, "strict"), "base": _rows([base_run["base"]], "strict"), "full_grpo": grpo}
    seeds = {name: tuple(range(len(x))) for name, x in arms.items()}
    rec = stats.gain_recovery_interval(stats.ScoreSet("strict", arms, seeds, units=cell_units(base_run)), "method")
    return {"mean": _finite(rec.estimate), "low": _finite(rec.low), "high": _finite(rec.high),
            "grpo_gain": float(grpo.mean() - np.mean(base_run["base"]["strict"])), "note": rec.note}


def map_gap(cell: dict[str, list], a: str = "copes", b: str = "es", *, units=None):
    """stats.compare of arm ``a`` - arm ``b`` in strict accuracy, same base, seeds paired; cluster-aware over
    ``units`` (the base's :func:`cell_units`)."""
    from copes_lib import stats

    return stats.compare(_rows(cell[a], "strict"), _rows(cell[b], "strict"), name=f"{a} - {b}", expected_sign=1,
                         paired_seeds=True, units=units)


def line_fit(x: list[float], values: list[float | None], lows: list[float | None],
             highs: list[float | None]) -> dict[str, Any]:
    """Least-squares slope of ``values`` over ``x`` with its 95% interval from the per-point 95% intervals
    (points independent: variances add; slope_test's rule on a linear axis). Points without a finite
    value and interval are left out; None with fewer than 2 points."""
    pts = [(xi, v, lo, hi) for xi, v, lo, hi in zip(x, values, lows, highs)
           if all(z is not None and math.isfinite(z) for z in (xi, v, lo, hi))]
    out: dict[str, Any] = {"slope": None, "low": None, "high": None, "n_points": len(pts)}
    from copes_lib import stats

    xs = np.array([p[0] for p in pts])
    if len(pts) < 2 or float(((xs - xs.mean()) ** 2).sum()) == 0:
        return out
    slope, _, low, high = stats.slope_interval(xs, [p[1] for p in pts], [p[2] for p in pts], [p[3] for p in pts],
                                               z=_Z95)
    out.update(slope=slope, low=low, high=high)
    return out


def map_predictions(params: ScaleStudyParams, bases: dict[tuple[str, float | None], dict[str, Any]]
                    ) -> dict[str, float | None]:
    """R2, R5, R6, R7 of docs/regime.md#r4-predictions-ours-registered-before-the-run on the map, as
    ``prediction_R<i>_value`` / ``_low`` / ``_high`` (docs/mechanism.md#m6-the-map-of-where-es-and-copes-work
    says how each is computed); None where the map lacks the cells."""
    out: dict[str, float | None] = {}
    n0, p0 = params.MAP_HEADLINE_N, params.MAP_HEADLINE_P

    def put(rid, value, low, high):
        out[f"prediction_{rid}_value"], out[f"prediction_{rid}_low"], out[f"prediction_{rid}_high"] = (
            _finite(value), _finite(low), _finite(high))

    latent = {p: b for (regime, p), b in bases.items() if regime == "latent"}
    skill = bases.get(("skill_gap", None))
    # R2: Delta S of ES at p = 0, N = MAP_HEADLINE_N (seeds x latent units x problems within units)
    if 0.0 in latent:
        c = map_delta(latent[0.0]["base"], latent[0.0]["cells"][n0]["es"], "strict", units=cell_units(latent[0.0]))
        put("R2", c.estimate, c.low, c.high)
    else:
        put("R2", None, None, None)
    # R5: ES gain recovery (latent, headline p) - (skill gap), both at N = MAP_HEADLINE_N; the two bases are
    # independent, so the interval adds their variances (each from its stats.gain_recovery_interval)
    put("R5", *recovery_contrast(latent.get(p0), skill, n0, "es"))
    # R6: slope of ES gain recovery over p (latent bases, N = MAP_HEADLINE_N)
    ps = sorted(latent)
    recs6 = [map_gain_recovery(latent[p], latent[p]["cells"][n0]["es"]) for p in ps]
    fit = line_fit(ps, [r["mean"] for r in recs6], [r["low"] for r in recs6], [r["high"] for r in recs6])
    put("R6", fit["slope"], fit["low"], fit["high"])
    out["prediction_R6_points"] = fit["n_points"]
    # R7: slope of CoPES - ES (strict) over log10(N / d_eff), every cell whose base has a positive d_eff
    xs, vs, lo, hi = [], [], [], []
    for b in bases.values():
        d_eff = base_d_eff(b)["d_eff"]
        if d_eff is None or not d_eff > 0:
            continue
        for n, cell in b["cells"].items():
            c = map_gap(cell, units=cell_units(b))
            xs.append(math.log10(n / d_eff))
            vs.append(c.estimate)
            lo.append(c.low)
            hi.append(c.high)
    fit = line_fit(xs, vs, lo, hi)
    put("R7", fit["slope"], fit["low"], fit["high"])
    out["prediction_R7_points"] = fit["n_points"]
    return out


def base_d_eff(base: dict[str, Any]) -> dict[str, Any]:
    """A map base's d_eff for R7 (docs/mechanism.md#m6-the-map-of-where-es-and-copes-work): the Hessian's
    (M1) where it is defined, else the Gauss-Newton curvature's of the same surrogate (positive
    semi-definite by construction, so defined wherever the surrogate exists); ``source`` says which, and
    ``undefined_reason`` why the Hessian's was not used."""
    mech = base.get("mechanism") or {}
    hessian, ggn = mech.get("curvature") or {}, mech.get("curvature_ggn") or {}
    if hessian.get("d_eff") is not None:
        return {"d_eff": hessian["d_eff"], "low": hessian.get("d_eff_low"), "high": hessian.get("d_eff_high"),
                "source": "hessian", "undefined_reason": None}
    reason = hessian.get("undefined_reason") or ("no mechanism measurement" if not mech else "not recorded")
    if ggn.get("d_eff") is not None:
        return {"d_eff": ggn["d_eff"], "low": ggn.get("d_eff_low"), "high": ggn.get("d_eff_high"), "source": "ggn",
                "undefined_reason": reason}
    return {"d_eff": None, "low": None, "high": None, "source": None, "undefined_reason": reason}


def recovery_contrast(latent: dict[str, Any] | None, skill: dict[str, Any] | None, n: int, arm: str
                      ) -> tuple[float | None, float | None, float | None]:
    """R5's quantity for ``arm``: its gain recovery on the latent base minus on the skill-gap base, both at N
    = n, with a 95% interval (the two bases are independent: the half-widths of their gain-recovery
    intervals add in quadrature); (None, None, None) where a base or the arm is missing, no interval where
    a recovery's interval is undefined."""
    bases = [b for b in (latent, skill) if b is not None and arm in b["cells"].get(n, {})]
    if len(bases) < 2:
        return None, None, None
    recs = [map_gain_recovery(b, b["cells"][n][arm]) for b in bases]
    if None in (recs[0]["mean"], recs[1]["mean"]):
        return None, None, None
    d = recs[0]["mean"] - recs[1]["mean"]
    if any(r[k] is None for r in recs for k in ("low", "high")):
        return d, None, None
    se = math.hypot(*[(r["high"] - r["low"]) / (2 * _Z95) for r in recs])
    return d, d - _Z95 * se, d + _Z95 * se


def map_cell_summary(base_run: dict[str, Any], n: int) -> dict[str, Any]:
    """Flat values of one map cell (keys without the ``map_`` prefix and the cell's tag)."""
    cell, base, units = base_run["cells"][n], base_run["base"], cell_units(base_run)
    s: dict[str, Any] = {}
    for arm in [a for a in (*MAP_ARMS, *MAP_LOWRANK_ARMS) if a in cell]:
        for metric, name in (("strict", "delta_s"), ("lenient", "delta_l"), ("protocol", "delta_protocol")):
            c = map_delta(base, cell[arm], metric, units=units)
            s[f"{arm}_{name}"], s[f"{arm}_{name}_low"], s[f"{arm}_{name}_high"] = (
                c.estimate, _finite(c.low), _finite(c.high))
        s[f"{arm}_strict"] = float(_rows(cell[arm], "strict").mean())
        s[f"{arm}_lenient"] = float(_rows(cell[arm], "lenient").mean())
        rec = map_gain_recovery(base_run, cell[arm])
        s[f"{arm}_gain_recovery"], s[f"{arm}_gain_recovery_low"], s[f"{arm}_gain_recovery_high"] = (
            rec["mean"], rec["low"], rec["high"])
        s[f"{arm}_update_norm"] = float(np.mean([r["mean_update_norm"] for r in cell[arm]]))
        s[f"{arm}_step_s"] = float(np.mean([r["mean_step_s"] for r in cell[arm]]))
    for a, b in [(a, b) for a, b in (("copes", "es"), ("es", "es_shuffled"), ("copes", "es_sqrtk"),
                                     *MAP_LOWRANK_ARMS.items()) if a in cell and b in cell]:
        c = map_gap(cell, a, b, units=units)
        s[f"{a}_minus_{b}"], s[f"{a}_minus_{b}_low"], s[f"{a}_minus_{b}_high"] = (
            c.estimate, _finite(c.low), _finite(c.high))
        s[f"{a}_minus_{b}_verdict"] = c.verdict
        if a in MAP_LOWRANK_ARMS:  # the registered rule of docs/lowrank_es.md#l4-low-rank-on-the-map
            moved = any(r["mean_update_norm"] > 0 for r in (*cell[a], *cell[b]))
            s[f"{a}_minus_{b}_prediction"] = (lowrank_prediction(_finite(c.low), _finite(c.high)) if moved
                                              else "not judged")  # both returned the base: 0 by construction
    return s


def map_summary(params: ScaleStudyParams, bases: dict[tuple[str, float | None], dict[str, Any]]) -> dict[str, Any]:
    """09's map keys (``map_*``; docs/mechanism.md#m6-the-map-of-where-es-and-copes-work) and the predictions."""
    out: dict[str, Any] = {"map_size": params.MAP_SIZE, "map_priors": params.map_priors(),
                           "map_populations": params.map_populations(), "map_regimes": params.map_regimes(),
                           "map_subspaces": [params.map_subspaces(n) for n in params.map_populations()],
                           "map_control_populations": params.map_control_populations(), "map_seeds": params.MAP_SEEDS,
                           "map_grpo_seeds": params.MAP_GRPO_SEEDS, "map_steps": params.MAP_STEPS,
                           "map_grpo_steps": params.MAP_GRPO_STEPS, "map_headline_p": params.MAP_HEADLINE_P,
                           "map_headline_n": params.MAP_HEADLINE_N, "map_mechanism_per": "base",
                           "map_bases": [map_tag(*b) for b in bases],
                           "map_preflight": bool(params.MAP_PREFLIGHT),
                           "map_preflight_measured": list(MAP_PRECONDITIONS) if params.MAP_PREFLIGHT else []}
    for (regime, p), b in bases.items():
        tag = map_tag(regime, p)
        grpo = np.asarray([r["horizon_strict"] for r in b["grpo"]])
        out.update({f"map_n_params_{tag}": b["n_params"], f"map_warm_steps_{tag}": b["warm_steps"],
                    f"map_converged_{tag}": b["converged"],
                    f"map_base_strict_{tag}": float(np.mean(b["base"]["strict"])),
                    f"map_base_lenient_{tag}": float(np.mean(b["base"]["lenient"])),
                    f"map_regime_criterion_met_{tag}": b["base"]["criterion"].get("met"),
                    f"map_grpo_strict_{tag}": float(grpo.mean()),
                    f"map_grpo_lenient_{tag}": float(np.mean([r["horizon_lenient"] for r in b["grpo"]])),
                    f"map_grpo_seed_sd_{tag}": float(grpo.mean(axis=1).std(ddof=1)) if len(grpo) > 1 else None})
        # the units every interval of the base's cells rests on (its problems where none are recorded)
        out[f"map_units_{tag}"], out[f"map_units_effective_{tag}"] = unit_count(b)
        d_eff = base_d_eff(b)
        out[f"map_d_eff_{tag}"], out[f"map_d_eff_source_{tag}"] = d_eff["d_eff"], d_eff["source"]
        out[f"map_d_eff_low_{tag}"], out[f"map_d_eff_high_{tag}"] = d_eff["low"], d_eff["high"]
        out[f"map_d_eff_hessian_undefined_{tag}"] = d_eff["undefined_reason"]
        out.update({f"map_{k}_{tag}": v for k, v in map_preflight_summary(params, b).items()})
        for n in b["cells"]:
            cell = {**map_cell_summary(b, n), "subspaces": params.map_subspaces(n)}
            out.update({f"map_{k}_{map_tag(regime, p, n)}": v for k, v in cell.items()})
    out.update(map_predictions(params, bases))
    out.update(map_lowrank_summary(params, bases, out))
    return out


def map_lowrank_summary(params: ScaleStudyParams, bases: dict, keys: dict[str, Any]) -> dict[str, Any]:
    """The low-rank arms' overall reading (docs/lowrank_es.md#l4-low-rank-on-the-map): ``map_lowrank_prediction``
    is ``does not agree`` if any cell and arm does not, ``agrees`` if every one agrees, else
    ``inconclusive`` (a ``not judged`` cell included); None without low-rank arms. Per-cell values are ``map_<arm>_*_<c>`` (map_cell_summary)."""
    cells = [c for c in params.map_lowrank_cells() if c[:2] in bases and c[2] in bases[c[:2]]["cells"]]
    readings = [keys.get(f"map_{a}_minus_{b}_prediction_{map_tag(*c)}") for c in cells
                for a, b in MAP_LOWRANK_ARMS.items()]
    overall = (None if not readings else "does not agree" if "does not agree" in readings
               else "agrees" if all(r == "agrees" for r in readings) else "inconclusive")
    out = {"map_lowrank_rank": params.MAP_LOWRANK_RANK, "map_lowrank_cells": [map_tag(*c) for c in cells],
           "map_lowrank_margin": LOWRANK_MARGIN, "map_lowrank_prediction": overall}
    # descriptive, no rule reads it: R5's latent-minus-skill-gap contrast with low-rank ES in place of ES, beside
    # prediction_R5_value (where ES works, at low rank)
    latent = bases.get(("latent", params.MAP_HEADLINE_P)) if "latent" in params.map_regimes() else None
    value, low, high = recovery_contrast(latent, bases.get(("skill_gap", None)), params.MAP_HEADLINE_N, "es_lowrank")
    out.update(map_lowrank_R5_value=_finite(value), map_lowrank_R5_low=_finite(low), map_lowrank_R5_high=_finite(high))
    return out


def save_map_scores(params: ScaleStudyParams, out_dir: str | Path, bases: dict) -> None:
    """Per-seed per-problem strict and lenient scores of every map cell (stats contract), metric
    ``map_<strict|lenient>_<tag>``, with each problem's latent unit."""
    from copes_lib import stats

    for (regime, p), b in bases.items():
        for n, cell in b["cells"].items():
            for metric in ("strict", "lenient"):
                arms = {"base": _rows([b["base"]], metric),
                        "full_grpo": np.asarray([r[f"horizon_{metric}"] for r in b["grpo"]], dtype=float),
                        **{arm: _rows(rows, metric) for arm, rows in cell.items()}}
                seeds = {"base": [0], "full_grpo": [42 + g for g in range(len(b["grpo"]))],
                         **{arm: [params.ES_SEED + s for s in range(len(rows))] for arm, rows in cell.items()}}
                stats.save_scores(out_dir, f"map_{metric}_{map_tag(regime, p, n)}", arms, seeds, units=cell_units(b))
