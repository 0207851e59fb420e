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
two more things (``RowExactLinearAttention``): a padding step would advance a row's recurrent state
and shift its conv window, so every linear-attention layer runs each group of rows on their real
tokens only, on a copy of their states that is written back; and turn boundaries select rows of
every cache layer type (``select_rows``). The KV cache itself (grown in place, rows joining and
leaving, columns re-packed, one buffer per KV head) and that row-exact path are
``copes_lib/kv_cache.py``; this module holds the environment, stop detection, the trajectory state
and the plain scheduler.

One trajectory state serves every engine (:class:`Trajectories`: prompts, per-row feeding, turn
ends with their tool calls, the batch); :func:`rollout` is its plain scheduler (:func:`run_loop`),
``copes_lib/engines.py`` holds the others. Sampling draws on the logits' device from a seeded
generator on that device (on the CPU the same draws as before this was so; docs/engines.md).

Departures from the paper (docs/paper_a_copes.md#a4-task-agent-reward-and-data): an invalid call (no opening tag, empty body, over its
limit) gets an error observation instead of a retry; the tool budget is per trajectory; the
reward is computed on the model-written text only (observations removed).
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import weakref
from collections.abc import Callable

import torch

from copes_lib.config import Config, ConfigError, param
from copes_lib.kv_cache import (
    RowExactLinearAttention,
    StaticRowLayer,
    add_rows,
    check_hybrid_cache,
    growing_cache,
    linear_attention_layers,
    select_rows,
)
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
_STOP_KINDS = frozenset(_STOP_TAGS.values())


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
    model_s: float = 0.0  # host clock inside the model's forward calls (on a GPU: launches, not kernels)

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
_CLOSERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def closing_tokens(tokenizer, tags, vocab: dict[str, int] | None = None) -> frozenset[int]:
    """Ids of the tokens at which one of ``tags`` can become complete: a tag completes at the token whose
    text holds its last character, so every other token skips the decode. When every tag ends in a
    printable ASCII character (the protocol's ``>``), the vocabulary's pieces (``vocab``, else
    ``get_vocab()``) are read: byte-level BPE, SentencePiece and WordPiece spell such a character as
    itself (byte fallback's ``<0x3E>`` holds it too), so a piece without it cannot write it. Otherwise
    every token is decoded once, and tokens that decode to nothing or to part of a character are kept
    too. Built once per tokenizer, rebuilt when tokens are added."""
    key = (len(tokenizer), frozenset(tags))
    try:
        cached = _CLOSERS.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        cached = {}
    if key not in cached:
        last = {tag[-1] for tag in tags}
        if all(" " < c < "\x7f" for c in last):
            pieces = (tokenizer.get_vocab() if vocab is None else vocab).items()
            cached[key] = frozenset(i for piece, i in pieces if not last.isdisjoint(piece))
        else:
            texts = tokenizer.decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
            cached[key] = frozenset(i for i, text in enumerate(texts)
                                    if not text or "\ufffd" in text or not last.isdisjoint(text))
    return cached[key]


