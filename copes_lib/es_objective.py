"""What an ES member is scored on: the agent objective of paper A (mean reward over the step's
shared prompt batch, docs/paper_a_copes.md#a1-standard-es) and a toy quadratic for tests and benchmarks.

Both follow ``es.Objective``. A member's rollouts are greedy, as the paper's ES decodes
(docs/paper_a_copes.md#a3-hyperparameters); the batch of step s depends on (batch seed, s) only
(``sampling.prompt_batch``, GRPO's sampler too), so every ES-family method and every sigma given the
same batch seed sees the same batches (paired comparisons).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from copes_lib.config import ConfigError
from copes_lib.es import PER_PROBLEM
from copes_lib.sampling import prompt_batch


class QuadraticObjective:
    """Synthetic fitness -mean((theta - target)^2) for tests and benchmarks (sequential/ray only)."""

    def __init__(self, target: list[torch.Tensor]):
        self.target = target

    def fitness(self, model: nn.Module, step: int) -> float:
        sq = sum(float((p.detach() - t).pow(2).sum()) for p, t in zip(model.parameters(), self.target))
        return -sq / sum(t.numel() for t in self.target)

    def validate(self, model: nn.Module) -> dict[str, float]:
        return {"score": self.fitness(model, 0)}  # not an accuracy: no eval/val_accuracy


class _ToyModel(nn.Module):
    def __init__(self, shapes: Sequence[tuple[int, ...]]):
        super().__init__()
        self.tensors = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])


def toy_quadratic(seed: int = 0, shapes: Sequence[tuple[int, ...]] = ((16, 16), (16, 16), (16,))):
    """(model at 0, QuadraticObjective with a seeded N(0, 1) target): picklable for Ray workers."""
    gen = torch.Generator().manual_seed(seed)
    model = _ToyModel(shapes)
    return model, QuadraticObjective([torch.randn(s, generator=gen) for s in shapes])


class AgentObjective:
    """fitness = mean paper reward over the step's shared prompt batch, greedy (docs/paper_a_copes.md#a1-standard-es, docs/paper_a_copes.md#a4-task-agent-reward-and-data).

    The batch of step s is drawn from ``train_tasks`` by ``batch_seed`` and s only, so every method
    and every sigma sees the same batches (paired comparisons). Validation is greedy on ``val_tasks``.
    """

    def __init__(self, tokenizer, env, train_tasks, val_tasks, rollout_config, batch_size: int,
                 batch_seed: int):
        if batch_size > len(train_tasks):
            raise ConfigError(f"batch_size = {batch_size} exceeds the {len(train_tasks)} training tasks")
        self.tokenizer, self.env, self.rollout_config = tokenizer, env, rollout_config
        self.train_tasks, self.val_tasks = list(train_tasks), list(val_tasks)
        self.batch_size, self.batch_seed = batch_size, batch_seed
        self.tokens = 0  # tokens through the model in training rollouts (prompt + completion; benchmarks)
        self.engine, self.engine_options = "loop", {}  # copes_lib.engines: who generates the rollouts

    def _generate(self, model: nn.Module, tasks: list, step: int, row_hook=None):
        from copes_lib.engines import make_engine

        engine = make_engine(self.engine, model, self.tokenizer, **self.engine_options)
        with torch.no_grad():
            return engine.generate(tasks, self.env, self.rollout_config, seed=step, row_hook=row_hook)

    def _count(self, out) -> None:
        self.tokens += sum(len(p) + len(c) for p, c in zip(out.prompt_ids, out.completion_ids))

    def with_val(self, n: int) -> AgentObjective:
        """A copy that validates on the first ``n`` validation tasks only (sweeps)."""
        other = copy.copy(self)
        other.val_tasks = self.val_tasks[:n]
        return other

    def batch(self, step: int) -> list:
        return prompt_batch(self.train_tasks, step, self.batch_size, self.batch_seed)

    def rows_per_member(self, step: int) -> int:
        return self.batch_size

    def fitness(self, model: nn.Module, step: int) -> float:
        out = self._generate(model, self.batch(step), step)
        self._count(out)
        return float(np.mean(out.rewards))

    def population_fitness(self, model: nn.Module, step: int, n_members: int,
                           row_hook: Callable[[list[int]], None]) -> list[float]:
        tasks = self.batch(step) * n_members  # member-major: rows [m * B, (m + 1) * B) are member m
        out = self._generate(model, tasks, step, row_hook)
        self._count(out)
        return np.asarray(out.rewards, dtype=np.float64).reshape(n_members, self.batch_size).mean(1).tolist()

    def validate(self, model: nn.Module) -> dict[str, Any]:
        """Greedy validation: the mean metrics (floats) and ``per_problem``, each validation task's score in
        ``val_tasks`` order (the same rollouts; ``es_training`` records it beside the run, for intervals over
        latent units along the validation curve)."""
        from copes_lib.rollout import evaluate

        with torch.no_grad():
            result = evaluate(model, self.tokenizer, self.val_tasks, self.env, self.rollout_config, seed=0,
                              return_batches=True)
        # score: what checkpoints are selected on (math accuracy; QA F1, the paper's QA validation metric)
        out = {"score": result["score"], "mean_reward": result["mean_reward"],
               "accuracy": result.get("accuracy", result.get("acc"))}
        out.update({k: result[k] for k in ("f1", "em") if k in result})
        return {**{k: float(v) for k, v in out.items()},
                PER_PROBLEM: [float(s) for b in result["batches"] for s in b.scores]}


__all__ = ["AgentObjective", "QuadraticObjective", "toy_quadratic"]
