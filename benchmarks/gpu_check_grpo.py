"""GPU check of GRPO at scale (called by benchmarks/gpu_check.sh): one small model, 2 updates.

1. Single process, fp32 master weights under bf16 autocast, chunked log-probs: peak
   ``torch.cuda.max_memory_allocated`` of the second update vs ``grpo_memory.predict_grpo_memory``.
2. liger-kernel's fused linear cross-entropy log-probs vs the chunked torch path (max |difference|),
   if liger-kernel is installed; otherwise recorded as not run.
3. With 2 or more GPUs: the FSDP2 engine (``copes_lib.grpo_sharded``, NCCL, bf16 parameters, fp32
   master weights, activation checkpointing) on 2 GPUs for 2 updates, its peak per GPU vs the
   prediction, and its update time.

Writes --out (default results/bench/gpu/grpo.json) atomically, mirrored to $OUT/gpu_check/ when OUT
is set. Without a CUDA device it exits with status 2 and writes nothing, unless ``--allow-cpu`` (a dry
run of this script's logic; gpu_check.sh --dry-run passes it).
Run: ``python benchmarks/gpu_check_grpo.py [--out results/bench/gpu/grpo.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from copes_lib import grpo, runs
from copes_lib.budget import SubstrateSizes, build_substrate_model
from copes_lib.grpo_memory import measure_update_peak, predict_grpo_memory
from copes_lib.memory_model import GIB

REPO = Path(__file__).resolve().parents[1]
PROMPT, COMPLETION, TRAJECTORIES = 64, 448, 16
# the model on CUDA (the shape the GRPO goal is judged at: gpu_check.GRPO_SHAPE) and in the CPU dry run
GPU_SIZES = SubstrateSizes(layers=8, hidden=1024, heads=16, kv_heads=8, head_dim=64, intermediate=3072, vocab=32768)
CPU_SIZES = SubstrateSizes(layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128, vocab=512)


def rollouts(vocab: int, seed: int) -> SimpleNamespace:
    gen = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        prompt_ids=[torch.randint(3, vocab, (PROMPT,), generator=gen).tolist() for _ in range(TRAJECTORIES)],
        completion_ids=[torch.randint(3, vocab, (COMPLETION,), generator=gen).tolist() for _ in range(TRAJECTORIES)],
        model_mask=[[1] * COMPLETION for _ in range(TRAJECTORIES)])


def workload(cuda: bool) -> tuple[SubstrateSizes, grpo.GRPOConfig]:
    """The model sizes and GRPO configuration of the check: on CUDA a ~134M-parameter substrate under
    bf16 autocast; on CPU (the dry run, whose ratio tests/test_memory_grpo_dry_run.py checks) tiny."""
    sizes = GPU_SIZES if cuda else CPU_SIZES
    config = grpo.GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=4, micro_batch_size=4, lr=1e-6,
                             amp_dtype="bfloat16" if cuda else "none", logprob_chunk=256, rollout_copy=False)
    return sizes, config


def single_process(sizes: SubstrateSizes, config: grpo.GRPOConfig, device: str) -> dict:
    model = build_substrate_model(sizes, seed=0, device=device)
    reference = grpo.Reference(model, False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    advantages = torch.linspace(-1.0, 1.0, TRAJECTORIES)
    rows = []
    for step in range(2):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        stats = grpo.grpo_update(model, optimizer, rollouts(sizes.vocab, step), advantages, config, reference)
        if device == "cuda":
            torch.cuda.synchronize()
        rows.append({"update_s": time.perf_counter() - t0, "peak_gib": runs.peak_memory_gib(device),
                     "loss": stats["loss"], "grad_norm": stats["grad_norm"]})
    plan = predict_grpo_memory(sizes.description(), config, PROMPT + COMPLETION)
    predicted = plan.total_bytes - plan.parts.get("rollout_kv_cache", 0.0)
    out = {"updates": rows, "predicted_gib": predicted / GIB,
           "measured_over_predicted": rows[-1]["peak_gib"] / (predicted / GIB),
           "parts_gib": {k: v / GIB for k, v in plan.parts.items()}}
    if device != "cuda":  # a CPU's peak RSS counts the interpreter and libraries: live tensor bytes instead
        live = measure_update_peak(config, sizes, PROMPT, COMPLETION)
        out.update(measured="live CPU tensor bytes (grpo_memory.measure_update_peak)",
                   predicted_gib=live["predicted_bytes"] / GIB, measured_over_predicted=live["ratio"])
    return out


def liger_check(sizes: SubstrateSizes, device: str) -> dict:
    try:
        import liger_kernel  # noqa: F401
    except ImportError as err:
        return {"ran": False, "why": f"liger-kernel not importable: {err}"}
    if device != "cuda":
        return {"ran": False, "why": "needs CUDA"}
    model = build_substrate_model(sizes, seed=0, device=device)
    batch = rollouts(sizes.vocab, 0)
    packed = grpo.pack(batch.prompt_ids[:4], batch.completion_ids[:4], batch.model_mask[:4], 0, device)
    with torch.no_grad():
        ours = grpo.completion_logprobs(model, packed, 0.7, chunk_tokens=256)[0]
        fused = grpo.completion_logprobs(model, packed, 0.7, backend="liger")[0]
    return {"ran": True, "max_abs_diff_fp32": float((ours - fused).abs().max())}


def sharded(sizes: SubstrateSizes, config: grpo.GRPOConfig) -> dict:
    from copes_lib.grpo_sharded import ShardingConfig, launch

    if torch.cuda.device_count() < 2:
        return {"ran": False, "why": f"{torch.cuda.device_count()} GPU(s); the sharded check needs 2"}
    sharding = ShardingConfig(processes=2, backend="nccl", param_dtype="bfloat16")
    updates = [{"batch": rollouts(sizes.vocab, k), "advantages": torch.linspace(-1.0, 1.0, TRAJECTORIES),
                "pad_id": 0} for k in range(2)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="gpu_check_grpo_") as tmp:
        build_substrate_model(sizes, seed=0).save_pretrained(Path(tmp) / "model")
        result = launch(Path(tmp) / "model", updates, config, sharding, Path(tmp) / "job", env=env)
    plan = predict_grpo_memory(sizes.description(), config, PROMPT + COMPLETION, 2, True, "bfloat16", True)
    return {"ran": True, "updates": result["stats"], "predicted_gib": plan.total_gib,
            "measured_over_predicted": result["stats"][-1]["peak_gib"] / plan.total_gib,
            "parts_gib": {k: v / GIB for k, v in plan.parts.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(runs.RESULTS_ROOT / "bench" / "gpu" / "grpo.json"))
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on CPU (tiny sizes)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("gpu_check_grpo: no CUDA device; GPU figures stay 'not yet run on a GPU'", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    sizes, config = workload(cuda)
    result = {"check": "gpu_check_grpo", "sizes": sizes.to_dict(), "params": sizes.description().params,
              "tokens_per_trajectory": PROMPT + COMPLETION, "trajectories": TRAJECTORIES, "grpo": config.to_dict(),
              "single_process": single_process(sizes, config, device), "liger": liger_check(sizes, device),
              "sharded_2gpu": sharded(sizes, config) if cuda else {"ran": False, "why": "CPU dry run"},
              "device": runs.device_info(), "git": runs.git_state(), "dry_run_on_cpu": not cuda}
    path = runs.atomic_write_json(args.out, result)
    if os.environ.get("OUT"):  # the GPU machine's folder that comes back (gpu_check.sh sets the layout)
        runs.atomic_write_json(Path(os.environ["OUT"]) / "gpu_check" / Path(args.out).parent.name / "grpo.json", result)
    print(json.dumps({k: result[k] for k in ("single_process", "liger")}, indent=1, default=str)[:3000])
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
