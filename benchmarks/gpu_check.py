"""GPU check of the rollout engines and ES on a randomly initialised Qwen3.5 (run by gpu_check.sh).

One section per process (gpu_check.sh gives each its own time limit), each written to
``<run dir>/<section>.json`` atomically as soon as it is measured (and mirrored to ``$OUT/gpu_check/``
when ``OUT`` is set), so a timeout keeps what was measured before it:

- ``kernels``: are the flash-linear-attention (fla) kernels the ones transformers calls for Qwen3.5?
  Not ``import fla``: the functions Qwen3.5's Gated-DeltaNet layer calls are resolved (transformers
  binds them when ``modeling_qwen3_5`` is imported), and on CUDA a profiled forward (prefill and one
  decode step) must launch fla's Triton kernels.
- ``equality`` (tiny Qwen3.5 probe with logits that are not flat, fp32): each engine of
  ``engines.ENGINES`` against the plain loop on forced multi-turn trajectories (same tokens), rows of a
  batch against their single-row runs (max logit difference), and one ES step per engine from the same
  weights and seeds (member rewards and the updated weights compared with the loop's).
- ``engine`` (one per engine of ``engines.ENGINES``, so a new engine is measured without an edit;
  0.8B-shaped Qwen3.5 in bf16 on CUDA): an untimed warm-up that is the timed run itself (compilation
  and graph capture of every shape it uses, reported as ``compile_s``), pure inference of the batch
  (new tokens/s, peak memory), a
  probe run that reads the KV cache at every forward (width against the longest live row, bytes
  against notebook 08's memory model, ``copes_lib.memory_model``), and one ES step on the same rows
  (member evaluation time against the pure inference, perturb + restore share, rewards and update).
- ``summary``: every section's goals (docs/gpu_check.md#goals: speed, ES, KV memory and width, kernels,
  equality, GRPO memory) as pass / fail with the measured values (judged only on CUDA, and only on
  figures measured at the goals' shapes, ``ENGINE_SHAPE``, ``EQUALITY_SHAPE``, ``GRPO_SHAPE``: a figure
  from another shape is judged as not measured).

The workload, the same for every engine: every row's trajectory is forced (a logits hook) through a
script of tool calls whose count varies by row (r % 4 searches, (r + 1) % 6 Python calls) with free tokens in
between; a third of the rows then runs to the token budget, the rest close with an answer, so row
lengths differ; the counts stay within the paper's math budget of 3 searches and 5 Python calls
(docs/paper_a_copes.md#model-and-tools). The tools are scripted too (``ScriptedEnv``): a search returns
3 passages (``SEARCH_TOP_K`` of profiles/gpu.yaml) of ~130-170 tokens each (their length is not stated
in the paper; ~100-word Wikipedia passages are assumed), a Python call an output of 4-200 tokens.
Random weights never write a correct answer, so the reward is synthetic: the share of odd character
codes in the model-written text. It depends on the free tokens, so it differs across ES members and
the update is exercised (constant rewards would make it zero). Free tokens are drawn from the
tokenizer's vocabulary only (the 0.8B shape keeps Qwen3.5's 248,320-row output layer).

Without CUDA it runs only with ``--allow-cpu`` (the CPU dry run: tiny sizes, JSON marked
``cpu_dry_run``): it proves the script runs end to end; its numbers are not GPU figures.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import sys
import time
import traceback
import zlib
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The suite's imports can fail on a machine that lacks a wheel: main() then still writes the section's
# JSON with the error instead of crashing before anything is written.
try:
    from copes_lib import engines
    from copes_lib.budget import LiveTensorBytes
    from copes_lib.config import ConfigError
    from copes_lib.engines import QWEN35_SIZES, build_qwen35
    from copes_lib.es import ES, ESConfig, es_step
    from copes_lib.memory_model import ModelDescription, kv_bytes_per_token
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.rollout import AgentEnv, RolloutConfig, encode, rollout
    from copes_lib.substrate import train_agent_tokenizer
    from copes_lib.tasks import format_prompt
    from copes_lib.tasks.protocol import Task, python_observation, search_observation
    IMPORT_ERROR = None
except Exception:  # recorded by main()
    IMPORT_ERROR = traceback.format_exc(limit=8)
    AgentEnv, QWEN35_SIZES = object, {"tiny": None, "4b-layout": None, "0.8b": None, "2b": None}

# The goals (docs/gpu_check.md#goals, set before any GPU run), judged in the summary on CUDA only.
GOALS = {"fast_over_loop": 4.0, "member_over_pure": 0.8, "kv_over_model_tolerance": 0.15, "slot_width": 1.25,
         # equality (tiny Qwen3.5, fp32): batch rows vs single rows, engines vs the loop after one ES step
         "row_exact_logit_diff": 1e-4, "es_weights_diff": 1e-6,
         # GRPO: measured peak / grpo_memory's prediction (docs/statistics.md A11's "agrees": within 25%)
         "grpo_memory_tolerance": 0.25}
# The shapes the goals are set at (docs/gpu_check.md#goals): a figure measured at another shape (a tiny
# model, a small batch, fp32) is not the goal's figure and is judged as not measured (fails on CUDA).
ENGINE_SHAPE = {"size": "0.8b", "batch": 64, "max_new_tokens": 128, "dtype": "torch.bfloat16"}
EQUALITY_SHAPE = {"rows": 8, "dtype": "torch.float32"}
# benchmarks/gpu_check_grpo.py's CUDA sizes (tests/test_gpu_check.py checks they agree)
GRPO_SHAPE = {"sizes": {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 64, "intermediate": 3072,
                        "vocab": 32768, "tie_embeddings": True}, "tokens_per_trajectory": 512, "trajectories": 16}
WORDS = ("the city river was founded by its council in year north station museum old bridge market "
         "school of history large small people first team won").split()


# --------------------------------------------------------------------------- output
def save(run_dir: Path, name: str, data: dict) -> Path:
    """Atomic write of one section's JSON, mirrored to $OUT/gpu_check/<run>/ when OUT is set."""
    text = json.dumps(data, indent=1, default=str)
    targets = [run_dir / f"{name}.json"]
    if os.environ.get("OUT"):
        targets.append(Path(os.environ["OUT"]) / "gpu_check" / run_dir.name / f"{name}.json")
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # atomic: a reader sees the old file or the new one
    return targets[0]


