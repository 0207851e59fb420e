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

Engines here, all on one trajectory state (:class:`copes_lib.rollout.Trajectories`), each only a
scheduler: ``loop`` (the plain batched loop of ``rollout.rollout``: CPU and any device), ``slots``
(continuous batching: a fixed number of slots, a finished trajectory frees its slot for the next
task, a row whose turn ends runs its tool and continues without waiting for the rest of the batch;
its cache is re-packed so its width stays near the longest live row) and ``static`` (the loop's
scheduler on a fast decode path: a fixed-width static cache, decode inputs built on the device, a
``torch.compile``-d decode step, CUDA graphs on a GPU; the loop's tokens, sampled ones included).
Hybrid Qwen3.5 models are supported through the row-exact linear-attention path. On a GPU an
engine built with ``require_gpu=True`` needs the Triton kernels of Qwen3.5's linear attention
(``flash-linear-attention``, requirements-gpu.txt): without them transformers falls back to a slow
PyTorch loop, so it refuses with what to install.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from copes_lib.config import ConfigError
from copes_lib.kv_cache import static_cache
from copes_lib.rollout import (
    PACK_SLACK,
    AgentEnv,
    RolloutBatch,
    RolloutConfig,
    Trajectories,
    rollout,
    run_loop,
)
from copes_lib.tasks import Task

ENGINES = ("loop", "slots", "static")


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

    def generate(self, tasks, env, config, seed=0, row_hook=None, logits_hook=None) -> RolloutBatch:
        return rollout(self.model, self.tokenizer, tasks, env, config, seed=seed, row_hook=row_hook,
                       logits_hook=logits_hook)


def make_engine(name: str, model: nn.Module, tokenizer, **options) -> RolloutEngine:
    """The engine ``name`` (one of ENGINES) for ``model``; clear errors for what a machine lacks."""
    if name not in ENGINES:
        raise ConfigError(f"engine = {name!r} is not valid; valid values: {list(ENGINES)}")
    cls = {"loop": LoopEngine, "slots": SlotEngine, "static": StaticEngine}[name]
    valid = [p for p in inspect.signature(cls).parameters if p not in ("model", "tokenizer")]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"engine {name!r}: options {unknown} are not valid; valid options: {valid}")
    return cls(model, tokenizer, **options)


def kernel_implementation(fn: Callable, depth: int = 0) -> Callable:
    """The function a transformers kernel wrapper (``use_kernel_func_from_hub_with_fallback``) dispatches
    to: the ``implementation`` in its closure, looked for through at most 3 nested wrappers."""
    try:
        closure = inspect.getclosurevars(fn).nonlocals
    except TypeError:
        return fn
    if "implementation" in closure:
        return closure["implementation"]
    for value in closure.values():
        if callable(value) and depth < 3 and value is not fn:
            found = kernel_implementation(value, depth + 1)
            if found is not value:
                return found
    return fn


#: Qwen3.5's module-level kernel entry points (transformers 5.x) whose fast path is flash-linear-attention
LINEAR_ATTENTION_KERNELS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                            "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")


