"""Low-rank ES (ESConfig.noise_rank, docs/lowrank_es.md): ratios against baselines measured in the same run.

Measures (saved to results/bench/lowrank_es.json; goals in docs/lowrank_es.md#l2-goals-and-the-learning-comparison-set-before-the-runs):
- throughput on the cpu-size substrate (untrained, the stand-in reward of bench_es) at N members x B
  prompts (B = 1, 4, 16): pure batched inference of the N B rows on the unperturbed model, low-rank batched members
  (K = 1 and K = 4), full-rank batched members (stacked weight copies), full-rank sequential members;
  members/s of each and the ES-step time; goals: low-rank eval >= 0.8 of inference, >= 5x members/s
  over full-rank sequential;
- learning per step (``--learning``): full-rank ES vs low-rank ES at equal N on the smoke miniature
  (cached warm start), same sigma, alpha, batches and seed: training reward per step, validation
  score before and after.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lowrank_es.py --learning``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_es import setup  # noqa: E402  (the substrate + stand-in reward of the ES benchmark)

from copes_lib import runs  # noqa: E402
from copes_lib.es import ES, ESConfig, es_step  # noqa: E402
from copes_lib.es_backends import make_backend  # noqa: E402


def shorten(objective, new_tokens: int) -> None:
    objective.rollout_config = dataclasses.replace(objective.rollout_config, max_new_tokens=new_tokens)


def throughput(args, batch: int) -> dict:
    model, objective, what = setup("cpu", batch, untrained=True)
    shorten(objective, args.new_tokens)
    n = args.population
    out: dict = {"substrate": what, "population": n, "batch": batch, "new_tokens": args.new_tokens,
                 "rank": args.rank, "parameters": sum(p.numel() for p in model.parameters())}
    objective.fitness(model, 1)  # warm up

    base = dict(population=n, subspaces=1, sigma=1e-2, alpha=5e-3, chunk_size=4096)
    arms = {"lowrank_batched": dict(noise_rank=args.rank, backend="batched"),
            "lowrank_batched_k4": dict(noise_rank=args.rank, backend="batched", subspaces=4),
            "fullrank_batched": dict(backend="batched"),
            "fullrank_sequential": dict(backend="sequential")}
    if args.arms != "all":  # the low-rank arms only (a short run: full-rank sequential is most of the time)
        arms = {name: extra for name, extra in arms.items() if name.startswith("lowrank")}
    best: dict = {}
    # the arms interleaved, each repeat in turn, the minimum kept: the machine is shared, and load that
    # comes and goes then hits every arm alike
    tokens: dict = {}  # tokens the rows held (prompt + completion) per arm: perturbed members write other
    # texts (other lengths, invalid tool tags with their error observations), so the work differs too
    # CPU seconds of this process inside the batched rollouts (one thread: the compute, less exposed to
    # the other jobs of a shared machine than the wall clock)
    cpu: dict = {}
    rollouts = objective.population_fitness

    def timed(*a, **k):
        t0 = time.process_time()
        values = rollouts(*a, **k)
        timed.cpu_s += time.process_time() - t0
        return values

    objective.population_fitness = timed
    per_repeat: dict = {}  # arm -> CPU seconds of each repeat (the medians of the per-repeat ratios below)
    for _ in range(args.repeats):
        # pure batched inference of the same N x B rows on the unperturbed model (the ceiling)
        held, t0, timed.cpu_s = objective.tokens, time.perf_counter(), 0.0
        with torch.no_grad():
            objective.population_fitness(model, 2, n, lambda rows: None)
        best["inference"] = min(best.get("inference", float("inf")), time.perf_counter() - t0)
        tokens["inference"] = objective.tokens - held
        cpu["inference"] = min(cpu.get("inference", float("inf")), timed.cpu_s)
        per_repeat.setdefault("inference", []).append(timed.cpu_s)
        for name, extra in arms.items():
            es = ES(copy.deepcopy(model), ESConfig(**{**base, **extra}))
            held, timed.cpu_s = objective.tokens, 0.0
            res = es_step(es, 2, objective, make_backend(es))
            if name not in best or res.rollout_s < best[name].rollout_s:
                best[name] = res
                tokens[name] = objective.tokens - held
            if name != "fullrank_sequential":  # its members run through fitness(), not the batched call
                cpu[name] = min(cpu.get(name, float("inf")), timed.cpu_s)
                per_repeat.setdefault(name, []).append(timed.cpu_s)
    objective.population_fitness = rollouts
    out["inference_s"] = best["inference"]
    if args.arms != "all":
        out["arms"] = sorted(arms)
        ratios = {name: [i / v for i, v in zip(per_repeat["inference"], per_repeat[name])] for name in arms}
        out["cpu_fraction_of_inference_per_repeat"] = ratios
        out["cpu_fraction_of_inference_median"] = {name: float(np.median(v)) for name, v in ratios.items()}
        out["goal_fraction_of_inference_b1"] = 0.91
        out["tokens"] = tokens
        out["decode_linear_delta_cost"] = delta_cost(model, n, args.rank)
        return out
    out["inference_tokens"] = tokens["inference"]
    out["rollout_cpu_s"] = cpu
    out["cpu_fraction_of_inference"] = {name: cpu["inference"] / v for name, v in cpu.items() if name != "inference"}
    # each repeat's arms ran right after its inference: the ratio within a repeat, median over repeats
    ratios = {name: [i / v for i, v in zip(per_repeat["inference"], values)]
              for name, values in per_repeat.items() if name != "inference"}
    out["cpu_fraction_of_inference_per_repeat"] = ratios
    out["cpu_fraction_of_inference_median"] = {name: float(np.median(v)) for name, v in ratios.items()}
    for name in arms:
        out[f"{name}_eval_s"] = best[name].rollout_s
        out[f"{name}_step_s"] = best[name].step_s
        out[f"{name}_members_per_s"] = n / best[name].rollout_s
        out[f"{name}_tokens"] = tokens[name]
        # the same ratio per token held: the cost of the noise itself, the members' other texts removed
        out[f"{name}_per_token_fraction_of_inference"] = ((out["inference_s"] / tokens["inference"])
                                                         / (best[name].rollout_s / tokens[name]))
    out["inference_members_per_s"] = n / out["inference_s"]
    out["lowrank_fraction_of_inference"] = out["inference_s"] / out["lowrank_batched_eval_s"]
    out["lowrank_k4_fraction_of_inference"] = out["inference_s"] / out["lowrank_batched_k4_eval_s"]
    out["lowrank_speedup_over_fullrank_sequential"] = (out["fullrank_sequential_eval_s"]
                                                       / out["lowrank_batched_eval_s"])
    out["lowrank_step_speedup_over_fullrank_sequential"] = (out["fullrank_sequential_step_s"]
                                                            / out["lowrank_batched_step_s"])
    out["lowrank_speedup_over_fullrank_batched"] = out["fullrank_batched_eval_s"] / out["lowrank_batched_eval_s"]
    out["goal_fraction_of_inference"], out["goal_speedup_over_sequential"] = 0.8, 5.0
    out["goals_met"] = bool(out["lowrank_fraction_of_inference"] >= 0.8
                            and out["lowrank_speedup_over_fullrank_sequential"] >= 5.0)
    return out


def delta_cost(model, members: int, rank: int, repeats: int = 200) -> dict:
    """At a decode step (one token per row, ``members`` rows, one member each), each Linear shape of
    ``model``: this process's CPU seconds of the plain ``F.linear`` (pure inference) against the same
    call with the low-rank delta of ``lowrank.LowRankPopulation`` (x B_i by ``bmm``, then ``baddbmm_``
    of A_i into the output); medians of ``repeats``, interleaved. The ratio is what a forward whose
    time were all Linear calls could reach against pure inference (the model's shapes, then 1024 and
    2048 square for reference)."""
    import torch.nn.functional as F

    shapes = sorted({tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)})
    out = {}
    # and two wider square shapes for reference (the delta's fixed cost against a larger matmul)
    for out_f, in_f in shapes + [(1024, 1024), (2048, 2048)]:
        weight, x = torch.randn(out_f, in_f), torch.randn(members, 1, in_f)
        a_t, b_t = torch.randn(members, rank, out_f), torch.randn(members, rank, in_f)
        plain, low = [], []
        for _ in range(repeats):
            t0 = time.process_time()
            F.linear(x, weight)
            t1 = time.process_time()
            base = F.linear(x, weight)
            base.view(members, 1, -1).baddbmm_(torch.bmm(x, b_t.transpose(1, 2)), a_t, alpha=0.01)
            t2 = time.process_time()
            plain.append(t1 - t0)
            low.append(t2 - t1)
        out[f"{in_f}->{out_f}"] = {"linear_us": float(np.median(plain)) * 1e6, "with_delta_us": float(np.median(low)) * 1e6,
                                   "fraction": float(np.median(plain) / np.median(low))}
    return out


def learning(args) -> dict:
    model, objective, what = setup("smoke", 8, untrained=False)
    objective = objective.with_val(args.val)
    out: dict = {"substrate": what, "population": args.learn_population, "steps": args.learn_steps,
                 "batch": 8, "val_problems": len(objective.val_tasks), "rank": args.rank, "seed": 33}
    base = dict(population=args.learn_population, subspaces=1, sigma=1e-2, alpha=5e-3, chunk_size=4096,
                backend="batched", seed=33)
    start = objective.validate(model)["score"]
    out["val_score_start"] = start
    for name, extra in (("fullrank", {}), ("lowrank", {"noise_rank": args.rank})):
        trained = copy.deepcopy(model)
        es = ES(trained, ESConfig(**{**base, **extra}))
        backend = make_backend(es)
        rewards, t0 = [], time.perf_counter()
        for step in range(1, args.learn_steps + 1):
            rewards.append(float(es_step(es, step, objective, backend).rewards.mean()))
        out[f"{name}_train_reward_per_step"] = rewards
        out[f"{name}_s"] = time.perf_counter() - t0
        end = objective.validate(trained)["score"]
        out[f"{name}_val_score_end"] = end
        out[f"{name}_val_gain_per_step"] = (end - start) / args.learn_steps
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--population", type=int, default=40)
    parser.add_argument("--batches", default="1,4,16", help="prompts per member, comma-separated (one "
                        "throughput measurement each; the cpu profile's ES batch is 16)")
    parser.add_argument("--new-tokens", type=int, default=32, help="max new tokens per rollout")
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--arms", default="all", choices=("all", "lowrank"),
                        help="lowrank: pure inference and the low-rank arms only (their CPU-time ratios, median of "
                        "the per-repeat ratios)")
    parser.add_argument("--learning", action="store_true", help="also the learning-per-step comparison")
    parser.add_argument("--learn-population", type=int, default=8)
    parser.add_argument("--learn-steps", type=int, default=6)
    parser.add_argument("--val", type=int, default=64, help="validation problems of the learning comparison")
    parser.add_argument("--out", default=str(runs.RESULTS_ROOT / "bench" / "lowrank_es.json"))
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = {"threads": torch.get_num_threads(), "load_average_at_start": os.getloadavg(),
              "throughput": [throughput(args, int(b)) for b in args.batches.split(",")]}
    result["load_average_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=1), flush=True)
    if args.learning:
        result["learning"] = learning(args)
    result["argv"] = sys.argv[1:]
    path = runs.atomic_write_json(args.out, result)
    print(json.dumps(result, indent=1, default=lambda v: np.asarray(v).tolist()))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
