"""GPU check of the rollout engines and ES on a randomly initialised Qwen3.5 (run by gpu_check.sh).

Sections (each is timed and recorded; a failing section records its error and the others still run):
1. equality, tiny Qwen3.5 (fp32): each row of a batched multi-turn rollout with forced tool calls vs
   its single-row run (max logit difference), the slots engine vs the loop (same tokens), and 2 ES
   steps on each engine from the same seeds (member rewards, differences reported);
2. speed, a realistic size (bf16, 0.8B or 2B parameters): new tokens/s of the loop and of the slots
   engine on the same prompts (generation runs to the token budget: random weights almost never
   write a stop tag), 2 ES steps on the slots engine against pure batch inference of the same prompts
   (member throughput ratio), perturb + restore time against the member's rollout time, and the peak
   GPU memory against the analytic model (``copes_lib.budget.es_memory`` + the fp32 master + the
   linear-attention states, which the paper's ES line does not count).

Without CUDA it runs as a CPU dry run (``"cpu_dry_run": true`` in the JSON): it proves the script
runs end to end; its numbers are not GPU figures. Results: results/bench/gpu/<stamp>-<size>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from copes_lib.engines import QWEN35_SIZES, LoopEngine, SlotEngine, build_qwen35, check_gpu_engine  # noqa: E402
from copes_lib.es import ES, ESConfig, es_step  # noqa: E402
from copes_lib.es_objective import AgentObjective  # noqa: E402
from copes_lib.protocols.substrate_setup import substrate_config  # noqa: E402
from copes_lib.rollout import RolloutConfig, encode, make_env, rollout  # noqa: E402
from copes_lib.substrate import get_tokenizer  # noqa: E402
from copes_lib.tasks import load_tasks  # noqa: E402

SCRIPTS = ["<python>print(1+2)</python>", "<answer>\\boxed{3}</answer>", "<python>x = 5\nprint(x * 7 + 1)</python>", ""]


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def forcing(tokenizer, seen=None):
    scripts = [encode(tokenizer, s) if s else [] for s in SCRIPTS]
    count = {}

    def hook(rows, generating, logits):
        for i, (r, g) in enumerate(zip(rows, generating)):
            if g:
                t = count[r] = count.get(r, -1) + 1
                if seen is not None:
                    seen[(r, t)] = logits[i].detach().cpu().clone()
                script = scripts[r % len(scripts)]
                if t < len(script):
                    logits[i] = float("-inf")
                    logits[i, script[t]] = 0.0

    return hook


def as_row(hook, row: int):
    """A single-row run's hook that forces (and records) as batch row ``row``."""
    return lambda rows, generating, logits: hook([row], generating, logits)


def equality(device, tokenizer, env) -> dict:
    model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer, device=device)
    tasks = load_tasks("smoke", "math", "val")[:4]
    config = RolloutConfig(max_new_tokens=30)
    seen = {}
    batch = rollout(model, tokenizer, tasks, env, config, logits_hook=forcing(tokenizer, seen))
    worst, same_tokens = 0.0, True
    for row in range(len(tasks)):
        single_seen = {}
        single = rollout(model, tokenizer, [tasks[row]], env, config,
                         logits_hook=as_row(forcing(tokenizer, single_seen), row))
        same_tokens &= single.completion_ids[0] == batch.completion_ids[row]
        for (r, t), v in single_seen.items():
            finite = torch.isfinite(v)
            worst = max(worst, float((seen[(r, t)][finite] - v[finite]).abs().max()))
    slots = SlotEngine(model, tokenizer, slots=2).generate(tasks * 2, env, config, logits_hook=forcing(tokenizer))
    loop = rollout(model, tokenizer, tasks * 2, env, config, logits_hook=forcing(tokenizer))
    es_rewards = {}
    for name in ("loop", "slots"):
        es_model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer, device=device)
        objective = AgentObjective(tokenizer, env, load_tasks("smoke", "math", "train"), tasks, config, 4, 1088)
        objective.engine, objective.engine_options = name, ({"slots": 4} if name == "slots" else {})
        es = ES(es_model, ESConfig(population=4, subspaces=2, sigma=0.05, alpha=0.02, chunk_size=4096, seed=33))
        es_rewards[name] = [es_step(es, step, objective).rewards.tolist() for step in (1, 2)]
    diff = float(np.abs(np.array(es_rewards["loop"]) - np.array(es_rewards["slots"])).max())
    return {"rows_vs_single_max_logit_diff": worst, "rows_vs_single_same_tokens": bool(same_tokens),
            "tool_calls_forced": sum(c["python"] for c in batch.tool_calls),
            "slots_vs_loop_same_tokens": slots.completion_ids == loop.completion_ids,
            "es_member_rewards": es_rewards, "es_rewards_max_abs_diff_loop_vs_slots": diff}


