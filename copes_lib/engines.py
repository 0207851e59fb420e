"""Rollout engines: who generates a batch of multi-turn agent trajectories, behind one contract.

ES (member fitness), GRPO (groups of sampled trajectories), validation and test code call
``engine.generate(tasks, env, config, seed)`` and get a :class:`copes_lib.rollout.RolloutBatch`
(token ids, the model-written mask, texts, rewards, scores, tool calls, finish reasons), without
knowing which engine runs. The contract an engine keeps (a vLLM or SGLang engine plugs in by
keeping it; see docs/engines.md):

- ``engine.model`` is the module whose parameters ES perturbs IN PLACE between calls: an engine must
  read the weights at every ``generate`` (no stale copy; a server engine reloads or shares them);
- ``generate`` runs every task to its end with the tool protocol of ``copes_lib.rollout`` (stop at
  a closing tool tag, run the tools of ``env``, append the observation, continue; limits of
  ``config``), greedy when ``config.temperature == 0``, seeded by ``seed`` otherwise;
- greedy results are those of the plain loop (``LoopEngine``) up to float summation order: the
  same tokens on the same device and dtype (tested for every engine here on the CPU);
- ``row_hook(rows)``, when given, is called before every forward pass with the original task
  indices of the rows in it (the population-batched ES backend needs it; an engine that cannot
  offer it raises ``ConfigError`` when given one).

Engines here: ``loop`` (the plain batched loop of ``rollout.rollout``: CPU and any device) and
``slots`` (continuous batching: a fixed number of slots, a finished trajectory frees its slot for
the next task, a row whose turn ends runs its tool and continues without waiting for the rest of
the batch; hybrid Qwen3.5 models supported through the row-exact linear-attention path). On a GPU
the ``slots`` engine needs the Triton kernels of Qwen3.5's linear attention
(``flash-linear-attention``, requirements-gpu.txt): without them transformers falls back to a slow
PyTorch loop, so :func:`make_engine` refuses with what to install.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from copes_lib.config import ConfigError
from copes_lib.rollout import AgentEnv, RolloutBatch, RolloutConfig, rollout
from copes_lib.tasks import Task

ENGINES = ("loop", "slots")


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates a batch of multi-turn agent trajectories (see the module docstring)."""

    name: str
    model: nn.Module

    def generate(self, tasks: list[Task], env: AgentEnv, config: RolloutConfig, seed: int = 0,
                 row_hook: Callable[[list[int]], None] | None = None) -> RolloutBatch: ...


