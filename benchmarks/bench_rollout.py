"""Rollout throughput: the agent rollout engine vs plain ``model.generate`` on the same batch.

Both run the same single-turn greedy generation, in the same process, on the same prompts: each
sequence stops at its first closing tool tag, ``</answer>`` or EOS (``generate`` gets these as
``eos_token_id``; the rollout gets ``max_turns=1``, so no tool runs), with the same
``max_new_tokens``. Throughput = model-written tokens (up to and including the stop token) per
second; medians over repeats after a warm-up. Goal: rollout / generate >= 1.0. Saved to
``results/bench/rollout.json``. A multi-turn figure (tools included) is reported alongside.

The model is the profile's cached warm start when it exists (``--model warm``), else a freshly
initialised model of the profile's shape (``--model fresh``; timing depends little on the weights,
but a fresh model rarely stops early).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rollout.py --profile cpu``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from copes_lib import runs
from copes_lib.protocols.substrate_setup import substrate_config
from copes_lib.rollout import RolloutConfig, StopMatcher, make_env, rollout
from copes_lib.substrate import build_agent_model, get_tokenizer, warm_start, warm_start_folder
from copes_lib.tasks import format_prompt, load_tasks


def generate_tokens(model, tokenizer, tasks, max_new_tokens: int) -> int:
    """Plain HF generate, greedy, stopping per sequence at the protocol's stop tokens; returns the
    number of generated tokens up to and including each sequence's stop."""
    stops = sorted(StopMatcher(tokenizer).by_id) + [tokenizer.eos_token_id]
    batch = tokenizer([format_prompt(t) for t in tasks], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stops,
                         pad_token_id=tokenizer.pad_token_id)
    new = out[:, batch["input_ids"].shape[1]:].tolist()
    count = 0
    for row in new:
        for token in row:
            count += 1
            if token in stops:
                break
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu"])
    parser.add_argument("--model", default="auto", choices=["auto", "warm", "fresh"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    config = substrate_config(args.profile)
    tokenizer = get_tokenizer(args.profile, config.vocab_size)
    use_warm = args.model == "warm" or (args.model == "auto" and warm_start_folder(args.profile, "math", 0, config=config)[1])
    if use_warm:
        model, tokenizer, _ = warm_start(args.profile, "math", 0, config=config)
    else:
        model = build_agent_model(config.model_size, len(tokenizer), 0, config.max_context, tokenizer)
    model.eval()
    tasks = load_tasks(args.profile, "math", "val")[: args.batch]
    single = RolloutConfig(max_new_tokens=args.max_new_tokens, max_turns=1, max_context=config.max_context,
                           prompt_style="plain")
    multi = RolloutConfig(max_new_tokens=args.max_new_tokens * 2, max_context=config.max_context, prompt_style="plain")
    with make_env("math", args.profile) as env:
        rollout(model, tokenizer, tasks[:4], env, single, seed=0)  # warm-up
        with torch.no_grad():
            generate_tokens(model, tokenizer, tasks[:4], 4)
        ours, theirs, agent = [], [], []
        for _ in range(args.repeats):
            batch = rollout(model, tokenizer, tasks, env, single, seed=0)
            ours.append(batch.new_tokens / batch.elapsed_s)
            t0 = time.perf_counter()
            with torch.no_grad():
                n = generate_tokens(model, tokenizer, tasks, args.max_new_tokens)
            theirs.append(n / (time.perf_counter() - t0))
            full = rollout(model, tokenizer, tasks, env, multi, seed=0)
            agent.append(full.new_tokens / full.elapsed_s)
        same_tokens = batch.new_tokens == n
    result = {
        "profile": args.profile, "model": "warm" if use_warm else "fresh", "batch": args.batch,
        "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
        "rollout_single_turn_tokens_per_s": statistics.median(ours),
        "generate_tokens_per_s": statistics.median(theirs),
        "ratio_rollout_over_generate": statistics.median(ours) / statistics.median(theirs),
        "same_token_count": same_tokens,
        "rollout_multi_turn_tokens_per_s": statistics.median(agent),
        "goal": ">= 1.0",
    }
    runs.atomic_write_json(runs.RESULTS_ROOT / "bench" / "rollout.json", result)
    for key, value in result.items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
