"""Rollout engines behind one contract: the continuous-batching engine gives the plain loop's greedy
trajectories and the static (fast decode path) engine its greedy and sampled ones (dense Qwen3 and
hybrid Qwen3.5, tool calls forced); the slot engine's cache stays near the longest live row; every
engine runs the hybrid-cache guard; clear errors."""

import pytest
import torch

from copes_lib import kv_cache
from copes_lib import rollout as rollout_module
from copes_lib.config import ConfigError
from copes_lib.engines import (
    ENGINES,
    LoopEngine,
    RolloutEngine,
    SlotEngine,
    StaticEngine,
    build_qwen35,
    check_gpu_engine,
    make_engine,
)
from copes_lib.protocols.testbed.substrate_setup import substrate_config
from copes_lib.rollout import AgentEnv, RolloutConfig, encode, make_env
from copes_lib.substrate import build_agent_model, get_tokenizer
from copes_lib.tasks import load_tasks
from copes_lib.tasks.protocol import python_observation

SCRIPTS = ["<python>print(1+2)</python>", "<answer>\\boxed{3}</answer>", "<python>x = 5\nprint(x * 7 + 1)</python>",
           "", "<python>print(2*2)</python>"]


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smoke", substrate_config("smoke").vocab_size)


@pytest.fixture(scope="module")
def env():
    env = make_env("math", "smoke")
    yield env
    env.close()


def _forcing(tokenizer, scripts=SCRIPTS):
    """A logits hook that forces scripts[row] (over all of a row's turns) from its first token on."""
    scripts = [encode(tokenizer, s) if s else [] for s in scripts]
    count = {}

    def force(rows, generating, logits):
        for i, (r, g) in enumerate(zip(rows, generating)):
            if g:
                t = count[r] = count.get(r, -1) + 1
                if t < len(scripts[r % len(scripts)]):
                    logits[i] = float("-inf")
                    logits[i, scripts[r % len(scripts)][t]] = 0.0

    return force


def _loop(model, tokenizer, tasks, env, config, hook, seed=0):
    return rollout_module.rollout(model, tokenizer, tasks, env, config, seed=seed, logits_hook=hook)


def _model(tokenizer, family, **kw):
    if family == "qwen3":
        return build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer, **kw)
    return build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer, **kw)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_slot_engine_equals_the_loop_greedy(tokenizer, env, family):
    model = _model(tokenizer, family)
    tasks = load_tasks("smoke", "math", "val")[:7]
    config = RolloutConfig(max_new_tokens=24)
    loop = _loop(model, tokenizer, tasks, env, config, _forcing(tokenizer))
    engine = SlotEngine(model, tokenizer, slots=3, join_at=2, slack=0.0)  # re-packs whenever a column is masked
    slots = engine.generate(tasks, env, config, seed=0, logits_hook=_forcing(tokenizer))
    assert engine.compactions > 0
    assert slots.completion_ids == loop.completion_ids
    assert slots.model_mask == loop.model_mask and slots.rewards == loop.rewards
    assert slots.tool_calls == loop.tool_calls and slots.finish_reasons == loop.finish_reasons
    assert sum(c["python"] for c in loop.tool_calls) >= 3  # the forced calls ran
    # fewer forward passes than tokens x rows: rows never wait for the slowest one
    assert slots.forward_calls >= max(len(c) for c in loop.completion_ids) // 2


def test_engines_keep_the_contract(tokenizer, env):
    model = build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer)
    tasks = load_tasks("smoke", "math", "val")[:3]
    config = RolloutConfig(max_new_tokens=8)
    options = {"loop": {}, "slots": {"slots": 2}, "static": {}}
    engines = [make_engine(name, model, tokenizer, **options[name]) for name in ENGINES]
    assert all(isinstance(e, RolloutEngine) for e in engines) and isinstance(engines[0], LoopEngine)
    assert [e.name for e in engines] == list(ENGINES)
    outs = [e.generate(tasks, env, config, seed=0) for e in engines]
    assert all(out.completion_ids == outs[0].completion_ids for out in outs)
    # the engine reads the weights at every call: a change in place shows in the next batch
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)), alpha=0.5)
    for engine, out in zip(engines[1:], outs[1:]):
        assert engine.generate(tasks, env, config, seed=0).completion_ids != out.completion_ids