def header(args) -> dict:
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    cuda = torch.cuda.is_available()
    return {"cpu_dry_run": not cuda, "started": datetime.datetime.now(datetime.UTC).isoformat(),
            "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
            "python": platform.python_version(), "python_is_venv": sys.prefix != sys.base_prefix,
            "versions": {n: version(n) for n in ("torch", "transformers", "huggingface_hub", "tokenizers",
                                                 "flash-linear-attention", "fla-core", "triton", "einops")},
            "args": {k: v for k, v in vars(args).items() if k != "dir"}}


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- workload
def text_of(tokenizer, tokens: int, salt: int) -> str:
    """Text of about ``tokens`` tokens under ``tokenizer`` (words from WORDS, order by ``salt``)."""
    words, n = [], 0
    while n < tokens:
        words.extend(WORDS[(salt + 7 * k) % len(WORDS)] for k in range(len(words), len(words) + 8))
        n = len(encode(tokenizer, " ".join(words)))
    return " ".join(words)


class ScriptedEnv(AgentEnv):
    """Math-kind tools whose observations have set lengths (no sandbox, no retriever) and a synthetic
    reward that depends on every model-written character (see the module docstring)."""

    def __init__(self, tokenizer):
        super().__init__("math", retriever=None, search_k=3, limits={"python": 5, "search": 3})
        self.tokenizer = tokenizer
        self._texts: dict[tuple[int, int], str] = {}

    def _text(self, tokens: int, salt: int) -> str:
        if (tokens, salt) not in self._texts:
            self._texts[(tokens, salt)] = text_of(self.tokenizer, tokens, salt)
        return self._texts[(tokens, salt)]

    def run_python(self, codes):
        return [python_observation(self._text(4 + zlib.crc32(c.encode()) % 197, 1)) for c in codes]

    def run_search(self, queries):
        out = []
        for q in queries:
            h = zlib.crc32(q.encode())
            out.append(search_observation([self._text(130 + (h >> (8 * k)) % 41, k) for k in range(3)]))
        return out

    def reward(self, prompts, completions, answers, tool_calls):
        return [float(np.mean([ord(c) % 2 for c in text])) if text else 0.0 for text in completions]

    def details(self, prompts, completions, answers):
        return [{"correct": 0.0} for _ in completions]


def make_tasks(rows: int) -> list[Task]:
    """Math-kind questions of varied length (built here: the suite's task loaders need the retriever,
    and so bm25s, which the GPU machine may lack; the tools are scripted anyway)."""
    return [Task(f"gpu_check/{r}", "math", "What is " + " plus ".join(str(k) for k in range(2 + (5 * r) % 23)) + "?",
                 ("3",), 0) for r in range(rows)]


def make_tokenizer():
    """The suite's agent tokenizer (byte-level BPE, protocol tags as single tokens) trained here on the
    check's own text: the profile tokenizers are trained from task files that need the retriever."""
    texts = [format_prompt(t) for t in make_tasks(64)] + [" ".join(WORDS)] * 4
    texts += [f"<search>{w} history</search><python>print({k})</python><answer>\\boxed{{3}}</answer>"
              for k, w in enumerate(WORDS)]
    return train_agent_tokenizer(texts, substrate_config("smoke").vocab_size)


def scripts(tokenizer, rows: int) -> list[list[int | None]]:
    """Per row: the forced model tokens, None where the model picks freely."""
    out = []
    for r in range(rows):
        script: list[int | None] = []
        free = 3 + (7 * r) % 9
        for s in range(r % 4):
            script += [None] * free + encode(tokenizer, f"<search>{WORDS[(r + s) % len(WORDS)]} history</search>")
        for p in range((r + 1) % 6):
            script += [None] * free + encode(tokenizer, f"<python>print({r * 10 + p})</python>")
        if r % 3:
            script += [None] * free + encode(tokenizer, "<answer>\\boxed{3}</answer>")
        out.append(script)
    return out