class StopMatcher:
    """Finds where a row's current turn ends: at the token where the turn's text first holds a closing
    tag, whatever the tokens that spell it (one token, a BPE split, one token per character or byte,
    tokens that decode to nothing). Fast path: every closing tag is one token of the vocabulary (the
    miniature's tokenizer). Otherwise a token that can complete a tag (:func:`closing_tokens`) is
    checked on the text of the fewest last tokens whose text before it holds at least the longest
    tag's characters (:meth:`window`): the tag was not complete one token earlier (the check runs at
    every token), so it ends inside the newest token and starts inside that text. Cost per token: a
    set lookup, and for a closing token two decodes of about a tag's length of tokens (never the whole
    turn, unless its tokens decode to almost nothing)."""

    def __init__(self, tokenizer, tags: dict[str, str] | None = None):
        self.tokenizer = tokenizer
        self.tags = dict(_STOP_TAGS if tags is None else tags)
        vocab = tokenizer.get_vocab()
        self.by_id = {vocab[tag]: kind for tag, kind in self.tags.items() if tag in vocab}
        self.single_token = len(self.by_id) == len(self.tags)
        self.eos_ids = {i for i in _as_list(tokenizer.eos_token_id)}
        self.ids = torch.tensor(sorted(set(self.by_id) | self.eos_ids)) if self.single_token else None
        self.longest = max(len(tag) for tag in self.tags)
        self.closers = frozenset() if self.single_token else closing_tokens(tokenizer, self.tags, vocab)

    def window(self, segment: list[int]) -> tuple[str, str]:
        """(text of the window, text of the window without its newest token) for the fewest last tokens
        of ``segment`` (a tag's length of tokens, doubled while too short) whose text before the
        newest token holds at least ``longest`` characters, or the whole segment. Why that suffices: a
        tag that ends inside the newest token has at most ``longest - 1`` characters before it, and the
        window's first token, cut from what precedes it, can only lose characters that are not the
        tag's (an incomplete byte sequence, a leading space)."""
        k = self.longest + 1
        while True:
            window = segment[-k:]
            before = self.tokenizer.decode(window[:-1], skip_special_tokens=False)
            if len(before) >= self.longest or k >= len(segment):
                return self.tokenizer.decode(window, skip_special_tokens=False), before
            k *= 2

    def check(self, segment: list[int]) -> str | None:
        token = segment[-1]
        if token in self.eos_ids:
            return "eos"
        if self.single_token:
            return self.by_id.get(token)
        if token not in self.closers:
            return None
        text, _ = self.window(segment)
        for tag, kind in self.tags.items():
            if tag in text:
                return kind
        return None

    def trim(self, segment: list[int]) -> list[int] | None:
        """The tokens that replace the turn's last token so that its text ends where the closing tag
        ends (None when it already does). A BPE that merges punctuation can write one token across the
        tag's end (``</python><`` or ``>.``): as serving engines do with stop strings, the rest of that
        token is dropped and the kept part re-tokenised. Only the last token changes: the tag was not
        complete one token earlier (``check`` runs at every token), so it ends inside the last token,
        and the tokens before it are already in the KV cache."""
        if self.single_token or not segment:
            return None
        text, before = self.window(segment)
        if not text.startswith(before):  # a multi-byte character split across tokens: keep the token
            return None
        ends = [text.find(tag, max(0, len(before) - len(tag) + 1)) for tag in self.tags]
        ends = [i + len(tag) for i, tag in zip(ends, self.tags) if i >= 0]
        end = min(ends, default=len(text))
        if end >= len(text):
            return None
        return encode(self.tokenizer, text[len(before):end])


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


# --------------------------------------------------------------------------- token choice
def pick(logits: torch.Tensor, config: RolloutConfig, generator: torch.Generator) -> torch.Tensor:
    """The next token of every row, on the logits' device: argmax when ``config.temperature == 0``,
    else a draw from the temperature / top-p distribution with ``generator`` (a generator on the
    logits' device: no probability copy to the host; on the CPU this is the draw every committed
    result used)."""
    if config.temperature == 0.0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / config.temperature, dim=-1)
    if config.top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > config.top_p  # keeps at least the top token
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


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


#: every engine's re-packing bound: at every forward the cache is at most (1 + PACK_SLACK) x the longest
#: live row wide (or MIN_PIECE columns more), so the KV memory stays near rows x longest row
#: (docs/engines.md#memory-at-the-forward)
PACK_SLACK = 0.08
#: the smallest piece a long chunk is split into (a piece this wide may exceed the bound on short rows)
MIN_PIECE = 16


def split_chunk(real: list[int], lengths: list[int], slack: float) -> list[int]:
    """Where to cut a left-padded chunk (row i: ``lengths[i]`` real tokens, right-aligned, after its
    ``real[i]`` tokens already in the cache) into pieces fed one after another, the cache re-packed
    between them: the end column of each piece. Each piece is as wide as it can be while the packed
    width before it plus the piece stays <= (1 + ``slack``) x the longest row after it (at least
    ``MIN_PIECE`` columns, or ``slack`` x the longest row: that always fits). One piece when the whole
    chunk fits. Depends on the row lengths only, so every engine cuts the same pieces (the same forwards
    and, up to float summation order, the same tokens). Why: a row that already holds the longest history
    and gets a short observation next to another row's long one would otherwise widen the cache to the
    sum of both, at the forward where memory peaks."""
    width = max(lengths, default=0)
    if width <= 1 or slack == float("inf"):
        return [width]
    n = torch.tensor(lengths)[:, None]
    x = torch.arange(width + 1)
    fed = torch.minimum((x[None, :] - (width - n)).clamp_min(0), n)
    longest = (torch.tensor(real)[:, None] + fed).amax(0)  # longest row after the first x columns
    bound = (1 + slack) * longest
    ends, start = [], 0
    while start < width:
        fits = (longest[start] + x - start <= bound) & (x > start)
        end = int(fits.nonzero()[-1]) if bool(fits.any()) else start
        end = max(end, min(width, start + max(MIN_PIECE, int(slack * int(longest[start])))))
        ends.append(end)
        start = end
    return ends