def test_bad_engine_and_missing_gpu_say_what_to_do(tokenizer):
    model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="valid values"):
        make_engine("vllm", model, tokenizer)
    with pytest.raises(ConfigError, match="valid options"):
        make_engine("static", model, tokenizer, slots=4)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="requirements-gpu.txt"):
            check_gpu_engine(model)
        with pytest.raises(ConfigError, match="CUDA"):
            SlotEngine(model, tokenizer, require_gpu=True)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_engine_equals_the_loop_greedy_and_sampled(tokenizer, env, family, temperature):
    """The fast decode path (static cache, device-built decode inputs, sampling on the device) on the
    CPU, uncompiled: the loop's tokens, also sampled for the same seed (the compiled step runs in
    benchmarks/bench_rollout.py: a CPU compile takes a minute)."""
    model = _model(tokenizer, family)
    tasks = load_tasks("smoke", "math", "val")[:7]
    config = RolloutConfig(max_new_tokens=24, temperature=temperature, top_p=0.9 if temperature else 1.0)
    loop = _loop(model, tokenizer, tasks, env, config, _forcing(tokenizer), seed=3)
    engine = StaticEngine(model, tokenizer, columns=40)  # narrow: prompt + tokens overflow it, re-packed / widened
    fast = engine.generate(tasks, env, config, seed=3, logits_hook=_forcing(tokenizer))
    assert fast.completion_ids == loop.completion_ids and fast.rewards == loop.rewards
    assert fast.finish_reasons == loop.finish_reasons and fast.forward_calls == loop.forward_calls
    assert sum(c["python"] for c in loop.tool_calls) >= 3
    assert not engine.compile  # on the CPU by default


class LongOutputs(AgentEnv):
    """Python observations of about 300 tokens (as the paper's tool outputs), no sandbox."""

    def run_python(self, codes):
        return [python_observation(" ".join(["7"] * (140 + 5 * len(code)))) for code in codes]


def test_slot_cache_width_stays_near_the_longest_live_row(tokenizer):
    """8 slots, 12 tasks, 1-3 forced Python calls each with ~300-token observations: the cache width
    after every step <= 1.25 x the longest live row (the stated slack, ``SlotEngine.slack``); the
    same tokens as the loop. Without re-packing the width grows with every observation (the check
    can fail)."""
    model = _model(tokenizer, "qwen3", max_positions=2048)
    env = LongOutputs("math")
    tasks = load_tasks("smoke", "math", "val")[:12]
    scripts = [f"<python>print({r})</python>" * (1 + r % 3) + "<answer>\\boxed{1}</answer>" for r in range(12)]
    config = RolloutConfig(max_new_tokens=160, max_context=1600)
    loop = _loop(model, tokenizer, tasks, env, config, _forcing(tokenizer, scripts))
    engine = SlotEngine(model, tokenizer, slots=8)
    slots = engine.generate(tasks, env, config, seed=0, logits_hook=_forcing(tokenizer, scripts))
    assert slots.completion_ids == loop.completion_ids and slots.model_mask == loop.model_mask
    assert sum(c["python"] for c in slots.tool_calls) == sum(1 + r % 3 for r in range(12))
    assert min(mask.count(0) for mask in slots.model_mask) >= 280  # the observations were fed
    assert all(width <= 1.25 * longest for width, longest in engine.widths)
    assert max(longest for _, longest in engine.widths) > 900
    unbounded = SlotEngine(model, tokenizer, slots=8, slack=float("inf"))
    unbounded.generate(tasks, env, config, seed=0, logits_hook=_forcing(tokenizer, scripts))
    assert max(width for width, _ in unbounded.widths) > 2 * max(longest for _, longest in unbounded.widths)


@pytest.mark.parametrize("name", ENGINES)
def test_every_engine_runs_the_hybrid_cache_guard(tokenizer, env, monkeypatch, name):
    """A hybrid model whose cache shows no linear-attention layer (older transformers) is refused."""
    model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer)
    # every lookup sees no such layer: the guard's own (kv_cache) and the trajectory state's (rollout)
    for module in (kv_cache, rollout_module):
        monkeypatch.setattr(module, "linear_attention_layers", lambda cache: [])
    with pytest.raises(ConfigError, match="LinearAttentionLayer"):
        make_engine(name, model, tokenizer).generate(load_tasks("smoke", "math", "val")[:2], env,
                                                     RolloutConfig(max_new_tokens=4))


