"""Tokenizer, model construction, trace encoding and the cached, deterministic warm start."""

import dataclasses

import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.protocols.params import SubstrateNotebookParams
from copes_lib.protocols.testbed.substrate_setup import substrate_config, substrate_params
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
    monkeypatch.setattr(rollout_module, "evaluate", lambda *a, **k: {"score": next(scores), "batches": []})
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



# --------------------------------------------------------------------------- the latent-protocol warm start
def test_latent_protocol_ranges_fail_naming_the_parameter():
    from copes_lib.substrate import WarmStartConfig, latent_trace_mix

    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="latent_p"):
            WarmStartConfig(latent_p=bad)
        with pytest.raises(ConfigError, match="WARM_LATENT_P"):
            SubstrateNotebookParams(WARM_LATENT_P=bad)
        with pytest.raises(ConfigError, match="latent_p"):
            latent_trace_mix(load_tasks("smoke", "math", "train")[:10], bad, 0)
    with pytest.raises(ConfigError, match="WARM_PROTOCOL"):
        SubstrateNotebookParams(WARM_PROTOCOL="chatty")
    with pytest.raises(ConfigError, match="WARM_LATENT_MATH_STEPS"):
        SubstrateNotebookParams(WARM_LATENT_MATH_STEPS=0)
    assert WarmStartConfig(latent_p=0.0).latent_p == 0.0  # p = 0 is valid: no trace in the reward's protocol


@pytest.mark.parametrize("kind", ["math", "qa"])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.35])
def test_latent_traces_are_in_the_declared_protocol_mix(kind, p):
    from copes_lib.substrate import latent_trace_mix

    tasks = load_tasks("smoke", kind, "train")
    mixed, n_paper = latent_trace_mix(tasks, p, seed=0)
    paper = [t for t in mixed if t.reference.endswith(r"}</answer>") and r"<answer>\boxed{" in t.reference]
    latent = [t for t in mixed if t.reference.endswith(f"Answer: {t.answers[0]}")]
    latent_ids = {t.id for t in latent}
    assert n_paper == len(paper) == round(p * len(tasks)) and len(latent) == len(tasks) - n_paper
    assert not any("<answer>" in t.reference for t in latent)
    for before, after in zip(tasks, mixed):  # same task, same tool calls and observations, only the answer differs
        assert (before.id, before.question, before.answers) == (after.id, after.question, after.answers)
        if after.id in latent_ids:
            assert after.reference.rsplit("Answer: ", 1)[0] == before.reference.rsplit("<answer>", 1)[0]
        else:
            assert after == before
    if 0 < p:  # the draw follows the seed
        other = latent_trace_mix(tasks, p, seed=1)[0]
        assert [t.reference for t in other] != [t.reference for t in mixed]


@pytest.mark.parametrize("kind", ["math", "qa"])
def test_the_cued_prior_keys_the_paper_protocol_on_a_question_feature(kind):
    # docs/regime.md#r3a-the-design-change-a-lower-bound-on-strict-accuracy-and-a-cued-prior
    from copes_lib.substrate import cued_values, latent_trace_mix, prior_cue

    tasks = load_tasks("cpu", kind, "train")
    mixed, n_paper = latent_trace_mix(tasks, 0.1, seed=0, prior="cued")
    cues = cued_values(tasks, 0.1, seed=0)
    paper = {t.id for t in mixed if "<answer>" in t.reference}
    assert paper == {t.id for t in tasks if prior_cue(t) in cues} and n_paper == len(paper)
    assert 0.05 <= n_paper / len(tasks) <= 0.15  # about p: whole cue values, the share closest to 0.1
    assert cues != cued_values(tasks, 0.1, seed=1) or len(cues) > 2  # the set follows the seed
    val = load_tasks("cpu", kind, "val")  # the validation problems carry the same cues
    assert 0.05 <= sum(prior_cue(t) in cues for t in val) / len(val) <= 0.15
    assert latent_trace_mix(tasks, 0.0, seed=0, prior="cued")[1] == 0  # p = 0: every trace latent
    with pytest.raises(ConfigError, match="latent_prior"):
        latent_trace_mix(tasks, 0.1, seed=0, prior="random")
    with pytest.raises(ConfigError, match="WARM_LATENT_PRIOR"):
        SubstrateNotebookParams(WARM_LATENT_PRIOR="random")


