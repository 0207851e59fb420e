"""Analytic memory model (hand-checked arithmetic, Table S7), feasibility rules, measurement, params."""

from __future__ import annotations

import math

import pytest
import torch

from copes_lib import budget, memory_model
from copes_lib.budget import SubstrateSizes, measure_peak_bytes, predict_substrate_bytes
from copes_lib.config import ConfigError, profile_params
from copes_lib.memory_model import (
    GIB,
    ModelDescription,
    es_memory,
    feasibility_table,
    full_grpo_memory,
    implied_lora_adapter_params,
    kv_bytes_per_token,
    load_model_description,
    lora_adapter_params,
    lora_grpo_memory,
    paper_table_s7,
    parameter_count,
    per_gpu_gib,
)
from copes_lib.protocols.params import BudgetNotebookParams

# A hand-checked configuration: P = 2^29 (bf16 weights = 1 GiB exactly); KV bytes per token =
# 2 x 4 full-attention layers x 8 KV heads x 128 x 2 bytes = 16,384 = 16 KiB -> 16 MiB per 1,024 tokens.
HAND = ModelDescription(name="hand", params=2**29, kv_heads=8, head_dim=128, full_attention_layers=4,
                        layers=16, heads=32)


def test_hand_checked_arithmetic():
    assert kv_bytes_per_token(HAND) == 16_384
    es = es_memory(HAND)
    assert es.intercept_gib == 1.0
    assert es.slope_gib_per_k == 1 / 64  # 16 MiB
    assert es.at(128) == 1.0 + 2.0  # 128 x 16 MiB = 2 GiB
    assert es_memory(HAND, convention="paper").slope_gib_per_k == pytest.approx(0.016)  # 16 MiB "= 0.016 GB"
    assert es_memory(HAND, sequences=4).slope_gib_per_k == 4 / 64
    full = full_grpo_memory(HAND, activation_gib_per_1k=3.0)
    assert full.intercept_gib == 8.0 and full.at(10) == 38.0  # 16 x 2^29 B = 8 GiB
    lora = lora_grpo_memory(HAND, 3.0, adapter_params=2**26)
    assert lora.parts == {"frozen_base": 2.0, "adapter_states": 1.0}  # 4P = 2 GiB; 16 x 2^26 B = 1 GiB
    assert implied_lora_adapter_params(HAND, intercept_gib=3.0) == 2**26


