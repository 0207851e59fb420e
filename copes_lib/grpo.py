"""GRPO: paper A's reinforcement-learning baseline, full-parameter and LoRA, on the shared agent stack.

The paper trained its GRPO baselines with VeRL 0.8.0 (hyperparameters in docs/paper_a_copes.md#a3-hyperparameters, Table S6).
This module is the same algorithm written out in one place, on the same rollout engine, tools,
rewards and splits as ES and CoPES (``copes_lib.rollout``), so the comparison is like for like.

One training step, next to the equations:

1. Sample a batch of B prompts; roll out G trajectories per prompt at temperature 1 (a trajectory is
   the model's tokens interleaved with tool observations; ``model_mask`` marks the model's tokens).
2. Group-relative advantage of trajectory i of prompt q, broadcast to every token of it::

       A_i = (r_i - mean_g(r)) / (std_g(r) + eps)          eps = 1e-6, std over the G rewards

3. Per-token log-probabilities of the completion under the policy pi_theta, the policy that sampled
   it pi_old (computed once before the first update, so the ratio of the first mini-batch is exactly
   1) and a frozen reference pi_ref (the warm-start model; for LoRA the same model with its adapters
   switched off, so no second copy is kept).
4. Per model token t the PPO clipped surrogate plus a k3 KL penalty::

       rho_t   = exp(log pi_theta(o_t) - log pi_old(o_t))
       l_t     = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))     eps = 0.2, 0.2
       l_t     = min(l_t, -A c)   if A < 0   (VeRL's dual-clip)                c = 3
       kl_t    = exp(log pi_ref - log pi_theta) - (log pi_ref - log pi_theta) - 1   ("low_var_kl" = k3)
       loss    = agg_t(l_t + beta * kl_t)                                    beta = 1e-3

   ``agg`` is "token-mean": the mean over every MODEL token of the mini-batch; tool observations and
   padding contribute nothing (their mask is 0).
5. The B*G trajectories are cut into mini-batches of ``mini_batch_size`` prompts (VeRL's
   ``ppo_mini_batch_size``, counted in prompts, i.e. ``mini_batch_size * G`` trajectories); one AdamW
   step with gradient-norm clipping per mini-batch; ``ppo_epochs`` passes (1, as VeRL's default).

How it departs from the paper / VeRL 0.8.0:
- Scale: the cpu profile trains a ~1-10M parameter Qwen3 model built by the suite on synthetic tool
  tasks, with fewer prompts per step, fewer steps and a larger learning rate chosen by a small sweep
  (notebook 04); the gpu profile keeps the paper's values (the dataclass defaults below).
- Gradient accumulation is exact: every micro-batch's loss is divided by the token count (or sequence
  count) of the whole mini-batch, so the result does not depend on ``micro_batch_size`` (tested).
  VeRL scales per-micro-batch means, which equals this only when micro-batches hold equal token
  counts. Rows are sorted by length inside a mini-batch and each micro-batch is padded to its own
  longest row (less padding work; the loss does not depend on the order).
- No entropy bonus (VeRL's default ``entropy_coeff`` is 0 in recent versions), no dynamic batch sizing
  or sequence packing. Dual-clip (``clip_ratio_c``) is VeRL's, tested against its formula.
- Memory at scale: ``logprob_chunk`` computes log-probs from the decoder's hidden states one chunk of
  tokens at a time (or with liger-kernel's fused linear cross-entropy on CUDA), never the
  full-vocabulary logits of the whole micro-batch; ``rollout_batch_size`` rolls out in micro-batches;
  with ``amp_dtype`` set, rollouts sample from a bf16 copy of the policy (bf16 KV cache) that gets the
  new weights after every update (:class:`RolloutWeights`), as VeRL's inference engine does. Sharding
  over GPUs (FSDP2) is ``copes_lib.grpo_sharded``, which runs this module's update in each process;
  the memory a configuration needs per device, and a fit check, are in ``copes_lib.grpo_memory``.
- The best checkpoint is chosen among trained steps only (step 0, the base model, is reported
  separately), by strict improvement of ``eval/val_score`` (accuracy on math, F1 on QA: ``validation_row``),
  the earliest step winning ties (``copes_lib.training_run``, shared with ES).
- Log-probabilities are computed on left-padded prompts with explicit position ids; logits are
  divided by the sampling temperature as in VeRL.
- Peak memory: ``torch.cuda.max_memory_allocated`` on GPU; on CPU the process's peak resident set
  size (``resource.getrusage``), which never decreases within a process, so it bounds rather than
  isolates one run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils.checkpoint

from copes_lib import runs
from copes_lib.config import Config, ConfigError, param
from copes_lib.sampling import mix_seed, prompt_batch, rollout_seed
from copes_lib.training_run import LAST, SCORE, RunBook, TrainingRun, read_checkpoint

KL_ESTIMATORS = ("low_var_kl", "k3", "k1", "k2")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LOGPROB_BACKENDS = ("torch", "liger")
QWEN3_LINEAR_MODULES = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


# --------------------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class GRPOConfig(Config):
    """GRPO hyperparameters. Defaults are the paper's (Table S6, docs/paper_a_copes.md#a3-hyperparameters) unless stated."""

    group_size: int = param(8, "G: sampled trajectories per prompt (paper: 8). Advantages need G >= 2.", ge=2)
    prompt_batch_size: int = param(64, "prompts per training step (paper: 64 for all methods)", ge=1)
    mini_batch_size: int = param(
        32, "prompts per optimizer step, VeRL's ppo_mini_batch_size (paper: 32, i.e. 32*G trajectories); "
        "must divide prompt_batch_size", ge=1)
    micro_batch_size: int = param(
        16, "trajectories per forward/backward pass (gradient accumulation; memory only, the loss is exact)",
        ge=1)
    ppo_epochs: int = param(1, "passes over each step's rollouts (VeRL ppo_epochs, default 1)", ge=1)
    lr: float = param(1e-6, "AdamW learning rate (paper: 1e-6 full-parameter, 5e-6 LoRA)", gt=0)
    weight_decay: float = param(0.01, "AdamW weight decay (VeRL actor default 0.01)", ge=0)
    max_grad_norm: float = param(1.0, "gradient-norm clip per optimizer step (VeRL grad_clip 1.0)", gt=0)
    clip_ratio_low: float = param(0.2, "PPO clip: ratio >= 1 - clip_ratio_low (paper range [0.8, 1.2])",
                                  gt=0, lt=1)
    clip_ratio_high: float = param(0.2, "PPO clip: ratio <= 1 + clip_ratio_high (paper range [0.8, 1.2])",
                                   gt=0)
    clip_ratio_c: float = param(
        3.0, "dual-clip bound for negative advantages (VeRL clip_ratio_c, default 3.0 as in VeRL): the "
             "per-token loss is at most -A * clip_ratio_c when A < 0; 0 disables it. Must be > 1 when set", ge=0)
    kl_coef: float = param(1e-3, "beta, the KL-to-reference loss coefficient (paper: 1e-3; 0 disables "
                                 "the reference pass)", ge=0)
    kl_estimator: str = param(
        "low_var_kl", "KL estimator (VeRL kl_loss_type): low_var_kl = k3 clamped to [-10, 10] (paper), "
        "k3, k1 = log-ratio, k2 = half squared log-ratio", choices=KL_ESTIMATORS)
    loss_agg_mode: str = param("token-mean", "loss aggregation over model tokens (VeRL loss_agg_mode; paper "
                                             "token-mean)", choices=LOSS_AGG_MODES)
    norm_adv_by_std: bool = param(True, "divide group-centred rewards by the group std (VeRL "
                                        "norm_adv_by_std_in_grpo; TRL scale_rewards='group'); False = Dr. GRPO")
    adv_eps: float = param(1e-6, "epsilon in (r - mean_g) / (std_g + eps) (paper: 1e-6)", gt=0)
    temperature: float = param(1.0, "sampling temperature of training rollouts (paper: 1.0)", gt=0)
    top_p: float = param(1.0, "nucleus sampling of training rollouts (VeRL default 1.0)", gt=0, le=1)
    use_lora: bool = param(False, "train LoRA adapters (peft) instead of every parameter")
    lora_r: int = param(32, "LoRA rank (paper: 32)", ge=1)
    lora_alpha: int = param(64, "LoRA alpha (paper: 64)", ge=1)
    lora_target_modules: str = param(
        QWEN3_LINEAR_MODULES, "comma-separated module names given LoRA adapters, or 'all-linear' "
                              "(VeRL's default: every linear layer but the output head)")
    amp_dtype: str = param(
        "none", "autocast dtype of the update's forward passes; 'bfloat16' with an fp32 model keeps fp32 "
                "master weights as VeRL's FSDP mixed precision does (a pure-bf16 model cannot resolve lr "
                "1e-6 updates)", choices=("none", "bfloat16", "float16"))
    logprob_chunk: int = param(
        0, "completion tokens per output-head chunk when computing log-probs (0 = the model's full-vocabulary "
           "logits of every token at once; > 0 = peak memory grows with the chunk, not vocabulary x tokens)",
        ge=0)
    logprob_backend: str = param(
        "torch", "log-prob kernel: torch (CPU and GPU) or liger (liger-kernel's fused linear cross-entropy, "
                 "CUDA only)", choices=LOGPROB_BACKENDS)
    rollout_copy: bool = param(
        True, "with amp_dtype set, roll out from a copy of the policy in amp_dtype (so its KV cache is in "
              "that dtype, as VeRL's inference engine holds bf16 weights), refreshed with the trained weights "
              "after every update; False samples from the fp32 policy itself")
    rollout_batch_size: int = param(
        0, "trajectories per call of the rollout engine (0 = all prompt_batch_size * group_size at once); "
           "bounds the rollout's KV cache", ge=0)
    total_steps: int = param(16, "training steps (paper: full GRPO best at 16, LoRA-GRPO at 64)", ge=1)
    val_every: int = param(8, "validate (temperature 0) every this many steps (paper: 8)", ge=1)
    save_every: int = param(1, "write the resumable checkpoint every this many steps", ge=1)
    early_stop_patience: int = param(
        0, "stop after this many consecutive validations without a new best validation score (total_steps "
           "is then the cap), so the best step is not censored by the run's end; 0 = off, run total_steps", ge=0)
    seed: int = param(42, "seed of prompt order, sampling and LoRA init (paper GRPO runs: 42)", ge=0)

    def check(self) -> None:
        if self.prompt_batch_size % self.mini_batch_size:
            raise ConfigError(
                f"GRPOConfig.prompt_batch_size = {self.prompt_batch_size} is not divisible by "
                f"mini_batch_size = {self.mini_batch_size}; choose a mini_batch_size that divides it "
                f"(divisors: {[d for d in range(1, self.prompt_batch_size + 1) if self.prompt_batch_size % d == 0]})")
        if 0 < self.clip_ratio_c <= 1:
            raise ConfigError(f"GRPOConfig.clip_ratio_c = {self.clip_ratio_c}: the dual-clip bound must be > 1 "
                              "(VeRL's default is 3.0) or 0 to disable it")
        if not self.lora_target_modules.strip():
            raise ConfigError("GRPOConfig.lora_target_modules is empty; give names such as "
                              f"{QWEN3_LINEAR_MODULES!r} or 'all-linear'")

    @property
    def mini_batches_per_step(self) -> int:
        return self.prompt_batch_size // self.mini_batch_size


