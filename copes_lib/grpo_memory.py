"""Memory of one GRPO configuration: the analytic prediction per device, a fit check that runs
before anything loads, and the measured peak of the real update on the substrate (CPU).

The prediction applies notebook 08's analytic model (``copes_lib.budget``: parameter counts,
activation bytes per token, KV bytes per token) to what ``copes_lib.grpo`` / ``grpo_sharded``
actually keep in memory, term by term (bytes per device):

* trainable states: full = fp32 weights + grads + 2 AdamW moments (16 P); LoRA = the fp32 frozen
  base (4 P) + 16 bytes per adapter parameter; divided by the processes when FSDP-sharded, plus the
  gathered parameters of the root (embeddings, head) and two decoder layers in ``param_dtype``;
* reference policy: LoRA = none (the adapter-disabled base); full = a frozen copy (fp32 in one
  process, ``param_dtype`` and sharded under FSDP);
* rollout copy: with ``amp_dtype`` and ``rollout_copy``, one bf16 copy of the weights (one process);
* the larger of the two phases: the update (one micro-batch: activations per token x
  ``micro_batch_size`` x context tokens, with or without activation checkpointing, plus the logits:
  3 fp32 vocabulary vectors per token for the full-logits path, or per chunk token with
  ``logprob_chunk``, and then, when the head is trained, 2 head-sized gradients while backward sums
  the chunks' head gradients) and the rollout (KV cache of ``rollout_batch_size`` trajectories of the context
  length in the rollout dtype).

Departures: allocator fragmentation, autocast's transient bf16 weight copies, the prompt's
transient prefill activations and communication buffers are not modelled; the measured peak
counts live CPU tensor bytes (``budget.LiveTensorBytes``), not the allocator's reservation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from copes_lib.budget import LiveTensorBytes, SubstrateSizes, build_substrate_model
from copes_lib.config import ConfigError
from copes_lib.grpo import GRPOConfig
from copes_lib.memory_model import (
    GIB,
    ModelDescription,
    activation_bytes_per_token,
    kv_bytes_per_token,
    lora_adapter_params,
    parameter_count,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Predicted bytes per device of one GRPO configuration, by part (see the module docstring).
    ``phases`` holds both phase terms (``update``, ``rollout``); ``parts`` only the larger."""

    parts: dict[str, float]
    processes: int
    phases: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def total_bytes(self) -> float:
        return sum(self.parts.values())

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


def _layer_params(desc: ModelDescription) -> int:
    h, d, a, kv, inter = desc.hidden, desc.head_dim, desc.heads, desc.kv_heads, desc.intermediate
    return h * a * d + 2 * h * kv * d + a * d * h + 3 * h * inter + 2 * h + (2 * d if desc.qk_norm else 0)


