"""The rollout's KV cache: transformers' caches with full-attention layers that rows can join and leave,
whose columns can be re-packed, held one buffer per KV head; and the row-exact path of a hybrid model's
linear-attention states.

Every engine's trajectory state (:class:`copes_lib.rollout.Trajectories`, ``copes_lib/engines.py``)
runs on a cache made here: :func:`growing_cache` by default, :func:`static_cache` for the ``static``
engine. Nothing here knows about tasks, tools or scheduling; ``copes_lib.rollout`` imports from this
module, never the other way.

How it departs from a plain transformers ``DynamicCache``:

- **Grown in place** (:class:`GrowingLayer`): a ``DynamicLayer`` concatenates the whole cache at every
  step; here K and V are written into preallocated buffers, grown with ~3% spare when full, so a
  decode step copies one column, not the cache (profiled: the concatenation was a third of a QA
  rollout's time). A rollout never crops its cache (``crop`` raises).
- **Rows and columns change**: rows join a running batch (:func:`add_rows`, zero keys and values
  under masked columns), leave it (:func:`select_rows`, linear-attention conv / recurrent states
  included, where transformers' ``Cache.batch_select_indices`` fails on ``LinearAttentionLayer``), and
  each row's masked columns are dropped (``gather_columns``: ``Trajectories.compact``'s re-packing).
- **One buffer per KV head** (:class:`HeadPieces`, for an sdpa model): a full-attention layer holds K
  and V as one (rows, 1, columns, head_dim) buffer per KV head, not one (rows, heads, columns,
  head_dim) tensor. Why: no copy transients. A cache that grows, re-packs or changes rows copies into
  a new buffer while the old one is live, and the peak memory sees both; held whole, that transient is
  a layer's K or V, 1 / (2 x full-attention layers) of the cache (1/16 on Qwen3.5-4B's 8
  full-attention layers). Held by head, each buffer is copied and its old one freed before the next,
  so the transient is one head's K or V, 1 / (2 x full-attention layers x KV heads) (1/64 there). The
  attention runs per KV head on that head's query heads (:func:`sdpa_by_head`, registered once as
  transformers' sdpa entry and unchanged for plain tensors): the same per-(row, head) arithmetic as
  one sdpa call over all heads, bit for bit (``tests/test_engines.py``). Another attention
  implementation gets one buffer per K and V.
- **A static variant** (:func:`static_cache`, :class:`StaticRowLayer`): transformers' ``StaticLayer``
  (a fixed-width buffer written at a device-side column counter, so a compiled / CUDA-graph decode
  step keeps its shapes and addresses) with the same row and column operations, widened (``grow``)
  when a chunk fits in no re-packing.
- **Hybrid models** (Qwen3.5's Gated-DeltaNet layers next to full attention): the linear-attention
  layers stay transformers' ``LinearAttentionLayer``, and :class:`RowExactLinearAttention` runs each
  group of rows on their real tokens only, on a copy of their states written back, so a padding step
  neither advances a row's recurrent state nor shifts its conv window. :func:`check_hybrid_cache`
  refuses a hybrid model whose cache holds no ``LinearAttentionLayer`` (older transformers).

Memory at the forward, measured: docs/engines.md#memory-at-the-forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import (
    DynamicLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
    StaticLayer,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward as _SDPA

from copes_lib.config import ConfigError


def growing_cache(model):
    """HF's DynamicCache with its full-attention layers replaced by :class:`GrowingLayer` (one buffer per
    KV head, :class:`HeadPieces`, for an sdpa model)."""
    cache = DynamicCache(config=getattr(model, "config", None))
    apart = heads_apart(model)
    cache.layers = [GrowingLayer(apart) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:
        cache.layer_class_to_replicate = lambda: GrowingLayer(apart)
    return cache


class HeadPieces(tuple):
    """A full-attention layer's K (or V) as one tensor per KV head, each (rows, 1, columns, head_dim):
    what a cache layer returns to the attention instead of one (rows, heads, columns, head_dim) tensor.

    Why: a cache that grows, re-packs or changes rows copies into a new buffer while the old one is
    live, and the peak memory sees both. Held whole, that transient is a layer's K or V (1 / (2 x full
    layers) of the cache: 1/16 on Qwen3.5-4B's 8 full-attention layers); held by head it is 1 / (2 x
    full layers x KV heads) (1/64 there), since each piece is copied and its old buffer freed before
    the next. The attention runs per KV head on its query heads (:func:`sdpa_by_head`): the same
    per-(row, head) arithmetic as one sdpa call over all heads (the tests check equal tokens)."""

    @property
    def shape(self):
        first = self[0]
        return torch.Size((first.shape[0], first.shape[1] * len(self), *first.shape[2:]))

    def whole(self) -> torch.Tensor:
        """The pieces as one (rows, heads, columns, head_dim) tensor (a copy: for inspection and tests)."""
        return torch.cat(list(self), dim=1)


def sdpa_by_head(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention, run once per KV head when the cache hands :class:`HeadPieces`
    (each piece with its query heads; outputs concatenated by head), else unchanged."""
    if not isinstance(key, HeadPieces):
        return _SDPA(module, query, key, value, attention_mask, **kwargs)
    group = query.shape[1] // len(key)
    outputs = [_SDPA(module, query[:, h * group:(h + 1) * group], k, v, attention_mask, **kwargs)[0]
               for h, (k, v) in enumerate(zip(key, value))]
    return torch.cat(outputs, dim=2), None  # (rows, queries, heads, head_dim), heads in order