# --------------------------------------------------------------------------- advantages
def group_advantages(rewards: torch.Tensor, group_size: int, *, norm_by_std: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """Per-trajectory advantage (r - mean_g) / (std_g + eps); rows of a group are consecutive.

    The std is the unbiased one (``torch.std``), as in VeRL and TRL.

    >>> [round(a, 4) for a in group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2).tolist()]
    [0.7071, -0.7071, 0.0, 0.0]
    """
    if group_size < 2:
        raise ConfigError(f"group_size = {group_size}: group-relative advantages need group_size >= 2")
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}; expected a flat vector whose length is a "
                         f"multiple of group_size = {group_size}")
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"rewards must be finite; got {rewards[bad[0]].item()} at trajectory indices {bad[:10]}")
    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if norm_by_std:
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    return centred.flatten()


# --------------------------------------------------------------------------- loss
def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled by pi_theta (J. Schulman's k1/k2/k3)."""
    log_ratio = ref_logps - logps
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator in ("k3", "low_var_kl"):
        kl = log_ratio.exp() - log_ratio - 1
        # VeRL clamps k3 so one very unlikely token cannot dominate the mini-batch.
        return kl.clamp(-10.0, 10.0) if estimator == "low_var_kl" else kl
    raise ConfigError(f"kl_estimator = {estimator!r} is not valid; valid values: {list(KL_ESTIMATORS)}")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, *,
              num_tokens: float | None = None, num_seqs: float | None = None) -> torch.Tensor:
    """Reduce a (sequences, tokens) loss over masked tokens; ``num_tokens``/``num_seqs`` are the whole
    mini-batch's counts when this is one micro-batch of it (defaults: this tensor's own counts)."""
    mask = mask.to(per_token.dtype)
    if mode == "token-mean":
        total = mask.sum() if num_tokens is None else torch.tensor(num_tokens, dtype=per_token.dtype)
        return (per_token * mask).sum() / total.clamp(min=1.0)
    seq_sums = (per_token * mask).sum(dim=1)
    if mode == "seq-mean-token-mean":
        seq_sums = seq_sums / mask.sum(dim=1).clamp(min=1.0)
    elif mode != "seq-mean-token-sum":
        raise ConfigError(f"loss_agg_mode = {mode!r} is not valid; valid values: {list(LOSS_AGG_MODES)}")
    return seq_sums.sum() / (per_token.shape[0] if num_seqs is None else num_seqs)


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, config: GRPOConfig, *,
              num_tokens: float | None = None, num_seqs: float | None = None
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of step 4 (module docstring) over ``mask == 1`` tokens, and its statistics.

    ``logps``, ``old_logps``, ``ref_logps`` and ``mask`` are (sequences, tokens); ``advantages`` is
    one value per sequence. ``ref_logps`` may be None when ``config.kl_coef == 0``.
    """
    mask = mask.to(logps.dtype)
    # Clamp the log-ratio as VeRL does, so one diverged token cannot overflow exp().
    log_ratio = (logps - old_logps).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    adv = advantages.to(logps.dtype).unsqueeze(1)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high)
    policy_loss = torch.maximum(unclipped, clipped)
    if config.clip_ratio_c > 0:
        # VeRL's dual-clip: for A < 0 the loss -A * rho grows without bound in rho; cap it at -A * c.
        policy_loss = torch.where(adv < 0, torch.minimum(policy_loss, -adv * config.clip_ratio_c), policy_loss)
    per_token = policy_loss
    kl = torch.zeros_like(logps)
    if config.kl_coef > 0:
        if ref_logps is None:
            raise ValueError("ref_logps is None but kl_coef > 0; pass reference log-probabilities or set kl_coef = 0")
        kl = kl_penalty(logps, ref_logps, config.kl_estimator)
        per_token = per_token + config.kl_coef * kl
    loss = aggregate(per_token, mask, config.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        stats = {
            "kl": float((kl * mask).sum() / n),
            "clip_frac": float(((clipped > unclipped).to(mask.dtype) * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
            "policy_loss": float((policy_loss * mask).sum() / n),
            "tokens": float(mask.sum()),
        }
    return loss, stats


# --------------------------------------------------------------------------- log-probabilities
@dataclasses.dataclass
class PackedBatch:
    """Trajectories laid out as [left padding | prompt | completion | right padding].

    Every completion starts at column ``prompt_width``, so the logits that predict completion token j
    of every row sit in one column, ``prompt_width - 1 + j``.
    """

    input_ids: torch.Tensor       # (N, prompt_width + completion_width)
    attention_mask: torch.Tensor  # (N, prompt_width + completion_width), 1 on prompt and completion
    position_ids: torch.Tensor    # (N, prompt_width + completion_width), 0 at each prompt's first token
    completion_mask: torch.Tensor  # (N, completion_width), 1 on MODEL tokens only (tool output = 0)
    prompt_width: int

    def rows(self, index: slice | torch.Tensor) -> PackedBatch:
        return PackedBatch(self.input_ids[index], self.attention_mask[index], self.position_ids[index],
                           self.completion_mask[index], self.prompt_width)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def pack(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
         model_mask: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu") -> PackedBatch:
    """Pad a rollout batch's token lists into tensors (see :class:`PackedBatch`)."""
    if not (len(prompt_ids) == len(completion_ids) == len(model_mask)):
        raise ValueError(f"prompt_ids, completion_ids and model_mask have lengths {len(prompt_ids)}, "
                         f"{len(completion_ids)}, {len(model_mask)}; they must be equal")
    for i, (comp, m) in enumerate(zip(completion_ids, model_mask)):
        if len(comp) != len(m):
            raise ValueError(f"row {i}: completion_ids has {len(comp)} tokens but model_mask has {len(m)}")
    n = len(prompt_ids)
    pw = max(len(p) for p in prompt_ids)
    cw = max(1, max(len(c) for c in completion_ids))
    ids = torch.full((n, pw + cw), pad_id, dtype=torch.long)
    attn = torch.zeros((n, pw + cw), dtype=torch.long)
    cmask = torch.zeros((n, cw), dtype=torch.float32)
    for i, (p, c, m) in enumerate(zip(prompt_ids, completion_ids, model_mask)):
        ids[i, pw - len(p):pw] = torch.tensor(p, dtype=torch.long)
        ids[i, pw:pw + len(c)] = torch.tensor(c, dtype=torch.long)
        attn[i, pw - len(p):pw + len(c)] = 1
        cmask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
    positions = (attn.cumsum(dim=1) - 1).clamp(min=0)
    dev = torch.device(device)
    return PackedBatch(ids.to(dev), attn.to(dev), positions.to(dev), cmask.to(dev), pw)