@pytest.mark.parametrize("kind", ["math", "qa"])
def test_the_graded_prior_gives_each_unit_its_own_rate(kind):
    """docs/preflight.md#p82-the-graded-prior-over-units: one rate per subject name, evenly spaced over the kind's
    range (QA's top is graded_high_qa), each unit's paper-protocol share near its rate, seeded."""
    from copes_lib.substrate import WarmStartConfig, graded_range, latent_trace_mix, unit_rates

    config = WarmStartConfig(protocol="latent", latent_prior="graded")
    tasks = load_tasks("cpu", kind, "train")
    rates = unit_rates(tasks, config, kind, seed=0)
    low, high = graded_range(config, kind)
    assert len(rates) == 128 and min(rates.values()) == low and max(rates.values()) == pytest.approx(high)
    assert (low, high) == ((0.02, 0.55) if kind == "qa" else (0.02, 0.70))
    mixed, n_paper = latent_trace_mix(tasks, 0.0, seed=0, prior="graded", graded=(low, high))
    by_unit: dict[str, list[bool]] = {}
    for t in mixed:
        by_unit.setdefault(t.unit_id, []).append("<answer>" in t.reference)
    share = {u: sum(v) / len(v) for u, v in by_unit.items()}
    assert sum(abs(share[u] - rates[u]) for u in rates) / len(rates) < 0.08  # ~40-80 Bernoulli draws per unit
    assert abs(n_paper / len(tasks) - sum(rates.values()) / len(rates)) < 0.02
    assert unit_rates(tasks, config, kind, seed=1) != rates  # the order follows the warm-start seed


def test_tail_mean_reads_the_last_points():
    from copes_lib.substrate import tail_mean

    curve = [{"step": 0, "val_strict": 0.0}] + [{"step": s, "val_strict": v} for s, v in
                                                 ((850, 0.023), (900, 0.1), (950, 0.266), (1000, 0.2))]
    assert tail_mean(curve)["mean"] == pytest.approx((0.023 + 0.1 + 0.266 + 0.2) / 4)
    assert tail_mean(curve, k=1)["mean"] == 0.2 and tail_mean(curve[:1])["points"] == 0


def test_a_latent_trace_ends_on_eos_and_a_paper_trace_does_not(tokenizer):
    from copes_lib.substrate import latent_trace_mix

    task = load_tasks("smoke", "math", "val")[3]
    latent = latent_trace_mix([task], 0.0, seed=0)[0][0]
    ids, mask = encode_trace(tokenizer, latent, 512)
    assert ids[-1] == tokenizer.eos_token_id and mask[-1] == 1
    assert "Answer:" in tokenizer.decode([i for i, m in zip(ids, mask) if m]) and "<answer>" not in tokenizer.decode(ids)
    paper_ids, _ = encode_trace(tokenizer, task, 512)
    assert paper_ids[-1] != tokenizer.eos_token_id and tokenizer.eos_token_id not in paper_ids


def test_cache_key_changes_with_p_and_the_paper_base_keeps_its_key():
    from copes_lib.substrate import warm_start_folder

    base = substrate_config("smoke")
    latent = dataclasses.replace(base, protocol="latent", latent_prior="cued", lr_decay=0.0)

    def folder(config, kind="math"):
        return warm_start_folder("smoke", kind, 0, config=config)[0]

    keys = {folder(dataclasses.replace(latent, latent_p=p)) for p in (0.0, 0.1, 0.2)}
    assert len(keys) == 3 and folder(base) not in keys
    assert folder(dataclasses.replace(latent, latent_math_steps=7)) != folder(latent)
    assert folder(dataclasses.replace(latent, latent_qa_steps=7), "qa") != folder(latent, "qa")
    homogeneous = dataclasses.replace(latent, latent_prior="homogeneous")
    assert folder(dataclasses.replace(latent, latent_prior="cued")) != folder(homogeneous)
    graded = dataclasses.replace(latent, latent_prior="graded")
    assert folder(dataclasses.replace(graded, latent_p=0.3)) == folder(graded)  # the graded prior ignores p
    assert folder(dataclasses.replace(graded, graded_high=0.6)) != folder(graded)
    assert folder(dataclasses.replace(graded, graded_high_qa=0.5), "qa") != folder(graded, "qa")
    assert folder(dataclasses.replace(graded, graded_high_qa=0.5)) == folder(graded)  # math reads graded_high
    # the paper protocol ignores the latent knobs, so its cache entry (the skill-gap control) is unchanged
    assert folder(dataclasses.replace(base, latent_p=0.3, latent_math_steps=7)) == folder(base)


