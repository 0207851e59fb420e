"""Batched multi-turn agent rollouts with tool calls, a KV cache, and a mask of model-written tokens.

One call runs a batch of trajectories to the end: the model generates (greedy, or sampled with
temperature / top-p from a seeded generator) until each row stops at a closing tool tag, an answer,
EOS or a budget; the tool calls of the whole batch then run together (Python through
``PythonSandbox.run_many``, search through one ``retriever.search`` call); their observations are
appended and generation resumes on the same KV cache. Rows that finish leave the batch (their cache
rows are dropped), so late turns cost only what is still running. ``model_mask`` marks the tokens
the model wrote (1) against tool observations (0): GRPO trains only on the former.

Positions: every row keeps its own position counter and padding holes are masked, so a row's tokens
see exactly what they would see alone (tested against single-row rollouts). Hybrid models (Qwen3.5:
Gated-DeltaNet linear-attention layers with conv and recurrent states next to full attention) get
two more things (``_RowExactLinearAttention``): a padding step would advance a row's recurrent state
and shift its conv window, so every linear-attention layer runs each group of rows on their real
tokens only, on a copy of their states that is written back; and turn boundaries select rows of
every cache layer type (``select_rows``).

Departures from the paper (docs/paper_a_copes.md#a4-task-agent-reward-and-data): an invalid call (no opening tag, empty body, over its
limit) gets an error observation instead of a retry; the tool budget is per trajectory; the
reward is computed on the model-written text only (observations removed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin, LinearAttentionLayer

from copes_lib.config import Config, ConfigError, param
from copes_lib.tasks import TOOL_LIMITS, Task, format_prompt
from copes_lib.tasks.protocol import (
    ANSWER_CLOSE,
    PYTHON_CLOSE,
    SEARCH_CLOSE,
    error_observation,
    last_call,
    python_observation,
    search_observation,
)
from copes_lib.tasks.rewards import format_reward_value, math_correctness, math_reward, qa_reward, qa_scores

_STOP_TAGS = {PYTHON_CLOSE: "python", SEARCH_CLOSE: "search", ANSWER_CLOSE: "answer"}


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Config):
    """How trajectories are generated. Tool limits default to the task kind's (math 5 Python +
    3 search, QA 5 + 5; docs/paper_a_copes.md#a4-task-agent-reward-and-data)."""

    max_new_tokens: int = param(96, "model-written tokens per trajectory, over all turns", ge=1)
    max_turns: int = param(6, "model turns per trajectory (each tool call ends a turn); 0 = every allowed tool "
                           "call plus the answer (the tool limits' sum + 1: the paper's 9 for math, 11 for QA)", ge=0)
    max_context: int = param(512, "prompt + completion tokens; a trajectory that reaches it ends", ge=8)
    max_python_calls: int | None = param(None, "Python calls per trajectory; None = the task kind's limit", ge=0)
    max_search_calls: int | None = param(None, "search calls per trajectory; None = the task kind's limit", ge=0)
    temperature: float = param(0.0, "sampling temperature; 0 = greedy (the paper's validation and ES)", ge=0.0)
    top_p: float = param(1.0, "nucleus sampling mass (paper's test decoding: 1.0)", gt=0.0, le=1.0)
    batch_size: int = param(256, "trajectories per rollout call inside evaluate()", ge=1)
    prompt_style: str = param("auto", "prompt format: plain (miniature), chat (chat template), "
                              "auto = chat when the tokenizer has a chat template", choices=("auto", "plain", "chat"))
    enable_thinking: bool | None = param(None, "chat prompts: the chat template's enable_thinking (Qwen3 / "
                                         "Qwen3.5 thinking mode); None = the template's own default")

    def to_dict(self) -> dict:
        """Config.to_dict without ``enable_thinking`` when it is None, so cache keys made before the
        field existed (every smoke / cpu run) stay valid."""
        out = super().to_dict()
        if out["enable_thinking"] is None:
            del out["enable_thinking"]
        return out