def test_count_params_and_lora_match_transformers():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    desc = ModelDescription(name="tiny", params=1, kv_heads=1, head_dim=2, full_attention_layers=2, layers=2,
                            heads=2, hidden=4, intermediate=6, vocab=10, tie_embeddings=True, qk_norm=True)
    # by hand, per layer: q 4x4 + k,v 2x(4x2) + o 4x4 = 48; mlp 3x4x6 = 72; norms 2x4 + 2x2 = 12 -> 132;
    # two layers 264 + tied embedding 40 + final norm 4 = 308
    assert parameter_count(desc) == 308
    # rank 1, per layer: q (4+4) + k,v 2x(4+2) + o (4+4) + gate,up 2x(4+6) + down (6+4) = 58
    assert lora_adapter_params(desc, rank=1) == 2 * 58
    config = Qwen3Config(vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=2, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 308
    # add_lora adds peft's tensors (checked once against peft 0.21 LoraConfig(target_modules=LORA_TARGETS);
    # peft is not imported here to keep the test fast)
    assert budget.add_lora(model, rank=3) == lora_adapter_params(desc, 3)


def test_qwen35_4b_reproduces_table_s7_within_rounding():
    desc = load_model_description("qwen35_4b")
    assert kv_bytes_per_token(desc) == 32 * 1024  # the paper's "32 KiB per token"
    lines = paper_table_s7(desc, convention="paper")
    assert lines["es"].intercept_gib == pytest.approx(8.68, abs=0.005)
    assert lines["es"].slope_gib_per_k == pytest.approx(0.032, abs=1e-6)
    assert lines["full_grpo"].intercept_gib == pytest.approx(69.44, abs=0.005)
    assert lines["es"].at(128) == pytest.approx(12.78, abs=0.01)
    assert lines["full_grpo"].at(128) == pytest.approx(453.44, abs=0.01)
    assert lines["lora_grpo"].at(128) == pytest.approx(402.55, abs=0.01)
    # exact units: 128 x 1,024 tokens x 32 KiB = 4 GiB of KV cache
    assert paper_table_s7(desc, convention="exact")["es"].at(128) == pytest.approx(8.68 + 4.0, abs=0.005)


def test_lora_intercept_implies_fp32_base():
    desc = load_model_description("qwen35_4b")
    fp32_base = implied_lora_adapter_params(desc, base_bytes_per_param=4)
    bf16_base = implied_lora_adapter_params(desc, base_bytes_per_param=2)
    assert 0.005 < fp32_base / desc.params < 0.03  # a rank-32 all-linear adapter is ~1-2% of a 4B model
    assert bf16_base / desc.params > 0.1
    qwen3 = load_model_description("qwen3_4b")
    assert 0.005 < lora_adapter_params(qwen3, 32) / qwen3.params < 0.03


def test_model_configs_load_and_params_match_their_shapes():
    for name in memory_model.model_description_names():
        desc = load_model_description(name)
        if desc.is_dense_known:
            assert parameter_count(desc) == desc.params, name
    with pytest.raises(ConfigError, match="valid names"):
        load_model_description("no_such_model")


@pytest.mark.parametrize("kwargs, field", [
    ({"params": -5}, "params"),
    ({"head_dim": 0}, "head_dim"),
    ({"heads": 6, "kv_heads": 4}, "kv_heads"),
    ({"layers": 4, "full_attention_layers": 8}, "full_attention_layers"),
    ({"hidden": -1}, "hidden"),
])
def test_bad_descriptions_fail_clearly(kwargs, field):
    base = {"name": "bad", "params": 10, "kv_heads": 2, "head_dim": 4, "full_attention_layers": 2}
    with pytest.raises(ConfigError, match=field):
        ModelDescription(**{**base, **kwargs})


def test_unknown_sizes_refuse_derived_estimates():
    desc = load_model_description("qwen35_4b")
    with pytest.raises(ConfigError, match="hidden"):
        memory_model.activation_bytes_per_token(desc)


def test_feasibility_rules():
    lines = paper_table_s7(load_model_description("qwen35_4b"))
    assert per_gpu_gib(lines["full_grpo"], 128, 8, "zero3_sp") == pytest.approx(453.44 / 8, abs=0.01)
    assert per_gpu_gib(lines["full_grpo"], 128, 8, "zero3_sp_offload") == pytest.approx(48.0)
    assert per_gpu_gib(lines["es"], 128, 8, "zero3_sp") == lines["es"].at(128)  # ES never shards
    rows = {(r["method"], r["context_k"]): r for r in feasibility_table(lines, [128], "zero3_sp_offload")}
    assert rows[("es", 128)]["fits_1x24"]
    assert not rows[("full_grpo", 128)]["fits_4x48"] and rows[("full_grpo", 128)]["fits_8x48"]
    with pytest.raises(ConfigError, match="valid values"):
        per_gpu_gib(lines["es"], 1, 1, "magic")


def test_live_tensor_bytes_counts_and_releases():
    tracker = budget.LiveTensorBytes()
    with tracker:
        a = torch.ones(1000)
        b = a * 2
        del b
        c = a + 1
    assert tracker.peak == 8000 and tracker.current == 8000
    del a, c
    assert tracker.current == 0


def test_live_tensor_bytes_device_filter():
    cuda_only, every = budget.LiveTensorBytes(device_type="cuda"), budget.LiveTensorBytes(device_type=None)
    with cuda_only, every:
        a = torch.ones(250)
    assert cuda_only.peak == 0 and every.peak == 1000
    del a


def test_measured_peaks_are_ordered_deterministic_and_near_prediction():
    sizes = SubstrateSizes(layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=64, vocab=128)
    es_short = measure_peak_bytes("es", sizes, 32, 1, seed=0)["peak_bytes"]
    es_long = measure_peak_bytes("es", sizes, 128, 1, seed=0)["peak_bytes"]
    full = measure_peak_bytes("full_grpo", sizes, 128, 1, seed=0)["peak_bytes"]
    lora = measure_peak_bytes("lora_grpo", sizes, 128, 1, seed=0, lora_rank=2)["peak_bytes"]
    assert es_long > es_short >= 4 * sizes.description().params
    assert full > lora > es_long
    assert full >= 16 * sizes.description().params  # weights + grads + 2 Adam moments at least
    assert measure_peak_bytes("es", sizes, 128, 1, seed=0)["peak_bytes"] == es_long
    predicted = predict_substrate_bytes("full_grpo", sizes, 128, 1)
    assert 0.5 < full / predicted < 2.0


def test_notebook_params_checks_and_profiles():
    params = BudgetNotebookParams()
    assert params.context_lengths == [256, 512, 1024, 2048]
    with pytest.raises(ConfigError, match="CONTEXTS"):
        BudgetNotebookParams(CONTEXTS="64,128,256")
    with pytest.raises(ConfigError, match="MEASURE_KV_HEADS"):
        BudgetNotebookParams(MEASURE_HEADS=4, MEASURE_KV_HEADS=3)
    with pytest.raises(ConfigError, match="DEVICE"):
        BudgetNotebookParams(DEVICE="tpu")
    for profile in ("smoke", "cpu", "gpu"):
        BudgetNotebookParams(**{**profile_params(profile, BudgetNotebookParams), "PROFILE": profile})


def test_paper_gpu_hours_rederived():
    rows = {r["method"]: r for r in budget.paper_gpu_hours_table()}
    assert rows["standard ES (best)"]["derived_gpu_h"] == pytest.approx(480.60, abs=0.1)
    assert rows["LoRA-GRPO (best)"]["derived_gpu_h"] == pytest.approx(314.45, abs=0.05)
    assert math.isclose(rows["CoPES @16"]["gpu_h_per_step"], 68.65 / 16)
    assert GIB == 2**30


def test_local_lora_matches_peft_count_and_keeps_outputs():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    before = model(input_ids=ids).logits
    desc = ModelDescription(name="t", params=1, kv_heads=1, head_dim=4, full_attention_layers=2, layers=2, heads=2,
                            hidden=8, intermediate=12, vocab=16, tie_embeddings=True, qk_norm=True)
    assert budget.add_lora(model, rank=2) == lora_adapter_params(desc, 2)
    assert torch.equal(model(input_ids=ids).logits, before)  # B = 0 at initialisation


def test_agent_step_costs_split_into_phases():
    from copes_lib import substrate
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.rollout import RolloutConfig, make_env
    from copes_lib.tasks import load_tasks

    tokenizer = substrate.get_tokenizer("smoke", substrate_config("smoke").vocab_size)
    model = substrate.build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer)
    tasks = load_tasks("smoke", "math", "train")[:2]
    config = RolloutConfig(max_new_tokens=6, max_context=256, prompt_style="plain")
    with make_env("math", "smoke") as env:
        es = budget.measure_agent_step_costs("es", model, tokenizer, env, tasks, config, population=2, group=2, seed=0)
        grpo = budget.measure_agent_step_costs("grpo", model, tokenizer, env, tasks, config, population=2, group=2,
                                               seed=0)
    assert es["trajectories"] == 4 and grpo["trajectories"] == 4
    for row in (es, grpo):
        phases = [row[f"{phase}_s"] for phase in budget.PHASES]
        assert all(t >= 0 for t in phases) and sum(phases) == pytest.approx(row["step_s"])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    with pytest.raises(ConfigError, match="valid values"):
        budget.measure_agent_step_costs("ppo", model, tokenizer, None, tasks, config, 2, 2, 0)


