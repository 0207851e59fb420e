"""Measured memory and compute of paper A: memory scaling measured on our substrate against the analytic
model (:mod:`copes_lib.memory_model`), and device-hour accounting (Section A5 / Table 1), timing
the suite's own engines (``es.ES``, ``grpo.grpo_update``), so the steps timed are the steps trained.

Departures from the paper
-------------------------
* The measured scaling runs on our small Qwen3 substrate in fp32 (CPU: live tensor bytes counted by a
  dispatch-mode tracker, deterministic and allocator-free; CUDA: ``torch.cuda.max_memory_allocated``).
  The ES step is ``es.ES``'s: one member perturbed chunk by chunk from its seed, a greedy generation
  with a KV cache, and the restore by subtracting the regenerated noise (the paper restores from a
  CPU-RAM backup, off the device). The GRPO step is the suite's loss (``grpo.completion_logprobs`` +
  ``grpo.grpo_loss``, the clip range of ``GRPOConfig``) with fixed per-sequence advantages,
  gradient clipping and AdamW (the second step is measured, so the Adam moments are live), without
  a reference model; LoRA is a minimal local adapter (:func:`add_lora`, the same tensors as peft's,
  to keep peft's import out of the smoke run).
* Device-hour accounting (:func:`measure_agent_step_costs`) times one ES step and one GRPO step of
  the suite's agent (``copes_lib.rollout.rollout``, real tool calls and reward) split into rollout,
  tool, reward and update, through the engines themselves: ``es.es_step`` (sequential backend) and
  ``grpo.group_advantages`` + ``grpo.grpo_update`` with a ``GRPOConfig`` (reference model included
  when ``kl_coef > 0``). :func:`measure_step_costs` is the fallback on a random model: ``generate``
  rollouts, one distinct trusted snippet per trajectory through the sandbox, an exact-match reward,
  and the same engine updates. Extrapolation is the paper's: mean per-step cost x steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
import weakref
from typing import Any

from copes_lib import runs
from copes_lib.config import Config, ConfigError, param
from copes_lib.memory_model import (
    METHODS,
    ModelDescription,
    activation_bytes_per_token,
    kv_bytes_per_token,
    lora_adapter_params,
    parameter_count,
    prefill_transient_bytes_per_token,
)

# Bump when a measurement function changes what it measures: it is part of the notebook's cache keys.
MEASUREMENT_VERSION = 4
PAPER_GPU_HOURS_PER_STEP = {"es_class": 68.65 / 16, "grpo_class": 78.61 / 16}
PAPER_STEP_COUNTS = {  # (method, class, steps, Table 1 GPU-hours)
    "full GRPO (best)": ("grpo_class", 16, 78.61),
    "LoRA-GRPO @16": ("grpo_class", 16, 78.61),
    "LoRA-GRPO (best)": ("grpo_class", 64, 314.45),
    "standard ES @16": ("es_class", 16, 68.65),
    "CoPES @16": ("es_class", 16, 68.65),
    "standard ES to match CoPES": ("es_class", 48, None),
    "standard ES (best)": ("es_class", 112, 480.60),
}


# ----------------------------------------------------------------------------- measurement
class LiveTensorBytes:
    """Counts the bytes of live CPU tensor storages and their peak, via a TorchDispatchMode.

    Every op output's storage is registered once and released through a weakref finalizer, so the
    count is allocator-free and deterministic (unlike RSS). Tensors created before entering (the
    model's parameters) are registered with :meth:`track_existing`.
    """

    def __init__(self, device_type: str | None = "cpu") -> None:
        """``device_type``: count storages on this device type only (None: every device)."""
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for item in tree_flatten(out)[0]:
                    if isinstance(item, torch.Tensor):
                        tracker._track(item)
                return out

        self._mode = _Mode()
        self.device_type = device_type
        self._live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _track(self, tensor: Any) -> None:
        if self.device_type is not None and tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._live:
            return
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def track_existing(self, tensors: Any) -> None:
        for tensor in tensors:
            self._track(tensor)

    def __enter__(self) -> LiveTensorBytes:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


@dataclasses.dataclass(frozen=True)
class SubstrateSizes(Config):
    """A small Qwen3 model for measurements (fp32)."""

    layers: int = param(4, "decoder layers", gt=0)
    hidden: int = param(256, "hidden size", gt=0)
    heads: int = param(4, "query heads", gt=0)
    kv_heads: int = param(2, "KV heads", gt=0)
    head_dim: int = param(64, "head dimension", gt=0)
    intermediate: int = param(768, "MLP intermediate size", gt=0)
    vocab: int = param(4096, "vocabulary size", gt=0)
    tie_embeddings: bool = param(True, "tied input/output embeddings (as in the suite's substrate)")

    def check(self) -> None:
        if self.heads % self.kv_heads:
            raise ConfigError(f"SubstrateSizes.kv_heads = {self.kv_heads} must divide heads = {self.heads}")

    def description(self) -> ModelDescription:
        desc = ModelDescription(
            name="substrate", params=1, kv_heads=self.kv_heads, head_dim=self.head_dim,
            full_attention_layers=self.layers, layers=self.layers, heads=self.heads, hidden=self.hidden,
            intermediate=self.intermediate, vocab=self.vocab, tie_embeddings=self.tie_embeddings,
            qk_norm=True, source="this suite's measurement model", derived="params")
        return dataclasses.replace(desc, params=parameter_count(desc))


def build_substrate_model(sizes: SubstrateSizes, seed: int, device: str = "cpu") -> Any:
    """A seeded fp32 Qwen3ForCausalLM of the given sizes (sdpa attention)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads, num_key_value_heads=sizes.kv_heads,
        head_dim=sizes.head_dim, tie_word_embeddings=sizes.tie_embeddings, max_position_embeddings=1 << 16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}, attn_implementation="sdpa",
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).to(device=device, dtype=torch.float32).eval()


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def add_lora(model: Any, rank: int, alpha: float | None = None) -> int:
    """Freeze ``model`` and add rank-``rank`` adapters (A: r x in, Kaiming-uniform; B: out x r, zeros)
    to every linear layer named in :data:`LORA_TARGETS`, as peft's LoraConfig(target_modules=...) does.
    A minimal local equivalent so the measurement does not import peft. Returns the adapter count."""
    import torch
    from torch import nn

    scale = (alpha if alpha is not None else 2 * rank) / rank

    class _LoRA(nn.Module):
        def __init__(self, base: nn.Linear) -> None:
            super().__init__()
            self.base = base
            self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
            self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
            nn.init.kaiming_uniform_(self.lora_a, a=5**0.5)

        def forward(self, x: Any) -> Any:
            return self.base(x) + scale * nn.functional.linear(nn.functional.linear(x, self.lora_a), self.lora_b)

    for p in model.parameters():
        p.requires_grad_(False)
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS]
    for name, module in targets:
        parent_name, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent_name), child, _LoRA(module))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _es_member_step(model: Any, input_ids: Any, new_tokens: int, sigma: float, seed: int) -> None:
    """One ES member as ``es.ES`` runs it: perturb chunk by chunk from the member's seed, generate
    greedily with a KV cache, restore by subtracting the regenerated noise."""
    import torch

    from copes_lib.es import ES, ESConfig

    es = ES(model, ESConfig(population=2, subspaces=1, sigma=sigma, restore="subtract", seed=seed))
    plan = es.plan(0)
    with torch.no_grad():
        es.perturb(plan, 0, 0)
        try:
            model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                           use_cache=True)
        finally:
            es.restore(plan, 0, 0, None)