@dataclasses.dataclass
class RolloutBatch:
    tasks: list[Task]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    model_mask: list[list[int]]
    texts: list[str]
    rewards: list[float]
    scores: list[float]
    tool_calls: list[dict[str, int]]
    model_texts: list[str] = dataclasses.field(default_factory=list)   # model-written text only
    finish_reasons: list[str] = dataclasses.field(default_factory=list)  # answer/eos/tokens/turns/context
    details: list[dict[str, float]] = dataclasses.field(default_factory=list)  # acc/em/f1 (QA), correct (math)
    elapsed_s: float = 0.0
    forward_calls: int = 0

    @property
    def new_tokens(self) -> int:
        """Model-written tokens of the whole batch."""
        return sum(sum(m) for m in self.model_mask)


# --------------------------------------------------------------------------- environment
class AgentEnv:
    """The tools and the reward of one task kind: a lazily started Python sandbox, a retriever, the
    per-trajectory tool limits, and the paper's reward. Identical Python code gives the cached
    observation (``cache_tool_results``), which makes greedy populations cheap; the code the model
    writes here cannot read clocks or randomness usefully, so the cache changes no result."""

    def __init__(self, kind: str, retriever=None, search_k: int = 2, limits: dict | None = None,
                 sandbox_config=None, cache_tool_results: bool = True, show_titles: bool = False):
        if kind not in TOOL_LIMITS:
            raise ConfigError(f"kind = {kind!r} is not valid; valid values: {list(TOOL_LIMITS)}")
        self.kind, self.retriever, self.search_k = kind, retriever, search_k
        self.limits = dict(limits or TOOL_LIMITS[kind])
        # real corpora: Search-R1's "Doc 1 (Title: ...) text" lines; the miniature: the text alone
        self.show_titles = show_titles
        self.sandbox_config = sandbox_config
        self.cache_tool_results = cache_tool_results
        self._sandbox = None
        self._python_cache: dict[str, str] = {}
        self._search_cache: dict[str, str] = {}

    # tools ---------------------------------------------------------------
    @property
    def sandbox(self):
        if self._sandbox is None:
            from copes_lib.tools import CodeSandboxConfig, PythonSandbox

            self._sandbox = PythonSandbox(self.sandbox_config or CodeSandboxConfig())
        return self._sandbox

    def run_python(self, codes: list[str]) -> list[str]:
        """Observations (``<output>...</output>``) of a batch of code strings."""
        todo = sorted({c for c in codes if c not in self._python_cache}) if self.cache_tool_results \
            else list(dict.fromkeys(codes))
        results = dict(zip(todo, self.sandbox.run_many(todo))) if todo else {}
        out = []
        for code in codes:
            if code in results:
                obs = python_observation(results[code].observation())
                if self.cache_tool_results:
                    self._python_cache[code] = obs
            else:
                obs = self._python_cache[code]
            out.append(obs)
        return out

    def run_search(self, queries: list[str]) -> list[str]:
        """Observations (``<result>...</result>``) of a batch of queries."""
        from copes_lib.tools.search import format_passages
        if self.retriever is None:
            return [error_observation("search", "no search tool in this environment")] * len(queries)
        todo = list(dict.fromkeys(q for q in queries if q not in self._search_cache))
        if todo:
            for query, passages in zip(todo, self.retriever.search(todo, self.search_k)):
                texts = [format_passages(passages)] if self.show_titles else [p.text for p in passages]
                self._search_cache[query] = search_observation(texts)
        return [self._search_cache[q] for q in queries]

    # rewards ----------------------------------------------------------------
    def reward(self, prompts, completions, answers, tool_calls) -> list[float]:
        fn = math_reward if self.kind == "math" else qa_reward
        return fn(prompts, completions, answers, tool_calls)

    def details(self, prompts, completions, answers) -> list[dict[str, float]]:
        """Per-sample correctness: {"correct"} for math, {"acc", "em", "f1"} for QA."""
        if self.kind == "math":
            return [{"correct": c} for c in math_correctness(prompts, completions, answers)]
        return qa_scores(prompts, completions, answers)

    def score_key(self) -> str:
        return "correct" if self.kind == "math" else "f1"

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_env(kind: str, profile: str, sandbox_config=None, cache_tool_results: bool = True) -> AgentEnv:
    """The environment of ``kind`` ("math" | "qa") in ``profile``: its retriever (built once per
    corpus, :func:`copes_lib.tasks.retrieval.shared_retriever`), tool limits and passages per search."""
    from copes_lib.tasks import tool_settings
    from copes_lib.tasks.retrieval import shared_retriever

    limits, top_k = tool_settings(profile, kind)
    return AgentEnv(kind, shared_retriever(profile, kind), top_k, limits, sandbox_config, cache_tool_results,
                    show_titles=profile == "gpu")


