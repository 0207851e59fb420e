"""Overhead of the sharding engine: FSDP2 GRPO update time with 2 processes / with 1 process, on CPU.

Both runs are torchrun jobs of ``copes_lib.grpo_sharded`` (gloo, fp32 compute, activation
checkpointing, chunked log-probs) on the same seeded substrate-sized Qwen3 and the same synthetic
rollouts; the single-process in-process ``grpo.grpo_update`` is timed too. The first update of a
job is a warm-up; the median of the others is reported. Every process runs OMP_NUM_THREADS
threads (1 by default), so 2 processes use twice the cores of 1: the ratio is the data-parallel
speed-up net of the engine's overhead (collectives, re-gathering, recompute). The 1-process FSDP job
over the plain in-process update (no activation checkpointing) is the engine's fixed cost. On a
shared machine both are noisy: the per-update times and the load average are saved with them.

Saved to results/bench/grpo_sharded.json (a new run replaces the previous file atomically).
Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_grpo_sharded.py [--updates 4]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from copes_lib import grpo, runs
from copes_lib.budget import SubstrateSizes, build_substrate_model
from copes_lib.grpo_sharded import ShardingConfig, launch

REPO = Path(__file__).resolve().parents[1]


def synthetic_rollouts(vocab: int, trajectories: int, prompt_len: int, completion_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (prompt_len,), generator=gen).tolist() for _ in range(trajectories)]
    comps = [torch.randint(3, vocab, (completion_len - i % 5,), generator=gen).tolist() for i in range(trajectories)]
    masks = [[int(j % 7 != 6) for j in range(len(c))] for c in comps]  # every 7th token a "tool" token
    rewards = torch.rand(trajectories, generator=gen).round()
    return SimpleNamespace(prompt_ids=prompts, completion_ids=comps, model_mask=masks), rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=4, help="updates per job (the first is a warm-up)")
    parser.add_argument("--completion", type=int, default=96, help="completion tokens per trajectory")
    args = parser.parse_args()
    if args.updates < 2:
        raise SystemExit("--updates must be >= 2 (the first update is a warm-up)")

    sizes = SubstrateSizes(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=384, vocab=4096)
    config = grpo.GRPOConfig(group_size=4, prompt_batch_size=4, mini_batch_size=4, micro_batch_size=4, lr=1e-5,
                             kl_coef=1e-3, logprob_chunk=64, seed=0)
    updates = []
    for k in range(args.updates):
        batch, rewards = synthetic_rollouts(sizes.vocab, 16, 32, args.completion, seed=k)
        updates.append({"batch": batch, "advantages": grpo.group_advantages(rewards, config.group_size),
                        "pad_id": 0})

    model = build_substrate_model(sizes, seed=0)
    policy = copy.deepcopy(model)
    reference = grpo.Reference(policy, False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    plain = []
    for update in updates:
        t0 = time.perf_counter()
        grpo.grpo_update(policy, optimizer, update["batch"], update["advantages"], config, reference)
        plain.append(time.perf_counter() - t0)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    timed: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_grpo_sharded_") as tmp:
        model.save_pretrained(Path(tmp) / "model")
        for processes in (1, 2):
            sharding = ShardingConfig(processes=processes, backend="gloo", param_dtype="float32")
            result = launch(Path(tmp) / "model", updates, config, sharding, Path(tmp) / f"job{processes}", env=env)
            timed[processes] = [row["update_s"] for row in result["stats"]]

    def summary(times: list[float]) -> dict[str, float]:
        rest = times[1:]
        return {"median_s": statistics.median(rest), "min_s": min(rest), "max_s": max(rest), "all_s": times}

    one, two = summary(timed[1]), summary(timed[2])
    result = {
        "benchmark": "grpo_sharded",
        "ratio_2proc_over_1proc": two["median_s"] / one["median_s"],
        "ratio_1proc_fsdp_over_plain": one["median_s"] / statistics.median(plain[1:]),
        "fsdp_1proc": one, "fsdp_2proc": two, "plain_in_process": summary(plain),
        "setup": {"sizes": sizes.to_dict(), "params": sizes.description().params, "trajectories": 16,
                  "prompt_tokens": 32, "completion_tokens_max": args.completion, "grpo": config.to_dict(),
                  "sharding": "gloo, fp32, activation checkpointing, reshard after forward",
                  "omp_num_threads_per_process": os.environ.get("OMP_NUM_THREADS", "unset"),
                  "load_average_1min": os.getloadavg()[0]},
        "device": runs.device_info(), "git": runs.git_state(),
    }
    path = runs.atomic_write_json(runs.RESULTS_ROOT / "bench" / "grpo_sharded.json", result)
    print(json.dumps({k: result[k] for k in ("ratio_2proc_over_1proc", "ratio_1proc_fsdp_over_plain")}, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
