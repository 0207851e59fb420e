"""The GRPO arm notebooks 04, 05 and 07 share: ONE GRPO configuration (notebook 04's parameters
under the profile: group, batches, learning-rate fallbacks, LoRA shape, KL, sampling temperature and
the dtype policy) and one cached run per (configuration, substrate, validation set).

A run is ``grpo.train_grpo`` on an fp32 copy of the warm-started model (VeRL keeps fp32 master
weights; ``amp_dtype`` runs the update under autocast), cached under
``cache/<profile>/grpo_runs-<full|lora>-<key>/``: 05 reuses the full run 04 trained when their
validation sets agree (the cpu and gpu profiles), instead of training it again under another name.

Notebook 04's reference is GRPO_SEEDS full and LORA_SEEDS LoRA runs (``seed_runs``, seed i = GRPO_SEED + i),
each trained until PATIENCE validations without a new best show its peak, under a hard cap STEPS a run
that reaches it is reported censored (``cap_censored``); its learning rates come from a sweep on the
tuning split (``lr_sweep``). The rules: docs/reference.md#r1-the-grpo-reference-is-trained-past-its-peak.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from copes_lib import grpo, runs
from copes_lib.config import build, profile_params
from copes_lib.grpo import GRPOConfig
from copes_lib.grpo_sharded import ShardingConfig
from copes_lib.protocols.paper_a.sweeps import GridSweep, widen_to_bracket
from copes_lib.protocols.params import GRPONotebookParams
from copes_lib.training_run import BEST, LAST, SCORE, read_checkpoint


@dataclass
class GRPORun:
    label: str
    history: list[dict[str, Any]]
    val_by_step: dict[int, float]
    best_step: int | None
    best_val: float | None
    folder: Path
    result: Any  # grpo.GRPOResult (its .policy holds the final weights)
    seed: int | None = None  # GRPOConfig.seed of the run

    def curve(self) -> tuple[list[int], list[float]]:
        """(validated steps, their ``eval/val_score``), as ``ESRun.curve``."""
        steps = sorted(self.val_by_step)
        return steps, [self.val_by_step[s] for s in steps]


def grpo_params(profile: str) -> GRPONotebookParams:
    """Notebook 04's parameters under ``profile``: the suite's one GRPO configuration."""
    return build(GRPONotebookParams, {**profile_params(profile, GRPONotebookParams), "PROFILE": profile})


def grpo_config(profile: str, use_lora: bool, lr: float | None = None, steps: int | None = None,
                patience: int | None = None, seed_index: int = 0) -> GRPOConfig:
    """The GRPOConfig every notebook of ``profile`` trains with (``lr`` None: 04's FULL_LR / LORA_LR;
    ``patience`` None: 04's PATIENCE, so a reference run stops at its peak; 0 for a run that must reach
    ``steps``, e.g. LoRA-GRPO at a fixed budget; ``seed_index`` i: GRPO_SEED + i, 04's reference seeds)."""
    return grpo_params(profile).grpo_config(use_lora, lr=lr, steps=steps, patience=patience, seed_index=seed_index)


def run_folder(profile: str, agent: Any, config: GRPOConfig, sharding: ShardingConfig | None = None) -> Path:
    """The cache folder of a GRPO run: its configuration, the substrate's weights, the rollout settings
    and the validation problems identify it, not the notebook that asked for it. A sharded update
    equals the in-process one only to float tolerance (tests/test_grpo_sharded.py), so it is its own run.
    ``metric``: the name its history validates under, so a folder written before histories carried
    ``eval/val_score`` (they had ``eval/val_accuracy`` only, F1 on QA) is not reused. The rollout engine
    is not in the key: GRPO always rolls out with ``copes_lib.rollout.rollout``, whatever ENGINE says."""
    objective = agent.objective
    identity = {"grpo": config.to_dict(), "rollout": objective.rollout_config.to_dict(),
                "substrate_checksum": agent.key["substrate_checksum"], "kind": agent.key["kind"], "metric": SCORE}
    if sharding is not None:
        identity["sharding"] = sharding.to_dict()
    key = runs.cache_key(identity, [t.id for t in objective.val_tasks])
    return runs.cache_dir(profile, f"grpo_runs-{'lora' if config.use_lora else 'full'}", key)


def grpo_run(profile: str, agent: Any, config: GRPOConfig, *, label: str, force: bool = False,
             stop_after: int | None = None, forced: set[Path] | None = None) -> GRPORun:
    """One cached GRPO run (full or LoRA) on an fp32 copy of the warm start, validated on the agent's
    validation problems; an interrupted run resumes, ``stop_after`` pauses it early (a learning-rate
    sweep). ``force`` starts over, once per folder recorded in ``forced``.

    With notebook 04's ``SHARD_PROCESSES`` >= 1 every update is a torchrun job of that many processes
    (FSDP2, ``copes_lib.grpo_sharded.ShardedUpdater``) started from the weights of the previous step;
    the notebook stays the driver and rolls out with the updated weights. Such a run does not resume
    after an interruption (the AdamW state lives in the last job's folder): it starts over."""
    sharding = grpo_params(profile).sharding()
    folder = run_folder(profile, agent, config, sharding)
    forced = set() if forced is None else forced
    if force and folder not in forced:
        for name in (LAST, BEST):
            (folder / name).unlink(missing_ok=True)
        forced.add(folder)

    def on_step(step: int, row: dict[str, Any]) -> None:
        if step == 0 or SCORE in row:
            shown = {k: row[k] for k in ("reward/mean", SCORE, "grpo/kl", "grpo/clip_frac",
                                         "grpo/entropy", "time/step_s") if k in row}
            runs.summary_line(label, step, shown)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # fp32 weights: a pure-bf16 model would round lr 1e-6 updates away (amp_dtype = bf16 autocast)
    model = copy.deepcopy(agent.model).to(device=device, dtype=torch.float32)
    objective = agent.objective
    update_fn = None
    if sharding is not None:
        from copes_lib.grpo_sharded import ShardedUpdater

        base_dir = folder / "base_model"
        if not (base_dir / "config.json").exists():
            model.save_pretrained(base_dir)
        jobs = folder / "sharded_jobs"
        if jobs.exists():  # an interrupted sharded run starts over (see above)
            shutil.rmtree(jobs)
        update_fn = ShardedUpdater(base_dir, config, sharding, jobs)
    result = grpo.train_grpo(model, objective.tokenizer, objective.env, objective.train_tasks,
                             objective.val_tasks, config, folder, rollout_config=objective.rollout_config,
                             on_step=on_step, stop_after=stop_after, resume=update_fn is None,
                             update_fn=update_fn)
    return GRPORun(label, result.history, dict(result.val_by_step), result.best_step, result.best_val, folder,
                   result, config.seed)


def peak_report(run: GRPORun | grpo.GRPOResult) -> dict[str, Any]:
    """Where a run (or a ``grpo.GRPOResult``) peaked, where it stopped, and whether the peak is censored:
    ``peak_censored`` (best = last trained step of a run that did not stop on its own) and the stricter
    ``cap_censored`` (the run reached its cap without the stopping rule seeing the curve peak, wherever
    its best step lies: the reference's s* and gain are then lower bounds)."""
    result = getattr(run, "result", run)
    return {"peak_step": result.best_step, "last_step": result.last_step,
            "stopped_early": bool(result.stopped_early), "peak_censored": bool(result.peak_censored),
            "cap_censored": bool(cap_censored(result))}


def cap_censored(result: Any) -> bool:
    """A run whose validation curve was never seen to peak: it ended without the PATIENCE rule firing
    (it reached the hard cap, or ran with patience 0)."""
    return not result.stopped_early


def seed_runs(profile: str, agent: Any, use_lora: bool, lr: float, *, label: str, force: bool = False,
              forced: set[Path] | None = None) -> list[GRPORun]:
    """Notebook 04's reference runs of one arm: GRPO_SEEDS (full) or LORA_SEEDS (LoRA) seeds, seed i
    with GRPO_SEED + i, each trained until PATIENCE sees its peak or the STEPS cap. Seed 0 is the cache
    entry notebooks 05 / 07 reuse (their config is seed index 0)."""
    p = grpo_params(profile)
    return [grpo_run(profile, agent, p.grpo_config(use_lora, lr=lr, seed_index=i),
                     label=f"{label} seed {seed}", force=force, forced=forced)
            for i, seed in enumerate(p.seeds(use_lora))]


def seed_report(seed_runs: list[GRPORun], prefix: str) -> dict[str, Any]:
    """Per-seed arrays and their spread for 04's summary (``<prefix>_..._seeds``, ``_mean``, ``_sd``): best
    validation score, best step, last step, whether the stopping rule fired, whether the cap censored it."""
    results = [r.result for r in seed_runs]
    best = np.array([r.best_val for r in results], dtype=float)
    steps = np.array([r.best_step for r in results], dtype=float)
    gain = best - np.array([r.base_val for r in results], dtype=float)

    def sd(values: np.ndarray) -> float | None:  # the sample SD over seeds; None for one seed
        return float(values.std(ddof=1)) if len(values) > 1 else None

    return {f"{prefix}_seeds": [r.seed for r in seed_runs],
            f"{prefix}_best_val_accuracy_seeds": best.tolist(), f"{prefix}_best_val_accuracy_mean": float(best.mean()),
            f"{prefix}_best_val_accuracy_sd": sd(best),
            f"{prefix}_gain_over_base_seeds": gain.tolist(), f"{prefix}_gain_over_base_mean": float(gain.mean()),
            f"{prefix}_gain_over_base_sd": sd(gain),
            f"{prefix}_best_step_seeds": [int(s) for s in steps], f"{prefix}_best_step_median": float(np.median(steps)),
            f"{prefix}_best_step_min": int(steps.min()), f"{prefix}_best_step_max": int(steps.max()),
            f"{prefix}_best_step_sd": sd(steps),
            f"{prefix}_last_step_seeds": [int(r.last_step) for r in results],
            f"{prefix}_stopped_early_seeds": [bool(r.stopped_early) for r in results],
            f"{prefix}_cap_censored_seeds": [cap_censored(r) for r in results],
            f"{prefix}_any_cap_censored": any(cap_censored(r) for r in results)}


def arm_summary(runs_by_arm: dict[str, list[GRPORun]], lrs: dict[str, float], timing: Any,
                trainable: dict[str, int]) -> dict[str, Any]:
    """04's per-arm summary keys (arm ``full`` keys its own without a prefix, as 05 and 07 read them): seed 0's
    best, final and step-16 validation accuracy, gain, device hours per step, rollout share and peak memory
    (``timing``: a frame indexed by arm with rollout_s, step_s, peak_mem_gib), the rate, the trainable
    parameters, where each peaked, and every seed's spread (:func:`seed_report`)."""
    summary: dict[str, Any] = {}
    for arm, seed_list in runs_by_arm.items():
        r, row, lead = seed_list[0].result, timing.loc[arm], "" if arm == "full" else f"{arm}_"
        summary.update({
            f"{arm}_best_val_accuracy": r.best_val, f"{arm}_best_step": r.best_step,
            f"{arm}_val_accuracy_at_16": r.val_by_step.get(16),
            f"{arm}_final_val_accuracy": r.val_by_step.get(max(r.val_by_step)),
            f"{arm}_gain_over_base": r.best_val - r.base_val, f"{arm}_beats_base": bool(r.best_val > r.base_val),
            f"{lead}device_hours_per_step": grpo.device_hours_per_step(r.history),
            f"{arm}_rollout_share": float(row["rollout_s"] / row["step_s"]),
            f"{arm}_peak_mem_gib": float(row["peak_mem_gib"]),
            f"{arm}_lr": lrs[arm], f"{arm}_trainable_params": trainable[arm],
            **{f"{arm}_{k}": v for k, v in peak_report(r).items()},
            **seed_report(seed_list, arm)})
    return summary


def _lr_key(row: dict[str, Any]) -> tuple:
    """The sweep rule's first two criteria: the highest score after the sweep steps, then the higher mean
    training reward; rates still tied go to the registered default (``protocols.paper_a.sweeps.break_tie``)."""
    return (row["val_at_sweep_end"], row["mean_train_reward"])


def lr_sweep(profile: str, agent: Any, use_lora: bool, candidates: list[float], *, force: bool = False,
             forced: set[Path] | None = None, default: float | None = None) -> GridSweep:
    """Notebook 04's learning-rate sweep of one arm: SWEEP_STEPS-step runs scored on the first
    SWEEP_VAL_PROBLEMS problems of the tuning split (never validation), the grid widened while its best
    rate is at an edge (``protocols.paper_a.sweeps``, at most SWEEP_MAX_EXTEND added rates), as 02 / 03's sigma
    sweeps. Ties go to ``default`` (None: the arm's FULL_LR / LORA_LR, the registered default); every rate
    tied: ``uninformative``, the default is kept. The sweep runs are their own cache entries (another
    validation set), not the reference runs."""
    from copes_lib.protocols.paper_a.es_arm import tuning_agent

    p = grpo_params(profile)
    tuning = tuning_agent(agent, p.SWEEP_VAL_PROBLEMS)
    name = "SWEEP_LRS_LORA" if use_lora else "SWEEP_LRS_FULL"

    def evaluate(lr: float) -> dict[str, Any]:
        config = p.grpo_config(use_lora, lr=lr, steps=p.SWEEP_STEPS, patience=0)
        run = grpo_run(profile, tuning, config, label=f"sweep {'lora' if use_lora else 'full'} lr={lr:g}",
                       force=force, forced=forced)
        trained = [row for row in run.history[1:] if row["step"] <= p.SWEEP_STEPS]
        return {"arm": "lora" if use_lora else "full", "lr": lr, "base_val": run.result.base_val,
                "val_at_sweep_end": run.val_by_step[p.SWEEP_STEPS],
                "mean_train_reward": float(np.mean([r["reward/mean"] for r in trained])),
                "kl_at_sweep_end": trained[-1]["grpo/kl"]}

    if default is None:
        default = p.LORA_LR if use_lora else p.FULL_LR
    return widen_to_bracket(evaluate, candidates, key=_lr_key, max_extend=p.SWEEP_MAX_EXTEND, name=name,
                            default=default)


def grpo_policy(run: GRPORun, which: str = "final"):
    """A plain model with the run's final or best weights (LoRA adapters merged)."""
    policy = copy.deepcopy(run.result.policy)
    if which == "best":
        grpo.load_trainable_state(policy, read_checkpoint(run.result.best_path, "trainable"))
    elif which != "final":
        raise ValueError(f"which = {which!r}; valid values: ['final', 'best']")
    if hasattr(policy, "merge_and_unload"):
        policy = policy.merge_and_unload()
    policy.eval()
    return policy
