"""Standard ES (Qiu et al. 2025) and CoPES (Algorithm 1): ONE code path; CoPES with K = 1 is ES.

One training step, read next to docs/paper_a_copes.md#a2-copes (Algorithm 1):

1. partition: a fresh random partition of all parameter CHUNKS into K subspaces S_1..S_K, drawn from
   the step's partition seed (``ES.plan``);
2. members: N_k = N / K per subspace, each with its own noise seed; sigma_k = sqrt(K) * sigma;
3. evaluate: member (k, i) is theta + sigma_k * P_k eps_{k,i}; every member answers the same prompt
   batch, fitness r_{k,i} = mean reward (``evaluate_*`` backends; the model is restored after each);
4. z-score the N rewards jointly (one mean, population std), or per subspace (the ablation);
5. update: g_k = (1/N_k) sum_i r_hat_{k,i} eps_{k,i};  theta <- theta + alpha * sum_k P_k g_k
   (``ES.update``), zero when the std is 0.

Noise is never stored: member (k, i)'s noise on chunk c is regenerated from a seed derived from
(run seed, step, k, i, tensor, chunk) whenever it is needed (perturb, restore, update).

How this departs from the paper (and why):
- Chunks are cut per tensor (``chunk_size`` elements; the last chunk of a tensor is shorter, the
  paper's chunk size is unstated) and dealt to subspaces in a random order, each chunk to the subspace
  with the fewest elements so far, so subspaces are equal in size up to one chunk.
- ``noise="iid"`` (default) seeds every chunk of every tensor differently; ``"paper_correlated"``
  reproduces Qiu's flaw: the seed ignores the tensor, so same-shaped tensors get identical noise.
- ``restore="backup"`` (the paper's; default) copies the perturbed chunks back from a copy of theta
  held on the CPU; ``"subtract"`` (Qiu) regenerates and subtracts the noise (not bit-exact in float).
- "std == 0" is taken as std <= 1e-12 * max(1, |mean|): equal float rewards can give a tiny std.
- Backends: sequential (the model plus one chunk of noise), population-batched (``population.py``:
  members x prompts in one forward) and Ray (workers hold replicas, get seeds, return scalars, and
  replay every update from the seeds). All give the same update for the same seeds.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from copes_lib.config import Config, ConfigError, param

_MASK64 = (1 << 64) - 1


def mix_seed(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 mixing): distinct inputs give unrelated streams."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


_PARTITION_TAG = 0x5EED_0001
_MEMBER_TAG = 0x5EED_0002


# =========================================================================== config
@dataclass(frozen=True)
class ESConfig(Config):
    """The ES / CoPES algorithm. Defaults are the paper's (docs/paper_a_copes.md#a3-hyperparameters, Table S6)."""

    population: int = param(40, "N, model evaluations per step (paper: 40; Qiu et al.: 30)", ge=1)
    subspaces: int = param(4, "K, parameter subspaces per step; K = 1 is standard ES (paper CoPES: 4)", ge=1)
    sigma: float = param(1e-3, "sigma, noise scale of standard ES; CoPES uses sigma_k = sqrt(K) sigma "
                         "(paper: 1e-3)", gt=0.0)
    alpha: float = param(5e-4, "alpha, step size; 1/sigma folded in (paper: 5e-4)", gt=0.0)
    chunk_size: int = param(2**20, "elements per parameter chunk dealt to subspaces (paper: unstated; "
                            "an independent reimplementation used 2^20)", ge=1)
    noise: str = param("iid", "iid: every tensor its own noise; paper_correlated: Qiu's same seed for "
                       "every tensor (same-shaped tensors get identical noise)",
                       choices=("iid", "paper_correlated"))
    zscore: str = param("joint", "joint: one mean/std over all N rewards (paper); independent: per "
                        "subspace (the paper's worse ablation)", choices=("joint", "independent"))
    restore: str = param("backup", "backup: copy theta back from a CPU copy (paper); subtract: "
                         "subtract the regenerated noise (Qiu)", choices=("backup", "subtract"))
    backend: str = param("sequential", "how members are evaluated: sequential in-process, batched "
                         "(members x prompts in one forward), ray (workers hold replicas)",
                         choices=("sequential", "batched", "ray"))
    members_per_batch: int = param(0, "batched backend: members per batched forward (0 = all N)", ge=0)
    ray_workers: int = param(2, "ray backend: number of worker replicas", ge=1)
    seed: int = param(33, "seed of noise and partitions (paper's ES runs: 33)", ge=0)

    def check(self) -> None:
        if self.population % self.subspaces:
            raise ConfigError(
                f"ESConfig.population = {self.population} is not divisible by subspaces = "
                f"{self.subspaces}; choose N a multiple of K (paper: N = 40, K = 4)"
            )
        if self.population // self.subspaces < 2:
            raise ConfigError(
                f"ESConfig: N_k = population / subspaces = {self.population}/{self.subspaces} = "
                f"{self.population // self.subspaces} < 2; a z-score needs at least 2 members per "
                "subspace (the paper recommends N_k >= 10)"
            )

    @property
    def members_per_subspace(self) -> int:
        return self.population // self.subspaces

    @property
    def sigma_k(self) -> float:
        """Dimension-aware noise scale: keeps E||delta||^2 equal to full-space ES (docs/paper_a_copes.md#a2-copes)."""
        return math.sqrt(self.subspaces) * self.sigma