def autocast(batch: PackedBatch, amp_dtype: str = "none"):
    """``torch.autocast`` to ``amp_dtype`` on the batch's device, or a no-op for "none"."""
    if amp_dtype == "none":
        return contextlib.nullcontext()
    return torch.autocast(batch.input_ids.device.type, dtype=getattr(torch, amp_dtype))


def _logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                          with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log-softmax gather (fp32) of ``targets`` under ``logits / temperature``; entropy without gradient.
    ``log_softmax`` keeps one vocabulary-sized tensor for backward (its output); logits minus their
    logsumexp kept two and made two more in backward (measured: 5 such tensors at the peak, now 3)."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    return logps, entropy


def _head_chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float,
                         with_entropy: bool, amp_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    ctx = (contextlib.nullcontext() if amp_dtype == "none"
           else torch.autocast(hidden.device.type, dtype=getattr(torch, amp_dtype)))
    with ctx:
        logits = head(hidden)
    logps, entropy = _logprobs_from_logits(logits, targets, temperature, with_entropy)
    return logps, (entropy if entropy is not None else torch.zeros_like(logps))


def _liger_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                    temperature: float) -> torch.Tensor:
    """log pi via liger-kernel's fused linear cross-entropy (Triton, CUDA only): -CE(h W^T / T, o_t)
    with ``reduction="none"``, the full-vocabulary logits never stored. Not run by the CPU tests."""
    if hidden.device.type != "cuda":
        raise ConfigError("GRPOConfig.logprob_backend = 'liger' needs a CUDA device (liger-kernel's Triton "
                          f"kernels); the model is on {hidden.device.type!r}. Use logprob_backend = 'torch' "
                          "with logprob_chunk > 0 on CPU")
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError as err:
        raise ConfigError(f"GRPOConfig.logprob_backend = 'liger' needs the liger-kernel package ({err}); "
                          "install liger-kernel==0.8.5 or use logprob_backend = 'torch'") from err
    if type(head) is not torch.nn.Linear:
        raise ConfigError(f"logprob_backend = 'liger' needs a plain nn.Linear output head, got "
                          f"{type(head).__name__} (LoRA on lm_head?); use logprob_backend = 'torch'")
    flat = (hidden / temperature).reshape(-1, hidden.shape[-1])
    loss = liger_fused_linear_cross_entropy(flat, head.weight, targets.reshape(-1), bias=head.bias,
                                            reduction="none")
    if isinstance(loss, tuple):
        loss = loss[0]
    return (-loss.float()).view(targets.shape)


