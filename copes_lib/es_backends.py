"""How ES members are evaluated (``es.es_step``'s ``backend``): sequentially in this process, batched
(members x prompts in one forward, ``copes_lib.population``), or on Ray workers that hold replicas.

All give the same update for the same seeds (tests/test_es.py, tests/test_es_scale.py). A backend has
``evaluate(es, plan, objective) -> rewards (K, N_k)``, ``after_update(es, plan, rhat)`` and ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from copes_lib.config import ConfigError
from copes_lib.es import ES, ESConfig, Objective, StepPlan, checksum, evaluate_members, member_rewards


class SequentialBackend:
    """One member at a time, in place: perturb, evaluate, restore (``es.member_rewards``)."""

    def evaluate(self, es: ES, plan: StepPlan, objective: Objective) -> np.ndarray:
        return member_rewards(es, plan, objective)

    def after_update(self, es: ES, plan: StepPlan, rhat: np.ndarray) -> None:
        pass

    def close(self) -> None:
        pass


class BatchedBackend:
    """Members x prompts in one batched forward, groups of G members: full-rank noise with stacked
    weight copies (``population.Population``), low-rank noise (``ESConfig.noise_rank``) on the shared
    weights with per-member factors (``lowrank.LowRankPopulation``)."""

    def evaluate(self, es: ES, plan: StepPlan, objective: Objective) -> np.ndarray:
        from copes_lib.lowrank import LowRankPopulation
        from copes_lib.population import Population

        members = plan.members()
        group = es.config.members_per_batch or len(members)
        rewards = np.zeros((len(plan.seeds), len(plan.seeds[0])))
        rows = objective.rows_per_member(plan.step)
        for start in range(0, len(members), group):
            chunk = members[start:start + group]
            if es.config.noise_rank:
                stacked = es.member_factors(plan, chunk)
                context = LowRankPopulation(es.model, stacked, plan.sigma_k / es.config.noise_rank ** 0.5, rows)
            else:
                stacked = es.member_weights(plan, chunk)
                context = Population(es.model, stacked, rows)
            with context as pop:
                t0 = time.perf_counter()
                values = objective.population_fitness(es.model, plan.step, len(chunk), pop.row_hook)
                es.fitness_s += time.perf_counter() - t0
            for (k, i), value in zip(chunk, values):
                rewards[k, i] = value
            del stacked
        return rewards

    def after_update(self, es: ES, plan: StepPlan, rhat: np.ndarray) -> None:
        pass

    def close(self) -> None:
        pass


class _RayWorker:
    """A replica (one per GPU when the cluster has GPUs): builds (model, objective) from a factory,
    moves the model to its device (bf16 compute weights on a GPU, fp32 master), gets theta ONCE, then
    only seeds, partitions and rewards."""

    def __init__(self, factory: Callable[[], tuple[nn.Module, Objective]], state: dict,
                 master: list[torch.Tensor], config: ESConfig, compute_dtype: str | None):
        torch.set_num_threads(1)
        self.model, self.objective = factory()
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        dtype = getattr(torch, compute_dtype) if compute_dtype else None
        self.model.to(device=device, dtype=dtype)
        self.model.load_state_dict(state)
        self.es = ES(self.model, config, master=master)

    def device(self) -> str:
        return str(next(self.model.parameters()).device.type)

    def evaluate(self, step: int, partition: list[list[int]], members: list[tuple[int, int]]) -> list[float]:
        return evaluate_members(self.es, self.es.plan(step, partition), members, self.objective.fitness)

    def update(self, step: int, partition: list[list[int]], rhat: list[list[float]]) -> float:
        self.es.update(self.es.plan(step, partition), np.asarray(rhat))
        return checksum(self.model)

    def master_state(self) -> list[torch.Tensor]:
        return self.es.master_state()


def ensure_ray(workers: int) -> None:
    """Connect to the cluster in ``RAY_ADDRESS`` (any number of nodes: ``ray start --head`` on one,
    ``ray start --address=...`` on the others), or start a local one with ``workers`` CPUs."""
    import os

    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)


class RayBackend:
    """Workers hold replicas; per step they receive (step, partition, member ids), return scalars,
    and replay the update from the seeds. Only the initial weights travel, once, at start.

    One worker per GPU when the cluster has GPUs (``num_gpus=1`` each, bf16 compute weights with an
    fp32 master), else one per CPU; the workers are reserved together in a placement group
    (``strategy``: PACK fills a node first, SPREAD puts one worker per node). Members are dealt to the
    workers round-robin; every worker replays every update, in lockstep. A worker that dies fails the
    step with its error before the update: nothing is written to the model, and ``train_es`` resumes
    from the last checkpoint. Noise streams are device-specific: when the workers run on GPUs and the
    driver's model does not, the driver copies the fp32 master of worker 0 after each update (the
    checksums of all workers are compared first).
    """

    def __init__(self, es: ES, worker_factory: Callable[[], tuple[nn.Module, Objective]],
                 gpus_per_worker: float | None = None, strategy: str = "PACK"):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            raise ConfigError("backend='ray' needs ray.init(...) first (e.g. es_backends.ensure_ray(workers), which "
                              "honours RAY_ADDRESS)")
        if strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ConfigError(f"RayBackend: strategy = {strategy!r}; valid: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD")
        n = es.config.ray_workers
        if gpus_per_worker is None:
            gpus_per_worker = 1.0 if ray.cluster_resources().get("GPU", 0) >= n else 0.0
        bundle = {"CPU": 1, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self.group = placement_group([bundle] * n, strategy=strategy)
        ray.get(self.group.ready(), timeout=600)
        state = {k: v.detach().cpu() for k, v in es.model.state_dict().items()}
        state_ref, master_ref = ray.put(state), ray.put(es.master_state())
        actor = ray.remote(num_cpus=1, num_gpus=gpus_per_worker, max_restarts=0)(_RayWorker)
        compute = "bfloat16" if gpus_per_worker else None
        self.workers = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=w)).remote(
            worker_factory, state_ref, master_ref, es.config, compute) for w in range(n)]
        self.ray = ray
        devices = self._get([w.device.remote() for w in self.workers], "start")
        self.same_device = all(d == next(es.model.parameters()).device.type for d in devices)

    def _get(self, futures: list, what: str) -> list:
        try:
            return self.ray.get(futures)
        except self.ray.exceptions.RayError as err:
            raise RuntimeError(f"Ray worker failed during {what}; the model was not updated: {err}") from err

    def evaluate(self, es: ES, plan: StepPlan, objective: Objective) -> np.ndarray:
        members = plan.members()
        shares = [members[w::len(self.workers)] for w in range(len(self.workers))]
        futures = [w.evaluate.remote(plan.step, plan.partition, share) for w, share in zip(self.workers, shares)]
        rewards = np.zeros((len(plan.seeds), len(plan.seeds[0])))
        for share, values in zip(shares, self._get(futures, f"step {plan.step} (member evaluation)")):
            for (k, i), value in zip(share, values):
                rewards[k, i] = value
        return rewards

    def after_update(self, es: ES, plan: StepPlan, rhat: np.ndarray) -> None:
        sums = self._get([w.update.remote(plan.step, plan.partition, rhat.tolist()) for w in self.workers],
                         f"step {plan.step} (update)")
        if any(abs(s - sums[0]) > 1e-9 * max(1.0, abs(sums[0])) for s in sums):
            raise RuntimeError(f"Ray replicas diverged from each other: {sums}")
        if not self.same_device:  # the driver's noise differs from the workers': take worker 0's result
            master = self._get([self.workers[0].master_state.remote()], "copying the master")[0]
            for m, p, new in zip(es.master, es.params, master):
                m.copy_(new)
                if m is not p:
                    p.copy_(m)
            return
        mine = checksum(es.model)
        if abs(sums[0] - mine) > 1e-9 * max(1.0, abs(mine)):
            raise RuntimeError(f"Ray replicas diverged from the driver: {sums} vs {mine}")

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            self.ray.kill(w)
        self.workers = []
        remove_placement_group(self.group)


def make_backend(es: ES, worker_factory: Callable[[], tuple[nn.Module, Objective]] | None = None):
    if es.config.backend == "sequential":
        return SequentialBackend()
    if es.config.backend == "batched":
        return BatchedBackend()
    if worker_factory is None:
        raise ConfigError("backend='ray' needs worker_factory: a picklable () -> (model, objective)")
    return RayBackend(es, worker_factory)


__all__ = ["SequentialBackend", "BatchedBackend", "RayBackend", "ensure_ray", "make_backend"]
