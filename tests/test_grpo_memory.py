"""GRPO memory: the analytic prediction against the measured peak of the real update on the
substrate (CPU, live tensor bytes), and the fit check that refuses a configuration before loading."""

from __future__ import annotations

import pytest
from test_grpo import tiny_model

from copes_lib.budget import SubstrateSizes
from copes_lib.config import ConfigError
from copes_lib.grpo import GRPOConfig
from copes_lib.grpo_memory import check_fits, describe_hf_config, measure_update_peak, predict_grpo_memory
from copes_lib.grpo_sharded import ShardingConfig, launch
from copes_lib.memory_model import load_model_description

SIZES = SubstrateSizes(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=384, vocab=4096)

# Stated tolerance: the prediction may not exceed the measured peak by more than 5% and may fall
# short of it by at most 15%. Measured: 1.03 (full, full logits), 1.02 (full, chunk 32), 0.97 (LoRA,
# chunk 32); before the activation model counted the norm intermediates, q/k norms and rotary tensors
# and the log-probs used log_softmax: 1.13, 1.25, 1.14.
LOW, HIGH = 0.95, 1.15


@pytest.mark.parametrize("use_lora,chunk", [(False, 0), (True, 32)])
def test_measured_peak_of_the_update_is_within_the_stated_tolerance_of_the_prediction(use_lora, chunk):
    config = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=2, micro_batch_size=4,
                        use_lora=use_lora, lora_r=8, lora_alpha=16, logprob_chunk=chunk)
    result = measure_update_peak(config, SIZES, prompt_tokens=16, completion_tokens=48)
    assert LOW <= result["ratio"] <= HIGH, result


def test_prediction_terms_follow_the_configuration():
    desc = load_model_description("qwen3_4b")
    base = GRPOConfig(micro_batch_size=1, logprob_chunk=1024)
    one = predict_grpo_memory(desc, base, 8192, 1)
    eight = predict_grpo_memory(desc, base, 8192, 8, sharded=True, param_dtype="bfloat16",
                                activation_checkpointing=True)
    assert eight.parts["weights_grads_adam"] == pytest.approx(one.parts["weights_grads_adam"] / 8)
    assert eight.total_gib < one.total_gib
    full_logits = predict_grpo_memory(desc, GRPOConfig(micro_batch_size=1), 8192, 1)
    assert full_logits.phases["update"] > one.phases["update"]
    small_rollouts = predict_grpo_memory(desc, GRPOConfig(micro_batch_size=1, rollout_batch_size=8), 8192, 1)
    assert small_rollouts.phases["rollout"] == pytest.approx(one.phases["rollout"] * 8 / 512)
    lora = predict_grpo_memory(desc, GRPOConfig(micro_batch_size=1, logprob_chunk=1024, use_lora=True), 8192, 1)
    assert "reference_copy" not in lora.parts and lora.total_gib < one.total_gib


def test_full_grpo_on_a_4b_model_fits_8x48_for_the_shipped_configuration_and_not_on_one_gpu():
    desc = load_model_description("qwen3_4b")
    shipped = GRPOConfig(micro_batch_size=1, logprob_chunk=1024)
    plan = check_fits(desc, shipped, 32 * 1024, processes=8, capacity_gib=48.0)
    assert plan.total_gib < 48.0
    with pytest.raises(ConfigError) as err:
        check_fits(desc, GRPOConfig(), 8192, processes=1, capacity_gib=48.0, sharded=False,
                   param_dtype="float32", activation_checkpointing=False)
    message = str(err.value)
    assert "predicted" in message and "GiB per GPU" in message and "LoRA" in message and "offload" in message
    # at the paper's 128K context our engine (no sequence parallelism, no offload) does not fit 8x48
    with pytest.raises(ConfigError, match="131072 tokens"):
        check_fits(desc, shipped, 128 * 1024, processes=8, capacity_gib=48.0)


def test_launch_refuses_a_configuration_that_cannot_fit_before_starting_processes(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    desc = describe_hf_config(model.config)
    assert desc.params == sum(p.numel() for p in model.parameters())
    from types import SimpleNamespace

    batch = SimpleNamespace(prompt_ids=[[1, 2]] * 2, completion_ids=[[3, 4, 5]] * 2, model_mask=[[1, 1, 1]] * 2)
    with pytest.raises(ConfigError, match="predicted"):
        launch(tmp_path / "model", [{"batch": batch, "advantages": [1.0, -1.0], "pad_id": 0}],
               GRPOConfig(group_size=2, prompt_batch_size=1, mini_batch_size=1),
               ShardingConfig(processes=2, backend="gloo"), tmp_path / "job", capacity_gib=1e-6)
    assert not (tmp_path / "job").exists()


def test_feasibility_rows_agree_with_check_fits():
    from copes_lib.grpo_memory import feasibility

    desc = load_model_description("qwen3_4b")
    shipped = GRPOConfig(micro_batch_size=1, logprob_chunk=1024)
    fits = feasibility(desc, shipped, 32 * 1024, processes=8, capacity_gib=48.0)
    assert fits["fits"] and fits["advice"] == ""
    assert fits["gib_per_gpu"] == pytest.approx(check_fits(desc, shipped, 32 * 1024, 8, 48.0).total_gib)
    too_long = feasibility(desc, shipped, 128 * 1024, processes=8, capacity_gib=48.0)
    assert not too_long["fits"] and too_long["gib_per_gpu"] > 48.0 and "LoRA" in too_long["advice"]
