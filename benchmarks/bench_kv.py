"""KV cache memory of every engine: peak (re-allocation transients included) against the steady cache.

Measures (saved to results/bench/kv.json), at benchmarks/gpu_check.py's engine workload (batch 64,
128 new tokens, forced scripts with the paper's observation lengths; docs/gpu_check.md) and its
``CacheProbe`` read at every forward, for every engine (loop, slots, static) on two models:

- ``qwen35_4b_layout``: a narrow random Qwen3.5 with Qwen3.5-4B's attention layout (32 layers, the
  8 full-attention ones with 4 KV heads; ``engines.QWEN35_SIZES["4b-layout"]``): the transient of a
  re-allocation is one KV head's K or V, a share that depends on the layer layout, not on the width;
- ``qwen3_smoke``: the smoke profile's tiny Qwen3 (2 layers, 2 KV heads), the worst case here.

Figures per engine: ``kv_peak_over_steady`` (each forward's peak over the cache around it; goal <= 1.05
on the 4B layout), ``kv_over_model`` (the gpu check's judged KV figure: the peak over rows x longest
live row, goal within 15%), ``kv_steady_over_model`` (between re-allocations), and whether every
engine wrote the loop's tokens. Ratios of one run, so the load of other jobs does not enter (bytes,
not time).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_kv.py`` (a few minutes on one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402  (the workload, CacheProbe and kv_figures of the gpu check)

from copes_lib import runs  # noqa: E402
from copes_lib.engines import ENGINES, build_qwen35  # noqa: E402
from copes_lib.memory_model import kv_bytes_per_token  # noqa: E402
from copes_lib.substrate import build_agent_model  # noqa: E402

GOAL_PEAK_OVER_STEADY = 1.05


def measure(model, tokenizer, batch: int, new_tokens: int) -> dict:
    per_token = kv_bytes_per_token(gpu_check.describe(model), dtype_bytes=4)
    work = gpu_check.workload(tokenizer, batch, new_tokens)
    out, tokens = {}, {}
    for name in ENGINES:
        began = time.perf_counter()
        figures, _, tokens[name] = gpu_check.engine_kv(name, model, tokenizer, work, per_token)
        out[name] = {key: figures[key] for key in ("kv_peak_over_steady", "kv_over_model", "kv_steady_over_model",
                                                    "max_width_over_longest_row", "forwards_seen")}
        out[name]["seconds"] = time.perf_counter() - began
    out["tokens_equal_to_loop"] = all(t == tokens["loop"] for t in tokens.values())
    out["longest_row"] = max(map(len, tokens["loop"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", default=str(runs.RESULTS_ROOT / "bench" / "kv.json"))
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tokenizer = gpu_check.make_tokenizer()
    models = {"qwen35_4b_layout": build_qwen35("4b-layout", len(tokenizer), 0, tokenizer=tokenizer, max_positions=4096),
              "qwen3_smoke": build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer,
                                               max_positions=4096).eval()}
    result: dict = {"batch": args.batch, "new_tokens": args.new_tokens, "threads": torch.get_num_threads(),
                    "goal_peak_over_steady": GOAL_PEAK_OVER_STEADY,
                    "goal_kv_over_model_tolerance": gpu_check.GOALS["kv_over_model_tolerance"]}
    for label, model in models.items():
        cfg = model.config
        result[label] = {"layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads,
                         "full_attention_layers": sum(t == "full_attention" for t in cfg.layer_types),
                         **measure(model, tokenizer, args.batch, args.new_tokens)}
        print(label, json.dumps(result[label], indent=1), flush=True)
    four = result["qwen35_4b_layout"]
    result["goals_met_4b_layout"] = bool(
        four["tokens_equal_to_loop"]
        and all(four[e]["kv_peak_over_steady"] <= GOAL_PEAK_OVER_STEADY
                and abs(four[e]["kv_over_model"] - 1) <= gpu_check.GOALS["kv_over_model_tolerance"] for e in ENGINES))
    path = runs.atomic_write_json(args.out, result)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