# --------------------------------------------------------------------------- stop detection
class StopMatcher:
    """Finds where a row's current turn ends. Fast path: every closing tag is one token of the
    vocabulary (the miniature's tokenizer); otherwise the last few decoded tokens are searched."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        self.by_id = {vocab[tag]: kind for tag, kind in _STOP_TAGS.items() if tag in vocab}
        self.single_token = len(self.by_id) == len(_STOP_TAGS)
        self.eos_ids = {i for i in _as_list(tokenizer.eos_token_id)}
        self.ids = torch.tensor(sorted(set(self.by_id) | self.eos_ids)) if self.single_token else None

    def check(self, segment: list[int]) -> str | None:
        token = segment[-1]
        if token in self.eos_ids:
            return "eos"
        if self.single_token:
            return self.by_id.get(token)
        tail = self.tokenizer.decode(segment[-8:], skip_special_tokens=False)
        for tag, kind in _STOP_TAGS.items():
            if tag in tail:
                return kind
        return None


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def decode(tokenizer, ids: list[int]) -> str:
    """Text of ``ids`` with tags kept and padding / EOS / BOS dropped."""
    drop = set(_as_list(tokenizer.pad_token_id)) | set(_as_list(tokenizer.eos_token_id)) \
        | set(_as_list(tokenizer.bos_token_id))
    return tokenizer.decode([i for i in ids if i not in drop], skip_special_tokens=False)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_style(tokenizer, config: RolloutConfig) -> str:
    if config.prompt_style != "auto":
        return config.prompt_style
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


def _growing_cache(model):
    """HF's DynamicCache with its full-attention layers replaced by :class:`GrowingLayer`."""
    cache = DynamicCache(config=getattr(model, "config", None))
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = GrowingLayer
    return cache


