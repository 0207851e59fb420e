"""GRPO: the loss against hand-computed values, masking, updates, LoRA, bad input, train/resume.

Everything runs on a ~19K-parameter Qwen3 built from a Qwen3Config and a toy sampler that stands in
for the rollout engine (prompt -> model tokens, one masked "tool" token, more model tokens).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from copes_lib import grpo
from copes_lib.config import ConfigError
from copes_lib.grpo import (
    GRPOConfig,
    GRPOResult,
    Reference,
    attach_lora,
    completion_logprobs,
    group_advantages,
    grpo_loss,
    grpo_update,
    pack,
    pick_learning_rate,
    prompt_batch,
    train_grpo,
)
from copes_lib.protocols.params import GRPONotebookParams

TOOL_TOKEN, TARGET_TOKEN, VOCAB = 11, 5, 12


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, intermediate_size=64, tie_word_embeddings=True,
                      max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).eval()


# --------------------------------------------------------------------------- toy rollout engine
@dataclasses.dataclass(frozen=True)
class ToyRolloutConfig:
    temperature: float = 1.0
    top_p: float = 1.0


@dataclasses.dataclass
class ToyBatch:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    model_mask: list[list[int]]
    rewards: list[float]
    scores: list[float]


@torch.no_grad()
def toy_rollout(model, tokenizer, tasks, env, config, seed):
    """3 model tokens, a tool observation (masked), 2 model tokens; reward = share of TARGET_TOKEN."""
    gen = torch.Generator().manual_seed(seed)
    seqs = torch.tensor([[1, 2 + t % 4] for t in tasks])
    mask_cols = [1, 1, 1, 0, 1, 1]
    for col in mask_cols:
        if col == 0:
            nxt = torch.full((len(tasks), 1), TOOL_TOKEN)
        else:
            logits = model(input_ids=seqs).logits[:, -1].float()
            if config.temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                nxt = torch.multinomial(torch.softmax(logits / config.temperature, -1), 1, generator=gen)
        seqs = torch.cat([seqs, nxt], dim=1)
    comps = seqs[:, 2:].tolist()
    rewards = [sum(tok == TARGET_TOKEN for tok, m in zip(c, mask_cols) if m) / 5 for c in comps]
    return ToyBatch([s[:2] for s in seqs.tolist()], comps, [mask_cols[:] for _ in tasks], rewards, rewards)


def toy_evaluate(model, tokenizer, tasks, env, config, seed):
    batch = toy_rollout(model, tokenizer, tasks, env, config, seed)
    value = sum(batch.rewards) / len(batch.rewards)
    return {"score": value, "accuracy": value}


def toy_packed(model, n: int, seed: int = 0):
    batch = toy_rollout(model, None, list(range(n)), None, ToyRolloutConfig(), seed)
    return batch, pack(batch.prompt_ids, batch.completion_ids, batch.model_mask, pad_id=0)


def ragged_batch(model, n: int, seed: int = 0):
    """A toy batch whose rows have different prompt and completion lengths (padding matters)."""
    batch = toy_rollout(model, None, list(range(n)), None, ToyRolloutConfig(), seed)
    for i in range(n):
        batch.prompt_ids[i] = batch.prompt_ids[i] + [3] * (i % 3)
        cut = 6 - (i % 2) * 2
        batch.completion_ids[i], batch.model_mask[i] = batch.completion_ids[i][:cut], batch.model_mask[i][:cut]
    return batch


# --------------------------------------------------------------------------- the loss
def test_loss_matches_hand_computed_values():
    ln = math.log
    # seq 0 (A = +1): token 0 ratio 0.5/0.4 = 1.25 -> clipped to 1.2; token 1 ratio 1, k3 vs ref 0.25;
    # token 2 masked with absurd values. seq 1 (A = -1): ratio 0.2/0.4 = 0.5 -> clipped to 0.8.
    logps = torch.tensor([[ln(0.5), ln(0.5), 50.0], [ln(0.2), -50.0, 0.0]])
    old = torch.tensor([[ln(0.4), ln(0.5), -50.0], [ln(0.4), 10.0, 0.0]])
    ref = torch.tensor([[ln(0.5), ln(0.25), 9.0], [ln(0.2), 0.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    k3 = 0.5 - ln(0.5) - 1  # exp(log 0.5) - log 0.5 - 1
    tokens = [-1.2, -1.0 + 0.5 * k3, 0.8]
    cfg = GRPOConfig(kl_coef=0.5, kl_estimator="low_var_kl")
    loss, stats = grpo_loss(logps, old, ref, adv, mask, cfg)
    assert loss.item() == pytest.approx(sum(tokens) / 3, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    assert stats["kl"] == pytest.approx(k3 / 3, abs=1e-6)
    seq_cfg = dataclasses.replace(cfg, loss_agg_mode="seq-mean-token-mean")
    loss_seq, _ = grpo_loss(logps, old, ref, adv, mask, seq_cfg)
    assert loss_seq.item() == pytest.approx(((tokens[0] + tokens[1]) / 2 + tokens[2]) / 2, abs=1e-6)


def test_kl_estimators_and_zero_kl_needs_no_reference():
    logps, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    adv, mask = torch.tensor([0.0]), torch.ones(1, 1)
    for est, expected in [("k1", math.log(2)), ("k2", 0.5 * math.log(2) ** 2), ("k3", 0.5 + math.log(2) - 1)]:
        _, stats = grpo_loss(logps, logps, ref, adv, mask, GRPOConfig(kl_estimator=est))
        assert stats["kl"] == pytest.approx(expected, abs=1e-6), est
    loss, _ = grpo_loss(logps, logps, None, torch.tensor([2.0]), mask, GRPOConfig(kl_coef=0.0))
    assert loss.item() == pytest.approx(-2.0)
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_loss(logps, logps, None, adv, mask, GRPOConfig(kl_coef=1e-3))


def test_masked_tokens_get_zero_gradient():
    torch.manual_seed(0)
    logps = torch.randn(3, 5, requires_grad=True)
    old, ref = logps.detach() + 0.05 * torch.randn(3, 5), torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    loss, _ = grpo_loss(logps, old, ref, torch.tensor([1.0, -0.5, 2.0]), mask, GRPOConfig())
    loss.backward()
    assert torch.all(logps.grad[mask == 0] == 0)
    assert torch.all(logps.grad[mask == 1] != 0)


# --------------------------------------------------------------------------- advantages, bad input
def test_group_advantages_hand_computed_and_bad_input():
    adv = group_advantages(torch.tensor([1.0, 0.0, 3.0, 3.0, 2.0, 0.0]), 2)
    s = math.sqrt(0.5)  # unbiased std of {1, 0}
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0, 1 / (2 * s), -1 / (2 * s)], rel=1e-5)
    assert group_advantages(torch.tensor([1.0, 0.0]), 2, norm_by_std=False).tolist() == [0.5, -0.5]
    with pytest.raises(ConfigError, match="group_size = 1"):
        group_advantages(torch.tensor([1.0, 2.0]), 1)
    with pytest.raises(ValueError, match=r"nan.*\[2\]"):
        group_advantages(torch.tensor([1.0, 0.0, float("nan"), 1.0]), 2)
    with pytest.raises(ValueError, match="multiple of group_size = 4"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0]), 4)


def test_config_rejects_bad_values_by_name():
    with pytest.raises(ConfigError, match="group_size"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match=r"prompt_batch_size = 64 is not divisible by mini_batch_size = 24"):
        GRPOConfig(mini_batch_size=24)
    with pytest.raises(ConfigError, match="kl_estimator"):
        GRPOConfig(kl_estimator="k4")
    with pytest.raises(ConfigError, match="MINI_BATCH"):
        GRPONotebookParams(PROMPT_BATCH=16, MINI_BATCH=5)
    with pytest.raises(ConfigError, match="SWEEP_LRS_FULL"):
        GRPONotebookParams(SWEEP_LRS_FULL="1e-4,abc")


def test_update_rejects_batch_not_divisible_into_mini_batches():
    model = tiny_model()
    batch, _ = toy_packed(model, 6)
    cfg = GRPOConfig(group_size=2, prompt_batch_size=2, mini_batch_size=2, kl_coef=0.0)  # 4 per mini-batch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="6 trajectories cannot be cut into mini-batches"):
        grpo_update(model, opt, batch, torch.zeros(6), cfg, None)


# --------------------------------------------------------------------------- log-probabilities
def test_logprobs_independent_of_padding():
    model = tiny_model()
    prompts, comps = [[1, 2, 3], [4]], [[5, 6, 7, 8], [9]]
    packed = pack(prompts, comps, [[1] * 4, [1]], pad_id=0)
    batched, _ = completion_logprobs(model, packed)
    for i in range(2):
        alone, _ = completion_logprobs(model, pack([prompts[i]], [comps[i]], [[1] * len(comps[i])], pad_id=0))
        n = len(comps[i])
        torch.testing.assert_close(batched[i, :n], alone[0, :n], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- updates
def test_full_update_changes_parameters_and_first_ratio_is_one():
    model = tiny_model()
    batch, _ = toy_packed(model, 8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=1, micro_batch_size=4, lr=1e-2)
    adv = group_advantages(torch.tensor(batch.rewards), 4) + torch.tensor([0.3, -0.3] * 4)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    one_mini = dataclasses.replace(cfg, mini_batch_size=2)
    stats = grpo_update(model, opt, batch, adv, one_mini, Reference(model, use_lora=False))
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # one mini-batch: on-policy
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)  # reference = policy before the update
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)


def test_gradient_accumulation_is_exact():
    grads = []
    for micro in (8, 3, 1):
        model = tiny_model()
        batch = ragged_batch(model, 8, seed=1)
        cfg = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=2, micro_batch_size=micro,
                         lr=1e-3, max_grad_norm=1e9)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        adv = torch.linspace(-1, 1, 8)
        grpo_update(model, opt, batch, adv, cfg, Reference(model, use_lora=False))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[0], grads[2], atol=1e-6, rtol=1e-5)


def test_lora_trains_adapters_only_and_reference_is_base_model():
    model = tiny_model()
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch, packed = toy_packed(model, 8)
    base_logps, _ = completion_logprobs(model, packed)
    cfg = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=2, use_lora=True, lora_r=4,
                     lora_alpha=8, lr=5e-2, lora_target_modules="q_proj,v_proj,up_proj")
    policy = attach_lora(model, cfg)
    ref = Reference(policy, use_lora=True)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
    for _ in range(2):
        grpo_update(policy, opt, batch, torch.linspace(-1, 1, 8), cfg, ref)
    for name, p in policy.named_parameters():
        if "lora_" in name:
            continue
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(p, base[key]), name
    assert any(("lora_B" in n and p.abs().sum() > 0) for n, p in policy.named_parameters())
    torch.testing.assert_close(ref.logprobs(packed, 8, 1.0), base_logps)
    trained, _ = completion_logprobs(policy, packed)
    assert not torch.allclose(trained, base_logps)


# --------------------------------------------------------------------------- training loop
def run_toy(tmp_path, steps, use_lora=False, on_step=None):
    cfg = GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=2, micro_batch_size=8, lr=3e-2,
                     total_steps=steps, val_every=2, use_lora=use_lora, lora_r=4, lora_alpha=8)
    return train_grpo(tiny_model(), None, None, list(range(8)), list(range(8)), cfg, tmp_path,
                      rollout_config=ToyRolloutConfig(), on_step=on_step,
                      rollout_fn=toy_rollout, evaluate_fn=toy_evaluate)


def test_training_raises_toy_reward_and_keeps_best_checkpoint(tmp_path):
    result = run_toy(tmp_path, steps=8)
    rewards = [row["reward/mean"] for row in result.history[1:]]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1
    assert result.best_val == max(v for s, v in result.val_by_step.items() if s > 0)
    assert result.best_path.exists() and result.best_val > result.base_val
    for key in ("grpo/kl", "grpo/clip_frac", "grpo/entropy", "mem/peak_gib", "time/step_s"):
        assert all(math.isfinite(row[key]) for row in result.history[1:]), key


def test_grpo_run_bookkeeping_is_the_shared_one(tmp_path):
    """train_grpo keeps its folder with copes_lib.training_run, as train_es does: .curve() on eval/val_score,
    the base (step 0) outside the best-checkpoint choice, a ConfigError for a folder of another config."""
    result = run_toy(tmp_path, steps=4)
    assert result.curve() == ([0, 2, 4], [row["eval/val_score"] for row in result.history if "eval/val_score" in row])
    assert result.best_step in (2, 4) and result.last_path.name == "last.pt"
    assert all("eval/val_accuracy" in row for row in result.history if "eval/val_score" in row)  # the toy's is accuracy
    cfg = GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=2, micro_batch_size=8, lr=1e-2,
                     total_steps=4, val_every=2)
    with pytest.raises(ConfigError, match="different GRPOConfig"):
        train_grpo(tiny_model(), None, None, list(range(8)), list(range(8)), cfg, tmp_path,
                   rollout_config=ToyRolloutConfig(), rollout_fn=toy_rollout, evaluate_fn=toy_evaluate)


def test_a_qa_validation_logs_its_f1_as_the_score_not_as_accuracy():
    row = grpo.validation_row({"score": 0.4, "f1": 0.4, "em": 0.2, "acc": 0.3})
    assert row == {"eval/val_score": 0.4, "eval/val_f1": 0.4}
    with pytest.raises(KeyError, match="score"):
        grpo.validation_row({"accuracy": 0.5})


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("use_lora", [False, True])
def test_resume_equals_uninterrupted(tmp_path, use_lora):
    straight = run_toy(tmp_path / "straight", steps=4, use_lora=use_lora)

    def crash_at_step_3(step, metrics):
        if step == 3:
            raise Interrupted

    with pytest.raises(Interrupted):
        run_toy(tmp_path / "resumed", steps=4, use_lora=use_lora, on_step=crash_at_step_3)
    resumed = run_toy(tmp_path / "resumed", steps=4, use_lora=use_lora)
    assert [r["step"] for r in resumed.history] == [0, 1, 2, 3, 4]
    for a, b in zip(straight.history, resumed.history):
        assert {k: v for k, v in a.items() if not k.startswith(("time/", "mem/"))} == \
               {k: v for k, v in b.items() if not k.startswith(("time/", "mem/"))}
    for (name, p), q in zip(straight.policy.named_parameters(), resumed.policy.parameters()):
        assert torch.equal(p, q), name


def test_prompt_batches_cover_an_epoch_and_depend_only_on_seed_and_step():
    tasks = list(range(10))
    epoch = [t for step in (1, 2, 3, 4, 5) for t in prompt_batch(tasks, step, 2, seed=7)]
    assert sorted(epoch) == tasks
    assert prompt_batch(tasks, 6, 2, seed=7) == prompt_batch(tasks, 6, 2, seed=7)
    assert prompt_batch(tasks, 6, 2, seed=7) != prompt_batch(tasks, 1, 2, seed=7) or \
        prompt_batch(tasks, 7, 2, seed=7) != prompt_batch(tasks, 2, 2, seed=7)
    with pytest.raises(ValueError, match="prompt batch size = 11"):
        prompt_batch(tasks, 1, 11, seed=0)


def test_bf16_autocast_update_keeps_fp32_master_weights():
    model = tiny_model()
    batch, _ = toy_packed(model, 4)
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    cfg = GRPOConfig(group_size=4, prompt_batch_size=1, mini_batch_size=1, lr=1e-2, amp_dtype="bfloat16")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    stats = grpo_update(model, opt, batch, torch.tensor([1.0, -1.0, 0.5, -0.5]), cfg, Reference(model, False))
    after = model.model.layers[0].mlp.up_proj.weight
    assert after.dtype == torch.float32 and not torch.equal(after, before)
    assert math.isfinite(stats["kl"]) and math.isfinite(stats["entropy"])


def test_stop_after_then_resume_equals_uninterrupted(tmp_path):
    straight = run_toy(tmp_path / "straight", steps=4)
    cfg = GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=2, micro_batch_size=8, lr=3e-2,
                     total_steps=4, val_every=2, lora_r=4, lora_alpha=8)
    kwargs = dict(rollout_config=ToyRolloutConfig(), rollout_fn=toy_rollout, evaluate_fn=toy_evaluate)
    first = train_grpo(tiny_model(), None, None, list(range(8)), list(range(8)), cfg, tmp_path / "x",
                       stop_after=2, **kwargs)
    assert first.history[-1]["step"] == 2 and 2 in first.val_by_step
    rest = train_grpo(tiny_model(), None, None, list(range(8)), list(range(8)), cfg, tmp_path / "x", **kwargs)
    assert rest.val_by_step == straight.val_by_step
    for p, q in zip(straight.policy.parameters(), rest.policy.parameters()):
        assert torch.equal(p, q)


def test_pick_learning_rate_keeps_the_best_run_and_breaks_ties(tmp_path):
    def fake(val, reward):
        return GRPOResult(policy=None, history=[{"step": 0}, {"step": 1, "reward/mean": reward, "grpo/kl": 0.0}],
                          val_by_step={0: 0.1, 1: val}, best_step=1, best_val=val,
                          best_path=None, last_path=tmp_path)

    outcomes = {1e-4: (0.3, 0.5), 3e-4: (0.4, 0.1), 1e-3: (0.4, 0.2)}
    lr, rows = pick_learning_rate(lambda lr, stop: fake(*outcomes[lr]), list(outcomes), 1)
    assert lr == 1e-3 and [r["chosen"] for r in rows] == [False, False, True]
    with pytest.raises(ValueError, match="not validated at sweep_steps = 2"):
        pick_learning_rate(lambda lr, stop: fake(0.1, 0.1), [1e-4], 2)


def scripted_validation(values):
    """An evaluate_fn returning the given validation accuracies in order (step 0 first)."""
    calls = iter(values)
    return lambda *args, **kwargs: {"score": next(calls)}


def run_patience(tmp_path, values, *, patience, steps=8, on_step=None):
    cfg = GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=2, micro_batch_size=8, lr=3e-2,
                     total_steps=steps, val_every=1, early_stop_patience=patience)
    return train_grpo(tiny_model(), None, None, list(range(8)), list(range(8)), cfg, tmp_path,
                      rollout_config=ToyRolloutConfig(), rollout_fn=toy_rollout,
                      evaluate_fn=scripted_validation(values), on_step=on_step)


def test_early_stopping_stops_after_patience_without_a_new_best(tmp_path):
    # best at step 2; steps 3 and 4 do not beat it (a tie is not a new best): patience 2 stops at 4
    result = run_patience(tmp_path, [0.1, 0.2, 0.5, 0.4, 0.5, 0.9, 0.9, 0.9, 0.9], patience=2)
    assert [r["step"] for r in result.history] == [0, 1, 2, 3, 4]
    assert result.stopped_early and result.best_step == 2 and not result.peak_censored
    # a resumed stopped run stays stopped (evaluate_fn would fail if called again)
    again = run_patience(tmp_path, [], patience=2)
    assert again.stopped_early and again.last_step == 4 and again.best_step == 2


def test_early_stopping_does_not_stop_while_improving(tmp_path):
    result = run_patience(tmp_path, [0.1, 0.2, 0.3, 0.35, 0.4, 0.45], patience=1, steps=5)
    assert [r["step"] for r in result.history] == [0, 1, 2, 3, 4, 5]
    assert not result.stopped_early and result.best_step == 5 and result.peak_censored


def test_early_stopping_off_runs_every_step_and_resumes_with_its_count(tmp_path):
    values = [0.1, 0.5, 0.4, 0.3, 0.2, 0.1]
    off = run_patience(tmp_path / "off", values, patience=0, steps=5)
    assert off.last_step == 5 and not off.stopped_early and off.best_step == 1

    def crash_at_step_2(step, metrics):
        if step == 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        run_patience(tmp_path / "on", values[:3], patience=3, on_step=crash_at_step_2)
    # the stale count (1 after step 2) survives the resume: steps 3 and 4 make 3 -> stop at 4
    resumed = run_patience(tmp_path / "on", values[3:], patience=3)
    assert resumed.stopped_early and resumed.last_step == 4 and resumed.best_step == 1


# --------------------------------------------------------------------------- 04's reference: past its peak
def test_reference_stopping_rule_on_known_curves(tmp_path):
    from copes_lib.protocols.paper_a import grpo_arm

    # a peak (step 2) then a fall: patience 3 sees three validations without a new best and stops at 5
    peaked = run_patience(tmp_path / "peak", [0.1, 0.3, 0.5, 0.45, 0.4, 0.42, 0.9, 0.9, 0.9], patience=3)
    report = grpo_arm.peak_report(peaked)
    assert (report["peak_step"], report["last_step"], report["stopped_early"]) == (2, 5, True)
    assert not report["cap_censored"] and not report["peak_censored"]
    # still rising at the cap: censored by both flags
    rising = grpo_arm.peak_report(run_patience(tmp_path / "rise", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], patience=3, steps=5))
    assert rising["cap_censored"] and rising["peak_censored"] and rising["last_step"] == 5
    # a dip the cap cut short (best at 2, two stale validations of three): not seen to peak, so censored
    cut = grpo_arm.peak_report(run_patience(tmp_path / "cut", [0.1, 0.2, 0.5, 0.4, 0.45], patience=3, steps=4))
    assert cut["cap_censored"] and not cut["peak_censored"] and cut["peak_step"] == 2


def test_seed_report_spreads_the_reference_over_seeds(tmp_path):
    from copes_lib.protocols.paper_a import grpo_arm

    curves = {42: [0.1, 0.3, 0.5, 0.4, 0.4, 0.4], 43: [0.1, 0.2, 0.3, 0.6, 0.5, 0.5, 0.5], 44: [0.1, 0.2, 0.3, 0.4, 0.5]}
    seed_runs = []
    for seed, values in curves.items():
        result = run_patience(tmp_path / str(seed), values, patience=3, steps=4 if seed == 44 else 8)
        seed_runs.append(grpo_arm.GRPORun(f"seed {seed}", result.history, dict(result.val_by_step), result.best_step,
                                          result.best_val, tmp_path, result, seed))
    report = grpo_arm.seed_report(seed_runs, "full")
    assert report["full_seeds"] == [42, 43, 44]
    assert report["full_best_step_seeds"] == [2, 3, 4] and report["full_best_step_median"] == 3.0
    assert report["full_best_val_accuracy_seeds"] == pytest.approx([0.5, 0.6, 0.5])
    assert report["full_gain_over_base_seeds"] == pytest.approx([0.4, 0.5, 0.4])
    assert report["full_best_step_sd"] == pytest.approx(1.0)
    assert report["full_cap_censored_seeds"] == [False, False, True] and report["full_any_cap_censored"]


def test_a_truncated_best_checkpoint_stops_clearly_and_the_run_heals(tmp_path):
    """Issue 33: GRPO's best weights were read without a check (a bare TypeError on a damaged file)."""
    from copes_lib import runs
    from copes_lib.grpo import load_best

    result = run_toy(tmp_path, steps=4)
    best = result.best_path
    best.write_bytes(best.read_bytes()[:200])
    with pytest.raises(runs.CorruptCacheError, match=f"{best} is damaged.*rerun its notebook"):
        load_best(tiny_model(), result)
    assert not best.exists() and not (tmp_path / "last.pt").exists()  # reset: a rerun retrains
    again = run_toy(tmp_path, steps=4)
    assert [r["step"] for r in again.history] == [0, 1, 2, 3, 4]
    load_best(again.policy, again)