def completion_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0,
                        with_entropy: bool = False, amp_dtype: str = "none", chunk_tokens: int = 0,
                        backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | prefix) of every completion token, (N, completion_width), in fp32; optionally the
    policy's per-token entropy (no gradient).

    ``chunk_tokens = 0``: the model's own forward, full-vocabulary logits of every position.
    ``chunk_tokens > 0``: the decoder's hidden states, then the output head, log-softmax and gather
    on ``chunk_tokens`` completion tokens at a time; with gradients each chunk is checkpointed, so
    backward recomputes one chunk's logits instead of keeping all of them. Peak memory then grows
    with hidden size x tokens + vocabulary x chunk, not vocabulary x tokens (same values: tested).
    ``backend = "liger"``: liger-kernel's fused linear cross-entropy (CUDA only; no entropy).
    """
    if isinstance(model, LogProbsModule):
        return model(batch, temperature, with_entropy, amp_dtype, chunk_tokens, backend)
    pw = batch.prompt_width
    targets = batch.input_ids[:, pw:]
    if chunk_tokens == 0 and backend == "torch":
        with autocast(batch, amp_dtype):
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        position_ids=batch.position_ids, use_cache=False)
        return _logprobs_from_logits(out.logits[:, pw - 1:-1], targets, temperature, with_entropy)
    with autocast(batch, amp_dtype):
        hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                     position_ids=batch.position_ids, use_cache=False).last_hidden_state
    hidden = hidden[:, pw - 1:-1]
    head = model.get_output_embeddings()
    if backend == "liger":
        with autocast(batch, amp_dtype):
            logps = _liger_logprobs(hidden, targets, head, temperature)
        entropy = torch.full_like(logps, math.nan) if with_entropy else None
        return logps, entropy
    if backend != "torch":
        raise ConfigError(f"logprob backend = {backend!r} is not valid; valid values: {list(LOGPROB_BACKENDS)}")
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    parts = []
    for i in range(0, flat_targets.numel(), chunk_tokens):
        args = (flat_hidden[i:i + chunk_tokens], flat_targets[i:i + chunk_tokens], head, temperature,
                with_entropy, amp_dtype)
        if torch.is_grad_enabled():
            parts.append(torch.utils.checkpoint.checkpoint(_head_chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(_head_chunk_logprobs(*args))
    # a new tensor, not a view: FSDP2 warns about (and in-place ops would break) a root that returns views
    logps = torch.cat([p[0] for p in parts]).view(targets.shape).clone()
    entropy = torch.cat([p[1] for p in parts]).view(targets.shape).detach() if with_entropy else None
    return logps, entropy


class LogProbsModule(torch.nn.Module):
    """:func:`completion_logprobs` of ``model`` as this module's forward.

    A sharding engine makes this its root module (``copes_lib.grpo_sharded``): the chunked path calls
    the decoder and the output head separately, and only inside the root's forward are the root's
    sharded parameters (embeddings, final norm, head) gathered. ``disable_adapter`` is the wrapped
    peft model's, so :class:`Reference` works unchanged; parameter names gain a ``model.`` prefix.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: PackedBatch, temperature: float = 1.0, with_entropy: bool = False,
                amp_dtype: str = "none", chunk_tokens: int = 0, backend: str = "torch"
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return completion_logprobs(self.model, batch, temperature, with_entropy, amp_dtype, chunk_tokens, backend)

    def disable_adapter(self):
        return self.model.disable_adapter()


