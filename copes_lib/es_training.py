"""The ES / CoPES training loop (``train_es``: ``es.es_step`` repeated, validated, checkpointed and
resumable) and its cached runs (``cached_es_run`` under ``cache/<profile>/<name>-<key>/``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from copes_lib import runs
from copes_lib.config import ConfigError
from copes_lib.es import ES, PER_PROBLEM, ESConfig, Objective, es_step
from copes_lib.es_backends import make_backend
from copes_lib.training_run import SCORE, RunBook, TrainingRun


def train_es(model: nn.Module, objective: Objective, config: ESConfig, *, steps: int, val_every: int,
             run_dir: str | Path, worker_factory=None, on_step: Callable[[int, dict], None] | None = None,
             run=None, log_prefix: str = "es", resume: bool = True,
             base_validation: dict[str, float] | None = None) -> TrainingRun:
    """Train ``model`` in place for ``steps`` ES/CoPES steps; returns the run (one metrics row per step).

    Validation (``objective.validate``, temperature 0, logged as ``eval/val_<key>``; checkpoints are
    selected on its ``score``, ``eval/val_score``) at step 0 and every ``val_every`` steps and at the
    end; the best validated weights (step 0 included) go to ``run_dir/best.pt``; ``run_dir/last.pt`` is
    written after every step, and a rerun resumes from it (all randomness is a function of the step, so
    the resumed run is identical to an uninterrupted one; ``copes_lib.training_run``). ``on_step(step,
    row)`` runs after each step's checkpoint. ``run`` (a ``runs.Run``) receives every row. Device-hours
    count step time only (validation excluded, as in docs/paper_a_copes.md#a5-gpu-hour-accounting).
    ``base_validation``: the starting model's ``objective.validate`` result when already known (runs
    from the same start share it). Where validation returns per-problem scores (``es.PER_PROBLEM``) they are
    recorded in ``run_dir/val_scores.json`` by step (:func:`record_val_scores`), not in the history.
    """
    if steps < 0 or val_every < 1:
        raise ConfigError(f"train_es: steps = {steps} must be >= 0 and val_every = {val_every} >= 1")
    device = next(model.parameters()).device
    book = RunBook(run_dir, config, resume=resume, base_counts=True)
    if book.saved is not None:
        model.load_state_dict(book.saved["model"])
    es = ES(model, config, master=book.saved.get("master") if book.saved is not None else None)

    def validate(step: int, known: dict[str, float] | None = None) -> dict[str, Any]:
        t0 = time.perf_counter()
        result = dict(known if known is not None else objective.validate(model))
        per_problem = result.pop(PER_PROBLEM, None)
        if per_problem is not None:
            record_val_scores(run_dir, step, per_problem)
        if "score" not in result:
            raise KeyError(f"objective.validate returned {sorted(result)}; expected a 'score' entry (the metric "
                           "checkpoints are selected on)")
        row = {f"eval/val_{k}": float(v) for k, v in result.items()}
        row["time/val_s"] = time.perf_counter() - t0
        book.validated(step, row[SCORE], lambda: {"model": model.state_dict()})
        return row

    def checkpoint() -> None:
        # bf16/fp16 models: the fp32 master is saved too, so a resumed run continues from exact values
        book.save(model=model.state_dict(), **({"master": es.master_state()} if es.mixed else {}))

    if not book.history:
        row = {"step": 0, "time/device_hours": 0.0, **validate(0, base_validation)}
        book.history.append(row)
        if run is not None:
            run.log(0, {k: v for k, v in row.items() if k != "step"})
        checkpoint()

    backend = make_backend(es, worker_factory)
    try:
        while book.step < steps:
            step = book.step + 1
            result = es_step(es, step, objective, backend)
            hours = book.history[-1]["time/device_hours"] + result.step_s / 3600
            row = {"step": step, "reward/mean": float(result.rewards.mean()),
                   "reward/std": float(result.rewards.std()), "es/update_norm": result.update_norm,
                   **{f"es/update_norm_k{k}": n for k, n in enumerate(result.update_norms)},
                   **{f"reward/mean_k{k}": float(r.mean()) for k, r in enumerate(result.rewards)},
                   "time/step_s": result.step_s, "time/rollout_s": result.rollout_s,
                   "time/noise_s": result.noise_s, "time/fitness_s": result.fitness_s,
                   "time/device_hours": hours,
                   "mem/peak_gib": runs.peak_memory_gib(device)}
            validated = step % val_every == 0 or step == steps
            if validated:
                row.update(validate(step))
            book.step = step
            book.history.append(row)
            checkpoint()
            if run is not None:
                run.log(step, {k: v for k, v in row.items() if k != "step"})
            if validated:
                runs.summary_line(log_prefix, step, {k: row[k] for k in ("reward/mean", SCORE)})
            if on_step is not None:
                on_step(step, row)
    finally:
        backend.close()
    return book.result()


VAL_SCORES = "val_scores.json"  # per-problem validation scores of a run, by step


def record_val_scores(run_dir: str | Path, step: int, scores: list[float]) -> None:
    """Add step ``step``'s per-problem validation scores to ``run_dir/val_scores.json`` (atomic; a step
    validated again, e.g. after a resume, is replaced by the same deterministic values)."""
    saved = read_val_scores(run_dir)
    saved[int(step)] = [float(s) for s in scores]
    runs.atomic_write_json(Path(run_dir) / VAL_SCORES, {str(k): v for k, v in sorted(saved.items())})


def read_val_scores(run_dir: str | Path) -> dict[int, list[float]]:
    """step -> per-problem validation scores a run recorded (empty for a run trained before they were recorded,
    or whose objective gives none)."""
    path = Path(run_dir) / VAL_SCORES
    if not path.exists():
        return {}
    return {int(k): v for k, v in runs.read_json(path).items()}


def run_key(config: ESConfig, steps: int, val_every: int, key_extra: dict[str, Any]) -> str:
    return runs.cache_key({"es": config.to_dict(), "steps": steps, "val_every": val_every, **key_extra})


def cached_es_run(profile: str, name: str, model: nn.Module, objective: Objective, config: ESConfig, *,
                  steps: int, val_every: int, key_extra: dict[str, Any], force: bool = False,
                  log_prefix: str = "es", **kw: Any) -> TrainingRun:
    """``train_es`` in ``cache/<profile>/<name>-<key>/`` (the run's ``last_path.parent``): a finished
    run is reused, an interrupted one resumes. ``model`` is trained in place (pass a copy)."""
    folder = runs.cache_dir(profile, name, run_key(config, steps, val_every, key_extra))
    if force:
        shutil.rmtree(folder)
        folder.mkdir(parents=True)
    result = train_es(model, objective, config, steps=steps, val_every=val_every, run_dir=folder,
                      log_prefix=log_prefix, **kw)
    runs.atomic_write_json(folder / "history.json", result.history)
    return result


__all__ = ["train_es", "cached_es_run", "run_key", "record_val_scores", "read_val_scores", "VAL_SCORES"]
