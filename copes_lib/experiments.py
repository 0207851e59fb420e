"""Paper A's experiments: the fixed-budget comparison (Table 1, Fig. 3, Fig. S4), the CoPES ablations
(Table 3) and multi-hop QA (Table 4), as cached runs of ``copes_lib.es`` and ``copes_lib.grpo``.

This module only orchestrates: it builds the configurations of each arm, runs them through the cached
trainers (a finished run is reused, an interrupted one resumes), evaluates checkpoints on the test
split with the paper's test decoding, and turns histories into the paper's quantities. Notebooks 05,
06 and 07 call it and tabulate / plot.

The protocol, next to the paper (PAPERS.md A4-A6):

1. full GRPO is trained and validated; its best validation step s* sets the budget (the paper:
   s* = 16). ``BUDGET_STEPS > 0`` fixes the budget instead (stated in the notebook).
2. standard ES, CoPES and LoRA-GRPO run for the budget; ES and CoPES with several seeds. Seed i
   uses noise seed ``ES_SEED + i`` and prompt-batch seed ``BATCH_SEED + i`` for BOTH methods, so
   ES and CoPES of one seed see the same prompt batches (paired).
3. standard ES seed 0 (or ``LONG_SEEDS`` seeds) is continued from its budget checkpoint to
   ``ES_LONG_STEPS`` (resuming the cached run, identical to an uninterrupted one) to find its best
   checkpoint and the first validated step at which it reaches CoPES's budget-level accuracy.
4. gain recovery = (method - base) / (full GRPO best - base) on validation accuracy.
5. test decoding: temperature 0.3, top-p 1, n samples per problem, unbiased pass@k for k = 1..n.

How it departs from the paper (and why):
- Several seeds where the paper ran once; intervals are Student-t over seeds; "significant" is a
  two-sided paired t-test at 5% (with 3 seeds it has little power: a non-significant result is weak
  evidence either way).
- The paper ran each method once with shared sigma / alpha. Here two protocols sit side by side: the
  paper's (CoPES at standard ES's sigma and alpha) and each method at its own tuned setting (read
  from notebooks 02 / 03 when they have run, else the notebook's parameters); FINDINGS.md showed the
  choice decides the sign of the comparison at this scale.
- GRPO's prompt batches come from its own seeded order (``grpo.prompt_batch``), so they are not
  paired with ES's; every method is validated on the same problems.
- Step costs are this machine's measured wall time per training step (validation excluded, as in
  A5), counting the machine as one device; "est. device-hours" = mean step cost x steps.
- ``BACKEND = "ray"`` spreads the members over Ray workers (one per GPU on a GPU cluster; ``RAY_ADDRESS``):
  the workers rebuild the agent with the run's own batch seed (``AgentSetup.worker_args``).
- Test decoding of ES and CoPES uses seed 0's checkpoint only (cost); seeds enter the validation
  comparison.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from copes_lib import paper, runs, stats
from copes_lib.config import ConfigError, NotebookParams, param

ABLATION_KEYS = ("k1", "k2", "k4", "k8", "indep_z", "es_2sigma", "es_sqrtk_alpha", "copes_matched_step")


# =========================================================================== parameters
@dataclass(frozen=True)
class _ExperimentParams(NotebookParams):
    """What every paper-A experiment notebook shares: the ES engine, the batches, the validation."""

    POPULATION: int = param(40, "N, members per ES / CoPES step (paper: 40)", ge=2)
    BATCH_SIZE: int = param(16, "prompts per ES step, shared by all members (paper: 64)", ge=1)
    VAL_PROBLEMS: int = param(512, "validation problems (0 means all of the val split; paper: 750)", ge=0)
    VAL_EVERY: int = param(4, "validate every this many steps (paper: 8)", ge=1)
    BUDGET_STEPS: int = param(8, "the step budget; 0 means full GRPO's best validation step s* (paper: 16)",
                              ge=0)
    SEEDS: int = param(3, "seeds of ES and CoPES (paper: 1 run each)", ge=1)
    SIGMA: float = param(1e-2, "standard ES sigma when notebook 02 has not chosen one (paper: 1e-3)", gt=0.0)
    ALPHA: float = param(5e-3, "standard ES alpha when notebook 02 has not chosen one (paper: 5e-4)", gt=0.0)
    SUBSPACES: int = param(4, "K of CoPES (paper: 4)", ge=1)
    CHUNK_SIZE: int = param(4096, "elements per parameter chunk (paper: unstated)", ge=1)
    BACKEND: str = param("batched", "ES member evaluation: sequential, batched or ray (same updates)",
                         choices=("sequential", "batched", "ray"))
    RAY_WORKERS: int = param(2, "BACKEND ray: workers (one per GPU on a GPU cluster; RAY_ADDRESS joins one)", ge=1)
    ENGINE: str = param("loop", "rollout engine: loop, or slots (continuous batching; for GPUs)",
                        choices=("loop", "slots"))
    NOISE: str = param("iid", "noise seeding (iid or paper_correlated)", choices=("iid", "paper_correlated"))
    ES_SEED: int = param(33, "noise seed of seed 0; seed i uses ES_SEED + i (paper: 33)", ge=0)
    BATCH_SEED: int = param(1088, "prompt-batch seed of seed 0; seed i uses BATCH_SEED + i", ge=0)
    READ_UPSTREAM: bool = param(True, "take sigma / alpha / learning rates from notebooks 02-04's summaries "
                                "when they exist (else this notebook's values)")

    TASK_KIND = "math"  # not a parameter: the notebook fixes its task family

    def check(self) -> None:
        if self.POPULATION % self.SUBSPACES or self.POPULATION // self.SUBSPACES < 2:
            raise ConfigError(f"POPULATION = {self.POPULATION} must be a multiple of SUBSPACES = "
                              f"{self.SUBSPACES} with at least 2 members per subspace (paper: 40 and 4)")


@dataclass(frozen=True)
class _GRPOParams(_ExperimentParams):
    """GRPO arms (defaults = notebook 04's cpu values)."""

    GRPO_STEPS: int = param(16, "full GRPO steps, searched for its best validation step s* (paper: s* is 16)",
                            ge=1)
    PROMPT_BATCH: int = param(16, "GRPO prompts per step (paper: 64)", ge=1)
    GROUP_SIZE: int = param(8, "GRPO trajectories per prompt (paper: 8)", ge=2)
    MINI_BATCH: int = param(8, "GRPO prompts per optimizer step (paper: 32)", ge=1)
    MICRO_BATCH: int = param(64, "GRPO trajectories per forward/backward (memory only)", ge=1)
    FULL_LR: float = param(1e-4, "full GRPO learning rate when notebook 04 has not chosen one (paper: 1e-6)",
                           gt=0.0)
    LORA_LR: float = param(1e-3, "LoRA-GRPO learning rate when notebook 04 has not chosen one (paper: 5e-6)",
                           gt=0.0)
    LORA_R: int = param(8, "LoRA rank (paper: 32)", ge=1)
    LORA_ALPHA: int = param(16, "LoRA alpha (paper: 64)", ge=1)
    KL_COEF: float = param(1e-3, "GRPO k3 KL coefficient (paper: 1e-3)", ge=0.0)
    GRPO_SEED: int = param(42, "GRPO seed (paper: 42)", ge=0)
    ES_LONG_STEPS: int = param(24, "steps standard ES is continued to, for its best checkpoint and the "
                               "step it reaches CoPES (paper: 112; 48 to match)", ge=1)
    LONG_SEEDS: int = param(1, "ES seeds continued to ES_LONG_STEPS (their mean curve is used)", ge=1)
    TEST_PROBLEMS: int = param(128, "test problems for the test decoding (0 means the whole test split)", ge=0)
    TEST_SAMPLES: int = param(8, "samples per test problem, n of pass@k (paper: 32)", ge=1)
    TEST_TEMPERATURE: float = param(0.3, "test decoding temperature (paper: 0.3)", gt=0.0)

    def check(self) -> None:
        super().check()
        if self.PROMPT_BATCH % self.MINI_BATCH:
            raise ConfigError(f"PROMPT_BATCH = {self.PROMPT_BATCH} is not divisible by MINI_BATCH = "
                              f"{self.MINI_BATCH}; choose a MINI_BATCH that divides it")
        if self.LONG_SEEDS > self.SEEDS:
            raise ConfigError(f"LONG_SEEDS = {self.LONG_SEEDS} must be <= SEEDS = {self.SEEDS}")
        if self.BUDGET_STEPS and self.ES_LONG_STEPS < self.BUDGET_STEPS:
            raise ConfigError(f"ES_LONG_STEPS = {self.ES_LONG_STEPS} must be >= BUDGET_STEPS = "
                              f"{self.BUDGET_STEPS}: the long run continues the budget run")
        if self.BUDGET_STEPS == 0 and self.ES_LONG_STEPS < self.GRPO_STEPS:
            raise ConfigError(f"ES_LONG_STEPS = {self.ES_LONG_STEPS} must be >= GRPO_STEPS = "
                              f"{self.GRPO_STEPS} when the budget is s* (BUDGET_STEPS = 0)")

    def grpo_config(self, use_lora: bool, lr: float, steps: int):
        from copes_lib.grpo import GRPOConfig

        return GRPOConfig(group_size=self.GROUP_SIZE, prompt_batch_size=self.PROMPT_BATCH,
                          mini_batch_size=self.MINI_BATCH, micro_batch_size=self.MICRO_BATCH, lr=lr,
                          kl_coef=self.KL_COEF, use_lora=use_lora, lora_r=self.LORA_R,
                          lora_alpha=self.LORA_ALPHA, total_steps=steps, val_every=self.VAL_EVERY,
                          seed=self.GRPO_SEED)


@dataclass(frozen=True)
class FixedBudgetParams(_GRPOParams):
    """Parameters of 05_fixed_budget_math (defaults = the cpu profile)."""

    COPES_SIGMA: float = param(5e-3, "CoPES's own sigma when notebook 03 has not tuned one", gt=0.0)
    COPES_ALPHA: float = param(2.5e-3, "CoPES's own alpha when notebook 03 has not tuned one", gt=0.0)
    HEADLINE: str = param("tuned", "protocol of the headline keys: tuned (each method at its own sigma / "
                          "alpha) or paper (CoPES at ES's sigma / alpha)", choices=("tuned", "paper"))


@dataclass(frozen=True)
class AblationParams(_ExperimentParams):
    """Parameters of 06_copes_ablations (defaults = the cpu profile)."""

    BUDGET_STEPS: int = param(8, "the step budget of every arm (paper: 16)", ge=1)
    SEEDS: int = param(3, "seeds per arm (paper: 1 run each)", ge=1)

    def check(self) -> None:
        super().check()
        if self.POPULATION % 8 or self.POPULATION // 8 < 2:
            raise ConfigError(f"POPULATION = {self.POPULATION}: the K = 8 arm needs a multiple of 8 with at "
                              "least 2 members per subspace (paper: 40, N_k = 5)")


@dataclass(frozen=True)
class MultihopQAParams(_GRPOParams):
    """Parameters of 07_multihop_qa (defaults = the cpu profile)."""

    SEEDS: int = param(1, "seeds of ES and CoPES (paper: 1 run each)", ge=1)
    BUDGET_STEPS: int = param(8, "the step budget (paper: 48); 0 means full GRPO's best step s*", ge=0)
    GRPO_STEPS: int = param(8, "full GRPO steps (paper: 48)", ge=1)
    ES_LONG_STEPS: int = param(16, "steps standard ES is continued to, to reach CoPES's F1 (paper: 64)", ge=1)
    TEST_PROBLEMS: int = param(256, "QA test problems (0 means the whole test split)", ge=0)
    TEST_SAMPLES: int = param(2, "samples per test problem (paper: 32)", ge=1)
    READ_UPSTREAM: bool = param(False, "take sigma / alpha / learning rates from notebooks 02-04 (tuned on "
                                "math, not QA)")
    COPES_SIGMA: float = param(1e-2, "CoPES sigma on QA (the paper's protocol: ES's sigma)", gt=0.0)
    COPES_ALPHA: float = param(5e-3, "CoPES alpha on QA (the paper's protocol: ES's alpha)", gt=0.0)

    TASK_KIND = "qa"


# =========================================================================== settings from upstream notebooks
def upstream_settings(params: _ExperimentParams) -> dict[str, Any]:
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
    out.update(full_lr=getattr(params, "FULL_LR", None), lora_lr=getattr(params, "LORA_LR", None),
               grpo_source="parameters")
    if s04 and s04.get("full_lr"):
        out.update(full_lr=s04["full_lr"], lora_lr=s04["lora_lr"], grpo_source="04_grpo")
    return out


def es_config(params: _ExperimentParams, *, subspaces: int, sigma: float, alpha: float, seed_index: int = 0,
              zscore: str = "joint"):
    from copes_lib.es import ESConfig

    return ESConfig(population=params.POPULATION, subspaces=subspaces, sigma=sigma, alpha=alpha,
                    chunk_size=params.CHUNK_SIZE, noise=params.NOISE, zscore=zscore, backend=params.BACKEND,
                    ray_workers=params.RAY_WORKERS, seed=params.ES_SEED + seed_index)


# =========================================================================== agents and runs
def seeded_agent(agent, batch_seed: int):
    """The same substrate and tasks with another prompt-batch seed (a new cache identity)."""
    from copes_lib.es import AgentSetup

    objective = copy.copy(agent.objective)
    objective.batch_seed = batch_seed
    return AgentSetup(agent.model, objective, {**agent.key, "batch_seed": batch_seed},
                      {**agent.worker_args, "batch_seed": batch_seed} if agent.worker_args else {})


@dataclass
class ESRun:
    label: str
    config: Any  # ESConfig
    history: list[dict[str, Any]]
    folder: Path
    seed_index: int = 0

    def weights(self, which: str = "final") -> dict:
        """The model's state dict at the last step (``final``) or the best validated step (``best``)."""
        if which not in ("final", "best"):
            raise ValueError(f"which = {which!r}; valid values: ['final', 'best']")
        return runs.load_checkpoint(self.folder / ("state.pt" if which == "final" else "best.pt"))["model"]


def _es_key_extra(agent) -> dict[str, Any]:
    # the same identity as es.run_arm, so a run of notebooks 02/03 with the same config is reused
    return {**agent.key, "val_ids": [t.id for t in agent.objective.val_tasks]}


def es_run_folder(profile: str, agent, config, steps: int, val_every: int) -> Path:
    """The cache folder ``es.cached_es_run`` uses for this run (tests check that the two agree)."""
    key = runs.cache_key({"es": config.to_dict(), "steps": steps, "val_every": val_every,
                          **_es_key_extra(agent)})
    return runs.cache_dir(profile, "es_runs", key)


def es_run(params: NotebookParams, agent, config, *, steps: int, val_every: int, label: str,
           continue_from: ESRun | None = None, force: bool | None = None) -> ESRun:
    """One cached ES/CoPES run on a copy of the warm start. With ``continue_from`` (a shorter run of the
    same config), the new run starts from its checkpoint: all randomness is a function of the step, so
    this equals an uninterrupted run and costs only the extra steps."""
    from copes_lib.es import cached_es_run, ray_worker_factory

    force = params.FORCE if force is None else force
    if continue_from is not None:
        if continue_from.config != config:
            raise ValueError("continue_from must be a run of the same ESConfig")
        folder = es_run_folder(params.PROFILE, agent, config, steps, val_every)
        if folder == continue_from.folder:  # same length: nothing to continue
            return dataclasses.replace(continue_from, label=label)
        if force:
            shutil.rmtree(folder)
            folder.mkdir(parents=True)
        if not (folder / "state.pt").exists():
            for name in ("state.pt", "best.pt"):
                if (continue_from.folder / name).exists():
                    shutil.copyfile(continue_from.folder / name, folder / name)
        force = False
    history, folder = cached_es_run(params.PROFILE, "es_runs", copy.deepcopy(agent.model), agent.objective,
                                    config, steps=steps, val_every=val_every, key_extra=_es_key_extra(agent),
                                    force=force, log_prefix=label,
                                    worker_factory=ray_worker_factory(config, agent))
    return ESRun(label, config, history, folder, config.seed - getattr(params, "ES_SEED", config.seed))


def seed_runs(params: _ExperimentParams, agent, *, subspaces: int, sigma: float, alpha: float, steps: int,
              label: str, zscore: str = "joint", seeds: int | None = None) -> list[ESRun]:
    """One arm over seeds 0..SEEDS-1: seed i = noise seed ES_SEED + i and batch seed BATCH_SEED + i, so
    arms of the same seed are paired (same prompt batches)."""
    out = []
    for i in range(params.SEEDS if seeds is None else seeds):
        config = es_config(params, subspaces=subspaces, sigma=sigma, alpha=alpha, seed_index=i, zscore=zscore)
        out.append(es_run(params, seeded_agent(agent, params.BATCH_SEED + i), config, steps=steps,
                          val_every=params.VAL_EVERY, label=f"{label} seed {i}"))
    return out


def continue_runs(params: _ExperimentParams, agent, budget_runs: Sequence[ESRun], steps: int) -> list[ESRun]:
    """The given budget runs continued to ``steps`` (only the extra steps are trained)."""
    return [es_run(params, seeded_agent(agent, params.BATCH_SEED + r.seed_index), r.config, steps=steps,
                   val_every=params.VAL_EVERY, label=r.label.replace("seed", "long, seed"), continue_from=r)
            for r in budget_runs]


def compare_at_budget(es_runs: Sequence[ESRun], copes_runs: Sequence[ESRun], budget: int, base: float,
                      grpo_best: float) -> dict[str, Any]:
    """Validation accuracy at the budget per seed, gain recovery, and the paired CoPES - ES difference."""
    es_vals = [val_at(r.history, budget) for r in es_runs]
    copes_vals = [val_at(r.history, budget) for r in copes_runs]
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


@dataclass
class GRPORun:
    label: str
    history: list[dict[str, Any]]
    val_by_step: dict[int, float]
    best_step: int | None
    best_val: float | None
    folder: Path
    result: Any  # grpo.GRPOResult (its .policy holds the final weights)

    def curve(self) -> tuple[list[int], list[float]]:
        steps = sorted(self.val_by_step)
        return steps, [self.val_by_step[s] for s in steps]


def grpo_run(params: _GRPOParams, agent, *, use_lora: bool, lr: float, steps: int, label: str) -> GRPORun:
    """One cached GRPO run (full or LoRA) on a copy of the warm start, validated on the ES val set."""
    from copes_lib import grpo

    config = params.grpo_config(use_lora, lr, steps)
    objective = agent.objective
    key = runs.cache_key({"grpo": config.to_dict(), "rollout": objective.rollout_config.to_dict(),
                          "substrate_checksum": agent.key["substrate_checksum"], "kind": agent.key["kind"]},
                         [t.id for t in objective.val_tasks])
    folder = runs.cache_dir(params.PROFILE, "grpo_runs", key)
    if params.FORCE:
        for name in ("last.pt", "best.pt"):
            (folder / name).unlink(missing_ok=True)

    def on_step(step: int, row: dict[str, Any]) -> None:
        if "eval/val_accuracy" in row:
            runs.summary_line(label, step, {k: row[k] for k in ("reward/mean", "eval/val_accuracy") if k in row})

    result = grpo.train_grpo(copy.deepcopy(agent.model), objective.tokenizer, objective.env,
                             objective.train_tasks, objective.val_tasks, config, folder,
                             rollout_config=objective.rollout_config, on_step=on_step)
    return GRPORun(label, result.history, dict(result.val_by_step), result.best_step, result.best_val, folder,
                   result)


def grpo_policy(run: GRPORun, which: str = "final"):
    """A plain model with the run's final or best weights (LoRA adapters merged)."""
    from copes_lib import grpo

    policy = copy.deepcopy(run.result.policy)
    if which == "best":
        grpo.load_trainable_state(policy, runs.load_checkpoint(run.result.best_path)["trainable"])
    elif which != "final":
        raise ValueError(f"which = {which!r}; valid values: ['final', 'best']")
    if hasattr(policy, "merge_and_unload"):
        policy = policy.merge_and_unload()
    policy.eval()
    return policy


def es_model(agent, run: ESRun, which: str = "final"):
    model = copy.deepcopy(agent.model)
    model.load_state_dict(run.weights(which))
    model.eval()
    return model


# =========================================================================== histories -> numbers
def val_points(history: Sequence[dict[str, Any]]) -> tuple[list[int], list[float]]:
    rows = [r for r in history if "eval/val_accuracy" in r]
    return [int(r["step"]) for r in rows], [float(r["eval/val_accuracy"]) for r in rows]


def val_at(history: Sequence[dict[str, Any]], step: int) -> float | None:
    for s, v in zip(*val_points(history)):
        if s == step:
            return v
    return None


def best_validated(history: Sequence[dict[str, Any]], trained_only: bool = True) -> tuple[int, float]:
    """(step, accuracy) of the best validation (earliest on ties); step 0 excluded when ``trained_only``."""
    points = [(s, v) for s, v in zip(*val_points(history)) if s > 0 or not trained_only]
    if not points:
        raise ValueError("history has no validated training step")
    return max(points, key=lambda sv: (sv[1], -sv[0]))


def mean_curve(histories: Sequence[Sequence[dict[str, Any]]]) -> tuple[list[int], list[float]]:
    """Mean validation accuracy over runs at the steps every run validated."""
    curves = [dict(zip(*val_points(h))) for h in histories]
    common = sorted(set.intersection(*(set(c) for c in curves)))
    return common, [float(np.mean([c[s] for c in curves])) for s in common]


def steps_to_match(steps: Sequence[int], values: Sequence[float], target: float) -> int | None:
    """The first validated training step (> 0) whose accuracy is >= target; None if never."""
    pairs = [(s, v) for s, v in zip(steps, values) if s > 0]
    return stats.first_step_reaching([s for s, _ in pairs], [v for _, v in pairs], target)


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


def protocol_reading(compare: dict[str, dict[str, Any]], headline: str) -> list[str]:
    """Sentences on the two protocols of notebook 05: CoPES - ES under each, which one gave CoPES the
    larger edge, and whether the expectation behind the default headline (FINDINGS.md: CoPES at ES's
    sigma / alpha is handicapped) held in this run."""
    lines = []
    for proto in ("paper", "tuned"):
        d = compare[proto]["copes_minus_es"]
        p = "undefined" if d["p"] is None else f"{d['p']:.3g}"
        lines.append(f"{proto} protocol: CoPES - ES = {100 * d['mean']:+.2f} points at the budget "
                     f"(paired over seeds, p = {p}: {'significant' if d['significant'] else 'not significant'}).")
    edge = {proto: compare[proto]["copes_minus_es"]["mean"] for proto in ("paper", "tuned")}
    if edge["paper"] > edge["tuned"]:
        lines.append("CoPES's edge is larger under the paper's protocol: the expectation that sharing ES's "
                     "sigma / alpha handicaps CoPES did NOT hold in this run.")
    elif edge["paper"] < edge["tuned"]:
        lines.append("CoPES's edge is larger under its own tuned sigma / alpha, as expected.")
    else:
        lines.append("CoPES's edge is the same under both protocols.")
    lines.append(f"The headline keys use the {headline} protocol.")
    return lines


def mean_step_seconds(history: Sequence[dict[str, Any]]) -> float | None:
    times = [r["time/step_s"] for r in history if "time/step_s" in r]
    return float(np.mean(times)) if times else None


def mean_update_norm(history: Sequence[dict[str, Any]]) -> float:
    norms = [r["es/update_norm"] for r in history if "es/update_norm" in r]
    return float(np.mean(norms)) if norms else 0.0


# =========================================================================== test decoding and pass@k
def sample_test(params: NotebookParams, agent, model, tasks: Sequence[Any], *, samples: int,
                temperature: float, label: str, seed: int = 0) -> dict[str, Any]:
    """``samples`` trajectories per task at ``temperature`` (top-p 1), cached by the weights' checksum.

    Returns per-task scores (``scores[j]``: the samples' scores of task j; correctness for math, F1 for
    QA), the mean Acc / EM / F1 (QA) or accuracy (math), and ``correct_counts`` for pass@k.
    """
    from copes_lib.es import checksum
    from copes_lib.rollout import evaluate

    objective = agent.objective
    config = dataclasses.replace(objective.rollout_config, temperature=temperature, top_p=1.0)
    key = runs.cache_key({"weights": checksum(model), "samples": samples, "temperature": temperature,
                          "rollout": config.to_dict(), "kind": agent.key["kind"], "seed": seed},
                         [t.id for t in tasks])
    path = runs.cache_dir(params.PROFILE, "test_samples", key) / "result.json"

    def compute() -> dict[str, Any]:
        repeated = [t for t in tasks for _ in range(samples)]  # task-major: task j's samples are adjacent
        result = evaluate(model, objective.tokenizer, repeated, objective.env, config, seed=seed,
                          return_batches=True)
        details = [d for b in result["batches"] for d in b.details]
        scores = [float(s) for b in result["batches"] for s in b.scores]
        out = {"label": label, "samples": samples, "temperature": temperature, "problems": len(tasks),
               "scores": [scores[j * samples:(j + 1) * samples] for j in range(len(tasks))]}
        if agent.key["kind"] == "math":
            out["accuracy"] = float(np.mean(scores))
        else:
            for name in ("acc", "em", "f1"):
                out[name] = float(np.mean([d[name] for d in details]))
        return out

    result = runs.cached(path, compute, force=params.FORCE)
    result["correct_counts"] = [int(sum(s >= 1.0 for s in row)) for row in result["scores"]]
    per_problem = [float(np.mean(row)) for row in result["scores"]]
    result["score_se"] = (float(np.std(per_problem, ddof=1) / math.sqrt(len(per_problem)))
                          if len(per_problem) > 1 else None)
    runs.summary_line(f"test {label}", 0, {k: result[k] for k in ("accuracy", "acc", "em", "f1") if k in result})
    return result


def pass_at_k_frame(results: dict[str, dict[str, Any]]):
    """Long table (method, k, pass_at_k) for k = 1..n of each method's test samples."""
    import pandas as pd

    rows = []
    for method, result in results.items():
        curve = stats.pass_at_k_curve(result["correct_counts"], result["samples"])
        rows += [{"method": method, "k": k, "pass_at_k": float(v)} for k, v in enumerate(curve, start=1)]
    return pd.DataFrame(rows)


# =========================================================================== tables beside the paper
def table1_frame(ours: dict[str, dict[str, Any]]):
    """Table 1 in the paper's layout: our test pass@1, steps, est. device-hours and validation accuracy
    beside the paper's (MATH-500 pass@1 shown as the paper's closest benchmark; all % )."""
    import pandas as pd

    rows = []
    for key, label in (("base", "base (warm start)"), ("full_grpo_best", "full GRPO (best ckpt)"),
                       ("es_best", "standard ES (best ckpt)"), ("lora_grpo_at_budget", "LoRA-GRPO @budget"),
                       ("es_at_budget", "standard ES @budget"), ("copes_at_budget", "CoPES @budget")):
        theirs = paper.TABLE1[key.replace("_at_budget", "_at_16")]
        mine = ours.get(key, {})
        rows.append({
            "method": label,
            "paper MATH-500 pass@1": theirs["pass1"][3],
            "ours test pass@1": _pct(mine.get("test_pass1")),
            "paper steps": theirs["steps"], "ours steps": mine.get("steps"),
            "paper est. GPU-h": theirs["gpu_hours"], "ours est. device-h": mine.get("device_hours"),
            "paper val acc": theirs["val_acc"], "ours val acc": _pct(mine.get("val_acc")),
            "ours val acc 95% CI": mine.get("val_ci", ""),
        })
    return pd.DataFrame(rows)


def table3_frame(val: dict[str, dict[str, Any]], update_norms: dict[str, float]):
    """Table 3 beside ours: the paper's MATH-500 pass@1 (%) and our validation accuracy at the budget."""
    import pandas as pd

    names = {"k1": "K=1 (standard ES)", "k2": "K=2", "k4": "K=4 (default)", "k8": "K=8",
             "indep_z": "independent z-score, K=4", "es_2sigma": "ES with 2 sigma",
             "es_sqrtk_alpha": "ES with sqrt(K) x alpha (our control)",
             "copes_matched_step": "CoPES K=4 with alpha / sqrt(K) (our control)"}
    theirs = {"k1": "k1", "k2": "k2", "k4": "k4", "k8": "k8", "indep_z": "indep_z_k4", "es_2sigma": "es_2sigma"}
    rows = []
    for key in ABLATION_KEYS:
        s = val.get(key, {})
        rows.append({"variant": names[key],
                     "paper MATH-500 pass@1": paper.TABLE3[theirs[key]][3] if key in theirs else None,
                     "ours val acc": _pct(s.get("mean")),
                     "ours 95% CI": _ci_text(s), "seeds": s.get("n"),
                     "mean update norm": update_norms.get(key)})
    return pd.DataFrame(rows)


def table4_frame(ours: dict[str, dict[str, float]]):
    """Table 4 (Acc / EM / F1, %) of the paper's three benchmarks beside our generated QA test split."""
    import pandas as pd

    rows = []
    for method, label in (("base", "base"), ("full_grpo", "full GRPO"), ("es", "standard ES"), ("copes", "CoPES")):
        row = {"method": label}
        for bench, cells in paper.TABLE4.items():
            row[f"paper {bench} Acc/EM/F1"] = "/".join(f"{v:.2f}" for v in cells[method])
        mine = ours.get(method)
        row["ours Acc/EM/F1"] = ("/".join(f"{100 * mine[k]:.2f}" for k in ("acc", "em", "f1")) if mine else "")
        rows.append(row)
    return pd.DataFrame(rows)


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def _ci_text(s: dict[str, Any]) -> str:
    if not s or s.get("low") is None:
        return ""
    return f"[{100 * s['low']:.1f}, {100 * s['high']:.1f}]"


def ci_text(s: dict[str, Any]) -> str:
    """An interval of accuracies as ``[low, high]`` in %, empty when there is only one seed."""
    return _ci_text(s)


# =========================================================================== the ablation arms
def ablation_configs(params: AblationParams, sigma: float, alpha: float, seed_index: int) -> dict[str, Any]:
    """The eight arms of Table 3 plus our two step-size controls, at fixed N and shared sigma / alpha."""
    k = params.SUBSPACES
    cfg = lambda **kw: es_config(params, seed_index=seed_index, **kw)  # noqa: E731
    return {
        "k1": cfg(subspaces=1, sigma=sigma, alpha=alpha),
        "k2": cfg(subspaces=2, sigma=sigma, alpha=alpha),
        "k4": cfg(subspaces=4, sigma=sigma, alpha=alpha),
        "k8": cfg(subspaces=8, sigma=sigma, alpha=alpha),
        "indep_z": cfg(subspaces=k, sigma=sigma, alpha=alpha, zscore="independent"),
        # the paper's control: sigma doubled, step unchanged (the update does not scale with sigma)
        "es_2sigma": cfg(subspaces=1, sigma=2 * sigma, alpha=alpha),
        # our controls: ES at CoPES's update norm, and CoPES at ES's
        "es_sqrtk_alpha": cfg(subspaces=1, sigma=sigma, alpha=math.sqrt(k) * alpha),
        "copes_matched_step": cfg(subspaces=k, sigma=sigma, alpha=alpha / math.sqrt(k)),
    }


def ablation_reading(per_seed: dict[str, Sequence[float]], norms: dict[str, float]) -> list[str]:
    """Plain sentences comparing each of the paper's Table-3 orderings (and our controls) with ours:
    the direction, and whether the paired interval over seeds excludes 0."""
    def compare(a: str, b: str, what: str, paper_says: str) -> str:
        n = min(len(per_seed[a]), len(per_seed[b]))
        d = paired_comparison(per_seed[a][:n], per_seed[b][:n])
        direction = "higher than" if d["mean"] > 0 else "lower than" if d["mean"] < 0 else "equal to"
        if d["low"] is None:
            sure = "one seed, no interval"
        elif d["p"] is None:  # every seed gave the same difference: no spread, the t-test is undefined
            sure = f"the same {100 * d['mean']:+.2f} points in each of {n} seeds: no spread, no test"
        elif d["low"] > 0 or d["high"] < 0:
            sure = f"paired 95% interval [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] points excludes 0"
        else:
            sure = f"paired 95% interval [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] points includes 0: not resolved"
        return (f"{what}: {a} is {direction} {b} by {100 * d['mean']:+.1f} points ({sure}); "
                f"the paper: {paper_says}.")

    lines = [compare("k4", "k1", "CoPES K=4 vs standard ES", "K=4 higher (MATH-500 88.3 vs 78.9)"),
             compare("k4", "k2", "K=4 vs K=2", "K=4 higher (88.3 vs 86.0)"),
             compare("k4", "k8", "K=4 vs K=8 (N_k small)", "K=4 far higher (88.3 vs 58.1)"),
             compare("k4", "indep_z", "joint vs independent z-score", "joint higher (88.3 vs 87.7)"),
             compare("k4", "es_2sigma", "CoPES vs ES with 2 sigma", "CoPES far higher (88.3 vs 65.3)"),
             compare("k4", "es_sqrtk_alpha", "CoPES vs ES at CoPES's step size (our control)", "not tested"),
             compare("k4", "copes_matched_step", "CoPES vs CoPES at ES's step size (our control)", "not tested")]
    if norms.get("k1"):
        lines.append("Mean update norm relative to standard ES: " + ", ".join(
            f"{k} {norms[k] / norms['k1']:.2f}x" for k in ABLATION_KEYS if k in norms) + ".")
    return lines


__all__ = ["ablation_reading", "protocol_reading", "FixedBudgetParams", "AblationParams", "MultihopQAParams", "ESRun", "GRPORun", "upstream_settings",
           "es_config", "seeded_agent", "es_run", "seed_runs", "continue_runs",
           "compare_at_budget", "es_run_folder", "grpo_run", "grpo_policy", "es_model",
           "val_points", "val_at", "best_validated", "mean_curve", "steps_to_match", "gain_recovery_or_none",
           "seed_stats", "paired_comparison", "mean_step_seconds", "mean_update_norm", "sample_test",
           "pass_at_k_frame", "table1_frame", "table3_frame", "table4_frame", "ablation_configs", "ci_text",
           "ABLATION_KEYS"]