def linear_attention_kernels() -> dict[str, str]:
    """Kernel entry point -> ``module.qualname`` of what Qwen3.5's Gated-DeltaNet layers call. transformers
    picks the implementation when its modeling file is imported: flash-linear-attention's (``fla.``) if that
    import and lookup work, else its reference PyTorch loop (correct, much slower), silently but for a
    log warning at the first call."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as q35

    out = {}
    for name in LINEAR_ATTENTION_KERNELS:
        fn = getattr(q35, name, None)
        if callable(fn):
            impl = kernel_implementation(fn)
            out[name] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
    return out


def check_gpu_engine(model: nn.Module) -> None:
    """Raise ConfigError unless ``model`` can run fast on a GPU: CUDA present and, for hybrid
    (linear-attention) models, transformers resolving the Gated-DeltaNet kernels to flash-linear-attention
    (an installed ``fla`` that transformers cannot use, e.g. another version's layout, is not enough)."""
    if not torch.cuda.is_available():
        raise ConfigError("the GPU engine needs a CUDA GPU (torch.cuda.is_available() is False): install the "
                          "CUDA build of torch from requirements-gpu.txt, or use engine='loop' on the CPU")
    layer_types = getattr(getattr(model, "config", None), "layer_types", None) or []
    if "linear_attention" not in layer_types:
        return
    try:
        import fla  # noqa: F401  (flash-linear-attention's import name)
    except ImportError as err:
        raise ConfigError("this model has linear-attention (Gated-DeltaNet) layers: on a GPU they need the "
                          "Triton kernels of flash-linear-attention; pip install -r requirements-gpu.txt "
                          "(or pip install flash-linear-attention)") from err
    resolved = linear_attention_kernels()
    slow = {k: v for k, v in resolved.items() if not v.startswith("fla.")}
    if not resolved or slow:
        raise ConfigError(f"flash-linear-attention imports, but transformers resolves Qwen3.5's Gated-DeltaNet "
                          f"kernels to {slow or 'nothing'} (its reference PyTorch loop, not fla's Triton kernels): "
                          "install the flash-linear-attention version of requirements-gpu.txt in the same "
                          "environment before transformers is imported (benchmarks/gpu_check.sh reports the "
                          "resolution)")


# --------------------------------------------------------------------------- continuous batching
class SlotEngine:
    """Continuous batching over ``slots`` rows: a trajectory that finishes frees its slot for the next
    task at once, and a row whose turn ends with a tool call runs the call (together with the rows
    that stopped at the same token) and feeds its observation in the next forward while the others
    keep decoding: no row waits for the slowest row of its batch. One forward per token, as the loop;
    rows join with fresh cache rows (attention: masked columns; linear attention: fresh states).
    The trajectory state is the loop's (:class:`copes_lib.rollout.Trajectories`); this class is only
    the scheduler.

    Memory: a prompt or observation fed to some rows adds masked columns to every row. Before every
    model call the cache is re-packed (each row keeps its real columns, :meth:`Trajectories.compact`)
    when the call would make it wider than (1 + ``slack``) x the longest live row, and a long chunk is
    fed in pieces (:func:`copes_lib.rollout.split_chunk`): the width stays within that bound at every
    forward, the chunk included (where memory peaks), as in every engine. ``widths`` holds (width,
    longest live row) at each model call of the last ``generate``, ``compactions`` how often it
    re-packed; ``slack=inf`` never re-packs.

    Greedy results equal the loop's (tested on the CPU); sampled results are seeded but use the
    random stream in another order than the loop does. ``row_hook`` gets original task indices.
    Rows join in groups, once ``join_at`` slots are free (default: an eighth of the slots), so
    prompts are fed (and the cache re-packed) less often.
    """

    name = "slots"

    def __init__(self, model: nn.Module, tokenizer, slots: int = 64, require_gpu: bool = False,
                 join_at: int | None = None, slack: float = PACK_SLACK):
        if slots < 1:
            raise ConfigError(f"SlotEngine: slots = {slots} must be >= 1")
        self.join_at = max(1, slots // 8) if join_at is None else join_at
        if not 1 <= self.join_at <= slots:
            raise ConfigError(f"SlotEngine: join_at = {join_at} must be in [1, slots = {slots}]")
        if slack < 0:
            raise ConfigError(f"SlotEngine: slack = {slack} must be >= 0")
        if require_gpu:
            check_gpu_engine(model)
        self.model, self.tokenizer, self.slots, self.slack = model, tokenizer, slots, slack
        self.widths: list[tuple[int, int]] = []
        self.compactions = 0

    @torch.no_grad()
    def generate(self, tasks, env, config, seed=0, row_hook=None, logits_hook=None) -> RolloutBatch:
        queue = deque(range(len(tasks)))
        self.widths, self.compactions = [], 0
        with Trajectories(self.model, self.tokenizer, tasks, env, config, seed, row_hook, logits_hook,
                          slack=self.slack) as state:
            while queue or state.rows:
                free = self.slots - len(state.rows)
                if queue and free >= min(self.join_at, len(queue)):
                    state.add([queue.popleft() for _ in range(min(free, len(queue)))])
                stopped = state.feed(state.pick(state.forward()))
                if stopped:
                    going_on = set(state.end_turns(stopped))
                    ended = set(stopped) - going_on
                    if ended:
                        state.keep([i for i in range(len(state.rows)) if i not in ended])
            self.widths, self.compactions = state.widths, state.compactions
        return state.to_batch()


class StaticEngine:
    """The plain loop's scheduler (:func:`copes_lib.rollout.run_loop`: the same tokens as ``loop``,
    greedy and sampled, for the same seed) on a fast decode path: a preallocated fixed-width cache
    (:func:`copes_lib.kv_cache.static_cache`: transformers' StaticLayer, written at a device-side
    column, re-packed in place when a chunk would not fit), decode steps whose inputs are built on
    the device (the last tokens, positions, one mask column), run by ``torch.compile`` (on a GPU
    ``mode="reduce-overhead"``: CUDA graphs), sampling on the device with a seeded device generator.
    Per token the host syncs once, on the picked tokens (the stop check). Prompts and observations
    run eagerly (other shapes), and so do a hybrid model's steps in which some rows wait (the
    row-exact groups); a decode step of a hybrid model feeds one real token to every row, which the
    row-exact path leaves to the plain model.

    ``columns``: the cache width to start with (default: the longest prompt + ``max_new_tokens`` + 8,
    at most ``config.max_context``: a single-turn rollout fits); a chunk that does not fit after re-packing widens it (by a quarter
    more: a new shape, so a new compiled graph; a few per rollout at most). Every decode step
    attends over all of it (masked), as a static cache does. ``compile``: None = on CUDA only (a CPU compile takes
    minutes; ``benchmarks/bench_rollout.py --check-compiled`` runs it, the tests run the uncompiled
    static path). With a ``row_hook`` (ES's population batching patches per-row weights in Python)
    the decode steps run eagerly. ES perturbs the weights in place: the compiled step reads them.
    """

    name = "static"

    def __init__(self, model: nn.Module, tokenizer, columns: int | None = None, compile: bool | None = None,
                 compile_mode: str | None = None, require_gpu: bool = False):
        if columns is not None and columns < 8:
            raise ConfigError(f"StaticEngine: columns = {columns} must be >= 8 (or None: from the config)")
        if require_gpu:
            check_gpu_engine(model)
        self.model, self.tokenizer, self.columns = model, tokenizer, columns
        device = next(model.parameters()).device
        self.compile = device.type == "cuda" if compile is None else compile
        self.compile_mode = compile_mode or ("reduce-overhead" if device.type == "cuda" else "default")
        self.step = torch.compile(model, mode=self.compile_mode) if self.compile else model
        self.exact = None  # made at the first generate, then kept: the compiled step guards on it

    @torch.no_grad()
    def generate(self, tasks, env, config, seed=0, row_hook=None, logits_hook=None) -> RolloutBatch:
        def cache(prompt_ids):
            width = min(config.max_context, max(map(len, prompt_ids)) + config.max_new_tokens + 8)
            return static_cache(self.model, self.columns or width)

        state = Trajectories(self.model, self.tokenizer, tasks, env, config, seed, row_hook, logits_hook,
                             cache=cache, exact=self.exact)
        # a row_hook (ES's population batching) swaps per-row weights in Python: eager decode steps
        self.exact, state.step_model = state.exact, self.step if row_hook is None else self.model
        return run_loop(state)

# --------------------------------------------------------------------------- Qwen3.5 models built here
QWEN35_SIZES = {
    # 3 linear-attention layers + 1 full-attention layer: the pattern of Qwen3.5, in miniature
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=4),
    # Qwen3.5-4B's attention layout, narrow: 8 full-attention layers with 4 KV heads (paper A, docs/paper_a_copes.md
    # #a4-task-agent-reward-and-data) in Qwen3.5's 3:1 pattern (32 layers; the paper gives no layer count); what the
    # KV cache's re-allocation transient depends on (benchmarks/bench_kv.py), at a width a CPU runs in seconds
    "4b-layout": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=32, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
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


#: the row-exactness probe's output-weight scale: random tiny models give nearly flat logits, in which
#: a wrong linear-attention state moves the logits by only ~6e-4 (6x the gpu check's 1e-4 bar); scaled
#: by 30 (and with slowly decaying states) it moves them by ~4e-2 while float noise stays ~1e-5
PROBE_OUTPUT_SCALE = 30.0


def build_probe_qwen35(vocab_size: int, seed: int, tokenizer=None, device: str | torch.device = "cpu"):
    """The tiny Qwen3.5 of ``build_qwen35`` made into a row-exactness probe: output weights x
    ``PROBE_OUTPUT_SCALE`` (logits that are not flat) and Gated-DeltaNet decay ``A_log`` in [-3, 0]
    (slow decay, so a wrongly advanced recurrent state still shows in later logits). Rows of a batch
    equal their single-row runs within 1e-4 on it; with the row-exact path switched off they differ by
    >= 100x that (tests/test_gpu_check.py, tests/test_qwen35_rollout.py)."""
    model = build_qwen35("tiny", vocab_size, seed, tokenizer=tokenizer, device=device)
    with torch.no_grad():
        model.lm_head.weight.mul_(PROBE_OUTPUT_SCALE)
        generator = torch.Generator().manual_seed(seed + 1)
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                decay = layer.linear_attn.A_log
                decay.copy_(torch.empty(decay.shape).uniform_(-3.0, 0.0, generator=generator))
    return model
