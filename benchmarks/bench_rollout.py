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

``--host-overhead``: host time per decoded token (ms) of the rollout before this fast path (the
loop of ``copes_lib/rollout.py`` at ``--before`` read from git, run in this process) against the
engines now: ``loop``, ``static`` uncompiled and ``static`` compiled (``torch.compile`` on the
CPU; compile time reported, excluded from the timed runs). Host time = wall time minus the time
inside the model's forward calls; per decoded token = over the batch's model-written tokens. The
time inside a forward (``model_ms_per_forward``) is itself mostly dispatch overhead for the smoke
profile's tiny model (what compiling removes), mostly compute for the cpu profile's. Single-turn
greedy and sampled rollouts of ``--batch`` prompts, medians over repeats after a warm-up (the
engines take turns within each repeat). Saved to ``results/bench/rollout_host_overhead_<profile>.json``.

``--stop-matcher``: host cost of the stop check per generated token (``StopMatcher.check`` on each
token of a turn, ``trim`` where it stops) now against ``copes_lib/rollout.py`` at ``--stop-before``
(the 8-token window), on two tokenizers whose closing tags are several tokens (a byte-level BPE trained
on protocol text; one token per byte), over turns of free text that end with a tool tag; and how many
tags each one finds. Saved to ``results/bench/rollout_stop_matcher.json``.

``--check-compiled``: the compiled ``static`` engine against the loop on the CPU (too slow to
compile for ``make test``): the smoke Qwen3 and a tiny random Qwen3.5, tool calls forced, greedy
and sampled; saved to ``results/bench/rollout_compiled_equality.json``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from copes_lib import runs
from copes_lib.protocols.testbed.substrate_setup import substrate_config
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