class LoopEngine:
    """The plain loop (``rollout.rollout``): one batched forward per token, rows leave the batch when
    they finish, a turn boundary waits for every row of the batch. Runs anywhere."""

    name = "loop"

    def __init__(self, model: nn.Module, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def generate(self, tasks, env, config, seed=0, row_hook=None) -> RolloutBatch:
        return rollout(self.model, self.tokenizer, tasks, env, config, seed=seed, row_hook=row_hook)


def make_engine(name: str, model: nn.Module, tokenizer, **options) -> RolloutEngine:
    """The engine ``name`` (one of ENGINES) for ``model``; clear errors for what a machine lacks."""
    if name not in ENGINES:
        raise ConfigError(f"engine = {name!r} is not valid; valid values: {list(ENGINES)}")
    if name == "loop":
        return LoopEngine(model, tokenizer)
    return SlotEngine(model, tokenizer, **options)


def check_gpu_engine(model: nn.Module) -> None:
    """Raise ConfigError unless ``model`` can run fast on a GPU: CUDA present and, for hybrid
    (linear-attention) models, the flash-linear-attention kernels installed."""
    if not torch.cuda.is_available():
        raise ConfigError("the GPU engine needs a CUDA GPU (torch.cuda.is_available() is False): install the "
                          "CUDA build of torch from requirements-gpu.txt, or use engine='loop' on the CPU")
    layer_types = getattr(getattr(model, "config", None), "layer_types", None) or []
    if "linear_attention" in layer_types:
        try:
            import fla  # noqa: F401  (flash-linear-attention's import name)
        except ImportError as err:
            raise ConfigError("this model has linear-attention (Gated-DeltaNet) layers: on a GPU they need the "
                              "Triton kernels of flash-linear-attention; pip install -r requirements-gpu.txt "
                              "(or pip install flash-linear-attention)") from err



# --------------------------------------------------------------------------- continuous batching
class SlotEngine:
    """Continuous batching over ``slots`` rows: a trajectory that finishes frees its slot for the next
    task at once, and a row whose turn ends with a tool call runs the call (together with the rows
    that stopped at the same token) and feeds its observation in the next forward while the others
    keep decoding: no row waits for the slowest row of its batch. One forward per token, as the loop;
    rows join with fresh cache rows (attention: masked columns; linear attention: fresh states), and
    leading cache columns no row uses any more are dropped.

    Greedy results equal the loop's (tested on the CPU); sampled results are seeded but use the
    random stream in another order than the loop does. ``row_hook`` gets original task indices.

    Cost of joining: a joining row's prompt is fed while the others decode, so every row's cache
    gets that many (masked) columns; rows therefore join in groups, once ``join_at`` slots are free
    (default: an eighth of the slots), and the masked columns stay until every row that saw them has
    left. A paged KV cache would avoid them (transformers' paged continuous batching does not take
    linear-attention layers in 5.24).
    """

    name = "slots"

    def __init__(self, model: nn.Module, tokenizer, slots: int = 64, require_gpu: bool = False,
                 join_at: int | None = None):
        if slots < 1:
            raise ConfigError(f"SlotEngine: slots = {slots} must be >= 1")
        self.join_at = max(1, slots // 8) if join_at is None else join_at
        if not 1 <= self.join_at <= slots:
            raise ConfigError(f"SlotEngine: join_at = {join_at} must be in [1, slots = {slots}]")
        if require_gpu:
            check_gpu_engine(model)
        self.model, self.tokenizer, self.slots = model, tokenizer, slots

    @torch.no_grad()
    def generate(self, tasks, env, config, seed=0, row_hook=None, logits_hook=None) -> RolloutBatch:
        import contextlib
        import time
        from collections import deque

        from copes_lib import rollout as ro
        from copes_lib.tasks import format_prompt

        start = time.perf_counter()
        model, tok = self.model, self.tokenizer
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        stops = ro.StopMatcher(tok)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else ro._as_list(tok.eos_token_id)[0]
        limits = {"python": env.limits["python"] if config.max_python_calls is None else config.max_python_calls,
                  "search": env.limits["search"] if config.max_search_calls is None else config.max_search_calls}
        style = ro.prompt_style(tok, config)
        max_turns = config.max_turns or limits["python"] + limits["search"] + 1
        prompt_ids = [ro.encode(tok, format_prompt(t, style, tok, limits["python"], limits["search"],
                                                   config.enable_thinking)) for t in tasks]
        n = len(tasks)
        completion, mask, segment, parts = ([[] for _ in range(n)] for _ in range(4))
        calls = [{"python": 0, "search": 0} for _ in range(n)]
        finish, turns, n_model = [""] * n, [0] * n, [0] * n
        generator = torch.Generator().manual_seed(seed)
        queue = deque(range(n))
        rows: list[int] = []
        pending: list[list[int]] = []
        fresh: list[bool] = []
        seen = torch.zeros(0, dtype=torch.long, device=device)
        attention = torch.zeros(0, 0, dtype=torch.long, device=device)
        cache = ro._growing_cache(model)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cache_arg = "cache" if "cache" in ro.inspect.signature(base.forward).parameters else "past_key_values"
        exact = ro._RowExactLinearAttention(model, cache, row_hook) if ro.linear_attention_layers(cache) else None
        forwards = 0
        with exact if exact is not None else contextlib.nullcontext():
            while queue or rows:
                joining = []
                free = self.slots - len(rows)
                while queue and free >= min(self.join_at, len(queue)) and len(rows) + len(joining) < self.slots:
                    joining.append(queue.popleft())
                if joining:
                    _add_rows(cache, len(joining))
                    rows += joining
                    pending += [list(prompt_ids[r]) for r in joining]
                    fresh += [True] * len(joining)
                    seen = torch.cat([seen, seen.new_zeros(len(joining))])
                    attention = torch.cat([attention, attention.new_zeros(len(joining), attention.shape[1])])
                width = max(len(p) for p in pending)
                chunk = torch.tensor([[pad_id] * (width - len(p)) + p for p in pending], dtype=torch.long,
                                     device=device)
                chunk_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in pending],
                                          dtype=torch.long, device=device)
                positions = (seen[:, None] + chunk_mask.cumsum(1) - 1).clamp_min(0)
                attention = torch.cat([attention, chunk_mask], dim=1)
                seen = seen + chunk_mask.sum(1)
                if row_hook is not None:
                    row_hook(list(rows))
                if exact is not None:
                    exact.prepare([len(p) for p in pending], rows, device, fresh)
                out = model(input_ids=chunk, attention_mask=attention, position_ids=positions, use_cache=True,
                            logits_to_keep=1, **{cache_arg: cache})
                forwards += 1
                fresh = [False] * len(rows)
                logits = out.logits[:, -1, :].float()
                if pad_id not in stops.eos_ids:
                    logits[:, pad_id] = float("-inf")
                if logits_hook is not None:
                    logits_hook(list(rows), [True] * len(rows), logits)
                new_tokens = ro._pick(logits, config, generator).tolist()

                stopped = []  # (batch row, original row) whose turn ended at this token
                for i, r in enumerate(rows):
                    token = new_tokens[i]
                    completion[r].append(token)
                    mask[r].append(1)
                    segment[r].append(token)
                    pending[i] = [token]
                    n_model[r] += 1
                    stop = ro.turn_stop(stops, segment[r], n_model[r], len(prompt_ids[r]) + len(completion[r]), config)
                    if stop is not None:
                        finish[r] = stop
                        stopped.append((i, r))
                if not stopped:
                    continue
                observations = _turn_end(tok, env, config, limits, stopped, finish, segment, parts, turns, calls)
                stopped_rows = {r for _, r in stopped}
                keep = []
                for i, r in enumerate(rows):
                    if r not in stopped_rows:
                        keep.append(i)
                    elif r in observations:
                        obs_ids = ro.encode(tok, observations[r])
                        if turns[r] >= max_turns:
                            finish[r] = "turns"
                        elif len(prompt_ids[r]) + len(completion[r]) + len(obs_ids) + 1 > config.max_context:
                            finish[r] = "context"
                        else:
                            completion[r].extend(obs_ids)
                            mask[r].extend([0] * len(obs_ids))
                            pending[i] = pending[i] + obs_ids
                            keep.append(i)
                if len(keep) < len(rows):
                    index = torch.tensor(keep, dtype=torch.long, device=device)
                    ro.select_rows(cache, index)
                    attention, seen = attention[index], seen[index]
                    rows, pending = [rows[i] for i in keep], [pending[i] for i in keep]
                    fresh = [fresh[i] for i in keep]
                    attention = _drop_unused_columns(cache, attention)
        if was_training:
            model.train()
        model_texts = ["".join(p) for p in parts]
        answers = [t.answers for t in tasks]
        prompts = [ro.decode(tok, p) for p in prompt_ids]
        details = env.details(prompts, model_texts, answers)
        return RolloutBatch(
            tasks=list(tasks), prompt_ids=prompt_ids, completion_ids=completion, model_mask=mask,
            texts=[ro.decode(tok, c) for c in completion], rewards=env.reward(prompts, model_texts, answers, calls),
            scores=[d[env.score_key()] for d in details], tool_calls=calls, model_texts=model_texts,
            finish_reasons=finish, details=details, elapsed_s=time.perf_counter() - start, forward_calls=forwards)


