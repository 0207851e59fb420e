"""Memory and compute budget of paper A: analytic memory (Table S7, Fig. 2), hardware feasibility
(Table 2), measured memory scaling, and device-hour accounting (Section A5 / Table 1).

The analytic model
------------------
Memory is ``M(L) = intercept + slope * L`` in GiB (2^30 bytes), L = context length in thousands of
tokens ("128K" is L = 128). Per method, from a :class:`ModelDescription` with P parameters:

* ES / CoPES (inference only): weights in bf16 (``2P`` bytes, derived) + the KV cache. KV bytes per
  token = ``2 (K and V) x full-attention layers x KV heads x head dim x 2 bytes`` (derived). Hybrid
  models (Qwen3.5) keep a KV cache only in their full-attention layers; the linear-attention layers'
  fixed-size recurrent state is ignored here, as in the paper. The CPU backup of the weights is not
  on the device.
* Full GRPO: fp32 weights + fp32 gradients + two fp32 Adam moments = ``16P`` bytes (derived) + a
  per-token activation/logits term. The paper ASSUMES ~3 GB per 1K tokens for Qwen3.5-4B ("rounded
  low"); it is not derived from the architecture, so it is an input here
  (:data:`PAPER_ACTIVATION_GIB_PER_1K`). :func:`activation_bytes_per_token` gives a rough derived
  estimate for dense architectures whose sizes are known (used for our substrate and other models).
* LoRA-GRPO: frozen base + adapter weights, gradients and Adam moments (16 bytes per adapter
  parameter) + the same per-token term. The paper's intercept 18.55 GiB is NOT stated in terms of
  the facts; :func:`implied_lora_adapter_params` inverts it. Read as an fp32 frozen base (4P = 17.36
  GiB) it implies ~80M adapter parameters at 16 B each (1.7% of P, the size of a rank-32 adapter on
  every linear layer of a 4B model: Qwen3-4B has 66M); read as a bf16 base (2P = 8.68 GiB) it would
  imply ~660M adapter parameters (14% of P), implausible at rank 32. So the paper's LoRA line assumes
  an fp32 frozen base.

Units: the paper's ES slope 0.032 "GB per 1K tokens" is 32 KiB x 1K tokens = 32 MiB written as
0.032 (MiB divided by 1000). The exact value is 0.03125 GiB per 1,024 tokens. ``convention="paper"``
reproduces the paper's arithmetic (12.78 GiB at 128K); ``"exact"`` gives 12.68 GiB.

Departures from the paper
-------------------------
* Multi-GPU feasibility (Table 2) is not specified in the paper beyond "with checkpointing and
  offload"; the sharding rules here are stated in :data:`SHARDING_RULES` and all are reported. Only
  ``zero3_sp_offload`` (every state in CPU RAM, the per-token term split over the GPUs) reproduces the
  paper's table, and then full GRPO needs exactly 48.0 GiB per GPU on 8x48: no headroom. Capacities
  are the nominal "24 GB" / "48 GB" read as GiB.
* The ES line leaves out the prefill's transient activations (one layer's hidden states and MLP
  intermediates for the whole prompt), which at our measured scale exceed the KV cache; chunked
  prefill bounds them, and the paper does not say whether it used it.
* The measured scaling runs on our small Qwen3 substrate in fp32 (CPU: live tensor bytes counted by a
  dispatch-mode tracker, deterministic and allocator-free; CUDA: ``torch.cuda.max_memory_allocated``).
  The GRPO step is a token-mean policy-gradient surrogate with fixed per-sequence advantages + AdamW
  (the second step is measured, so the Adam moments are live), without a reference model; LoRA is a
  minimal local adapter (:func:`add_lora`, the same tensors as peft's, to keep peft's import out of
  the smoke run); the ES step perturbs the weights tensor by tensor and generates with a KV cache.
* Device-hour accounting (:func:`measure_agent_step_costs`) times one ES step and one GRPO step of
  the suite's agent (``copes_lib.rollout.rollout``, real tool calls and reward) split into rollout,
  tool, reward and update, with plain local updates (seed-replayed ES update; clipped token-mean
  surrogate + AdamW) rather than the ES/GRPO engines' step functions, whose internals are not an
  agreed interface. :func:`measure_step_costs` is the fallback on a random model: ``generate``
  rollouts, one distinct trusted snippet per trajectory through the sandbox, an exact-match reward.
  Extrapolation is the paper's: mean per-step cost x steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from copes_lib.config import REPO_ROOT, Config, ConfigError, param

GIB = 2**30
# Bump when a measurement function changes what it measures: it is part of the notebook's cache keys.
MEASUREMENT_VERSION = 3
MODEL_CONFIG_DIR = REPO_ROOT / "data" / "model_configs"

# The paper's assumptions (PAPERS.md A5/A6), kept apart from what is derived.
PAPER_ACTIVATION_GIB_PER_1K = 3.0  # full and LoRA GRPO per-token term, "rounded low"
PAPER_LORA_INTERCEPT_GIB = 18.55  # Table S7 LoRA-GRPO intercept (not derivable from stated facts)
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
GPU_SETUPS = {"1x24": (1, 24.0), "1x48": (1, 48.0), "4x48": (4, 48.0), "8x48": (8, 48.0)}
METHODS = ("es", "full_grpo", "lora_grpo")


# ----------------------------------------------------------------------------- descriptions
@dataclasses.dataclass(frozen=True)
class ModelDescription(Config):
    """Architecture facts needed by the memory model. ``None`` = not known (not guessed)."""

    name: str = param("model", "architecture name")
    params: int = param(1, "total parameter count P", gt=0)
    kv_heads: int = param(1, "key/value heads of a full-attention layer", gt=0)
    head_dim: int = param(1, "attention head dimension", gt=0)
    full_attention_layers: int = param(1, "layers that keep a KV cache (all layers for dense models)", gt=0)
    layers: int | None = param(None, "decoder layers (None = not known)", gt=0)
    heads: int | None = param(None, "query heads (None = not known)", gt=0)
    hidden: int | None = param(None, "hidden size (None = not known)", gt=0)
    intermediate: int | None = param(None, "MLP intermediate size (None = not known)", gt=0)
    vocab: int | None = param(None, "vocabulary size (None = not known)", gt=0)
    tie_embeddings: bool = param(False, "input embedding shared with the output head")
    attention_bias: bool = param(False, "q/k/v projections carry biases (Qwen2)")
    qk_norm: bool = param(False, "per-head RMSNorm on q and k (Qwen3)")
    lora_adapter_params: int | None = param(
        None, "LoRA adapter parameter count if known; None = derive from the shapes", gt=0)
    source: str = param("", "where the numbers come from")
    derived: str = param("", "comma-separated fields computed here rather than transcribed")

    def check(self) -> None:
        if self.layers is not None and self.full_attention_layers > self.layers:
            raise ConfigError(f"ModelDescription.full_attention_layers = {self.full_attention_layers} must be "
                              f"<= layers = {self.layers}")
        if self.heads is not None and self.heads % self.kv_heads:
            raise ConfigError(f"ModelDescription.kv_heads = {self.kv_heads} must divide heads = {self.heads} "
                              "(grouped-query attention shares each KV head among heads/kv_heads queries)")

    @property
    def is_dense_known(self) -> bool:
        """All sizes needed to count parameters and estimate activations are known."""
        return None not in (self.layers, self.heads, self.hidden, self.intermediate, self.vocab)

    def _require_dense(self, what: str) -> None:
        if not self.is_dense_known:
            missing = [f for f in ("layers", "heads", "hidden", "intermediate", "vocab") if getattr(self, f) is None]
            raise ConfigError(f"{self.name}: {what} needs {missing}, which are not known for this description")


def load_model_description(name: str, directory: str | Path = MODEL_CONFIG_DIR) -> ModelDescription:
    """``data/model_configs/<name>.json`` as a checked :class:`ModelDescription` (keys starting with _
    are comments)."""
    path = Path(directory) / f"{name}.json"
    if not path.exists():
        valid = sorted(p.stem for p in Path(directory).glob("*.json"))
        raise ConfigError(f"unknown model description {name!r}; valid names: {valid}")
    data = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return ModelDescription(**data)


def model_description_names(directory: str | Path = MODEL_CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.json"))


def parameter_count(desc: ModelDescription) -> int:
    """Parameter count of a dense Llama/Qwen-style decoder (SwiGLU MLP, RMSNorm, GQA)."""
    desc._require_dense("parameter_count")
    h, d, a, kv = desc.hidden, desc.head_dim, desc.heads, desc.kv_heads
    attn = h * a * d + 2 * h * kv * d + a * d * h
    if desc.attention_bias:
        attn += a * d + 2 * kv * d
    mlp = 3 * h * desc.intermediate
    norms = 2 * h + (2 * d if desc.qk_norm else 0)
    embed = desc.vocab * h * (1 if desc.tie_embeddings else 2)
    return desc.layers * (attn + mlp + norms) + embed + h


def lora_adapter_params(desc: ModelDescription, rank: int) -> int:
    """LoRA parameters of rank ``rank`` on every linear layer of every decoder block (q, k, v, o,
    gate, up, down): r x (in + out) per matrix. Uses ``desc.lora_adapter_params`` when given."""
    if desc.lora_adapter_params is not None:
        return desc.lora_adapter_params
    desc._require_dense("lora_adapter_params")
    h, d, a, kv, inter = desc.hidden, desc.head_dim, desc.heads, desc.kv_heads, desc.intermediate
    per_layer = (h + a * d) + 2 * (h + kv * d) + (a * d + h) + 2 * (h + inter) + (inter + h)
    return rank * per_layer * desc.layers


# ----------------------------------------------------------------------------- analytic model
def kv_bytes_per_token(desc: ModelDescription, dtype_bytes: int = 2) -> int:
    """K and V of every full-attention layer: 2 x layers x KV heads x head dim x bytes (derived)."""
    return 2 * desc.full_attention_layers * desc.kv_heads * desc.head_dim * dtype_bytes


def activation_bytes_per_token(desc: ModelDescription, act_bytes: int = 2, checkpointing: bool = True,
                               logits_copies: int = 3) -> float:
    """Rough derived estimate of the per-token training memory (an estimate, not the paper's term).

    Logits: ``logits_copies`` fp32 vectors of the vocabulary (logits, log-softmax, its gradient).
    Without checkpointing each layer keeps what its backward needs: two norm inputs and outputs
    (4h), q/attention output and k, v (3 a d + 2 kv d), and the MLP's gate, up, act(gate) and product
    (4 I). With full checkpointing only each layer's input (h) is kept, plus one layer recomputed.
    """
    desc._require_dense("activation_bytes_per_token")
    h, d, a, kv, inter = desc.hidden, desc.head_dim, desc.heads, desc.kv_heads, desc.intermediate
    per_layer = 4 * h + 3 * a * d + 2 * kv * d + 4 * inter
    layers = (desc.layers * h + per_layer) if checkpointing else desc.layers * per_layer
    return act_bytes * layers + logits_copies * 4 * desc.vocab


def prefill_transient_bytes_per_token(desc: ModelDescription, act_bytes: int = 2) -> float:
    """Rough derived estimate of the transient memory per prompt token while one layer runs the prefill
    without gradients: residual, normed input and layer output (3h), q and attention output (2 a d),
    k and v (2 kv d), and the MLP's gate, up and product (3 I). Not in the paper's ES line; chunked
    prefill divides it by (prompt length / chunk length)."""
    desc._require_dense("prefill_transient_bytes_per_token")
    h, d, a, kv, inter = desc.hidden, desc.head_dim, desc.heads, desc.kv_heads, desc.intermediate
    return act_bytes * (3 * h + 2 * a * d + 2 * kv * d + 3 * inter)


@dataclasses.dataclass(frozen=True)
class MemoryLine:
    """M(L) = intercept_gib + slope_gib_per_k * L, with the parts that make it up (GiB)."""

    method: str
    intercept_gib: float
    slope_gib_per_k: float
    parts: dict[str, float]

    def at(self, context_k: float) -> float:
        return self.intercept_gib + self.slope_gib_per_k * context_k


def _per_k(bytes_per_token: float, convention: str) -> float:
    """GiB per "1K" tokens. exact: 1K = 1,024 tokens, GiB = 2^30; paper: MiB per 1,024 tokens / 1000."""
    if convention == "exact":
        return bytes_per_token * 1024 / GIB
    if convention == "paper":
        return bytes_per_token * 1024 / 2**20 / 1000
    raise ConfigError(f"convention = {convention!r} is not valid; valid values: ['exact', 'paper']")


def es_memory(desc: ModelDescription, weight_bytes: int = 2, kv_dtype_bytes: int = 2, sequences: int = 1,
              convention: str = "exact") -> MemoryLine:
    """ES / CoPES member evaluation: weights + KV cache of ``sequences`` sequences of length L."""
    weights = weight_bytes * desc.params / GIB
    slope = _per_k(kv_bytes_per_token(desc, kv_dtype_bytes) * sequences, convention)
    return MemoryLine("es", weights, slope, {"weights": weights})


def full_grpo_memory(desc: ModelDescription, activation_gib_per_1k: float,
                     state_bytes_per_param: int = 16) -> MemoryLine:
    """Full GRPO: fp32 weights + grads + 2 Adam moments (16P bytes) + per-token activation term."""
    states = state_bytes_per_param * desc.params / GIB
    return MemoryLine("full_grpo", states, activation_gib_per_1k, {"weights_grads_adam": states})


def lora_grpo_memory(desc: ModelDescription, activation_gib_per_1k: float, adapter_params: int,
                     base_bytes_per_param: int = 4, adapter_bytes_per_param: int = 16) -> MemoryLine:
    """LoRA-GRPO: frozen base (fp32 by default, see module docstring) + adapter weights, grads and Adam
    moments + per-token activation term."""
    base = base_bytes_per_param * desc.params / GIB
    adapters = adapter_bytes_per_param * adapter_params / GIB
    return MemoryLine("lora_grpo", base + adapters, activation_gib_per_1k,
                      {"frozen_base": base, "adapter_states": adapters})


def implied_lora_adapter_params(desc: ModelDescription, intercept_gib: float = PAPER_LORA_INTERCEPT_GIB,
                                base_bytes_per_param: int = 4, adapter_bytes_per_param: int = 16) -> float:
    """Adapter parameter count implied by a LoRA intercept under a given base precision."""
    return (intercept_gib * GIB - base_bytes_per_param * desc.params) / adapter_bytes_per_param


def paper_table_s7(desc: ModelDescription, convention: str = "paper") -> dict[str, MemoryLine]:
    """The three Table S7 lines for ``desc`` with the paper's assumptions (3 GiB/1K activations; the
    LoRA adapter count implied by 18.55 GiB unless the description or shapes give one)."""
    try:
        adapters = lora_adapter_params(desc, rank=32)
    except ConfigError:
        adapters = round(implied_lora_adapter_params(desc))
    return {
        "es": es_memory(desc, convention=convention),
        "full_grpo": full_grpo_memory(desc, PAPER_ACTIVATION_GIB_PER_1K),
        "lora_grpo": lora_grpo_memory(desc, PAPER_ACTIVATION_GIB_PER_1K, adapters),
    }


# ----------------------------------------------------------------------------- feasibility (Table 2)
SHARDING_RULES = {
    "replicated": "every GPU holds the whole M(L) (plain data parallel): per GPU = M(L)",
    "zero3_sp": "GRPO: weights, grads and Adam states sharded ZeRO-3/FSDP-style AND the per-token term "
                "split by sequence parallelism (Ulysses): per GPU = M(L) / n",
    "zero3_sp_offload": "as zero3_sp, with all parameter/gradient/optimizer states offloaded to CPU RAM: "
                        "per GPU = per-token term / n",
}
# ES never shards: each GPU evaluates whole population members (weights + one KV cache), so its
# per-GPU memory is M(L) under every rule.


def per_gpu_gib(line: MemoryLine, context_k: float, n_gpus: int, rule: str) -> float:
    if rule not in SHARDING_RULES:
        raise ConfigError(f"rule = {rule!r} is not valid; valid values: {list(SHARDING_RULES)}")
    if line.method == "es" or rule == "replicated":
        return line.at(context_k)
    if rule == "zero3_sp":
        return line.at(context_k) / n_gpus
    return line.slope_gib_per_k * context_k / n_gpus


def feasibility_table(lines: dict[str, MemoryLine], contexts_k: list[float], rule: str,
                      setups: dict[str, tuple[int, float]] = GPU_SETUPS) -> list[dict[str, Any]]:
    """Rows (method, context_k, total GiB, and per setup: per-GPU GiB and whether it fits)."""
    rows = []
    for method, line in lines.items():
        for context_k in contexts_k:
            row: dict[str, Any] = {"method": method, "context_k": context_k, "total_gib": line.at(context_k)}
            for setup, (n_gpus, capacity) in setups.items():
                need = per_gpu_gib(line, context_k, n_gpus, rule)
                row[f"{setup}_per_gpu_gib"] = need
                row[f"fits_{setup}"] = need <= capacity
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- measurement
class LiveTensorBytes:
    """Counts the bytes of live CPU tensor storages and their peak, via a TorchDispatchMode.

    Every op output's storage is registered once and released through a weakref finalizer, so the
    count is allocator-free and deterministic (unlike RSS). Tensors created before entering (the
    model's parameters) are registered with :meth:`track_existing`.
    """

    def __init__(self) -> None:
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
        self._live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _track(self, tensor: Any) -> None:
        if tensor.device.type != "cpu":
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


def _es_step(model: Any, input_ids: Any, new_tokens: int, sigma: float, seed: int) -> None:
    """Perturb tensor by tensor from a seed, generate greedily with a KV cache, restore."""
    import torch

    generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    with torch.no_grad():  # the paper restores from a CPU-RAM backup (off the device); we replay the noise
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, device=p.device) * sigma)
        model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, use_cache=True)
        generator.manual_seed(seed)
        for p in model.parameters():
            p.sub_(torch.randn(p.shape, generator=generator, device=p.device) * sigma)


def _grpo_step(model: Any, input_ids: Any, optimizer: Any, advantages: Any = None) -> None:
    """Token-mean policy-gradient surrogate (per-sequence advantages; a fixed spread when None),
    backward, AdamW step."""
    import torch

    logits = model(input_ids=input_ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    if advantages is None:
        advantages = torch.linspace(-1.0, 1.0, input_ids.shape[0], device=input_ids.device)
    advantages = advantages.reshape(-1, 1)
    loss = -(advantages * logp).mean()
    loss.backward()
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
    cuda = device.startswith("cuda")
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
        _grpo_step(model, input_ids, optimizer)
        existing += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    tracker = LiveTensorBytes()
    tracker.track_existing(existing)
    with contextlib.nullcontext() if cuda else tracker:
        if method == "es":
            _es_step(model, input_ids, new_tokens, sigma=1e-3, seed=seed)
        else:
            _grpo_step(model, input_ids, optimizer)
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


def measure_step_costs(method: str, sizes: SubstrateSizes, prompts: int, population: int, group: int,
                       prompt_len: int, new_tokens: int, seed: int, device: str = "cpu") -> dict[str, Any]:
    """Seconds per phase of one training step on the substrate (validation excluded).

    ES: ``population`` members x ``prompts`` greedy trajectories (perturb, generate, restore), one tool
    call per trajectory, exact-match reward, seed-replayed update. GRPO: ``prompts`` x ``group`` sampled
    trajectories, one tool call each, reward, one no-grad log-prob pass + policy-gradient backward + AdamW.
    """
    import torch

    if method not in ("es", "grpo"):
        raise ConfigError(f"method = {method!r} is not valid; valid values: ['es', 'grpo']")
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
            fitness = []
            for member in range(population):
                start = time.perf_counter()
                noise_gen = torch.Generator(device=device).manual_seed(seed * 1000 + member)
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=noise_gen, device=device) * sigma)
                sequences = generate(prompt_ids, sample=False)
                noise_gen.manual_seed(seed * 1000 + member)
                for p in model.parameters():
                    p.sub_(torch.randn(p.shape, generator=noise_gen, device=device) * sigma)
                times["rollout"] += time.perf_counter() - start
                start = time.perf_counter()
                fitness.append(sum(reward(sequences, answers)) / prompts)
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
            mean = sum(fitness) / population
            std = math.sqrt(sum((f - mean) ** 2 for f in fitness) / population)
            weights = [(f - mean) / std if std > 0 else 0.0 for f in fitness]
            for member, weight in enumerate(weights):  # seed replay: regenerate each member's noise
                noise_gen = torch.Generator(device=device).manual_seed(seed * 1000 + member)
                for p in model.parameters():
                    noise = torch.randn(p.shape, generator=noise_gen, device=device)
                    if weight:
                        p.add_(noise, alpha=alpha / population * weight)
    else:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        with torch.no_grad():
            old_logp = torch.log_softmax(model(input_ids=sequences).logits.float(), dim=-1)  # old-policy pass
            del old_logp
        grouped = torch.tensor(rewards, device=device).view(prompts, group)
        advantages = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
        _grpo_step(model, sequences, optimizer, advantages)  # zero advantages cost the same compute
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


def _replay_noise(model: Any, seed: int, scale: float) -> None:
    """theta += scale * eps(seed), tensor by tensor (eps regenerated from the seed, never stored)."""
    import torch

    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=torch.float32)
            p.add_(noise.to(p.dtype), alpha=scale)


def measure_agent_step_costs(method: str, model: Any, tokenizer: Any, env: Any, tasks: list[Any],
                             rollout_config: Any, population: int, group: int, seed: int,
                             sigma: float = 1e-3, alpha: float = 5e-4, lr: float = 1e-6,
                             micro_batch: int = 8) -> dict[str, Any]:
    """Seconds per phase of one training step of the suite's agent (``copes_lib.rollout.rollout``
    with its real tool calls and reward), validation excluded.

    ES: ``population`` members, each perturbed by seed replay and rolled out greedily on ``tasks``,
    restored by replaying the noise; update = standardized-fitness weighted sum of the replayed noise.
    GRPO: each task ``group`` times at temperature 1; update = one old-log-prob pass + a token-mean
    policy-gradient surrogate over the model-written tokens with group-normalised advantages + AdamW.
    The updates are plain local ones (the ES/GRPO engines' internals are not an agreed interface);
    the model is left changed by the update. Tool time = the env's run_python/run_search; reward time
    = its reward/details; rollout = the rest of the rollout call.
    """
    import dataclasses as dc

    import torch

    from copes_lib.rollout import rollout

    if method not in ("es", "grpo"):
        raise ConfigError(f"method = {method!r} is not valid; valid values: ['es', 'grpo']")
    env.run_python(["print(0)"])  # untimed: start the sandbox workers (a one-off, not a step cost)
    clock = _PhaseClock(env)
    rollout_total, update_s, calls = 0.0, 0.0, []
    if method == "es":
        config = dc.replace(rollout_config, temperature=0.0)
        fitness = []
        for member in range(population):
            start = time.perf_counter()
            _replay_noise(model, seed * 1000 + member, sigma)
            batch = rollout(model, tokenizer, tasks, env, config, seed=seed)
            _replay_noise(model, seed * 1000 + member, -sigma)
            rollout_total += time.perf_counter() - start
            fitness.append(sum(batch.rewards) / len(batch.rewards))
            calls += batch.tool_calls
        trajectories = population * len(tasks)
        start = time.perf_counter()
        mean = sum(fitness) / population
        std = math.sqrt(sum((f - mean) ** 2 for f in fitness) / population)
        for member, f in enumerate(fitness):  # replayed even at weight 0 (all-equal rewards): same cost
            weight = (f - mean) / std if std > 0 else 0.0
            _replay_noise(model, seed * 1000 + member, alpha / population * weight)
        update_s = time.perf_counter() - start
    else:
        config = dc.replace(rollout_config, temperature=1.0)
        grouped = [t for t in tasks for _ in range(group)]
        start = time.perf_counter()
        batch = rollout(model, tokenizer, grouped, env, config, seed=seed)
        rollout_total = time.perf_counter() - start
        trajectories = len(grouped)
        calls = batch.tool_calls
        start = time.perf_counter()
        device = next(model.parameters()).device
        rows = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
        width = max(len(r) for r in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        loss_mask = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, (p, c, m) in enumerate(zip(batch.prompt_ids, batch.completion_ids, batch.model_mask)):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            attention[i, :len(p) + len(c)] = 1
            loss_mask[i, len(p):len(p) + len(c)] = torch.tensor(m, dtype=torch.float32)
        ids, attention, loss_mask = ids.to(device), attention.to(device), loss_mask.to(device)
        rewards = torch.tensor(batch.rewards, dtype=torch.float32, device=device).view(len(tasks), group)
        advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        total_tokens = loss_mask[:, 1:].sum().clamp_min(1.0)

        def token_logp(rows: slice) -> Any:
            logits = model(input_ids=ids[rows], attention_mask=attention[rows]).logits[:, :-1].float()
            return torch.log_softmax(logits, -1).gather(-1, ids[rows, 1:, None]).squeeze(-1)

        for first in range(0, len(rows), micro_batch):  # gradient accumulation over micro-batches
            part = slice(first, first + micro_batch)
            with torch.no_grad():  # old-policy log-probs (the ratio's denominator)
                old_logp = token_logp(part)
            ratio = torch.exp(token_logp(part) - old_logp)
            surrogate = torch.minimum(ratio * advantages[part], ratio.clamp(0.8, 1.2) * advantages[part])
            (-(surrogate * loss_mask[part, 1:]).sum() / total_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
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
