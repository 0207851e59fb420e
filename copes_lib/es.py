"""Standard ES (Qiu et al. 2025) and CoPES (Algorithm 1): ONE code path; CoPES with K = 1 is ES.

One training step, read next to docs/paper_a_copes.md#a2-copes (Algorithm 1):

1. partition: a fresh random partition of all parameter CHUNKS into K subspaces S_1..S_K, drawn from
   the step's partition seed (``ES.plan``);
2. members: N_k = N / K per subspace, each with its own noise seed; sigma_k = sqrt(K) * sigma;
3. evaluate: member (k, i) is theta + sigma_k * P_k eps_{k,i}; every member answers the same prompt
   batch, fitness r_{k,i} = mean reward (``member_rewards`` or a backend of ``es_backends``; the model
   is restored after each);
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
- ``noise_rank = r > 0`` (not the paper's; EGGROLL's lever, docs/lowrank_es.md): member noise on every
  Linear / Embedding weight is A B^T / sqrt(r), other parameters are frozen, chunks are blocks of whole
  rows; ``ES.noise`` returns the dense noise of a chunk, so perturb / restore are the code above, and
  the update is the same sum done as one matmul per subspace and matrix (``copes_lib.lowrank``).
- "std == 0" is taken as std <= 1e-12 * max(1, |mean|): equal float rewards can give a tiny std.
- Backends: sequential (the model plus one chunk of noise; :func:`member_rewards`, here), and in
  ``copes_lib.es_backends`` population-batched (``population.py``: members x prompts in one forward)
  and Ray (workers hold replicas, get seeds, return scalars, and replay every update from the seeds).
  All give the same update for the same seeds.

Around the algorithm: ``copes_lib.es_backends`` (how members are evaluated), ``copes_lib.es_objective``
(what a member is scored on: the agent's mean reward, a toy quadratic) and ``copes_lib.es_training``
(the training loop, checkpoints and cached runs).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from copes_lib.config import Config, ConfigError, param
from copes_lib.lowrank import check_rank, dense_noise, factors, matrix_names, row_chunks
from copes_lib.sampling import mix_seed

_PARTITION_TAG = 0x5EED_0001
_MEMBER_TAG = 0x5EED_0002
_LOWRANK_TAG = 0x5EED_0003


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
    noise_rank: int = param(0, "0: full-rank noise (the paper's); r >= 1: low-rank noise A B^T / sqrt(r) on every "
                            "Linear/Embedding weight, other parameters frozen (EGGROLL; docs/lowrank_es.md)", ge=0)
    seed: int = param(33, "seed of noise and partitions (paper's ES runs: 33)", ge=0)

    def check(self) -> None:
        if self.noise_rank and self.backend == "ray":
            raise ConfigError(
                f"ESConfig.noise_rank = {self.noise_rank} with backend = 'ray': low-rank noise runs on the "
                "backends 'batched' (members on shared weights) or 'sequential' (the dense reference); valid "
                "noise_rank with 'ray': 0")
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

    def to_dict(self) -> dict:
        out = super().to_dict()
        if not out["noise_rank"]:  # full-rank runs keep their cache keys and resumable checkpoints
            del out["noise_rank"]
        return out

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
        self.lowrank: set[int] = set()  # indices of the low-rank perturbed matrices (noise_rank > 0)
        if config.noise_rank:
            check_rank(model, config.noise_rank)
            ids = matrix_names(model)
            self.lowrank = {j for j, p in enumerate(model.parameters()) if id(p) in ids}
            # chunks are blocks of whole rows of the matrices; every other parameter is frozen
            self.chunks = [Chunk(j, a, b) for j in sorted(self.lowrank)
                           for a, b in row_chunks(self.params[j].shape, config.chunk_size)]
        else:
            self.chunks = make_chunks(self.params, config.chunk_size)
        self._factor_cache: tuple[tuple, tuple[torch.Tensor, torch.Tensor]] | None = None
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
        if self.config.noise_rank:  # E = A B^T / sqrt(r) on the chunk's rows (copes_lib.lowrank)
            eps = dense_noise(*self.factors(seed, chunk.tensor), chunk.start, chunk.stop)
        else:
            gen = self._generator[device].manual_seed(mix_seed(seed, tensor_key, chunk.start))
            eps = torch.randn(chunk.size, generator=gen, device=device, dtype=torch.float32)
        self.noise_s += time.perf_counter() - t0
        return eps

    def factors(self, seed: int, tensor: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Low-rank mode: (A, B) of one member on matrix ``tensor`` (the last pair is kept: a member's
        chunks of one matrix are visited one after another)."""
        tensor_key = tensor if self.config.noise == "iid" else 0
        target = self.params[tensor]
        key = (seed, tensor_key, tuple(target.shape), target.device)
        if self._factor_cache is None or self._factor_cache[0] != key:
            if target.device not in self._generator:
                self._generator[target.device] = torch.Generator(device=target.device)
            self._factor_cache = (key, factors(mix_seed(seed, tensor_key, _LOWRANK_TAG), target.shape,
                                               self.config.noise_rank, target.device,
                                               self._generator[target.device]))
        return self._factor_cache[1]

    def member_factors(self, plan: StepPlan, members: Sequence[tuple[int, int]]
                       ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Low-rank mode: stacked factors (A (G, out, r), B (G, in, r)) of ``members`` per matrix,
        keyed by id of the model's Parameter, A's rows outside the member's subspace zeroed (what
        ``lowrank.LowRankPopulation`` reads). Memory: G (out + in) r per matrix, no weight copies."""
        t0 = time.perf_counter()
        rank, out = self.config.noise_rank, {}
        rows = [dict() for _ in plan.partition]  # rows[k][tensor]: row mask of subspace k
        for k, chunk_ids in enumerate(plan.partition):
            for c in chunk_ids:
                chunk = self.chunks[c]
                in_f = self.params[chunk.tensor].shape[1]
                mask = rows[k].setdefault(chunk.tensor, torch.zeros(self.params[chunk.tensor].shape[0],
                                                                    dtype=torch.bool))
                mask[chunk.start // in_f: chunk.stop // in_f] = True
        for param_obj, (j, p) in zip(self.model.parameters(), enumerate(self.params)):
            if j not in self.lowrank:
                continue
            a_stack = torch.empty(len(members), p.shape[0], rank, device=p.device)
            b_stack = torch.empty(len(members), p.shape[1], rank, device=p.device)
            key = j if self.config.noise == "iid" else 0
            gen = self._generator.setdefault(p.device, torch.Generator(device=p.device))
            for g, (k, i) in enumerate(members):
                if j not in rows[k]:  # this matrix has no rows in subspace k: A = 0
                    a_stack[g].zero_()
                    b_stack[g].zero_()
                    continue
                # the same stream as self.factors, written in place
                factors(mix_seed(plan.seeds[k][i], key, _LOWRANK_TAG), p.shape, rank, p.device, gen,
                        out=(a_stack[g], b_stack[g]))
                if not bool(rows[k][j].all()):
                    a_stack[g][~rows[k][j].to(p.device)] = 0.0
            out[id(param_obj)] = (a_stack, b_stack)
        self.noise_s += time.perf_counter() - t0
        return out

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
        if self.config.noise_rank:
            return self._update_lowrank(plan, rhat)
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

    def _update_lowrank(self, plan: StepPlan, rhat: np.ndarray) -> list[float]:
        """The same update for low-rank noise: per subspace and matrix, sum_i r_hat_i A_i B_i^T / sqrt(r)
        on the subspace's rows as ONE matmul, [r_hat_i A_i] (rows x N r) @ [B_i]^T (N r x in): a full-rank
        step from N rank-r terms, added to the fp32 master (members' factors regenerated once each)."""
        alpha, rank, norms = self.config.alpha, self.config.noise_rank, []
        for k, chunk_ids in enumerate(plan.partition):
            n_k = len(plan.seeds[k])
            active = [i for i in range(n_k) if rhat[k][i] != 0.0]
            if not active:
                norms.append(0.0)
                continue
            rows: dict[int, list[int]] = {}
            for c in chunk_ids:
                chunk = self.chunks[c]
                in_f = self.params[chunk.tensor].shape[1]
                rows.setdefault(chunk.tensor, []).extend(range(chunk.start // in_f, chunk.stop // in_f))
            sq = 0.0
            for j, row_ids in rows.items():
                param, master = self.params[j], self.master[j]
                index = torch.as_tensor(row_ids, device=param.device)
                a_parts, b_parts = [], []
                t0 = time.perf_counter()
                for i in active:
                    a, b = self.factors(plan.seeds[k][i], j)
                    a_parts.append(a[index] * float(rhat[k][i]))
                    b_parts.append(b)
                self.noise_s += time.perf_counter() - t0
                step = (torch.cat(a_parts, 1) @ torch.cat(b_parts, 1).T).mul_(alpha / (n_k * math.sqrt(rank)))
                sq += float(step.pow(2).sum())
                master.index_add_(0, index.to(master.device), step.to(master.device))
                if master is not param:
                    param[index] = master[index.to(master.device)].to(param.device, param.dtype)
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

    def validate(self, model: nn.Module) -> dict[str, Any]:
        """Mean validation metrics (floats; ``score`` is what checkpoints are selected on) and optionally
        :data:`PER_PROBLEM`, a list of per-problem scores (recorded beside the run, not logged)."""
        ...


PER_PROBLEM = "per_problem"  # validate()'s optional per-problem scores (es_training.VAL_SCORES)


# =========================================================================== one step
def evaluate_members(es: ES, plan: StepPlan, members: Sequence[tuple[int, int]],
                     fitness: Callable[[nn.Module, int], float]) -> list[float]:
    """Members one at a time, in place: perturb, ``fitness(model, step)``, restore (the one sequential
    member loop; the Ray workers run it on their replicas)."""
    backup = es.backup() if es.config.restore == "backup" else None
    out = []
    for k, i in members:
        es.perturb(plan, k, i)
        try:
            t0 = time.perf_counter()
            out.append(float(fitness(es.model, plan.step)))
            es.fitness_s += time.perf_counter() - t0
        finally:
            es.restore(plan, k, i, backup)
    return out


def member_rewards(es: ES, plan: StepPlan, objective: Objective) -> np.ndarray:
    """r_{k,i} of every member, (K, N_k), evaluated sequentially (:func:`evaluate_members`)."""
    values = evaluate_members(es, plan, plan.members(), objective.fitness)
    return np.asarray(values, dtype=np.float64).reshape(len(plan.seeds), len(plan.seeds[0]))


def es_step(es: ES, step: int, objective: Objective, backend=None,
            partition: Sequence[Sequence[int]] | None = None) -> StepResult:
    """One synchronous ES/CoPES step (Algorithm 1). On bad input nothing is written to the model.
    ``backend``: one of ``copes_lib.es_backends`` (None: members one at a time, in this process)."""
    t0 = time.perf_counter()
    es.noise_s = es.fitness_s = 0.0
    plan = es.plan(step, partition)                              # 1. partition + member seeds
    t_roll = time.perf_counter()
    rewards = (member_rewards(es, plan, objective) if backend is None  # 2-3. evaluate every member
               else backend.evaluate(es, plan, objective))
    rollout_s = time.perf_counter() - t_roll
    check_rewards(rewards)
    rhat = es.standardize(rewards)                               # 4. z-score (joint or per subspace)
    norms = es.update(plan, rhat)                                # 5. theta += alpha sum_k P_k g_k
    if backend is not None:
        backend.after_update(es, plan, rhat)                     # (Ray: the replicas replay it)
    return StepResult(step, rewards, norms, math.sqrt(sum(n * n for n in norms)), rollout_s,
                      es.noise_s, time.perf_counter() - t0, es.fitness_s)


def checksum(model: nn.Module) -> float:
    """A cheap fingerprint of the weights (replicas compare it after every update; caches key on it)."""
    return float(sum(p.detach().double().sum() * (j + 1) for j, p in enumerate(model.parameters())))


__all__ = ["ES", "ESConfig", "StepPlan", "StepResult", "Chunk", "Objective", "es_step", "evaluate_members",
           "member_rewards", "check_rewards", "checksum", "mix_seed", "make_chunks", "random_partition",
           "check_partition"]
