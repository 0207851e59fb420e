"""ES / CoPES engine performance: ratios against baselines measured in the same run.

Measures (saved to results/bench/es.json):
- step overhead: (ES step time) / (the same N rollouts on the unperturbed model), goal <= 1.10;
- distance to the compute limit: the FLOP/s of the step's rollouts / the FLOP/s of a large fp32
  matmul (FLOPs of a rollout estimated as 2 x matmul parameters x tokens through the model, attention
  ignored), goal >= 0.5 (population-batched); each of ``--repeats`` repeats runs the sequential and
  the batched evaluation of the same step, each beside its own matmul baseline, all timed in this
  process's CPU seconds (one thread), and the median of the per-repeat ratios is kept;
- population-batched vs sequential evaluation of the same step (and whether their rewards agree);
- ``--breakdown``: where a batched step's time goes (torch.profiler's op kinds, host time outside the
  model), docs/engines.md#where-an-es-steps-time-goes-cpu-size, and the ceiling of the compute fraction:
  the same step's matmuls (every bmm / mm / addmm, at the shapes and counts the profiler recorded) replayed
  alone, so the fraction the rollouts would reach if nothing but their matmuls took time (on tensors hot in the
  caches), the same with the step's attention calls, and one decode step's matmuls on each member's own weights
  in forward order (``streamed_weights``: what the members' weights cost when they do not fit in the caches);
- ``--variants``: the batched step with fewer members per forward and with low-rank noise (``VARIANTS``);
- noise-generation time per member, CoPES (K = 4) vs ES (K = 1), expected about 1/K.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_es.py --profile smoke`` (add
``--profile cpu --untrained`` for the cpu-size model without its warm start). With the agent
stack (``copes_lib.substrate`` / ``copes_lib.rollout``) present it uses the profile's warm-started
substrate and real agent rollouts; otherwise a tiny Qwen3 with plain greedy decoding.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import numpy as np
import torch

from copes_lib import runs
from copes_lib.es import ES, ESConfig, es_step
from copes_lib.es_backends import make_backend


class GreedyObjective:
    """Fallback fitness without the agent stack: share of greedy tokens equal to token 3."""

    def __init__(self, prompts: torch.Tensor, new_tokens: int):
        self.prompts, self.new_tokens, self.tokens = prompts, new_tokens, 0

    def rows_per_member(self, step):
        return len(self.prompts)

    @torch.no_grad()
    def _generate(self, model, ids, row_hook=None):
        out = model(input_ids=ids, use_cache=True) if row_hook is None else None
        if row_hook is not None:
            row_hook(list(range(len(ids))))
            out = model(input_ids=ids, use_cache=True)
        cache, new = out.past_key_values, [out.logits[:, -1].argmax(-1, keepdim=True)]
        self.tokens += ids.numel()
        for _ in range(self.new_tokens - 1):
            if row_hook is not None:
                row_hook(list(range(len(ids))))
            out = model(input_ids=new[-1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            new.append(out.logits[:, -1].argmax(-1, keepdim=True))
            self.tokens += len(ids)
        return torch.cat(new, 1)

    def fitness(self, model, step):
        return float((self._generate(model, self.prompts) == 3).float().mean())

    def population_fitness(self, model, step, n_members, row_hook):
        tokens = self._generate(model, self.prompts.repeat(n_members, 1), row_hook)
        return [float((t == 3).float().mean()) for t in tokens.split(len(self.prompts))]

    def validate(self, model):
        return {"score": self.fitness(model, 0)}


def _fallback(batch: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=32, hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=48,
                         tie_word_embeddings=True, max_position_embeddings=128,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    model = Qwen3ForCausalLM(config).eval()
    prompts = torch.randint(0, 32, (batch, 12), generator=torch.Generator().manual_seed(0))
    return model, GreedyObjective(prompts, new_tokens=11), "tiny qwen3 (1.3M), plain greedy"


def setup(profile: str, batch: int, untrained: bool):
    """The profile's substrate and agent rollouts; ``untrained``: a fresh model of the profile's size
    (no warm start needed) with a cheap deterministic stand-in reward (a hash of the text), so the
    measurement is of the engine and the rollouts, not of answer checking."""
    try:
        import zlib

        from copes_lib.es_objective import AgentObjective
        from copes_lib.protocols.testbed.substrate_setup import substrate_config
        from copes_lib.rollout import make_env
        from copes_lib.substrate import build_agent_model, get_tokenizer, warm_rollout_config, warm_start
        from copes_lib.tasks import load_tasks
    except ImportError:
        return _fallback(batch)
    config = substrate_config(profile)
    env = make_env("math", profile)
    if untrained:
        tokenizer = get_tokenizer(profile, config.vocab_size)
        model = build_agent_model(config.model_size, len(tokenizer), 0, config.max_context, tokenizer).eval()
        env.reward = lambda prompts, texts, answers, calls: [zlib.crc32(t.encode()) % 97 / 97 for t in texts]
        env.details = lambda prompts, texts, answers: [{"correct": 0.0} for _ in texts]
        what = f"{profile}-size untrained substrate, agent rollouts, stand-in reward"
    else:
        model, tokenizer, _ = warm_start(profile, "math", seed=0, config=config)
        what = f"{profile} warm-started substrate, agent rollouts"
    objective = AgentObjective(tokenizer, env, load_tasks(profile, "math", "train"),
                               load_tasks(profile, "math", "val")[:8],
                               warm_rollout_config(config), batch, 1088)
    return model, objective, what


def matmul_flops(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of an n x n fp32 matmul: the median of ``repeats`` products, timed in this process's CPU
    seconds (one thread: the compute, not the wait for a core on a shared machine)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        a @ b
        times.append(time.process_time() - t0)
    return 2 * n**3 / float(np.median(times))


class CpuClock:
    """Wraps an objective's rollout calls (``fitness``, ``population_fitness``) and sums this process's
    CPU seconds inside them (``seconds``): on one thread the compute of the rollouts, which the load of
    other jobs slows far less than the wall clock."""

    def __init__(self, objective):
        self.seconds = 0.0
        for name in ("fitness", "population_fitness"):
            method = getattr(objective, name)

            def timed(*args, _method=method, **kwargs):
                t0 = time.process_time()
                try:
                    return _method(*args, **kwargs)
                finally:
                    self.seconds += time.process_time() - t0

            setattr(objective, name, timed)


#: torch.profiler op names by where an ES step's model time goes (self CPU time; the rest is "other ops")
OP_KINDS = {"linear matmuls": ("aten::bmm", "aten::mm", "aten::addmm", "aten::baddbmm", "aten::linear"),
            "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention",
                          "aten::_scaled_dot_product_attention_math"),
            "copies and layout": ("aten::copy_", "aten::cat", "aten::index", "aten::gather", "aten::index_copy_",
                                  "aten::contiguous", "aten::clone", "aten::_to_copy"),
            "elementwise (norms, rotary, activation)": ("aten::mul", "aten::add", "aten::silu", "aten::pow",
                                                        "aten::mean", "aten::rsqrt", "aten::neg", "aten::sub",
                                                        "aten::div", "aten::where", "aten::cos", "aten::sin",
                                                        "aten::add_", "aten::mul_", "aten::div_"),
            "noise (randn)": ("aten::normal_", "aten::randn"),
            "sampling": ("aten::argmax", "aten::multinomial", "aten::softmax", "aten::_softmax")}


def breakdown(model, objective, config) -> dict:
    """Where one population-batched ES step's CPU time goes: torch.profiler's self CPU time by op kind
    (OP_KINDS) and, from the rollout's own clocks, the host time outside the model's forward calls
    (the loop, sampling's host side, stop checks, tool calls, tokenization)."""
    from torch.profiler import ProfilerActivity, profile

    from copes_lib import engines

    bench_es = ES(copy.deepcopy(model), ESConfig(**{**config.to_dict(), "backend": "batched"}))
    backend = make_backend(bench_es)
    seen = []
    generate = engines.LoopEngine.generate

    def keep(self, *args, **kwargs):
        out = generate(self, *args, **kwargs)
        seen.append(out)
        return out

    engines.LoopEngine.generate = keep
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.process_time()
            es_step(bench_es, 2, objective, backend)
            total = time.process_time() - t0
    finally:
        engines.LoopEngine.generate = generate
    by_kind = dict.fromkeys(OP_KINDS, 0.0)
    ops = 0.0
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        ops += seconds
        for kind, names in OP_KINDS.items():
            if event.key in names:
                by_kind[kind] += seconds
    by_kind["other ops"] = ops - sum(by_kind.values())
    rollout = sum(b.elapsed_s for b in seen)
    model_s = sum(b.model_s for b in seen)
    return {"profiled_cpu_s": total, "op_self_cpu_s": by_kind,
            "op_share": {k: v / ops for k, v in by_kind.items()},
            "rollout_wall_s": rollout, "host_outside_model_share_of_rollout": (rollout - model_s) / rollout,
            "forward_calls": sum(b.forward_calls for b in seen),
            "note": "op seconds are the profiler's clock per op (its overhead and the load inflate them): shares, "
                    "not seconds, are the figure"}


def _matmul_flops(name: str, shapes: list) -> int | None:
    """FLOPs of one matmul op from the profiler's input shapes (None: not a matmul this replays)."""
    if name == "aten::bmm" and len(shapes) >= 2 and len(shapes[0]) == 3 and len(shapes[1]) == 3:
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
    elif name == "aten::mm" and len(shapes) >= 2 and len(shapes[0]) == 2 and len(shapes[1]) == 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        b = 1
    elif name == "aten::addmm" and len(shapes) >= 3 and len(shapes[1]) == 2 and len(shapes[2]) == 2:
        (m, k), (_, n) = shapes[1], shapes[2]
        b = 1
    else:
        return None
    return 2 * b * m * k * n


#: the attention op transformers' sdpa path calls (torch.nn.functional.scaled_dot_product_attention)
SDPA = "aten::scaled_dot_product_attention"


def _replay_attention(shapes: list, count: int, generator: torch.Generator) -> float:
    """CPU seconds of ``count`` scaled-dot-product attentions at the recorded shapes (query, key, value and, when
    recorded, the mask; a boolean mask, as transformers' sdpa masks are, every column attended)."""
    import torch.nn.functional as F

    query, key, value = (torch.randn(*shape, generator=generator) for shape in shapes[:3])
    mask = torch.ones(*shapes[3], dtype=torch.bool) if len(shapes) > 3 and shapes[3] else None
    gqa = key.shape[-3] != query.shape[-3]
    F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=gqa)
    t0 = time.process_time()
    for _ in range(count):
        F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=gqa)
    return time.process_time() - t0