# =========================================================================== chunks and plans
@dataclass(frozen=True)
class Chunk:
    tensor: int  # index into ES.params
    start: int  # element range in the flattened tensor
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def make_chunks(params: Sequence[torch.Tensor], chunk_size: int) -> list[Chunk]:
    return [Chunk(j, a, min(a + chunk_size, p.numel()))
            for j, p in enumerate(params) for a in range(0, p.numel(), chunk_size)]


def check_partition(partition: Sequence[Sequence[int]], n_chunks: int, subspaces: int) -> None:
    """K non-empty, disjoint subspaces that together cover every chunk exactly once."""
    if len(partition) != subspaces:
        raise ConfigError(f"partition has {len(partition)} subspaces, expected subspaces = {subspaces}")
    for k, members in enumerate(partition):
        if len(members) == 0:
            raise ConfigError(
                f"partition: subspace {k} is empty ({n_chunks} chunks for K = {subspaces}); lower "
                "ESConfig.chunk_size or subspaces"
            )
    flat = sorted(c for members in partition for c in members)
    if flat != list(range(n_chunks)):
        raise ConfigError(f"partition must cover each of the {n_chunks} chunks exactly once")


def random_partition(chunks: Sequence[Chunk], subspaces: int, seed: int) -> list[list[int]]:
    """Deal the chunks, in a random order, each to the currently smallest subspace (ties: lowest k)."""
    if len(chunks) < subspaces:
        raise ConfigError(
            f"partition with an empty subspace: only {len(chunks)} chunks for subspaces = {subspaces}; "
            "lower ESConfig.chunk_size"
        )
    order = torch.randperm(len(chunks), generator=torch.Generator().manual_seed(seed)).tolist()
    sizes = [0] * subspaces
    partition: list[list[int]] = [[] for _ in range(subspaces)]
    for c in order:
        k = min(range(subspaces), key=lambda s: sizes[s])
        partition[k].append(c)
        sizes[k] += chunks[c].size
    return [sorted(members) for members in partition]


@dataclass(frozen=True)
class StepPlan:
    """Everything a step's randomness depends on; rebuilt from (config, step) anywhere (Ray workers)."""

    step: int
    partition: list[list[int]]  # chunk indices of S_1..S_K
    seeds: list[list[int]]  # seeds[k][i]: noise seed of member i of subspace k
    sigma_k: float

    def members(self) -> list[tuple[int, int]]:
        """(k, i) of every member, in evaluation order (subspace-major)."""
        return [(k, i) for k in range(len(self.seeds)) for i in range(len(self.seeds[k]))]


@dataclass
class StepResult:
    step: int
    rewards: np.ndarray  # (K, N_k)
    update_norms: list[float]  # ||alpha P_k g_k|| per subspace
    update_norm: float
    rollout_s: float  # the evaluation phase (perturb + rollouts + restore)
    noise_s: float
    step_s: float
    fitness_s: float = 0.0  # time inside the objective's calls (the rollouts alone)


