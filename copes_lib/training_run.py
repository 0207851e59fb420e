"""The bookkeeping both training loops share (``es_training.train_es``, ``grpo.train_grpo``): the run
folder's checkpoints, resuming, the best validated checkpoint, early stopping and the run they return.

A run folder holds ``last.pt`` (what a rerun resumes from: the loop's counters and history, the config
the run was written with, and the loop's own payload such as weights, optimizer or the ES master) and
``best.pt`` (the best validated weights, with their step and value). A rerun checks that ``best.pt``
opens and holds the step ``last.pt`` names; a damaged one (a disk that filled up, a copy cut short)
resets the run, with a warning, and it retrains at once: no FORCE is needed. Every validation is recorded
under one metric, ``eval/val_score`` (what checkpoints are selected on: accuracy on math, F1 on QA);
the best is the strictly highest value, so the earliest step wins ties. ``patience`` P > 0 stops the
run after P validations in a row without a new best.

The loops differ in one declared respect: ES counts its step-0 validation (the starting model) as a
candidate for the best checkpoint (``base_counts``); GRPO chooses among trained steps only and reports
step 0 as the base.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copes_lib import runs
from copes_lib.config import Config, ConfigError

LAST, BEST = "last.pt", "best.pt"
SCORE = "eval/val_score"  # the validation metric checkpoints are selected on


@dataclass
class TrainingRun:
    """What a training loop returns. ``history``: one metrics row per step (step 0 = the start);
    ``val_by_step``: the ``eval/val_score`` of every validated step."""

    history: list[dict[str, Any]]
    val_by_step: dict[int, float]
    best_step: int | None
    best_val: float | None
    best_path: Path | None
    last_path: Path
    stopped_early: bool = False  # ``patience`` validations without a new best ended the run

    @property
    def base_val(self) -> float:
        return self.val_by_step[0]

    @property
    def last_step(self) -> int:
        return int(self.history[-1]["step"])

    @property
    def peak_censored(self) -> bool:
        """The best validation is the last trained step and the run did not stop on its own: the peak
        may lie beyond the run (a reference gain measured here may be underestimated)."""
        return self.best_step is not None and self.best_step == self.last_step and not self.stopped_early

    def val_at(self, step: int) -> float | None:
        return self.val_by_step.get(step)

    def curve(self) -> tuple[list[int], list[float]]:
        """(validated steps, their ``eval/val_score``), in order."""
        steps = sorted(self.val_by_step)
        return steps, [self.val_by_step[s] for s in steps]


class RunBook:
    """The checkpoints and counters of one training run in ``run_dir``.

    With ``resume`` and a ``last.pt`` written under the same ``config``, the counters and history come
    back from it and ``saved`` holds the loop's payload; one written under another config is refused.
    """

    def __init__(self, run_dir: str | Path, config: Config, *, resume: bool = True, base_counts: bool = False,
                 patience: int = 0, map_location: str = "cpu"):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.last_path, self.best_path = self.dir / LAST, self.dir / BEST
        self.config, self.base_counts, self.patience = config, base_counts, patience
        self.step, self.history, self.val_by_step = 0, [], {}
        self.best_step: int | None = None
        self.best_val: float | None = None
        self.stale, self.stopped = 0, False
        self.saved = runs.load_checkpoint(self.last_path, map_location=map_location) if resume else None
        if self.saved is not None:
            if self.saved["config"] != config.to_dict():
                raise ConfigError(f"{self.last_path} was written with a different {type(config).__name__}; "
                                  "delete it, use another run folder or pass resume=False")
            if self.saved["best_step"] is not None and not self._best_is_readable(self.saved["best_step"]):
                self.saved = None  # the run starts over: its best weights are gone (warned)
        if self.saved is not None:
            s = self.saved
            self.step, self.history = s["step"], s["history"]
            self.val_by_step = {int(k): v for k, v in s["val_by_step"].items()}
            self.best_step, self.best_val = s["best_step"], s["best_val"]
            self.stale, self.stopped = s["stale_validations"], s["stopped_early"]

    def _best_is_readable(self, best_step: int) -> bool:
        """Whether ``best.pt`` is there, opens (a truncated file does not) and holds step ``best_step``. When
        not, the run is reset (``last.pt``, ``best.pt`` and ``history.json`` deleted, a
        :class:`copes_lib.runs.CorruptCacheWarning` naming the file) so that it retrains now: a damaged
        cache heals on the first rerun, with no FORCE. The file is memory-mapped, so the check does not read
        the weights (a file damaged inside its tensors is still caught by :func:`read_checkpoint`)."""
        import pickle
        import warnings
        import zipfile

        import torch

        problem = "is missing"
        if self.best_path.exists():
            try:
                zipfile.ZipFile(self.best_path).close()  # a cut file has lost its central directory
                state = torch.load(self.best_path, map_location="cpu", weights_only=False, mmap=True)
            except (zipfile.BadZipFile, OSError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
                # written by this module through an atomic rename: a file that does not open is damaged
                problem = f"is damaged ({type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]})"
            else:
                if isinstance(state, dict) and state.get("step") == best_step:
                    return True
                problem = f"does not hold the best step {best_step} that {LAST} records (an incomplete or foreign file)"
        removed = [p for p in (self.last_path, self.best_path, self.dir / "history.json") if p.exists()]
        for p in removed:
            p.unlink()
        warnings.warn(f"corrupted cache entry: {self.best_path} {problem}; deleted {', '.join(map(str, removed))} "
                      "and retraining the run from its start now (nothing to do by hand)",
                      runs.CorruptCacheWarning, stacklevel=3)
        return False

    def validated(self, step: int, value: float, best_payload: Callable[[], dict[str, Any]]) -> None:
        """Record ``eval/val_score`` = ``value`` at ``step``; a new best writes ``best.pt`` with
        ``best_payload()`` (the weights). Step 0 is a candidate only with ``base_counts``."""
        self.val_by_step[step] = value
        if step == 0 and not self.base_counts:
            return
        if self.best_val is None or value > self.best_val:
            self.best_step, self.best_val, self.stale = step, value, 0
            runs.save_checkpoint(self.best_path, {"step": step, "val": value, **best_payload()})
        else:
            self.stale += 1
        self.stopped = 0 < self.patience <= self.stale

    def save(self, **payload: Any) -> None:
        """Write ``last.pt``: the counters, the history and the loop's ``payload``."""
        runs.save_checkpoint(self.last_path, {
            "config": self.config.to_dict(), "step": self.step, "history": self.history,
            "val_by_step": self.val_by_step, "best_step": self.best_step, "best_val": self.best_val,
            "stale_validations": self.stale, "stopped_early": self.stopped, **payload})

    def result(self) -> TrainingRun:
        return TrainingRun(self.history, dict(self.val_by_step), self.best_step, self.best_val,
                           self.best_path if self.best_step is not None else None, self.last_path, self.stopped)


