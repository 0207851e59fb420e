"""Hybrid (Qwen3.5: Gated-DeltaNet linear attention + full attention) rollouts: every row of a batched
multi-turn rollout with tool calls equals its single-row run."""

import pytest
import torch

from copes_lib import kv_cache
from copes_lib import rollout as rollout_module
from copes_lib.engines import build_probe_qwen35
from copes_lib.protocols.testbed.substrate_setup import substrate_config
from copes_lib.rollout import RolloutConfig, encode, make_env, rollout
from copes_lib.substrate import get_tokenizer
from copes_lib.tasks import load_tasks

BAR = 1e-4  # the largest logit difference between a batch row and its single-row run (gpu check's too)
# per row: the tokens forced at the start of its first turn (a Python call, an answer, a longer call, none)
SCRIPTS = ["<python>print(1+2)</python>", "<answer>\\boxed{3}</answer>", "<python>x = 5\nprint(x * 7 + 1)</python>", ""]


@pytest.fixture(scope="module")
def setup():
    tokenizer = get_tokenizer("smoke", substrate_config("smoke").vocab_size)
    # logits that are not flat, slowly decaying states: a wrongly advanced state shows by >= 100x the bar
    model = build_probe_qwen35(len(tokenizer), seed=0, tokenizer=tokenizer)
    env = make_env("math", "smoke")
    yield model, tokenizer, env, load_tasks("smoke", "math", "val")[:4]
    env.close()


def _run(model, tokenizer, env, tasks, rows):
    """Rollout of tasks[rows] with SCRIPTS forced; returns (batch, {(row, t): raw logits of token t})."""
    scripts = [encode(tokenizer, s) if s else [] for s in SCRIPTS]
    seen, count = {}, {}

    def force(batch_rows, generating, logits):
        for i, (r, g) in enumerate(zip(batch_rows, generating)):
            if not g:
                continue
            row = rows[r]
            t = count[row] = count.get(row, -1) + 1
            seen[(row, t)] = logits[i].clone()
            if t < len(scripts[row]):
                logits[i] = float("-inf")
                logits[i, scripts[row][t]] = 0.0

    out = rollout(model, tokenizer, [tasks[r] for r in rows], env, RolloutConfig(max_new_tokens=30), seed=0,
                  logits_hook=force)
    return out, seen


def _max_diff(a: dict, b: dict) -> float:
    worst = 0.0
    for key, single in b.items():
        finite = torch.isfinite(single)
        assert torch.equal(finite, torch.isfinite(a[key]))
        worst = max(worst, (a[key][finite] - single[finite]).abs().max().item())
    return worst


def test_hybrid_batch_rows_equal_single_rows_with_tool_calls(setup):
    model, tokenizer, env, tasks = setup
    assert sum(type(layer).__name__ == "LinearAttentionLayer"
               for layer in kv_cache.growing_cache(model).layers) == 3
    batch, seen = _run(model, tokenizer, env, tasks, [0, 1, 2, 3])
    assert batch.tool_calls[0]["python"] == 1 and batch.tool_calls[2]["python"] == 1  # the forced calls ran
    assert batch.finish_reasons[1] == "answer"
    assert 0 in batch.model_mask[0]  # an observation was fed back
    for row in range(4):
        single, single_seen = _run(model, tokenizer, env, tasks, [row])
        assert single.completion_ids[0] == batch.completion_ids[row]
        assert _max_diff(seen, single_seen) < BAR


def test_without_row_exact_linear_attention_rows_drift(setup, monkeypatch):
    """The check above can fail, by a margin: padding that advances the linear-attention state changes the
    logits by >= 100x the bar (on a model with flat logits, build_qwen35's, by only ~6x)."""
    model, tokenizer, env, tasks = setup
    # both looked up by the trajectory state (copes_lib.rollout.Trajectories), which then builds no row-exact path
    monkeypatch.setattr(rollout_module, "linear_attention_layers", lambda cache: [])
    monkeypatch.setattr(rollout_module, "check_hybrid_cache", lambda model, cache: None)
    _, seen = _run(model, tokenizer, env, tasks, [0, 1, 2, 3])
    _, single_seen = _run(model, tokenizer, env, tasks, [0])
    assert _max_diff(seen, single_seen) >= 100 * BAR


def test_select_rows_reorders_every_layer_type(setup):
    model, tokenizer, _, _ = setup
    cache = kv_cache.growing_cache(model)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    model(input_ids=ids, cache=cache, use_cache=True)
    def keys(layer):  # held by KV head (kv_cache.HeadPieces) for an sdpa model
        return layer.keys.whole() if isinstance(layer.keys, kv_cache.HeadPieces) else layer.keys.clone()

    before = [(layer.conv_states[0].clone(), layer.recurrent_states[0].clone()) if hasattr(layer, "conv_states")
              else (keys(layer),) for layer in cache.layers]
    kv_cache.select_rows(cache, torch.tensor([2, 0]))
    for layer, old in zip(cache.layers, before):
        now = (layer.conv_states[0], layer.recurrent_states[0]) if hasattr(layer, "conv_states") else (keys(layer),)
        for a, b in zip(now, old):
            assert torch.equal(a, b[[2, 0]])
