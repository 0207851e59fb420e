"""The ES arm every paper-A notebook shares: the warm-started agent, one cached ES / CoPES run
(``es_run``), the sigma sweep of notebooks 02 / 03, runs over paired seeds and their continuation (05,
06, 07).

Sweeps score on the tuning split (``tuning_agent``), never on validation, and widen their grid until the
choice is bracketed (``protocols.paper_a.sweeps``).

A run is ``copes_lib.es_training.cached_es_run`` on a copy of the warm-started model, cached under
``cache/<profile>/es_runs-<key>/`` with key ``es_training.run_key`` (config, steps, validation cadence, the
agent's identity, the rollout engine included): two notebooks that ask for the same run share it, and an
interrupted run resumes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from copes_lib import runs
from copes_lib.config import ConfigError
from copes_lib.es import PER_PROBLEM, ESConfig, checksum
from copes_lib.es_backends import ensure_ray
from copes_lib.es_objective import AgentObjective
from copes_lib.es_training import VAL_SCORES, cached_es_run, read_val_scores, run_key
from copes_lib.protocols.histories import val_points
from copes_lib.protocols.paper_a.sweeps import GridSweep, break_tie, widen_to_bracket
from copes_lib.protocols.params import ESSettings, StandardESNotebookParams
from copes_lib.protocols.testbed.substrate_setup import substrate_config
from copes_lib.substrate import WarmStartConfig
from copes_lib.training_run import BEST, LAST, SCORE, read_checkpoint


@dataclass
class AgentSetup:
    """The warm-started substrate and the agent objective of a notebook, plus their cache identity."""

    model: nn.Module
    objective: AgentObjective
    key: dict[str, Any]
    worker_args: dict[str, Any] = field(default_factory=dict)  # load_agent's arguments (Ray workers)
    base_validation: dict[tuple, dict[str, Any]] = field(default_factory=dict)  # by validation ids (+ per_problem)
    forced: set[Path] = field(default_factory=set)  # run folders already recomputed under FORCE


def load_agent(profile: str | ESSettings, kind: str = "math", *, seed: int = 0, batch_size: int = 64,
               batch_seed: int = 1088, val_problems: int = 0, engine: str = "loop",
               substrate: WarmStartConfig | None = None) -> AgentSetup:
    """The profile's warm-started substrate (cached by ``copes_lib.substrate``), its tools, the
    training tasks and the first ``val_problems`` validation tasks (0: all), with the substrate's
    rollout settings. ``profile`` may be the ES settings of a notebook instead (02, 03, 05, 06, 07):
    then PROFILE, TASK_KIND, SEED, BATCH_SIZE, BATCH_SEED, VAL_PROBLEMS and ENGINE are read from them.
    ``substrate`` replaces the profile's substrate (e.g. the skill-gap control base of
    ``substrate_setup.control_config``); the key's substrate checksum keeps the runs of two bases apart."""
    from copes_lib.rollout import make_env
    from copes_lib.substrate import warm_rollout_config, warm_start
    from copes_lib.tasks import load_tasks

    if isinstance(profile, ESSettings):
        p = profile
        profile, kind, seed, engine = p.PROFILE, p.TASK_KIND, p.SEED, p.ENGINE
        batch_size, batch_seed, val_problems = p.BATCH_SIZE, p.BATCH_SEED, p.VAL_PROBLEMS
    given = substrate
    substrate = substrate or substrate_config(profile)
    model, tokenizer, _ = warm_start(profile, kind, seed=seed, config=substrate)
    env = make_env(kind, profile)
    val = load_tasks(profile, kind, "val")
    val = val[:val_problems] if val_problems else val
    rollout_config = warm_rollout_config(substrate)
    objective = AgentObjective(tokenizer, env, load_tasks(profile, kind, "train"), val, rollout_config,
                               batch_size, batch_seed)
    objective.engine = engine
    # the engine is part of a run's identity: no test shows the engines' trajectories equal, so a run
    # under ENGINE slots must not silently reuse one made under loop (or the reverse)
    key = {"profile": profile, "kind": kind, "substrate_checksum": checksum(model), "batch_size": batch_size,
           "batch_seed": batch_seed, "rollout": rollout_config.to_dict(), "engine": engine}
    worker_args = dict(profile=profile, kind=kind, seed=seed, batch_size=batch_size, batch_seed=batch_seed,
                       val_problems=val_problems, engine=engine)
    if given is not None:  # a Ray worker rebuilds the same base
        worker_args["substrate"] = given
    return AgentSetup(model, objective, key, worker_args)


