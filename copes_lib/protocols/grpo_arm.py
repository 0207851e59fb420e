"""The GRPO arm every paper-A notebook shares: one cached GRPO run (full or LoRA) on a copy of the
warm-started substrate, validated on the ES validation set, and the policy it ends with."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copes_lib import grpo, runs


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


def grpo_run(params: Any, agent, *, use_lora: bool, lr: float, steps: int, label: str) -> GRPORun:
    """One cached GRPO run (full or LoRA) on a copy of the warm start, validated on the ES val set."""
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
    policy = copy.deepcopy(run.result.policy)
    if which == "best":
        grpo.load_trainable_state(policy, runs.load_checkpoint(run.result.best_path)["trainable"])
    elif which != "final":
        raise ValueError(f"which = {which!r}; valid values: ['final', 'best']")
    if hasattr(policy, "merge_and_unload"):
        policy = policy.merge_and_unload()
    policy.eval()
    return policy
