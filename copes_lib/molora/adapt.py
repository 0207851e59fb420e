"""Training one cell of paper B's system: pool + router on the frozen substrate, optionally evolving.

One adapter step: a balanced batch (equal sequences per domain) -> router features (R0: embedding
prefix means; R1: a first, adapter-free pass) -> mixing weights -> the substrate with the pool's
mixed LoRA updates -> next-token cross-entropy -> AdamW on the pool and the router (separate
learning rates; one Adam step counter per slot, so slots reborn by the lifecycle restart Adam).
Every ``evolve_every`` steps (when the lifecycle is on) the fitness of each slot is measured on
validation windows (scope E0 or E1) and one lifecycle event runs.
At the end the balanced log-PPL on the fixed test windows (equally many per domain) and each
window's NLL are the cell's result.

The data order depends only on ``seed`` (its own generator), so cells with the same seed see the
same batches: contrasts between cells are paired. Departures: the paper's 25,000 steps per cell is
the gpu profile; the cpu profile runs a few hundred (stated in notebooks 11-12).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from copes_lib.config import Config, ConfigError, param
from copes_lib.molora import fitness, lifecycle, metrics
from copes_lib.molora.lm import Substrate, eval_windows, lm_loss, sample_batch, window_nll
from copes_lib.molora.pool import AdapterPool, PoolConfig
from copes_lib.molora.routers import RouterConfig, make_router, router_rows
from copes_lib.molora.slot_adam import SlotAdamW


@dataclasses.dataclass(frozen=True)
class CellConfig(Config):
    """One cell: router (R), fitness scope (E), lifecycle (L), and the shared training settings."""

    pool: PoolConfig = param(PoolConfig(), "adapter pool shape")
    router: RouterConfig = param(RouterConfig(), "router kind (R0/R1) and knobs")
    scope: str = param("e0", "fitness scope: e0 global leave-one-out, e1 per-domain", choices=fitness.SCOPES)
    use_lifecycle: bool = param(False, "run the lifecycle (death, inheritance, mutation, reallocation)")
    life: lifecycle.LifecycleConfig = param(lifecycle.LifecycleConfig(), "lifecycle knobs")
    steps: int = param(400, "adapter steps (paper: 25,000)", ge=1)
    lr: float = param(1e-3, "AdamW learning rate of the adapter pool", gt=0)
    router_lr: float = param(1e-3, "AdamW learning rate of the router", gt=0)
    batch_per_domain: int = param(4, "sequences per domain per batch", ge=1)
    evolve_every: int = param(50, "M: adapter steps between evolution events", ge=1)
    fitness_windows: int = param(4, "validation windows per domain for leave-one-out fitness", ge=1)
    eval_windows: int = param(64, "test windows per domain for the final balanced log-PPL", ge=1)
    log_every: int = param(25, "steps between gate-share records", ge=1)
    seed: int = param(0, "seed of the pool/router initialisation, data order and lifecycle noise", ge=0)

    def check(self) -> None:
        if self.use_lifecycle:
            self.life.check_slots(self.pool.n_slots)

    @property
    def label(self) -> str:
        return f"{self.router.kind.upper()}/{self.scope.upper()}/{'L' if self.use_lifecycle else 'noL'}"

    def effective(self) -> CellConfig:
        """The computation actually run: without the lifecycle, scope and lifecycle knobs are inert.

        They are reset to their defaults so equal computations share one cache entry.
        """
        if self.use_lifecycle:
            return self
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return dataclasses.replace(self, scope="e0", life=defaults["life"], evolve_every=defaults["evolve_every"],
                                   fitness_windows=defaults["fitness_windows"])


def cell_from_dict(values: dict) -> CellConfig:
    values = dict(values)
    values["pool"] = PoolConfig(**values["pool"])
    values["router"] = RouterConfig(**values["router"])
    values["life"] = lifecycle.LifecycleConfig(**values["life"])
    return CellConfig(**values)


def train_cell(sub: Substrate, cfg: CellConfig, on_log=None) -> dict:
    """Train one cell from scratch on the frozen substrate; return a JSON-able result."""
    if sub.model.training or any(p.requires_grad for p in sub.model.parameters()):
        raise ConfigError("the substrate must be frozen (eval mode, requires_grad False)")
    model, domains = sub.model, sub.domains
    seq_len = sub.config.seq_len
    pool = AdapterPool(model, cfg.pool, seed=cfg.seed)
    router = make_router(cfg.router, model.config.hidden_size, cfg.pool.n_slots, seed=cfg.seed)
    device = next(model.parameters()).device
    router.to(device)
    optimizer = SlotAdamW([
        {"params": list(pool.parameters()), "lr": cfg.lr},
        {"params": list(router.parameters()), "lr": cfg.router_lr},
    ], slot_dims=[*pool.slot_parameters(), *router_rows(router)], weight_decay=0.0)
    data_gen = torch.Generator().manual_seed(10_000 + cfg.seed)
    life_gen = torch.Generator().manual_seed(20_000 + cfg.seed)
    val = eval_windows(sub.streams, "val", cfg.fitness_windows, seq_len)
    ages = torch.zeros(cfg.pool.n_slots, dtype=torch.long)
    history, events, t0 = [], [], time.perf_counter()
    window_mass, window_domains = [], []
    try:
        for step in range(cfg.steps):
            ids, dom = sample_batch(sub.streams, "train", cfg.batch_per_domain, seq_len, data_gen)
            ids = ids.to(device)
            inputs = ids[:, :-1]
            weights = router(router.features(model, pool, inputs), step)
            with pool.gated(weights):
                loss = lm_loss(model(input_ids=inputs).logits, ids[:, 1:]).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            ages += 1
            window_mass.append(router.gate_mass(weights.detach()).mean(dim=1).cpu())  # (B, S) per sequence
            window_domains.append(dom)
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                mass = torch.cat(window_mass)
                labels = torch.cat(window_domains)
                shares = metrics.gate_shares(mass)
                matrix = metrics.domain_slot_matrix(mass[:, None, :], labels, len(domains))
                row = {"step": step + 1, "train/loss": loss.item(),
                       "moe/monopoly_slots": metrics.monopoly_count(shares),
                       "moe/routing_entropy": metrics.routing_entropy(shares),
                       "moe/token_entropy": metrics.token_entropy(mass),
                       "moe/specialisation_mi": metrics.specialisation(matrix),
                       "moe/total_weight": float(weights.detach().sum(-1).mean()),
                       "time/elapsed_s": time.perf_counter() - t0,
                       **{f"moe/expert_share_{i}": float(s) for i, s in enumerate(shares)}}
                history.append(row)
                window_mass, window_domains = [], []
                if on_log:
                    on_log(row)
            if cfg.use_lifecycle and (step + 1) % cfg.evolve_every == 0 and step + 1 < cfg.steps:
                drops = fitness.leave_one_out_drops(model, pool, router, val, step)
                fit = fitness.scope_fitness(drops, cfg.scope)
                events += lifecycle.evolve(pool, router, optimizer, fit, ages, step + 1, cfg.life, life_gen)
        result = evaluate_pool(sub, pool, router, cfg.steps, cfg.eval_windows)
    finally:
        pool.remove()
    result.update({"config": cfg.to_dict(), "label": cfg.label, "history": history, "events": events,
                   "wall_s": time.perf_counter() - t0})
    return result


@torch.no_grad()
def evaluate_pool(sub: Substrate, pool: AdapterPool, router, step: int, n_windows: int) -> dict:
    """Test balanced log-PPL, per-domain and per-window NLL, gate shares, monopoly count and the
    domain-by-slot matrix.

    Every domain is scored on the same number of test windows (the smallest domain's count, at most
    ``n_windows``), so ``window_nll`` (domain-major, fixed order) has a plain mean equal to the balanced
    log-PPL: the per-window scores notebook 12's claims test on."""
    test = eval_windows(sub.streams, "test", n_windows, sub.config.seq_len)
    per_domain = min(len(rows) for rows in test.values())
    test = {domain: rows[:per_domain] for domain, rows in test.items()}
    masses, labels = [], []

    device = next(sub.model.parameters()).device

    def forward(ids):
        ids = ids.to(device)
        weights = router(router.features(sub.model, pool, ids), step)
        masses.append(router.gate_mass(weights))
        with pool.gated(weights):
            return sub.model(input_ids=ids).logits

    windows = window_nll(forward, test)
    nll = {domain: sum(values) / len(values) for domain, values in windows.items()}
    for d, rows in enumerate(test.values()):
        labels += [d] * len(rows)
    mass = torch.cat(masses).cpu()
    shares = metrics.gate_shares(mass)
    matrix = metrics.domain_slot_matrix(mass, torch.tensor(labels), len(test))
    return {"test_nll": nll, "balanced_log_ppl": metrics.balanced_log_ppl(nll),
            "window_nll": [v for values in windows.values() for v in values], "windows_per_domain": per_domain,
            "shares": shares.tolist(), "monopoly_slots": metrics.monopoly_count(shares),
            "routing_entropy": metrics.routing_entropy(shares), "token_entropy": metrics.token_entropy(mass),
            "domain_slot": matrix.tolist(), "specialisation_mi": metrics.specialisation(matrix)}


def run_adapter_cell(profile: str, sub: Substrate, cfg: CellConfig, force: bool = False, on_log=None) -> dict:
    """``train_cell`` behind the run store's cache (``cache/<profile>/molora_cell-<key>/result.json``).

    The key covers the substrate's config and the cell's *effective* config, so a finished cell
    (of any notebook) is reused instantly and an interrupted factorial resumes at the next cell.
    """
    from copes_lib import runs

    effective = cfg.effective()
    # "optimizer" names the per-slot Adam restart, "evaluation" the per-window test NLLs (equal windows
    # per domain): cells cached before either are not reused
    key = runs.cache_key({"substrate": sub.config.to_dict(), "cell": effective.to_dict(),
                          "optimizer": "slot_adamw", "evaluation": "window_nll"})
    path = runs.cache_dir(profile, "molora_cell", key) / "result.json"
    return runs.cached(path, lambda: train_cell(sub, effective, on_log), force=force)