def _whole_sequence_batch(input_ids: Any) -> Any:
    """Every token but the first is a model-written completion token (one prompt token per row)."""
    import torch

    from copes_lib.grpo import PackedBatch

    n, width = input_ids.shape
    positions = torch.arange(width, device=input_ids.device).expand(n, width)
    return PackedBatch(input_ids, torch.ones_like(input_ids), positions,
                       torch.ones((n, width - 1), device=input_ids.device), 1)


def _grpo_loss_step(model: Any, input_ids: Any, optimizer: Any, advantages: Any = None, config: Any = None) -> None:
    """The GRPO loss of ``copes_lib.grpo`` (log-probs, clipped ratio, token-mean aggregation) on whole
    sequences with per-sequence advantages (a fixed spread when None), gradient clip, AdamW step."""
    import torch

    from copes_lib.grpo import GRPOConfig, completion_logprobs, grpo_loss

    config = config or GRPOConfig(kl_coef=0.0)
    batch = _whole_sequence_batch(input_ids)
    if advantages is None:
        advantages = torch.linspace(-1.0, 1.0, input_ids.shape[0], device=input_ids.device)
    logps, _ = completion_logprobs(model, batch, config.temperature, amp_dtype=config.amp_dtype)
    loss, _ = grpo_loss(logps, logps.detach(), None, advantages, batch.completion_mask, config)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], config.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure_peak_bytes(method: str, sizes: SubstrateSizes, context_len: int, sequences: int, seed: int,
                       new_tokens: int = 4, lora_rank: int = 8, device: str = "cpu") -> dict[str, float]:
    """Peak device bytes of one step of ``method`` (es | full_grpo | lora_grpo) at ``context_len``
    tokens per sequence, weights included. CPU: live tensor bytes; CUDA: max_memory_allocated."""
    import torch

    if method not in METHODS:
        raise ConfigError(f"method = {method!r} is not valid; valid values: {list(METHODS)}")
    if context_len <= new_tokens:
        raise ConfigError(f"context_len = {context_len} must exceed new_tokens = {new_tokens}")
    cuda = runs.check_device(device).startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    model = build_substrate_model(sizes, seed, device)
    if method == "lora_grpo":
        add_lora(model, lora_rank)
    generator = torch.Generator().manual_seed(seed + 1)
    length = context_len - new_tokens if method == "es" else context_len
    input_ids = torch.randint(3, sizes.vocab, (sequences, length), generator=generator).to(device)
    optimizer, existing = None, list(model.parameters()) + list(model.buffers()) + [input_ids]
    if method != "es":
        # One untracked warm-up step first: AdamW allocates its moments lazily in the first step(),
        # after backward has freed the activations, so only from the second step on are the 16P bytes
        # and the activations live together (the steady state that Table S7 models).
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
        _grpo_loss_step(model, input_ids, optimizer)
        existing += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    tracker = LiveTensorBytes()
    tracker.track_existing(existing)
    with contextlib.nullcontext() if cuda else tracker:
        if method == "es":
            _es_member_step(model, input_ids, new_tokens, sigma=1e-3, seed=seed)
        else:
            _grpo_loss_step(model, input_ids, optimizer)
    peak = (torch.cuda.max_memory_allocated(device) - base) if cuda else tracker.peak
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if method != "es" else 0
    return {"peak_bytes": float(peak), "trainable_params": float(trainable)}