def predict_grpo_memory(desc: ModelDescription, config: GRPOConfig, context_tokens: int, processes: int = 1,
                        sharded: bool = False, param_dtype: str = "float32",
                        activation_checkpointing: bool = False) -> MemoryPlan:
    """Bytes per device of ``config`` on the model ``desc`` (dense sizes known) with trajectories of
    ``context_tokens`` tokens (prompt + completion), on ``processes`` devices (FSDP when ``sharded``)."""
    if context_tokens < 1 or processes < 1:
        raise ConfigError(f"context_tokens = {context_tokens} and processes = {processes} must be >= 1")
    if param_dtype not in DTYPE_BYTES:
        raise ConfigError(f"param_dtype = {param_dtype!r} is not valid; valid values: {list(DTYPE_BYTES)}")
    n = processes if sharded else 1
    params = parameter_count(desc) if desc.is_dense_known else desc.params
    compute_bytes = DTYPE_BYTES[param_dtype] if sharded else (4 if config.amp_dtype == "none"
                                                              else DTYPE_BYTES[config.amp_dtype])
    parts: dict[str, float] = {}
    if config.use_lora:
        targets = config.lora_target_modules
        adapters = lora_adapter_params(desc, config.lora_r)
        if targets != "all-linear" and set(targets.split(",")) != {
                "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}:
            raise ConfigError(f"predict_grpo_memory counts LoRA on every decoder linear layer; "
                              f"lora_target_modules = {targets!r} is not modelled")
        parts["frozen_base"] = 4 * params / n
        parts["adapter_states"] = 16 * adapters / n
    else:
        parts["weights_grads_adam"] = 16 * params / n
        if config.kl_coef > 0:
            parts["reference_copy"] = (DTYPE_BYTES[param_dtype] if sharded else 4) * params / n
    if sharded and n > 1:
        embed = desc.vocab * desc.hidden * (1 if desc.tie_embeddings else 2)
        parts["gathered_params"] = DTYPE_BYTES[param_dtype] * (embed + 2 * _layer_params(desc))
    if config.amp_dtype != "none" and config.rollout_copy and not sharded:
        parts["rollout_copy"] = DTYPE_BYTES[config.amp_dtype] * params
    tokens = config.micro_batch_size * context_tokens
    logits_tokens = tokens if config.logprob_chunk == 0 else min(config.logprob_chunk, tokens)
    update = (activation_bytes_per_token(desc, compute_bytes, activation_checkpointing, logits_copies=0) * tokens
              + 3 * 4 * desc.vocab * logits_tokens)
    if config.logprob_chunk and not config.use_lora:
        # each chunk's backward gives the output head its own weight gradient, which autograd sums out
        # of place: the running sum and the new chunk's gradient coexist beside .grad (measured at the
        # peak: up to 3, while the chunk's logits are partly freed; 2 counted)
        grad_bytes = DTYPE_BYTES[param_dtype] if sharded else 4
        update += 2 * grad_bytes * desc.vocab * desc.hidden
    rollout_rows = config.rollout_batch_size or config.prompt_batch_size * config.group_size
    kv_dtype = 4 if config.amp_dtype == "none" or not config.rollout_copy else DTYPE_BYTES[config.amp_dtype]
    rollout = 0.0 if sharded else kv_bytes_per_token(desc, kv_dtype) * rollout_rows * context_tokens
    parts["update_activations" if update >= rollout else "rollout_kv_cache"] = max(update, rollout)
    return MemoryPlan(parts, processes, {"update": update, "rollout": rollout})


def check_fits(desc: ModelDescription, config: GRPOConfig, context_tokens: int, processes: int,
               capacity_gib: float, sharded: bool = True, param_dtype: str = "bfloat16",
               activation_checkpointing: bool = True) -> MemoryPlan:
    """The plan of :func:`predict_grpo_memory`, or a ConfigError naming the predicted memory and what
    would make it fit (call before loading the model)."""
    plan = predict_grpo_memory(desc, config, context_tokens, processes, sharded, param_dtype,
                               activation_checkpointing)
    if plan.total_gib <= capacity_gib:
        return plan
    advice = []
    for more in (2, 4, 8, 16, 32, 64):
        if more > processes and predict_grpo_memory(desc, config, context_tokens, more, True, param_dtype,
                                                    activation_checkpointing).total_gib <= capacity_gib:
            advice.append(f"{more} GPUs (sharded)")
            break
    if not config.use_lora:
        lora = dataclasses.replace(config, use_lora=True)
        gib = predict_grpo_memory(desc, lora, context_tokens, processes, sharded, param_dtype,
                                  activation_checkpointing).total_gib
        advice.append(f"LoRA (use_lora=True: {gib:.1f} GiB)")
    if not activation_checkpointing:
        advice.append("activation checkpointing")
    if config.logprob_chunk == 0:
        advice.append("logprob_chunk > 0 (no full-vocabulary logits)")
    for shorter in (context_tokens // 2, context_tokens // 4):
        if shorter >= 1 and predict_grpo_memory(desc, config, shorter, processes, sharded, param_dtype,
                                                activation_checkpointing).total_gib <= capacity_gib:
            advice.append(f"a context of {shorter} tokens")
            break
    if config.micro_batch_size > 1:
        advice.append("a smaller micro_batch_size")
    advice.append("CPU offload of parameters and optimizer state (not implemented in this suite)")
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in plan.parts.items())
    raise ConfigError(f"GRPO on {desc.name} needs a predicted {plan.total_gib:.1f} GiB per GPU ({parts} GiB) "
                      f"with {processes} GPU(s) of {capacity_gib:g} GiB at {context_tokens} tokens per "
                      f"trajectory; to fit, try: " + "; ".join(advice))


def feasibility(desc: ModelDescription, config: GRPOConfig, context_tokens: int, processes: int,
                capacity_gib: float, **plan_options: Any) -> dict[str, Any]:
    """One row of a feasibility table: the predicted GiB per device of ``config`` (options of
    :func:`check_fits`), whether it fits ``capacity_gib``, and check_fits' advice when it does not."""
    plan_options = {"sharded": True, "param_dtype": "bfloat16", "activation_checkpointing": True, **plan_options}
    try:
        plan = check_fits(desc, config, context_tokens, processes, capacity_gib, **plan_options)
        return {"gib_per_gpu": plan.total_gib, "fits": True, "advice": ""}
    except ConfigError as err:
        plan = predict_grpo_memory(desc, config, context_tokens, processes, **plan_options)
        return {"gib_per_gpu": plan.total_gib, "fits": False, "advice": str(err).split("try: ", 1)[-1]}


def describe_hf_config(config: Any, name: str = "model") -> ModelDescription:
    """A :class:`ModelDescription` of a dense transformers decoder config (Qwen3/Qwen2/Llama-style)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    desc = ModelDescription(
        name=name, params=1, kv_heads=config.num_key_value_heads, head_dim=head_dim,
        full_attention_layers=config.num_hidden_layers, layers=config.num_hidden_layers,
        heads=config.num_attention_heads, hidden=config.hidden_size, intermediate=config.intermediate_size,
        vocab=config.vocab_size, tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        qk_norm=getattr(config, "model_type", "") == "qwen3", source="transformers config", derived="params")
    return dataclasses.replace(desc, params=parameter_count(desc))


def measure_update_peak(config: GRPOConfig, sizes: SubstrateSizes, prompt_tokens: int, completion_tokens: int,
                        seed: int = 0) -> dict[str, float]:
    """Peak live CPU tensor bytes of one ``grpo.grpo_update`` (the second one, so AdamW's moments are
    live) on the seeded fp32 substrate model, weights, reference and optimizer state included,
    next to :func:`predict_grpo_memory`'s prediction for the same configuration."""
    import torch

    from copes_lib import grpo

    if config.amp_dtype != "none":
        raise ConfigError("measure_update_peak measures the fp32 CPU update; use amp_dtype = 'none'")
    model = build_substrate_model(sizes, seed)
    policy = grpo.attach_lora(model, config) if config.use_lora else model
    policy.eval()
    reference = grpo.Reference(policy, config.use_lora, needed=config.kl_coef > 0)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-6)
    rows = config.prompt_batch_size * config.group_size
    gen = torch.Generator().manual_seed(seed)

    def rollouts() -> Any:
        from types import SimpleNamespace

        comps = [torch.randint(3, sizes.vocab, (completion_tokens,), generator=gen).tolist() for _ in range(rows)]
        return SimpleNamespace(
            prompt_ids=[torch.randint(3, sizes.vocab, (prompt_tokens,), generator=gen).tolist() for _ in range(rows)],
            completion_ids=comps, model_mask=[[1] * completion_tokens for _ in range(rows)])

    advantages = torch.linspace(-1.0, 1.0, rows)
    grpo.grpo_update(policy, optimizer, rollouts(), advantages, config, reference)  # allocates Adam moments
    batch = rollouts()
    tracker = LiveTensorBytes()
    existing = list(policy.parameters()) + list(policy.buffers())
    existing += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    if reference.frozen is not None:
        existing += list(reference.frozen.parameters()) + list(reference.frozen.buffers())
    tracker.track_existing(existing)
    with tracker:
        grpo.grpo_update(policy, optimizer, batch, advantages, config, reference)
    plan = predict_grpo_memory(sizes.description(), dataclasses.replace(config, rollout_batch_size=1),
                               prompt_tokens + completion_tokens)
    predicted = plan.total_bytes - plan.parts.get("rollout_kv_cache", 0.0)
    return {"measured_bytes": float(tracker.peak), "predicted_bytes": float(predicted),
            "ratio": float(tracker.peak) / predicted,
            "parts_gib": {k: v / GIB for k, v in plan.parts.items() if k != "rollout_kv_cache"}}


__all__ = ["MemoryPlan", "check_fits", "describe_hf_config", "feasibility", "measure_update_peak",
           "predict_grpo_memory"]