class GrowingLayer(DynamicLayer):
    """A DynamicLayer that writes into a preallocated buffer (grown by 25% when full) instead
    of concatenating the whole cache at every step: one decode step then copies one column, not
    the cache (profiled: the concatenation was a third of a QA rollout's time)."""

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None
        self._n = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self._k is None or self._n + new > self._k.shape[-2]:
            capacity = self._n + new + max(128, self._n // 4)  # <= 25% slack: caches of 1000s of rows are big
            k = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
            v = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
            if self._n:
                k[..., :self._n, :] = self._k[..., :self._n, :]
                v[..., :self._n, :] = self._v[..., :self._n, :]
            self._k, self._v = k, v
        self._k[..., self._n:self._n + new, :] = key_states
        self._v[..., self._n:self._n + new, :] = value_states
        self._n += new
        self.keys, self.values = self._k[..., :self._n, :], self._v[..., :self._n, :]
        return self.keys, self.values

    def batch_select_indices(self, indices) -> None:
        if self.is_initialized and self._n:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[..., :self._n, :], self._v[..., :self._n, :]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the rollout never crops its cache")


def select_rows(cache, index: torch.Tensor) -> None:
    """Keep (and reorder) the rows ``index`` of every layer of ``cache``: attention keys/values and
    linear-attention conv/recurrent states (transformers' ``Cache.batch_select_indices`` fails on
    ``LinearAttentionLayer``, which has no such method)."""
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            LinearAttentionCacheLayerMixin.reorder_cache(layer, index)
        if hasattr(layer, "batch_select_indices"):
            layer.batch_select_indices(index)


def linear_attention_layers(cache) -> list[int]:
    """Indices of the cache layers that hold linear-attention (conv / recurrent) states."""
    return [i for i, layer in enumerate(cache.layers) if isinstance(layer, LinearAttentionCacheLayerMixin)]


def check_hybrid_cache(model, cache) -> None:
    """A hybrid model whose cache does not hold transformers' ``LinearAttentionLayer`` (older
    transformers kept Qwen3.5's states in a model-specific cache) would be rolled out without the
    row-exact path: refuse rather than return rows that differ from their single-row runs."""
    layer_types = getattr(getattr(model, "config", None), "layer_types", None) or []
    if "linear_attention" in layer_types and not linear_attention_layers(cache):
        import transformers

        raise ConfigError(f"rollout: this hybrid model's cache (transformers {transformers.__version__}) has no "
                          "LinearAttentionLayer; the row-exact rollout needs transformers 5.24 "
                          "(requirements.txt / requirements-gpu.txt)")


class _RowStates:
    """The conv/recurrent states of some rows of one linear-attention cache layer, copied out, so a
    module can run on those rows alone; ``write_back`` stores them into the full layer. It offers the
    Cache methods a linear-attention module calls (``get_/update_conv_state``, ``get_/update_recurrent_state``,
    ``is_recording_past``) for its one layer."""

    def __init__(self, layer, index: torch.Tensor, fresh: bool):
        self.layer, self.index = layer, index
        self.part = LinearAttentionLayer(number_of_states=layer.number_of_states)
        for s in range(layer.number_of_states):
            if fresh or not layer.has_previous_state[s]:
                continue
            if layer.is_conv_states_initialized[s]:
                self.part.conv_states[s] = layer.conv_states[s][index]
                self.part.is_conv_states_initialized[s] = True
                self.part.conv_kernel_size[s] = layer.conv_kernel_size[s]
            if layer.is_recurrent_states_initialized[s]:
                self.part.recurrent_states[s] = layer.recurrent_states[s][index]
                self.part.is_recurrent_states_initialized[s] = True
            self.part.has_previous_state[s] = True
            self.part.device, self.part.dtype = layer.device, layer.dtype

    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        return self.part.conv_states[state_idx] if self.part.has_previous_state[state_idx] else None

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        return self.part.recurrent_states[state_idx] if self.part.has_previous_state[state_idx] else None

    def update_conv_state(self, conv_states, layer_idx: int, state_idx: int = 0, **kwargs):
        return self.part.update_conv_state(conv_states, state_idx, **kwargs)

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0, **kwargs):
        return self.part.update_recurrent_state(recurrent_states, state_idx, **kwargs)

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def write_back(self, batch: int) -> None:
        layer, part = self.layer, self.part
        for s in range(layer.number_of_states):
            for kind in ("conv", "recurrent"):
                if not getattr(part, f"is_{kind}_states_initialized")[s]:
                    continue
                states, new = getattr(layer, f"{kind}_states"), getattr(part, f"{kind}_states")[s]
                if not getattr(layer, f"is_{kind}_states_initialized")[s]:
                    states[s] = new.new_zeros(batch, *new.shape[1:])
                    getattr(layer, f"is_{kind}_states_initialized")[s] = True
                states[s][self.index] = new
            if part.is_conv_states_initialized[s]:
                layer.conv_kernel_size[s] = part.conv_kernel_size[s]
            if part.has_previous_state[s]:
                layer.has_previous_state[s] = True
            layer.device, layer.dtype = part.device, part.dtype