@torch.no_grad()
def batched_logprobs(model: torch.nn.Module, batch: PackedBatch, micro_batch_size: int,
                     temperature: float, amp_dtype: str = "none", chunk_tokens: int = 0,
                     backend: str = "torch") -> torch.Tensor:
    """:func:`completion_logprobs` without gradient, in micro-batches."""
    parts = [completion_logprobs(model, batch.rows(slice(i, i + micro_batch_size)), temperature,
                                 amp_dtype=amp_dtype, chunk_tokens=chunk_tokens, backend=backend)[0]
             for i in range(0, len(batch), micro_batch_size)]
    return torch.cat(parts)


# --------------------------------------------------------------------------- policy / reference
def attach_lora(model: torch.nn.Module, config: GRPOConfig) -> torch.nn.Module:
    """Wrap ``model`` with peft LoRA adapters (B = 0 at init, so the policy starts equal to the base)."""
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = config.lora_target_modules
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=targets, bias="none")
    torch.manual_seed(config.seed)  # LoRA A matrices are drawn from torch's global generator
    return get_peft_model(model, lora)


class Reference:
    """pi_ref: a frozen copy of the starting model, or (LoRA) the policy with its adapters disabled."""

    def __init__(self, policy: torch.nn.Module, use_lora: bool, needed: bool = True,
                 frozen: torch.nn.Module | None = None):
        """``frozen``: an already built frozen copy (``grpo_sharded`` passes a sharded one)."""
        self.policy = policy
        self.use_lora = use_lora
        self.frozen = frozen
        if needed and not use_lora and frozen is None:
            self.frozen = copy.deepcopy(policy).eval()
            for p in self.frozen.parameters():
                p.requires_grad_(False)

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch, micro_batch_size: int, temperature: float,
                 amp_dtype: str = "none", chunk_tokens: int = 0, backend: str = "torch") -> torch.Tensor:
        kwargs = {"amp_dtype": amp_dtype, "chunk_tokens": chunk_tokens, "backend": backend}
        if self.use_lora:
            with self.policy.disable_adapter():
                return batched_logprobs(self.policy, batch, micro_batch_size, temperature, **kwargs)
        if self.frozen is None:
            raise RuntimeError("reference requested but none was built (kl_coef == 0)")
        return batched_logprobs(self.frozen, batch, micro_batch_size, temperature, **kwargs)


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters the optimizer updates (all of them, or only the LoRA adapters), detached copies."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    missing = sorted(set(n for n, p in params.items() if p.requires_grad) - set(state))
    if missing:
        raise ValueError(f"checkpoint lacks trainable parameters {missing[:5]} (LoRA vs full mismatch?)")
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


# --------------------------------------------------------------------------- one update
def mini_batches(batch: Any, advantages: torch.Tensor, config: GRPOConfig, pad_id: int,
                 device: torch.device | str = "cpu", rank: int = 0, world_size: int = 1
                 ) -> list[list[tuple[PackedBatch, torch.Tensor]]]:
    """Cut a rollout batch (``prompt_ids``, ``completion_ids``, ``model_mask``) into mini-batches of
    ``mini_batch_size * group_size`` consecutive trajectories, each a list of (micro-batch, advantages).

    Within a mini-batch, rows are sorted by length before being cut into micro-batches, and each
    micro-batch is padded only to its own longest row: the loss is a sum over rows divided by
    mini-batch totals, so the order changes nothing but the padding work.

    With ``world_size`` > 1 (data-parallel ranks) this rank keeps rows ``rank, rank + world_size, ...``
    of each sorted mini-batch: every rank gets as many rows, of similar lengths.
    """
    per_mini = config.mini_batch_size * config.group_size
    if per_mini % world_size:
        raise ValueError(f"mini_batch_size * group_size = {per_mini} trajectories cannot be split evenly over "
                         f"{world_size} processes; choose a process count that divides it")
    n = len(batch.completion_ids)
    if n % per_mini:
        raise ValueError(f"{n} trajectories cannot be cut into mini-batches of mini_batch_size * "
                         f"group_size = {config.mini_batch_size} * {config.group_size} = {per_mini}")
    if advantages.shape != (n,):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}; expected ({n},), one per trajectory")
    out = []
    for start in range(0, n, per_mini):
        rows = sorted(range(start, start + per_mini),
                      key=lambda i: len(batch.prompt_ids[i]) + len(batch.completion_ids[i]))[rank::world_size]
        micro = []
        for m0 in range(0, len(rows), config.micro_batch_size):
            idx = rows[m0:m0 + config.micro_batch_size]
            packed = pack([batch.prompt_ids[i] for i in idx], [batch.completion_ids[i] for i in idx],
                          [batch.model_mask[i] for i in idx], pad_id, device)
            micro.append((packed, advantages[idx].to(packed.input_ids.device)))
        out.append(micro)
    return out