def predict_substrate_bytes(method: str, sizes: SubstrateSizes, context_len: int, sequences: int,
                            lora_rank: int = 8, es_prefill: bool = True) -> float:
    """The analytic model applied to the substrate in fp32 (no checkpointing), in bytes. For ES,
    ``es_prefill`` adds the unchunked prefill's transient activations to the paper-style weights + KV
    cache (that term was added after the first measurement showed the gap; it is derived, not fitted)."""
    desc = sizes.description()
    tokens = context_len * sequences
    if method == "es":
        prefill = prefill_transient_bytes_per_token(desc, 4) * tokens if es_prefill else 0.0
        return 4 * desc.params + kv_bytes_per_token(desc, 4) * tokens + prefill
    per_token = activation_bytes_per_token(desc, act_bytes=4, checkpointing=False)
    if method == "full_grpo":
        return 16 * desc.params + per_token * tokens
    if method == "lora_grpo":
        return 4 * desc.params + 16 * lora_adapter_params(desc, lora_rank) + per_token * tokens
    raise ConfigError(f"method = {method!r} is not valid; valid values: {list(METHODS)}")


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept)."""
    n = len(xs)
    if n < 2:
        raise ValueError("fit_line needs at least two points")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


# ----------------------------------------------------------------------------- device-hour accounting
PHASES = ("rollout", "tool", "reward", "update")
# fixed, trusted snippets, one distinct per call (the sandbox memoises identical code)
_TOOL_SNIPPET = "print(sum(range({})))"


def _run_tool_calls(count: int) -> tuple[str, float]:
    """(backend, seconds) of ``count`` fixed snippets through the suite's sandbox (started untimed: a
    one-off, not a step cost), or through one subprocess each when the sandbox is not available."""
    try:
        from copes_lib.tools.sandbox import PythonSandbox
    except ImportError:
        start = time.perf_counter()
        for i in range(count):
            subprocess.run([sys.executable, "-I", "-c", _TOOL_SNIPPET.format(i)], capture_output=True,
                           timeout=30, check=False)
        return "subprocess (sandbox not available)", time.perf_counter() - start
    with PythonSandbox() as sandbox:
        sandbox.run_many([_TOOL_SNIPPET.format(-1)])
        start = time.perf_counter()
        sandbox.run_many([_TOOL_SNIPPET.format(i) for i in range(count)])
        return "copes_lib.tools.sandbox", time.perf_counter() - start


@dataclasses.dataclass
class _TokenBatch:
    """What ``grpo.grpo_update`` reads of a rollout batch."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    model_mask: list[list[int]]