def rollout_at(rev: str):
    """``copes_lib/rollout.py`` as it was at git revision ``rev``, imported as its own module."""
    root = Path(__file__).resolve().parents[1]
    text = subprocess.run(["git", "show", f"{rev}:copes_lib/rollout.py"], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "rollout_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("rollout_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rollout_before"] = module
    spec.loader.exec_module(module)
    return module


def timed_forward(model):
    """Wrap ``model.forward`` to add its wall time to ``model.forward_s`` (the old loop has no clock)."""
    original = model.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            model.forward_s += time.perf_counter() - began

    model.forward, model.forward_s = forward, 0.0
    return lambda: delattr(model, "forward")


def run_once(before, engine, model, tokenizer, tasks, env, config):
    """(batch, seconds inside the model's forward) of ``engine``, or of the old loop when None."""
    if engine is not None:
        out = engine.generate(tasks, env, config, seed=0)
        return out, out.model_s
    undo = timed_forward(model)
    try:
        out = before.rollout(model, tokenizer, tasks, env, config, seed=0)
    finally:
        undo()
    return out, model.forward_s


def host_overhead(args, model, tokenizer, tasks, env) -> dict:
    from copes_lib.engines import StaticEngine, make_engine

    before = rollout_at(args.before)
    result = {"before": args.before, "batch": len(tasks), "max_new_tokens": args.max_new_tokens, "runs": {}}
    t0 = time.perf_counter()
    compiled = StaticEngine(model, tokenizer, compile=True)
    compiled.generate(tasks[:2], env, RolloutConfig(max_new_tokens=4, max_turns=1, prompt_style="plain"))
    result["compile_s"] = time.perf_counter() - t0
    for temperature in (0.0, 1.0):
        config = RolloutConfig(max_new_tokens=args.max_new_tokens, max_turns=1, temperature=temperature,
                               prompt_style="plain")

        engines = {"before_loop": None, "loop": make_engine("loop", model, tokenizer),
                   "static": StaticEngine(model, tokenizer, compile=False), "static_compiled": compiled}
        runs = {name: functools.partial(run_once, before, engine, model, tokenizer, tasks, env, config)
                for name, engine in engines.items()}
        stats = {name: [] for name in runs}
        tokens = {}
        for _ in range(args.repeats + 1):  # the first round is a warm-up
            for name, run in runs.items():
                out, forward_s = run()
                tokens[name] = out.completion_ids
                stats[name].append(((out.elapsed_s - forward_s) / out.new_tokens * 1e3,
                                    out.elapsed_s / out.new_tokens * 1e3, out.new_tokens / out.elapsed_s,
                                    forward_s / out.forward_calls * 1e3))
        key = "greedy" if temperature == 0 else "sampled"
        base = statistics.median(s[0] for s in stats["before_loop"][1:])
        result["runs"][key] = {
            name: {"host_ms_per_token": statistics.median(s[0] for s in values[1:]),
                   "wall_ms_per_token": statistics.median(s[1] for s in values[1:]),
                   "tokens_per_s": statistics.median(s[2] for s in values[1:]),
                   "model_ms_per_forward": statistics.median(s[3] for s in values[1:]),
                   "host_overhead_ratio_vs_before": statistics.median(s[0] for s in values[1:]) / base,
                   "same_tokens_as_before": tokens[name] == tokens["before_loop"]}
            for name, values in stats.items()}
    return result


def check_compiled() -> dict:
    """Tokens of the compiled static engine == the loop's (dense and hybrid, forced tool calls)."""
    from copes_lib.engines import StaticEngine, build_qwen35
    from copes_lib.rollout import encode

    tokenizer = get_tokenizer("smoke", substrate_config("smoke").vocab_size)
    scripts = [encode(tokenizer, s) for s in ("<python>print(1+2)</python>", "<answer>\\boxed{3}</answer>",
                                              "<python>print(2*2)</python>")]

    def forcing():
        count = {}

        def force(rows, generating, logits):  # row r writes scripts[r % 3] first
            for i, (r, wants) in enumerate(zip(rows, generating)):
                t = count[r] = count.get(r, -1) + wants
                if wants and t < len(scripts[r % 3]):
                    logits[i] = float("-inf")
                    logits[i, scripts[r % 3][t]] = 0.0
        return force

    tasks = load_tasks("smoke", "math", "val")[:6]
    result = {}
    with make_env("math", "smoke") as env:
        for family in ("qwen3", "qwen3_5"):
            model = build_agent_model("smoke", len(tokenizer), 0, tokenizer=tokenizer) if family == "qwen3" \
                else build_qwen35("tiny", len(tokenizer), 0, tokenizer=tokenizer)
            engine = StaticEngine(model, tokenizer, compile=True)
            for temperature in (0.0, 1.0):
                config = RolloutConfig(max_new_tokens=24, temperature=temperature)
                t0 = time.perf_counter()
                fast = engine.generate(tasks, env, config, seed=3, logits_hook=forcing())
                seconds = time.perf_counter() - t0
                loop = rollout(model, tokenizer, tasks, env, config, seed=3, logits_hook=forcing())
                result[f"{family}_{'greedy' if temperature == 0 else 'sampled'}"] = {
                    "same_tokens": fast.completion_ids == loop.completion_ids, "seconds_with_compile": seconds,
                    "python_calls": sum(c["python"] for c in loop.tool_calls)}
    return result


def _protocol_tokenizers() -> dict:
    """Tokenizers whose closing tags are several tokens: a byte-level BPE trained on protocol text (its
    merges join a tag's ``>`` with what follows, as real BPEs do) and one with a token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def wrap(tok):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")

    texts = [f"Question {k}? <python>print({k})</python><output>{k}</output><search>river {k}</search>"
             f"<result>the city</result><answer>\\boxed{{{k}}}</answer>." for k in range(200)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<eos>"], min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    vocab = {"<pad>": 0, "<eos>": 1, **{c: k + 2 for k, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}}
    byte = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    byte.add_special_tokens(["<pad>", "<eos>"])
    return {"bpe": wrap(bpe), "byte": wrap(byte)}


def stop_matcher_cost(args) -> dict:
    """Microseconds of stop check per generated token, now and at ``args.stop_before``; tags found."""
    from copes_lib.rollout import encode

    before = rollout_at(args.stop_before)
    words = "the city river was founded by its council in year north station museum 3 > 2 and x < 7".split()
    turns = []
    for k in range(args.batch):
        free = " ".join(words[(k + 3 * i) % len(words)] for i in range(args.max_new_tokens // 2))
        tag = ("<python>print(1)</python>", "<search>river</search>", "<answer>\\boxed{2}</answer>")[k % 3]
        turns.append(free + " " + tag)
    result = {"stop_before": args.stop_before, "turns": len(turns), "repeats": args.repeats, "tokenizers": {}}
    for name, tokenizer in _protocol_tokenizers().items():
        ids = [encode(tokenizer, t) for t in turns]
        row = {"tokens_per_turn": statistics.mean(len(i) for i in ids),
               "tag_tokens": {t: len(encode(tokenizer, t)) for t in ("</python>", "</search>", "</answer>")}}
        for label, matcher_class in (("before", before.StopMatcher), ("now", StopMatcher)):
            matcher = matcher_class(tokenizer)  # built outside the timing (now: the closing-token table)
            times, found = [], 0
            for _ in range(args.repeats + 1):  # the first round is a warm-up
                found, count = 0, 0
                t0 = time.perf_counter()
                for turn in ids:
                    segment = []
                    for token in turn:
                        segment.append(token)
                        count += 1
                        if matcher.check(segment) is not None:
                            matcher.trim(segment)
                            found += 1
                            break
                times.append((time.perf_counter() - t0) / count * 1e6)
            row[label] = {"us_per_token": statistics.median(times[1:]), "tags_found": found}
        row["ratio_now_over_before"] = row["now"]["us_per_token"] / row["before"]["us_per_token"]
        result["tokenizers"][name] = row
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu"])
    parser.add_argument("--model", default="auto", choices=["auto", "warm", "fresh"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--host-overhead", action="store_true", help="host ms per decoded token, before vs now")
    parser.add_argument("--before", default="863d599", help="git revision of the rollout before the fast path")
    parser.add_argument("--check-compiled", action="store_true", help="compiled static engine == loop (CPU)")
    parser.add_argument("--stop-matcher", action="store_true", help="host cost of the stop check, before vs now")
    parser.add_argument("--stop-before", default="26bebfd", help="git revision of the 8-token stop window")
    args = parser.parse_args()
    if args.stop_matcher:
        result = {"threads": torch.get_num_threads(), **stop_matcher_cost(args)}
        runs.atomic_write_json(runs.RESULTS_ROOT / "bench" / "rollout_stop_matcher.json", result)
        print(result)
        return
    if args.check_compiled:
        result = {"threads": torch.get_num_threads(), **check_compiled()}
        runs.atomic_write_json(runs.RESULTS_ROOT / "bench" / "rollout_compiled_equality.json", result)
        print(result)
        return

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
    if args.host_overhead:
        with make_env("math", args.profile) as env:
            result = {"profile": args.profile, "model": "warm" if use_warm else "fresh",
                      "threads": torch.get_num_threads(), **host_overhead(args, model, tokenizer, tasks, env)}
        runs.atomic_write_json(runs.RESULTS_ROOT / "bench" / f"rollout_host_overhead_{args.profile}.json", result)
        print(result)
        return
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