def forcing(row_scripts: list[list[int | None]], vocab: int):
    """A logits hook: force each row's script (one vectorised write per forward), keep free tokens in
    the tokenizer's vocabulary. Fresh per generate call: it counts each row's model tokens."""
    count: dict[int, int] = {}

    def hook(rows, generating, logits):
        if logits.shape[1] > vocab:
            logits[:, vocab:] = float("-inf")
        at, tokens = [], []
        for i, (r, g) in enumerate(zip(rows, generating)):
            if g:
                t = count[r] = count.get(r, -1) + 1
                script = row_scripts[r % len(row_scripts)]
                if t < len(script) and script[t] is not None:
                    at.append(i)
                    tokens.append(script[t])
        if at:
            index = torch.tensor(at, device=logits.device)
            logits[index] = float("-inf")
            logits[index, torch.tensor(tokens, device=logits.device)] = 0.0

    return hook


def generate(engine, tasks, env, config, row_scripts, vocab, seed=0):
    hook = forcing(row_scripts, vocab)
    if "logits_hook" not in inspect.signature(engine.generate).parameters:
        if engine.name == "loop":  # the loop engine is rollout.rollout (its contract), which takes one
            return rollout(engine.model, engine.tokenizer, tasks, env, config, seed=seed, logits_hook=hook)
        raise TypeError(f"engine {engine.name!r}: generate() takes no logits_hook, so the scripted "
                        "trajectories cannot be forced")
    return engine.generate(tasks, env, config, seed=seed, logits_hook=hook)


def workload(tokenizer, batch: int, new_tokens: int):
    """(env, tasks, row scripts, rollout config) of the engine sections: ``batch`` forced rows (see the
    module docstring), ``new_tokens`` model tokens each. tests/test_engines.py measures the KV goals on it."""
    config = RolloutConfig(max_new_tokens=new_tokens, max_context=4096, max_turns=0, batch_size=batch)
    return ScriptedEnv(tokenizer), make_tasks(batch), scripts(tokenizer, batch), config


class ScriptedObjective:
    """ES fitness = mean synthetic reward of the engine's forced trajectories of ``tasks``."""

    def __init__(self, engine, tasks, env, config, row_scripts, vocab):
        self.engine, self.tasks, self.env, self.config = engine, tasks, env, config
        self.row_scripts, self.vocab = row_scripts, vocab
        self.member_rewards: list[list[float]] = []

    def fitness(self, model, step):
        out = generate(self.engine, self.tasks, self.env, self.config, self.row_scripts, self.vocab, seed=step)
        self.member_rewards.append(out.rewards)
        return float(np.mean(out.rewards))

    def validate(self, model):
        return {}


def describe(model) -> ModelDescription:
    cfg = model.config
    full = sum(t == "full_attention" for t in cfg.layer_types)
    return ModelDescription(name="qwen3_5-random", params=sum(p.numel() for p in model.parameters()),
                            kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, full_attention_layers=full,
                            layers=len(cfg.layer_types), heads=cfg.num_attention_heads, hidden=cfg.hidden_size,
                            intermediate=cfg.intermediate_size, vocab=cfg.vocab_size)


class CacheProbe:
    """Reads the KV cache after every forward of ``model`` (a forward hook): cache width, allocated
    K/V bytes, linear-attention state bytes, live rows and their lengths (the attention mask).

    Also the peak of the K/V bytes *during* re-allocations (``kv_peak_bytes``, what a CUDA
    ``max_memory_allocated`` sees): a layer that grows, re-packs or changes rows allocates its new
    buffers while old ones are live. The probe wraps the attention cache layers' re-allocating methods
    (``update`` outside static layers, ``gather_columns``, ``add_rows``, ``batch_select_indices``,
    ``grow``) and counts, at each call, the other layers' bytes plus the peak of the layer's live
    tensors inside the call (``budget.LiveTensorBytes``: old buffers, new ones and temporaries; the
    call's own inputs, such as the new columns' K and V, are live before and after it and left out).
    Such transients are charged to the next forward's row (a re-pack runs just before the forward
    that needs it)."""

    REALLOCATING = ("update", "gather_columns", "add_rows", "batch_select_indices", "grow")

    def __init__(self, model):
        self.rows: list[dict] = []
        self._transient, self._wrapped, self._patched = 0, set(), []
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)
        self.pre_handle = model.register_forward_pre_hook(self._instrument, with_kwargs=True)

    @staticmethod
    def _kv(layer) -> list[torch.Tensor]:
        """A layer's K and V tensors: one each, or one per KV head (``kv_cache.HeadPieces``)."""
        out = []
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            out += [p for p in (t if isinstance(t, tuple) else [t]) if torch.is_tensor(p) and p.numel()]
        return out

    @classmethod
    def _storages(cls, layers) -> dict[int, int]:
        return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for layer in layers for t in cls._kv(layer)}

    @torch.compiler.disable
    def _instrument(self, module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is None or not hasattr(cache, "layers") or id(cache) in self._wrapped:
            return
        self._wrapped.add(id(cache))
        from transformers.cache_utils import StaticLayer

        for layer in cache.layers:
            if hasattr(layer, "conv_states"):  # linear attention: fixed-size states, not K/V
                continue
            for name in self.REALLOCATING:
                if hasattr(layer, name) and not (name == "update" and isinstance(layer, StaticLayer)):
                    setattr(layer, name, self._wrap(cache, layer, name, getattr(layer, name)))
                    self._patched.append((layer, name))

    def _wrap(self, cache, layer, name, method):
        @torch.compiler.disable
        def wrapped(*args, **kwargs):
            before, own = self._storages(cache.layers), self._storages([layer])
            tracker = LiveTensorBytes(device_type=None)
            # the call's inputs (the new columns' K and V, an index) are live before and after it and are not
            # the cache: registered up front (a view of them inside the call would register them) and left out
            inputs = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                      for t in [*args, *kwargs.values()] if torch.is_tensor(t) and t.numel()}
            tracker.track_existing([*self._kv(layer), *(t for t in [*args, *kwargs.values()]
                                                        if torch.is_tensor(t) and t.numel())])
            with tracker:
                out = method(*args, **kwargs)
            others = sum(before.values()) - sum(own.values())
            outside = sum(v for k, v in inputs.items() if k not in own)
            self._transient = max(self._transient, others + tracker.peak - outside)
            return out

        return wrapped

    @torch.compiler.disable  # runs eagerly even when an engine calls a torch.compile-d model
    def _hook(self, module, args, kwargs, output):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        mask = kwargs.get("attention_mask")
        if cache is None or mask is None or not hasattr(cache, "layers"):
            return
        width, kv, states, seen = 0, 0, 0, set()
        for layer in cache.layers:
            for t in self._kv(layer):
                width = max(width, t.shape[-2])
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    kv += storage.nbytes()
            for name in ("conv_states", "recurrent_states"):
                for t in getattr(layer, name, None) or []:
                    if torch.is_tensor(t):
                        states += t.numel() * t.element_size()
        lengths = mask.sum(1)
        self.rows.append({"width": width, "kv_bytes": kv, "kv_peak_bytes": max(kv, self._transient),
                          "transient_bytes": self._transient,
                          "state_bytes": states, "live_rows": int(mask.shape[0]),
                          "longest_row": int(lengths.max()), "tokens_held": int(lengths.sum())})
        self._transient = 0

    def close(self):
        self.handle.remove()
        self.pre_handle.remove()
        for layer, name in self._patched:
            delattr(layer, name)  # the class's method again


