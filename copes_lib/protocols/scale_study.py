"""Notebook 09's study (issue 18, beyond the paper): where do ES's and CoPES's effects appear?

Neither paper varies model size, warm-start depth or the noise protocol (it post-trains one 4B
model). This module runs, on the suite's miniature substrate:

- **scale axis**: for each size in ``SIZES`` (names of ``substrate.MODEL_SIZES``), a base model
  warm-started EXACTLY as notebook 01 warm-starts its own (``substrate.warm_start`` with 01's
  parameters, only ``model_size`` changed; the size 01 uses is its cached model), then at the same
  step budget: full GRPO (``grpo.train_grpo``), standard ES (K = 1) and CoPES (K = ``SUBSPACES``)
  (``es.train_es``), ES-family arms over ``SEEDS`` noise seeds on the SAME prompt batches (paired);
- **protocol axis**: CoPES with ES's sigma / alpha (the paper's protocol; its update is ~sqrt(K)
  times larger) and CoPES with alpha / sqrt(K) (step-matched to ES), at every size;
- **warm-start axis**: at ``WARM_AXIS_SIZE``, the same arms from an under-trained and a longer-trained
  ("converged") warm start, each trained for exactly ``UNDER_WARM_STEPS`` / ``CONVERGED_WARM_STEPS``
  steps: 01's stopping rule is switched off for them, since with it a longer cap stops at the same step
  as 01's recipe and the axis would compare a base model with itself;
- **mechanism**: at the warm-started weights, ``copes_lib.estimator_agreement``'s cosines (two
  independent populations; each against the GRPO policy gradient on the same prompts).

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
from copes_lib.es import AgentObjective

NOTEBOOK = "09_scale_study"
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
    MECH_POPULATIONS: int = param(3, "independent populations per estimator for the agreement cosines "
                                  "(0: no mechanism measurement)", ge=0)
    MECH_POPULATION: int = param(16, "N of each population in the mechanism measurement", ge=2)
    MECH_REFERENCES: int = param(2, "GRPO policy-gradient estimates per size (their own agreement is the ceiling)",
                                 ge=1)
    MECH_GROUP: int = param(8, "sampled trajectories per prompt of each GRPO gradient estimate", ge=2)

    def sizes(self) -> list[str]:
        return [s.strip() for s in self.SIZES.split(",") if s.strip()]

    def protocols(self) -> list[str]:
        return [s.strip() for s in self.PROTOCOLS.split(",") if s.strip()]

    def check(self) -> None:
        from copes_lib.substrate import MODEL_SIZES

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
        for name, n in (("POPULATION", self.POPULATION), ("MECH_POPULATION", self.MECH_POPULATION)):
            if n % self.SUBSPACES or n // self.SUBSPACES < 2:
                raise ConfigError(f"{name} = {n} must be a multiple of SUBSPACES = {self.SUBSPACES} with at "
                                  "least 2 members per subspace")


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
    """es.AgentObjective whose validation also keeps the per-problem scores (``last_scores``)."""

    last_scores: list[float] | None = None

    def validate(self, model) -> dict[str, float]:
        scores, result = score_problems(model, self.tokenizer, self.val_tasks, self.env, self.rollout_config)
        self.last_scores = scores
        return {"score": result["score"], "accuracy": result["score"], "mean_reward": result["mean_reward"]}


def score_problems(model, tokenizer, tasks, env, rollout_config) -> tuple[list[float], dict[str, Any]]:
    """Greedy per-problem scores (math: 0/1 correctness) of ``tasks``, in order, and the mean metrics."""
    import torch

    from copes_lib.rollout import evaluate

    greedy = dataclasses.replace(rollout_config, temperature=0.0, top_p=1.0)
    with torch.no_grad():
        result = evaluate(model, tokenizer, list(tasks), env, greedy, seed=0, return_batches=True)
    scores = [float(s) for b in result.pop("batches") for s in b.scores]
    return scores, result


def data_profile(params: ScaleStudyParams) -> str:
    """Whose substrate recipe and tasks the study uses: the profile's own, except under gpu, whose
    single real checkpoint has no size axis: there the cpu recipe's miniatures run on the GPU."""
    return "cpu" if params.PROFILE == "gpu" else params.PROFILE