def matmul_replay(model, objective, config) -> dict:
    """The matmuls of one population-batched ES step (shapes and counts from torch.profiler), replayed alone on
    random fp32 tensors of the same shapes: their CPU seconds are what the step's rollouts would take if every
    other op (attention, norms, rotary, copies, sampling, the host's loop) were free, so the rollout FLOP
    estimate over those seconds is the ceiling of ``batched_rollout_fraction_of_matmul`` for any implementation
    that computes the same per-member products, as far as the tensors stay in the caches: each shape is replayed on
    one set of tensors, so this overstates a step whose members' weights do not fit (``streamed_weights``).

    The step's attention calls are replayed the same way (``attention_*``): the FLOP estimate counts no attention
    (it is the papers' 2 x parameters x tokens), but a decode step over a cache of W columns does about
    4 x hidden x W FLOPs of it per layer and row at a matrix-vector's rate, so ``ceiling_with_attention_fraction``
    (the matmuls and the attention alone, everything else free) bounds any implementation that attends over the
    same columns."""
    from torch.profiler import ProfilerActivity, profile

    bench_es = ES(copy.deepcopy(model), ESConfig(**{**config.to_dict(), "backend": "batched"}))
    backend = make_backend(bench_es)
    objective.tokens = 0
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        es_step(bench_es, 2, objective, backend)
    tokens = objective.tokens
    calls, attention, skipped = [], [], 0
    for event in prof.key_averages(group_by_input_shape=True):
        shapes = [list(s) for s in event.input_shapes]
        if event.key == SDPA:
            attention.append((shapes, event.count))
            continue
        if event.key not in ("aten::bmm", "aten::mm", "aten::addmm"):
            continue
        if _matmul_flops(event.key, shapes) is None:
            skipped += event.count
            continue
        calls.append((event.key, shapes, event.count))
    seconds, flops = 0.0, 0
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, shapes, count in calls:
            op = getattr(torch, name.removeprefix("aten::"))  # torch.bmm, torch.mm, torch.addmm
            args = [torch.randn(*shape, generator=generator) for shape in shapes[:3 if name == "aten::addmm" else 2]]
            op(*args)
            t0 = time.process_time()
            for _ in range(count):
                op(*args)
            seconds += time.process_time() - t0
            flops += count * _matmul_flops(name, shapes)
        attention_s = sum(_replay_attention(shapes, count, generator) for shapes, count in attention)
    peak, estimate = matmul_flops(), 2 * matmul_params(model) * tokens
    return {"matmul_calls": sum(c for _, _, c in calls), "matmul_shapes": len(calls), "unreplayed_calls": skipped,
            "replay_cpu_s": seconds, "replayed_gflop": flops / 1e9, "rollout_gflop_estimate": estimate / 1e9,
            "matmul_rate_fraction": flops / seconds / peak, "ceiling_fraction_of_matmul": estimate / seconds / peak,
            "attention_calls": sum(c for _, c in attention), "attention_shapes": len(attention),
            "attention_replay_cpu_s": attention_s,
            "ceiling_with_attention_fraction": estimate / (seconds + attention_s) / peak}