def engine_kv(name: str, model, tokenizer, workload, per_token: int) -> tuple[dict, list[dict], list]:
    """Engine ``name`` on ``workload`` (:func:`workload`'s four values) under a :class:`CacheProbe`: its KV figures
    (:func:`kv_figures`), the probe's rows (one per forward) and the completion ids."""
    env, tasks, row_scripts, config = workload
    probe = CacheProbe(model)
    try:
        out = generate(engines.make_engine(name, model, tokenizer), tasks, env, config, row_scripts, len(tokenizer))
    finally:
        probe.close()
    return kv_figures(probe.rows, per_token), probe.rows, out.completion_ids


def kv_figures(rows: list[dict], per_token: int) -> dict:
    """The KV goals' figures from a CacheProbe's rows (one per forward, read where the forward left the
    cache: its chunk included) and the model's K/V bytes per token: at the forward where the allocated
    K/V bytes peak, those bytes over notebook 08's ES line (bytes per token x live rows x longest live
    row), and the widest cache over the longest live row at any forward."""
    if not rows:
        return {"forwards_seen": 0, "why": "the engine does not call the model module (compiled or external): "
                "its cache is not observable from here"}
    at = max(range(len(rows)), key=lambda i: rows[i].get("kv_peak_bytes", rows[i]["kv_bytes"]))
    peak = rows[at]
    steady = max(rows, key=lambda r: r["kv_bytes"])
    widest = max(rows, key=lambda r: r["width"] / max(1, r["longest_row"]))
    model_bytes = per_token * peak["live_rows"] * peak["longest_row"]  # 08's ES line: sequences x L
    if at and peak.get("transient_bytes", 0) > peak["kv_bytes"]:  # a re-allocation before this forward:
        previous = rows[at - 1]  # it still held the rows of the forward before (rows that just ended)
        model_bytes = max(model_bytes, per_token * previous["live_rows"] * previous["longest_row"])
    steady_model = per_token * steady["live_rows"] * steady["longest_row"]
    # each forward's peak (transients included) over the cache around it: a re-allocation before
    # forward i goes from the cache forward i-1 left to the one forward i leaves
    around = [max(r["kv_bytes"], rows[i - 1]["kv_bytes"] if i else 0) for i, r in enumerate(rows)]
    over = [r.get("kv_peak_bytes", r["kv_bytes"]) / a for r, a in zip(rows, around) if a]
    return {"forwards_seen": len(rows), "at_peak": peak, "model_bytes_at_peak": model_bytes,
            "kv_peak_over_steady": max(over, default=None),
            # the judged figure: re-allocation transients included (CacheProbe)
            "kv_over_model": peak.get("kv_peak_bytes", peak["kv_bytes"]) / model_bytes if model_bytes else None,
            "kv_steady_over_model": steady["kv_bytes"] / steady_model if steady_model else None,
            "kv_over_packed_tokens": peak["kv_bytes"] / (per_token * peak["tokens_held"]),
            "max_width_over_longest_row": widest["width"] / max(1, widest["longest_row"]),
            "at_widest": widest, "max_width": max(r["width"] for r in rows)}


