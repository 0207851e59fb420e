"""The fixed-budget protocol of paper A (notebooks 05 and 07; 06 reuses its ES arm): full GRPO's best
validation step sets the budget, ES and CoPES run over paired seeds for it, standard ES continues to
find its best checkpoint, and histories become the paper's quantities (gain recovery, paired
differences, steps to match).

The runs themselves are cached runs of ``copes_lib.es`` and ``copes_lib.grpo``
(``protocols.paper_a.es_arm``, ``protocols.paper_a.grpo_arm``); test decoding is ``protocols.paper_a.decoding``.

The protocol, next to the paper (docs/paper_a_copes.md):

1. full GRPO is trained and validated until it stops improving (notebook 04's PATIENCE validations
   without a new best, capped at its STEPS); its best validation step s* sets the budget (the paper:
   s* = 16). ``BUDGET_STEPS > 0`` fixes the budget instead (stated in the notebook). A peak at the last
   step of a capped run is reported as censored.
2. standard ES, CoPES and LoRA-GRPO run for the budget; ES and CoPES with several seeds. Seed i
   uses noise seed ``ES_SEED + i`` and prompt-batch seed ``BATCH_SEED + i`` for BOTH methods, so
   ES and CoPES of one seed see the same prompt batches (paired).
3. standard ES seed 0 (or ``LONG_SEEDS`` seeds) is continued from its budget checkpoint to
   ``ES_LONG_STEPS`` (resuming the cached run, identical to an uninterrupted one) to find its best
   checkpoint and the first validated step at which it reaches CoPES's budget-level accuracy.
4. gain recovery = (method - base) / (full GRPO best - base) on validation accuracy.
5. test decoding: temperature 0.3, top-p 1, n samples per problem, unbiased pass@k for k = 1..n.

How it departs from the paper (and why):
- Several seeds where the paper ran once. The claims are tested on per-seed per-problem scores at the
  budget (``budget_scores``, saved with ``stats.save_scores``; seeds x problems noise, Holm over the
  notebook's family in ``copes_lib.claims``); the Student-t intervals and paired t over seeds printed
  by the notebooks are descriptive.
- The headline is the paper's protocol (CoPES at standard ES's sigma and alpha, as published); two
  controls sit beside it (``protocol_arms``): CoPES at its own tuned setting (notebook 03's sweep, ties
  broken by ``es_arm.SWEEP_TIE_RULE``) and step-matched CoPES (alpha / sqrt(K), ES's update norm); at
  this scale the choice can decide the sign of the comparison (docs/prior_measurements.md).
- GRPO and ES draw prompt batches from one sampler (``sampling.prompt_batch``) with their own seeds
  (GRPO's 42, ES's BATCH_SEED), so GRPO's batches are not paired with ES's; every method is validated
  on the same problems.
- Step costs are this machine's measured wall time per training step (validation excluded, as in
  A5), counting the machine as one device; "est. device-hours" = mean step cost x steps.
- ``BACKEND = "ray"`` spreads the members over Ray workers (one per GPU on a GPU cluster; ``RAY_ADDRESS``):
  the workers rebuild the agent with the run's own batch seed (``AgentSetup.worker_args``).
- Notebook 05 test-decodes ES and CoPES at seed 0's checkpoint only (cost; its pass@k intervals are
  over problems); notebook 07 test-decodes every seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from copes_lib import runs, stats
from copes_lib.config import ConfigError
from copes_lib.grpo import GRPOConfig
from copes_lib.protocols.histories import (
    SCORE,
    best_validated,
    mean_curve,
    steps_to_match,
    val_at,
)
from copes_lib.protocols.paper_a import decoding
from copes_lib.protocols.paper_a.es_arm import AgentSetup, ESRun, continue_runs, es_model, seed_runs
from copes_lib.protocols.paper_a.grpo_arm import (
    GRPORun,
    grpo_config,
    grpo_params,
    grpo_policy,
    grpo_run,
    peak_report,
)


def upstream_settings(params: Any) -> dict[str, Any]:
    """sigma / alpha of ES (02's choice) and CoPES (03's own best), GRPO rates (04), with their source."""
    s02 = runs.load_summary(params.PROFILE, "02_standard_es") if params.READ_UPSTREAM else None
    s03 = runs.load_summary(params.PROFILE, "03_copes") if params.READ_UPSTREAM else None
    s04 = runs.load_summary(params.PROFILE, "04_grpo") if params.READ_UPSTREAM else None
    out: dict[str, Any] = {"es_sigma": params.SIGMA, "es_alpha": params.ALPHA, "es_source": "parameters"}
    if s02 and s02.get("chosen_sigma"):
        out.update(es_sigma=s02["chosen_sigma"], es_alpha=s02["chosen_alpha"], es_source="02_standard_es")
    out.update(copes_sigma=getattr(params, "COPES_SIGMA", out["es_sigma"]),
               copes_alpha=getattr(params, "COPES_ALPHA", out["es_alpha"]), copes_source="parameters")
    if s03 and s03.get("own_best_sigma"):
        out.update(copes_sigma=s03["own_best_sigma"], copes_alpha=s03["own_best_alpha"], copes_source="03_copes")
    grpo = grpo_params(params.PROFILE)  # the one GRPO configuration: notebook 04's parameters
    out.update(full_lr=grpo.FULL_LR, lora_lr=grpo.LORA_LR, grpo_source="parameters")
    if s04 and s04.get("full_lr"):
        out.update(full_lr=s04["full_lr"], lora_lr=s04["lora_lr"], grpo_source="04_grpo")
    return out


@dataclass
class FixedBudgetRuns:
    """Everything the fixed-budget protocol trained, by arm, and the comparisons at the budget."""

    full: GRPORun  # full GRPO, searched for its best validation step
    grpo_config: GRPOConfig
    s_star: int  # full GRPO's best validation step
    grpo_best: float  # its validation accuracy (F1 on QA) there
    base: float  # the warm start's validation accuracy
    budget: int
    es_runs: list[ESRun]
    copes_runs: dict[str, list[ESRun]]  # CoPES arm name -> its seed runs
    compare: dict[str, dict[str, Any]]  # CoPES arm name -> compare_at_budget(ES, that arm)
    long_runs: list[ESRun]  # standard ES continued to ES_LONG_STEPS
    long_steps: list[int] = field(default_factory=list)
    long_curve: list[float] = field(default_factory=list)
    match: dict[str, int | None] = field(default_factory=dict)  # first step long ES reaches each CoPES arm
    metric: str = SCORE  # the validation metric of every history (eval/val_score: accuracy on math, F1 on QA)
    full_seeds: list[GRPORun] = field(default_factory=list)  # every full-GRPO reference seed ([0] is ``full``)
    reference_best: float | None = None  # the gain recoveries' reference: mean over full_seeds of each best

    def __post_init__(self) -> None:
        if not self.full_seeds:
            self.full_seeds = [self.full]
        if self.reference_best is None:
            self.reference_best = self.grpo_best


def protocol_arms(params: Any, settings: dict[str, Any]) -> dict[str, tuple[str, float, float, int]]:
    """Notebook 05's three CoPES protocols, name -> (label, sigma, alpha, seeds): ``paper`` (CoPES at ES's
    sigma / alpha, as published), ``tuned`` (CoPES's own sweep, notebook 03) and ``step_matched`` (ES's
    sigma, alpha / sqrt(K): the update norm of standard ES). HEADLINE gets SEEDS seeds, the two controls
    CONTROL_SEEDS (the first seeds of the same pairing)."""
    k = params.SUBSPACES
    arms = {"paper": ("CoPES paper protocol", settings["es_sigma"], settings["es_alpha"]),
            "tuned": ("CoPES tuned", settings["copes_sigma"], settings["copes_alpha"]),
            "step_matched": ("CoPES step-matched", settings["es_sigma"], settings["es_alpha"] / math.sqrt(k))}
    return {name: (*arm, params.SEEDS if name == params.HEADLINE else params.CONTROL_SEEDS)
            for name, arm in arms.items()}


def run_fixed_budget(params: Any, agent: AgentSetup, settings: dict[str, Any], *, grpo_steps: int,
                     copes_arms: dict[str, tuple], grpo_label: str = "full GRPO", es_label: str = "ES",
                     metric: str = SCORE, reference_seeds: int = 1) -> FixedBudgetRuns:
    """The protocol of notebooks 05 and 07, steps 1-3 of the module docstring.

    1. full GRPO (the shared configuration, ``settings["full_lr"]``, stopped at its peak by notebook 04's
       PATIENCE) capped at ``grpo_steps``; its best validation step s* is the budget unless BUDGET_STEPS
       fixes it;
    2. standard ES (``settings["es_sigma"]`` / ``["es_alpha"]``) over SEEDS paired seeds and each CoPES
       arm of ``copes_arms`` (name -> (label, sigma, alpha[, seeds]), seeds default SEEDS) for the
       budget; an arm with the same sigma / alpha as an earlier one reuses its runs (the cache);
    3. the first LONG_SEEDS ES seeds continued to ES_LONG_STEPS: their mean curve, and the first step at
       which it reaches each CoPES arm's mean at the budget.

    ``metric``: the history key compared, ``eval/val_score`` by default: the metric both training loops
    select checkpoints on (accuracy on math, F1 on QA), so full GRPO's s* and the ES / CoPES values agree.

    ``reference_seeds``: full-GRPO seeds (seed i = GRPO_SEED + i, notebook 04's cached reference runs when
    the validation sets agree); seed 0 sets the budget, every gain recovery divides by the mean over the
    seeds of each one's best (docs/reference.md#r4-notebook-05s-references-carry-every-seed-registered-2026-12-03).
    """
    if reference_seeds < 1:
        raise ConfigError(f"reference_seeds = {reference_seeds}: must be >= 1 (full-GRPO reference seeds)")
    configs = [grpo_config(params.PROFILE, use_lora=False, lr=settings["full_lr"], steps=grpo_steps, seed_index=i)
               for i in range(reference_seeds)]
    config = configs[0]
    full_seeds = [grpo_run(params.PROFILE, agent, c, label=grpo_label if i == 0 else f"{grpo_label} seed {i}",
                           force=params.FORCE) for i, c in enumerate(configs)]
    full = full_seeds[0]
    s_star, grpo_best = best_validated(full.history, metric=metric)
    reference_best = float(np.mean([best_validated(r.history, metric=metric)[1] for r in full_seeds]))
    base = full.val_by_step[0]
    budget = budget_from(params, s_star)
    if params.ES_LONG_STEPS < budget:
        raise ConfigError(f"ES_LONG_STEPS = {params.ES_LONG_STEPS} must be >= the budget ({budget} steps: "
                          f"{'BUDGET_STEPS' if params.BUDGET_STEPS else 'full GRPO s*'}); raise ES_LONG_STEPS")
    es_runs = seed_runs(params, agent, subspaces=1, sigma=settings["es_sigma"], alpha=settings["es_alpha"],
                        steps=budget, label=es_label)
    copes_runs: dict[str, list[ESRun]] = {}
    done: dict[tuple[float, float], list[ESRun]] = {}
    for name, (label, sigma, alpha, *rest) in copes_arms.items():
        n = rest[0] if rest else params.SEEDS
        if len(done.get((sigma, alpha), [])) < n:
            done[(sigma, alpha)] = seed_runs(params, agent, subspaces=params.SUBSPACES, sigma=sigma, alpha=alpha,
                                             steps=budget, label=label, seeds=n)
        copes_runs[name] = done[(sigma, alpha)][:n]
    compare = {name: compare_at_budget(es_runs, arm, budget, base, reference_best, metric)
               for name, arm in copes_runs.items()}
    long_runs = continue_runs(params, agent, es_runs[:params.LONG_SEEDS], params.ES_LONG_STEPS)
    long_steps, long_curve = mean_curve([r.history for r in long_runs], metric)
    match = {name: steps_to_match(long_steps, long_curve, c["copes"]["mean"]) for name, c in compare.items()}
    return FixedBudgetRuns(full, config, s_star, grpo_best, base, budget, es_runs, copes_runs, compare, long_runs,
                           long_steps, long_curve, match, metric, full_seeds, reference_best)


def lora_runs(params: Any, agent: AgentSetup, frb: FixedBudgetRuns, settings: dict[str, Any], *,
              seeds: int | None = None, label: str = "LoRA-GRPO") -> list[GRPORun]:
    """LoRA-GRPO at the budget over ``seeds`` seeds (None: notebook 04's LORA_SEEDS), seed i = GRPO_SEED + i,
    each trained for exactly ``frb.budget`` steps (no early stop) at ``settings["lora_lr"]``; cached runs, seed 0
    the one notebook 05 trained before (docs/reference.md#r4-notebook-05s-references-carry-every-seed-registered-2026-12-03)."""
    n = grpo_params(params.PROFILE).LORA_SEEDS if seeds is None else seeds
    if n < 1:
        raise ConfigError(f"seeds = {n}: must be >= 1 (LoRA-GRPO seeds at the budget)")
    return [grpo_run(params.PROFILE, agent, grpo_config(params.PROFILE, use_lora=True, lr=settings["lora_lr"],
                                                        steps=frb.budget, patience=0, seed_index=i),
                     label=label if i == 0 else f"{label} seed {i}", force=params.FORCE) for i in range(n)]


def norm_matched_runs(params: Any, agent: AgentSetup, settings: dict[str, Any], budget: int, *,
                      label: str = "ES sqrt(K) x alpha") -> list[ESRun]:
    """The norm-matched control (docs/regime.md#r12-is-copes-more-than-a-larger-step-registered-2026-12-03):
    standard ES at ES's sigma and sqrt(SUBSPACES) x its alpha, CoPES's update norm, over SEEDS seeds paired
    with ES's and CoPES's (seed i: noise seed ES_SEED + i, batch seed BATCH_SEED + i) for ``budget`` steps."""
    return seed_runs(params, agent, subspaces=1, sigma=settings["es_sigma"],
                     alpha=math.sqrt(params.SUBSPACES) * settings["es_alpha"], steps=budget, label=label)


class ReferenceRetrainedWarning(UserWarning):
    """Notebook 05 trains its own full-GRPO reference runs instead of reusing notebook 04's."""


def reference_reuse(params: Any, agent: AgentSetup) -> dict[str, Any]:
    """Whether notebook 05's full-GRPO reference seeds are notebook 04's cached runs
    (docs/reference.md#r4-notebook-05s-references-carry-every-seed-registered-2026-12-03). A GRPO run's cache
    key holds its validation problems, so where 04 validated on other problems than 05 (04's ``N_VAL`` first
    problems of the validation split against 05's ``VAL_PROBLEMS``; on real data the split itself is 01's
    ``VAL_HOLDOUT`` problems) 05 trains its own ``GRPO_SEEDS`` reference runs. R4 allows that (the smoke
    profile's 04 validates on fewer problems) but it must not pass unseen: the reference is then not the
    one 04 reports. Returns ``reference_retrained`` and ``reference_retrained_reason`` (None when 04's runs
    are reused), and warns (``ReferenceRetrainedWarning``, printed too) when they are not."""
    import warnings

    from copes_lib.protocols.testbed.substrate_setup import substrate_params
    from copes_lib.tasks import load_tasks

    g = grpo_params(params.PROFILE)
    split = load_tasks(params.PROFILE, "math", "val")
    ids04 = [t.id for t in split[:g.N_VAL]]
    ids05 = [t.id for t in agent.objective.val_tasks]
    if ids04 == ids05:
        return {"reference_retrained": False, "reference_retrained_reason": None}
    holdout = substrate_params(params.PROFILE).VAL_HOLDOUT
    wanted = "all" if not params.VAL_PROBLEMS else f"the first {params.VAL_PROBLEMS}"
    reason = (f"notebook 04 validated its full-GRPO runs on its N_VAL = {g.N_VAL} first validation problems "
              f"({len(ids04)} of the split's {len(split)}; 01's VAL_HOLDOUT = {holdout} sets the split on real data), "
              f"05 validates on VAL_PROBLEMS = {params.VAL_PROBLEMS} ({wanted}: {len(ids05)} problems): a GRPO run's "
              f"cache key holds its validation problems, so 05 trains its own {g.GRPO_SEEDS} full-GRPO reference "
              "run(s) instead of reusing 04's, and its reference values are not the ones 04 reports (set 04's N_VAL "
              "and 05's VAL_PROBLEMS to the same problems to reuse them; docs/reference.md R4)")
    warnings.warn(f"05's full-GRPO reference is RETRAINED: {reason}", ReferenceRetrainedWarning, stacklevel=2)
    print(f"WARNING: 05's full-GRPO reference is RETRAINED: {reason}")
    return {"reference_retrained": True, "reference_retrained_reason": reason}


def budget_from(params: Any, s_star: int) -> int:
    """The budget: BUDGET_STEPS when set, else full GRPO's s*, capped at BUDGET_MAX (> 0; the cpu cost
    bound, stated by :func:`budget_text`) and at least VAL_EVERY (a GRPO that never beats its base has
    s* = 0: the methods still get one validation interval)."""
    if params.BUDGET_STEPS:
        return params.BUDGET_STEPS
    cap = getattr(params, "BUDGET_MAX", 0) or s_star
    return max(min(s_star, cap), params.VAL_EVERY)


def budget_text(params: Any, s_star: int, budget: int) -> str:
    """How the budget was set, for the notebook's note (``budget_note``)."""
    if params.BUDGET_STEPS:
        return f"budget fixed at {budget} steps by BUDGET_STEPS (full GRPO's s* = {s_star}; paper: s* = 16)"
    if budget < s_star:
        return (f"budget = {budget} steps: full GRPO's s* = {s_star} capped at BUDGET_MAX = {params.BUDGET_MAX} "
                "(the cpu cost bound; paper: s* = 16)")
    if budget > s_star:
        return f"budget = {budget} steps = VAL_EVERY: full GRPO's s* = {s_star} (it never beat the base)"
    return f"budget = full GRPO's best validation step s* = {s_star} (paper: 16)"


def compare_at_budget(es_runs: Sequence[ESRun], copes_runs: Sequence[ESRun], budget: int, base: float,
                      grpo_best: float, metric: str = SCORE) -> dict[str, Any]:
    """Validation accuracy at the budget per seed, gain recovery, and the paired CoPES - ES difference
    (over the seeds both arms ran; ``es`` itself is over all of ES's seeds)."""
    es_vals = [val_at(r.history, budget, metric) for r in es_runs]
    copes_vals = [val_at(r.history, budget, metric) for r in copes_runs]
    if None in es_vals or None in copes_vals:
        raise ValueError(f"a run has no validation at the budget step {budget}")
    es_stats, copes_stats = seed_stats(es_vals), seed_stats(copes_vals)
    n = min(len(es_vals), len(copes_vals))
    return {
        "es_vals": es_vals, "copes_vals": copes_vals, "es": es_stats, "copes": copes_stats,
        "gain_recovery_es": gain_recovery_or_none(es_stats["mean"], base, grpo_best),
        "gain_recovery_copes": gain_recovery_or_none(copes_stats["mean"], base, grpo_best),
        "gain_recovery_es_per_seed": [gain_recovery_or_none(v, base, grpo_best) for v in es_vals],
        "gain_recovery_copes_per_seed": [gain_recovery_or_none(v, base, grpo_best) for v in copes_vals],
        "copes_minus_es": paired_comparison(copes_vals[:n], es_vals[:n]),
    }


def gain_recovery_or_none(method: float | None, base: float, reference: float) -> float | None:
    """stats.gain_recovery, or None when full GRPO did not move above the base (undefined)."""
    if method is None or reference <= base:
        return None
    return stats.gain_recovery(method, base, reference)


def seed_stats(values: Sequence[float]) -> dict[str, float | None]:
    mean, low, high = stats.mean_ci(values)
    nan_to_none = lambda x: None if x is None or not math.isfinite(x) else float(x)  # noqa: E731
    return {"mean": mean, "low": nan_to_none(low), "high": nan_to_none(high), "n": len(values)}


def paired_comparison(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> dict[str, Any]:
    """Paired a - b across seeds; ``significant`` is p < alpha (False when p is undefined)."""
    diff = stats.paired_difference(a, b)
    finite = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in diff.items()}
    finite["significant"] = bool(diff["p"] is not None and math.isfinite(diff["p"]) and diff["p"] < alpha)
    return finite


PROTOCOL_NAMES = {"paper": "paper's protocol (CoPES at ES's sigma / alpha, as published)",
                  "tuned": "tuned control (CoPES at its own sweep's best sigma / alpha)",
                  "step_matched": "step-matched control (CoPES at ES's sigma, alpha / sqrt(K): ES's update norm)"}


def protocol_reading(compare: dict[str, dict[str, Any]], headline: str,
                     intervals: dict[str, Any] | None = None) -> list[str]:
    """Sentences on notebook 05's protocols: CoPES - ES under each (paired over that arm's seeds), which
    one is the headline, and how the controls move CoPES's edge relative to the paper's protocol. With
    ``intervals`` (:func:`budget_intervals`) each difference is read from the per-problem scores with its
    cluster-aware 95% interval and unit count; without them, the paired t over seed means (descriptive)."""
    lines = []
    for proto, c in compare.items():
        d = c["copes_minus_es"]
        role = "HEADLINE" if proto == headline else "control"
        head = f"{PROTOCOL_NAMES.get(proto, proto)} [{role}, {int(d['n'])} paired seed(s)]: CoPES - ES = "
        sfx = f"_{proto}_protocol"
        if intervals is not None and f"copes_minus_es_val_accuracy{sfx}" in intervals:
            g = _difference_keys(intervals, sfx)
            lines.append(head + f"{100 * g['val_accuracy']:+.2f} points at the budget, 95% interval "
                         f"[{100 * g['ci_low']:+.2f}, {100 * g['ci_high']:+.2f}] over "
                         f"{units_phrase(g['units'], g['units_effective'], intervals.get('interval_unit_ids'))} "
                         f"(seeds x units x problems within units; p = {g['p']:.3g} before Holm, which the "
                         "claims table applies over 05's family).")
            continue
        p = "undefined" if d["p"] is None else f"{d['p']:.3g}"
        lines.append(head + f"{100 * d['mean']:+.2f} points at the budget (paired t over seeds, p = {p}; the claims "
                     "table tests the headline with seeds x units x problems noise).")
    if headline in compare:
        for proto in compare:
            if proto == headline:
                continue
            delta = compare[proto]["copes_minus_es"]["mean"] - compare[headline]["copes_minus_es"]["mean"]
            lines.append(f"CoPES's edge under the {proto} control is {100 * delta:+.2f} points vs the headline "
                         f"(seed means; the control ran {compare[proto]['copes']['n']} seed(s)).")
    lines.append(f"The headline keys use the {headline} protocol, declared before the run.")
    return lines


# =========================================================================== cluster-aware intervals
def units_phrase(n_units: int, effective: float | None, unit_ids: bool | None = True) -> str:
    """How many units an interval rests on: ``128 latent units`` (``(effective 120)`` where sizes differ),
    or ``512 problems as independent units (no unit ids)``."""
    if not unit_ids:
        return f"{n_units} problems as independent units (no unit ids)"
    eff = "" if effective is None or round(effective) >= n_units else f" (effective {effective:.0f})"
    return f"{n_units} latent units{eff}"


def unit_counts(units: Sequence[str] | None, n_problems: int) -> tuple[int, float, str]:
    """(units an interval rests on, Kish's effective number of them, how it resamples) for ``n_problems``
    problem columns: with ``units`` (one id per column, else a clear error) the latent units; without, every
    problem its own unit (the interval is then the problem-level one, too narrow wherever units matter)."""
    if units is None:
        return n_problems, float(n_problems), "seeds x problems, problems as independent units (no unit ids)"
    _, sizes = stats.unit_codes(units, n_problems)
    return (len(sizes), stats.effective_units(sizes),
            "seeds x latent units x problems within units (stats.compare with units; means: "
            "stats.hierarchical_bootstrap with units); docs/statistics.md S6")


def budget_intervals(arms: dict[str, np.ndarray], units: Sequence[str] | None, protocols: Sequence[str],
                     headline: str, *, level: float = 0.95, n_boot: int = 2000) -> dict[str, Any]:
    """Notebook 05's intervals at the budget from the per-problem scores of :func:`budget_scores`, cluster-aware
    (docs/statistics.md#s6-latent-units-registered-2026-12-03): seeds, the latent units and the problems
    within them are resampled (modelled), never the problems as independent draws.

    Keys (summary.json; ``<sfx>`` is ``_<protocol>_protocol`` for every protocol and also empty for the
    headline): ``copes_minus_es_val_accuracy<sfx>`` (mean CoPES - ES over the seeds both arms ran, from the
    scores: the logged validation values within 2 problems), ``copes_minus_es_ci_low<sfx>`` / ``_ci_high<sfx>``
    (the ``level`` interval of ``stats.compare``, seeds paired, ``units``), ``copes_minus_es_p<sfx>`` (its p
    before Holm), ``copes_minus_es_significant<sfx>`` (p < 1 - level with both arms' seed noise measured),
    ``copes_minus_es_units<sfx>`` / ``_units_effective<sfx>`` (the units it rests on; Kish's effective number);
    ``val_accuracy_es_at_budget_ci_low`` / ``_ci_high`` / ``_units`` and ``val_accuracy_copes_at_budget_ci_low<sfx>``
    / ``_ci_high<sfx>`` / ``_units<sfx>`` (:func:`mean_interval`: the seeds x units x problems bootstrap);
    ``interval_units``, ``interval_units_effective``, ``interval_unit_ids`` (False: no unit ids given, every
    problem its own unit, and the intervals are too narrow wherever units matter) and ``interval_method``.
    The CoPES arm of a protocol is ``copes_<protocol>_protocol`` where :func:`budget_scores` wrote one, else
    ``copes`` (the headline's)."""
    es = np.atleast_2d(np.asarray(arms["es"], dtype=float))
    n_units, effective, method = unit_counts(units, es.shape[1])
    out: dict[str, Any] = {"interval_units": n_units, "interval_units_effective": effective,
                           "interval_unit_ids": units is not None, "interval_method": method}

    def mean_keys(key: str, scores: np.ndarray, sfx: str = "") -> dict[str, Any]:
        _, low, high = mean_interval(scores, level=level, n_boot=n_boot, units=units)
        return {f"{key}_ci_low{sfx}": low, f"{key}_ci_high{sfx}": high, f"{key}_units{sfx}": n_units}

    out.update(mean_keys("val_accuracy_es_at_budget", es))
    for proto in protocols:
        arm = f"copes_{proto}_protocol" if f"copes_{proto}_protocol" in arms else "copes"
        if arm == "copes" and proto != headline:
            raise ValueError(f"arms hold no 'copes_{proto}_protocol' scores for the {proto} protocol")
        copes = np.atleast_2d(np.asarray(arms[arm], dtype=float))
        n = min(len(copes), len(es))  # a control ran the first seeds of the same pairing
        c = stats.compare(copes[:n], es[:n], name=f"CoPES ({proto}) - ES", paired_seeds=True, units=units,
                          alpha=1 - level)
        keys = {"copes_minus_es_val_accuracy": c.estimate, "copes_minus_es_ci_low": c.low,
                "copes_minus_es_ci_high": c.high, "copes_minus_es_p": c.p,
                "copes_minus_es_significant": bool(c.p < 1 - level and c.seed_noise_counted),
                "copes_minus_es_units": n_units, "copes_minus_es_units_effective": effective}
        for sfx in ([""] if proto == headline else []) + [f"_{proto}_protocol"]:
            out.update({f"{k}{sfx}": v for k, v in keys.items()})
            out.update(mean_keys("val_accuracy_copes_at_budget", copes, sfx))
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def _difference_keys(intervals: dict[str, Any], sfx: str) -> dict[str, Any]:
    """A protocol's CoPES - ES keys of :func:`budget_intervals`, without the prefix and the suffix."""
    return {k: intervals[f"copes_minus_es_{k}{sfx}"] for k in ("val_accuracy", "ci_low", "ci_high", "p",
                                                                "significant", "units", "units_effective")}


def interval_text(intervals: dict[str, Any], key: str, sfx: str = "") -> str:
    """``[low, high]`` in % with its units, from :func:`budget_intervals`' ``<key>_ci_low<sfx>`` / ``_ci_high`` /
    ``_units``; empty where the interval is undefined."""
    low, high = intervals.get(f"{key}_ci_low{sfx}"), intervals.get(f"{key}_ci_high{sfx}")
    if low is None or high is None:
        return ""
    return f"[{100 * low:.1f}, {100 * high:.1f}] over {intervals[f'{key}_units{sfx}']} units"


def comparison_frame(params: Any, settings: dict[str, Any], compare: dict[str, dict[str, Any]],
                     intervals: dict[str, Any]):
    """Notebook 05's comparison table (``comparison.csv``): per protocol, ES and CoPES at the budget (values
    per seed, mean, the cluster-aware 95% interval with its units, gain recovery) and CoPES - ES (paired,
    from the per-problem scores, its interval, units and p before Holm), from :func:`budget_intervals`."""
    import pandas as pd

    arms = protocol_arms(params, settings)
    unit_ids = intervals.get("interval_unit_ids")
    rows = []
    for proto, c in compare.items():
        sfx = f"_{proto}_protocol"
        for method in ("es", "copes"):
            key, ksfx = (("val_accuracy_es_at_budget", "") if method == "es"
                         else ("val_accuracy_copes_at_budget", sfx))
            rows.append({"protocol": proto, "method": method,
                         "sigma": arms[proto][1] if method == "copes" else settings["es_sigma"],
                         "alpha": arms[proto][2] if method == "copes" else settings["es_alpha"],
                         "val acc per seed": [round(v, 4) for v in c[f"{method}_vals"]], "mean": c[method]["mean"],
                         "95% CI": interval_text(intervals, key, ksfx),
                         "units": units_phrase(intervals[f"{key}_units{ksfx}"], intervals["interval_units_effective"],
                                               unit_ids),
                         "gain recovery": c[f"gain_recovery_{method}"]})
        g = _difference_keys(intervals, sfx)
        rows.append({"protocol": proto, "method": "CoPES - ES (paired)", "mean": g["val_accuracy"],
                     "95% CI": interval_text(intervals, "copes_minus_es", sfx),
                     "units": units_phrase(g["units"], g["units_effective"], unit_ids),
                     "gain recovery": f"p = {g['p']:.3g} (before Holm)",
                     "val acc per seed": "significant" if g["significant"] else "not significant"})
    return pd.DataFrame(rows)


# =========================================================================== per-problem scores
def budget_scores(params: Any, agent: AgentSetup, frb: FixedBudgetRuns, *,
                  lora: GRPORun | Sequence[GRPORun] | None = None, headline: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, list[int]],
                                                        dict[str, float]]:
    """Per-seed per-validation-problem greedy scores of every arm's weights at the budget step (the
    claims' ``val_accuracy_at_budget`` / ``val_f1_at_budget``), via ``decoding.greedy_scores``
    (cached by weights).

    Arms: ``es``; ``copes`` (the headline protocol; ``headline`` None: the only CoPES arm) and
    ``copes_<protocol>_protocol`` for each CoPES arm; ``lora_grpo`` (the weights at the budget of each run
    in ``lora``: one row per seed), ``full_grpo`` (each reference seed's best checkpoint, ``frb.full_seeds``)
    and ``base`` (one row). Rows are labelled by seed: ES and CoPES seed i by ``ES_SEED + i`` (paired), the
    GRPO arms by each run's GRPO seed, the base by SEED.

    Returns (arms, seeds, gaps): ``gaps[arm]`` is the largest |mean of the scores - the run's logged
    validation value| over its rows; the notebook asserts it is within 2 / n problems.
    """
    tasks = agent.objective.val_tasks
    arms: dict[str, np.ndarray] = {}
    seeds: dict[str, list[int]] = {}
    gaps: dict[str, float] = {}

    def add(arm: str, models: list[tuple[Any, float, int]]) -> None:
        rows = [decoding.greedy_scores(params, agent, model, tasks, label=f"{arm} seed {seed}")
                for model, _, seed in models]
        arms[arm] = np.stack(rows)
        seeds[arm] = [seed for _, _, seed in models]
        gaps[arm] = float(max(abs(row.mean() - logged) for row, (_, logged, _) in zip(rows, models)))

    def es_rows(runs_: Sequence[ESRun]) -> list[tuple[Any, float, int]]:
        return [(es_model(agent, r, "final"), val_at(r.history, frb.budget, frb.metric),
                 params.ES_SEED + r.seed_index) for r in runs_]

    add("es", es_rows(frb.es_runs))
    if headline is None and len(frb.copes_runs) == 1:
        headline = next(iter(frb.copes_runs))
    for name, arm_runs in frb.copes_runs.items():
        if name == headline:
            add("copes", es_rows(arm_runs))
        if len(frb.copes_runs) > 1:
            add(f"copes_{name}_protocol", es_rows(arm_runs))
    if lora is not None:
        loras = [lora] if isinstance(lora, GRPORun) else list(lora)
        add("lora_grpo", [(grpo_policy(r, "final"), r.val_by_step[frb.budget], r.seed) for r in loras])
    add("full_grpo", [(grpo_policy(r, "best"), best_validated(r.history, metric=frb.metric)[1], r.seed)
                      for r in frb.full_seeds])
    add("base", [(agent.model, frb.base, params.SEED)])
    return arms, seeds, gaps


def problem_units(tasks: Sequence[Any]) -> tuple[str, ...]:
    """The latent unit of each problem, in the tasks' order: ``Task.unit_id`` (the subject name the prior keys
    on, copes_lib.tasks.units); a task record without one falls back to its ``cue`` field, then to its own id
    (a problem that is its own unit). Saved beside the scores, so the claims' intervals resample units."""
    return tuple(str(getattr(t, "unit_id", "") or getattr(t, "cue", "") or t.id) for t in tasks)


def save_budget_scores(out_dir: Any, metric: str, arms: dict[str, np.ndarray], seeds: dict[str, list[int]],
                       a: str = "copes", b: str = "es", *, scale: float = 100, unit: str = " points",
                       units: Sequence[str] | None = None) -> str:
    """Save the arms (``stats.save_scores``, with each problem's latent unit when ``units`` is given) and
    return the power note of ``a`` vs ``b`` (the MDE now, and for a planned study with twice the seeds;
    cluster-aware with ``units``)."""
    stats.save_scores(out_dir, metric, arms, seeds, units=units)
    n = min(len(arms[a]), len(arms[b]))
    if n < 2:
        return stats.power_note(arms[a], arms[b], scale=scale, unit=unit, units=units)
    return stats.power_note(arms[a][:n], arms[b][:n], n_seeds=2 * n, scale=scale, unit=unit, units=units)


def mean_interval(scores: np.ndarray, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0,
                  units: Sequence[str] | None = None) -> tuple[float, float, float]:
    """Mean of a (seeds, problems) array and its ``level`` interval from the seeds x problems bootstrap
    (``stats.hierarchical_bootstrap`` against a zero arm; with ``units``, units then problems within them);
    with one seed only problems (units) are resampled."""
    scores = np.atleast_2d(np.asarray(scores, dtype=float))
    zero = np.zeros((1, scores.shape[1]))
    reps = stats.hierarchical_bootstrap(scores, zero, n_boot=n_boot, seed=seed, paired_seeds=False, units=units)
    tail = (1 - level) / 2
    return float(scores.mean()), float(np.quantile(reps, tail)), float(np.quantile(reps, 1 - tail))


def curve_band(runs_: Sequence[ESRun], units: Sequence[str] | None, *, metric: str = SCORE, level: float = 0.95,
               n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """A validation curve's band over seeds x latent units (docs/statistics.md#s6-latent-units-registered-2026-12-03;
    notebook 05's Fig. S4): at each step every run validated, the seed mean of the logged ``metric`` and the
    ``level`` interval of the per-problem scores the runs recorded there (``ESRun.val_scores``, one row per run)
    from the seeds x units x problems-within-units bootstrap (:func:`mean_interval`, the budget intervals'
    resampling, with the same draws at every step; one run: units and problems only). At a step where a run
    recorded no scores (a run cached before they were recorded) the band is the Student-t interval over the
    seeds (one seed: none), and ``label`` says so.

    Returns ``steps``, ``mean``, ``low`` / ``high`` (None: no band at that step), ``over_units`` (per step: the
    band resamples units), ``units`` (how many; every problem its own without ``units``) and ``label``."""
    steps, mean = mean_curve([r.history for r in runs_], metric)
    recorded = [r.val_scores() for r in runs_]
    out: dict[str, Any] = {"steps": steps, "mean": mean, "low": [], "high": [], "over_units": [], "units": None}
    for step in steps:
        rows = [rec.get(step) for rec in recorded]
        if all(row is not None for row in rows):
            x = np.stack(rows)
            out["units"] = unit_counts(units, x.shape[1])[:2]
            _, low, high = mean_interval(x, level=level, n_boot=n_boot, seed=seed, units=units)
            out["over_units"].append(True)
        else:
            values = [val_at(r.history, step, metric) for r in runs_]
            _, low, high = stats.mean_ci(values, level)  # one seed: (nan, nan), no band
            out["over_units"].append(False)
        out["low"].append(low if math.isfinite(low) else None)
        out["high"].append(high if math.isfinite(high) else None)
    over = "" if out["units"] is None else units_phrase(*out["units"], units is not None)
    over = f"seeds x {over}" if over and len(runs_) > 1 else over  # one run: units and problems only
    n_over = sum(out["over_units"])
    out["label"] = ("95% band: " + over if steps and n_over == len(steps) else
                    f"95% band: {over} at {n_over} of {len(steps)} steps, else t over seeds" if n_over else
                    "95% band: t over seeds (no per-problem scores recorded)")
    out["units"] = None if out["units"] is None else out["units"][0]
    return out


# =========================================================================== protocol vs skill (docs/regime.md)
def split_scores(params: Any, agent: AgentSetup, frb: FixedBudgetRuns, *, lora: GRPORun | None = None,
                 headline: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Per-seed per-problem strict and lenient correctness (``decoding.greedy_split_scores``) of the arms
    of :func:`budget_scores` that split a gain: ``es``, ``copes`` (the headline CoPES arm), ``full_grpo``
    (its best checkpoint, s*), ``lora_grpo`` (``lora`` at the budget, if given) and ``base``. Returns
    {"strict": {arm: (seeds, problems)}, "lenient": {...}}; rows in :func:`budget_scores`'s seed order."""
    tasks = agent.objective.val_tasks
    if headline is None:
        headline = next(iter(frb.copes_runs))
    models = {"es": [es_model(agent, r, "final") for r in frb.es_runs],
              "copes": [es_model(agent, r, "final") for r in frb.copes_runs[headline]],
              "full_grpo": [grpo_policy(frb.full, "best")], "base": [agent.model]}
    if lora is not None:
        models["lora_grpo"] = [grpo_policy(lora, "final")]
    out: dict[str, dict[str, np.ndarray]] = {"strict": {}, "lenient": {}}
    for arm, ms in models.items():
        rows = [decoding.greedy_split_scores(params, agent, m, tasks, label=f"{arm} row {i}") for i, m in enumerate(ms)]
        for name in out:
            out[name][arm] = np.stack([r[name] for r in rows])
    return out


def regime_context(profile: str, task: str = "math") -> dict[str, Any]:
    """Which base the notebook ran on and whether it is in the papers' regime for ``task`` (the task the
    notebook's claims are measured on: ``math`` for 05 and 06, ``qa`` for 07), from notebook 01's summary
    (docs/regime.md#r2-the-base-regime-criterion, gated per claim by
    docs/regime.md#r10-gates-per-claim-registered-2026-12-03): ``regime_criterion_met`` (the task's criterion;
    the combined key where 01 wrote no per-task one; None when 01 has not run), ``regime_task``,
    ``warm_protocol``, ``warm_latent_p``, ``warm_latent_prior`` and ``regime_note``, the sentence a notebook
    prints (claims that need the regime read "not in regime" when their task's criterion is not met)."""
    from copes_lib.claims.verdicts import regime_key

    key = regime_key(task)  # a clear error for an unknown task
    s01 = runs.load_summary(profile, "01_substrate_and_agent") or {}
    met = s01.get(key, s01.get("regime_criterion_met"))
    ctx = {"regime_criterion_met": met, "regime_task": task, "warm_protocol": s01.get("warm_protocol"),
           "warm_latent_p": s01.get("warm_latent_p"), "warm_latent_prior": s01.get("warm_latent_prior"),
           "regime_criterion_met_math": s01.get("regime_criterion_met_math"),
           "regime_criterion_met_qa": s01.get("regime_criterion_met_qa")}
    if met is None:
        note = "notebook 01 has not reported the base-regime criterion: the regime is unknown"
    elif met:
        note = (f"in regime for {task}: 01's base ({ctx['warm_protocol']} protocol, p = {ctx['warm_latent_p']}, "
                f"{ctx['warm_latent_prior']} prior) meets {task}'s criterion of docs/regime.md#r2-the-base-regime-criterion")
    else:
        note = (f"NOT IN REGIME for {task}: 01's base ({ctx['warm_protocol']} protocol) misses {task}'s criterion of "
                f"docs/regime.md#r2-the-base-regime-criterion; the claims measured on {task} read 'not in regime'")
    return {**ctx, "regime_note": note}


def split_keys(split: dict[str, dict[str, np.ndarray]], prefix: str = "val") -> dict[str, float]:
    """Per-arm strict and lenient accuracy and their gains over the base (Delta S, Delta L of
    docs/regime.md#r4-predictions-ours-registered-before-the-run): ``<prefix>_strict_<arm>``,
    ``<prefix>_lenient_<arm>``, ``delta_strict_<arm>``, ``delta_lenient_<arm>``."""
    out: dict[str, float] = {}
    base = {name: float(split[name]["base"].mean()) for name in split}
    for name in ("strict", "lenient"):
        for arm, scores in split[name].items():
            out[f"{prefix}_{name}_{arm}"] = float(scores.mean())
            if arm != "base":
                out[f"delta_{name}_{arm}"] = float(scores.mean()) - base[name]
    return out


def protocol_minus_skill(split: dict[str, dict[str, np.ndarray]], arm: str,
                         units: Sequence[str] | None = None) -> stats.Comparison:
    """Delta S - 2 Delta L of ``arm`` over the base (R3 / R4's quantity: > 0 when the strict gain is more than
    twice the lenient one, i.e. most of it is protocol), with seeds x problems noise (``stats.compare`` of
    S - 2L per problem, the arm against the base, as the claims test; cluster-aware with ``units``)."""
    a = split["strict"][arm] - 2 * split["lenient"][arm]
    b = split["strict"]["base"] - 2 * split["lenient"]["base"]
    return stats.compare(a, b, name=f"{arm}: Delta S - 2 Delta L", paired_seeds=False, units=units)


def regime_predictions(split: dict[str, dict[str, np.ndarray]],
                       units: Sequence[str] | None = None) -> dict[str, float]:
    """``prediction_R<i>_value`` / ``_low`` / ``_high`` (the quantity and its 95% interval) of R3 (ES's
    Delta S - 2 Delta L), R4 (full GRPO's) and R8 (CoPES - ES strict accuracy, paired seeds), the keys the
    claims read (docs/regime.md#r4-predictions-ours-registered-before-the-run). Judged at the notebook's
    base; whether that is in regime is :func:`regime_context`'s. With ``units`` (:func:`problem_units` of the
    validation tasks) every interval is cluster-aware (docs/statistics.md#s6-latent-units-registered-2026-12-03)."""
    n = min(len(split["strict"]["copes"]), len(split["strict"]["es"]))
    comparisons = {"R3": protocol_minus_skill(split, "es", units), "R4": protocol_minus_skill(split, "full_grpo", units),
                   "R8": stats.compare(split["strict"]["copes"][:n], split["strict"]["es"][:n],
                                       name="CoPES - ES strict accuracy", paired_seeds=True, units=units)}
    out: dict[str, float] = {}
    for rid, c in comparisons.items():
        out.update({f"prediction_{rid}_value": float(c.estimate), f"prediction_{rid}_low": float(c.low),
                    f"prediction_{rid}_high": float(c.high)})
    return out


def skill_gap_control(params: Any, settings: dict[str, Any], budget: int) -> dict[str, Any]:
    """The regime's control arm (issue 22 item 3): standard ES and CoPES (the paper's protocol: ES's sigma /
    alpha) on the skill-gap base (``substrate_setup.control_config``: every trace in the reward's protocol,
    the target stopping rule) for the same ``budget``, over CONTROL_SEEDS paired seeds (fewer than the
    headline's: cost). Full GRPO is not rerun on it (cost): its gain recovery is 09's map's. Returns the
    ``control_*`` summary keys: strict / lenient accuracy and gains of ES and CoPES over that base
    (:func:`split_keys`), CoPES - ES strict accuracy with its 95% interval, and whether the control base is
    the headline's own (a profile whose base already is the skill-gap one, e.g. smoke)."""
    from copes_lib.protocols.paper_a.es_arm import load_agent
    from copes_lib.protocols.testbed.substrate_setup import control_config, substrate_config

    config = control_config(params.PROFILE)
    agent = load_agent(params, substrate=config)
    n = params.CONTROL_SEEDS
    es = seed_runs(params, agent, subspaces=1, sigma=settings["es_sigma"], alpha=settings["es_alpha"], steps=budget,
                   label="ES (skill-gap control)", seeds=n)
    copes = seed_runs(params, agent, subspaces=params.SUBSPACES, sigma=settings["es_sigma"],
                      alpha=settings["es_alpha"], steps=budget, label="CoPES (skill-gap control)", seeds=n)
    tasks = agent.objective.val_tasks
    models = {"es": [es_model(agent, r, "final") for r in es], "copes": [es_model(agent, r, "final") for r in copes],
              "base": [agent.model]}
    split: dict[str, dict[str, np.ndarray]] = {"strict": {}, "lenient": {}}
    for arm, ms in models.items():
        rows = [decoding.greedy_split_scores(params, agent, m, tasks, label=f"control {arm} row {i}")
                for i, m in enumerate(ms)]
        for name in split:
            split[name][arm] = np.stack([r[name] for r in rows])
    diff = stats.compare(split["strict"]["copes"], split["strict"]["es"], name="control CoPES - ES strict",
                         paired_seeds=True, units=problem_units(tasks))
    keys = {f"control_{k}": v for k, v in split_keys(split).items()}
    keys.update(control_copes_minus_es_strict=float(diff.estimate), control_copes_minus_es_strict_low=float(diff.low),
                control_copes_minus_es_strict_high=float(diff.high), control_n_seeds=n, control_budget_steps=budget,
                control_warm_protocol=config.protocol,
                control_same_base=config == substrate_config(params.PROFILE))
    return keys


# =========================================================================== figures with uncertainty
def pass_at_k_intervals(results: dict[str, dict[str, Any]], *, level: float = 0.95, n_boot: int = 1000,
                        seed: int = 0, units: Sequence[str] | None = None):
    """pass@k for k = 1..n of each method with a ``level`` interval from a seeded bootstrap over test
    problems (the evaluation-set noise; one checkpoint per method, so seed noise is not in it). With
    ``units`` (:func:`problem_units` of the test problems) the bootstrap draws units, then problems within
    them (``stats.problem_weights``; docs/statistics.md#s6-latent-units-registered-2026-12-03). Long table
    (method, k, pass_at_k, low, high, units: the units the interval rests on, the problems without ids)."""
    import pandas as pd

    rows = []
    for method, result in results.items():
        counts = np.asarray(result["correct_counts"])
        if units is not None and len(units) != len(counts):
            raise ValueError(f"units: {len(units)} unit ids for {len(counts)} test problems of {method!r}; "
                             "pass one unit id per scored problem (problem_units of the same tasks)")
        n = result["samples"]
        per_problem = np.stack([[stats.pass_at_k(n, int(c), k) for k in range(1, n + 1)] for c in counts])
        weights = stats.problem_weights(np.random.default_rng(seed), len(counts), n_boot, units)  # same draws per method
        reps = weights @ per_problem / weights.sum(axis=1, keepdims=True)  # (n_boot, n)
        tail = (1 - level) / 2
        n_units = len(counts) if units is None else len(set(units))
        for k in range(1, n + 1):
            rows.append({"method": method, "k": k, "pass_at_k": float(per_problem[:, k - 1].mean()),
                         "low": float(np.quantile(reps[:, k - 1], tail)),
                         "high": float(np.quantile(reps[:, k - 1], 1 - tail)), "units": n_units})
    return pd.DataFrame(rows)


# =========================================================================== notebook 07's test-F1 intervals
def qa_f1_intervals(f1_scores: dict[str, np.ndarray], units: Sequence[str] | None, *, a: str = "copes",
                    b: str = "es", level: float = 0.95, n_boot: int = 2000) -> dict[str, Any]:
    """Notebook 07's test-F1 summary keys, cluster-aware as 05's (docs/statistics.md#s6-latent-units-registered-2026-12-03):
    ``f1_scores`` is method -> (seeds, test problems) per-problem F1 (the mean over a problem's samples).

    Keys: ``f1_ci_low_<m>`` / ``f1_ci_high_<m>`` (the ``level`` interval of the method's mean F1 from the seeds x
    latent units x problems-within-units bootstrap, :func:`mean_interval`; a method with one seed: units and
    problems only) and ``f1_units_<m>`` (the units it rests on); ``<a>_minus_<b>_f1`` (mean difference over the
    paired seeds), ``_ci_low`` / ``_ci_high`` (``stats.compare``, seeds paired, ``units``: the test claim A8 runs,
    before Holm), ``_p``, ``_significant`` (p < 1 - level with ``a`` ahead), ``_units`` / ``_units_effective``;
    ``f1_interval_units``, ``f1_interval_units_effective``, ``f1_interval_unit_ids`` (False: no unit ids, every
    problem its own unit) and ``f1_interval_method``."""
    n_problems = np.atleast_2d(np.asarray(f1_scores[b], dtype=float)).shape[1]
    n_units, effective, method = unit_counts(units, n_problems)
    out: dict[str, Any] = {"f1_interval_units": n_units, "f1_interval_units_effective": effective,
                           "f1_interval_unit_ids": units is not None, "f1_interval_method": method}
    for m, scores in f1_scores.items():
        _, low, high = mean_interval(scores, level=level, n_boot=n_boot, units=units)
        out.update({f"f1_ci_low_{m}": low, f"f1_ci_high_{m}": high, f"f1_units_{m}": n_units})
    arm_a, arm_b = (np.atleast_2d(np.asarray(f1_scores[k], dtype=float)) for k in (a, b))
    d = stats.compare(arm_a, arm_b, name=f"{a} - {b} (test F1)", units=units, alpha=1 - level)
    key = f"{a}_minus_{b}_f1"
    out.update({key: d.estimate, f"{key}_ci_low": d.low, f"{key}_ci_high": d.high, f"{key}_p": d.p,
                f"{key}_significant": bool(math.isfinite(d.p) and d.p < 1 - level and d.estimate > 0),
                f"{key}_units": n_units, f"{key}_units_effective": effective})
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


# =========================================================================== notebook 05's summary
def math_summary(params: Any, frb: FixedBudgetRuns, settings: dict[str, Any], *, lora: GRPORun | Sequence[GRPORun],
                 es_best: tuple[int, float], pass1: dict[str, float], step_hours: tuple[float, float],
                 n_val: int, n_test: int, budget_note: str, intervals: dict[str, Any] | None = None,
                 reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """Notebook 05's summary.json keys (the claims read ``gain_recovery_*``, ``base_val_accuracy``,
    ``full_grpo_best_val_accuracy``, ``es_steps_to_match_copes``, ``budget_steps``, ``es_long_steps``,
    ``val_every``, ``es_long_n_seeds``). Headline keys have no suffix; every protocol's also carry
    ``_<protocol>_protocol``. Gain recovery is left out, with ``gain_recovery_note``, when full GRPO did not
    beat the base. ``pass1``: test pass@1 by key (base, full_grpo, es_best, lora_grpo, es, copes);
    ``step_hours``: (ES-class, GRPO-class) device-hours per step. ``lora``: LoRA-GRPO's run(s) at the budget
    (their seed mean is the arm's value); every gain recovery divides by ``frb.reference_best``, the mean
    of the full-GRPO seeds' bests. ``intervals`` (:func:`budget_intervals`): the cluster-aware intervals, unit
    counts and CoPES - ES tests that replace the paired t over seed means (``copes_minus_es_interval`` says
    which the summary holds); ``reference``: :func:`reference_reuse`'s keys."""
    head = frb.compare[params.HEADLINE]
    loras = [lora] if isinstance(lora, GRPORun) else list(lora)
    lora_vals = [float(r.val_by_step[frb.budget]) for r in loras]
    lora_val = float(np.mean(lora_vals))
    full_bests = [float(best_validated(r.history, metric=frb.metric)[1]) for r in frb.full_seeds]
    peak = peak_report(frb.full)

    def protocol_keys(proto: str, suffix: str) -> dict[str, Any]:
        c, d = frb.compare[proto], frb.compare[proto]["copes_minus_es"]
        return {f"gain_recovery_copes{suffix}": c["gain_recovery_copes"],
                f"gain_recovery_es{suffix}": c["gain_recovery_es"],
                f"val_accuracy_copes_at_budget{suffix}": c["copes"]["mean"],
                f"val_accuracy_copes_at_budget_ci_low{suffix}": c["copes"]["low"],
                f"val_accuracy_copes_at_budget_ci_high{suffix}": c["copes"]["high"],
                f"copes_minus_es_val_accuracy{suffix}": d["mean"], f"copes_minus_es_p{suffix}": d["p"],
                f"copes_minus_es_ci_low{suffix}": d["low"], f"copes_minus_es_ci_high{suffix}": d["high"],
                f"copes_minus_es_significant{suffix}": d["significant"],
                f"es_steps_to_match_copes{suffix}": frb.match[proto], f"n_seeds{suffix}": c["copes"]["n"]}

    summary = {
        "gain_recovery_copes": head["gain_recovery_copes"],
        "gain_recovery_es": head["gain_recovery_es"],
        "gain_recovery_lora_grpo": gain_recovery_or_none(lora_val, frb.base, frb.reference_best),
        "es_steps_to_match_copes": frb.match[params.HEADLINE],
        "budget_steps": frb.budget,
        "headline_protocol": params.HEADLINE,
        "protocol_reading": " ".join(protocol_reading(frb.compare, params.HEADLINE, intervals)),
        "grpo_best_step": frb.s_star,
        "grpo_peak_step": peak["peak_step"],
        "grpo_last_step": peak["last_step"],
        "grpo_stopped_early": peak["stopped_early"],
        "grpo_peak_censored": peak["peak_censored"],
        "grpo_step_cap": frb.grpo_config.total_steps,
        "grpo_patience": frb.grpo_config.early_stop_patience,
        "base_val_accuracy": frb.base,
        "full_grpo_best_val_accuracy": frb.grpo_best,
        "full_grpo_reference_val_accuracy": frb.reference_best,
        "full_grpo_best_val_accuracy_seeds": full_bests,
        "full_grpo_seeds": [r.seed for r in frb.full_seeds],
        "full_grpo_n_seeds": len(frb.full_seeds),
        "val_accuracy_es_at_budget": head["es"]["mean"],
        "val_accuracy_es_at_budget_ci_low": head["es"]["low"],
        "val_accuracy_es_at_budget_ci_high": head["es"]["high"],
        "val_accuracy_lora_grpo_at_budget": lora_val,
        "val_accuracy_lora_grpo_at_budget_seeds": lora_vals,
        "lora_grpo_seeds": [r.seed for r in loras],
        "lora_grpo_n_seeds": len(loras),
        "es_best_step": es_best[0],
        "es_best_val_accuracy": es_best[1],
        "es_long_steps": params.ES_LONG_STEPS,
        "es_long_n_seeds": len(frb.long_runs),
        "val_every": params.VAL_EVERY,
        **protocol_keys(params.HEADLINE, ""),
        **{k: v for proto in frb.compare for k, v in protocol_keys(proto, f"_{proto}_protocol").items()},
        **{f"test_pass1_{key}": value for key, value in pass1.items()},
        "es_sigma": settings["es_sigma"], "es_alpha": settings["es_alpha"], "es_setting_source": settings["es_source"],
        "copes_sigma": settings["copes_sigma"], "copes_alpha": settings["copes_alpha"],
        "copes_setting_source": settings["copes_source"],
        "full_grpo_lr": settings["full_lr"], "lora_grpo_lr": settings["lora_lr"], "grpo_lr_source": settings["grpo_source"],
        "es_class_device_hours_per_step": float(step_hours[0]), "grpo_class_device_hours_per_step": float(step_hours[1]),
        "val_problems": n_val, "test_problems": n_test, "test_samples": params.TEST_SAMPLES,
        "n_seeds": params.SEEDS, "control_seeds": params.CONTROL_SEEDS, "budget_note": budget_note,
    }
    summary["copes_minus_es_interval"] = ("cluster-aware: " + intervals["interval_method"] if intervals is not None
                                          else "paired t over seed means (descriptive; no per-problem scores)")
    summary.update(intervals or {}, **(reference or {}))
    undefined = [k for k in ("gain_recovery_copes", "gain_recovery_es", "gain_recovery_lora_grpo") if summary[k] is None]
    for key in undefined:
        del summary[key]
    if undefined:
        summary["gain_recovery_note"] = (f"undefined: full GRPO's reference validation accuracy {frb.reference_best:.4f} "
                                         f"(mean of {len(frb.full_seeds)} seed(s)' bests) does not exceed the base "
                                         f"{frb.base:.4f}")
    return summary
