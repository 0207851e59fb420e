"""GRPO at scale, CPU checks: chunked log-probs, dual-clip, rollout micro-batches, the liger flag."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from test_grpo import ToyRolloutConfig, tiny_model, toy_evaluate, toy_packed, toy_rollout
from transformers import Qwen3Config, Qwen3ForCausalLM

from copes_lib.budget import LiveTensorBytes
from copes_lib.config import ConfigError
from copes_lib.grpo import (
    GRPOConfig,
    Reference,
    RolloutWeights,
    attach_lora,
    completion_logprobs,
    concat_rollout_batches,
    grpo_loss,
    grpo_update,
    pack,
    rollout_in_micro_batches,
    train_grpo,
)


def wide_vocab_model(vocab: int = 2048) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, intermediate_size=64, tie_word_embeddings=True,
                      max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def random_packed(vocab: int, rows: int, completion: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (3 + i % 2,), generator=gen).tolist() for i in range(rows)]
    comps = [torch.randint(3, vocab, (completion - i % 3,), generator=gen).tolist() for i in range(rows)]
    masks = [[int(j % 4 != 3) for j in range(len(c))] for c in comps]
    return pack(prompts, comps, masks, pad_id=0)


def loss_and_grads(model, packed, chunk, temperature=0.7):
    model.zero_grad(set_to_none=True)
    logps, entropy = completion_logprobs(model, packed, temperature, with_entropy=True, chunk_tokens=chunk)
    adv = torch.linspace(-1, 1, len(packed))
    cfg = GRPOConfig(group_size=2, prompt_batch_size=1, mini_batch_size=1, kl_coef=0.0)
    loss, _ = grpo_loss(logps, logps.detach() - 0.05, None, adv, packed.completion_mask, cfg)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), entropy, loss.detach(), grads


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_chunked_logprobs_equal_full_logits_loss_and_gradients(chunk):
    model = wide_vocab_model(vocab=300)
    packed = random_packed(300, rows=5, completion=9)
    full = loss_and_grads(model, packed, chunk=0)
    chunked = loss_and_grads(model, packed, chunk=chunk)
    torch.testing.assert_close(chunked[0], full[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked[1], full[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked[2], full[2], rtol=1e-6, atol=1e-6)
    assert set(chunked[3]) == set(full[3])
    for name in full[3]:
        torch.testing.assert_close(chunked[3][name], full[3][name], rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("mini_batch_size", [1, 2])
def test_chunked_update_equals_unchunked_with_lora_reference(mini_batch_size):
    # One optimizer step (mini_batch_size 2): the gradients must agree to 1e-6. Two steps: the second
    # mini-batch sees the updated adapters (KL > 0); AdamW's first step is ~lr * sign(g), which turns a
    # 1e-9 difference in a near-zero gradient into a visible one, so there only the statistics are compared.
    def run(chunk):
        model = tiny_model(seed=2)
        batch, _ = toy_packed(model, 8)
        cfg = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=mini_batch_size, micro_batch_size=3,
                         lr=1e-2, use_lora=True, lora_r=2, lora_alpha=4, kl_coef=0.1, logprob_chunk=chunk)
        policy = attach_lora(model, cfg)
        opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
        stats = grpo_update(policy, opt, batch, torch.linspace(-1, 1, 8), cfg, Reference(policy, True))
        return stats, {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}

    (s0, g0), (s1, g1) = run(0), run(4)
    for key in ("loss", "kl", "entropy", "grad_norm", "clip_frac"):
        assert s1[key] == pytest.approx(s0[key], rel=1e-6, abs=1e-7), key
    if mini_batch_size == 1:
        assert s0["kl"] > 0
    else:
        for name in g0:
            torch.testing.assert_close(g1[name], g0[name], rtol=1e-6, atol=1e-6, msg=name)


def peak_bytes_of_backward(chunk: int) -> int:
    model = wide_vocab_model(vocab=4096)
    packed = random_packed(4096, rows=4, completion=48)
    tracker = LiveTensorBytes()
    tracker.track_existing(list(model.parameters()) + [packed.input_ids, packed.completion_mask])
    with tracker:
        loss_and_grads(model, packed, chunk)
    return tracker.peak


def test_peak_memory_falls_as_the_chunk_shrinks():
    # 4 rows x 48 completion tokens x 4096 vocabulary: one fp32 copy of the logits is 3 MiB, the
    # hidden states 24 KiB. Live tensor bytes (deterministic), forward + backward.
    peaks = {chunk: peak_bytes_of_backward(chunk) for chunk in (0, 96, 16)}
    logits_copy = 4 * 48 * 4096 * 4
    assert peaks[96] < peaks[0] and peaks[16] < peaks[96], peaks
    # with 16-token chunks, the full-vocabulary logits of the 192 tokens are gone from the peak
    assert peaks[0] - peaks[16] > 2 * logits_copy, peaks


# --------------------------------------------------------------------------- dual-clip
def verl_policy_loss(old_log_prob, log_prob, advantages, eps_low, eps_high, clip_ratio_c):
    """VeRL 0.8's compute_policy_loss_vanilla, per token (before aggregation), written out."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    return torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)