def measure_step_costs(method: str, sizes: SubstrateSizes, prompts: int, population: int, group: int,
                       prompt_len: int, new_tokens: int, seed: int, device: str = "cpu") -> dict[str, Any]:
    """Seconds per phase of one training step on the substrate (validation excluded).

    ES: ``population`` members x ``prompts`` greedy trajectories (``es.ES``: perturb, generate,
    restore), one tool call per trajectory, exact-match reward, ``es.ES.update``. GRPO: ``prompts`` x
    ``group`` sampled trajectories, one tool call each, reward, ``grpo.grpo_update`` (no reference).
    """
    import numpy as np
    import torch

    from copes_lib.es import ES, ESConfig
    from copes_lib.grpo import GRPOConfig, group_advantages, grpo_update

    if method not in ("es", "grpo"):
        raise ConfigError(f"method = {method!r} is not valid; valid values: ['es', 'grpo']")
    runs.check_device(device)
    model = build_substrate_model(sizes, seed, device)
    generator = torch.Generator().manual_seed(seed + 1)
    prompt_ids = torch.randint(3, sizes.vocab, (prompts, prompt_len), generator=generator).to(device)
    answers = [str(i) for i in range(prompts)]
    times = dict.fromkeys(PHASES, 0.0)
    sigma, alpha = 1e-3, 5e-4

    def generate(ids: Any, sample: bool) -> Any:
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=sample, temperature=1.0 if sample else None,
                              top_p=None, top_k=None, pad_token_id=0)

    def reward(sequences: Any, targets: list[str]) -> list[float]:
        texts = [" ".join(map(str, row.tolist())) for row in sequences]
        return [float(text.endswith(target)) for text, target in zip(texts, targets)]

    with torch.no_grad():
        generate(prompt_ids[:1], sample=False)  # untimed warm-up: first-call overheads are not step cost
        if method == "es":
            es = ES(model, ESConfig(population=population, subspaces=1, sigma=sigma, alpha=alpha, seed=seed))
            plan = es.plan(0)
            backup = es.backup()
            fitness = np.zeros((1, population))
            for k, i in plan.members():
                start = time.perf_counter()
                es.perturb(plan, k, i)
                sequences = generate(prompt_ids, sample=False)
                es.restore(plan, k, i, backup)
                times["rollout"] += time.perf_counter() - start
                start = time.perf_counter()
                fitness[k, i] = sum(reward(sequences, answers)) / prompts
                times["reward"] += time.perf_counter() - start
            trajectories = population * prompts
        else:
            start = time.perf_counter()
            torch.manual_seed(seed)
            sequences = generate(prompt_ids.repeat_interleave(group, dim=0), sample=True)
            times["rollout"] += time.perf_counter() - start
            start = time.perf_counter()
            rewards = reward(sequences, [a for a in answers for _ in range(group)])
            times["reward"] += time.perf_counter() - start
            trajectories = prompts * group
    tool_backend, times["tool"] = _run_tool_calls(trajectories)

    start = time.perf_counter()
    if method == "es":
        with torch.no_grad():
            es.update(plan, es.standardize(fitness))
    else:
        rows = sequences.tolist()
        batch = _TokenBatch([r[:prompt_len] for r in rows], [r[prompt_len:] for r in rows],
                            [[1] * (len(r) - prompt_len) for r in rows])
        config = GRPOConfig(group_size=group, prompt_batch_size=prompts, mini_batch_size=prompts,
                            micro_batch_size=prompts * group, lr=1e-6, kl_coef=0.0)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        grpo_update(model, optimizer, batch, group_advantages(torch.tensor(rewards), group), config, None, pad_id=0)
    times["update"] = time.perf_counter() - start
    return {"method": method, "trajectories": trajectories, "tool_backend": tool_backend,
            **{f"{phase}_s": times[phase] for phase in PHASES}, "step_s": sum(times.values())}


class _PhaseClock:
    """Times an AgentEnv's tool and reward calls by wrapping them on this one instance."""

    def __init__(self, env: Any) -> None:
        self.tool_s = 0.0
        self.reward_s = 0.0
        for name, field in (("run_python", "tool_s"), ("run_search", "tool_s"), ("reward", "reward_s"),
                            ("details", "reward_s")):
            setattr(env, name, self._timed(getattr(env, name), field))

    def _timed(self, fn: Any, field: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - start)
        return wrapper


class _AgentFitness:
    """An ES objective: a member's fitness is the mean reward of one rollout of ``tasks``."""

    def __init__(self, tokenizer: Any, env: Any, tasks: list[Any], config: Any, seed: int) -> None:
        self.tokenizer, self.env, self.tasks, self.config, self.seed = tokenizer, env, tasks, config, seed
        self.tool_calls: list[dict] = []

    def fitness(self, model: Any, step: int) -> float:
        from copes_lib.rollout import rollout

        batch = rollout(model, self.tokenizer, self.tasks, self.env, self.config, seed=self.seed)
        self.tool_calls += batch.tool_calls
        return sum(batch.rewards) / len(batch.rewards)