def test_latent_warm_start_trains_its_exact_steps_and_records_the_mix():
    config = dataclasses.replace(substrate_config("smoke"), protocol="latent", latent_p=0.2, latent_math_steps=4,
                                 latent_prior="homogeneous",
                                 math_target=0.01, batch=4, eval_every=2, eval_problems=2, max_new_tokens=8)
    _, _, info = warm_start("smoke", "math", seed=7, force=True, config=config, log=lambda s: None)
    n_train = len(load_tasks("smoke", "math", "train"))
    assert info["protocol"] == "latent" and info["steps"] == 4 and info["target"] == 0.0  # no stopping rule
    assert (info["paper_traces"], info["latent_traces"]) == (round(0.2 * n_train), n_train - round(0.2 * n_train))
    assert [p["step"] for p in info["curve"]] == [0, 2, 4]
    assert all({"val_strict", "val_lenient"} <= set(p) for p in info["curve"]) and isinstance(info["converged"], bool)


def test_spread_seeds_are_skipped_when_nothing_is_trained():
    assert SubstrateNotebookParams(WARM_SPREAD_SEEDS=2).spread_seeds() == [1, 2]
    assert SubstrateNotebookParams(SEED=4, WARM_SPREAD_SEEDS=1).spread_seeds() == [5]
    assert SubstrateNotebookParams(WARM_SPREAD_SEEDS=0).spread_seeds() == []
    loaded = [SubstrateNotebookParams(PROFILE="gpu", PREFLIGHT=False, WARM_SPREAD_SEEDS=2),
              SubstrateNotebookParams(MODEL_PATH="/models/Qwen3.5-4B", WARM_SPREAD_SEEDS=2)]
    for params in loaded:  # every seed would load the same checkpoint: sd 0 by construction
        assert params.spread_seeds() == [] and not params.trains_base()
        assert params.warm_start_config().protocol == "paper"  # a loaded checkpoint is trained on no traces


def test_converged_reads_the_lenient_curve():
    from copes_lib.substrate import converged

    rising = [{"val_lenient": v} for v in (0.0, 0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9)]
    flat = [{"val_lenient": v} for v in (0.0, 0.4, 0.7, 0.8, 0.82, 0.81, 0.83, 0.82)]
    untrained = [{"val_lenient": 0.0}] * 8
    assert not converged(rising) and converged(flat) and not converged(flat[:1]) and not converged(untrained)


def test_cached_model_files_share_the_cache_mode(tmp_path, tokenizer):
    """safetensors writes model.safetensors 0600; the rest of the cache is 0644 (issue 33)."""
    import os

    from copes_lib import runs
    from copes_lib.substrate import _save_atomically, build_agent_model

    model = build_agent_model("tiny", len(tokenizer), 0, 64, tokenizer)
    folder = _save_atomically(tmp_path, "model", model.save_pretrained)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert "model.safetensors" in modes
    assert set(modes.values()) == {0o666 & ~runs._UMASK}, modes
    assert folder.stat().st_mode & 0o777 == 0o777 & ~runs._UMASK
    assert os.access(folder / "model.safetensors", os.R_OK)


def test_subject_tokens_make_every_unit_one_token():
    """docs/preflight.md#p86-the-unit-as-one-token-registered-2026-12-03: with subject_tokens each subject name is one
    token (a whole word only), text stays lossless, and the tokenizer and the warm start have their own keys."""
    from copes_lib.substrate import _warm_config, get_tokenizer
    from copes_lib.tasks import format_prompt
    from copes_lib.tasks.units import SUBJECTS

    vocab = substrate_params("smoke").VOCAB_SIZE
    tok = get_tokenizer("smoke", vocab, subject_tokens=True)
    assert all(len(tok(name, add_special_tokens=False)["input_ids"]) == 1 for name in SUBJECTS)
    assert len(tok(SUBJECTS[0] + "x", add_special_tokens=False)["input_ids"]) > 1  # not inside a longer word
    for task in load_tasks("smoke", "qa", "val")[:2] + load_tasks("smoke", "math", "val")[:2]:
        text = format_prompt(task) + task.reference
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    config = substrate_config("smoke")
    assert _warm_config(dataclasses.replace(config, subject_tokens=True), "math", 0) != _warm_config(config, "math", 0)
