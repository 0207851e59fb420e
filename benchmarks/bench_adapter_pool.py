"""Adapter-pool forward cost: 16 stacked LoRA slots vs the bare frozen substrate vs 16 separate peft adapters.

Measured in one run on the same input batch (saved to results/bench/adapter_pool.json):
- bare: the frozen substrate alone (no adapters);
- pool: the substrate + the 16-slot pool mixed by given per-token weights (two batched matmuls per
  target layer), goal: pool / bare < 2;
- pool + R0 / pool + R1: the same including the router (R1 adds its adapter-free first pass);
- peft loop: the 16 slots exported as PEFT adapters and run as 16 separate forwards (one per adapter,
  ``set_adapter``), what mixing 16 experts costs without stacking;
- training step (forward + backward) of pool + R0 vs the bare substrate's forward + backward.

Timings are medians over repeats after a warm-up. The substrate is randomly initialised with the
profile's shape (timing does not depend on the weights). Run:
``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_adapter_pool.py --profile cpu``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch

from copes_lib import runs
from copes_lib.config import build, profile_params
from copes_lib.molora.lm import build_corpus_lm, lm_loss
from copes_lib.molora.pool import AdapterPool, PoolConfig, export_peft
from copes_lib.molora.routers import RouterConfig, make_router
from copes_lib.protocols.paper_b.molora_params import MoloraRouterParams, MoloraSubstrateParams


def median_time(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu", choices=("smoke", "cpu", "gpu"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=12, help="sequences per forward")
    args = parser.parse_args()

    sub_params = build(MoloraSubstrateParams, {**profile_params(args.profile, MoloraSubstrateParams),
                                               "PROFILE": args.profile})
    cell_params = build(MoloraRouterParams, {**profile_params(args.profile, MoloraRouterParams), "PROFILE": args.profile})
    cfg = sub_params.substrate_config()
    device = torch.device(cell_params.DEVICE if torch.cuda.is_available() or cell_params.DEVICE == "cpu" else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = build_corpus_lm(cfg, device=device).eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len), generator=generator).to(device)
    pool_cfg = PoolConfig(n_slots=cell_params.N_SLOTS, rank=cell_params.RANK, alpha=cell_params.LORA_ALPHA,
                          targets=cell_params.TARGETS)
    pool = AdapterPool(model, pool_cfg, seed=0)
    with torch.no_grad():
        for key in pool.B:  # non-zero B, as after training
            pool.B[key].normal_(0, 0.02, generator=None)
    weights = torch.softmax(torch.randn(args.batch, cfg.seq_len, pool_cfg.n_slots, generator=generator), -1).to(device)
    r0 = make_router(RouterConfig(kind="r0"), cfg.d_model, pool_cfg.n_slots).to(device)
    r1 = make_router(RouterConfig(kind="r1"), cfg.d_model, pool_cfg.n_slots).to(device)

    def forward(gates):
        with torch.no_grad(), pool.gated(gates):
            model(input_ids=ids)
        sync()

    def routed(router):
        with torch.no_grad():
            gates = router(router.features(model, pool, ids))
            with pool.gated(gates):
                model(input_ids=ids)
        sync()

    def train_step(use_pool: bool):
        def step():
            if use_pool:
                gates = r0(r0.features(model, pool, ids[:, :-1]))
                with pool.gated(gates):
                    loss = lm_loss(model(input_ids=ids[:, :-1]).logits, ids[:, 1:]).mean()
                loss.backward()
            else:  # bare substrate with trainable weights: a like-for-like forward + backward
                loss = lm_loss(trainable(input_ids=ids[:, :-1]).logits, ids[:, 1:]).mean()
                loss.backward()
            sync()
        return step

    trainable = copy.deepcopy(model).requires_grad_(True)
    times = {
        "bare_forward_s": median_time(lambda: forward(None), args.repeats),
        "pool_forward_s": median_time(lambda: forward(weights), args.repeats),
        "pool_r0_forward_s": median_time(lambda: routed(r0), args.repeats),
        "pool_r1_forward_s": median_time(lambda: routed(r1), args.repeats),
        "bare_train_step_s": median_time(train_step(False), args.repeats),
        "pool_r0_train_step_s": median_time(train_step(True), args.repeats),
    }

    from peft import PeftModel

    with tempfile.TemporaryDirectory() as tmp:
        for slot in range(pool_cfg.n_slots):
            export_peft(pool, slot, f"{tmp}/slot{slot}")
        pool.remove()
        peft_model = PeftModel.from_pretrained(copy.deepcopy(model), f"{tmp}/slot0", adapter_name="slot0")
        for slot in range(1, pool_cfg.n_slots):
            peft_model.load_adapter(f"{tmp}/slot{slot}", adapter_name=f"slot{slot}")
        peft_model.eval()

        def peft_loop():
            with torch.no_grad():
                mixed = 0.0
                for slot in range(pool_cfg.n_slots):
                    peft_model.set_adapter(f"slot{slot}")
                    mixed = mixed + weights[..., slot:slot + 1] * peft_model(input_ids=ids).logits
            sync()

        times["peft_loop_16_forward_s"] = median_time(peft_loop, max(3, args.repeats // 2), warmup=1)

    bare = times["bare_forward_s"]
    result = {
        "profile": args.profile, "device": str(device), "threads": torch.get_num_threads(),
        "batch": args.batch, "seq_len": cfg.seq_len, "d_model": cfg.d_model, "vocab": cfg.vocab_size,
        "n_layers": cfg.n_layers, "n_slots": pool_cfg.n_slots, "rank": pool_cfg.rank, "targets": pool_cfg.targets,
        "substrate_params": sum(p.numel() for p in model.parameters()),
        "pool_params": sum(p.numel() for p in pool.parameters()),
        **times,
        "ratio_pool_vs_bare": times["pool_forward_s"] / bare,
        "ratio_pool_r0_vs_bare": times["pool_r0_forward_s"] / bare,
        "ratio_pool_r1_vs_bare": times["pool_r1_forward_s"] / bare,
        "ratio_peft_loop_vs_bare": times["peft_loop_16_forward_s"] / bare,
        "ratio_peft_loop_vs_pool": times["peft_loop_16_forward_s"] / times["pool_forward_s"],
        "ratio_train_step_pool_vs_bare": times["pool_r0_train_step_s"] / times["bare_train_step_s"],
        "goal_pool_under_2x_bare": times["pool_forward_s"] / bare < 2.0,
    }
    path = runs.RESULTS_ROOT / "bench" / "adapter_pool.json"
    runs.atomic_write_json(path, result)
    for key, value in result.items():
        print(f"{key:32s} {value:.4g}" if isinstance(value, float) else f"{key:32s} {value}")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