def measure_agent_step_costs(method: str, model: Any, tokenizer: Any, env: Any, tasks: list[Any],
                             rollout_config: Any, population: int, group: int, seed: int,
                             sigma: float = 1e-3, alpha: float = 5e-4, lr: float = 1e-6,
                             micro_batch: int = 8, kl_coef: float = 1e-3) -> dict[str, Any]:
    """Seconds per phase of one training step of the suite's agent (``copes_lib.rollout.rollout``
    with its real tool calls and reward), validation excluded, through the training engines.

    ES: ``es.es_step`` with the sequential backend: ``population`` members, each perturbed from its
    seed and rolled out greedily on ``tasks``, restored from the CPU backup, then the z-scored update.
    GRPO: each task ``group`` times at temperature 1, then ``grpo.group_advantages`` and
    ``grpo.grpo_update`` (one mini-batch, ``micro_batch`` trajectories per forward, the reference
    policy's log-probs when ``kl_coef > 0``). The model is left changed by the update. Tool time =
    the env's run_python/run_search; reward time = its reward/details; rollout = the rest.
    """
    import dataclasses as dc

    import torch

    from copes_lib.es import ES, ESConfig, es_step
    from copes_lib.es_backends import SequentialBackend
    from copes_lib.grpo import GRPOConfig, Reference, group_advantages, grpo_update
    from copes_lib.rollout import rollout

    if method not in ("es", "grpo"):
        raise ConfigError(f"method = {method!r} is not valid; valid values: ['es', 'grpo']")
    env.run_python(["print(0)"])  # untimed: start the sandbox workers (a one-off, not a step cost)
    if method == "es":
        objective = _AgentFitness(tokenizer, env, tasks, dc.replace(rollout_config, temperature=0.0), seed)
        es = ES(model, ESConfig(population=population, subspaces=1, sigma=sigma, alpha=alpha, seed=seed))
        clock = _PhaseClock(env)
        with torch.no_grad():
            result = es_step(es, 0, objective, SequentialBackend())
        rollout_total, update_s = result.rollout_s, result.step_s - result.rollout_s
        trajectories, calls = population * len(tasks), objective.tool_calls
    else:
        config = GRPOConfig(group_size=group, prompt_batch_size=len(tasks), mini_batch_size=len(tasks),
                            micro_batch_size=micro_batch, lr=lr, kl_coef=kl_coef, temperature=1.0)
        reference = Reference(model, use_lora=False, needed=kl_coef > 0)
        grouped = [t for t in tasks for _ in range(group)]
        clock = _PhaseClock(env)
        start = time.perf_counter()
        batch = rollout(model, tokenizer, grouped, env, dc.replace(rollout_config, temperature=1.0), seed=seed)
        rollout_total = time.perf_counter() - start
        trajectories, calls = len(grouped), batch.tool_calls
        start = time.perf_counter()
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                      weight_decay=config.weight_decay)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        grpo_update(model, optimizer, batch, group_advantages(torch.tensor(batch.rewards), group), config,
                    reference, pad_id=pad)
        model.eval()
        update_s = time.perf_counter() - start
    times = {"rollout": rollout_total - clock.tool_s - clock.reward_s, "tool": clock.tool_s,
             "reward": clock.reward_s, "update": update_s}
    return {"method": method, "trajectories": trajectories, "tool_backend": "agent rollout (copes_lib.rollout)",
            "python_calls": sum(c.get("python", 0) for c in calls), "search_calls": sum(c.get("search", 0) for c in calls),
            **{f"{phase}_s": times[phase] for phase in PHASES}, "step_s": sum(times.values())}


def paper_gpu_hours_table() -> list[dict[str, Any]]:
    """Table 1's GPU-hour column re-derived as (per-step cost of the class) x steps."""
    rows = []
    for method, (klass, steps, stated) in PAPER_STEP_COUNTS.items():
        derived = PAPER_GPU_HOURS_PER_STEP[klass] * steps
        rows.append({"method": method, "class": klass, "steps": steps,
                     "gpu_h_per_step": PAPER_GPU_HOURS_PER_STEP[klass], "derived_gpu_h": derived,
                     "table1_gpu_h": stated,
                     "difference_gpu_h": None if stated is None else derived - stated})
    return rows
