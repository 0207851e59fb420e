"""Notebook 09's study (issue 18, beyond the paper): where do ES's and CoPES's effects appear?

Neither paper varies model size, warm-start depth or the noise protocol (it post-trains one 4B
model). This module runs, on the suite's miniature substrate:

- **scale axis**: for each size in ``SIZES`` (names of ``substrate.MODEL_SIZES``), a base model
  warm-started EXACTLY as notebook 01 warm-starts its own (``substrate.warm_start`` with 01's
  parameters, only ``model_size`` changed; the size 01 uses is its cached model), then at the same
  step budget: full GRPO (``grpo.train_grpo``), standard ES (K = 1) and CoPES (K = ``SUBSPACES``)
  (``es_training.train_es``), ES-family arms over ``SEEDS`` noise seeds on the SAME prompt batches (paired);
- **protocol axis**: CoPES with ES's sigma / alpha (the paper's protocol; its update is ~sqrt(K)
  times larger) and CoPES with alpha / sqrt(K) (step-matched to ES), at every size;
- **warm-start axis**: at ``WARM_AXIS_SIZE``, the same arms from an under-trained and a longer-trained
  ("converged") warm start, each trained for exactly ``UNDER_WARM_STEPS`` / ``CONVERGED_WARM_STEPS``
  steps: 01's stopping rule is switched off for them, since with it a longer cap stops at the same step
  as 01's recipe and the axis would compare a base model with itself;
- **mechanism** (``mechanism``, engine ``copes_lib.mechanism``; docs/mechanism.md): at the base, the
  held-out fitness change along ES's, CoPES's and the GRPO gradient's one-step directions against
  ``MECH_RANDOM`` random directions of ES's update norm, the linear share rho^2 of ES's fitness, d_eff
  of the rewarded trajectories' log-likelihood, and rho^2 N / (d_eff + N - 1) against ES's measured
  per-step efficiency, with the five registered verdicts (``mechanism_verdicts``). It replaced two
  populations' cosine vs chance, which could not detect even a perfect estimator (E[cos] ~ 1e-5,
  chance spread 8.5e-4 at 1.37M parameters: docs/mechanism.md#m4-why-the-old-mechanism-test-could-not-find-anything).
  ``mechanism(params, sub, model)`` takes any base of the cell's shape, so the map can call it per cell;
- **low rank on the map** (issue 26 item 5; docs/lowrank_es.md#l4-low-rank-on-the-map): in the cells of
  ``MAP_LOWRANK_CELLS``, low-rank ES and paper-protocol CoPES (``ESConfig.noise_rank`` = ``MAP_LOWRANK_RANK``;
  EGGROLL's lever, not the paper's) beside the full-rank arms, paired by seed and prompt batches, read by
  the registered margin rule (``lowrank_prediction``);
- **trends**: ``slope_test`` (slope and its interval over sizes; a 4B value only with >= 4 sizes and a
  slope interval excluding 0).

Every arm is scored per validation problem (greedy, 0/1) at the budget step, so the CoPES - ES gap is
judged with ``stats.compare``, and every interval of the study (gaps, gains over the base, gain recovery,
the map's cells and predictions) is cluster-aware: it counts the seeds, the validation problems' latent
units and the problems within units (``base.val_units``: ``Task.unit_id``, a cued base's cue letter; carried
by every cell and map base as ``units``, docs/statistics.md#s6-latent-units-registered-2026-12-03). Gain
recovery = (arm at the budget - base) / (full GRPO at its horizon ``GRPO_STEPS`` - base), as notebook 05 (the
paper's reference is full GRPO's best), with ``stats.gain_recovery_interval`` (the arm's and GRPO's seeds).

Departures (stated in the notebook too): sigma / alpha are the ES notebooks' cpu values, not tuned per
size or method (the "per-method tuned" protocol of the issue is not run: a sweep per size does not fit
the cpu budget); GRPO draws its prompts with grpo's own sampler, so only the ES-family arms share
batches; the budget is a few steps, far below the paper's 16 at 64 prompts.

The package, by concept: ``base`` (the parameters, the bases, the arms and how a cell's scores read),
``size_axis`` (every arm per size, the trend over sizes, a cell's summary), ``mechanism_study`` (the
mechanism measurement and its summary), ``map_study`` (the map), ``tables`` (the notebook's tables and its
flat summary) and ``figures`` (its figures: the scale axis, the phase diagram, low rank on the map). Every
public name is importable from ``copes_lib.protocols.study``.
"""