def describe_agent(agent: AgentSetup) -> str:
    """One line on the substrate and its tasks, for a notebook's setup cell."""
    n_params = sum(p.numel() for p in agent.model.parameters())
    return (f"substrate: {n_params:,} parameters; train tasks {len(agent.objective.train_tasks)}, "
            f"validation problems {len(agent.objective.val_tasks)}")


def agent_worker(worker_args: dict[str, Any]) -> tuple[nn.Module, AgentObjective]:
    """Ray worker factory: rebuild the substrate and objective inside the worker (weights then
    come once from the driver)."""
    agent = load_agent(**worker_args)
    return agent.model, agent.objective


def ray_worker_factory(config: ESConfig, agent: AgentSetup):
    """None, or for ``backend="ray"``: connect to Ray (``RAY_ADDRESS`` or a local cluster) and return
    the picklable factory with which each worker rebuilds the agent (weights come once from the driver)."""
    if config.backend != "ray":
        return None
    import functools

    if not agent.worker_args:
        raise ConfigError("backend='ray' needs the agent's worker_args (load_agent's arguments) to rebuild it "
                          "in the workers")
    ensure_ray(config.ray_workers)
    return functools.partial(agent_worker, agent.worker_args)


def tuning_agent(agent: AgentSetup, problems: int, name: str = "SWEEP_VAL_PROBLEMS") -> AgentSetup:
    """The agent validating on the first ``problems`` of the tuning split (``tasks.TUNING_SPLIT``): what
    every sweep of 02-04 scores on, so the validation split stays untouched by the choice. Checked
    disjoint from the agent's training and validation problems and the test split (a clear error
    otherwise); ``name``: the parameter that sized it, for messages."""
    from copes_lib.tasks import TUNING_SPLIT, check_tuning_disjoint, load_tasks

    profile, kind = agent.key["profile"], agent.key["kind"]
    tuning = load_tasks(profile, kind, TUNING_SPLIT)
    if problems > len(tuning):
        raise ConfigError(f"{name} = {problems}: the {profile} tuning split of {kind} holds {len(tuning)} "
                          f"problems; choose 1..{len(tuning)}")
    tuning = tuning[:problems]
    check_tuning_disjoint(tuning, {"train": agent.objective.train_tasks, "val": agent.objective.val_tasks,
                                   "test": load_tasks(profile, kind, "test")}, f"{name} (tuning split)")
    objective = copy.copy(agent.objective)
    objective.val_tasks = tuning
    return dataclasses.replace(agent, objective=objective)


def _sweep_key(row: dict[str, Any]) -> tuple:
    """SWEEP_TIE_RULE's first two criteria as a sort key (higher is better); the rest goes to the default."""
    return (row["final_val_accuracy"], row.get("final_reward_mean", 0.0))


def _calibrated_sigma(params: StandardESNotebookParams) -> float | None:
    """Notebook 01's calibrated sigma for TASK_KIND, or None when its preflight calibrated none (or has not run)."""
    summary = runs.load_summary(params.PROFILE, "01_substrate_and_agent") or {}
    calibrated = summary.get(f"preflight_{params.TASK_KIND}_sigma")
    return float(calibrated) if isinstance(calibrated, (int, float)) and calibrated > 0 else None


def registered_sigma(params: StandardESNotebookParams) -> tuple[float, str]:
    """(the sigma a sweep is centred on and ties go to, where it comes from): notebook 01's calibrated sigma
    for TASK_KIND (docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op, rule 1) when 01's
    preflight calibrated one, else the notebook's SIGMA."""
    calibrated = _calibrated_sigma(params)
    if calibrated is not None:
        return calibrated, f"notebook 01's calibrated sigma for {params.TASK_KIND}"
    return params.SIGMA, f"SIGMA (notebook 01 calibrated no sigma for {params.TASK_KIND})"