def grpo_update(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any,
                advantages: torch.Tensor, config: GRPOConfig, reference: Reference | None,
                pad_id: int = 0, *, process_group: Any = None) -> dict[str, float]:
    """Steps 3-5 of the module docstring on one step's rollouts; returns mean statistics.

    ``batch`` has ``prompt_ids``, ``completion_ids`` and ``model_mask`` (a ``RolloutBatch``);
    ``advantages`` holds one value per trajectory.

    ``process_group`` (a ``torch.distributed`` group; ``copes_lib.grpo_sharded`` passes it): this
    process updates its share of every mini-batch (:func:`mini_batches`), the token and sequence counts
    that divide the loss and the statistics are summed over the group, and the sharding engine sums
    (does not average) the gradients, so the update equals the single-process one (tested).
    """
    rank, world = (0, 1) if process_group is None else (process_group.rank(), process_group.size())
    minis = mini_batches(batch, torch.as_tensor(advantages, dtype=torch.float32), config, pad_id,
                         next(policy.parameters()).device, rank, world)
    temp = config.temperature
    lp = {"amp_dtype": config.amp_dtype, "chunk_tokens": config.logprob_chunk, "backend": config.logprob_backend}
    with torch.no_grad():
        # pi_old: the weights that sampled the rollouts. With one epoch the first mini-batch is seen
        # before any update, so its pi_old is the policy's own (detached) output: no extra pass.
        old = [None if (k == 0 and config.ppo_epochs == 1) else
               [completion_logprobs(policy, packed, temp, **lp)[0] for packed, _ in micro]
               for k, micro in enumerate(minis)]
        ref = [[reference.logprobs(packed, len(packed), temp, **lp) for packed, _ in micro]
               if config.kl_coef > 0 else None for micro in minis]
    params = [p for p in policy.parameters() if p.requires_grad]
    totals: dict[str, list[float]] = {}
    for _ in range(config.ppo_epochs):
        for k, micro in enumerate(minis):
            num_tokens, num_seqs = _group_sum([float(sum(packed.completion_mask.sum() for packed, _ in micro)),
                                               float(sum(len(packed) for packed, _ in micro))], process_group)
            optimizer.zero_grad(set_to_none=True)
            sums = {"kl": 0.0, "clip_frac": 0.0, "entropy": 0.0, "ratio_mean": 0.0, "loss": 0.0}
            for j, (packed, adv) in enumerate(micro):
                logps, entropy = completion_logprobs(policy, packed, temp, with_entropy=True, **lp)
                old_logps = logps.detach() if old[k] is None else old[k][j]
                loss, stats = grpo_loss(logps, old_logps, None if ref[k] is None else ref[k][j], adv,
                                        packed.completion_mask, config, num_tokens=num_tokens, num_seqs=num_seqs)
                loss.backward()
                # token-weighted sums, so the mini-batch statistics are token means like the loss
                for key in ("kl", "clip_frac", "ratio_mean"):
                    sums[key] += stats[key] * stats["tokens"]
                sums["entropy"] += float((entropy * packed.completion_mask).sum())
                sums["loss"] += float(loss.detach())
            grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            if hasattr(grad_norm, "full_tensor"):  # sharded parameters: a DTensor holding the global norm
                grad_norm = grad_norm.full_tensor()
            if not torch.isfinite(grad_norm):
                raise FloatingPointError(f"gradient norm is {float(grad_norm)}; lower GRPOConfig.lr = {config.lr}")
            optimizer.step()
            sums = dict(zip(sums, _group_sum(list(sums.values()), process_group)))
            denom = max(num_tokens, 1.0)
            row = {key: (v if key == "loss" else v / denom) for key, v in sums.items()}
            row["grad_norm"] = float(grad_norm)
            for key, v in row.items():
                totals.setdefault(key, []).append(v)
    return {key: sum(v) / len(v) for key, v in totals.items()}


def _group_sum(values: list[float], process_group: Any) -> list[float]:
    """Sum floats over a torch.distributed group (identity without one), in fp64."""
    if process_group is None:
        return values
    import torch.distributed as dist

    device = "cuda" if dist.get_backend(process_group) == "nccl" else "cpu"  # NCCL reduces device tensors only
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total, group=process_group)
    return total.tolist()


# --------------------------------------------------------------------------- training loop
@dataclasses.dataclass
class GRPOResult(TrainingRun):
    """What :func:`train_grpo` returns: the run (``copes_lib.training_run.TrainingRun``: history, the
    ``eval/val_score`` of every validated step, the best checkpoint, ``.curve()``) and the trained policy."""

    policy: torch.nn.Module | None = None


def _default_rollout_fns() -> tuple[Callable, Callable]:
    from copes_lib import rollout as rollout_module

    return rollout_module.rollout, rollout_module.evaluate


def concat_rollout_batches(parts: Sequence[Any]) -> Any:
    """One rollout batch from several, in order: list fields are concatenated, numbers summed
    (``elapsed_s``, ``forward_calls``); works for ``RolloutBatch`` and any dataclass like it."""
    if len(parts) == 1:
        return parts[0]
    merged = {}
    for f in dataclasses.fields(parts[0]):
        values = [getattr(p, f.name) for p in parts]
        merged[f.name] = ([x for v in values for x in v] if isinstance(values[0], list) else sum(values))
    return type(parts[0])(**merged)


class RolloutWeights:
    """The weights the rollout engine samples with.

    With ``config.amp_dtype`` set and ``config.rollout_copy`` (the gpu profile), a copy of the policy
    in ``amp_dtype``: the KV cache of the rollout is then in the compute dtype, not fp32 (autocast
    alone does not do it: Qwen3's K norm multiplies by an fp32 weight), at the cost of one bf16
    copy of the weights, which VeRL's inference engine also holds. :meth:`push` copies the policy's
    trainable weights into it after every update. Otherwise the policy itself (nothing to push).
    """

    def __init__(self, policy: torch.nn.Module, config: GRPOConfig):
        self.policy = policy
        self.model = policy
        if config.amp_dtype != "none" and config.rollout_copy:
            self.model = copy.deepcopy(policy).to(getattr(torch, config.amp_dtype)).eval().requires_grad_(False)

    @torch.no_grad()
    def push(self) -> None:
        """Send the policy's trainable weights (all, or the LoRA adapters) to the rollout copy."""
        if self.model is self.policy:
            return
        params = dict(self.model.named_parameters())
        for name, p in self.policy.named_parameters():
            if p.requires_grad:
                params[name].copy_(p)


def rollout_in_micro_batches(rollout_fn: Callable, model: torch.nn.Module, tokenizer: Any,
                             tasks: Sequence[Any], env: Any, sample_cfg: Any, seed: int,
                             config: GRPOConfig) -> Any:
    """The step's trajectories from ``model`` (``RolloutWeights.model``), ``config.rollout_batch_size``
    at a time (0 = all at once): a smaller batch bounds the rollout's KV cache.

    The one place ``train_grpo`` calls the rollout engine (so another engine plugs in here).
    Micro-batch i is seeded ``mix_seed(seed, i)`` (``sampling.mix_seed``; a single batch keeps ``seed``),
    so the samples depend on ``rollout_batch_size``.
    """
    size = config.rollout_batch_size or len(tasks)
    chunks = [list(tasks[i:i + size]) for i in range(0, len(tasks), size)]
    parts = [rollout_fn(model, tokenizer, chunk, env, sample_cfg, seed if len(chunks) == 1 else mix_seed(seed, i))
             for i, chunk in enumerate(chunks)]
    return concat_rollout_batches(parts)