def _turn_end(tokenizer, env, config, limits, stopped, finish, segment, parts, turns, calls) -> dict[int, str]:
    """The turn boundary of ``rollout.rollout`` for the rows ``stopped``: keep the turn's text, run
    their valid tool calls in one batch per tool; returns {original row: observation}."""
    from copes_lib.rollout import decode, run_tool_calls

    tool_rows = {"python": [], "search": []}
    for _i, r in stopped:
        text = decode(tokenizer, segment[r])
        parts[r].append(text)
        segment[r] = []
        turns[r] += 1
        if finish[r] in ("python", "search"):
            tool_rows[finish[r]].append((r, text))
    return run_tool_calls(env, tool_rows, calls, limits)


def _add_rows(cache, count: int) -> None:
    """Append ``count`` empty rows to every initialised layer of ``cache`` (attention: zero keys and
    values under masked columns; linear attention: zero states, marked fresh by the caller)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    from copes_lib.rollout import GrowingLayer

    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for s in range(layer.number_of_states):
                for kind in ("conv", "recurrent"):
                    states = getattr(layer, f"{kind}_states")
                    if getattr(layer, f"is_{kind}_states_initialized")[s]:
                        old = states[s]
                        states[s] = torch.cat([old, old.new_zeros(count, *old.shape[1:])])
        if isinstance(layer, GrowingLayer) and layer.is_initialized and layer._k is not None:
            layer._k = torch.cat([layer._k, layer._k.new_zeros(count, *layer._k.shape[1:])])
            layer._v = torch.cat([layer._v, layer._v.new_zeros(count, *layer._v.shape[1:])])
            layer.keys, layer.values = layer._k[..., :layer._n, :], layer._v[..., :layer._n, :]
        elif not isinstance(layer, (GrowingLayer, LinearAttentionCacheLayerMixin)):
            raise ConfigError(f"SlotEngine: cache layer type {type(layer).__name__} is not supported")


def _drop_unused_columns(cache, attention: torch.Tensor) -> torch.Tensor:
    """Drop the leading cache columns that no remaining row attends to (rows that used them left)."""
    from copes_lib.rollout import GrowingLayer

    used = attention.any(0).nonzero()
    first = int(used[0]) if len(used) else attention.shape[1]
    if first < 64:  # not worth a copy
        return attention
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer) and layer.is_initialized and layer._n:
            layer._k = layer._k[..., first:, :].contiguous()
            layer._v = layer._v[..., first:, :].contiguous()
            layer._n -= first
            layer.keys, layer.values = layer._k[..., :layer._n, :], layer._v[..., :layer._n, :]
    return attention[:, first:]

# --------------------------------------------------------------------------- Qwen3.5 models built here
QWEN35_SIZES = {
    # 3 linear-attention layers + 1 full-attention layer: the pattern of Qwen3.5, in miniature
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=4),
    # realistic sizes (randomly initialised; benchmarks): about 0.8B and 2B parameters with Qwen3.5's vocabulary
    "0.8b": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
                 linear_num_key_heads=16, linear_num_value_heads=16),
    "2b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=8,
               num_key_value_heads=2, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
               linear_num_key_heads=16, linear_num_value_heads=16),
}


def build_qwen35(size: str, vocab_size: int, seed: int, tokenizer=None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, max_positions: int = 4096):
    """A randomly initialised Qwen3_5ForCausalLM (text only) of ``size`` (QWEN35_SIZES), every 4th layer
    full attention, the others Gated-DeltaNet linear attention. Deterministic in ``seed``."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    if size not in QWEN35_SIZES:
        raise ConfigError(f"size = {size!r} is not valid; valid values: {list(QWEN35_SIZES)}")
    dims = QWEN35_SIZES[size]
    layers = dims["num_hidden_layers"]
    special = {}
    if tokenizer is not None:
        special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                       bos_token_id=tokenizer.bos_token_id)
    config = Qwen3_5TextConfig(vocab_size=vocab_size, max_position_embeddings=max_positions, **dims, **special,
                               layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                            for i in range(layers)])
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3_5ForCausalLM(config)
    return model.to(dtype=dtype).eval()
