"""Test decoding of paper A (temperature 0.3, top-p 1, n samples per problem) and unbiased pass@k."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from copes_lib import runs, stats
from copes_lib.config import NotebookParams
from copes_lib.es import checksum
from copes_lib.rollout import evaluate


def sample_test(params: NotebookParams, agent, model, tasks: Sequence[Any], *, samples: int,
                temperature: float, label: str, seed: int = 0, top_p: float = 1.0) -> dict[str, Any]:
    """``samples`` trajectories per task at ``temperature`` and ``top_p`` (the paper: 0.3, 1.0), cached
    by the weights' checksum.

    Returns per-task scores (``scores[j]``: the samples' scores of task j; correctness for math, F1 for
    QA), the mean Acc / EM / F1 (QA) or accuracy (math), and ``correct_counts`` for pass@k.
    """
    objective = agent.objective
    config = dataclasses.replace(objective.rollout_config, temperature=temperature, top_p=top_p)
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


def greedy_scores(params: NotebookParams, agent, model, tasks: Sequence[Any], *, label: str) -> np.ndarray:
    """Per-problem scores of greedy validation (correctness for math, F1 for QA), cached by the weights'
    checksum and the task ids.

    The rollout settings, seed and chunking are those of ``AgentObjective.validate``, so the mean of the
    returned array is the ``eval/val_score`` a training run logged for the same weights and tasks (up to
    float noise in batched attention); the claims test differences between methods on these arrays
    (``copes_lib.stats``), which counts evaluation-set noise that a mean cannot show.
    """
    objective = agent.objective
    config = objective.rollout_config
    key = runs.cache_key({"weights": checksum(model), "rollout": config.to_dict(), "kind": agent.key["kind"],
                          "greedy_validation": True}, [t.id for t in tasks])
    path = runs.cache_dir(params.PROFILE, "greedy_scores", key) / "scores.json"

    def compute() -> dict[str, Any]:
        result = evaluate(model, objective.tokenizer, list(tasks), objective.env, config, seed=0,
                          return_batches=True)
        return {"label": label, "scores": [float(s) for b in result["batches"] for s in b.scores]}

    scores = np.asarray(runs.cached(path, compute, force=params.FORCE)["scores"], dtype=float)
    if len(scores) != len(tasks):
        raise ValueError(f"{path} holds {len(scores)} scores for {len(tasks)} tasks; rerun with FORCE=True")
    return scores


def greedy_split_scores(params: NotebookParams, agent, model, tasks: Sequence[Any], *, label: str
                        ) -> dict[str, np.ndarray]:
    """Per-problem strict and lenient correctness of greedy validation (docs/regime.md#r2-the-base-regime-criterion:
    strict = the paper's reward fully earned, lenient = the right answer anywhere in the final turn), the
    same rollout as :func:`greedy_scores`, cached by the weights' checksum and the task ids. A gain then
    splits into protocol and skill (docs/regime.md#r4-predictions-ours-registered-before-the-run)."""
    from copes_lib.tasks.regime import lenient_correctness, strict_correctness

    objective = agent.objective
    config = objective.rollout_config
    kind = agent.key["kind"]
    key = runs.cache_key({"weights": checksum(model), "rollout": config.to_dict(), "kind": kind,
                          "greedy_validation": True, "split": "strict_lenient"}, [t.id for t in tasks])
    path = runs.cache_dir(params.PROFILE, "greedy_split_scores", key) / "scores.json"

    def compute() -> dict[str, Any]:
        result = evaluate(model, objective.tokenizer, list(tasks), objective.env, config, seed=0,
                          return_batches=True)
        texts = [t for b in result["batches"] for t in b.model_texts]
        answers = [task.answers for b in result["batches"] for task in b.tasks]
        return {"label": label, "strict": strict_correctness(None, texts, answers, kind),
                "lenient": lenient_correctness(None, texts, answers, kind)}

    out = runs.cached(path, compute, force=params.FORCE)
    split = {name: np.asarray(out[name], dtype=float) for name in ("strict", "lenient")}
    if any(len(v) != len(tasks) for v in split.values()):
        raise ValueError(f"{path} holds scores for another task list than its {len(tasks)} tasks; rerun with FORCE=True")
    return split


def pass_at_k_frame(results: dict[str, dict[str, Any]]):
    """Long table (method, k, pass_at_k) for k = 1..n of each method's test samples."""
    import pandas as pd

    rows = []
    for method, result in results.items():
        curve = stats.pass_at_k_curve(result["correct_counts"], result["samples"])
        rows += [{"method": method, "k": k, "pass_at_k": float(v)} for k, v in enumerate(curve, start=1)]
    return pd.DataFrame(rows)
