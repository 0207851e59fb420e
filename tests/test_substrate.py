"""Tokenizer, model construction, trace encoding and the cached, deterministic warm start."""

import dataclasses

import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.protocols.params import SubstrateNotebookParams
from copes_lib.protocols.substrate_setup import substrate_config, substrate_params
from copes_lib.substrate import (
    MODEL_SIZES,
    build_agent_model,
    count_model_params,
    encode_trace,
    get_tokenizer,
    warm_start,
)
from copes_lib.tasks import TAGS, load_tasks


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smoke", substrate_config("smoke").vocab_size)


def test_tokenizer_is_small_lossless_and_tags_are_single_tokens(tokenizer):
    assert len(tokenizer) <= substrate_params("smoke").VOCAB_SIZE + 16
    assert tokenizer.padding_side == "left"
    for tag in TAGS:
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1
    for task in load_tasks("smoke", "qa", "val")[:3] + load_tasks("smoke", "math", "val")[:3]:
        ids = tokenizer(task.reference, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == task.reference
    # a name tokenizes the same after a space and after a tag (copying = copying ids)
    name = load_tasks("smoke", "qa", "val")[0].question.split(" was ")[1].split(" born")[0]
    after_space = tokenizer(" " + name, add_special_tokens=False)["input_ids"][1:]
    after_tag = tokenizer("<search>" + name, add_special_tokens=False)["input_ids"][1:]
    assert after_space == after_tag


def test_model_sizes_and_seeded_init(tokenizer):
    small = build_agent_model("smoke", len(tokenizer), seed=3)
    assert 100_000 <= count_model_params(small) <= 1_000_000
    assert 1_000_000 <= count_model_params(build_agent_model("cpu", 640, seed=0)) <= 10_000_000
    again = build_agent_model("smoke", len(tokenizer), seed=3)
    other = build_agent_model("smoke", len(tokenizer), seed=4)
    a, b, c = (torch.cat([p.flatten() for p in m.parameters()]) for m in (small, again, other))
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ConfigError, match="valid values"):
        build_agent_model("huge", 100, seed=0)
    assert set(MODEL_SIZES) >= {"smoke", "cpu"}


def test_trace_mask_covers_model_text_only(tokenizer):
    task = load_tasks("smoke", "math", "val")[3]  # difficulty 4: search + python
    ids, mask = encode_trace(tokenizer, task, 512)
    written = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert "<search>" in written and "</answer>" in written
    assert "<result>" not in written and "<output>" not in written and "Question" not in written
    with pytest.raises(ValueError, match="MAX_CONTEXT"):
        encode_trace(tokenizer, task, 10)


def test_warm_start_is_cached_and_deterministic():
    config = dataclasses.replace(substrate_config("smoke"), math_steps=3, batch=4, eval_every=3, eval_problems=2,
                                 max_new_tokens=8)
    model, tok, info = warm_start("smoke", "math", seed=5, force=True, config=config, log=lambda s: None)
    assert info["steps"] == 3 and [p["step"] for p in info["curve"]] == [0, 3] and not info["cached"]
    cached_model, _, cached_info = warm_start("smoke", "math", seed=5, config=config)
    assert cached_info["cached"]
    again, _, _ = warm_start("smoke", "math", seed=5, force=True, config=config, log=lambda s: None)
    for p, q, r in zip(model.parameters(), cached_model.parameters(), again.parameters()):
        assert torch.equal(p, q) and torch.equal(p, r)


def test_params_validate():
    with pytest.raises(ConfigError, match="MODEL_SIZE"):
        SubstrateNotebookParams(MODEL_SIZE="huge")
    with pytest.raises(ConfigError, match="kind"):
        warm_start("smoke", "chess", config=substrate_config("smoke"))
    with pytest.raises(ConfigError, match="MODEL_PATH"):
        warm_start("gpu", "math", config=substrate_config("gpu"))


def test_warm_start_stops_at_the_first_point_reaching_its_target(tokenizer, monkeypatch):
    """The declared stopping rule: evaluate every eval_every steps, stop once the score >= target."""
    import copes_lib.rollout as rollout_module
    from copes_lib.substrate import train_warm_start, warm_rollout_config

    scores = iter([0.0, 0.1, 0.45, 0.2, 0.9])  # step 0, 2, 4, 6, 8
    monkeypatch.setattr(rollout_module, "evaluate", lambda *a, **k: {"score": next(scores)})
    params = substrate_params("smoke")
    tasks = load_tasks("smoke", "math", "train")[:16]

    class Env:
        kind = "math"

    def curve(target):
        model = build_agent_model("smoke", len(tokenizer), seed=0)
        return train_warm_start(model, tokenizer, tasks, tasks[:2], Env(), steps=8, batch=2, lr=1e-3, warmup=0,
                                seed=0, eval_every=2, max_context=params.MAX_CONTEXT,
                                rollout_config=warm_rollout_config(params.warm_start_config()), log=lambda s: None, target=target)

    assert [p["step"] for p in curve(0.4)] == [0, 2, 4]  # 0.45 >= 0.4 at step 4: stop
    scores = iter([0.0, 0.1, 0.45, 0.2, 0.9])
    assert [p["step"] for p in curve(0.0)] == [0, 2, 4, 6, 8]  # no target: the cap