def registered_setting(params: StandardESNotebookParams) -> tuple[float, float, str]:
    """(sigma, alpha, where they come from): the registered default setting both ES sweeps are centred on
    (docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op, rule 1). Where notebook 01 calibrated a
    sigma for TASK_KIND: that sigma and alpha = SWEEP_ALPHA_RATIO x sigma (0.5, the paper's ratio: the alpha
    :func:`sigma_sweep` gives the sweep's default row); else the notebook's SIGMA and ALPHA (the gpu profile:
    the paper's values).

    Notebook 03's arms at ES's setting run here instead of at notebook 02's sweep choice, so 03 reads 01 only
    and runs beside 02 (docs/cost.md, the P8.7 recipe against the 2-hour bound, plan item 2); 05 still runs
    ES at 02's choice."""
    calibrated = _calibrated_sigma(params)
    if calibrated is None:
        return (params.SIGMA, params.ALPHA,
                f"the registered default: SIGMA and ALPHA (notebook 01 calibrated no sigma for {params.TASK_KIND})")
    return (calibrated, params.SWEEP_ALPHA_RATIO * calibrated,
            f"the registered default: notebook 01's calibrated sigma for {params.TASK_KIND}, "
            f"alpha = SWEEP_ALPHA_RATIO x sigma = {params.SWEEP_ALPHA_RATIO:g} x sigma")


def sigma_sweep(params: StandardESNotebookParams, agent: AgentSetup, subspaces: int) -> GridSweep:
    """The sigma sweep (alpha = SWEEP_ALPHA_RATIO * sigma) for one K on the tuning split, widened until
    its best sigma is inside the grid (``protocols.paper_a.sweeps``, at most SWEEP_MAX_EXTEND added sigmas).
    ``final_val_accuracy`` of a row is its accuracy on the tuning split after SWEEP_STEPS steps. An empty
    grid (no sweep: SWEEP_SIGMAS empty, as on the gpu profile, which has no tuning split) returns an empty
    sweep without reading the tuning split."""
    default, _ = registered_sigma(params)
    values = params.sweep_grid(default)
    if not values:
        return GridSweep("SWEEP_SIGMAS", [], {}, float("nan"))
    tuning = tuning_agent(agent, params.SWEEP_VAL_PROBLEMS)

    def evaluate(sigma: float) -> dict[str, Any]:
        alpha = params.SWEEP_ALPHA_RATIO * sigma
        config = params.es_config(subspaces=subspaces, sigma=sigma, alpha=alpha)
        history = es_run(tuning, config, steps=params.SWEEP_STEPS, val_every=params.SWEEP_STEPS,
                         force=params.FORCE, label=f"sweep K={subspaces} sigma={sigma:g}").history
        return {"subspaces": subspaces, "sigma": sigma, "alpha": alpha,
                "base_val_accuracy": history[0]["eval/val_accuracy"],
                "final_val_accuracy": history[-1]["eval/val_accuracy"],
                "final_reward_mean": history[-1]["reward/mean"],
                "mean_update_norm": float(np.mean([r["es/update_norm"] for r in history[1:]])),
                "device_hours": history[-1]["time/device_hours"]}

    return widen_to_bracket(evaluate, values, key=_sweep_key, max_extend=params.SWEEP_MAX_EXTEND, name="SWEEP_SIGMAS",
                            default=default)


def sweep_rows(grid: GridSweep) -> list[dict[str, Any]]:
    """One row per evaluated setting, ascending, marking the widening's additions and the choice."""
    return [{**grid.rows[v], "split": "tune", "added_by_widening": v in grid.added, "default": v == grid.default,
             "chosen": v == grid.chosen} for v in grid.values]


def sweep_summary(grid: GridSweep) -> dict[str, Any]:
    """The summary keys every sweep writes: whether the choice is bracketed, what the widening added."""
    best = grid.rows[grid.chosen]
    after, before = (best["final_val_accuracy"], best["base_val_accuracy"]) if "final_val_accuracy" in best else (
        best["val_at_sweep_end"], best["base_val"])  # an ES row (02, 03) or a GRPO row (04)
    return {"sweep_split": "tune", "sweep_values": list(grid.values), "sweep_added": list(grid.added),
            "sweep_at_edge": bool(grid.at_edge), "sweep_max_extend": grid.max_extend,
            "sweep_default": grid.default, "sweep_uninformative": bool(grid.uninformative),
            "sweep_tied": list(grid.tied) if len(grid.tied) > 1 else [],
            # the choice's tuning-split accuracy after SWEEP_STEPS minus the base's: <= 0 means no setting helped
            "sweep_best_minus_base": float(after - before)}


def run_sweep(params: StandardESNotebookParams, agent: AgentSetup, subspaces: int) -> list[dict[str, Any]]:
    """The rows of :func:`sigma_sweep`."""
    return sweep_rows(sigma_sweep(params, agent, subspaces))