from copes_lib.protocols.study.base import (
    MAP_PRIORS_OF_REGIME,
    MAP_REGIMES,
    MIN_MEMBERS_PER_SUBSPACE,
    NOTEBOOK,
    QWEN35_4B_PARAMS,
    ScaleStudyParams,
    ScoredObjective,
    Substrate,
    base_scores,
    budget_efficiency,
    cell_units,
    data_profile,
    es_arm,
    es_arm_config,
    es_family_arms,
    gain_recovery,
    gap,
    grpo_arm,
    grpo_horizon_accuracy,
    load_substrate,
    score_problems,
    scores,
    slug,
    substrate_units,
    unit_count,
    val_units,
)
from copes_lib.protocols.study.figures import (
    plot_lowrank_map,
    plot_map_preflight,
    plot_phase_diagram,
    plot_scale_axis,
    size_fits,
)
from copes_lib.protocols.study.map_study import (
    LOWRANK_MARGIN,
    MAP_ARMS,
    MAP_LOWRANK_ARMS,
    MAP_PRECONDITIONS,
    ShuffledFitness,
    base_d_eff,
    line_fit,
    load_map_base,
    lowrank_prediction,
    map_arm_config,
    map_base,
    map_bases,
    map_cell_summary,
    map_delta,
    map_es_arm,
    map_gain_recovery,
    map_gap,
    map_grpo_arm,
    map_lowrank_summary,
    map_objective,
    map_predictions,
    map_preflight,
    map_preflight_settings,
    map_preflight_summary,
    map_summary,
    map_tag,
    recovery_contrast,
    run_map_base,
    save_map_scores,
)
from copes_lib.protocols.study.mechanism_study import (
    LADDER,
    heldout_fitness,
    mechanism,
    mechanism_summary,
    mechanism_verdicts,
    rewarded_nll,
)
from copes_lib.protocols.study.size_axis import (
    cell_summary,
    run_cell,
    save_cell_scores,
    scores_digest,
    slope_test,
)
from copes_lib.protocols.study.tables import (
    MECHANISM_COLUMNS,
    map_preflight_table,
    map_table,
    mechanism_table,
    size_overview,
    size_table,
    study_summary,
    tagged_cells,
    warm_axis_table,
)

__all__ = [
    "LADDER",
    "LOWRANK_MARGIN",
    "MAP_ARMS",
    "MAP_LOWRANK_ARMS",
    "MAP_PRECONDITIONS",
    "MAP_PRIORS_OF_REGIME",
    "MAP_REGIMES",
    "MECHANISM_COLUMNS",
    "MIN_MEMBERS_PER_SUBSPACE",
    "NOTEBOOK",
    "QWEN35_4B_PARAMS",
    "ScaleStudyParams",
    "ScoredObjective",
    "ShuffledFitness",
    "Substrate",
    "base_scores",
    "budget_efficiency",
    "cell_summary",
    "cell_units",
    "data_profile",
    "es_arm",
    "es_arm_config",
    "es_family_arms",
    "gain_recovery",
    "gap",
    "grpo_arm",
    "grpo_horizon_accuracy",
    "heldout_fitness",
    "line_fit",
    "load_map_base",
    "load_substrate",
    "lowrank_prediction",
    "map_arm_config",
    "map_base",
    "map_bases",
    "map_cell_summary",
    "map_delta",
    "map_es_arm",
    "map_gain_recovery",
    "map_gap",
    "map_grpo_arm",
    "map_lowrank_summary",
    "map_objective",
    "map_predictions",
    "map_preflight",
    "map_preflight_settings",
    "map_preflight_summary",
    "map_preflight_table",
    "map_summary",
    "map_table",
    "map_tag",
    "mechanism",
    "mechanism_summary",
    "mechanism_table",
    "mechanism_verdicts",
    "plot_lowrank_map",
    "plot_map_preflight",
    "plot_phase_diagram",
    "plot_scale_axis",
    "recovery_contrast",
    "base_d_eff",
    "rewarded_nll",
    "run_cell",
    "run_map_base",
    "save_cell_scores",
    "save_map_scores",
    "score_problems",
    "scores",
    "scores_digest",
    "size_fits",
    "size_overview",
    "size_table",
    "slope_test",
    "slug",
    "study_summary",
    "substrate_units",
    "tagged_cells",
    "unit_count",
    "val_units",
    "warm_axis_table",
]