def load_substrate(params: ScaleStudyParams, size: str, warm_steps: int | None = None) -> Substrate:
    """The base model of ``size``, warm-started with notebook 01's recipe; cached by ``substrate.warm_start``.

    ``warm_steps`` (the warm-start axis) trains exactly that many steps: 01's stopping rule is off,
    else a longer cap stops where 01's recipe stops. ``Substrate.warm_steps`` is the number of steps
    actually trained, not the cap. Under the gpu profile: the cpu recipe (warm start on the CPU,
    cached under cache/cpu), then moved to the GPU."""
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
    recipe = dataclasses.replace(recipe, model_size=size, protocol="paper")
    if warm_steps is not None:
        recipe = dataclasses.replace(recipe, math_steps=warm_steps, math_target=0.0)
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
    return Substrate(size, trained_steps, model, tokenizer, env, objective, val, rollout_config, key,
                     substrate.count_model_params(model), {k: info.get(k) for k in ("steps", "params", "train_time_s",
                                                                              "cached")})


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
    from copes_lib.es import train_es

    config = es_arm_config(params, arm, seed_index)
    key = {**sub.key, "es": config.to_dict(), "steps": params.STEPS, "batch_size": params.BATCH_SIZE,
           "batch_seed": params.BATCH_SEED}

    def compute():
        folder = runs.cache_dir(params.PROFILE, "scale_es_runs", runs.cache_key(key))
        history = train_es(copy.deepcopy(sub.model), sub.objective, config, steps=params.STEPS,
                           val_every=params.STEPS, run_dir=folder, resume=False,
                           base_validation={"score": base_accuracy, "accuracy": base_accuracy},
                           log_prefix=f"{sub.size} {arm} seed {seed_index}")
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


def mechanism(params: ScaleStudyParams, sub: Substrate) -> list[dict[str, Any]]:
    """estimator_agreement's rows at the base weights, on the prompts of ES step 1."""
    from copes_lib import estimator_agreement as ea

    key = {**sub.key, "mech": [params.MECH_POPULATIONS, params.MECH_POPULATION, params.MECH_REFERENCES,
                               params.MECH_GROUP, params.SUBSPACES, params.SIGMA, params.ALPHA,
                               params.CHUNK_SIZE, params.BACKEND, params.BATCH_SIZE, params.BATCH_SEED]}

    def compute():
        arms = {}
        for name, subspaces in (("es", 1), ("copes", params.SUBSPACES)):
            config = es_arm_config(params, "es" if subspaces == 1 else "copes_paper", 0)
            config = dataclasses.replace(config, population=params.MECH_POPULATION)
            arms[name] = ea.population_estimates(sub.model, sub.objective, ea.Arm(name, config), step=1,
                                                 populations=params.MECH_POPULATIONS, seed=params.SEED)
        tasks = sub.objective.batch(1)
        references = [ea.grpo_direction(sub.model, sub.tokenizer, sub.env, tasks, sub.rollout_config,
                                        group_size=params.MECH_GROUP, seed=1000 + r,
                                        micro_batch_size=params.MICRO_BATCH)[0]
                      for r in range(params.MECH_REFERENCES)]
        return {"rows": ea.summarize_agreement(arms, references)}

    return _cached_json(params, "scale_mechanism", key, compute)["rows"]


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
    cell["mechanism"] = mechanism(params, sub) if with_mechanism and params.MECH_POPULATIONS >= 2 else []
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


def log_fit(n_params: list[float], values: list[float | None], at: float = QWEN35_4B_PARAMS) -> dict[str, Any]:
    """Least-squares line value = a + b log10(params) over the finite points; its value at ``at``
    (an EXTRAPOLATION, labelled so wherever it is shown). None with fewer than 2 points."""
    points = [(math.log10(n), v) for n, v in zip(n_params, values) if v is not None and math.isfinite(v)]
    if len(points) < 2:
        return {"slope_per_decade": None, "intercept": None, "at": None, "n_points": len(points)}
    x, y = np.array(points).T
    slope, intercept = np.polyfit(x, y, 1)
    return {"slope_per_decade": float(slope), "intercept": float(intercept),
            "at": float(intercept + slope * math.log10(at)), "n_points": len(points)}


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def mechanism_values(cell: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for row in cell["mechanism"]:
        arm = row["arm"]
        if arm == "reference":
            out["grpo_self_agreement"] = _finite(row["agreement"])
            continue
        out[f"agreement_{arm}"] = _finite(row["agreement"])
        out[f"cos_grpo_{arm}"] = _finite(row["cos_reference"])
        out[f"update_norm_{arm}"] = _finite(row["update_norm"])
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
    s.update(mechanism_values(cell))
    # two independent random directions in d dimensions have cosine ~ N(0, 1/d): the chance level
    s["cos_chance_sd"] = 1.0 / math.sqrt(cell["n_params"])
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


__all__ = ["ScaleStudyParams", "Substrate", "load_substrate", "run_cell", "cell_summary", "gain_recovery", "gap",
           "log_fit", "save_cell_scores", "scores_digest", "slug", "scores", "QWEN35_4B_PARAMS", "NOTEBOOK"]