class _RowExactLinearAttention:
    """Makes the linear-attention modules of a hybrid model (Qwen3.5's Gated-DeltaNet) see only the
    real tokens of each row. The rollout left-pads rows to a common width and feeds a pad to rows that
    wait for the others; attention layers mask those, but a linear-attention layer would decay its
    recurrent state and shift its conv window on every pad. Here each group of rows with the same
    number of real tokens runs alone on a copy of its states (written back after), rows with none
    are skipped, and pad outputs are zero (the residual stream carries them; they are masked)."""

    def __init__(self, model, cache, rows_hook: Callable[[list[int]], None] | None):
        self.cache, self.rows_hook = cache, rows_hook
        ids = set(linear_attention_layers(cache))
        self.modules = [m for m in model.modules() if getattr(m, "layer_idx", None) in ids
                        and hasattr(m, "conv1d")]
        missing = ids - {m.layer_idx for m in self.modules}
        if missing:
            raise ConfigError(f"rollout: cache layers {sorted(missing)} hold linear-attention states but no "
                              "module with a conv1d and that layer_idx was found; this model family is not "
                              "supported by the row-exact rollout")
        self.rows: list[int] = []
        self.full = True  # every row feeds `width` real tokens and none is fresh
        self.groups: list[tuple[int, bool, list[int], torch.Tensor]] = []  # (real tokens, fresh, batch rows)

    def prepare(self, lengths: list[int], rows: list[int], device, fresh: list[bool] | None = None) -> None:
        """Before every forward: each batch row's number of real (right-aligned) tokens, the original
        row ids, and which rows have no state yet (rows joining a running batch; slots engine). The
        groups are made here once, not in every layer (no device sync per layer)."""
        fresh = fresh or [False] * len(lengths)
        width = max(lengths)
        self.rows = list(rows)
        self.full = all(n == width for n in lengths) and not any(fresh)
        keys = sorted({(n, f) for n, f in zip(lengths, fresh) if n > 0})
        members = {key: [i for i, k in enumerate(zip(lengths, fresh)) if k == key] for key in keys}
        self.groups = [(n, f, members[(n, f)], torch.tensor(members[(n, f)], dtype=torch.long, device=device))
                       for n, f in keys]

    def __enter__(self):
        for module in self.modules:
            module.forward = self._forward(module, module.forward)
        return self

    def __exit__(self, *exc):
        for module in self.modules:
            del module.forward

    def _forward(self, module, original):
        def forward(hidden_states, cache=None, attention_mask=None, **kwargs):
            if cache is None or self.full:
                return original(hidden_states, cache=cache, attention_mask=None, **kwargs)
            layer = cache.layers[module.layer_idx]
            layer_fresh = not any(layer.has_previous_state.values())
            width = hidden_states.shape[1]
            out = hidden_states.new_zeros(hidden_states.shape)
            for n_real, fresh, batch_rows, index in self.groups:
                states = _RowStates(layer, index, fresh or layer_fresh)
                if self.rows_hook is not None:
                    self.rows_hook([self.rows[i] for i in batch_rows])
                out[index, width - n_real:] = original(hidden_states[index, width - n_real:], cache=states,
                                                       attention_mask=None, **kwargs).to(out.dtype)
                states.write_back(hidden_states.shape[0])
            if self.rows_hook is not None:
                self.rows_hook(list(self.rows))
            return out

        return forward


def _pick(logits: torch.Tensor, config: RolloutConfig, generator: torch.Generator) -> torch.Tensor:
    if config.temperature == 0.0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / config.temperature, dim=-1)
    if config.top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > config.top_p  # keeps at least the top token
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


# --------------------------------------------------------------------------- rollout
@torch.no_grad()
def run_tool_calls(env: AgentEnv, tool_rows: dict[str, list[tuple[int, str]]], calls: list[dict[str, int]],
                   limits: dict[str, int]) -> dict[int, str]:
    """The observation of each row whose turn closed a tool tag (``tool_rows``: tool -> [(row, turn
    text)]): the tool's output for a valid call within its limit (all of a tool's calls in one batch),
    else an error observation; counts the calls made in ``calls``. Every engine uses it."""
    observations: dict[int, str] = {}
    for tool, runner in (("python", env.run_python), ("search", env.run_search)):
        valid = []
        for r, text in tool_rows.get(tool, []):
            body = last_call(text, tool)
            if calls[r][tool] >= limits[tool]:
                observations[r] = error_observation(tool, f"{tool} call limit ({limits[tool]}) reached")
            elif body is None or not body.strip():
                observations[r] = error_observation(tool, f"invalid call: write <{tool}>...</{tool}>")
            else:
                calls[r][tool] += 1
                valid.append((r, body.strip() if tool == "search" else body))
        for (r, _), obs in zip(valid, runner([b for _, b in valid]) if valid else []):
            observations[r] = obs
    return observations


def turn_stop(stops: StopMatcher, segment: list[int], model_tokens: int, length: int, config: RolloutConfig) -> str | None:
    """Why a row's turn ends at its newest token: the stop tag it closed (``stops``), its model-token
    budget (``"tokens"``) or the context (``"context"``); None while it goes on. Every engine uses it."""
    stop = stops.check(segment)
    if stop is None:
        if model_tokens >= config.max_new_tokens:
            return "tokens"
        if length >= config.max_context:
            return "context"
    return stop