def heads_apart(model) -> bool:
    """Whether ``model``'s attention takes :class:`HeadPieces` (sdpa, through :func:`sdpa_by_head`,
    installed here once: transformers' sdpa entry is wrapped, unchanged for plain tensors); other
    attention implementations get one buffer per K and V."""
    from transformers.modeling_utils import AttentionInterface

    if getattr(getattr(model, "config", None), "_attn_implementation", None) != "sdpa":
        return False
    if AttentionInterface._global_mapping.get("sdpa") is not sdpa_by_head:
        AttentionInterface.register("sdpa", sdpa_by_head)
    return True


def _pieces(heads: bool, tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` (rows, heads, columns, dim) as the list of buffers a layer holds."""
    return [tensor[:, h:h + 1] for h in range(tensor.shape[1])] if heads else [tensor]


def _view(heads: bool, buffers: list[torch.Tensor], n: int | None = None):
    """What a layer hands the attention: its buffers' first ``n`` columns (all if None)."""
    views = [b if n is None else b[..., :n, :] for b in buffers]
    return HeadPieces(views) if heads else views[0]


def _one_at_a_time(buffers: list[torch.Tensor], make) -> None:
    """Replace each buffer by ``make(old)``, in place in the list: every old buffer is dropped as soon as
    its new one is made, so a re-allocation holds one buffer twice, never more (the caller must hold no
    other reference to the buffers)."""
    for i in range(len(buffers)):
        old, buffers[i] = buffers[i], None
        buffers[i] = make(old)
        del old


def _regrown(old, like, capacity: int, n: int):
    """A buffer of ``capacity`` columns shaped like ``like``, holding the first ``n`` columns of ``old``."""
    buffer = like.new_empty(*like.shape[:-2], capacity, like.shape[-1])
    if n:
        buffer[..., :n, :] = old[..., :n, :]
    return buffer


class GrowingLayer(DynamicLayer):
    """A DynamicLayer that writes into preallocated buffers (grown with ~3% spare when full) instead
    of concatenating the whole cache at every step: one decode step then copies one column, not
    the cache (profiled: the concatenation was a third of a QA rollout's time). Rows can be added
    (``add_rows``: rows joining a running batch) and columns re-packed (``gather_columns``).

    ``heads_apart``: K and V held as one buffer per KV head (:class:`HeadPieces`); every re-allocation
    (grow, re-pack, rows leaving or joining) copies one buffer at a time, freeing the old one before the
    next, so its transient is one head's K or V (docs/engines.md#memory-at-the-forward)."""

    def __init__(self, heads_apart: bool = False):
        super().__init__()
        self.heads = heads_apart

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._n = 0

    def _set(self, n) -> None:
        self._n = n
        self.keys, self.values = _view(self.heads, self._k, n), _view(self.heads, self._v, n)

    def get_seq_length(self) -> int:
        return self._n if self.is_initialized else 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        keys, values = _pieces(self.heads, key_states), _pieces(self.heads, value_states)
        if not self._k or self._n + new > self._k[0].shape[-2]:
            # a small spare (~3%): the cache's bytes stay near rows x width (a larger one was most of the KV goal's
            # excess); a regrowth every ~n/32 decode steps copies the cache, a small cost next to n/32 forwards
            capacity = self._n + new + max(16, self._n // 32)
            self.keys = self.values = None  # the views: the old buffers are freed as they are replaced
            if not self._k:
                self._k, self._v = [_regrown(None, k, capacity, 0) for k in keys], [_regrown(None, v, capacity, 0)
                                                                                 for v in values]
            else:
                n = self._n
                _one_at_a_time(self._k, lambda old: _regrown(old, old, capacity, n))
                _one_at_a_time(self._v, lambda old: _regrown(old, old, capacity, n))
        for buffer, k in zip(self._k, keys):
            buffer[..., self._n:self._n + new, :] = k
        for buffer, v in zip(self._v, values):
            buffer[..., self._n:self._n + new, :] = v
        self._set(self._n + new)
        return self.keys, self.values

    def _reallocate(self, make) -> None:
        self.keys = self.values = None
        _one_at_a_time(self._k, make)
        _one_at_a_time(self._v, make)
        self._set(self._n)

    def batch_select_indices(self, indices) -> None:
        if self.is_initialized and self._n:
            self._reallocate(lambda old: old[indices])

    def add_rows(self, count: int) -> None:
        if self.is_initialized and self._k:
            self._reallocate(lambda old: torch.cat([old, old.new_zeros(count, *old.shape[1:])]))

    def gather_columns(self, order: torch.Tensor) -> None:
        """Keep, per row, the columns ``order[row]`` (rows x new width) in that order."""
        if not (self.is_initialized and self._n):
            return
        index = order[:, None, :, None]
        n = self._n
        # the gather reads only the first n columns: the next update reallocates with slack
        self._reallocate(lambda old: torch.gather(old[..., :n, :], 2,
                                                  index.expand(-1, old.shape[1], -1, old.shape[3])))
        self._set(order.shape[1])

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the rollout never crops its cache")


class StaticRowLayer(StaticLayer):
    """transformers' StaticLayer (a fixed ``columns``-wide buffer written at a device-side column
    counter, so a compiled / CUDA-graph decode step keeps its shapes and addresses) with what a
    rollout needs: select rows, add rows, re-pack columns; ``heads_apart`` as :class:`GrowingLayer`
    (one buffer per KV head, re-allocated one at a time). Changing rows makes new buffers (a new
    graph for a new batch size); re-packing copies in place."""

    def __init__(self, max_cache_len: int, heads_apart: bool = False, **kwargs):
        super().__init__(max_cache_len, **kwargs)
        self.heads = heads_apart

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device = key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        per = 1 if self.heads else self.num_heads
        self._k = [key_states.new_zeros(self.batch_size, per, self.max_cache_len, self.k_head_dim)
                   for _ in range(self.num_heads // per)]
        self._v = [value_states.new_zeros(self.batch_size, per, self.max_cache_len, self.v_head_dim)
                   for _ in range(self.num_heads // per)]
        self.cumulative_length = self.cumulative_length.to(self.device)
        self.is_initialized = True
        self._set()
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(self.cumulative_length)

    def _set(self) -> None:
        self.keys, self.values = _view(self.heads, self._k), _view(self.heads, self._v)
        self.batch_size = self._k[0].shape[0]
        if not torch.compiler.is_compiling():
            for buffer in self._k + self._v:
                torch._dynamo.mark_static_address(buffer)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        kv_length = key_states.shape[-2]
        cache_position = torch.arange(kv_length, device=self.device) + self.cumulative_length
        self.cumulative_length.add_(kv_length)  # in place: a static address
        for buffers, states in ((self._k, key_states), (self._v, value_states)):
            for buffer, part in zip(buffers, _pieces(self.heads, states)):
                buffer.index_copy_(2, cache_position, part)
        return self.keys, self.values

    def _reallocate(self, make) -> None:
        self.keys = self.values = None
        _one_at_a_time(self._k, make)
        _one_at_a_time(self._v, make)
        self._set()

    def batch_select_indices(self, indices) -> None:
        if self.is_initialized:
            self._reallocate(lambda old: old[indices])

    def add_rows(self, count: int) -> None:
        if self.is_initialized:
            self._reallocate(lambda old: torch.cat([old, old.new_zeros(count, *old.shape[1:])]))

    def grow(self, columns: int) -> None:
        """Widen the buffers to ``columns`` (a chunk that fits in no re-packing: new buffers)."""
        if self.is_initialized:
            n = self.max_cache_len
            self._reallocate(lambda old: _zero_from(_regrown(old, old, columns, n), n))
        self.max_cache_len = columns

    def gather_columns(self, order: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        width = order.shape[1]
        for buffer in self._k + self._v:
            index = order[:, None, :, None].expand(-1, buffer.shape[1], -1, buffer.shape[3])
            buffer[:, :, :width] = torch.gather(buffer, 2, index)
        self.cumulative_length.fill_(width)


def _zero_from(buffer: torch.Tensor, n: int) -> torch.Tensor:
    buffer[..., n:, :] = 0
    return buffer


def static_cache(model, columns: int):
    """A cache of :class:`StaticRowLayer` (full attention, ``columns`` wide) and transformers'
    LinearAttentionLayer (already fixed-shape) for ``model``."""
    cache = StaticCache(config=model.config, max_cache_len=columns)
    apart = heads_apart(model)
    cache.layers = [StaticRowLayer(max_cache_len=columns, heads_apart=apart) if type(layer) is StaticLayer else layer
                    for layer in cache.layers]
    unsupported = [type(layer).__name__ for layer in cache.layers
                   if not isinstance(layer, (StaticRowLayer, LinearAttentionCacheLayerMixin))]
    if unsupported:
        raise ConfigError(f"static cache: layer types {sorted(set(unsupported))} are not supported "
                          "(full attention and linear attention are)")
    return cache


def add_rows(cache, count: int) -> None:
    """Append ``count`` empty rows to every initialised layer of ``cache`` (attention: zero keys and
    values under masked columns; linear attention: zero states, which the caller marks fresh)."""
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for s in range(layer.number_of_states):
                for kind in ("conv", "recurrent"):
                    states = getattr(layer, f"{kind}_states")
                    if getattr(layer, f"is_{kind}_states_initialized")[s]:
                        old = states[s]
                        states[s] = torch.cat([old, old.new_zeros(count, *old.shape[1:])])
        elif hasattr(layer, "add_rows"):
            layer.add_rows(count)
        else:
            raise ConfigError(f"rollout: cache layer type {type(layer).__name__} cannot take new rows")


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


class RowExactLinearAttention:
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
        # made once: a compiled decode step guards on these functions, so the same ones are put back
        self.patched = [(module, self._forward(module, module.forward)) for module in self.modules]
        self.groups: list[tuple[int, bool, list[int], torch.Tensor]] = []  # (real tokens, fresh, batch rows)

    def prepare(self, lengths: list[int], rows: list[int], device, fresh: list[bool] | None = None) -> None:
        """Before every forward: each batch row's number of real (right-aligned) tokens, the original
        row ids, and which rows have no state yet (rows joining a running batch; slots engine). The
        groups are made here once, not in every layer (no device sync per layer)."""
        fresh = fresh or [False] * len(lengths)
        width = max(lengths)
        self.rows = list(rows)
        self.full = all(n == width for n in lengths) and not any(fresh)
        if self.full:  # every decode step: no groups to build
            self.groups = []
            return
        keys = sorted({(n, f) for n, f in zip(lengths, fresh) if n > 0})
        members = {key: [i for i, k in enumerate(zip(lengths, fresh)) if k == key] for key in keys}
        self.groups = [(n, f, members[(n, f)], torch.tensor(members[(n, f)], dtype=torch.long, device=device))
                       for n, f in keys]

    def __enter__(self):
        for module, forward in self.patched:
            module.forward = forward
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
