"""Paper B library: corpus splits, pool (batched == per-slot, PEFT export), causal routers, metrics,
fitness, lifecycle, a tiny cell run, the factorial statistics and bad-input errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.molora import corpus, fitness, lifecycle, metrics
from copes_lib.molora.adapt import train_cell
from copes_lib.molora.lm import SubstrateConfig, pretrain, train_corpus_tokenizer
from copes_lib.molora.pool import AdapterPool, PoolConfig, export_peft
from copes_lib.molora.routers import RouterConfig, make_router, router_rows
from copes_lib.molora.slot_adam import SlotAdamW
from copes_lib.protocols.paper_b import factorial
from copes_lib.protocols.paper_b.molora_params import MoloraFactorialParams

TINY = SubstrateConfig(corpus_source="sample", max_chars_per_domain=0, vocab_size=400, d_model=32, n_layers=2,
                       n_heads=2, n_kv_heads=1, intermediate=64, seq_len=32, batch_per_domain=2, steps=3,
                       warmup=1, eval_windows=4)


@pytest.fixture(scope="module")
def sub():
    torch.manual_seed(0)
    return pretrain(TINY, log_every=100)


def _randomise_b(pool: AdapterPool, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key in pool.B:
            pool.B[key].copy_(torch.randn(pool.B[key].shape, generator=generator) * 0.3)


# --------------------------------------------------------------------------- corpus
def test_sample_corpus_splits_are_disjoint_and_deterministic():
    docs = corpus.load_documents("sample")
    assert set(docs) == set(corpus.DOMAINS) and all(len(v) >= 3 for v in docs.values())
    splits = corpus.split_ids(docs, seed=0)
    assert splits == corpus.split_ids(docs, seed=0)
    all_ids = [i for parts in splits.values() for ids in parts.values() for i in ids]
    assert len(all_ids) == len(set(all_ids)) == sum(len(v) for v in docs.values())
    bad = {"code": {"train": ["a"], "val": ["a"], "test": ["b"]}}
    with pytest.raises(ValueError, match="both"):
        corpus.check_splits(bad)


def test_obo_parser_keeps_named_defined_live_terms(tmp_path):
    obo = tmp_path / "x.obo"
    obo.write_text('format-version: 1.2\n\n[Term]\nid: GO:1\nname: cell growth\n'
                   'def: "The \\"process\\" of growing." [GOC:x]\n\n[Term]\nid: GO:2\nname: old\n'
                   'def: "Gone." []\nis_obsolete: true\n\n[Typedef]\nid: part_of\nname: part of\n')
    assert corpus.obo_terms(obo) == ['cell growth: The "process" of growing.']
    assert corpus.clean_text("a\tb  \r\n\n\n\nc\x07") == "a    b\n\nc\n"


def test_tokenizer_training_is_deterministic():
    texts = [d.text for d in corpus.load_documents("sample")["prose"]]
    a, b = train_corpus_tokenizer(texts, 400), train_corpus_tokenizer(texts, 400)
    assert a.to_str() == b.to_str()
    assert a.decode(a.encode(texts[0][:300]).ids) == texts[0][:300]


def test_substrate_is_frozen_and_evaluated(sub):
    assert not any(p.requires_grad for p in sub.model.parameters())
    assert set(sub.test_nll) == set(corpus.DOMAINS)
    assert all(0 < v < 10 for v in sub.test_nll.values())


# --------------------------------------------------------------------------- pool
def test_pool_batched_update_equals_per_slot_sum(sub):
    pool = AdapterPool(sub.model, PoolConfig(n_slots=5, rank=3, targets="q_proj,down_proj"), seed=0)
    try:
        _randomise_b(pool)
        x = torch.randn(2, 7, 32)
        key = pool.keys["model.layers.0.self_attn.q_proj"]
        weights = torch.rand(2, 7, 5)
        batched = pool.delta(key, x, weights)
        looped = sum(weights[..., s:s + 1] * (x @ pool.slot_delta(s)["model.layers.0.self_attn.q_proj"].T)
                     for s in range(5))
        torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-4)
    finally:
        pool.remove()


def test_peft_export_matches_pool_with_one_hot_gate(sub, tmp_path):
    from peft import PeftModel

    pool = AdapterPool(sub.model, PoolConfig(n_slots=4, rank=4), seed=0)
    ids = torch.randint(0, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    try:
        _randomise_b(pool)
        one_hot = torch.zeros(2, 12, 4)
        one_hot[..., 2] = 1.0
        with torch.no_grad(), pool.gated(one_hot):
            pooled = sub.model(input_ids=ids).logits
        with torch.no_grad():
            bare = sub.model(input_ids=ids).logits
        export_peft(pool, 2, tmp_path / "slot2")
    finally:
        pool.remove()
    assert (pooled - bare).abs().max() > 1e-3  # the adapter does something
    import copy

    peft_model = PeftModel.from_pretrained(copy.deepcopy(sub.model), str(tmp_path / "slot2"))
    with torch.no_grad():
        loaded = peft_model(input_ids=ids).logits
    torch.testing.assert_close(loaded, pooled, atol=1e-5, rtol=1e-4)


def test_set_slot_delta_refactorises_to_rank_r(sub):
    pool = AdapterPool(sub.model, PoolConfig(n_slots=3, rank=2, targets="q_proj"), seed=0)
    try:
        _randomise_b(pool)
        target = {name: d + pool.slot_delta(1)[name] for name, d in pool.slot_delta(0).items()}  # rank <= 4
        pool.set_slot_delta(2, target, torch.Generator().manual_seed(0))
        for name, d in pool.slot_delta(2).items():
            assert torch.linalg.matrix_rank(d) <= 2
            best = torch.linalg.svd(target[name])
            rank2 = (best.U[:, :2] * best.S[:2]) @ best.Vh[:2]
            torch.testing.assert_close(d, rank2, atol=1e-4, rtol=1e-3)
    finally:
        pool.remove()


# --------------------------------------------------------------------------- routers
@pytest.mark.parametrize("kind", ["r0", "r1"])
def test_routers_are_causal(sub, kind):
    pool = AdapterPool(sub.model, PoolConfig(n_slots=6, rank=2), seed=0)
    try:
        router = make_router(RouterConfig(kind=kind, input_scale=50.0), 32, 6, seed=0)
        ids = torch.randint(0, 400, (1, 16), generator=torch.Generator().manual_seed(3))
        changed = ids.clone()
        changed[0, 10] = (changed[0, 10] + 17) % 400
        with torch.no_grad():
            before = router(router.features(sub.model, pool, ids), 0)
            after = router(router.features(sub.model, pool, changed), 0)
        torch.testing.assert_close(before[:, :10], after[:, :10], atol=0, rtol=0)
        assert (before[:, 10:] - after[:, 10:]).abs().max() > 0  # the test could fail
    finally:
        pool.remove()


def test_r1_gates_respect_floor_and_temperature_bounds():
    cfg = RouterConfig(kind="r1", floor_min=0.05, floor_max=0.2, t_start=2.0, t_end=0.5, anneal_steps=10,
                       gate_norm="none")
    router = make_router(cfg, 8, 4)
    with torch.no_grad():
        router.floor_logit.copy_(torch.tensor([-50.0, 50.0, 0.0, 3.0]))
        gates = router.gates(torch.randn(3, 5, 8) * 100, step=5)
    assert gates.min() >= 0.05 - 1e-6 and gates.max() <= 1.0
    assert router.temperature(0) == 2.0 and router.temperature(10) == 0.5 and router.temperature(10**6) == 0.5
    normed = make_router(dataclasses.replace(cfg, gate_norm="init_mass"), 8, 4)
    with torch.no_grad():
        total = normed(torch.zeros(1, 1, 8)).sum()
    assert abs(float(total) - 1.0) < 1e-5  # same total weight as a softmax at initialisation


def test_bad_inputs_raise_config_errors(sub):
    with pytest.raises(ConfigError, match="floor_min"):
        RouterConfig(floor_min=-0.1)
    with pytest.raises(ConfigError, match="floor_max"):
        RouterConfig(floor_max=1.0)
    with pytest.raises(ConfigError, match="floor_min"):
        RouterConfig(floor_min=0.5, floor_max=0.2)
    with pytest.raises(ConfigError, match="rank"):
        AdapterPool(sub.model, PoolConfig(n_slots=2, rank=64), seed=0)
    with pytest.raises(ConfigError, match="match no linear"):
        AdapterPool(sub.model, PoolConfig(targets="nonexistent_proj"), seed=0)
    with pytest.raises(ConfigError, match="deaths"):
        lifecycle.LifecycleConfig(deaths=16).check_slots(16)
    with pytest.raises(ConfigError, match="DEATHS"):
        MoloraFactorialParams(DEATHS=16, N_SLOTS=16)
    with pytest.raises(ConfigError, match="FLOOR_MIN"):
        MoloraFactorialParams(FLOOR_MIN=0.3, FLOOR_MAX=0.1)
    with pytest.raises(ConfigError):
        corpus.load_documents("internet")


# --------------------------------------------------------------------------- metrics
def test_metrics():
    assert metrics.monopoly_count(torch.tensor([0.7, 0.2, 0.05, 0.05])) == 2
    assert metrics.monopoly_count(torch.full((16,), 1 / 16)) == 15  # 15/16 >= 0.9
    assert metrics.balanced_log_ppl({"a": 1.0, "b": 2.0, "c": 3.0}) == pytest.approx(2.0)
    assert metrics.delta(4.0, 3.9) == pytest.approx(0.1)
    assert metrics.routing_entropy(torch.full((4,), 0.25)) == pytest.approx(torch.log(torch.tensor(4.0)).item())
    specialised = torch.eye(3, 6)
    assert metrics.specialisation(specialised) == pytest.approx(torch.log(torch.tensor(3.0)).item(), abs=1e-5)
    assert metrics.specialisation(torch.full((3, 6), 1 / 6)) == pytest.approx(0.0, abs=1e-6)
    mass = torch.zeros(2, 3, 4)
    mass[0, :, 1] = 1
    mass[1, :, 3] = 1
    matrix = metrics.domain_slot_matrix(mass, torch.tensor([0, 1]), 2)
    assert matrix[0].tolist() == [0, 1, 0, 0] and matrix[1].tolist() == [0, 0, 0, 1]


# --------------------------------------------------------------------------- fitness + lifecycle
def test_leave_one_out_finds_the_only_useful_slot(sub):
    from copes_lib.molora.lm import eval_windows

    pool = AdapterPool(sub.model, PoolConfig(n_slots=3, rank=2), seed=0)
    try:
        _randomise_b(pool)  # slots 0 and 2 are random noise; slot 1 is switched off below
        with torch.no_grad():
            for key in pool.B:
                pool.B[key][1] = 0.0
        router = make_router(RouterConfig(kind="r0"), 32, 3)
        windows = eval_windows(sub.streams, "val", 2, 32)
        drops = fitness.leave_one_out_drops(sub.model, pool, router, windows)
    finally:
        pool.remove()
    assert drops.shape == (3, 3)
    assert drops[1].abs().max() < 1e-6  # removing an empty slot changes nothing
    assert fitness.scope_fitness(drops, "e1").shape == (3,)
    with pytest.raises(ValueError):
        fitness.scope_fitness(drops, "e2")


def test_lifecycle_event_kills_weakest_clones_best_and_resets_state(sub):
    pool = AdapterPool(sub.model, PoolConfig(n_slots=5, rank=2), seed=0)
    try:
        _randomise_b(pool)
        router = make_router(RouterConfig(kind="r1"), 32, 5)
        optimizer = SlotAdamW(list(pool.parameters()) + list(router.parameters()),
                              slot_dims=[*pool.slot_parameters(), *router_rows(router)])
        (pool.B[pool.keys["model.layers.0.self_attn.q_proj"]].sum() + router.proj.weight.sum()).backward()
        optimizer.step()
        fit = torch.tensor([0.5, -0.2, 0.9, -0.5, 0.1])
        ages = torch.tensor([10, 10, 10, 1, 10])  # slot 3 is weakest but within its grace period
        cfg = lifecycle.LifecycleConfig(deaths=2, grace_steps=5, inherit_alpha=0.5, mutation_scale=0.01)
        events = lifecycle.evolve(pool, router, optimizer, fit, ages, 10, cfg, torch.Generator().manual_seed(0))
        dead = sorted(e["slot"] for e in events if e["event"] == "death")
        assert dead == [1, 4]
        assert {e["event"] for e in events} == {"death", "inherit", "mutate", "realloc"}
        assert ages.tolist() == [10, 0, 10, 1, 0]
        # the last child is a small mutation of the (possibly inheritance-updated) best slot
        parent, child = pool.slot_delta(2), pool.slot_delta(events[-1]["slot"])
        for name in parent:
            cos = torch.nn.functional.cosine_similarity(child[name].flatten(), parent[name].flatten(), dim=0)
            assert cos > 0.9
        for slot in dead:
            key = pool.keys["model.layers.0.self_attn.q_proj"]
            assert optimizer.state[pool.B[key]]["exp_avg"][slot].abs().max() == 0
            assert optimizer.state[pool.B[key]]["step"][slot].item() == 0  # Adam restarts for the slot
            assert optimizer.state[router.proj.weight]["step"][slot].item() == 0
        survivors = [s for s in range(5) if s not in dead and s not in {e["into"] for e in events
                                                                          if e["event"] == "inherit"}]
        assert all(optimizer.state[pool.B[key]]["step"][s].item() == 1 for s in survivors)
        assert all(optimizer.state[router.proj.weight]["step"][s].item() == 1 for s in survivors)
        with pytest.raises(TypeError, match="SlotAdamW"):
            lifecycle.evolve(pool, router, torch.optim.AdamW(pool.parameters()), fit, torch.full((5,), 10),
                             11, cfg, torch.Generator().manual_seed(0))
            torch.testing.assert_close(router.proj.weight[slot], router.proj.weight[2], atol=0.05, rtol=0)
    finally:
        pool.remove()


# --------------------------------------------------------------------------- a cell + the factorial
def test_train_cell_is_seeded_and_logs(sub):
    params = MoloraFactorialParams(PROFILE="smoke", STEPS=4, LOG_EVERY=2, EVAL_WINDOWS=2, BATCH_PER_DOMAIN=1,
                                   N_SLOTS=4, RANK=2, GRACE_STEPS=0, DEATHS=1)
    cell = params.cell("r1", "e1", True, seed=0, life=params.life(), evolve_every=2, fitness_windows=1)
    first, second = train_cell(sub, cell), train_cell(sub, cell)
    assert first["balanced_log_ppl"] == second["balanced_log_ppl"]
    assert len(first["history"]) == 2 and any(e["event"] == "death" for e in first["events"])
    assert 1 <= first["monopoly_slots"] <= 4
    other = train_cell(sub, dataclasses.replace(cell, seed=1))
    assert other["balanced_log_ppl"] != first["balanced_log_ppl"]
    # per-window test NLLs: equally many per domain, domain-major, so a plain mean is the balanced log-PPL
    windows, n = first["window_nll"], first["windows_per_domain"]
    assert n >= 1 and len(windows) == n * len(sub.domains) == len(other["window_nll"])
    assert abs(float(np.mean(windows)) - first["balanced_log_ppl"]) < 1e-9
    for d, domain in enumerate(first["test_nll"]):
        assert float(np.mean(windows[d * n:(d + 1) * n])) == pytest.approx(first["test_nll"][domain], abs=1e-9)


def test_scope_is_inert_without_lifecycle():
    params = MoloraFactorialParams()
    a = params.cell("r1", "e0", False).effective()
    b = params.cell("r1", "e1", False, life=params.life(inherit_alpha=0.1)).effective()
    assert a == b
    assert params.cell("r1", "e1", True).effective().scope == "e1"


def test_paired_test_and_contrast_table():
    from scipy import stats

    ref, test = [4.0, 4.1, 4.2], [3.9, 4.05, 4.1]
    out = factorial.paired_test(test, ref)
    assert out["delta"] == pytest.approx(0.25 / 3)
    assert out["t"] == pytest.approx(stats.ttest_rel(ref, test).statistic)
    # the 95% interval is the paired t-interval: it excludes 0 exactly when p < 0.05
    diffs = [r - t for r, t in zip(ref, test)]
    half = stats.t.ppf(0.975, 2) * stats.tstd(diffs) / 3 ** 0.5
    assert (out["low"], out["high"]) == pytest.approx((0.25 / 3 - half, 0.25 / 3 + half))
    assert (out["low"] > 0) == (out["p"] < 0.05)
    assert factorial.paired_test([1.0, 2.0], [1.0, 2.0])["t"] is None  # zero variance: undefined, not inf
    rows = factorial.contrast_table({"B3": ref, "+R": test})
    assert [r["contrast"] for r in rows] == ["router"] and rows[0]["paper_delta_nats"] == 0.0426
    assert rows[0]["delta_low"] == pytest.approx(out["low"]) and rows[0]["delta_high"] == pytest.approx(out["high"])


def test_factorial_cells_share_cache_entries_with_notebook_11():
    from copes_lib.protocols.paper_b.molora_params import MoloraRouterParams

    cells = factorial.cell_configs(MoloraFactorialParams(), [0, 1, 2])
    assert list(cells) == ["B3", "+R", "+R+E", "+R+E+L", "+R+L (E0)", "B3 (collapsing)", "+R (collapsing)"]
    assert all(len(v) == 3 for v in cells.values())
    router_nb = MoloraRouterParams()
    assert cells["B3"][0].effective() == router_nb.cell("r0").effective()
    assert cells["+R"][0].effective() == router_nb.cell("r1").effective()
    assert cells["+R+E"][1].effective() == cells["+R"][1].effective()  # E is inert without L
    assert cells["+R+E+L"][0].effective() != cells["+R+L (E0)"][0].effective()