def test_dual_clip_equals_verl_and_binds_only_for_negative_advantages():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, generator=gen)
    new = old + 2.0 * torch.randn(6, 5, generator=gen)  # ratios far outside [0.8, 1.2], some > 3
    adv = torch.tensor([1.5, -1.5, 0.7, -0.2, -2.0, 0.0])
    mask = torch.ones(6, 5)
    cfg = GRPOConfig(group_size=2, prompt_batch_size=1, mini_batch_size=1, kl_coef=0.0, clip_ratio_c=3.0)
    ours, stats = grpo_loss(new, old, None, adv, mask, cfg)
    expected = verl_policy_loss(old, new, adv.unsqueeze(1), 0.2, 0.2, 3.0).mean()
    assert float(ours) == pytest.approx(float(expected), rel=1e-6)
    off, _ = grpo_loss(new, old, None, adv, mask, dataclasses.replace(cfg, clip_ratio_c=0.0))
    assert float(off) != pytest.approx(float(ours))  # the cap binds on this batch
    pos = adv > 0
    on_pos = grpo_loss(new[pos], old[pos], None, adv[pos], mask[pos], cfg)[0]
    off_pos = grpo_loss(new[pos], old[pos], None, adv[pos], mask[pos], dataclasses.replace(cfg, clip_ratio_c=0.0))[0]
    assert float(on_pos) == float(off_pos)


def test_dual_clip_bound_must_exceed_one():
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        GRPOConfig(clip_ratio_c=0.5)


# --------------------------------------------------------------------------- rollout micro-batches
def test_rollouts_in_micro_batches_concatenate_in_order_with_distinct_seeds():
    calls = []

    def fake_rollout(model, tokenizer, tasks, env, cfg, seed):
        calls.append((list(tasks), seed))
        return toy_rollout(model, tokenizer, tasks, env, cfg, seed)

    model = tiny_model()
    tasks = list(range(10))
    cfg = GRPOConfig(group_size=2, prompt_batch_size=5, mini_batch_size=5, rollout_batch_size=4)
    rb = rollout_in_micro_batches(fake_rollout, model, None, tasks, None, ToyRolloutConfig(), 99, cfg)
    assert [c[0] for c in calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len({c[1] for c in calls}) == 3
    assert len(rb.prompt_ids) == len(rb.rewards) == 10
    parts = [toy_rollout(model, None, c[0], None, ToyRolloutConfig(), c[1]) for c in calls]
    assert rb.completion_ids[4:8] == parts[1].completion_ids
    whole = rollout_in_micro_batches(toy_rollout, model, None, tasks, None, ToyRolloutConfig(), 99,
                                     dataclasses.replace(cfg, rollout_batch_size=0))
    assert whole.completion_ids == toy_rollout(model, None, tasks, None, ToyRolloutConfig(), 99).completion_ids


def test_concat_rollout_batches_sums_counters():
    from copes_lib.rollout import RolloutBatch

    a = RolloutBatch([], [[1]], [[2]], [[1]], ["x"], [1.0], [1.0], [{}], elapsed_s=1.0, forward_calls=2)
    b = RolloutBatch([], [[3]], [[4]], [[1]], ["y"], [0.0], [0.0], [{}], elapsed_s=2.0, forward_calls=3)
    c = concat_rollout_batches([a, b])
    assert c.prompt_ids == [[1], [3]] and c.texts == ["x", "y"] and c.elapsed_s == 3.0 and c.forward_calls == 5


def test_training_calls_the_rollout_engine_in_micro_batches(tmp_path):
    sizes = []

    def counting_rollout(model, tokenizer, tasks, env, cfg, seed):
        sizes.append(len(tasks))
        return toy_rollout(model, tokenizer, tasks, env, cfg, seed)

    cfg = GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=2, micro_batch_size=8, lr=3e-2,
                     total_steps=2, val_every=2, rollout_batch_size=6)
    result = train_grpo(tiny_model(), None, None, list(range(8)), list(range(8)), cfg, tmp_path,
                        rollout_config=ToyRolloutConfig(), rollout_fn=counting_rollout, evaluate_fn=toy_evaluate)
    assert sizes == [6, 6, 4] * 2  # 16 trajectories per step
    assert len(result.history) == 3 and all(math.isfinite(r["grpo/loss"]) for r in result.history[1:])