# =========================================================================== the engine
class ES:
    """Seed-replayed ES/CoPES over all parameters of ``model`` (tied parameters counted once).

    Master and compute weights: the update is accumulated in an fp32 master copy of theta and the
    model's own (compute) weights are refreshed from it, so a bf16 model does not lose updates smaller
    than its spacing (RMSNorm weights near 1.0: bf16 spacing 7.8e-3 vs an update of ~1e-4). For fp32
    parameters the master IS the parameter (no copy; the arithmetic is the one of the paper). A member
    is made in place on the parameters' device, from seeds: compute = (master + sigma_k eps) rounded
    once to the compute dtype; it is undone by copying the kept copy back (the master for bf16/fp16,
    a CPU backup for fp32 with ``restore="backup"``), never by subtracting, except with the explicit
    ``restore="subtract"`` (Qiu's; fp32 only). ``master``: an fp32 copy of theta to start from (a
    replica that loads bf16 compute weights gets the exact fp32 values this way).
    """

    def __init__(self, model: nn.Module, config: ESConfig, master: Sequence[torch.Tensor] | None = None,
                 master_device: str | torch.device | None = None):
        self.model, self.config = model, config
        self.params = [p.data for p in model.parameters()]
        for p in self.params:
            if not p.is_contiguous():
                raise ConfigError("ES needs contiguous parameters (flat views per tensor)")
        if master is not None and len(master) != len(self.params):
            raise ConfigError(f"ES: master has {len(master)} tensors, the model {len(self.params)} parameters")
        self.master = []
        for j, p in enumerate(self.params):
            source = p if master is None else master[j]
            if p.dtype == torch.float32 and master is None:
                self.master.append(p)  # the same tensor: fp32 models keep their exact, copy-free path
            elif p.dtype == torch.float32:
                p.copy_(source)
                self.master.append(p)
            else:
                # master_device="cpu" keeps 4 bytes/parameter off a small GPU (a 4B model: 16 GB);
                # members then copy their chunks over (cheap next to a member's rollouts)
                self.master.append(source.detach().to(master_device or p.device, torch.float32, copy=True))
        self.mixed = any(m is not p for m, p in zip(self.master, self.params))
        if self.mixed and config.restore == "subtract":
            raise ConfigError("ESConfig.restore = 'subtract' needs fp32 parameters (it is not exact in "
                              f"{sorted({str(p.dtype) for p in self.params})}); use restore='backup'")
        self.chunks = make_chunks(self.params, config.chunk_size)
        self.noise_s = 0.0  # time spent generating noise (benchmarks read it)
        self.fitness_s = 0.0  # time spent inside the objective (the rollouts alone)
        self.perturb_s = 0.0  # time spent making and undoing members (benchmarks read it)
        self._generator: dict[torch.device, torch.Generator] = {}

    # ------------------------------------------------------------------ seeds and noise
    def plan(self, step: int, partition: Sequence[Sequence[int]] | None = None) -> StepPlan:
        c = self.config
        if partition is None:
            partition = random_partition(self.chunks, c.subspaces, mix_seed(c.seed, _PARTITION_TAG, step))
        check_partition(partition, len(self.chunks), c.subspaces)
        seeds = [[mix_seed(c.seed, _MEMBER_TAG, step, k, i) for i in range(c.members_per_subspace)]
                 for k in range(c.subspaces)]
        return StepPlan(step, [list(s) for s in partition], seeds, c.sigma_k)

    def noise(self, seed: int, chunk: Chunk) -> torch.Tensor:
        """eps of one member on one chunk (float32 on the parameter's device), regenerated from the
        member's seed (never stored). Streams are device-specific: the same seed gives other noise on
        a CUDA device than on the CPU (replicas must keep their parameters on one device type)."""
        t0 = time.perf_counter()
        target = self.params[chunk.tensor]
        # paper_correlated drops the tensor index: same-shaped tensors get identical noise (Qiu's flaw)
        tensor_key = chunk.tensor if self.config.noise == "iid" else 0
        device = target.device
        if device not in self._generator:
            self._generator[device] = torch.Generator(device=device)
        gen = self._generator[device].manual_seed(mix_seed(seed, tensor_key, chunk.start))
        eps = torch.randn(chunk.size, generator=gen, device=device, dtype=torch.float32)
        self.noise_s += time.perf_counter() - t0
        return eps

    def _flat(self, tensors: list[torch.Tensor], chunk: Chunk) -> torch.Tensor:
        return tensors[chunk.tensor].view(-1)[chunk.start:chunk.stop]

    # ------------------------------------------------------------------ perturb / restore
    def backup(self) -> list[torch.Tensor] | None:
        """The kept copy a member is restored from: theta copied to the CPU (the paper's) for fp32
        parameters; None when every parameter has a separate fp32 master (the master is the copy)."""
        if not self.mixed:
            return [p.detach().to("cpu", copy=True) for p in self.params]
        return [p.detach().to("cpu", copy=True) if m is p else None for m, p in zip(self.master, self.params)]

    def perturb(self, plan: StepPlan, k: int, i: int) -> None:
        t0 = time.perf_counter()
        for c in plan.partition[k]:
            chunk = self.chunks[c]
            compute = self._flat(self.params, chunk)
            eps = self.noise(plan.seeds[k][i], chunk)
            if self.master[chunk.tensor] is self.params[chunk.tensor]:
                compute.add_(eps.to(compute.dtype), alpha=plan.sigma_k)
            else:  # theta + sigma eps in fp32, rounded once to the compute dtype
                compute.copy_(self._flat(self.master, chunk).to(eps.device).add(eps, alpha=plan.sigma_k))
        self.perturb_s += time.perf_counter() - t0

    def restore(self, plan: StepPlan, k: int, i: int, backup: list[torch.Tensor | None] | None) -> None:
        t0 = time.perf_counter()
        for c in plan.partition[k]:
            chunk = self.chunks[c]
            flat = self._flat(self.params, chunk)
            if self.master[chunk.tensor] is not self.params[chunk.tensor]:
                flat.copy_(self._flat(self.master, chunk))  # exact: compute = round(master)
            elif backup is not None:
                flat.copy_(backup[chunk.tensor].view(-1)[chunk.start:chunk.stop])
            else:
                flat.sub_(self.noise(plan.seeds[k][i], chunk), alpha=plan.sigma_k)
        self.perturb_s += time.perf_counter() - t0

    def member_weights(self, plan: StepPlan, members: Sequence[tuple[int, int]]) -> dict[int, torch.Tensor]:
        """Stacked full parameter copies, one per member, keyed by id of the model's Parameter
        (what the patched modules of the population-batched backend look up)."""
        stacked = [m.detach().to(p.device).unsqueeze(0).repeat(len(members), *([1] * m.dim()))
                   for m, p in zip(self.master, self.params)]
        for g, (k, i) in enumerate(members):
            for c in plan.partition[k]:
                chunk = self.chunks[c]
                stacked[chunk.tensor][g].view(-1)[chunk.start:chunk.stop].add_(
                    self.noise(plan.seeds[k][i], chunk), alpha=plan.sigma_k)
        stacked = [s.to(p.dtype) for s, p in zip(stacked, self.params)]
        return {id(param_obj): s for param_obj, s in zip(self.model.parameters(), stacked)}

    # ------------------------------------------------------------------ z-score and update
    def standardize(self, rewards: np.ndarray) -> np.ndarray:
        """Joint (paper) or per-subspace z-scores with the population std; zeros where std is 0."""
        rewards = np.asarray(rewards, dtype=np.float64)
        groups = [rewards] if self.config.zscore == "joint" else list(rewards)
        out = []
        for group in groups:
            mean, std = group.mean(), group.std()  # population std (1/N)
            if std <= 1e-12 * max(1.0, abs(mean)):
                out.append(np.zeros_like(group))
            else:
                out.append((group - mean) / std)
        return out[0] if self.config.zscore == "joint" else np.stack(out)

    def update(self, plan: StepPlan, rhat: np.ndarray) -> list[float]:
        """theta += alpha * sum_k P_k g_k on the fp32 master, chunk by chunk, then the compute
        weights are refreshed from it; returns ||alpha P_k g_k|| per subspace."""
        alpha, norms = self.config.alpha, []
        for k, chunk_ids in enumerate(plan.partition):
            n_k = len(plan.seeds[k])
            sq = 0.0
            if not np.any(rhat[k]):
                norms.append(0.0)
                continue
            for c in chunk_ids:
                chunk = self.chunks[c]
                master = self.master[chunk.tensor]
                g = torch.zeros(chunk.size, device=self.params[chunk.tensor].device, dtype=torch.float32)
                for i in range(n_k):
                    if rhat[k][i] != 0.0:
                        g.add_(self.noise(plan.seeds[k][i], chunk), alpha=float(rhat[k][i]))
                step = g.mul_(alpha / n_k)
                sq += float(step.pow(2).sum())
                self._flat(self.master, chunk).add_(step.to(master.device))
                if master is not self.params[chunk.tensor]:
                    self._flat(self.params, chunk).copy_(self._flat(self.master, chunk))
            norms.append(math.sqrt(sq))
        return norms

    def master_state(self) -> list[torch.Tensor]:
        """The fp32 master weights, on the CPU (checkpoints and new replicas start from them)."""
        return [m.detach().to("cpu", torch.float32, copy=True) for m in self.master]