def test_step_costs_time_the_training_engines(monkeypatch):
    """The timed updates are the engines' own (es.ES.update, grpo.grpo_update), not re-implementations."""
    import copes_lib.es as es_module
    import copes_lib.grpo as grpo_module

    calls = []
    real_grpo_update, real_es_update = grpo_module.grpo_update, es_module.ES.update
    monkeypatch.setattr(grpo_module, "grpo_update",
                        lambda *a, **k: calls.append("grpo.grpo_update") or real_grpo_update(*a, **k))
    monkeypatch.setattr(es_module.ES, "update", lambda self, *a: calls.append("es.ES.update") or real_es_update(self, *a))
    sizes = SubstrateSizes(layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=64, vocab=64)
    for method in ("es", "grpo"):
        row = budget.measure_step_costs(method, sizes, prompts=1, population=2, group=2, prompt_len=4, new_tokens=2,
                                        seed=0)
        assert row["update_s"] > 0
    assert calls == ["es.ES.update", "grpo.grpo_update"]


def test_cuda_device_without_cuda_is_refused_by_name(monkeypatch):
    import torch

    from copes_lib import runs
    from copes_lib.config import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"DEVICE = 'cuda' but this machine has no CUDA device.*\['cpu'\]"):
        runs.check_device("cuda", "DEVICE")
    with pytest.raises(ConfigError, match=r"DEVICE = 'tpu' is not valid; valid values: \['cpu'\]"):
        runs.check_device("tpu", "DEVICE")
    assert runs.check_device("cpu") == "cpu"
    sizes = budget.SubstrateSizes(layers=1, hidden=16, heads=2, kv_heads=1, head_dim=8, intermediate=32, vocab=32)
    with pytest.raises(ConfigError, match="device = 'cuda'"):
        budget.measure_peak_bytes("es", sizes, 16, 1, 0, device="cuda")
    with pytest.raises(ConfigError, match="device = 'cuda'"):
        budget.measure_step_costs("es", sizes, prompts=1, population=2, group=2, prompt_len=4, new_tokens=2, seed=0,
                                  device="cuda")
