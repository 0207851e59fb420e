"""Notebook 09's parameters, its bases (a warm-started substrate per size or map cell), the arms
trained on them (full GRPO, ES, CoPES) and how a cell's per-problem scores read (gain recovery, the
CoPES - ES gap, ES's per-step efficiency)."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np

from copes_lib.config import ConfigError, NotebookParams, param
from copes_lib.es_objective import AgentObjective

NOTEBOOK = "09_scale_study"
# the map's regimes (docs/mechanism.md#m6-the-map-of-where-es-and-copes-work): latent (cued-prior bases, one per
# MAP_PRIORS value; R2 / R5 / R6 read them), graded and homogeneous (one latent-protocol base each: the contrasts
# of docs/preflight.md#p2-the-graded-base-the-new-headline-base-design), skill_gap (the paper-protocol control)
MAP_REGIMES = ("latent", "graded", "homogeneous", "skill_gap")
#: load_substrate's latent priors: cued (the map's latent bases, the default), graded, homogeneous
MAP_PRIORS_OF_REGIME = {"latent": "cued", "graded": "graded", "homogeneous": "homogeneous"}
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
    MECH_NLL_BATCHES: int = param(4, "d_eff's surrogate: ES batches (from step 1 on) sampled until one holds a "
                                  "rewarded trajectory (a base that rarely earns the reward has none in one batch)",
                                  ge=1)
    MECH_FD_EPS: float = param(1e-2, "step length of the finite-difference Hessian-vector products", gt=0.0)
    MECH_MEMBERS_PER_BATCH: int = param(4, "directions per batched forward in the direction test (memory only)",
                                        ge=1)
    # the map (issue 22 item 5; docs/mechanism.md#m6-the-map-of-where-es-and-copes-work)
    MAP_SIZE: str = param("tiny", "substrate shape of the map (substrate.MODEL_SIZES); empty: no map")
    MAP_REGIMES: str = param("latent,graded,homogeneous,skill_gap", "regimes of the map: latent (cued-prior "
                             "latent-protocol bases, one per MAP_PRIORS value), graded (one base: 01's graded latent "
                             "recipe), homogeneous (one base: the homogeneous prior at MAP_HEADLINE_P) and skill_gap "
                             "(01's paper-protocol recipe), all at MAP_SIZE")
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
    MAP_LATENT_STEPS: int = param(1500, "warm-start steps of each latent-protocol base (latent, graded, "
                                  "homogeneous), trained exactly; 0: 01's WARM_LATENT_MATH_STEPS (1,000: at tiny it "
                                  "missed the convergence rule of docs/regime.md R3, 1,500 met it)", ge=0)
    MAP_SKILL_STEPS: int = param(0, "warm-start steps of the skill-gap base, trained exactly; 0: 01's paper "
                                 "recipe (its stopping rule included)", ge=0)
    MAP_MECHANISM: bool = param(True, "the mechanism measurement (d_eff, direction test) once per map base, at "
                                "MAP_HEADLINE_N (R7 reads its d_eff)")
    MAP_PREFLIGHT: bool = param(True, "the preconditions G1, G2 and E1 (docs/preflight.md) once per map base, with "
                                "notebook 01's PREFLIGHT_* settings of the profile, so the map shows where each fails")
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
            raise ConfigError(f"MAP_REGIMES = {self.MAP_REGIMES!r}: valid values are {list(MAP_REGIMES)}, each once "
                              "(comma-separated)")
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
    units: tuple[str, ...] = ()  # each validation problem's latent unit (:func:`val_units`), in val_tasks' order


def val_units(tasks: list, *, cued: bool = False) -> tuple[str, ...]:
    """The latent unit of each validation problem, for 09's cluster-aware intervals
    (docs/statistics.md#s6-latent-units-registered-2026-12-03): ``Task.unit_id`` (the subject name; a task
    without one is its own unit: ``fixed_budget.problem_units``), or on a cued-prior base the cue the prior
    keys on (``substrate.prior_cue``, the unit's first letter): there a letter's names behave alike, so the
    letter is the unit to resample (docs/regime.md#r11-the-latent-unit-registered-2026-12-03)."""
    from copes_lib.protocols.paper_a.fixed_budget import problem_units
    from copes_lib.substrate import prior_cue

    names = problem_units(tasks)
    if not cued:
        return names
    return tuple(prior_cue(t) if getattr(t, "unit_id", "") else name for t, name in zip(tasks, names))


def substrate_units(params: ScaleStudyParams, sub: Any, *, cued: bool = False) -> tuple[str, ...] | None:
    """A base's unit ids: ``Substrate.units``; where a base carries none (a substrate built elsewhere), from its
    validation tasks, else from the validation ids of its cache key through the task loader
    (``load_tasks(data_profile, "math", "val")``), so a unit is never dropped where the problems are known;
    None where nothing names the problems."""
    if getattr(sub, "units", None):
        return tuple(sub.units)
    if getattr(sub, "val_tasks", None):
        return val_units(sub.val_tasks, cued=cued)
    ids = (getattr(sub, "key", None) or {}).get("val_ids")
    if not ids:
        return None
    from copes_lib.tasks import load_tasks

    by_id = {t.id: t for t in load_tasks(data_profile(params), "math", "val")}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ConfigError(f"validation ids {missing[:3]} of a cached base are not in the {data_profile(params)} "
                          "validation split: its problems' units cannot be recovered; rerun with FORCE")
    return val_units([by_id[i] for i in ids], cued=cued)


def cell_units(cell: dict[str, Any]) -> tuple[str, ...] | None:
    """The unit ids a cell or map base carries (``run_cell`` / ``run_map_base`` put them there), else None:
    every problem its own unit, as before unit ids existed."""
    return tuple(cell["units"]) if cell.get("units") else None


def unit_count(cell: dict[str, Any]) -> tuple[int, float | None]:
    """(units, Kish's effective number of units) the intervals of a cell or map base rest on; without unit ids
    (problems, None)."""
    from copes_lib import stats

    units = cell_units(cell)
    if not units:
        return len(cell["base"]["scores"]), None
    sizes = np.unique(np.asarray(units), return_counts=True)[1]
    return len(sizes), stats.effective_units(sizes)


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
                   latent_p: float | None = None, prior: str | None = None) -> Substrate:
    """The base model of ``size``, warm-started with notebook 01's recipe; cached by ``substrate.warm_start``.

    ``warm_steps`` (the warm-start axis) trains exactly that many steps: 01's stopping rule is off,
    else a longer cap stops where 01's recipe stops. ``Substrate.warm_steps`` is the number of steps
    actually trained, not the cap. Under the gpu profile: the cpu recipe (warm start on the CPU,
    cached under cache/cpu), then moved to the GPU. The map's latent-protocol bases (01's latent recipe
    at ``size``, ``MAP_LATENT_STEPS`` steps if set; ``warm_steps`` then does not apply), by ``prior``:

    - ``None`` or ``"cued"`` with ``latent_p``: the cued prior at p, constant rate (the map's latent bases,
      registered as p-prior bases; their configs and cache keys are those of before ``prior`` existed);
    - ``"graded"``: 01's graded prior (``WARM_GRADED_LOW`` / ``WARM_GRADED_HIGH``) and its ``WARM_LR_DECAY``
      (docs/preflight.md#p2-the-graded-base-the-new-headline-base-design); p does not apply;
    - ``"homogeneous"`` with ``latent_p``: the homogeneous prior at p, constant rate (as the cued bases)."""
    import torch

    from copes_lib import substrate
    from copes_lib.es import checksum
    from copes_lib.protocols.testbed.substrate_setup import substrate_config, substrate_params
    from copes_lib.rollout import make_env
    from copes_lib.tasks import load_tasks

    if prior not in (None, *MAP_PRIORS_OF_REGIME.values()):
        raise ConfigError(f"prior = {prior!r}: valid values {[None, *MAP_PRIORS_OF_REGIME.values()]}")
    if prior in ("cued", "homogeneous") and latent_p is None:
        raise ConfigError(f"prior = {prior!r} needs latent_p (the fraction of paper-protocol traces)")
    if prior == "graded" and latent_p is not None:
        raise ConfigError("prior = 'graded' takes no latent_p: each cue value has its own rate "
                          "(WARM_GRADED_LOW .. WARM_GRADED_HIGH)")
    data = data_profile(params)
    recipe = substrate_config(data)
    # The scale study stays in the skill-gap regime (the paper-protocol recipe, its cache entries and
    # cost unchanged) until its map adds the regime axis (docs/regime.md#r4-predictions-ours-registered-before-the-run).
    # dataclasses.replace goes through WarmStartConfig's constructor: fields added later keep their defaults
    latent = prior is not None or latent_p is not None
    if not latent:
        recipe = dataclasses.replace(recipe, model_size=size, protocol="paper")
        if warm_steps is not None:
            recipe = dataclasses.replace(recipe, math_steps=warm_steps, math_target=0.0)
    elif prior == "graded":
        # 01's graded recipe as registered (docs/preflight.md P2), whatever 01's own WARM_PROTOCOL is (a
        # paper-protocol profile's recipe carries lr_decay 0: the rate comes from 01's parameter itself)
        p01 = substrate_params(data)
        recipe = dataclasses.replace(recipe, model_size=size, protocol="latent", latent_prior="graded",
                                     graded_low=p01.WARM_GRADED_LOW, graded_high=p01.WARM_GRADED_HIGH,
                                     lr_decay=p01.WARM_LR_DECAY,
                                     latent_math_steps=params.MAP_LATENT_STEPS or recipe.latent_math_steps)
    else:
        # the map's latent bases are registered as p-prior bases (docs/mechanism.md): a graded 01 recipe
        # ignores p, so the map keeps the cued prior and the constant rate it was registered with; the
        # homogeneous contrast has the same constant rate (lr_decay 0, as registered for the p-prior bases)
        if recipe.latent_prior == "graded":
            recipe = dataclasses.replace(recipe, latent_prior="cued", lr_decay=0.0)
        if prior == "homogeneous":
            recipe = dataclasses.replace(recipe, latent_prior="homogeneous", lr_decay=0.0)
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
    if latent:  # the scale axis's keys (and cache entries) stay as they were
        key.update(protocol="latent", latent_p=latent_p, warm_steps=recipe.latent_math_steps)
        if prior in ("graded", "homogeneous"):  # the cued bases keep their keys
            key.update(latent_prior=prior, lr_decay=recipe.lr_decay)
            if prior == "graded":
                key.update(graded_low=recipe.graded_low, graded_high=recipe.graded_high)
    cued = latent and recipe.protocol == "latent" and recipe.latent_prior == "cued"
    return Substrate(size, trained_steps, model, tokenizer, env, objective, val, rollout_config, key,
                     substrate.count_model_params(model), {k: info.get(k) for k in ("steps", "params", "train_time_s",
                                                                              "cached", "converged")},
                     val_units(val, cued=cued))


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


def es_family_arms(params: ScaleStudyParams) -> list[str]:
    return ["es"] + [f"copes_{p}" for p in params.protocols()]


def scores(cell: dict[str, Any], arm: str) -> np.ndarray:
    """(seeds, problems) 0/1 scores of an arm (``base`` is one row)."""
    rows = [cell["base"]] if arm == "base" else cell[arm]
    return np.asarray([r["scores"] for r in rows], dtype=float)


def grpo_horizon_accuracy(cell: dict[str, Any]) -> float:
    """Full GRPO's validation accuracy at its horizon (GRPO_STEPS), mean over its seeds."""
    return float(np.mean([np.mean(r["horizon_scores"]) for r in cell["grpo"]]))


def _recovery(cell: dict[str, Any], arm: str, reference: np.ndarray) -> dict[str, Any]:
    """(arm - base) / (reference - base) with ``stats.gain_recovery_interval``: the arm's and the reference's
    seeds, the latent units and the problems within them resampled (:func:`cell_units`)."""
    from copes_lib import stats

    arms = {"method": scores(cell, arm), "base": scores(cell, "base"), "full_grpo": reference}
    seeds = {name: tuple(range(len(x))) for name, x in arms.items()}
    rec = stats.gain_recovery_interval(stats.ScoreSet("val", arms, seeds, units=cell_units(cell)), "method")
    return {"mean": _finite(rec.estimate), "low": _finite(rec.low), "high": _finite(rec.high), "note": rec.note}


def gain_recovery(cell: dict[str, Any], arm: str) -> dict[str, Any]:
    """(arm at the budget - base) / (full GRPO at its horizon - base) (05's rule) with its 95% interval over
    the arm's and full GRPO's seeds, the latent units and the problems within them
    (``stats.gain_recovery_interval``; docs/statistics.md#s6-latent-units-registered-2026-12-03); None where
    GRPO did not gain."""
    base = float(scores(cell, "base").mean())
    grpo_gain = grpo_horizon_accuracy(cell) - base
    if grpo_gain <= 0:
        return {"mean": None, "low": None, "high": None, "grpo_gain": grpo_gain}
    reference = np.asarray([r["horizon_scores"] for r in cell["grpo"]], dtype=float)
    return {**_recovery(cell, arm, reference), "grpo_gain": grpo_gain}


def gap(cell: dict[str, Any], protocol: str = "paper"):
    """stats.compare of CoPES (``protocol``) - ES on the same problems, seeds paired, cluster-aware over the
    cell's latent units (:func:`cell_units`)."""
    from copes_lib import stats

    return stats.compare(scores(cell, f"copes_{protocol}"), scores(cell, "es"), name=f"copes_{protocol} - es",
                         expected_sign=1, paired_seeds=True, units=cell_units(cell))


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def budget_efficiency(cell: dict[str, Any], arm: str = "es") -> dict[str, float | None]:
    """ES's measured per-step efficiency in training: (arm at the budget - base) / (full GRPO at the
    budget - base), both ``STEPS`` steps from the same base, with its 95% interval over the arm's and full
    GRPO's seeds, the latent units and the problems within them (as :func:`gain_recovery`); None where GRPO
    did not gain at the budget."""
    base = float(scores(cell, "base").mean())
    grpo_gain = float(scores(cell, "grpo").mean()) - base
    if grpo_gain <= 0:
        return {"mean": None, "low": None, "high": None, "grpo_budget_gain": grpo_gain}
    return {**_recovery(cell, arm, scores(cell, "grpo")), "grpo_budget_gain": grpo_gain}


_Z95 = 1.959963984540054