def check_rewards(rewards: np.ndarray) -> None:
    bad = np.argwhere(~np.isfinite(rewards))
    if len(bad):
        k, i = bad[0]
        raise ConfigError(
            f"fitness of member (k={k}, i={i}) is {rewards[k, i]!r}: rewards must be finite; the update "
            "was not applied (the model is unchanged)"
        )


# =========================================================================== objectives
class Objective(Protocol):
    """What ES optimises. ``fitness`` sees the model as it is (one member); ``population_fitness``
    (needed only by the batched backend) runs a batch of ``n_members`` x prompts, rows ordered
    member-major, calling ``row_hook(rows)`` before every forward."""

    def fitness(self, model: nn.Module, step: int) -> float: ...

    def population_fitness(self, model: nn.Module, step: int, n_members: int,
                           row_hook: Callable[[list[int]], None]) -> list[float]: ...

    def rows_per_member(self, step: int) -> int: ...

    def validate(self, model: nn.Module) -> dict[str, float]: ...


class QuadraticObjective:
    """Synthetic fitness -mean((theta - target)^2) for tests and benchmarks (sequential/ray only)."""

    def __init__(self, target: list[torch.Tensor]):
        self.target = target

    def fitness(self, model: nn.Module, step: int) -> float:
        sq = sum(float((p.detach() - t).pow(2).sum()) for p, t in zip(model.parameters(), self.target))
        return -sq / sum(t.numel() for t in self.target)

    def validate(self, model: nn.Module) -> dict[str, float]:
        return {"accuracy": self.fitness(model, 0)}