SWEEP_TIE_RULE = ("highest tuning-split accuracy after the sweep steps; ties (equal accuracy) go to the higher mean "
                  "training reward at the last sweep step, then to the registered default (or the value geometrically "
                  "closest to it); every value tied: 'uninformative', the default is kept "
                  "(docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op)")


@dataclass(frozen=True)
class SweepChoice:
    """The sweep's choice, the settings that tied with it on validation accuracy, and the rule that broke
    the tie (declared here, before any run: ``SWEEP_TIE_RULE``)."""

    sigma: float
    alpha: float
    tie: tuple[float, ...] = ()  # sigmas that tied for the best validation accuracy (empty: no tie)
    rule: str = SWEEP_TIE_RULE

    def describe(self) -> str:
        if not self.tie:
            return f"sweep choice sigma = {self.sigma:g}, alpha = {self.alpha:g} (no tie)"
        return (f"sweep TIE at sigma in {list(self.tie)}: broken by the declared rule ({self.rule}) -> "
                f"sigma = {self.sigma:g}, alpha = {self.alpha:g}")


def sweep_choice(sweep: list[dict[str, Any]], fallback: tuple[float, float]) -> SweepChoice:
    """The best row of a sigma sweep by ``SWEEP_TIE_RULE``, with the tie shown; ``fallback`` when empty.
    Rows of :func:`sweep_rows` carry the sweep's choice (``chosen``) and its default (``default``); rows
    without them break a tie towards ``fallback``'s sigma."""
    if not sweep:
        return SweepChoice(*fallback)
    top = max(r["final_val_accuracy"] for r in sweep)
    tied = [r for r in sweep if r["final_val_accuracy"] == top]
    chosen = [r for r in sweep if r.get("chosen")]
    if chosen:
        best = chosen[0]
    else:
        defaults = [r["sigma"] for r in sweep if r.get("default")]
        reward = max(r.get("final_reward_mean", 0.0) for r in tied)
        still = [r["sigma"] for r in tied if r.get("final_reward_mean", 0.0) == reward]
        sigma = break_tie(still, defaults[0] if defaults else fallback[0])
        best = next(r for r in tied if r["sigma"] == sigma)
    return SweepChoice(best["sigma"], best["alpha"], tuple(sorted(r["sigma"] for r in tied)) if len(tied) > 1 else ())


def best_setting(sweep: list[dict[str, Any]], fallback: tuple[float, float]) -> tuple[float, float]:
    """(sigma, alpha) of :func:`sweep_choice`."""
    choice = sweep_choice(sweep, fallback)
    return choice.sigma, choice.alpha


def binomial_se(accuracy: float, n: int) -> float:
    """Standard error of an accuracy measured on n problems."""
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / max(n, 1))


# =========================================================================== one run, paired seeds (05, 06, 07)
def seeded_agent(agent: AgentSetup, batch_seed: int) -> AgentSetup:
    """The same substrate and tasks with another prompt-batch seed (a new cache identity); it shares the
    agent's base validations (they do not depend on the batches) and the runs FORCE has recomputed."""
    objective = copy.copy(agent.objective)
    objective.batch_seed = batch_seed
    return dataclasses.replace(agent, objective=objective, key={**agent.key, "batch_seed": batch_seed},
                               worker_args={**agent.worker_args, "batch_seed": batch_seed} if agent.worker_args else {})


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
        return read_checkpoint(self.folder / (LAST if which == "final" else BEST), "model")

    def curve(self, metric: str = SCORE) -> tuple[list[int], list[float]]:
        """(validated steps, values of ``metric``), as ``GRPORun.curve``."""
        return val_points(self.history, metric)

    def val_scores(self) -> dict[int, np.ndarray]:
        """validated step -> the per-problem greedy validation scores the run recorded there
        (``es_training.read_val_scores``; empty for a run cached before they were recorded)."""
        return {step: np.asarray(v, dtype=float) for step, v in read_val_scores(self.folder).items()}


def _identity(agent: AgentSetup, objective: AgentObjective) -> dict[str, Any]:
    return {**agent.key, "val_ids": [t.id for t in objective.val_tasks]}


def es_run_folder(agent: AgentSetup, config: ESConfig, steps: int, val_every: int,
                  val_problems: int | None = None) -> Path:
    """The cache folder of the run ``es_run`` makes with these arguments."""
    objective = agent.objective if val_problems is None else agent.objective.with_val(val_problems)
    return runs.cache_dir(agent.key["profile"], "es_runs", run_key(config, steps, val_every, _identity(agent, objective)))


