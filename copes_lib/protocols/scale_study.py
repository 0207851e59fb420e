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
judged with ``stats.compare`` (seeds x problems noise model). Gain recovery = (arm at the budget -
base) / (full GRPO at its horizon ``GRPO_STEPS`` - base), as notebook 05 (the paper's reference is full
GRPO's best); its interval counts ES-family seed noise only.

Departures (stated in the notebook too): sigma / alpha are the ES notebooks' cpu values, not tuned per
size or method (the "per-method tuned" protocol of the issue is not run: a sweep per size does not fit
the cpu budget); GRPO draws its prompts with grpo's own sampler, so only the ES-family arms share
batches; the budget is a few steps, far below the paper's 16 at 64 prompts.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from copes_lib.config import ConfigError, NotebookParams, param
from copes_lib.es_objective import AgentObjective
from copes_lib.regime import LOWRANK_MARGIN
from copes_lib.regime import lowrank_reading as lowrank_prediction

NOTEBOOK = "09_scale_study"
MAP_REGIMES = ("latent", "skill_gap")
MIN_MEMBERS_PER_SUBSPACE = 10  # the map's CoPES keeps the paper's N_k >= 10 (K = 4 at N = 40)
QWEN35_4B_PARAMS = 4.0e9  # the paper's model, for the labelled extrapolation only


# =========================================================================== parameters
@dataclasses.dataclass(frozen=True)
class ScaleStudyParams(NotebookParams):
    """Parameters of 09_scale_study (defaults = the cpu profile)."""

    NOTEBOOK = "09_scale_study"

    SIZES: str = param("tiny,smoke,cpu", "comma-separated substrate shapes (substrate.MODEL_SIZES), small to large")
    STEPS: int = param(4, "step budget of every arm (GRPO, ES, CoPES)", ge=1)
    SEEDS: int = param(5, "noise seeds of each ES-family arm (prompt batches shared: paired)", ge=1)
    GRPO_SEEDS: int = param(1, "seeds of full GRPO (the gain-recovery reference)", ge=1)
    POPULATION: int = param(16, "N, members per ES / CoPES step (paper: 40)", ge=2)
    SUBSPACES: int = param(4, "K of CoPES (paper: 4)", ge=2)
    SIGMA: float = param(0.01, "sigma shared by ES and CoPES (the ES notebooks' cpu value; paper: 1e-3)", gt=0.0)
    ALPHA: float = param(0.005, "alpha of ES and of paper-protocol CoPES (paper: 5e-4)", gt=0.0)
    PROTOCOLS: str = param("paper,step_matched", "CoPES protocols: paper (ES's sigma and alpha), "
                           "step_matched (alpha / sqrt(K))")
    BATCH_SIZE: int = param(8, "prompts per ES step, shared by all members (paper: 64)", ge=1)
    VAL_PROBLEMS: int = param(128, "validation problems scored per arm (greedy, 0/1 each)", ge=1)
    CHUNK_SIZE: int = param(4096, "elements per ES chunk (paper: unstated)", ge=1)
    BACKEND: str = param("batched", "ES member evaluation backend", choices=("sequential", "batched"))
    ES_SEED: int = param(33, "noise seed of the first ES-family seed (paper: 33)", ge=0)
    BATCH_SEED: int = param(1088, "seed of the ES-family prompt batches", ge=0)
    GRPO_STEPS: int = param(16, "full GRPO's horizon: its gain there is the gain-recovery reference (05's rule: "
                            "the paper's reference is full GRPO's best, at 16 steps); its budget-step scores too", ge=1)
    GRPO_LR: float = param(1e-4, "full-GRPO AdamW learning rate (04's cpu choice; paper: 1e-6)", gt=0.0)
    GRPO_PROMPT_BATCH: int = param(8, "prompts per GRPO step (paper: 64)", ge=1)
    GROUP_SIZE: int = param(4, "GRPO trajectories per prompt (paper: 8)", ge=2)
    MICRO_BATCH: int = param(16, "GRPO trajectories per forward/backward (memory only)", ge=1)
    WARM_AXIS_SIZE: str = param("smoke", "size of the warm-start axis; empty for none")
    UNDER_WARM_STEPS: int = param(250, "warm-start steps of the under-trained base, trained exactly (no stopping "
                                  "rule; 0 skips it)", ge=0)
    CONVERGED_WARM_STEPS: int = param(675, "warm-start steps of the converged base, trained exactly (no stopping "
                                      "rule; 0 skips it)", ge=0)
    MECH_RANDOM: int = param(32, "random directions of the mechanism's direction test (docs/mechanism.md); 0: no "
                             "mechanism measurement; at least 20 lets its p-value reach 0.05", ge=0)
    MECH_HELDOUT: int = param(128, "held-out (validation) problems of the direction test's fitness", ge=1)
    MECH_GROUP: int = param(8, "sampled trajectories per prompt of the GRPO gradient and of the curvature's "
                            "rewarded trajectories", ge=2)
    MECH_PROBES: int = param(16, "Hutchinson probes of tr(H) (d_eff)", ge=2)
    MECH_POWER_ITERS: int = param(20, "at most this many power-iteration products for lambda_max(H) (d_eff)", ge=1)
    MECH_FD_EPS: float = param(1e-2, "step length of the finite-difference Hessian-vector products", gt=0.0)
    MECH_MEMBERS_PER_BATCH: int = param(4, "directions per batched forward in the direction test (memory only)",
                                        ge=1)
    # the map (issue 22 item 5; docs/mechanism.md#m6-the-map-of-where-es-and-copes-work)
    MAP_SIZE: str = param("tiny", "substrate shape of the map (substrate.MODEL_SIZES); empty: no map")
    MAP_REGIMES: str = param("latent,skill_gap", "regimes of the map: latent (latent-protocol bases, one per "
                             "MAP_PRIORS value) and skill_gap (01's paper-protocol recipe at MAP_SIZE)")
    MAP_PRIORS: str = param("0,0.1,0.3", "latent priors p of the latent-protocol bases, each in [0, 1), 0 included "
                            "(docs/regime.md#r3-the-latent-protocol-warm-start)")
    MAP_POPULATIONS: str = param("20,40,80", "populations N of the map, small to large")
    MAP_SUBSPACES: int = param(0, "K of CoPES on the map (ES's sigma and alpha): 0 gives K of N / 10 at each N (10 "
                               "members per subspace, the paper's at N 40, K 4); else this K at every N, with at "
                               "least 10 members per subspace", ge=0)
    MAP_CONTROL_POPULATIONS: str = param("40", "populations at which the controls (shuffled fitness, sqrt(K) alpha) "
                                         "run; empty: every MAP_POPULATIONS value")
    MAP_SEEDS: int = param(3, "noise seeds per arm and cell (prompt batches shared: paired)", ge=2)
    MAP_GRPO_SEEDS: int = param(3, "full-GRPO seeds per base (the gain-recovery reference, with its seed noise)",
                                ge=1)
    MAP_STEPS: int = param(8, "step budget of the map's ES-family arms", ge=1)
    MAP_GRPO_STEPS: int = param(16, "full GRPO's horizon on the map: its strict gain there is the reference", ge=1)
    MAP_HEADLINE_P: float = param(0.1, "the headline latent prior (R3 / R5; the cpu profile's WARM_LATENT_P)",
                                  ge=0.0, lt=1.0)
    MAP_HEADLINE_N: int = param(40, "the headline population (R2, R5, R6; the paper's N)", ge=2)
    MAP_LATENT_STEPS: int = param(1500, "warm-start steps of each latent base, trained exactly; 0: 01's "
                                  "WARM_LATENT_MATH_STEPS (1,000: at tiny it missed the convergence rule of "
                                  "docs/regime.md R3, 1,500 met it)", ge=0)
    MAP_SKILL_STEPS: int = param(0, "warm-start steps of the skill-gap base, trained exactly; 0: 01's paper "
                                 "recipe (its stopping rule included)", ge=0)
    MAP_MECHANISM: bool = param(True, "the mechanism measurement (d_eff, direction test) once per map base, at "
                                "MAP_HEADLINE_N (R7 reads its d_eff)")
    MAP_LOWRANK_RANK: int = param(4, "rank r of the map's low-rank arms: ES and paper-protocol CoPES with low-rank "
                                  "noise of rank r (ESConfig.noise_rank; docs/lowrank_es.md#l4-low-rank-on-the-map); "
                                  "0: no low-rank arms", ge=0)
    MAP_LOWRANK_CELLS: str = param("headline,skill_gap", "cells that get the low-rank arms, all at MAP_HEADLINE_N: "
                                   "headline (the latent base at MAP_HEADLINE_P), skill_gap (the skill-gap base), p0 "
                                   "(the latent base at p 0); empty: none")

    def sizes(self) -> list[str]:
        return [s.strip() for s in self.SIZES.split(",") if s.strip()]

    def protocols(self) -> list[str]:
        return [s.strip() for s in self.PROTOCOLS.split(",") if s.strip()]

    def map_regimes(self) -> list[str]:
        return [s.strip() for s in self.MAP_REGIMES.split(",") if s.strip()] if self.MAP_SIZE else []

    def map_priors(self) -> list[float]:
        return [float(s) for s in self.MAP_PRIORS.split(",") if s.strip()]

    def map_populations(self) -> list[int]:
        return [int(s) for s in self.MAP_POPULATIONS.split(",") if s.strip()]

    def map_control_populations(self) -> list[int]:
        return ([int(s) for s in self.MAP_CONTROL_POPULATIONS.split(",") if s.strip()]
                if self.MAP_CONTROL_POPULATIONS.strip() else self.map_populations())

    def map_subspaces(self, population: int) -> int:
        """K of CoPES at population N on the map."""
        return self.MAP_SUBSPACES or population // MIN_MEMBERS_PER_SUBSPACE

    def map_lowrank_cells(self) -> list[tuple[str, float | None, int]]:
        """(regime, p, N) of the cells with low-rank arms (none when ``MAP_LOWRANK_RANK`` is 0 or there is no map)."""
        if not self.MAP_SIZE or not self.MAP_LOWRANK_RANK:
            return []
        where = self.lowrank_cell_bases()
        names = [s.strip() for s in self.MAP_LOWRANK_CELLS.split(",") if s.strip()]
        return [(*where[name], self.MAP_HEADLINE_N) for name in names if name in where]

    def lowrank_cell_bases(self) -> dict[str, tuple[str, float | None]]:
        """MAP_LOWRANK_CELLS' names -> the (regime, p) of the base they name."""
        return {"headline": ("latent", self.MAP_HEADLINE_P), "skill_gap": ("skill_gap", None), "p0": ("latent", 0.0)}

    def check_lowrank(self) -> None:
        """The low-rank arms' parameters (docs/lowrank_es.md#l4-low-rank-on-the-map): clear errors naming them."""
        from copes_lib.substrate import MODEL_SIZES

        names = [s.strip() for s in self.MAP_LOWRANK_CELLS.split(",") if s.strip()]
        valid = {name: regime for name, (regime, _) in self.lowrank_cell_bases().items()}
        bad = [n for n in names if n not in valid]
        if bad or len(set(names)) != len(names):
            raise ConfigError(f"MAP_LOWRANK_CELLS = {self.MAP_LOWRANK_CELLS!r}: valid values are {list(valid)}, each "
                              "once, or empty (no low-rank arms)")
        if not self.MAP_SIZE or not self.MAP_LOWRANK_RANK:
            return
        missing = [n for n in names if valid[n] not in self.map_regimes()]
        if missing:
            raise ConfigError(f"MAP_LOWRANK_CELLS = {self.MAP_LOWRANK_CELLS!r}: {missing} need(s) the regime "
                              f"{sorted({valid[n] for n in missing})} in MAP_REGIMES = {self.MAP_REGIMES!r}")
        # the smallest side of the Qwen3 miniature's matrices (q/k/v/o, gate/up/down; the embedding is
        # vocabulary x hidden): lowrank.check_rank would stop the run at the first arm, this stops it here
        shape = MODEL_SIZES[self.MAP_SIZE]
        sides = (shape["hidden_size"], shape["intermediate_size"], shape["num_attention_heads"] * shape["head_dim"],
                 shape["num_key_value_heads"] * shape["head_dim"])
        if self.MAP_LOWRANK_RANK > min(sides):
            raise ConfigError(f"MAP_LOWRANK_RANK = {self.MAP_LOWRANK_RANK} exceeds the smaller side {min(sides)} of a "
                              f"weight matrix of MAP_SIZE {self.MAP_SIZE!r}; valid values: 0 (no low-rank arms) or "
                              f"1..{min(sides)}")

    def check_map(self) -> None:
        """The map's grid: clear errors naming the parameter (docs/mechanism.md#m6-the-map-of-where-es-and-copes-work)."""
        from copes_lib.substrate import MODEL_SIZES

        if not self.MAP_SIZE:
            return
        if self.MAP_SIZE not in MODEL_SIZES:
            raise ConfigError(f"MAP_SIZE = {self.MAP_SIZE!r}: valid values: {list(MODEL_SIZES)} or empty (no map)")
        regimes = self.map_regimes()
        if not regimes or set(regimes) - set(MAP_REGIMES) or len(set(regimes)) != len(regimes):
            raise ConfigError(f"MAP_REGIMES = {self.MAP_REGIMES!r}: valid values are {list(MAP_REGIMES)}, each once")
        try:
            priors, pops = self.map_priors(), self.map_populations()
        except ValueError as e:
            raise ConfigError(f"MAP_PRIORS = {self.MAP_PRIORS!r} / MAP_POPULATIONS = {self.MAP_POPULATIONS!r}: "
                              f"comma-separated numbers expected ({e})") from None
        bad = [p for p in priors if not 0.0 <= p < 1.0]
        if "latent" in regimes and (not priors or bad or 0.0 not in priors or len(set(priors)) != len(priors)):
            raise ConfigError(f"MAP_PRIORS = {self.MAP_PRIORS!r}: each latent prior p must be in [0, 1) (out of "
                              f"range: {bad}), distinct, with 0 included (prediction R2 reads p = 0)")
        if "latent" in regimes and self.MAP_HEADLINE_P not in priors:
            raise ConfigError(f"MAP_HEADLINE_P = {self.MAP_HEADLINE_P} must be one of MAP_PRIORS {priors}")
        if not pops or len(set(pops)) != len(pops) or pops != sorted(pops):
            raise ConfigError(f"MAP_POPULATIONS = {self.MAP_POPULATIONS!r}: distinct populations, small to large")
        if self.MAP_SUBSPACES == 1:
            raise ConfigError("MAP_SUBSPACES = 1 is standard ES: CoPES needs K >= 2 (or 0: K = N / 10)")
        small = [n for n in pops if self.map_subspaces(n) < 2 or n % self.map_subspaces(n)
                 or n // self.map_subspaces(n) < MIN_MEMBERS_PER_SUBSPACE]
        if small:
            raise ConfigError(f"MAP_POPULATIONS = {self.MAP_POPULATIONS!r} with MAP_SUBSPACES = {self.MAP_SUBSPACES}: "
                              f"N = {small} give CoPES N_k = N / K < {MIN_MEMBERS_PER_SUBSPACE} members per subspace "
                              f"(or K < 2, or N not a multiple of K); the map keeps N_k >= {MIN_MEMBERS_PER_SUBSPACE}, "
                              "the paper's regime: raise N or lower MAP_SUBSPACES")
        extra = sorted(set(self.map_control_populations()) - set(pops))
        if extra:
            raise ConfigError(f"MAP_CONTROL_POPULATIONS = {self.MAP_CONTROL_POPULATIONS!r}: {extra} not in "
                              f"MAP_POPULATIONS {pops}")
        if self.MAP_HEADLINE_N not in pops:
            raise ConfigError(f"MAP_HEADLINE_N = {self.MAP_HEADLINE_N} must be one of MAP_POPULATIONS {pops}")
        if self.BACKEND != "batched":
            raise ConfigError(f"BACKEND = {self.BACKEND!r}: the map's shuffled-fitness control permutes the rewards "
                              "of a whole population, which only the batched backend evaluates at once")
        self.check_lowrank()

    def check(self) -> None:
        from copes_lib.substrate import MODEL_SIZES

        self.check_map()

        sizes = self.sizes()
        bad = [s for s in sizes if s not in MODEL_SIZES]
        if not sizes or bad:
            raise ConfigError(f"SIZES = {self.SIZES!r}: unknown sizes {bad}; valid values: {list(MODEL_SIZES)}")
        if len(set(sizes)) != len(sizes):
            raise ConfigError(f"SIZES = {self.SIZES!r} names a size twice")
        if self.WARM_AXIS_SIZE and self.WARM_AXIS_SIZE not in sizes:
            raise ConfigError(f"WARM_AXIS_SIZE = {self.WARM_AXIS_SIZE!r} must be one of SIZES {sizes} or empty")
        bad = [p for p in self.protocols() if p not in ("paper", "step_matched")]
        if not self.protocols() or bad:
            raise ConfigError(f"PROTOCOLS = {self.PROTOCOLS!r}: valid values are 'paper' and 'step_matched'")
        if self.POPULATION % self.SUBSPACES or self.POPULATION // self.SUBSPACES < 2:
            raise ConfigError(f"POPULATION = {self.POPULATION} must be a multiple of SUBSPACES = {self.SUBSPACES} "
                              "with at least 2 members per subspace")
        if self.MECH_HELDOUT > self.VAL_PROBLEMS:
            raise ConfigError(f"MECH_HELDOUT = {self.MECH_HELDOUT} exceeds VAL_PROBLEMS = {self.VAL_PROBLEMS}: the "
                              "direction test's held-out problems are the first MECH_HELDOUT validation problems")
        if 0 < self.MECH_RANDOM < 2:
            raise ConfigError(f"MECH_RANDOM = {self.MECH_RANDOM}: the direction test needs 0 (off) or >= 2 random "
                              "directions (>= 20 for a p-value that can reach 0.05)")


def slug(size: str) -> str:
    """A size name as a summary-key fragment (``cpu-large`` -> ``cpu_large``)."""
    return size.replace("-", "_")


# =========================================================================== substrate per size
@dataclasses.dataclass
class Substrate:
    """A warm-started base of one size with its task objective (ES) and scored validation."""

    size: str
    warm_steps: int
    model: Any
    tokenizer: Any
    env: Any
    objective: Any
    val_tasks: list
    rollout_config: Any
    key: dict[str, Any]
    n_params: int
    warm_info: dict[str, Any]


class ScoredObjective(AgentObjective):
    """es_objective.AgentObjective whose validation also keeps the per-problem scores (``last_scores``)."""

    last_scores: list[float] | None = None
    last_strict: list[float] | None = None
    last_lenient: list[float] | None = None

    def validate(self, model) -> dict[str, float]:
        scores, result = score_problems(model, self.tokenizer, self.val_tasks, self.env, self.rollout_config)
        self.last_scores, self.last_strict, self.last_lenient = scores, result["strict_scores"], result["lenient_scores"]
        return {"score": result["score"], "accuracy": result["score"], "mean_reward": result["mean_reward"]}


def score_problems(model, tokenizer, tasks, env, rollout_config) -> tuple[list[float], dict[str, Any]]:
    """Greedy per-problem scores (math: 0/1 correctness) of ``tasks``, in order, and the mean metrics."""
    import torch

    from copes_lib.rollout import evaluate
    from copes_lib.tasks.regime import lenient_correctness, strict_correctness

    greedy = dataclasses.replace(rollout_config, temperature=0.0, top_p=1.0)
    with torch.no_grad():
        result = evaluate(model, tokenizer, list(tasks), env, greedy, seed=0, return_batches=True)
    batches = result.pop("batches")
    scores = [float(s) for b in batches for s in b.scores]
    # strict (the paper's reward fully earned) and lenient (the right answer anywhere in the final turn)
    # per problem, docs/regime.md#r2-the-base-regime-criterion: the map splits every gain into the two
    texts = [t for b in batches for t in b.model_texts]
    answers = [task.answers for b in batches for task in b.tasks]
    result["strict_scores"] = strict_correctness(None, texts, answers, env.kind)
    result["lenient_scores"] = lenient_correctness(None, texts, answers, env.kind)
    return scores, result


def data_profile(params: ScaleStudyParams) -> str:
    """Whose substrate recipe and tasks the study uses: the profile's own, except under gpu, whose
    single real checkpoint has no size axis: there the cpu recipe's miniatures run on the GPU."""
    return "cpu" if params.PROFILE == "gpu" else params.PROFILE


def load_substrate(params: ScaleStudyParams, size: str, warm_steps: int | None = None, *,
                   latent_p: float | None = None) -> Substrate:
    """The base model of ``size``, warm-started with notebook 01's recipe; cached by ``substrate.warm_start``.

    ``warm_steps`` (the warm-start axis) trains exactly that many steps: 01's stopping rule is off,
    else a longer cap stops where 01's recipe stops. ``Substrate.warm_steps`` is the number of steps
    actually trained, not the cap. Under the gpu profile: the cpu recipe (warm start on the CPU,
    cached under cache/cpu), then moved to the GPU. ``latent_p`` (the map): a latent-protocol base with
    that prior, 01's latent recipe at ``size`` (``MAP_LATENT_STEPS`` steps if set); ``warm_steps`` then
    does not apply."""
    import torch

    from copes_lib import substrate
    from copes_lib.es import checksum
    from copes_lib.protocols.substrate_setup import substrate_config
    from copes_lib.rollout import make_env
    from copes_lib.tasks import load_tasks

    data = data_profile(params)
    recipe = substrate_config(data)
    # The scale study stays in the skill-gap regime (the paper-protocol recipe, its cache entries and
    # cost unchanged) until its map adds the regime axis (docs/regime.md#r4-predictions-ours-registered-before-the-run).
    # dataclasses.replace goes through WarmStartConfig's constructor: fields added later keep their defaults
    if latent_p is None:
        recipe = dataclasses.replace(recipe, model_size=size, protocol="paper")
        if warm_steps is not None:
            recipe = dataclasses.replace(recipe, math_steps=warm_steps, math_target=0.0)
    else:
        recipe = dataclasses.replace(recipe, model_size=size, protocol="latent", latent_p=latent_p,
                                     latent_math_steps=params.MAP_LATENT_STEPS or recipe.latent_math_steps)
    model, tokenizer, info = substrate.warm_start(data, "math", seed=0, config=recipe)
    if params.PROFILE == "gpu" and torch.cuda.is_available():
        model = model.to("cuda")
    env = make_env("math", data)
    rollout_config = substrate.warm_rollout_config(recipe)
    val = load_tasks(data, "math", "val")[: params.VAL_PROBLEMS]
    objective = ScoredObjective(tokenizer, env, load_tasks(data, "math", "train"), val, rollout_config,
                                params.BATCH_SIZE, params.BATCH_SEED)
    trained_steps = int(info.get("steps", recipe.math_steps))
    key = {"profile": params.PROFILE, "data_profile": data, "size": size, "warm_steps": recipe.math_steps,
           "substrate_checksum": checksum(model), "val_ids": [t.id for t in val],
           "rollout": rollout_config.to_dict()}
    if latent_p is not None:  # the scale axis's keys (and cache entries) stay as they were
        key.update(protocol="latent", latent_p=latent_p, warm_steps=recipe.latent_math_steps)
    return Substrate(size, trained_steps, model, tokenizer, env, objective, val, rollout_config, key,
                     substrate.count_model_params(model), {k: info.get(k) for k in ("steps", "params", "train_time_s",
                                                                              "cached", "converged")})


# =========================================================================== arms
def _cached_json(params: ScaleStudyParams, name: str, key: dict[str, Any], compute) -> dict[str, Any]:
    from copes_lib import runs

    folder = runs.cache_dir(params.PROFILE, name, runs.cache_key(key))
    return runs.cached(folder / "result.json", compute, force=params.FORCE)


def base_scores(params: ScaleStudyParams, sub: Substrate) -> dict[str, Any]:
    def compute():
        scores, result = score_problems(sub.model, sub.tokenizer, sub.val_tasks, sub.env, sub.rollout_config)
        return {"scores": scores, "accuracy": result["score"]}

    return _cached_json(params, "scale_base", sub.key, compute)


def es_arm_config(params: ScaleStudyParams, arm: str, seed_index: int):
    """ESConfig of an ES-family arm: ``es`` (K = 1), ``copes_paper`` (K, ES's sigma and alpha) or
    ``copes_step_matched`` (K, alpha / sqrt(K))."""
    from copes_lib.es import ESConfig

    subspaces = 1 if arm == "es" else params.SUBSPACES
    alpha = params.ALPHA / math.sqrt(params.SUBSPACES) if arm == "copes_step_matched" else params.ALPHA
    return ESConfig(population=params.POPULATION, subspaces=subspaces, sigma=params.SIGMA, alpha=alpha,
                    chunk_size=params.CHUNK_SIZE, backend=params.BACKEND, seed=params.ES_SEED + seed_index)


def es_arm(params: ScaleStudyParams, sub: Substrate, arm: str, seed_index: int, base_accuracy: float
           ) -> dict[str, Any]:
    """One ES-family run of ``STEPS`` steps from a copy of the base; its per-problem scores at the budget."""
    from copes_lib import runs
    from copes_lib.es_training import train_es

    config = es_arm_config(params, arm, seed_index)
    key = {**sub.key, "es": config.to_dict(), "steps": params.STEPS, "batch_size": params.BATCH_SIZE,
           "batch_seed": params.BATCH_SEED}

    def compute():
        folder = runs.cache_dir(params.PROFILE, "scale_es_runs", runs.cache_key(key))
        history = train_es(copy.deepcopy(sub.model), sub.objective, config, steps=params.STEPS,
                           val_every=params.STEPS, run_dir=folder, resume=False,
                           base_validation={"score": base_accuracy, "accuracy": base_accuracy},
                           log_prefix=f"{sub.size} {arm} seed {seed_index}").history
        trained = history[1:]
        return {"scores": list(sub.objective.last_scores), "accuracy": history[-1]["eval/val_accuracy"],
                "mean_update_norm": float(np.mean([r["es/update_norm"] for r in trained])),
                "mean_step_s": float(np.mean([r["time/step_s"] for r in trained]))}

    return _cached_json(params, "scale_es", key, compute)


def grpo_arm(params: ScaleStudyParams, sub: Substrate, seed_index: int) -> dict[str, Any]:
    """Full GRPO for ``STEPS`` steps from a copy of the base; its per-problem scores at the budget."""
    from copes_lib import runs
    from copes_lib.grpo import GRPOConfig, train_grpo

    config = GRPOConfig(group_size=params.GROUP_SIZE, prompt_batch_size=params.GRPO_PROMPT_BATCH,
                        mini_batch_size=params.GRPO_PROMPT_BATCH, micro_batch_size=params.MICRO_BATCH,
                        lr=params.GRPO_LR, total_steps=params.GRPO_STEPS, val_every=params.STEPS,
                        seed=42 + seed_index)
    key = {**sub.key, "grpo": config.to_dict()}

    def compute():
        kept: list[list[float]] = []  # one entry per validation, in train_grpo's order (= val_by_step's)

        def evaluate_fn(model, tokenizer, tasks, env, cfg, seed):
            scores, result = score_problems(model, tokenizer, tasks, env, cfg)
            kept.append(scores)
            return result

        folder = runs.cache_dir(params.PROFILE, "scale_grpo_runs", runs.cache_key(key))
        result = train_grpo(copy.deepcopy(sub.model), sub.tokenizer, sub.env, sub.objective.train_tasks,
                            sub.val_tasks, config, folder, rollout_config=sub.rollout_config, resume=False,
                            evaluate_fn=evaluate_fn)
        trained = result.history[1:]
        by_step = dict(zip(result.val_by_step, kept, strict=True))
        budget = min(params.STEPS, params.GRPO_STEPS)
        return {"scores": by_step[budget], "accuracy": result.val_by_step[budget],
                "horizon_scores": by_step[params.GRPO_STEPS],
                "horizon_accuracy": result.val_by_step[params.GRPO_STEPS],
                "mean_step_s": float(np.mean([r["time/step_s"] for r in trained]))}

    return _cached_json(params, "scale_grpo", key, compute)


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

    from copes_lib import estimator_agreement as ea
    from copes_lib import mechanism as mech
    from copes_lib.es import checksum

    model = sub.model if model is None else model
    # "version": what the measurement contains (cache keys do not cover code): bump it when that changes
    key = {**sub.key, "base_checksum": checksum(model), "version": 2,
           "mech": {k: getattr(params, k) for k in ("MECH_RANDOM", "MECH_HELDOUT", "MECH_GROUP", "MECH_PROBES",
                                                    "MECH_POWER_ITERS", "MECH_FD_EPS", "POPULATION", "SUBSPACES",
                                                    "SIGMA", "ALPHA", "CHUNK_SIZE", "BACKEND", "BATCH_SIZE",
                                                    "BATCH_SEED", "ES_SEED", "SEED")}}

    def compute():
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        step = 1
        updates = {arm: ea.es_update_vector(model, sub.objective, es_arm_config(params, arm, 0), step)[0]
                   for arm in ("es", "copes_paper")}
        tasks = sub.objective.batch(step)
        grad, grad_info = ea.grpo_direction(model, sub.tokenizer, sub.env, tasks, sub.rollout_config,
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
        loss_fn, nll_info = rewarded_nll(model, sub.tokenizer, sub.env, tasks, sub.rollout_config,
                                         group_size=params.MECH_GROUP, seed=params.SEED + 2000)
        # d_eff is computed at the base; the surrogate's gradient there says how far from its own optimum
        # the base is (a Hessian far from a minimum can be indefinite, reported as d_eff None)
        curvature = (mech.effective_rank(model, loss_fn, probes=params.MECH_PROBES, iters=params.MECH_POWER_ITERS,
                                         seed=params.SEED, eps=params.MECH_FD_EPS)
                     if loss_fn is not None else {"d_eff": None, "d_eff_low": None, "d_eff_high": None})
        curvature.update(nll_info)
        times["curvature_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ggn = (mech.effective_rank(model, hvp=mech.softmax_ggn_vp(model, loss_fn.logits_fn, params.MECH_FD_EPS),
                                   probes=params.MECH_PROBES, iters=params.MECH_POWER_ITERS, seed=params.SEED)
               if loss_fn is not None else {"d_eff": None, "d_eff_low": None, "d_eff_high": None})
        times["curvature_ggn_s"] = time.perf_counter() - t0
        return {"direction_test": test, "linear_share": share, "plus": plus.tolist(), "minus": minus.tolist(),
                "curvature": curvature, "curvature_ggn": ggn, "grpo_ladder": ladder, "grpo_gradient": grad_info,
                "norms": norms,
                "population": params.POPULATION, "times": times}

    return _cached_json(params, "scale_mechanism", key, compute)


def es_family_arms(params: ScaleStudyParams) -> list[str]:
    return ["es"] + [f"copes_{p}" for p in params.protocols()]


def run_cell(params: ScaleStudyParams, sub: Substrate, *, with_mechanism: bool = True, log=print) -> dict[str, Any]:
    """Every arm at one (size, warm start): {"base", "grpo": [...], arm: [...], "mechanism": rows}."""
    cell: dict[str, Any] = {"size": sub.size, "warm_steps": sub.warm_steps, "n_params": sub.n_params,
                            "base": base_scores(params, sub)}
    log(f"[{NOTEBOOK}] {sub.size} ({sub.n_params:,} params, warm {sub.warm_steps}): base "
        f"{cell['base']['accuracy']:.3f}")
    cell["grpo"] = [grpo_arm(params, sub, g) for g in range(params.GRPO_SEEDS)]
    for arm in es_family_arms(params):
        cell[arm] = [es_arm(params, sub, arm, s, cell["base"]["accuracy"]) for s in range(params.SEEDS)]
        log(f"[{NOTEBOOK}] {sub.size} {arm}: mean val {np.mean([r['accuracy'] for r in cell[arm]]):.3f}")
    cell["mechanism"] = mechanism(params, sub) if with_mechanism and params.MECH_RANDOM else None
    return cell


# =========================================================================== analysis
def scores(cell: dict[str, Any], arm: str) -> np.ndarray:
    """(seeds, problems) 0/1 scores of an arm (``base`` is one row)."""
    rows = [cell["base"]] if arm == "base" else cell[arm]
    return np.asarray([r["scores"] for r in rows], dtype=float)


def grpo_horizon_accuracy(cell: dict[str, Any]) -> float:
    """Full GRPO's validation accuracy at its horizon (GRPO_STEPS), mean over its seeds."""
    return float(np.mean([np.mean(r["horizon_scores"]) for r in cell["grpo"]]))


def gain_recovery(cell: dict[str, Any], arm: str) -> dict[str, float | None]:
    """Mean and t-interval over seeds of (arm at the budget - base) / (full GRPO at its horizon - base)
    (05's rule); None where GRPO did not gain."""
    from copes_lib.stats import mean_ci

    base = float(scores(cell, "base").mean())
    grpo_gain = grpo_horizon_accuracy(cell) - base
    if grpo_gain <= 0:
        return {"mean": None, "low": None, "high": None, "grpo_gain": grpo_gain}
    per_seed = (scores(cell, arm).mean(axis=1) - base) / grpo_gain
    mean, low, high = mean_ci(per_seed)
    return {"mean": mean, "low": _finite(low), "high": _finite(high), "grpo_gain": grpo_gain}


def gap(cell: dict[str, Any], protocol: str = "paper"):
    """stats.compare of CoPES (``protocol``) - ES on the same problems, seeds paired."""
    from copes_lib import stats

    return stats.compare(scores(cell, f"copes_{protocol}"), scores(cell, "es"), name=f"copes_{protocol} - es",
                         expected_sign=1, paired_seeds=True)


def slope_test(n_params: list[float], values: list[float | None], lows: list[float | None] | None = None,
               highs: list[float | None] | None = None, at: float = QWEN35_4B_PARAMS,
               min_points: int = 4) -> dict[str, Any]:
    """The least-squares line value = a + b log10(params) over the sizes with a finite value, the
    slope's 95% interval from the per-size 95% intervals (sizes are independent models, so their
    variances add: claims S2 / S3's rule), and the 4B extrapolation rule of
    docs/mechanism.md#m3-the-4b-extrapolation-rule: ``at`` (the value at ``at`` parameters) only when
    ``min_points`` sizes back the line AND the slope's interval excludes 0, else None
    (``extrapolation_allowed`` False). Without per-size intervals the slope has none and no
    extrapolation is allowed."""
    lows = lows if lows is not None else [None] * len(values)
    highs = highs if highs is not None else [None] * len(values)
    points = [(math.log10(n), v, lo, hi) for n, v, lo, hi in zip(n_params, values, lows, highs)
              if v is not None and math.isfinite(v)]
    out: dict[str, Any] = {"slope_per_decade": None, "slope_low": None, "slope_high": None, "intercept": None,
                           "at": None, "n_points": len(points), "extrapolation_allowed": False}
    if len(points) < 2:
        return out
    from copes_lib import stats

    x, y = [p[0] for p in points], [p[1] for p in points]
    slope, intercept, _, _ = stats.slope_interval(x, y)
    out.update(slope_per_decade=slope, intercept=intercept)
    if all(p[2] is not None and p[3] is not None and math.isfinite(p[2]) and math.isfinite(p[3]) for p in points):
        _, _, low, high = stats.slope_interval(x, y, [p[2] for p in points], [p[3] for p in points])
        out.update(slope_low=low, slope_high=high)
        allowed = len(points) >= min_points and (out["slope_low"] > 0 or out["slope_high"] < 0)
        out["extrapolation_allowed"] = bool(allowed)
        if allowed:
            out["at"] = float(intercept + slope * math.log10(at))
    return out


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def budget_efficiency(cell: dict[str, Any], arm: str = "es") -> dict[str, float | None]:
    """ES's measured per-step efficiency in training: (arm at the budget - base) / (full GRPO at the
    budget - base), both ``STEPS`` steps from the same base; mean and t-interval over the arm's seeds
    (GRPO's gain taken as known); None where GRPO did not gain at the budget."""
    from copes_lib.stats import mean_ci

    base = float(scores(cell, "base").mean())
    grpo_gain = float(scores(cell, "grpo").mean()) - base
    if grpo_gain <= 0:
        return {"mean": None, "low": None, "high": None, "grpo_budget_gain": grpo_gain}
    mean, low, high = mean_ci((scores(cell, arm).mean(axis=1) - base) / grpo_gain)
    return {"mean": mean, "low": _finite(low), "high": _finite(high), "grpo_budget_gain": grpo_gain}


_Z95 = 1.959963984540054


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


def cell_summary(params: ScaleStudyParams, cell: dict[str, Any], tag: str) -> dict[str, Any]:
    """The flat summary keys of one cell, suffixed ``_<tag>``."""
    s: dict[str, Any] = {"n_params": cell["n_params"], "warm_steps": cell["warm_steps"],
                         "base_val_accuracy": float(scores(cell, "base").mean()),
                         "grpo_val_accuracy": float(scores(cell, "grpo").mean()),
                         "grpo_horizon_val_accuracy": grpo_horizon_accuracy(cell)}
    for arm in es_family_arms(params):
        s[f"{arm}_val_accuracy"] = float(scores(cell, arm).mean())
        rec = gain_recovery(cell, arm)
        s[f"gain_recovery_{arm}"], s[f"gain_recovery_{arm}_low"], s[f"gain_recovery_{arm}_high"] = (
            rec["mean"], rec["low"], rec["high"])
        s[f"update_norm_{arm}"] = float(np.mean([r["mean_update_norm"] for r in cell[arm]]))
    for protocol in params.protocols():
        c = gap(cell, protocol)
        s[f"copes_{protocol}_minus_es"] = c.estimate
        s[f"copes_{protocol}_minus_es_low"] = _finite(c.low)
        s[f"copes_{protocol}_minus_es_high"] = _finite(c.high)
        s[f"copes_{protocol}_minus_es_p"] = _finite(c.p)
        s[f"copes_{protocol}_minus_es_verdict"] = c.verdict
    s.update(mechanism_summary(cell))
    return {f"{k}_{tag}": v for k, v in s.items()}


def scores_digest(out_dir: str | Path) -> str | None:
    """sha256 of ``<out_dir>/scores.npz`` (``stats.scores_digest``): the summary's ``scores_sha256``."""
    from copes_lib import stats

    return stats.scores_digest(out_dir)


def save_cell_scores(params: ScaleStudyParams, out_dir: str | Path, cell: dict[str, Any], tag: str) -> None:
    """Per-seed per-problem scores of a cell as metric ``val_accuracy_at_budget_<tag>`` (stats contract)."""
    from copes_lib import stats

    arms = {arm: scores(cell, arm) for arm in ["base", "grpo", *es_family_arms(params)]}
    seeds = {"base": [0], "grpo": [42 + g for g in range(params.GRPO_SEEDS)],
             **{arm: [params.ES_SEED + s for s in range(params.SEEDS)] for arm in es_family_arms(params)}}
    stats.save_scores(out_dir, f"val_accuracy_at_budget_{tag}", arms, seeds)


# =========================================================================== the map (issue 22 item 5)
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
    """(regime, p) of every map base: one latent base per prior, one skill-gap base (p does not apply)."""
    out: list[tuple[str, float | None]] = []
    for regime in params.map_regimes():
        out += [("latent", p) for p in params.map_priors()] if regime == "latent" else [("skill_gap", None)]
    return out


def map_tag(regime: str, p: float | None, population: int | None = None) -> str:
    """A map cell's summary-key suffix: ``latent_p0_1_n40``, ``skill_gap_n40`` (a base: without ``_n``)."""
    tag = regime if p is None else f"{regime}_p{p:g}".replace(".", "_")
    return tag if population is None else f"{tag}_n{population}"


def load_map_base(params: ScaleStudyParams, regime: str, p: float | None) -> Substrate:
    """A map base at ``MAP_SIZE``: a latent-protocol warm start with prior p, or the skill-gap control
    (01's paper recipe, or exactly ``MAP_SKILL_STEPS`` steps)."""
    if regime == "latent":
        return load_substrate(params, params.MAP_SIZE, latent_p=p)
    return load_substrate(params, params.MAP_SIZE, warm_steps=params.MAP_SKILL_STEPS or None)


def run_map_base(params: ScaleStudyParams, sub: Substrate, regime: str, p: float | None, log=print
                 ) -> dict[str, Any]:
    """Every cell of one map base: {"base", "grpo", "mechanism", "cells": {N: {arm: [runs]}}, ...}."""
    base = map_base(params, sub)
    out: dict[str, Any] = {"regime": regime, "p": p, "n_params": sub.n_params, "warm_steps": sub.warm_steps,
                           "converged": sub.warm_info.get("converged"), "base": base}
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
    return out


def _rows(runs_: list[dict[str, Any]], metric: str) -> np.ndarray:
    return np.asarray([r[metric] for r in runs_], dtype=float)


def map_delta(base: dict[str, Any], runs_: list[dict[str, Any]], metric: str):
    """stats.compare of an arm's ``metric`` (strict, lenient, or ``protocol`` = strict - lenient per
    problem) against its base's, seeds x problems: Delta S, Delta L, Delta S - Delta L."""
    from copes_lib import stats

    def pick(rows, m):
        return _rows(rows, "strict") - _rows(rows, "lenient") if m == "protocol" else _rows(rows, m)

    return stats.compare(pick(runs_, metric), pick([base], metric), name=f"delta {metric}", expected_sign=1,
                         paired_seeds=False)


def map_gain_recovery(base_run: dict[str, Any], runs_: list[dict[str, Any]]) -> dict[str, float | None]:
    """Strict gain recovery (arm - base) / (full GRPO at its horizon - base) with stats.gain_recovery_interval
    (problems and both arms' seeds resampled: GRPO's seed noise is inside the interval)."""
    from copes_lib import stats

    grpo = np.asarray([r["horizon_strict"] for r in base_run["grpo"]], dtype=float)
    arms = {"method": _rows(runs_, "strict"), "base": _rows([base_run["base"]], "strict"), "full_grpo": grpo}
    seeds = {name: tuple(range(len(x))) for name, x in arms.items()}
    rec = stats.gain_recovery_interval(stats.ScoreSet("strict", arms, seeds), "method")
    return {"mean": _finite(rec.estimate), "low": _finite(rec.low), "high": _finite(rec.high),
            "grpo_gain": float(grpo.mean() - np.mean(base_run["base"]["strict"])), "note": rec.note}


def map_gap(cell: dict[str, list], a: str = "copes", b: str = "es"):
    """stats.compare of arm ``a`` - arm ``b`` in strict accuracy, same base, seeds paired."""
    from copes_lib import stats

    return stats.compare(_rows(cell[a], "strict"), _rows(cell[b], "strict"), name=f"{a} - {b}", expected_sign=1,
                         paired_seeds=True)


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
    # R2: Delta S of ES at p = 0, N = MAP_HEADLINE_N (seeds x problems)
    if 0.0 in latent:
        c = map_delta(latent[0.0]["base"], latent[0.0]["cells"][n0]["es"], "strict")
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
        d_eff = ((b.get("mechanism") or {}).get("curvature") or {}).get("d_eff")
        if d_eff is None or not d_eff > 0:
            continue
        for n, cell in b["cells"].items():
            c = map_gap(cell)
            xs.append(math.log10(n / d_eff))
            vs.append(c.estimate)
            lo.append(c.low)
            hi.append(c.high)
    fit = line_fit(xs, vs, lo, hi)
    put("R7", fit["slope"], fit["low"], fit["high"])
    out["prediction_R7_points"] = fit["n_points"]
    return out


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
    cell, base = base_run["cells"][n], base_run["base"]
    s: dict[str, Any] = {}
    for arm in [a for a in (*MAP_ARMS, *MAP_LOWRANK_ARMS) if a in cell]:
        for metric, name in (("strict", "delta_s"), ("lenient", "delta_l"), ("protocol", "delta_protocol")):
            c = map_delta(base, cell[arm], metric)
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
        c = map_gap(cell, a, b)
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
                           "map_headline_n": params.MAP_HEADLINE_N, "map_mechanism_per": "base"}
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
        curv = ((b.get("mechanism") or {}).get("curvature") or {})
        out[f"map_d_eff_{tag}"] = curv.get("d_eff")
        out[f"map_d_eff_low_{tag}"], out[f"map_d_eff_high_{tag}"] = curv.get("d_eff_low"), curv.get("d_eff_high")
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
    ``map_<strict|lenient>_<tag>``."""
    from copes_lib import stats

    for (regime, p), b in bases.items():
        for n, cell in b["cells"].items():
            for metric in ("strict", "lenient"):
                arms = {"base": _rows([b["base"]], metric),
                        "full_grpo": np.asarray([r[f"horizon_{metric}"] for r in b["grpo"]], dtype=float),
                        **{arm: _rows(rows, metric) for arm, rows in cell.items()}}
                seeds = {"base": [0], "full_grpo": [42 + g for g in range(len(b["grpo"]))],
                         **{arm: [params.ES_SEED + s for s in range(len(rows))] for arm, rows in cell.items()}}
                stats.save_scores(out_dir, f"map_{metric}_{map_tag(regime, p, n)}", arms, seeds)


__all__ = ["ScaleStudyParams", "Substrate", "load_substrate", "run_cell", "cell_summary", "gain_recovery", "gap",
           "slope_test", "mechanism", "mechanism_summary", "mechanism_verdicts", "budget_efficiency", "heldout_fitness",
           "rewarded_nll", "save_cell_scores", "scores_digest", "slug", "scores", "QWEN35_4B_PARAMS", "NOTEBOOK",
           "MAP_ARMS", "MAP_LOWRANK_ARMS", "LOWRANK_MARGIN", "lowrank_prediction",
           "map_lowrank_summary", "ShuffledFitness", "map_arm_config", "map_bases", "map_tag", "load_map_base", "run_map_base",
           "map_delta", "map_gain_recovery", "map_gap", "line_fit", "map_predictions", "map_summary",
           "map_cell_summary", "save_map_scores"]