class _ToyModel(nn.Module):
    def __init__(self, shapes: Sequence[tuple[int, ...]]):
        super().__init__()
        self.tensors = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])


def toy_quadratic(seed: int = 0, shapes: Sequence[tuple[int, ...]] = ((16, 16), (16, 16), (16,))):
    """(model at 0, QuadraticObjective with a seeded N(0, 1) target): picklable for Ray workers."""
    gen = torch.Generator().manual_seed(seed)
    model = _ToyModel(shapes)
    return model, QuadraticObjective([torch.randn(s, generator=gen) for s in shapes])


# =========================================================================== backends
class SequentialBackend:
    """One member at a time, in place: perturb, evaluate, restore."""

    def evaluate(self, es: ES, plan: StepPlan, objective: Objective) -> np.ndarray:
        backup = es.backup() if es.config.restore == "backup" else None
        rewards = np.zeros((len(plan.seeds), len(plan.seeds[0])))
        for k, i in plan.members():
            es.perturb(plan, k, i)
            try:
                t0 = time.perf_counter()
                rewards[k, i] = objective.fitness(es.model, plan.step)
                es.fitness_s += time.perf_counter() - t0
            finally:
                es.restore(plan, k, i, backup)
        return rewards

    def after_update(self, es: ES, plan: StepPlan, rhat: np.ndarray) -> None:
        pass

    def close(self) -> None:
        pass


class BatchedBackend:
    """Members x prompts in one batched forward (``population.Population``), groups of G members."""

    def evaluate(self, es: ES, plan: StepPlan, objective: Objective) -> np.ndarray:
        from copes_lib.population import Population

        members = plan.members()
        group = es.config.members_per_batch or len(members)
        rewards = np.zeros((len(plan.seeds), len(plan.seeds[0])))
        for start in range(0, len(members), group):
            chunk = members[start:start + group]
            stacked = es.member_weights(plan, chunk)
            with Population(es.model, stacked, objective.rows_per_member(plan.step)) as pop:
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
        plan = self.es.plan(step, partition)
        backup = self.es.backup() if self.es.config.restore == "backup" else None
        out = []
        for k, i in members:
            self.es.perturb(plan, k, i)
            try:
                out.append(float(self.objective.fitness(self.model, step)))
            finally:
                self.es.restore(plan, k, i, backup)
        return out

    def update(self, step: int, partition: list[list[int]], rhat: list[list[float]]) -> float:
        self.es.update(self.es.plan(step, partition), np.asarray(rhat))
        return checksum(self.model)

    def master_state(self) -> list[torch.Tensor]:
        return self.es.master_state()