def speed(device, tokenizer, env, size: str, batch: int, new_tokens: int, population: int) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vocab = 248320 if size != "tiny" else len(tokenizer)
    t0 = time.perf_counter()
    model = build_qwen35(size, vocab, seed=0, tokenizer=tokenizer, device=device, dtype=dtype)
    sync(device)
    out = {"size": size, "dtype": str(dtype), "params": sum(p.numel() for p in model.parameters()),
           "build_s": time.perf_counter() - t0, "batch": batch, "max_new_tokens": new_tokens}
    tasks = (load_tasks("smoke", "math", "train") * 8)[:batch]
    config = RolloutConfig(max_new_tokens=new_tokens, max_context=4096, batch_size=batch)
    engines = {"loop": LoopEngine(model, tokenizer), "slots": SlotEngine(model, tokenizer, slots=batch)}
    for name, engine in engines.items():
        engine.generate(tasks[:2], env, RolloutConfig(max_new_tokens=4))  # warm-up
        sync(device)
        t0 = time.perf_counter()
        result = engine.generate(tasks, env, config)
        sync(device)
        seconds = time.perf_counter() - t0
        out[f"{name}_new_tokens"] = result.new_tokens
        out[f"{name}_s"] = seconds
        out[f"{name}_new_tokens_per_s"] = result.new_tokens / seconds
    out["slots_over_loop_tokens_per_s"] = out["slots_new_tokens_per_s"] / out["loop_new_tokens_per_s"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    objective = AgentObjective(tokenizer, env, tasks, tasks[:1], config, batch, 1088)
    objective.engine, objective.engine_options = "slots", {"slots": batch}
    es = ES(model, ESConfig(population=population, subspaces=2, sigma=1e-3, alpha=5e-4, seed=33))
    steps = []
    for step in (1, 2):
        es.perturb_s = 0.0
        tokens_before = objective.tokens
        result = es_step(es, step, objective)
        steps.append({"step_s": result.step_s, "rollout_s": result.rollout_s, "fitness_s": result.fitness_s,
                      "perturb_restore_s": es.perturb_s, "noise_s": result.noise_s,
                      "tokens": objective.tokens - tokens_before})
    member_s = np.mean([s["fitness_s"] / population for s in steps])
    out["es_steps"] = steps
    out["es_member_rollout_s"] = float(member_s)
    out["perturb_restore_per_member_s"] = float(np.mean([s["perturb_restore_s"] / population for s in steps]))
    out["perturb_restore_over_member_rollout"] = out["perturb_restore_per_member_s"] / member_s
    out["es_member_time_over_pure_inference"] = float(member_s / out["slots_s"])
    out["es_member_throughput_over_pure_inference"] = float(out["slots_s"] / member_s)
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["memory_model"] = memory_model(model, batch, new_tokens)
    return out


def memory_model(model, batch: int, new_tokens: int) -> dict:
    """The analytic ES line (bf16 weights + KV cache) plus what it leaves out here."""
    cfg = model.config
    full = sum(t == "full_attention" for t in cfg.layer_types)
    linear = len(cfg.layer_types) - full
    params = sum(p.numel() for p in model.parameters())
    try:
        from copes_lib.memory_model import ModelDescription, es_memory
    except ImportError:  # the memory model moved
        from copes_lib.memory import ModelDescription, es_memory  # type: ignore
    desc = ModelDescription(name="qwen3_5-random", params=params, kv_heads=cfg.num_key_value_heads,
                            head_dim=cfg.head_dim, full_attention_layers=full, layers=len(cfg.layer_types),
                            heads=cfg.num_attention_heads, hidden=cfg.hidden_size,
                            intermediate=cfg.intermediate_size, vocab=cfg.vocab_size)
    context_k = (200 + new_tokens) / 1024  # prompt ~200 tokens + the budget
    es_line = es_memory(desc, weight_bytes=2, kv_dtype_bytes=2, sequences=batch).at(context_k)
    master = 4 * params / 2**30
    states = batch * linear * 4 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    states += batch * linear * 4 * (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                                    + cfg.linear_num_value_heads * cfg.linear_value_head_dim) * cfg.linear_conv_kernel_dim
    return {"es_line_gib": es_line, "fp32_master_gib": master, "linear_states_gib": states / 2**30,
            "total_gib": es_line + master + states / 2**30}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="0.8b", choices=list(QWEN35_SIZES))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "results" / "bench" / "gpu"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    import transformers

    record = {"cpu_dry_run": not cuda, "started": datetime.datetime.now(datetime.UTC).isoformat(),
              "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
              "python": platform.python_version(), "torch": torch.__version__,
              "transformers": transformers.__version__, "args": vars(args), "sections": {}}
    if cuda:
        try:
            check_gpu_engine(build_qwen35("tiny", 64, seed=0))
            record["fla_kernels"] = True
        except Exception as err:  # recorded, the check goes on with transformers' PyTorch fallback
            record["fla_kernels"] = f"missing: {err}"
    tokenizer = get_tokenizer("smoke", substrate_config("smoke").vocab_size)
    env = make_env("math", "smoke")
    sections = {"equality": lambda: equality(device, tokenizer, env),
                "speed": lambda: speed(device, tokenizer, env, args.size, args.batch, args.new_tokens,
                                       args.population)}
    for name, run in sections.items():
        t0 = time.perf_counter()
        try:
            record["sections"][name] = run()
        except Exception:
            record["sections"][name] = {"error": traceback.format_exc(limit=8)}
        record["sections"][name]["seconds"] = time.perf_counter() - t0
        print(f"{name}: {json.dumps(record['sections'][name], default=str)[:800]}", flush=True)
    env.close()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"{stamp}-{args.size}{'-cpu-dry-run' if not cuda else ''}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(path)  # atomic; the timestamp keeps earlier results
    print(f"wrote {path}")
    return 1 if any("error" in s for s in record["sections"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