def _pad_id(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return int(pad) if pad is not None else 0


def grpo_step(step: int, train_tasks: Sequence[Any], config: GRPOConfig, rollout: Callable[[list, int], Any],
              update: Callable[[Any, torch.Tensor], dict[str, float]], push: Callable[[], None],
              device: torch.device) -> dict[str, Any]:
    """One GRPO training step, numbered as the module docstring; returns its metrics row.

    ``rollout(tasks, seed)`` samples trajectories (temperature ``config.temperature``) from the weights
    the rollout engine holds, ``update(batch, advantages)`` is steps 3-5 (:func:`grpo_update`, or a
    sharded one) and ``push()`` gives the rollout engine the new weights (:class:`RolloutWeights`).
    Prompts and sampling seeds depend only on (``config.seed``, ``step``).
    """
    t0 = time.perf_counter()
    tasks = prompt_batch(train_tasks, step, config.prompt_batch_size, config.seed)   # 1. B prompts,
    batch = rollout([t for t in tasks for _ in range(config.group_size)],            #    G trajectories each
                    rollout_seed(config.seed, step))
    t1 = time.perf_counter()
    rewards = torch.tensor(batch.rewards, dtype=torch.float32)
    advantages = group_advantages(rewards, config.group_size,                        # 2. A_i = (r_i - mean_g)
                                  norm_by_std=config.norm_adv_by_std, eps=config.adv_eps)  # / (std_g + eps)
    stats = update(batch, advantages)                                                # 3-5. rho_t, clip, k3 KL,
    push()                                                                           #      AdamW; new weights out
    t2 = time.perf_counter()
    group_std = rewards.view(-1, config.group_size).std(dim=1)
    return {
        "step": step,
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "score/mean": float(sum(batch.scores) / len(batch.scores)) if getattr(batch, "scores", None) else math.nan,
        "grpo/kl": stats["kl"],
        "grpo/clip_frac": stats["clip_frac"],
        "grpo/entropy": stats["entropy"],
        "grpo/ratio_mean": stats["ratio_mean"],
        "grpo/loss": stats["loss"],
        "grpo/grad_norm": stats["grad_norm"],
        "grpo/zero_std_group_frac": float((group_std == 0).float().mean()),
        "grpo/model_tokens_mean": sum(map(sum, batch.model_mask)) / len(batch.model_mask),
        "mem/peak_gib": runs.peak_memory_gib(device),
        "time/rollout_s": t1 - t0,
        "time/update_s": t2 - t1,
        "time/step_s": t2 - t0,
    }


def validation_row(result: dict[str, Any]) -> dict[str, float]:
    """An ``evaluate`` result as metrics: ``eval/val_score`` (what checkpoints are selected on:
    accuracy on math, F1 on QA) and, where the result has them, ``eval/val_accuracy`` / ``eval/val_f1``."""
    if "score" not in result:
        raise KeyError(f"evaluate() returned {sorted(result)}; expected a 'score' entry (the selected metric)")
    row = {SCORE: float(result["score"])}
    row.update({f"eval/val_{k}": float(result[k]) for k in ("accuracy", "f1") if k in result})
    return row


def train_grpo(model: torch.nn.Module, tokenizer: Any, env: Any, train_tasks: Sequence[Any],
               val_tasks: Sequence[Any], config: GRPOConfig, run_dir: str | Path, *,
               rollout_config: Any = None, resume: bool = True, stop_after: int | None = None,
               on_step: Callable[[int, dict[str, Any]], None] | None = None,
               rollout_fn: Callable | None = None, evaluate_fn: Callable | None = None,
               update_fn: Callable | None = None) -> GRPOResult:
    """Train ``model`` with GRPO (:func:`grpo_step` repeated) and return the run; checkpoints live in
    ``run_dir``.

    ``model`` is trained in place (full) or wrapped with LoRA adapters (``config.use_lora``); the
    trained policy is ``result.policy``. ``rollout_config`` is a ``copes_lib.rollout.RolloutConfig``
    (turn and tool limits); its ``temperature``/``top_p`` are replaced by ``config``'s for training
    rollouts and by temperature 0 for validation. ``rollout_fn(model, tokenizer, tasks, env, cfg, seed)``
    and ``evaluate_fn`` default to ``copes_lib.rollout.rollout`` / ``evaluate``; tests pass stand-ins.

    Validation (temperature 0; ``eval/val_score``, see :func:`validation_row`) runs at step 0 (the
    base model), every ``val_every`` steps and at the last step; the best validated trained step's
    weights go to ``run_dir/best.pt``. ``run_dir/last.pt`` (weights, optimizer, history) is written every
    ``save_every`` steps, and with ``resume`` a rerun continues from it (``copes_lib.training_run``);
    prompts and sampling seeds depend only on (seed, step), so a resumed run equals an uninterrupted one.
    ``stop_after`` ends the run after that step (validated and checkpointed), so a learning-rate sweep
    can continue its winner to ``total_steps`` by resuming. ``config.early_stop_patience`` = P > 0 ends
    the run after P validations in a row without a new best (``result.stopped_early``; the checkpoint
    records it, so a resumed run stays stopped); otherwise ``total_steps`` is reached and
    ``best_step == total_steps`` means the peak may lie beyond it.

    ``update_fn(policy, rollouts, advantages, pad_id) -> statistics`` replaces the in-process
    :func:`grpo_update` (``copes_lib.grpo_sharded.ShardedUpdater`` runs it sharded over GPUs and
    copies the new weights into ``policy``); it keeps its own optimizer state, so ``resume`` is refused.
    """
    if update_fn is not None and resume and (Path(run_dir) / LAST).exists():
        raise ConfigError(f"{Path(run_dir) / LAST} exists but an update_fn keeps its own optimizer state, "
                          "which the checkpoint does not hold; pass resume=False or a new run_dir")
    if stop_after is not None and stop_after < 1:
        raise ConfigError(f"stop_after = {stop_after} must be >= 1 (or None to run all total_steps)")
    if rollout_fn is None or evaluate_fn is None:
        default_rollout, default_evaluate = _default_rollout_fns()
        rollout_fn = rollout_fn or default_rollout
        evaluate_fn = evaluate_fn or default_evaluate
    device = next(model.parameters()).device

    sample_cfg = eval_cfg = rollout_config
    if rollout_config is not None:
        sample_cfg = dataclasses.replace(rollout_config, temperature=config.temperature, top_p=config.top_p)
        eval_cfg = dataclasses.replace(rollout_config, temperature=0.0, top_p=1.0)

    policy = attach_lora(model, config) if config.use_lora else model
    policy.eval()  # no dropout: pi_old and pi_theta must be the same function before the first update
    reference = Reference(policy, config.use_lora, needed=config.kl_coef > 0)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=config.weight_decay)
    book = RunBook(run_dir, config, resume=resume, patience=config.early_stop_patience,
                   map_location=str(device))
    if book.saved is not None:
        load_trainable_state(policy, book.saved["trainable"])
        optimizer.load_state_dict(book.saved["optimizer"])

    def validate(step: int) -> dict[str, float]:
        row = validation_row(evaluate_fn(policy, tokenizer, list(val_tasks), env, eval_cfg, config.seed))
        book.validated(step, row[SCORE], lambda: {"trainable": trainable_state(policy), "use_lora": config.use_lora})
        return row

    sampler = RolloutWeights(policy, config)  # after a resume: the rollout copy starts from the loaded weights
    pad_id = _pad_id(tokenizer)

    def rollout(tasks: list, seed: int) -> Any:
        return rollout_in_micro_batches(rollout_fn, sampler.model, tokenizer, tasks, env, sample_cfg, seed, config)

    def update(batch: Any, advantages: torch.Tensor) -> dict[str, float]:
        if update_fn is not None:
            return update_fn(policy, batch, advantages, pad_id)
        return grpo_update(policy, optimizer, batch, advantages, config, reference, pad_id)

    if book.step == 0:
        book.history = [{"step": 0, **validate(0)}]
        if on_step:
            on_step(0, book.history[0])
    last_step = config.total_steps if stop_after is None else min(stop_after, config.total_steps)
    for step in range(book.step + 1, last_step + 1):
        if book.stopped:
            break
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        metrics = grpo_step(step, train_tasks, config, rollout, update, sampler.push, device)
        if step % config.val_every == 0 or step == last_step:
            metrics.update(validate(step))
        book.step = step
        book.history.append(metrics)
        if step % config.save_every == 0 or step == last_step or book.stopped:
            book.save(trainable=trainable_state(policy), optimizer=optimizer.state_dict())
        if on_step:
            on_step(step, metrics)
    run = book.result()
    return GRPOResult(policy=policy, **{f.name: getattr(run, f.name) for f in dataclasses.fields(TrainingRun)})