def checksum(model: nn.Module) -> float:
    """A cheap fingerprint of the weights (replicas compare it after every update)."""
    return float(sum(p.detach().double().sum() * (j + 1) for j, p in enumerate(model.parameters())))


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
            raise ConfigError("backend='ray' needs ray.init(...) first (e.g. es.ensure_ray(workers), which "
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


# =========================================================================== one step
def es_step(es: ES, step: int, objective: Objective, backend=None,
            partition: Sequence[Sequence[int]] | None = None) -> StepResult:
    """One synchronous ES/CoPES step (Algorithm 1). On bad input nothing is written to the model."""
    t0 = time.perf_counter()
    backend = backend or SequentialBackend()
    es.noise_s = es.fitness_s = 0.0
    plan = es.plan(step, partition)                              # 1. partition + member seeds
    t_roll = time.perf_counter()
    rewards = backend.evaluate(es, plan, objective)              # 2-3. evaluate every member
    rollout_s = time.perf_counter() - t_roll
    check_rewards(rewards)
    rhat = es.standardize(rewards)                               # 4. z-score (joint or per subspace)
    norms = es.update(plan, rhat)                                # 5. theta += alpha sum_k P_k g_k
    backend.after_update(es, plan, rhat)
    return StepResult(step, rewards, norms, math.sqrt(sum(n * n for n in norms)), rollout_s,
                      es.noise_s, time.perf_counter() - t0, es.fitness_s)


# =========================================================================== training loop
@dataclass
class TrainState:
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best_step: int = 0
    best_val: float = -math.inf


def train_es(model: nn.Module, objective: Objective, config: ESConfig, *, steps: int, val_every: int,
             run_dir: str | Path, worker_factory=None, on_step: Callable[[int, dict], None] | None = None,
             run=None, log_prefix: str = "es", resume: bool = True,
             base_validation: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Train ``model`` in place for ``steps`` ES/CoPES steps; returns one metrics row per step.

    Validation (``objective.validate``, temperature 0; the best checkpoint is selected on its
    ``score`` if it returns one, else its ``accuracy``) at step 0 and every ``val_every`` steps and at
    the end; the best validated weights go to ``run_dir/best.pt``; ``run_dir/state.pt`` is written
    after every step, and a rerun resumes from it (all randomness is a function of the step, so the
    resumed run is identical to an uninterrupted one). ``on_step(step, row)`` runs after each step's
    checkpoint. ``run`` (a ``runs.Run``) receives every row. Device-hours count step time only
    (validation excluded, as in docs/paper_a_copes.md#a5-gpu-hour-accounting). ``base_validation``: the starting model's
    ``objective.validate`` result when already known (runs from the same start share it).
    """
    from copes_lib import runs

    if steps < 0 or val_every < 1:
        raise ConfigError(f"train_es: steps = {steps} must be >= 0 and val_every = {val_every} >= 1")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    state_path, best_path = run_dir / "state.pt", run_dir / "best.pt"
    state = TrainState()
    saved = runs.load_checkpoint(state_path) if resume else None
    if saved is not None:
        if saved["config"] != config.to_dict():
            raise ConfigError(f"{state_path} was written with a different ESConfig; delete it or use "
                              "another run_dir")
        model.load_state_dict(saved["model"])
        state = TrainState(saved["step"], saved["history"], saved["best_step"], saved["best_val"])
    master = saved.get("master") if saved is not None else None

    def validate(step: int, known: dict[str, float] | None = None) -> dict[str, Any]:
        t0 = time.perf_counter()
        result = known if known is not None else objective.validate(model)
        row = {f"eval/val_{k}": float(v) for k, v in result.items()}
        row["time/val_s"] = time.perf_counter() - t0
        selected = row.get("eval/val_score", row["eval/val_accuracy"])
        if selected > state.best_val:
            state.best_val, state.best_step = selected, step
            runs.save_checkpoint(best_path, {"model": model.state_dict(), "step": step})
        return row

    es = ES(model, config, master=master)

    def checkpoint() -> None:
        # bf16/fp16 models: the fp32 master is saved too, so a resumed run continues from exact values
        runs.save_checkpoint(state_path, {"model": model.state_dict(), "step": state.step,
                                          "history": state.history, "best_step": state.best_step,
                                          "best_val": state.best_val, "config": config.to_dict(),
                                          **({"master": es.master_state()} if es.mixed else {})})

    if not state.history:
        row = {"step": 0, "time/device_hours": 0.0, **validate(0, base_validation)}
        state.history.append(row)
        if run is not None:
            run.log(0, {k: v for k, v in row.items() if k != "step"})
        checkpoint()

    backend = make_backend(es, worker_factory)
    try:
        while state.step < steps:
            step = state.step + 1
            result = es_step(es, step, objective, backend)
            hours = state.history[-1]["time/device_hours"] + result.step_s / 3600
            row = {"step": step, "reward/mean": float(result.rewards.mean()),
                   "reward/std": float(result.rewards.std()), "es/update_norm": result.update_norm,
                   **{f"es/update_norm_k{k}": n for k, n in enumerate(result.update_norms)},
                   **{f"reward/mean_k{k}": float(r.mean()) for k, r in enumerate(result.rewards)},
                   "time/step_s": result.step_s, "time/rollout_s": result.rollout_s,
                   "time/noise_s": result.noise_s, "time/fitness_s": result.fitness_s,
                   "time/device_hours": hours,
                   "mem/peak_gib": runs.peak_memory_gib(device)}
            if step % val_every == 0 or step == steps:
                row.update(validate(step))
            state.step = step
            state.history.append(row)
            checkpoint()
            if run is not None:
                run.log(step, {k: v for k, v in row.items() if k != "step"})
            if step % val_every == 0 or step == steps:
                runs.summary_line(log_prefix, step, {k: row[k] for k in ("reward/mean", "eval/val_accuracy")})
            if on_step is not None:
                on_step(step, row)
    finally:
        backend.close()
    return state.history


# =========================================================================== the agent objective
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
        rng = np.random.default_rng(mix_seed(self.batch_seed, step))
        return [self.train_tasks[j] for j in rng.choice(len(self.train_tasks), self.batch_size, replace=False)]

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

    def validate(self, model: nn.Module) -> dict[str, float]:
        from copes_lib.rollout import evaluate

        with torch.no_grad():
            result = evaluate(model, self.tokenizer, self.val_tasks, self.env, self.rollout_config, seed=0)
        # score: what checkpoints are selected on (math accuracy; QA F1, the paper's QA validation metric)
        out = {"score": result["score"], "mean_reward": result["mean_reward"],
               "accuracy": result.get("accuracy", result.get("acc"))}
        out.update({k: result[k] for k in ("f1", "em") if k in result})
        return {k: float(v) for k, v in out.items()}


def run_key(config: ESConfig, steps: int, val_every: int, key_extra: dict[str, Any]) -> str:
    from copes_lib import runs

    return runs.cache_key({"es": config.to_dict(), "steps": steps, "val_every": val_every, **key_extra})


def cached_es_run(profile: str, name: str, model: nn.Module, objective: Objective, config: ESConfig, *,
                  steps: int, val_every: int, key_extra: dict[str, Any], force: bool = False,
                  log_prefix: str = "es", **kw: Any) -> tuple[list[dict[str, Any]], Path]:
    """``train_es`` in ``cache/<profile>/<name>-<key>/``: a finished run is reused, an interrupted
    one resumes. ``model`` is trained in place (pass a copy); returns (history, run folder)."""
    import shutil

    from copes_lib import runs

    folder = runs.cache_dir(profile, name, run_key(config, steps, val_every, key_extra))
    if force:
        shutil.rmtree(folder)
        folder.mkdir(parents=True)
    history = train_es(model, objective, config, steps=steps, val_every=val_every, run_dir=folder,
                       log_prefix=log_prefix, **kw)
    runs.atomic_write_json(folder / "history.json", history)
    return history, folder


__all__ = ["ES", "ESConfig", "StepPlan", "StepResult", "Chunk", "Objective", "AgentObjective", "SequentialBackend",
           "BatchedBackend", "RayBackend", "es_step", "train_es", "cached_es_run", "run_key", "checksum",
           "mix_seed", "make_chunks", "random_partition", "check_partition"]
