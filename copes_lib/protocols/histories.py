"""Numbers read from a training history (a list of per-step rows, validated steps carrying
``eval/val_score``, the metric checkpoints are selected on, and others such as ``eval/val_accuracy``):
the validation curve, the best checkpoint, the value at a step budget, means over seeds, and the
summary keys notebooks 02 / 03 write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from copes_lib import stats
from copes_lib.training_run import SCORE

ACCURACY = "eval/val_accuracy"  # math accuracy; absent from QA GRPO histories (their score is F1)


def val_points(history: Sequence[dict[str, Any]], metric: str = SCORE) -> tuple[list[int], list[float]]:
    """(steps, values) of the validated steps, in order."""
    rows = [r for r in history if metric in r]
    return [int(r["step"]) for r in rows], [float(r[metric]) for r in rows]


def val_at(history: Sequence[dict[str, Any]], step: int, metric: str = SCORE) -> float | None:
    for s, v in zip(*val_points(history, metric)):
        if s == step:
            return v
    return None


def best_validated(history: Sequence[dict[str, Any]], trained_only: bool = True,
                   metric: str = SCORE) -> tuple[int, float]:
    """(step, value) of the best validation (earliest on ties); step 0 excluded when ``trained_only``."""
    points = [(s, v) for s, v in zip(*val_points(history, metric)) if s > 0 or not trained_only]
    if not points:
        raise ValueError("history has no validated training step")
    return max(points, key=lambda sv: (sv[1], -sv[0]))


def mean_curve(histories: Sequence[Sequence[dict[str, Any]]], metric: str = SCORE) -> tuple[list[int], list[float]]:
    """Mean validation ``metric`` over runs at the steps every run validated."""
    curves = [dict(zip(*val_points(h, metric))) for h in histories]
    common = sorted(set.intersection(*(set(c) for c in curves)))
    return common, [float(np.mean([c[s] for c in curves])) for s in common]


def steps_to_match(steps: Sequence[int], values: Sequence[float], target: float) -> int | None:
    """The first validated training step (> 0) whose value is >= target; None if never."""
    pairs = [(s, v) for s, v in zip(steps, values) if s > 0]
    return stats.first_step_reaching([s for s, _ in pairs], [v for _, v in pairs], target)


def mean_step_seconds(history: Sequence[dict[str, Any]]) -> float | None:
    times = [r["time/step_s"] for r in history if "time/step_s" in r]
    return float(np.mean(times)) if times else None


def mean_update_norm(history: Sequence[dict[str, Any]]) -> float:
    norms = [r["es/update_norm"] for r in history if "es/update_norm" in r]
    return float(np.mean(norms)) if norms else 0.0
def summarize(history: list[dict[str, Any]], budget_step: int = 16,
              metric: str = ACCURACY) -> dict[str, Any]:
    """The summary keys of notebooks 02/03 from a training history (``*_val_accuracy`` keys hold
    ``metric``; pass ``"eval/val_f1"`` for QA)."""
    steps, values = val_points(history, metric)
    best_step, best = best_validated(history, trained_only=False, metric=metric)
    return {
        "base_val_accuracy": values[0],
        "best_val_accuracy": best,
        "best_step": best_step,
        f"val_accuracy_at_{budget_step}": val_at(history, budget_step, metric),
        "final_val_accuracy": values[-1],
        "device_hours": history[-1]["time/device_hours"],
        "steps": history[-1]["step"],
    }