def test_an_installed_fla_that_transformers_does_not_use_is_refused(tokenizer, monkeypatch):
    """The kernels transformers resolved at import, not `import fla`, decide (here: no fla, the torch loop)."""
    import sys
    import types

    from copes_lib import engines

    resolved = engines.linear_attention_kernels()
    assert resolved and all(not v.startswith("fla.") for v in resolved.values())
    assert any("torch_chunk_gated_delta_rule" in v for v in resolved.values())
    model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))  # importable, but transformers did not use it
    with pytest.raises(ConfigError, match="resolves Qwen3.5's Gated-DeltaNet kernels"):
        check_gpu_engine(model)
    monkeypatch.setattr(engines, "linear_attention_kernels",
                        lambda: {k: "fla.ops.gated_delta_rule." + k for k in engines.LINEAR_ATTENTION_KERNELS})
    check_gpu_engine(model)  # resolved to fla: accepted


@pytest.mark.slow(cost=80)  # started first by tests/conftest.py (make test's worker balance)
def test_every_engine_meets_the_kv_goals_at_the_gpu_checks_workload():
    """benchmarks/gpu_check.py's engine workload at its GPU shape (batch 64, 128 new tokens, forced
    scripts of up to 3 searches of ~450 tokens and 5 Python outputs of 4-200 tokens), a tiny Qwen3 (the
    ratios depend on row lengths, not on the model's size), its CacheProbe read at every forward (the
    chunk included, where memory peaks): every engine's allocated K/V bytes at the peak are within 15%
    of rows x longest live row (docs/gpu_check.md#goals), the slot engine's width <= 1.25 x the longest
    live row at every forward, and all emit the same tokens. Before re-packing at the forward (issue 34):
    1.29 (loop), 1.58 (slots, width 1.85), 1.22 (static)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check

    from copes_lib.memory_model import kv_bytes_per_token

    tokenizer = gpu_check.make_tokenizer()
    vocab = len(tokenizer)
    model = build_agent_model("smoke", vocab, seed=0, tokenizer=tokenizer, max_positions=4096).eval()
    per_token = kv_bytes_per_token(gpu_check.describe(model), dtype_bytes=4)
    env, tasks, row_scripts, config = gpu_check.workload(tokenizer, 64, 128)
    tokens, figures = {}, {}
    for name in ENGINES:
        probe = gpu_check.CacheProbe(model)
        try:
            out = gpu_check.generate(make_engine(name, model, tokenizer), tasks, env, config, row_scripts, vocab)
        finally:
            probe.close()
        tokens[name], figures[name] = out.completion_ids, gpu_check.kv_figures(probe.rows, per_token)
    assert max(map(len, tokens["loop"])) >= 1500 and sum(mask.count(0) for mask in out.model_mask) > 20000
    # between re-allocations (after each forward) the goal holds; the judged figure also counts what a
    # re-allocation holds while it copies (the new buffer beside the old): one buffer (a layer's K or V)
    # at a time, ~3% spare included, never a layer's K and V together (loop 1.38, slots 1.37, static 1.30
    # here with 2 layers; loop 1.65, slots 1.67 when K and V were copied together; docs/gpu_check.md#goals)
    ratios = {name: f["kv_steady_over_model"] for name, f in figures.items()}
    assert all(abs(r - 1) <= gpu_check.GOALS["kv_over_model_tolerance"] for r in ratios.values()), ratios
    buffers = 2 * model.config.num_hidden_layers
    peaks = {name: f["kv_over_model"] for name, f in figures.items()}
    assert all(p <= (1 + gpu_check.GOALS["kv_over_model_tolerance"]) * (1 + 1.1 / buffers) for p in peaks.values()), peaks
    assert figures["slots"]["max_width_over_longest_row"] <= gpu_check.GOALS["slot_width"], figures["slots"]
    assert all(t == tokens["loop"] for t in tokens.values())


def test_split_chunk_keeps_every_piece_within_the_bound():
    from copes_lib.rollout import MIN_PIECE, split_chunk

    assert split_chunk([100, 90], [5, 5], 0.08) == [5]  # fits: one piece
    assert split_chunk([100], [1], 0.0) == [1] and split_chunk([1000, 10], [1, 500], float("inf")) == [500]
    real, lengths, slack = [1000, 400, 50], [2, 500, 300], 0.08
    ends = split_chunk(real, lengths, slack)
    assert len(ends) > 1 and ends[-1] == 500 and ends == sorted(set(ends))
    start, fed = 0, [0, 0, 0]
    for end in ends:  # the packed width before a piece plus the piece, against the longest row after it
        before = max(r + f for r, f in zip(real, fed))
        fed = [min(n, max(0, end - 500 + n)) for n in lengths]
        after = max(r + f for r, f in zip(real, fed))
        assert before + end - start <= max((1 + slack) * after, before + MIN_PIECE)
        start = end


class LongWhenNine(AgentEnv):
    """A Python call whose code holds a 9 gets ~300 tokens of output, any other 4."""

    def run_python(self, codes):
        return [python_observation(" ".join(["7"] * (150 if "9" in code else 2))) for code in codes]


def test_feeding_in_pieces_changes_no_token(tokenizer):
    """The loop with the bound (pieces and re-packs at the forward) against the loop without it
    (slack = inf: one chunk per forward, never re-packed), where a row with a long history gets a short
    observation next to a row with a short history and a long one: more forwards, narrower, same tokens."""
    from copes_lib.rollout import Trajectories, run_loop

    model = _model(tokenizer, "qwen3", max_positions=2048)
    env = LongWhenNine("math")
    tasks = load_tasks("smoke", "math", "val")[:2]
    scripts = ["<python>print(9)</python>" * 3 + "<python>print(0)</python>",
               "<python>print(0)</python>" * 3 + "<python>print(9)</python>"]
    config = RolloutConfig(max_new_tokens=120, max_context=1600)
    runs = {}
    for slack in (float("inf"), None):
        state = Trajectories(model, tokenizer, tasks, env, config, 0, None, _forcing(tokenizer, scripts), slack=slack)
        runs[slack] = (run_loop(state), state)
    (plain, plain_state), (bounded, bounded_state) = runs[float("inf")], runs[None]
    assert [c["python"] for c in plain.tool_calls] == [4, 4]
    assert bounded.completion_ids == plain.completion_ids and bounded.model_mask == plain.model_mask
    assert bounded.forward_calls > plain.forward_calls and bounded_state.compactions > 0
    assert max(w / n for w, n in bounded_state.widths) < max(w / n for w, n in plain_state.widths)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("engine", ["loop", "static"])
def test_kv_held_by_head_gives_the_logits_of_one_buffer(tokenizer, env, family, engine, monkeypatch):
    """K and V held as one buffer per KV head (kv_cache.HeadPieces, attention run per head) give bit for
    bit the logits of one (rows, heads, columns, dim) buffer per K and V: committed results stay
    reproducible. Forced tool calls, so the cache grows, re-packs and loses rows."""
    model = _model(tokenizer, family)
    assert model.config.num_key_value_heads > 1 and kv_cache.heads_apart(model)
    tasks = load_tasks("smoke", "math", "val")[:5]
    config = RolloutConfig(max_new_tokens=24)
    runs = {}
    for apart in (True, False):
        # looked up by growing_cache / static_cache in kv_cache
        monkeypatch.setattr(kv_cache, "heads_apart", lambda m, _apart=apart: _apart)
        logits, hook = [], _forcing(tokenizer)

        def record(rows, generating, values, _hook=hook, _logits=logits):
            _hook(rows, generating, values)
            _logits.append(values.clone())

        out = make_engine(engine, model, tokenizer).generate(tasks, env, config, seed=0, logits_hook=record)
        runs[apart] = out, logits
    (split, split_logits), (whole, whole_logits) = runs[True], runs[False]
    assert split.completion_ids == whole.completion_ids and split.rewards == whole.rewards
    assert len(split_logits) == len(whole_logits) > 24
    assert all(torch.equal(a, b) for a, b in zip(split_logits, whole_logits))
    assert sum(c["python"] for c in split.tool_calls) >= 3


def test_a_reallocation_holds_one_head_buffer_twice_at_most():
    """A GrowingLayer held by head grows, re-packs and drops rows one buffer at a time: the live bytes
    inside each call exceed the larger of the cache before and after it by at most one head's K or V."""
    from copes_lib.budget import LiveTensorBytes

    layer = kv_cache.GrowingLayer(heads_apart=True)
    rows, heads, dim = 6, 4, 8
    layer.update(torch.randn(rows, heads, 40, dim), torch.randn(rows, heads, 40, dim))

    def held():
        return sum(t.untyped_storage().nbytes() for t in layer._k + layer._v)

    def check(call, inputs=()):
        before = held()
        tracker = LiveTensorBytes(device_type=None)
        tracker.track_existing(layer._k + layer._v + list(inputs))  # the new columns are live before and after
        with tracker:
            call()
        piece = max(t.untyped_storage().nbytes() for t in layer._k + layer._v)
        bound = max(before, held()) + sum(t.untyped_storage().nbytes() for t in inputs) + max(piece, before // (2 * heads))
        assert tracker.peak <= bound, (tracker.peak, before, held())

    keys, values = torch.randn(rows, heads, 30, dim), torch.randn(rows, heads, 30, dim)
    check(lambda: layer.update(keys, values), (keys, values))  # grows
    assert layer._n == 70 and len(layer._k) == heads and isinstance(layer.keys, kv_cache.HeadPieces)
    check(lambda: layer.batch_select_indices(torch.tensor([0, 2, 3, 5])))
    check(lambda: layer.gather_columns(torch.arange(10, 70).repeat(4, 1)))
    check(lambda: layer.add_rows(3))
    assert layer.keys.shape == (7, heads, 60, dim)


def test_a_row_past_the_cache_size_is_an_error_naming_it(tokenizer, env):
    model = build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer)
    tasks = load_tasks("smoke", "math", "val")[:2]
    with pytest.raises(ConfigError, match=r"KV cache: row 0 \(task .*\) would hold \d+ tokens, more than the 8 it is "
                                          r"sized for \(RolloutConfig.max_context\)"):
        make_engine("loop", model, tokenizer).generate(tasks, env, RolloutConfig(max_context=8, max_new_tokens=4))