class Trajectories:
    """The state of one rollout call, shared by every engine; an engine keeps only its scheduler
    (which tasks are in the batch, when a turn boundary runs, when the cache is re-packed).

    Per task: prompt ids, completion ids, model mask, the current turn's tokens, the model-written
    text of each turn, tool calls, finish reason, turns and model tokens. Per batch row: the task it
    runs (``rows``), the tokens it feeds next (``pending``), whether it wants a token after them
    (``generating``), its real tokens so far (``real``) and its attention columns. The KV cache (by
    default :func:`copes_lib.kv_cache.growing_cache`) runs behind the hybrid-cache guard
    (:func:`copes_lib.kv_cache.check_hybrid_cache`, the row-exact linear-attention path). Use as a
    context manager (eval mode, the row-exact path).

    The steps: :meth:`add` (rows join), :meth:`forward` (one pass over the pending tokens; a pass in
    which every row feeds one token builds its inputs on the device), :meth:`pick` and :meth:`feed`
    (append each generating row's token; returns the rows whose turn ended), :meth:`end_turns`
    (texts, tool calls, observations; returns the rows that go on), :meth:`keep` (rows leave),
    :meth:`compact` (drop each row's masked columns), :meth:`to_batch`.
    """

    def __init__(self, model, tokenizer, tasks: list[Task], env: AgentEnv, config: RolloutConfig,
                 seed: int = 0, row_hook: Callable[[list[int]], None] | None = None,
                 logits_hook: Callable[[list[int], list[bool], torch.Tensor], None] | None = None, cache=None,
                 exact: RowExactLinearAttention | None = None, slack: float | None = None):
        self.start_time = time.perf_counter()
        self.model, self.tokenizer, self.tasks, self.env, self.config = model, tokenizer, list(tasks), env, config
        self.row_hook, self.logits_hook = row_hook, logits_hook
        self.device = next(model.parameters()).device
        self.stops = StopMatcher(tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else _as_list(tokenizer.eos_token_id)[0]
        self.limits = {
            "python": env.limits["python"] if config.max_python_calls is None else config.max_python_calls,
            "search": env.limits["search"] if config.max_search_calls is None else config.max_search_calls}
        self.max_turns = config.max_turns or self.limits["python"] + self.limits["search"] + 1
        style = prompt_style(tokenizer, config)
        self.prompt_ids = [encode(tokenizer, format_prompt(t, style, tokenizer, self.limits["python"],
                                                           self.limits["search"], config.enable_thinking))
                           for t in tasks]
        n = len(tasks)
        self.completion, self.mask, self.segment, self.parts = ([[] for _ in range(n)] for _ in range(4))
        self.calls = [{"python": 0, "search": 0} for _ in range(n)]
        self.finish, self.turns, self.n_model = [""] * n, [0] * n, [0] * n
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        # batch rows
        self.rows: list[int] = []
        self.pending: list[list[int]] = []
        self.generating: list[bool] = []
        self.fresh: list[bool] = []
        self.real: list[int] = []
        self.seen = torch.zeros(0, dtype=torch.long, device=self.device)
        self.attention = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.last: torch.Tensor | None = None  # the tokens just picked, on the device
        self.decoding = False  # every row feeds exactly its last picked token
        # the KV cache: growing_cache by default; an engine passes one, or a function of the prompt ids
        self.cache = growing_cache(model) if cache is None else cache(self.prompt_ids) if callable(cache) else cache
        # a static cache: its fixed width (the cache is re-packed before a pass that would overflow it)
        self.columns = max((layer.max_cache_len for layer in self.cache.layers if isinstance(layer, StaticRowLayer)),
                           default=None)
        # transformers 5.x names the cache argument `cache`; older model classes call it past_key_values.
        # A peft model forwards **kwargs to its base model: ask the base model (else a FutureWarning per call).
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self.exact = None
        if linear_attention_layers(self.cache):  # an engine may pass one it keeps (a compiled step guards on it)
            self.exact = exact if exact is not None else RowExactLinearAttention(model, self.cache, row_hook)
            self.exact.rows_hook = row_hook
        check_hybrid_cache(model, self.cache)
        self.forwards, self.model_s = 0, 0.0
        # the memory bound (split_chunk): at every forward the width <= (1 + slack) x the longest live row
        self.slack = PACK_SLACK if slack is None else slack
        if self.slack < 0:
            raise ConfigError(f"Trajectories: slack = {self.slack} must be >= 0 (inf: never re-pack)")
        self.widths: list[tuple[int, int]] = []  # (width, longest live row) at every forward, chunk included
        self.compactions = 0
        self.step_model = model  # what runs a decode step (an engine may put a compiled model here)

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        if self.exact is not None:
            self.exact.__enter__()
        return self

    def __exit__(self, *exc):
        if self.exact is not None:
            self.exact.__exit__(*exc)
        if self.was_training:
            self.model.train()

    # batch rows ------------------------------------------------------------
    def add(self, tasks: list[int]) -> None:
        """Rows for ``tasks`` join the batch with their prompts (fresh cache rows once the batch ran)."""
        fresh = self.forwards > 0
        if fresh:
            add_rows(self.cache, len(tasks))
        self.rows += list(tasks)
        self.pending += [list(self.prompt_ids[r]) for r in tasks]
        self.generating += [True] * len(tasks)
        self.fresh += [fresh] * len(tasks)
        self.real += [0] * len(tasks)
        self.seen = torch.cat([self.seen, self.seen.new_zeros(len(tasks))])
        self.attention = torch.cat([self.attention, self.attention.new_zeros(len(tasks), self.attention.shape[1])])
        self.decoding, self.last = False, None

    def keep(self, index: list[int]) -> None:
        """Keep (in this order) the batch rows ``index``; the others leave the batch and the cache."""
        rows = torch.tensor(index, dtype=torch.long, device=self.device)
        select_rows(self.cache, rows)
        self.attention, self.seen = self.attention[rows], self.seen[rows]
        for name in ("rows", "pending", "generating", "fresh", "real"):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in index])
        self.decoding, self.last = False, None

    @property
    def width(self) -> int:
        """Attention columns held per row (the cache's width)."""
        return self.attention.shape[1]

    def compact(self) -> None:
        """Drop each row's masked columns: every row keeps its real columns (in order, right-aligned)
        and the width becomes the longest row's. Keys are stored after their rotary positions, and
        positions are per row, so no row's result changes (up to float summation order)."""
        width = max(self.real, default=0)
        if width >= self.width:
            return
        self.compactions += 1
        order = torch.argsort(self.attention, dim=1, stable=True)[:, self.width - width:]
        for layer in self.cache.layers:
            if hasattr(layer, "gather_columns"):
                layer.gather_columns(order)
        self.attention = torch.gather(self.attention, 1, order)

    # one step -------------------------------------------------------------
    def forward(self) -> torch.Tensor:
        """One step over every row's pending tokens; the next-token logits (float32, pad excluded,
        ``logits_hook`` applied) of every batch row. A long chunk is fed in pieces (:func:`split_chunk`,
        the cache re-packed between them), so no forward holds more than about (1 + ``slack``) x the
        longest live row; only the last piece's logits are kept (every row's newest token is in it)."""
        lengths = [len(p) for p in self.pending]
        # one token per generating row, the others waiting (a hybrid model's waiting rows need the row-exact
        # groups): inputs from the device, the same values as the general case below
        decoding = self.decoding or (self.last is not None and max(lengths) == 1 and self.exact is None
                                     and not any(self.fresh))
        if decoding:
            if self.decoding:
                chunk_mask = torch.ones(len(lengths), 1, dtype=torch.long, device=self.device)
                chunk = self.last[:, None]
            else:
                chunk_mask = torch.tensor(lengths, dtype=torch.long, device=self.device)[:, None]
                chunk = torch.where(chunk_mask.bool(), self.last[:, None], self.pad_id)
            out = self._pass(chunk, chunk_mask, lengths, self.step_model)
        else:
            width = max(lengths)
            # left-pad, so the last column is every feeding row's newest token
            chunk = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in self.pending], dtype=torch.long,
                                 device=self.device)
            chunk_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in self.pending],
                                      dtype=torch.long, device=self.device)
            start = 0
            for end in split_chunk(self.real, lengths, self.slack):
                fed = [min(n, max(0, end - width + n)) - min(n, max(0, start - width + n)) for n in lengths]
                out = self._pass(chunk[:, start:end], chunk_mask[:, start:end], fed, self.model)
                start = end
        logits = out.logits[:, -1, :].float()
        if self.pad_id not in self.stops.eos_ids:  # padding is never a real next token
            logits[:, self.pad_id] = float("-inf")
        if self.logits_hook is not None:
            self.logits_hook(list(self.rows), list(self.generating), logits)
        return logits

    def _pass(self, chunk: torch.Tensor, chunk_mask: torch.Tensor, lengths: list[int], model):
        """One model call on ``chunk`` (``lengths``: each row's real tokens in it, right-aligned). Re-packs
        the cache first when the chunk would make it wider than (1 + slack) x the longest live row, or
        would not fit a static cache (then widened, in buckets of 64 columns: few compiled shapes)."""
        longest = max((r + n for r, n in zip(self.real, lengths)), default=0)
        if longest > self.config.max_context:  # the cache is sized for max_context tokens a row: no silent growth
            i = next(i for i, (r, n) in enumerate(zip(self.real, lengths)) if r + n > self.config.max_context)
            raise ConfigError(f"KV cache: row {self.rows[i]} (task {self.tasks[self.rows[i]].id!r}) would hold "
                              f"{self.real[i] + lengths[i]} tokens, more than the {self.config.max_context} it is "
                              "sized for (RolloutConfig.max_context); raise max_context or shorten the prompt")
        columns = chunk.shape[1]
        if self.width + columns > (1 + self.slack) * longest:
            self.compact()
        if self.columns is not None and self.width + columns > self.columns:
            self.compact()
            if self.width + columns > self.columns:  # a small spare: the cache stays near the longest row
                self.columns = -(-(self.width + columns + MIN_PIECE) // 64) * 64
                for layer in self.cache.layers:
                    if isinstance(layer, StaticRowLayer):
                        layer.grow(self.columns)
        positions = (self.seen[:, None] + chunk_mask.cumsum(1) - 1).clamp_min(0)
        self.attention = torch.cat([self.attention, chunk_mask], dim=1)
        self.seen = self.seen + chunk_mask.sum(1)
        self.real = [r + n for r, n in zip(self.real, lengths)]
        self.widths.append((self.width, longest))
        if self.row_hook is not None:
            self.row_hook(list(self.rows))
        if self.exact is not None:
            self.exact.prepare(lengths, self.rows, self.device, self.fresh)
        attention = self.attention if self.columns is None else \
            torch.nn.functional.pad(self.attention, (0, self.columns - self.width))
        began = time.perf_counter()
        out = model(input_ids=chunk, attention_mask=attention, position_ids=positions, use_cache=True,
                    logits_to_keep=1, **{self.cache_arg: self.cache})
        self.model_s += time.perf_counter() - began
        self.forwards += 1
        self.fresh = [f and n == 0 for f, n in zip(self.fresh, lengths)]  # a row with no token yet stays fresh
        return out

    def pick(self, logits: torch.Tensor) -> list[int]:
        """The next token of every batch row (:func:`pick`); the one host sync of a decode step."""
        self.last = pick(logits, self.config, self.generator)
        return self.last.tolist()

    def feed(self, tokens: list[int]) -> list[int]:
        """Append each generating row's token; returns the batch rows whose turn ended at it. A turn
        whose closing tag ends inside its last token keeps only the text up to the tag's end
        (:meth:`StopMatcher.trim`): that token is replaced, in the completion and in what is fed next."""
        stopped, retokenised = [], False
        for i, r in enumerate(self.rows):
            if not self.generating[i]:
                self.pending[i] = []
                continue
            token = tokens[i]
            self.completion[r].append(token)
            self.mask[r].append(1)
            self.segment[r].append(token)
            self.pending[i] = [token]
            self.n_model[r] += 1
            stop = turn_stop(self.stops, self.segment[r], self.n_model[r],
                             len(self.prompt_ids[r]) + len(self.completion[r]), self.config)
            if stop in _STOP_KINDS:
                cut = self.stops.trim(self.segment[r])
                if cut is not None:  # the tag ends inside this token: keep its text up to the tag's end
                    for ids in (self.completion[r], self.segment[r]):
                        ids[-1:] = cut
                    self.mask[r][-1:] = [1] * len(cut)
                    self.pending[i] = list(cut)
                    self.n_model[r] += len(cut) - 1
                    retokenised = True
            if stop is not None:
                self.generating[i] = False
                self.finish[r] = stop
                stopped.append(i)
        self.decoding = all(self.generating)
        if retokenised:  # the picked tokens on the device are not what some rows feed next
            self.last = None
        return stopped

    def end_turns(self, stopped: list[int]) -> list[int]:
        """The turn boundary of the batch rows ``stopped``: keep each turn's text, run their tool calls
        (one batch per tool, :func:`run_tool_calls`), queue each observation to be fed. Returns the
        rows that go on (generating again); the others have finished (``finish``)."""
        tool_rows = {"python": [], "search": []}
        for i in stopped:
            r = self.rows[i]
            text = decode(self.tokenizer, self.segment[r])
            self.parts[r].append(text)
            self.segment[r] = []
            self.turns[r] += 1
            if self.finish[r] in ("python", "search"):
                tool_rows[self.finish[r]].append((r, text))
        observations = run_tool_calls(self.env, tool_rows, self.calls, self.limits)
        going_on = []
        for i in stopped:
            r = self.rows[i]
            if r not in observations:
                continue
            obs_ids = encode(self.tokenizer, observations[r])
            if self.turns[r] >= self.max_turns:
                self.finish[r] = "turns"
            elif len(self.prompt_ids[r]) + len(self.completion[r]) + len(obs_ids) + 1 > self.config.max_context:
                self.finish[r] = "context"
            else:
                self.completion[r].extend(obs_ids)
                self.mask[r].extend([0] * len(obs_ids))
                self.pending[i] = self.pending[i] + obs_ids
                self.generating[i] = True
                going_on.append(i)
        self.decoding, self.last = False, None
        return going_on

    def to_batch(self) -> RolloutBatch:
        model_texts = ["".join(parts) for parts in self.parts]
        answers = [t.answers for t in self.tasks]
        prompts = [decode(self.tokenizer, p) for p in self.prompt_ids]
        details = self.env.details(prompts, model_texts, answers)
        return RolloutBatch(
            tasks=self.tasks, prompt_ids=self.prompt_ids, completion_ids=self.completion, model_mask=self.mask,
            texts=[decode(self.tokenizer, c) for c in self.completion],
            rewards=self.env.reward(prompts, model_texts, answers, self.calls),
            scores=[d[self.env.score_key()] for d in details], tool_calls=self.calls, model_texts=model_texts,
            finish_reasons=self.finish, details=details, elapsed_s=time.perf_counter() - self.start_time,
            forward_calls=self.forwards, model_s=self.model_s)


@torch.no_grad()
def rollout(model, tokenizer, tasks: list[Task], env: AgentEnv, config: RolloutConfig = RolloutConfig(),
            seed: int = 0, row_hook: Callable[[list[int]], None] | None = None,
            logits_hook: Callable[[list[int], list[bool], torch.Tensor], None] | None = None) -> RolloutBatch:
    """Run ``tasks`` as one batch of agent trajectories. ``row_hook(rows)`` is called before every
    forward pass with the original batch-row indices of the rows in that pass. ``logits_hook(rows,
    generating, logits)`` sees each pass's next-token logits (float32, one row per batch row) before a
    token is picked; it may change them in place (tests force tool calls this way).

    The plain loop: :func:`run_loop` on a :class:`Trajectories` with a growing cache."""
    return run_loop(Trajectories(model, tokenizer, tasks, env, config, seed, row_hook, logits_hook))


def run_loop(state: Trajectories) -> RolloutBatch:
    """The plain loop's scheduler: one batch, a row that stops waits for the others, then the
    batch's tool calls run together and the rows that go on are kept."""
    with state:
        state.add(list(range(len(state.tasks))))
        while state.rows:
            state.feed(state.pick(state.forward()))
            if any(state.generating):
                continue
            going_on = state.end_turns(list(range(len(state.rows))))
            if not going_on:
                break
            state.keep(going_on)
    return state.to_batch()


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