def es_run(agent: AgentSetup, config: ESConfig, *, steps: int, val_every: int, label: str = "es",
           force: bool = False, val_problems: int | None = None, continue_from: ESRun | None = None,
           seed_index: int = 0) -> ESRun:
    """One ES / CoPES run from a copy of the warm-started model, cached under
    ``cache/<profile>/es_runs-<key>/`` (key ``es_training.run_key``: config, steps, validation cadence,
    the agent's identity and validation problems): a finished run is reused, an interrupted one resumes.

    ``val_problems``: validate on the first n of the agent's validation tasks. ``continue_from``: a
    shorter run of the same config whose checkpoint this run starts from (all randomness is a function
    of the step, so this equals an uninterrupted run and costs only the extra steps). ``force``
    recomputes, once per run and session (arms that share a run recompute it once). ``seed_index``: the
    run's place in a seed series (``seed_runs``)."""
    objective = agent.objective if val_problems is None else agent.objective.with_val(val_problems)
    identity = _identity(agent, objective)
    folder = es_run_folder(agent, config, steps, val_every, val_problems)
    force = force and folder not in agent.forced
    agent.forced.add(folder)
    if continue_from is not None:
        if continue_from.config != config:
            raise ConfigError("es_run: continue_from must be a run of the same ESConfig")
        if folder == continue_from.folder:  # same length: nothing to continue
            return dataclasses.replace(continue_from, label=label)
        if force:
            shutil.rmtree(folder)
            folder.mkdir(parents=True)
        if not (folder / LAST).exists():
            for name, key in ((LAST, "history"), (BEST, "model")):
                if name == LAST or (continue_from.folder / name).exists():  # read first: never copy a damaged file
                    read_checkpoint(continue_from.folder / name, key)
                    shutil.copyfile(continue_from.folder / name, folder / name)
            if (continue_from.folder / VAL_SCORES).exists():  # the steps it continues from keep their scores
                shutil.copyfile(continue_from.folder / VAL_SCORES, folder / VAL_SCORES)
        force = False
    val_ids = tuple(identity["val_ids"])
    result = cached_es_run(agent.key["profile"], "es_runs", copy.deepcopy(agent.model), objective, config,
                           steps=steps, val_every=val_every, key_extra=identity, force=force, log_prefix=label,
                           worker_factory=ray_worker_factory(config, agent),
                           base_validation=agent.base_validation.get(val_ids))
    start = {k[len("eval/val_"):]: v for k, v in result.history[0].items() if k.startswith("eval/val_")}
    start_scores = read_val_scores(folder).get(0)
    if start_scores is not None:  # later runs from the same start record step 0's per-problem scores too
        start[PER_PROBLEM] = start_scores
    agent.base_validation[val_ids] = start
    return ESRun(label, config, result.history, folder, seed_index)


def seed_runs(params: ESSettings, agent, *, subspaces: int, sigma: float, alpha: float, steps: int,
              label: str, zscore: str = "joint", seeds: int | None = None) -> list[ESRun]:
    """One arm over seeds 0..SEEDS-1: seed i = noise seed ES_SEED + i and batch seed BATCH_SEED + i, so
    arms of the same seed are paired (same prompt batches)."""
    out = []
    for i in range(params.SEEDS if seeds is None else seeds):
        config = params.es_config(subspaces=subspaces, sigma=sigma, alpha=alpha, seed_index=i, zscore=zscore)
        out.append(es_run(seeded_agent(agent, params.BATCH_SEED + i), config, steps=steps,
                          val_every=params.VAL_EVERY, label=f"{label} seed {i}", force=params.FORCE, seed_index=i))
    return out


def continue_runs(params: ESSettings, agent, budget_runs: Sequence[ESRun], steps: int) -> list[ESRun]:
    """The given budget runs continued to ``steps`` (only the extra steps are trained)."""
    return [es_run(seeded_agent(agent, params.BATCH_SEED + r.seed_index), r.config, steps=steps,
                   val_every=params.VAL_EVERY, label=r.label.replace("seed", "long, seed"), force=params.FORCE,
                   continue_from=r, seed_index=r.seed_index)
            for r in budget_runs]


def es_model(agent, run: ESRun, which: str = "final"):
    model = copy.deepcopy(agent.model)
    model.load_state_dict(run.weights(which))
    model.eval()
    return model
