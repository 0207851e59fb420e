"""Sharded GRPO (FSDP2, torchrun, gloo on CPU) equals the single-process update.

Each launch starts a torchrun job of 1-2 processes (~10-30 s on a loaded 2-core machine).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import pytest
import torch
from test_grpo import ToyRolloutConfig, tiny_model, toy_rollout

from copes_lib.grpo import GRPOConfig, Reference, attach_lora, group_advantages, grpo_update
from copes_lib.grpo_sharded import ShardingConfig, launch

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _updates(model, config: GRPOConfig, seeds=(7,)):
    out = []
    for seed in seeds:
        tasks = [t for t in range(config.prompt_batch_size) for _ in range(config.group_size)]
        batch = toy_rollout(model, None, tasks, None, ToyRolloutConfig(), seed)
        adv = group_advantages(torch.tensor(batch.rewards), config.group_size)
        out.append({"batch": batch, "advantages": adv, "pad_id": 0})
    return out


def _single_process(model, config: GRPOConfig, updates):
    policy = attach_lora(model, config) if config.use_lora else model
    policy.eval()
    reference = Reference(policy, config.use_lora, needed=config.kl_coef > 0)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=config.weight_decay)
    stats = [grpo_update(policy, optimizer, u["batch"], u["advantages"], config, reference, u["pad_id"])
             for u in updates]
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    params = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    return stats, grads, params


@pytest.mark.parametrize("use_lora", [False, True])
def test_two_process_fsdp_update_equals_single_process(tmp_path, use_lora):
    # Two mini-batches per step: the second is taken after an optimizer step, so pi_old, the KL to the
    # reference (a sharded frozen copy, or the LoRA policy with adapters off) and the gradient sum over
    # processes all matter. fp32 compute, so the only differences are summation order.
    config = GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=2, micro_batch_size=3, lr=1e-3,
                        kl_coef=0.1, use_lora=use_lora, lora_r=2, lora_alpha=4, logprob_chunk=5, seed=3)
    model = tiny_model(seed=1)
    model.save_pretrained(tmp_path / "model")
    updates = _updates(model, config)
    ref_stats, ref_grads, _ = _single_process(copy.deepcopy(model), config, updates)

    sharding = ShardingConfig(processes=2, backend="gloo", param_dtype="float32", activation_checkpointing=True)
    result = launch(tmp_path / "model", updates, config, sharding, tmp_path / "job2", return_grads=True, env=_env())
    assert result["processes"] == 2
    assert set(result["grads"]) == set(ref_grads)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(result["grads"][name], grad, rtol=1e-5, atol=1e-5, msg=name)
    for key in ("loss", "kl", "grad_norm", "clip_frac", "ratio_mean"):
        assert result["stats"][0][key] == pytest.approx(ref_stats[0][key], rel=1e-5, abs=1e-6), key
    assert ref_stats[0]["kl"] > 0  # the reference really was used


def test_bf16_sharding_keeps_fp32_master_weights_and_trains(tmp_path):
    config = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=2, micro_batch_size=4, lr=1e-2,
                        kl_coef=1e-3, seed=3)
    model = tiny_model(seed=1)
    model.save_pretrained(tmp_path / "model")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = launch(tmp_path / "model", _updates(model, config), config,
                    ShardingConfig(processes=2, backend="gloo", param_dtype="bfloat16"), tmp_path / "job",
                    env=_env())
    assert all(t.dtype == torch.float32 for t in result["trainable"].values())
    moved = max(float((result["trainable"][n] - before[n]).abs().max()) for n in before)
    assert moved > 1e-3
    assert torch.isfinite(torch.tensor(result["stats"][0]["loss"]))
    with pytest.raises(FileExistsError, match="never overwritten"):
        launch(tmp_path / "model", [], config, ShardingConfig(processes=1, backend="gloo"), tmp_path / "job")


def test_launch_rejects_bad_updates(tmp_path):
    config = GRPOConfig(group_size=2, prompt_batch_size=1, mini_batch_size=1)
    with pytest.raises(ValueError, match="batch, advantages and pad_id"):
        launch(tmp_path, [{"batch": None}], config, ShardingConfig(processes=1, backend="gloo"), tmp_path / "j")
    assert sys.executable  # the job runs under this interpreter


def test_shard_turns_on_activation_checkpointing_without_dropout_mode(tmp_path):
    # One process group of size 1 inside the test process: every decoder layer must run its forward
    # twice in a forward + backward (recomputed), while attention stays in eval mode (no dropout).
    import torch.distributed as dist

    from copes_lib.grpo import completion_logprobs, pack
    from copes_lib.grpo_sharded import decoder_layers, shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = tiny_model()
        calls = []
        for layer in decoder_layers(model):
            layer.self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
        root = shard(model, ShardingConfig(processes=1, backend="gloo", param_dtype="float32"))
        assert len(calls) == len(decoder_layers(model))  # shard's one no-grad forward (FSDP's lazy init)
        calls.clear()
        packed = pack([[1, 2]], [[3, 4, 5]], [[1, 1, 1]], pad_id=0)
        logps, _ = completion_logprobs(root, packed, chunk_tokens=2)
        assert len(calls) == 2
        logps.sum().backward()
        assert len(calls) == 4  # recomputed in backward
        assert not any(layer.self_attn.training for layer in decoder_layers(model))
        with torch.no_grad():
            completion_logprobs(root, packed)
        assert len(calls) == 6  # no recompute without gradients
    finally:
        dist.destroy_process_group()


def test_sharded_updater_carries_weights_and_adam_state_between_jobs(tmp_path):
    # Two steps, each a separate 2-process job started from the previous job's weights and AdamW
    # state, against two in-process grpo_update calls on the same rollouts. Without the carried AdamW
    # state the second step would be a first Adam step again: parameter differences ~lr, far above
    # the 5% of lr allowed here (AdamW's lr * sign(g) first step amplifies float noise in near-zero
    # gradients, so bit-equality of the parameters is not expected).
    from copes_lib.grpo_sharded import ShardedUpdater

    config = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=2, micro_batch_size=4, lr=1e-3,
                        kl_coef=0.1, seed=3)
    model = tiny_model(seed=1)
    model.save_pretrained(tmp_path / "model")
    updates = _updates(model, config, seeds=(7, 8))
    ref_model = copy.deepcopy(model)
    reference = Reference(ref_model, False)
    optimizer = torch.optim.AdamW(ref_model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    expected = [grpo_update(ref_model, optimizer, u["batch"], u["advantages"], config, reference) for u in updates]

    driver_policy = copy.deepcopy(model)
    updater = ShardedUpdater(tmp_path / "model", config,
                             ShardingConfig(processes=2, backend="gloo", param_dtype="float32"), tmp_path / "jobs",
                             env=_env())
    got = [updater(driver_policy, u["batch"], u["advantages"], u["pad_id"]) for u in updates]
    for step, (a, b) in enumerate(zip(expected, got)):
        for key in ("loss", "kl", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), (step, key)
    assert expected[1]["kl"] > 0
    for (name, p), q in zip(ref_model.named_parameters(), driver_policy.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0.05 * config.lr, msg=name)


def test_repeated_two_process_jobs_none_fails(tmp_path):
    # benchmarks/stress_grpo_sharded.py --repeats 20 is the full check (~5 min on 2 cores); 2 here
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stress_grpo_sharded import run_jobs

    out = run_jobs(2, tmp_path)
    assert out["failed"] == 0, out["failures"]


def test_driver_accepts_a_completed_job_whose_rank_failed_at_teardown(tmp_path):
    from copes_lib import runs
    from copes_lib.grpo_sharded import _job_result

    with pytest.raises(RuntimeError, match="exit 134"):
        _job_result(tmp_path, 134, "terminate called without an active exception")
    runs.save_checkpoint(tmp_path / "result.pt", {"trainable": {}, "stats": [{"loss": 1.0}], "processes": 2})
    (tmp_path / "torchrun.log").write_text("terminate called without an active exception\n")
    with pytest.warns(RuntimeWarning, match="teardown"):
        result = _job_result(tmp_path, 134, "")
    assert result["stats"] == [{"loss": 1.0}] and result["processes"] == 2
    assert "result is complete" in (tmp_path / "torchrun.log").read_text()
    assert _job_result(tmp_path, 0, "")["processes"] == 2  # a clean exit: no warning needed


def test_lora_bf16_sharded_update_trains_adapters_in_fp32(tmp_path):
    # LoRA under bf16 mixed precision (the gpu profile's 04/05 setting): the adapters are the only
    # trainable parameters, stored and updated in fp32 while the frozen base is gathered in bf16.
    config = GRPOConfig(group_size=4, prompt_batch_size=2, mini_batch_size=2, micro_batch_size=4, lr=1e-2,
                        kl_coef=1e-3, use_lora=True, lora_r=2, lora_alpha=4, seed=3)
    model = tiny_model(seed=1)
    model.save_pretrained(tmp_path / "model")
    updates = _updates(model, config)
    ref_stats, _, ref_params = _single_process(copy.deepcopy(model), config, updates)
    result = launch(tmp_path / "model", updates, config,
                    ShardingConfig(processes=2, backend="gloo", param_dtype="bfloat16"), tmp_path / "job", env=_env())
    assert result["processes"] == 2
    assert set(result["trainable"]) == set(ref_params) and ref_params
    assert all(t.dtype == torch.float32 for t in result["trainable"].values())
    assert torch.isfinite(torch.tensor(result["stats"][0]["loss"]))
    lora_b = [n for n in ref_params if "lora_B" in n]
    assert lora_b and max(float(result["trainable"][n].abs().max()) for n in lora_b) > 1e-3  # B starts at 0
    # Against an fp32 single-process step: bf16 gradients agree to bf16 precision, and AdamW's first
    # step (about lr * sign(g)) may flip the sign of near-zero gradient entries, so the updates are
    # compared by direction (measured: cosine >= 0.968 per tensor, grad norms within 0.5%).
    assert result["stats"][0]["grad_norm"] == pytest.approx(ref_stats[0]["grad_norm"], rel=0.02)
    start = attach_lora(tiny_model(seed=1), config).state_dict()
    for name, value in ref_params.items():
        ours, theirs = (result["trainable"][name] - start[name]).flatten(), (value - start[name]).flatten()
        assert float(torch.nn.functional.cosine_similarity(ours, theirs, dim=0)) > 0.9, name