def rollout(model, tokenizer, tasks: list[Task], env: AgentEnv, config: RolloutConfig = RolloutConfig(),
            seed: int = 0, row_hook: Callable[[list[int]], None] | None = None,
            logits_hook: Callable[[list[int], list[bool], torch.Tensor], None] | None = None) -> RolloutBatch:
    """Run ``tasks`` as one batch of agent trajectories. ``row_hook(rows)`` is called before every
    forward pass with the original batch-row indices of the rows in that pass. ``logits_hook(rows,
    generating, logits)`` sees each pass's next-token logits (float32, one row per batch row) before a
    token is picked; it may change them in place (tests force tool calls this way)."""
    start_time = time.perf_counter()
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    stops = StopMatcher(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else _as_list(tokenizer.eos_token_id)[0]
    limits = {"python": env.limits["python"] if config.max_python_calls is None else config.max_python_calls,
              "search": env.limits["search"] if config.max_search_calls is None else config.max_search_calls}
    max_turns = config.max_turns or limits["python"] + limits["search"] + 1
    style = prompt_style(tokenizer, config)
    prompt_ids = [encode(tokenizer, format_prompt(t, style, tokenizer, limits["python"], limits["search"],
                                                  config.enable_thinking)) for t in tasks]
    n = len(tasks)
    completion = [[] for _ in range(n)]
    mask = [[] for _ in range(n)]
    segment = [[] for _ in range(n)]
    model_parts = [[] for _ in range(n)]
    calls = [{"python": 0, "search": 0} for _ in range(n)]
    finish = [""] * n
    turns = [0] * n
    n_model = [0] * n
    generator = torch.Generator().manual_seed(seed)

    rows = list(range(n))                       # original index of each batch row
    pending = [list(p) for p in prompt_ids]     # tokens to feed, per batch row
    generating = [True] * n                     # per batch row: wants a new token after this feed
    seen = torch.zeros(n, dtype=torch.long, device=device)   # real tokens fed so far, per batch row
    attention = torch.zeros(n, 0, dtype=torch.long, device=device)
    cache = _growing_cache(model)
    # transformers 5.x names the cache argument `cache`; older model classes call it past_key_values.
    # A peft model forwards **kwargs to its base model: ask the base model (else a FutureWarning per call).
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    forwards = 0

    exact = _RowExactLinearAttention(model, cache, row_hook) if linear_attention_layers(cache) else None
    check_hybrid_cache(model, cache)
    with exact if exact is not None else contextlib.nullcontext():
        while rows:
            width = max(len(p) for p in pending)
            # left-pad, so the last column is every feeding row's newest token
            chunk = torch.tensor([[pad_id] * (width - len(p)) + p for p in pending], dtype=torch.long, device=device)
            chunk_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in pending], dtype=torch.long,
                                      device=device)
            positions = (seen[:, None] + chunk_mask.cumsum(1) - 1).clamp_min(0)
            attention = torch.cat([attention, chunk_mask], dim=1)
            seen = seen + chunk_mask.sum(1)
            if row_hook is not None:
                row_hook(list(rows))
            if exact is not None:
                exact.prepare([len(p) for p in pending], rows, device)
            out = model(input_ids=chunk, attention_mask=attention, position_ids=positions, use_cache=True,
                        logits_to_keep=1, **{cache_arg: cache})
            forwards += 1
            logits = out.logits[:, -1, :].float()
            if pad_id not in stops.eos_ids:  # padding is never a real next token
                logits[:, pad_id] = float("-inf")
            if logits_hook is not None:
                logits_hook(list(rows), list(generating), logits)
            new_tokens = _pick(logits, config, generator).tolist()

            pending = [[] for _ in rows]
            for i, r in enumerate(rows):
                if not generating[i]:
                    continue
                token = new_tokens[i]
                completion[r].append(token)
                mask[r].append(1)
                segment[r].append(token)
                pending[i] = [token]
                n_model[r] += 1
                stop = turn_stop(stops, segment[r], n_model[r], len(prompt_ids[r]) + len(completion[r]), config)
                if stop is not None:
                    generating[i] = False
                    finish[r] = stop
            if any(generating):
                continue

            # every row has stopped: run the batch's tool calls, then resume or retire each row
            tool_rows = {"python": [], "search": []}
            for i, r in enumerate(rows):
                text = decode(tokenizer, segment[r])
                model_parts[r].append(text)
                segment[r] = []
                turns[r] += 1
                if finish[r] in ("python", "search"):
                    tool_rows[finish[r]].append((i, r, text))
            observations = run_tool_calls(env, {tool: [(r, text) for _i, r, text in rows_]
                                                for tool, rows_ in tool_rows.items()}, calls, limits)
            keep = []
            for i, r in enumerate(rows):
                if r in observations:
                    obs_ids = encode(tokenizer, observations[r])
                    if turns[r] >= max_turns:
                        finish[r] = "turns"
                    elif len(prompt_ids[r]) + len(completion[r]) + len(obs_ids) + 1 > config.max_context:
                        finish[r] = "context"
                    else:
                        completion[r].extend(obs_ids)
                        mask[r].extend([0] * len(obs_ids))
                        pending[i] = pending[i] + obs_ids
                        keep.append(i)
            if not keep:
                break
            index = torch.tensor(keep, device=device)
            select_rows(cache, index)
            attention, seen = attention[index], seen[index]
            rows = [rows[i] for i in keep]
            pending = [pending[i] for i in keep]
            generating = [True] * len(rows)

    if was_training:
        model.train()
    model_texts = ["".join(parts) for parts in model_parts]
    answers = [t.answers for t in tasks]
    prompts = [decode(tokenizer, p) for p in prompt_ids]
    details = env.details(prompts, model_texts, answers)
    return RolloutBatch(
        tasks=list(tasks), prompt_ids=prompt_ids, completion_ids=completion, model_mask=mask,
        texts=[decode(tokenizer, c) for c in completion],
        rewards=env.reward(prompts, model_texts, answers, calls),
        scores=[d[env.score_key()] for d in details], tool_calls=calls, model_texts=model_texts,
        finish_reasons=finish, details=details, elapsed_s=time.perf_counter() - start_time,
        forward_calls=forwards)