@pytest.mark.parametrize("use_lora", [False, True])
def test_rollout_copy_is_bf16_gets_pushed_weights_and_keeps_a_bf16_kv_cache(monkeypatch, use_lora):
    from copes_lib import kv_cache

    model = tiny_model()
    cfg = GRPOConfig(group_size=4, prompt_batch_size=1, mini_batch_size=1, lr=1e-2, amp_dtype="bfloat16",
                     use_lora=use_lora, lora_r=2, lora_alpha=4)
    policy = attach_lora(model, cfg) if use_lora else model
    sampler = RolloutWeights(policy, cfg)
    assert sampler.model is not policy and all(p.dtype == torch.bfloat16 for p in sampler.model.parameters())
    batch, _ = toy_packed(policy, 4)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
    grpo_update(policy, opt, batch, torch.tensor([1.0, -1.0, 0.5, -0.5]), cfg, Reference(policy, use_lora))
    trained = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    copies = dict(sampler.model.named_parameters())
    assert any(not torch.equal(copies[n], p.to(torch.bfloat16)) for n, p in trained.items())  # stale
    sampler.push()
    for name, p in trained.items():
        assert torch.equal(copies[name], p.detach().to(torch.bfloat16)), name

    seen = []
    original = kv_cache.GrowingLayer.update

    def spy(self, key_states, value_states, *args, **kwargs):
        seen.append((key_states.dtype, value_states.dtype))
        return original(self, key_states, value_states, *args, **kwargs)

    monkeypatch.setattr(kv_cache.GrowingLayer, "update", spy)
    with torch.no_grad():
        sampler.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True,
                      cache=kv_cache.growing_cache(sampler.model))
    assert seen and all(d == (torch.bfloat16, torch.bfloat16) for d in seen), seen
    assert RolloutWeights(policy, dataclasses.replace(cfg, amp_dtype="none")).model is policy


# --------------------------------------------------------------------------- liger flag
def test_liger_backend_is_gpu_only_with_a_clear_error():
    model = tiny_model()
    _, packed = toy_packed(model, 2)
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        completion_logprobs(model, packed, backend="liger")


def test_training_with_an_update_fn_passes_the_policy_and_refuses_to_resume(tmp_path):
    seen = []

    def update_fn(policy, rollouts, advantages, pad_id):
        seen.append((policy, len(rollouts.completion_ids), tuple(advantages.shape)))
        return {"kl": 0.0, "clip_frac": 0.0, "entropy": 0.0, "ratio_mean": 1.0, "loss": 0.0, "grad_norm": 0.0}

    cfg = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=2, total_steps=2, val_every=2)
    model = tiny_model()
    result = train_grpo(model, None, None, list(range(8)), list(range(8)), cfg, tmp_path,
                        rollout_config=ToyRolloutConfig(), rollout_fn=toy_rollout, evaluate_fn=toy_evaluate,
                        update_fn=update_fn)
    assert [s[1:] for s in seen] == [(8, (8,))] * 2 and all(s[0] is result.policy for s in seen)
    with pytest.raises(ValueError, match="update_fn keeps its own optimizer state"):
        train_grpo(model, None, None, list(range(8)), list(range(8)), cfg, tmp_path,
                   rollout_config=ToyRolloutConfig(), rollout_fn=toy_rollout, evaluate_fn=toy_evaluate,
                   update_fn=update_fn)
