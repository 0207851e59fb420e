"""The analytic memory model of paper A: Table S7 (memory vs context length, Fig. 2) and the hardware
feasibility of Table 2, from a :class:`ModelDescription` of the model.

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
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from copes_lib.config import REPO_ROOT, Config, ConfigError, param

GIB = 2**30
MODEL_CONFIG_DIR = REPO_ROOT / "data" / "model_configs"

# The paper's assumptions (docs/paper_a_copes.md#a5-gpu-hour-accounting/A6), kept apart from what is derived.
PAPER_ACTIVATION_GIB_PER_1K = 3.0  # full and LoRA GRPO per-token term, "rounded low"
PAPER_LORA_INTERCEPT_GIB = 18.55  # Table S7 LoRA-GRPO intercept (not derivable from stated facts)
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
    """Derived estimate of the per-token training memory of a Llama/Qwen-style decoder as transformers
    implements it (an estimate, not the paper's term).

    Logits: ``logits_copies`` fp32 vectors of the vocabulary (log-softmax, its gradient, the gather's
    gradient). Without checkpointing each layer keeps what its backward needs: per RMSNorm its input,
    its normalised input (before the weight) and its output (2 norms: 6h); q and the attention output
    and, for k, v, the rotated k and v (2 a d + 2 kv d); with Qwen3's per-head q/k norms also the
    projections' outputs and the norms' normalised values (+2 a d + 2 kv d); the MLP's gate, up,
    act(gate) and product (4 I). Once per token, not per layer: the rotary cos and sin (2 d), the
    final norm's input, normalised value and output (3h). With full checkpointing only each layer's
    input (h) is kept, plus one layer recomputed. The norm intermediates, q/k norms, rotary tensors
    and the final norm were missing until a measurement on the substrate read 1.40x this estimate
    (tests/test_memory_grpo_dry_run.py).
    """
    desc._require_dense("activation_bytes_per_token")
    h, d, a, kv, inter = desc.hidden, desc.head_dim, desc.heads, desc.kv_heads, desc.intermediate
    qk_norm = 2 if desc.qk_norm else 0
    per_layer = 6 * h + (2 + qk_norm) * a * d + (2 + qk_norm) * kv * d + 4 * inter
    layers = (desc.layers * h + per_layer) if checkpointing else desc.layers * per_layer
    once = 3 * h + 2 * d
    return act_bytes * (layers + once) + logits_copies * 4 * desc.vocab


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