# --------------------------------------------------------------------------- sections
def kernels(device, size: str) -> dict:
    """Which gated-delta-rule / conv implementations Qwen3.5's layer calls, statically and at run time."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as q35

    implementation = engines.kernel_implementation

    out = {"is_fast_path_available": getattr(q35, "is_fast_path_available", "not defined by this transformers")}
    try:
        import fla

        out["fla_import"] = getattr(fla, "__version__", "ok")
    except Exception as err:  # recorded: what the machine lacks
        out["fla_import"] = f"failed: {type(err).__name__}: {err}"
    resolved = {}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "chunk_gated_delta_rule",
                 "fused_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"):
        fn = getattr(q35, name, None)
        if callable(fn):
            impl = implementation(fn)
            resolved[name] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
    # the measured size's head dimensions (the kernels' block shapes depend on them), a small vocabulary
    model = build_qwen35(size, 64, seed=0, device=device, dtype=torch.bfloat16 if device.type == "cuda"
                         else torch.float32)
    layer = next(m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet"))
    for name in ("chunk_gated_delta_rule", "recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update"):
        fn = getattr(layer, name, None)
        if callable(fn):  # older transformers bind the implementations on the layer
            impl = implementation(fn)
            resolved[f"layer.{name}"] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
    out["resolved"] = resolved
    delta_rule = {k: v for k, v in resolved.items() if "delta_rule" in k}
    out["static_uses_fla"] = bool(delta_rule) and all(v.startswith("fla.") for v in delta_rule.values())
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        ids = torch.randint(3, 64, (2, 40), device=device)
        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prefill:
            cache = model(input_ids=ids, use_cache=True).past_key_values
            torch.cuda.synchronize()
        with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as decode:
            model(input_ids=ids[:, -1:], use_cache=True, **{cache_arg: cache})
            torch.cuda.synchronize()
        # names of fla-core 0.6's forward Triton kernels (fla/ops/gated_delta_rule, fla/ops/common, utils)
        markers = ("gated_delta", "fused_recurrent", "chunk_fwd_kernel", "chunk_o_fwd", "chunk_scaled_dot_kkt",
                   "chunk_local_cumsum", "solve_tril", "merge_16x16", "recompute_w_u", "gdn_gate", "l2norm_fwd")
        for label, prof in (("prefill", prefill), ("decode", decode)):
            names = sorted({e.key for e in prof.key_averages()})
            out[f"{label}_fla_kernels"] = [n for n in names if any(m in n for m in markers)][:40]
            out[f"{label}_kernel_count"] = len(names)
        out["runtime_uses_fla"] = bool(out["prefill_fla_kernels"]) and bool(out["decode_fla_kernels"])
        out["fla_kernels_used"] = out["static_uses_fla"] and out["runtime_uses_fla"]
    else:
        out["fla_kernels_used"] = None
        out["why_not_judged"] = "no CUDA: fla's Triton kernels run on CUDA only"
    return out


def rows_vs_single(model, tokenizer, rows: int, singles: int = 2) -> tuple[float, bool]:
    """Row exactness: the forced workload of ``rows`` rows (48 tokens) in one batch against the first
    ``singles`` rows run alone (the loop): the largest next-token logit difference over every step of
    those rows, and whether their tokens are the same."""
    env, vocab = ScriptedEnv(tokenizer), len(tokenizer)
    tasks, row_scripts = make_tasks(rows), scripts(tokenizer, rows)
    config = RolloutConfig(max_new_tokens=48, max_context=4096, max_turns=0)

    def recording(store):
        inner = forcing(row_scripts, vocab)

        def hook(batch_rows, generating, logits):
            inner(batch_rows, generating, logits)
            for i, (r, g) in enumerate(zip(batch_rows, generating)):
                if g:
                    t = sum(1 for key in store if key[0] == r)
                    store[(r, t)] = logits[i].detach().cpu().clone()
        return hook

    seen: dict = {}
    batch = rollout(model, tokenizer, tasks, env, config, logits_hook=recording(seen))
    worst, same = 0.0, True
    for row in range(min(singles, rows)):
        store: dict = {}
        hook = recording(store)
        single = rollout(model, tokenizer, [tasks[row]], env, config,
                         logits_hook=lambda batch_rows, g, logits, h=hook, r=row: h([r], g, logits))
        same &= single.completion_ids[0] == batch.completion_ids[row]
        for key, v in store.items():
            finite = torch.isfinite(v) & torch.isfinite(seen[key])
            worst = max(worst, float((seen[key][finite] - v[finite]).abs().max()))
    env.close()
    return worst, bool(same)


def equality(device, tokenizer, rows: int, population: int) -> dict:
    env = ScriptedEnv(tokenizer)
    vocab = len(tokenizer)
    tasks = make_tasks(rows)
    row_scripts = scripts(tokenizer, len(tasks))
    config = RolloutConfig(max_new_tokens=48, max_context=4096, max_turns=0)
    # logits that are not flat (engines.build_probe_qwen35): without the row-exact path rows differ from
    # their single-row runs by >= 100x the bar (tests/test_gpu_check.py), with it they stay far below it
    model = engines.build_probe_qwen35(vocab, seed=0, tokenizer=tokenizer, device=device)
    out = {"engines": {}, "row_exact_bar": GOALS["row_exact_logit_diff"], "rows": rows,
           "dtype": str(next(model.parameters()).dtype)}
    out["rows_vs_single_max_logit_diff"], out["rows_vs_single_same_tokens"] = rows_vs_single(model, tokenizer, rows)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reference = None
    for name in engines.ENGINES:
        row: dict = {}
        out["engines"][name] = row
        model.load_state_dict(initial)  # in place: every engine starts from the same weights
        try:
            engine = engines.make_engine(name, model, tokenizer)
        except ConfigError as err:  # an engine that refuses this machine (e.g. CUDA only) is skipped, with why
            row["skipped"] = str(err)
            continue
        try:
            result = generate(engine, tasks, env, config, row_scripts, vocab)
            row["tool_calls"] = {k: sum(c[k] for c in result.tool_calls) for k in ("python", "search")}
            # the ES step on the same engine and model (a compiled engine compiles once per section)
            objective = ScriptedObjective(engine, tasks, env, config, row_scripts, vocab)
            es = ES(model, ESConfig(population=population, subspaces=1, sigma=0.05, alpha=0.02, chunk_size=4096, seed=33))
            step = es_step(es, 1, objective)
            row["member_rewards"] = step.rewards.tolist()
            row["update_norm"] = float(step.update_norm)
            weights = torch.cat([p.detach().flatten().float().cpu() for p in model.parameters()])
            row["rewards_differ_across_members"] = bool(np.ptp(step.rewards) > 0)
            if name == "loop":
                reference = {"tokens": result.completion_ids, "rewards": step.rewards, "weights": weights}
            elif reference is not None:
                row["same_tokens_as_loop"] = result.completion_ids == reference["tokens"]
                row["rewards_max_abs_diff_vs_loop"] = float(np.abs(step.rewards - reference["rewards"]).max())
                row["weights_max_abs_diff_vs_loop"] = float((weights - reference["weights"]).abs().max())
        except Exception:
            row["error"] = traceback.format_exc(limit=6)
    env.close()
    return out


def engine_check(device, tokenizer, name: str, size: str, batch: int, new_tokens: int, population: int,
                 run_dir: Path, base: dict) -> dict:
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    vocab = len(tokenizer)
    try:  # an engine that refuses this machine (e.g. CUDA only) is skipped, with why
        engines.make_engine(name, build_qwen35("tiny", vocab, seed=0, tokenizer=tokenizer, device=device), tokenizer)
    except ConfigError as err:
        return {**base, "engine": name, "skipped": str(err)}
    t0 = time.perf_counter()
    model = build_qwen35(size, 248320 if size != "tiny" else vocab, seed=0, tokenizer=tokenizer, device=device,
                         dtype=dtype)
    sync(device)
    desc = describe(model)
    out = {**base, "engine": name, "size": size, "dtype": str(dtype), "params": desc.params,
           "build_s": time.perf_counter() - t0, "batch": batch, "max_new_tokens": new_tokens}
    env, tasks, row_scripts, config = workload(tokenizer, batch, new_tokens)
    engine = engines.make_engine(name, model, tokenizer)

    # warm-up: the timed run itself, untimed (same rows, seed and scripts, so the same shapes: a compiled
    # engine compiles / captures every graph the timed run uses here, not inside it)
    t0 = time.perf_counter()
    generate(engine, tasks, env, config, row_scripts, vocab, seed=1)
    sync(device)
    out["warmup_s"] = time.perf_counter() - t0

    # 1. pure inference of the batch
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    pure = generate(engine, tasks, env, config, row_scripts, vocab, seed=1)
    sync(device)
    out["pure_s"] = time.perf_counter() - t0
    out["new_tokens"] = pure.new_tokens
    out["new_tokens_per_s"] = pure.new_tokens / out["pure_s"]
    # what a user pays once (compilation, graph capture, first-call allocation), as its own figure
    out["compile_s"] = max(0.0, out["warmup_s"] - out["pure_s"])
    out["forward_calls"] = pure.forward_calls
    out["tool_calls"] = {k: sum(c[k] for c in pure.tool_calls) for k in ("python", "search")}
    lengths = [len(p) + len(c) for p, c in zip(pure.prompt_ids, pure.completion_ids)]
    out["row_tokens"] = {"min": min(lengths), "max": max(lengths), "mean": float(np.mean(lengths))}
    out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    save(run_dir, f"engine-{name}", out)

    # 2. one ES step on the same rows: members vs the pure inference
    objective = ScriptedObjective(engine, tasks, env, config, row_scripts, vocab)
    es = ES(model, ESConfig(population=population, subspaces=1, sigma=1e-3 if cuda else 0.05,
                            alpha=5e-4 if cuda else 0.02, seed=33))
    before = [p.detach().float().norm().item() for p in list(model.parameters())[:4]]
    es.perturb_s = 0.0
    step = es_step(es, 1, objective)
    sync(device)
    after = [p.detach().float().norm().item() for p in list(model.parameters())[:4]]
    member_s = step.rollout_s / population  # perturb + generate + restore of one member
    out["es"] = {"population": population, "rewards": step.rewards.tolist(),
                 "rewards_differ_across_members": bool(np.ptp(step.rewards) > 0),
                 "weights_changed": before != after, "step_s": step.step_s, "rollout_s": step.rollout_s,
                 "fitness_s": step.fitness_s, "perturb_restore_s": es.perturb_s,
                 "perturb_restore_share": es.perturb_s / step.rollout_s, "member_s": member_s,
                 "member_over_pure_inference": out["pure_s"] / member_s}
    save(run_dir, f"engine-{name}", out)

    # 3. the KV cache at every forward: a separate run, last (the hook syncs every forward and makes a
    #    compiled engine break its graph or recompile; what came before is saved by then). After the ES
    #    update: the forced scripts and the budget, not the weights, set the row lengths
    probe = CacheProbe(model)
    try:
        generate(engine, tasks, env, config, row_scripts, vocab, seed=1)
    finally:
        probe.close()
    out["kv"] = kv_figures(probe.rows, kv_bytes_per_token(desc, dtype_bytes=torch.tensor([], dtype=dtype).element_size()))
    save(run_dir, f"engine-{name}", out)

    env.close()
    return out


def equality_goals(eq: dict, goal) -> None:
    """The equality section's goals (fp32, so exact): batch rows give their single-row logits within the
    bar and the same tokens; every engine but the loop gives the loop's tokens and, after one ES step from
    the same seeds, its member rewards and updated weights. A missing section or engine fails (value None)."""
    off = off_shape(eq, EQUALITY_SHAPE) if eq else {}
    diff, bar = eq.get("rows_vs_single_max_logit_diff"), GOALS["row_exact_logit_diff"]
    goal("equality: batch rows equal their single-row runs (row-exact logits, same tokens)", diff, bar,
         diff is not None and diff <= bar and eq.get("rows_vs_single_same_tokens") is True,
         f"same tokens: {eq.get('rows_vs_single_same_tokens')}", off)
    for name in engines.ENGINES:
        row = eq.get("engines", {}).get(name, {})
        if name == "loop" or "skipped" in row:
            continue
        same, rewards, weights = (row.get(k) for k in ("same_tokens_as_loop", "rewards_max_abs_diff_vs_loop",
                                                       "weights_max_abs_diff_vs_loop"))
        goal(f"equality: {name} gives the loop's tokens, ES member rewards and updated weights", weights,
             GOALS["es_weights_diff"], same is True and rewards == 0.0 and weights is not None
             and weights <= GOALS["es_weights_diff"],
             f"same tokens: {same}, rewards max abs diff: {rewards}" + (f"; error: {row['error'][-200:]}"
                                                                        if "error" in row else ""), off)


def grpo_goals(grpo: dict, goal) -> None:
    """GRPO's measured peak memory against grpo_memory's prediction: one process always, FSDP on 2 GPUs
    when it ran."""
    tolerance = GOALS["grpo_memory_tolerance"]
    off = off_shape(grpo, GRPO_SHAPE) if grpo else {}
    for key, label in (("single_process", "one process"), ("sharded_2gpu", "FSDP, 2 GPUs")):
        part = grpo.get(key, {})
        if key == "sharded_2gpu" and not part.get("ran"):
            continue
        ratio = part.get("measured_over_predicted")
        goal(f"GRPO ({label}): measured peak within 25% of grpo_memory's prediction", ratio, tolerance,
             ratio is not None and abs(ratio - 1) <= tolerance, part.get("why", ""), off)


def off_shape(section: dict, shape: dict) -> dict:
    """How a section's figures were measured where that differs from the goal's ``shape``:
    {key: {"measured": value, "goal": value}} (empty at the goal's shape; a key the section lacks differs)."""
    return {k: {"measured": section.get(k), "goal": v} for k, v in shape.items() if section.get(k) != v}


def summary(run_dir: Path, base: dict) -> dict:
    sections = {p.stem: json.loads(p.read_text()) for p in sorted(run_dir.glob("*.json")) if p.stem != "summary"}
    judged = not base["cpu_dry_run"]
    goals = []

    def goal(name, value, threshold, passed, note="", off=None):
        """One goal. ``off`` (off_shape): the figure was measured at another shape than the goal's, so it is
        not the goal's figure: judged as not measured (kept as ``value_at_other_shape``;
        ``measured_pass_on_this_device`` says whether it met the threshold at its own shape)."""
        entry = {"goal": name, "value": value, "threshold": threshold,
                 # on CUDA a goal without its figure (a section that failed or timed out) fails
                 "pass": (bool(passed) if value is not None else False) if judged else None,
                 "measured_pass_on_this_device": bool(passed) if value is not None else None, "note": note}
        if off:
            entry.update({"value": None, "value_at_other_shape": value, "off_shape": off,
                          "pass": False if judged else None,
                          "note": f"not measured at the goal's shape {off}; {note}"})
        goals.append(entry)

    measured = {k[len("engine-"):]: v for k, v in sections.items() if k.startswith("engine-")}
    missing = {e: measured.get(e, {}).get("skipped", "no result (timed out or failed)") for e in engines.ENGINES
               if "new_tokens_per_s" not in measured.get(e, {})}
    measured = {e: m for e, m in measured.items() if "skipped" not in m}
    loop = measured.get("loop", {}).get("new_tokens_per_s")
    fast = {e: m["new_tokens_per_s"] / loop for e, m in measured.items()
            if e != "loop" and loop and "new_tokens_per_s" in m}
    best = max(fast, key=fast.get) if fast else None
    off = {e: off_shape(m, ENGINE_SHAPE) for e, m in measured.items()}
    compile_s = {e: m.get("compile_s") for e, m in measured.items()}  # paid once, not in the timed run
    goal("fast path >= 4x the loop in new tokens/s (batch 64, 0.8B Qwen3.5; warm runs)",
         fast.get(best) if best else None, GOALS["fast_over_loop"], best and fast[best] >= GOALS["fast_over_loop"],
         f"best engine: {best}; all: {fast}; compile / first-run seconds, not timed: {compile_s}",
         (off.get("loop") or off.get(best)) if best else None)
    for e, m in measured.items():
        es_part = m.get("es", {})
        ratio = es_part.get("member_over_pure_inference")
        exercised = es_part.get("rewards_differ_across_members") and es_part.get("weights_changed")
        goal(f"{e}: ES member evaluation >= 80% of pure inference, update exercised", ratio,
             GOALS["member_over_pure"], ratio is not None and ratio >= GOALS["member_over_pure"] and exercised,
             f"rewards differ: {es_part.get('rewards_differ_across_members')}, weights changed: "
             f"{es_part.get('weights_changed')}, perturb+restore share: {es_part.get('perturb_restore_share')}",
             off[e])
        kv = m.get("kv", {})
        ratio = kv.get("kv_over_model")
        goal(f"{e}: KV memory within 15% of notebook 08's model (rows x longest row)", ratio,
             GOALS["kv_over_model_tolerance"], ratio is not None and abs(ratio - 1) <= GOALS["kv_over_model_tolerance"],
             kv.get("why", ""), off[e])
        if e == "slots":  # the goal is the slot engine's; a static cache's width is its allocation, by design
            width = kv.get("max_width_over_longest_row")
            goal(f"{e}: cache width <= 1.25 x the longest live row", width, GOALS["slot_width"],
                 width is not None and width <= GOALS["slot_width"], kv.get("why", ""), off[e])
    equality_goals(sections.get("equality", {}), goal)
    grpo_goals(sections.get("grpo", {}), goal)
    # the same ES step (same model seed, same member seeds, same rows) on every engine: bf16 on a GPU
    # need not give the loop's tokens exactly, so this is reported, not judged
    rewards = {e: np.asarray(m["es"]["rewards"]) for e, m in measured.items() if "rewards" in m.get("es", {})}
    es_vs_loop = {e: float(np.abs(r - rewards["loop"]).max()) for e, r in rewards.items()
                  if e != "loop" and "loop" in rewards and r.shape == rewards["loop"].shape}
    kern = sections.get("kernels", {})
    goal("fla kernels are what transformers calls for Qwen3.5", kern.get("fla_kernels_used"), True,
         kern.get("fla_kernels_used") is True, kern.get("why_not_judged", ""))
    errors = {k: v["error"][-400:] for k, v in sections.items() if isinstance(v, dict) and "error" in v}
    exits = [json.loads(p.read_text()) for p in sorted(run_dir.glob("exit-*.txt"))]  # written by gpu_check.sh
    return {**base, "judged": judged, "goals": goals, "engines_not_measured": missing, "section_errors": errors,
            "compile_s": compile_s,
            "section_exits": exits, "es_member_rewards_max_abs_diff_vs_loop": es_vs_loop,
            "all_pass": all(g["pass"] for g in goals) if judged else None,
            "note": "" if judged else "CPU dry run: the script ran end to end; these are not GPU figures"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", required=True, choices=["kernels", "equality", "engine", "summary"])
    parser.add_argument("--engine", help="engine of copes_lib.engines.ENGINES (--section engine)")
    parser.add_argument("--size", default=ENGINE_SHAPE["size"], choices=list(QWEN35_SIZES))
    parser.add_argument("--batch", type=int, default=ENGINE_SHAPE["batch"])
    parser.add_argument("--new-tokens", type=int, default=ENGINE_SHAPE["max_new_tokens"])
    parser.add_argument("--population", type=int, default=2)
    parser.add_argument("--dir", type=Path, required=True, help="the run's folder (one JSON per section)")
    parser.add_argument("--allow-cpu", action="store_true", help="CPU dry run (use tiny sizes)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("gpu_check: no CUDA device; pass --allow-cpu for the CPU dry run (its numbers are not GPU figures)",
              file=sys.stderr)
        return 2
    base = header(args)
    name = f"engine-{args.engine}" if args.section == "engine" else args.section
    if IMPORT_ERROR is not None:
        save(args.dir, name, {**base, "error": f"the suite does not import here:\n{IMPORT_ERROR}"})
        print(IMPORT_ERROR, file=sys.stderr)
        return 1
    if args.section == "engine" and args.engine not in engines.ENGINES:
        parser.error(f"--engine = {args.engine!r} is not valid; valid values: {list(engines.ENGINES)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    try:
        if args.section == "summary":
            result = summary(args.dir, base)
        else:
            tokenizer = make_tokenizer()
            if args.section == "kernels":
                result = {**base, **kernels(device, args.size)}
            elif args.section == "equality":
                result = {**base, **equality(device, tokenizer, min(args.batch, 8), args.population)}
            else:
                result = engine_check(device, tokenizer, args.engine, args.size, args.batch, args.new_tokens,
                                      args.population, args.dir, base)
    except Exception:
        previous = args.dir / f"{name}.json"  # keep what the section had saved before it failed
        result = {**(json.loads(previous.read_text()) if previous.exists() else base),
                  "error": traceback.format_exc(limit=8)}
    result["seconds"] = time.perf_counter() - t0
    path = save(args.dir, name, result)
    print(f"{name}: {json.dumps(result, default=str)[:600]}\nwrote {path}", flush=True)
    if "error" in result:
        return 1
    if args.section == "summary" and result["judged"] and not result["all_pass"]:
        return 3  # measured, and a goal failed
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