def evaluate(model, tokenizer, tasks: list[Task], env: AgentEnv, config: RolloutConfig = RolloutConfig(),
             seed: int = 0, return_batches: bool = False) -> dict:
    """Mean metrics over ``tasks`` (rolled out in chunks of ``config.batch_size``).

    Keys: ``score`` (accuracy for math, F1 for QA), ``accuracy`` (math) or ``f1``/``em``/``acc`` (QA),
    ``mean_reward``, ``format_ok_rate`` (answer block and boxed answer present), ``mean_python_calls``,
    ``mean_search_calls``, ``tool_use_rate``, ``mean_new_tokens``, ``new_tokens_per_s``,
    ``score_by_difficulty`` ({difficulty: mean score}), plus ``batches`` if asked.
    """
    if not tasks:
        raise ValueError("evaluate() needs at least one task")
    batches = [rollout(model, tokenizer, tasks[i:i + config.batch_size], env, config, seed + i)
               for i in range(0, len(tasks), config.batch_size)]
    scores = [s for b in batches for s in b.scores]
    calls = [c for b in batches for c in b.tool_calls]
    n = len(scores)
    result = {
        "n": n,
        "score": sum(scores) / n,
        "mean_reward": sum(r for b in batches for r in b.rewards) / n,
        "format_ok_rate": sum(format_reward_value(t) == 0.0 for b in batches for t in b.model_texts) / n,
        "mean_python_calls": sum(c["python"] for c in calls) / n,
        "mean_search_calls": sum(c["search"] for c in calls) / n,
        "tool_use_rate": sum(c["python"] + c["search"] > 0 for c in calls) / n,
        "mean_new_tokens": sum(b.new_tokens for b in batches) / n,
        "new_tokens_per_s": sum(b.new_tokens for b in batches) / max(sum(b.elapsed_s for b in batches), 1e-9),
    }
    if env.kind == "math":
        result["accuracy"] = result["score"]
    else:
        for key in ("acc", "em", "f1"):
            result[key] = sum(d[key] for b in batches for d in b.details) / n
    by_difficulty: dict[int, list[float]] = {}
    for b in batches:
        for task, score in zip(b.tasks, b.scores):
            by_difficulty.setdefault(task.difficulty, []).append(score)
    result["score_by_difficulty"] = {d: sum(v) / len(v) for d, v in sorted(by_difficulty.items())}
    if return_batches:
        result["batches"] = batches
    return result