def load_best(policy: torch.nn.Module, result: GRPOResult) -> torch.nn.Module:
    """Load the best validated weights into ``policy`` (the module ``train_grpo`` returned)."""
    if result.best_path is None:
        raise ConfigError("no validated training step, so there is no best checkpoint")
    load_trainable_state(policy, read_checkpoint(result.best_path, "trainable"))
    return policy


def pick_learning_rate(train: Callable[[float, int], GRPOResult], candidates: Sequence[float],
                       sweep_steps: int) -> tuple[float, list[dict[str, Any]]]:
    """A small learning-rate sweep: ``train(lr, stop_after)`` runs each candidate for ``sweep_steps``
    steps; the highest validation score (``eval/val_score``) at that step wins (ties: higher mean training reward, then
    the smaller rate). Returns (best rate, one row per candidate). With the runs' checkpoints kept,
    the winner continues to its ``total_steps`` by resuming, so only the losers cost extra steps.
    """
    if len(candidates) < 1:
        raise ValueError("pick_learning_rate needs at least one candidate learning rate")
    rows = []
    for lr in sorted(candidates):
        result = train(lr, sweep_steps)
        if sweep_steps not in result.val_by_step:
            raise ValueError(f"the run with lr = {lr:g} was not validated at sweep_steps = {sweep_steps}")
        trained = [row for row in result.history[1:] if row["step"] <= sweep_steps]
        rows.append({"lr": lr, "base_val": result.base_val, "val_at_sweep_end": result.val_by_step[sweep_steps],
                     "mean_train_reward": sum(r["reward/mean"] for r in trained) / len(trained),
                     "kl_at_sweep_end": trained[-1]["grpo/kl"]})
    best = max(rows, key=lambda r: (r["val_at_sweep_end"], r["mean_train_reward"], -r["lr"]))
    for row in rows:
        row["chosen"] = row is best
    return best["lr"], rows


def device_hours_per_step(history: Sequence[dict[str, Any]], devices: int = 1) -> float:
    """Mean (rollout + update) wall time per step x devices, in hours; validation excluded (paper A5)."""
    times = [row["time/step_s"] for row in history if "time/step_s" in row]
    if not times:
        raise ValueError("history has no timed training step")
    return sum(times) / len(times) * devices / 3600.0


__all__ = [
    "GRPOConfig", "GRPOResult", "LogProbsModule", "grpo_step", "validation_row", "PackedBatch", "Reference", "RolloutWeights", "aggregate", "attach_lora",
    "batched_logprobs", "completion_logprobs", "concat_rollout_batches", "rollout_in_micro_batches", "device_hours_per_step", "group_advantages", "grpo_loss",
    "grpo_update", "kl_penalty", "load_best", "mini_batches", "pack", "pick_learning_rate",
    "load_trainable_state", "prompt_batch", "train_grpo", "trainable_state",
]