@pytest.mark.slow(cost=300)
def test_kv_peak_stays_within_5_percent_of_the_steady_cache_at_qwen35_4bs_layout():
    """A narrow Qwen3.5 with Qwen3.5-4B's attention layout (8 full-attention layers of 4 KV heads in 32)
    on the gpu check's workload (a smaller batch: the share of one buffer depends on the layout): in
    every engine each forward's peak K/V bytes, re-allocation transients included, are <= 1.05 x the
    cache around it, and the gpu check's judged KV figure (the peak) is within 15% of rows x longest row.
    Held as one buffer per K and V the transient is a layer's K or V, 1/16 of the cache."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gpu_check

    from copes_lib.memory_model import kv_bytes_per_token

    tokenizer = gpu_check.make_tokenizer()
    model = build_qwen35("4b-layout", len(tokenizer), 0, tokenizer=tokenizer, max_positions=4096)
    assert sum(t == "full_attention" for t in model.config.layer_types) == 8 and model.config.num_key_value_heads == 4
    per_token = kv_bytes_per_token(gpu_check.describe(model), dtype_bytes=4)
    work = gpu_check.workload(tokenizer, 4, 32)  # bench_kv.py --batch 4 --new-tokens 32
    tokens = {}
    for name in ENGINES:
        figures, rows, tokens[name] = gpu_check.engine_kv(name, model, tokenizer, work, per_token)
        assert any(r["transient_bytes"] for r in rows), name  # it did re-allocate
        assert figures["kv_peak_over_steady"] <= 1.05, (name, figures)
        assert abs(figures["kv_over_model"] - 1) <= gpu_check.GOALS["kv_over_model_tolerance"], (name, figures)
    assert all(t == tokens["loop"] for t in tokens.values())
