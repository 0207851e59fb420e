"""Rollout engines behind one contract: the continuous-batching engine gives the plain loop's greedy
trajectories (dense Qwen3 and hybrid Qwen3.5, tool calls forced), and clear errors."""

import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.engines import (
    LoopEngine,
    RolloutEngine,
    SlotEngine,
    build_qwen35,
    check_gpu_engine,
    make_engine,
)
from copes_lib.protocols.substrate_setup import substrate_config
from copes_lib.rollout import RolloutConfig, encode, make_env
from copes_lib.substrate import build_agent_model, get_tokenizer
from copes_lib.tasks import load_tasks

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


def _forcing(tokenizer, tasks_per_script):
    """A logits hook that forces SCRIPTS[row] at the start of each row's first turn."""
    scripts = [encode(tokenizer, s) if s else [] for s in SCRIPTS]
    count = {}

    def force(rows, generating, logits):
        for i, (r, g) in enumerate(zip(rows, generating)):
            if g:
                t = count[r] = count.get(r, -1) + 1
                if t < len(scripts[r % len(scripts)]):
                    logits[i] = float("-inf")
                    logits[i, scripts[r % len(scripts)][t]] = 0.0

    return force


def _loop(model, tokenizer, tasks, env, config, hook):
    from copes_lib.rollout import rollout

    return rollout(model, tokenizer, tasks, env, config, seed=0, logits_hook=hook)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_slot_engine_equals_the_loop_greedy(tokenizer, env, family):
    if family == "qwen3":
        model = build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer)
    else:
        model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer)
    tasks = load_tasks("smoke", "math", "val")[:7]
    config = RolloutConfig(max_new_tokens=24)
    loop = _loop(model, tokenizer, tasks, env, config, _forcing(tokenizer, tasks))
    slots = SlotEngine(model, tokenizer, slots=3, join_at=2).generate(tasks, env, config, seed=0,
                                                           logits_hook=_forcing(tokenizer, tasks))
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
    engines = [make_engine("loop", model, tokenizer), make_engine("slots", model, tokenizer, slots=2)]
    assert all(isinstance(e, RolloutEngine) for e in engines) and isinstance(engines[0], LoopEngine)
    outs = [e.generate(tasks, env, config, seed=0) for e in engines]
    assert outs[0].completion_ids == outs[1].completion_ids
    # the engine reads the weights at every call: a change in place shows in the next batch
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)), alpha=0.5)
    assert engines[1].generate(tasks, env, config, seed=0).completion_ids != outs[1].completion_ids


def test_bad_engine_and_missing_gpu_say_what_to_do(tokenizer):
    model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="valid values"):
        make_engine("vllm", model, tokenizer)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="requirements-gpu.txt"):
            check_gpu_engine(model)
        with pytest.raises(ConfigError, match="CUDA"):
            SlotEngine(model, tokenizer, require_gpu=True)