def read_checkpoint(path: str | Path, key: str, *, rebuild: str | None = None, map_location: str = "cpu") -> Any:
    """``state[key]`` of a finished run's checkpoint (``best.pt`` or ``last.pt``): every read of a cached
    run's weights goes through here. A missing, damaged or incomplete file resets the run (``last.pt``,
    ``best.pt`` and ``history.json`` of its folder are deleted: the run is no longer finished, and its
    next use retrains it) and raises :class:`copes_lib.runs.CorruptCacheError` naming the file and the
    command that rebuilds it, never a bare TypeError."""
    path = Path(path)
    folder = path.parent
    command = rebuild or rerun_hint(folder)
    return runs.load_checkpoint(path, map_location, required=True, key=key, rebuild=command,
                                reset=[folder / name for name in (LAST, BEST, "history.json")])


def rerun_hint(folder: Path) -> str:
    """What retrains a reset run: its notebook again (no FORCE needed: the run is no longer finished)."""
    notebook = next(reversed(runs._OPEN_RUNS), None)
    try:
        profile = folder.resolve().relative_to(Path(runs.CACHE_ROOT).resolve()).parts[0]
    except (ValueError, IndexError):
        profile = "<profile>"
    number = notebook[1].split("_", 1)[0] if notebook else "<the notebook that trained it>"
    return f"rerun its notebook, e.g. make reproduce PROFILE={profile} ONLY={number}"


__all__ = ["BEST", "LAST", "SCORE", "RunBook", "TrainingRun", "read_checkpoint"]