def streamed_weights(model, members: int, rows: int, repeats: int = 100) -> dict:
    """One decode step's matmuls as the population-batched forward runs them (every Linear of ``model``, each
    member's own copy of its weight, in forward order: the weights stream through the caches) against the same
    products on one layer's weights over and over (hot in the caches, as the replay above runs each shape). The
    ratio says how far the replay's ceiling overstates what a step's matmuls can reach when the members' weights
    do not fit in the caches."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    generator = torch.Generator().manual_seed(0)
    stacks = [torch.randn(members, *m.weight.shape, generator=generator) for m in linears]
    inputs = {n: torch.randn(members, rows, n, generator=generator) for n in {m.weight.shape[1] for m in linears}}
    first = {}
    for stack in stacks:  # the hot pass: the first stack of each shape, reused
        first.setdefault(tuple(stack.shape), stack)

    def timed(weights) -> float:
        for w in weights:
            torch.bmm(inputs[w.shape[2]], w.transpose(1, 2))
        t0 = time.process_time()
        for _ in range(repeats):
            for w in weights:
                torch.bmm(inputs[w.shape[2]], w.transpose(1, 2))
        return (time.process_time() - t0) / repeats

    with torch.no_grad():
        streamed = timed(stacks)
        hot = timed([first[tuple(w.shape)] for w in stacks])
    flops = sum(2 * members * rows * w.shape[1] * w.shape[2] for w in stacks)
    peak = matmul_flops()
    return {"members": members, "rows_per_member": rows, "weights_mb": sum(w.numel() for w in stacks) * 4 / 1e6,
            "streamed_ms_per_decode_step": streamed * 1e3, "hot_ms_per_decode_step": hot * 1e3,
            "streamed_over_hot": streamed / hot, "streamed_fraction_of_matmul": flops / streamed / peak,
            "hot_fraction_of_matmul": flops / hot / peak}


def measured_step(model, objective, config, clock: CpuClock, **change):
    """One ES step (step 2) on a copy of ``model`` with ``config`` changed by ``change``, between two matmul
    baselines: (its result, the rollouts' CPU seconds, the baselines' mean FLOP/s, the rollouts' FLOP/s over it)."""
    bench_es = ES(copy.deepcopy(model), ESConfig(**{**config.to_dict(), **change}))
    backend = make_backend(bench_es)
    objective.tokens, clock.seconds = 0, 0.0
    before = matmul_flops()
    result = es_step(bench_es, 2, objective, backend)
    peak = (before + matmul_flops()) / 2
    return result, clock.seconds, peak, 2 * matmul_params(model) * objective.tokens / clock.seconds / peak


#: what else the batched backend could batch (``--variants``): fewer members per forward (their weights fit in the
#: caches, more forwards) and low-rank noise (EGGROLL's: the members share the base weights)
VARIANTS = {"all members": {}, "4 members per forward": {"members_per_batch": 4},
            "2 members per forward": {"members_per_batch": 2}, "low-rank noise, r = 4": {"noise_rank": 4}}


def variants(model, objective, config, clock: CpuClock, repeats: int = 3) -> dict:
    """The batched step's rollouts' fraction of the matmul limit under each of :data:`VARIANTS` (median of
    ``repeats``, each beside its own matmul baseline, as the main measurement)."""
    out = {}
    for name, change in VARIANTS.items():
        fractions = [measured_step(model, objective, config, clock, backend="batched", **change)[3]
                     for _ in range(repeats)]
        out[name] = {"config": change, "fraction_of_matmul": float(np.median(fractions)),
                     "fraction_per_repeat": fractions}
    return out


def matmul_params(model) -> int:
    """Parameters that take part in matmuls per token (every Linear, incl. a tied lm_head)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="smoke", choices=("smoke", "cpu"))
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--untrained", action="store_true",
                        help="a fresh model of the profile's size and a stand-in reward (no warm start)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="repeats of the batched vs sequential step, each beside its own matmul baseline (median)")
    parser.add_argument("--breakdown", action="store_true", help="also profile one batched step (torch.profiler)")
    parser.add_argument("--variants", action="store_true",
                        help="also the batched step with fewer members per forward and with low-rank noise (VARIANTS)")
    parser.add_argument("--out", default=str(runs.RESULTS_ROOT / "bench" / "es.json"))
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, objective, what = setup(args.profile, args.batch, args.untrained)
    result: dict = {"substrate": what, "population": args.population, "batch": args.batch,
                    "threads": torch.get_num_threads(), "repeats": args.repeats,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "load_average_at_start": os.getloadavg(),
                    "clock": "process CPU seconds (one thread) for every FLOP/s ratio; wall seconds where named _s"}
    clock = CpuClock(objective)

    # 1. a full sequential ES step vs the rollouts inside it (time spent in the objective's calls)
    config = ESConfig(population=args.population, subspaces=1, sigma=1e-2, alpha=5e-3, chunk_size=4096)
    objective.fitness(model, 1)  # warm up
    objective.tokens = 0
    step = es_step(ES(copy.deepcopy(model), config), 1, objective)
    result["rollouts_alone_s"] = step.fitness_s
    result["es_step_s"] = step.step_s
    result["step_overhead_ratio"] = step.step_s / step.fitness_s
    result["noise_share_of_step"] = step.noise_s / step.step_s
    result["step_overhead_goal"] = 1.10

    # 2. and 3. FLOP/s of the step's rollouts (2 x matmul parameters x tokens through the model) over a
    # large matmul's, sequential and population-batched evaluation of the same step, each repeat beside
    # its own matmul baseline (median of the per-repeat ratios: load that comes and goes hits both)
    fractions: dict = {"sequential": [], "batched": []}
    timings: dict = {"sequential": [], "batched": []}
    peaks, rewards = [], {}
    for _ in range(args.repeats):
        for backend_name in ("sequential", "batched"):
            res, seconds, peak, fraction = measured_step(model, objective, config, clock, backend=backend_name)
            peaks.append(peak)
            timings[backend_name].append(seconds)
            fractions[backend_name].append(fraction)
            if backend_name in rewards and not np.array_equal(rewards[backend_name], res.rewards):
                raise RuntimeError(f"{backend_name}: rewards differ between repeats of the same step")
            rewards[backend_name] = res.rewards
    result["matmul_gflops"] = float(np.median(peaks)) / 1e9
    for backend_name in ("sequential", "batched"):
        result[f"{backend_name}_rollout_fraction_of_matmul"] = float(np.median(fractions[backend_name]))
        result[f"{backend_name}_rollout_fraction_per_repeat"] = fractions[backend_name]
        result[f"{backend_name}_eval_cpu_s"] = float(np.median(timings[backend_name]))
    result["rollout_fraction_of_matmul"] = result["sequential_rollout_fraction_of_matmul"]
    result["compute_fraction_goal"] = 0.5
    result["batched_speedup"] = result["sequential_eval_cpu_s"] / result["batched_eval_cpu_s"]
    result["batched_rewards_equal"] = bool(np.array_equal(rewards["sequential"], rewards["batched"]))
    result["batched_rewards"] = np.asarray(rewards["batched"]).tolist()
    if args.breakdown:
        result["batched_step_breakdown"] = breakdown(model, objective, config)
        replay = matmul_replay(model, objective, config)
        result["batched_matmul_replay"] = replay
        result["batched_rollout_fraction_ceiling"] = replay["ceiling_fraction_of_matmul"]
        result["batched_rollout_fraction_ceiling_with_attention"] = replay["ceiling_with_attention_fraction"]
        result["batched_decode_weights_streamed"] = streamed_weights(model, args.population, args.batch)
    if args.variants:
        result["batched_variants"] = variants(model, objective, config, clock)

    # 4. noise time per member: CoPES K = 4 vs ES K = 1 (perturb + restore of every member)
    per_member = {}
    for k in (1, 4):
        cfg = ESConfig(**{**config.to_dict(), "subspaces": k, "population": 8})
        noise_es = ES(copy.deepcopy(model), cfg)
        plan = noise_es.plan(3)
        backup = noise_es.backup()
        repeats = []
        for _ in range(5):  # the minimum of 5 repeats: the machine is shared
            noise_es.noise_s = 0.0
            for kk, i in plan.members():
                noise_es.perturb(plan, kk, i)
                noise_es.restore(plan, kk, i, backup)
            repeats.append(noise_es.noise_s / cfg.population)
        per_member[k] = min(repeats)
    result["noise_s_per_member_es"] = per_member[1]
    result["noise_s_per_member_copes_k4"] = per_member[4]
    result["noise_ratio_copes_over_es"] = per_member[4] / per_member[1]
    result["noise_ratio_expected"] = 0.25

    result["load_average_at_end"] = os.getloadavg()
    path = runs.atomic_write_json(args.out, result)
    print(json.dumps(result, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
