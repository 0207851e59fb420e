"""Low-rank ES noise (ESConfig.noise_rank, copes_lib.lowrank): members equal the dense model perturbed by
the same E_i on Qwen3, Qwen3.5 and Llama; seeds replay; batched = sequential; frozen vectors; bad input."""

import copy

import numpy as np
import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.es import ES, ESConfig, es_step
from copes_lib.es_backends import make_backend
from copes_lib.lowrank import LowRankPopulation, matrix_names
from tests.test_es import GreedyTokens, flat, tiny_qwen

VOCAB = 20


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def tiny_qwen35(seed=0):
    from copes_lib.engines import build_qwen35

    return build_qwen35("tiny", VOCAB, seed)


ARCHS = {"qwen3": tiny_qwen, "qwen3_5": tiny_qwen35, "llama": tiny_llama}


def lowrank(**kw):
    base = dict(population=4, subspaces=2, sigma=0.3, alpha=0.1, chunk_size=256, noise_rank=2)
    return ESConfig(**{**base, **kw})


def batched_logits(es, plan, members, ids):
    rows = len(ids)
    pop = LowRankPopulation(es.model, es.member_factors(plan, members), plan.sigma_k / es.config.noise_rank ** 0.5,
                            rows)
    with torch.no_grad(), pop:
        pop.row_hook(list(range(rows * len(members))))
        return es.model(input_ids=ids.repeat(len(members), 1), use_cache=False).logits


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("subspaces", [1, 2])
def test_member_forward_equals_dense_perturbed_model(arch, subspaces):
    model = ARCHS[arch](1)
    es = ES(model, lowrank(subspaces=subspaces, sigma=0.01))
    plan = es.plan(1)
    members = plan.members()
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    batched = batched_logits(es, plan, members, ids)
    backup = es.backup()
    before = flat(model).clone()
    with torch.no_grad():
        clean = model(input_ids=ids, use_cache=False).logits
        for g, (k, i) in enumerate(members):
            # the dense reference: W + sigma_k A B^T / sqrt(r), built here from the factors
            dense = copy.deepcopy(model)
            names = matrix_names(model)
            for j, (p, q) in enumerate(zip(model.parameters(), dense.parameters())):
                if id(p) not in names:
                    continue
                a, b = es.factors(plan.seeds[k][i], j)
                rows = torch.zeros(p.shape[0], dtype=torch.bool)
                for c in plan.partition[k]:
                    chunk = es.chunks[c]
                    if chunk.tensor == j:
                        rows[chunk.start // p.shape[1]: chunk.stop // p.shape[1]] = True
                q.data.add_((a * rows.unsqueeze(1)) @ b.T, alpha=plan.sigma_k / 2 ** 0.5)
            reference = dense(input_ids=ids, use_cache=False).logits
            es.perturb(plan, k, i)  # the engine's own in-place member (sequential backend)
            single = model(input_ids=ids, use_cache=False).logits
            es.restore(plan, k, i, backup)
            assert torch.allclose(single, reference, atol=1e-5)
            assert torch.allclose(batched[2 * g: 2 * g + 2], reference, atol=1e-5)
            assert not torch.allclose(reference, clean, atol=1e-3)  # the member differs from theta
    assert torch.equal(flat(model), before)
    # rows in another order, and a subset of the members: each row still gets its member's noise
    order = torch.randperm(2 * len(members), generator=torch.Generator().manual_seed(3))
    pop = LowRankPopulation(model, es.member_factors(plan, members), plan.sigma_k / 2 ** 0.5, 2)
    with torch.no_grad(), pop:
        pop.row_hook(order.tolist())
        shuffled = model(input_ids=ids.repeat(len(members), 1)[order], use_cache=False).logits
        pop.row_hook([2, 3, 6, 7])  # members 1 and 3
        subset = model(input_ids=ids.repeat(2, 1), use_cache=False).logits
    assert torch.allclose(shuffled, batched[order], atol=1e-5)
    assert torch.allclose(subset, torch.cat([batched[2:4], batched[6:8]]), atol=1e-5)


def test_seeds_replay_and_tensors_differ():
    model = tiny_qwen(0)
    a1, b1 = ES(model, lowrank()).factors(123, 1)
    a2, b2 = ES(copy.deepcopy(model), lowrank()).factors(123, 1)
    assert torch.equal(a1, a2) and torch.equal(b1, b2)
    es = ES(model, lowrank())
    shapes = [p.shape for p in es.params]
    same = [j for j in es.lowrank if shapes[j] == shapes[1] and j != 1]
    assert same, "the tiny model has same-shaped matrices"
    assert not torch.equal(es.factors(123, same[0])[0], a1)  # iid: same-shaped tensors differ
    corr = ES(copy.deepcopy(model), lowrank(noise="paper_correlated"))
    assert torch.equal(corr.factors(123, same[0])[0], corr.factors(123, 1)[0])
    # a step is a function of (config, step): two runs give the same weights
    runs = []
    for _ in range(2):
        m = tiny_qwen(0)
        obj = GreedyTokens(torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(0)))
        e = ES(m, lowrank(backend="batched"))
        es_step(e, 1, obj, make_backend(e))
        runs.append(flat(m))
    assert torch.equal(runs[0], runs[1])


def test_vectors_frozen_and_update_is_full_rank():
    model = tiny_qwen35(0)
    before = [p.detach().clone() for p in model.parameters()]
    es = ES(model, lowrank(subspaces=1, population=6))
    names = matrix_names(model)
    plan = es.plan(1)
    rhat = np.array([[1.0, -1.0, 0.5, -0.5, 2.0, -2.0]])
    expected = {}
    for j in es.lowrank:
        a_b = [es.factors(plan.seeds[0][i], j) for i in range(6)]
        expected[j] = sum(float(rhat[0][i]) * (a @ b.T) for i, (a, b) in enumerate(a_b)) * (0.1 / 6 / 2 ** 0.5)
    es.update(plan, rhat)
    for j, p in enumerate(model.parameters()):
        if j in expected:  # the one-matmul update = alpha / N sum_i r_hat_i E_i
            assert torch.allclose(p - before[j], expected[j], atol=1e-6)
    changed_matrix = False
    for p, b in zip(model.parameters(), before):
        if id(p) in names:
            changed_matrix |= not torch.equal(p, b)
            if min(p.shape) >= 6:
                # a sum of 6 rank-2 terms: rank 12 (or full), more than one member's rank
                assert torch.linalg.matrix_rank(p - b) > es.config.noise_rank
        else:
            assert torch.equal(p, b), "vectors / norms / conv1d are frozen in low-rank mode"
    assert changed_matrix


def test_batched_equals_sequential_steps():
    prompts = torch.randint(0, VOCAB, (4, 6), generator=torch.Generator().manual_seed(0))
    seq_model, bat_model = tiny_qwen(), tiny_qwen()
    seq_es, bat_es = ES(seq_model, lowrank(population=6)), ES(bat_model, lowrank(population=6, backend="batched",
                                                                                 members_per_batch=4))
    seen = []
    for step in (1, 2):
        r_seq = es_step(seq_es, step, GreedyTokens(prompts, target=13)).rewards
        r_bat = es_step(bat_es, step, GreedyTokens(prompts, target=13), make_backend(bat_es)).rewards
        assert np.array_equal(r_seq, r_bat)
        seen += r_seq.ravel().tolist()
    assert len(set(seen)) > 1  # the perturbations matter
    assert not torch.equal(flat(seq_model), flat(tiny_qwen()))  # and the steps moved the weights
    assert torch.allclose(flat(seq_model), flat(bat_model), atol=1e-6)
    assert "forward" not in vars(bat_model.lm_head)


def test_full_rank_default_untouched():
    assert ESConfig().noise_rank == 0
    # full-rank configs serialise as before the option existed (cache keys, checkpoints' saved config)
    assert "noise_rank" not in ESConfig().to_dict() and lowrank().to_dict()["noise_rank"] == 2
    assert ESConfig(**lowrank().to_dict()) == lowrank()
    model = tiny_qwen(0)
    es = ES(model, ESConfig(population=4, subspaces=1, chunk_size=256))
    assert not es.lowrank and sum(c.size for c in es.chunks) == sum(p.numel() for p in es.params)


def test_bad_rank_and_backend():
    with pytest.raises(ConfigError, match=r"noise_rank = 17 exceeds min\(out, in\) = 16 .*valid range.*1\.\.16"):
        ES(tiny_qwen(0), lowrank(noise_rank=17))
    with pytest.raises(ConfigError, match=r"noise_rank = 2 with backend = 'ray'.*valid noise_rank with 'ray': 0"):
        lowrank(backend="ray")
    with pytest.raises(ConfigError, match="noise_rank"):
        lowrank(noise_rank=-1)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_agent_rollouts_batched_equal_sequential(family):
    """Through the real agent rollout (prompts of different lengths; Qwen3.5's row-exact linear attention
    calls row_hook per row group): every member's completions equal the sequential member's."""
    import zlib

    from copes_lib.engines import build_qwen35
    from copes_lib.es_objective import AgentObjective
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.rollout import RolloutConfig, make_env
    from copes_lib.substrate import build_agent_model, get_tokenizer
    from copes_lib.tasks import load_tasks

    tok = get_tokenizer("smoke", substrate_config("smoke").vocab_size)
    env = make_env("math", "smoke")
    env.reward = lambda prompts, texts, answers, calls: [zlib.crc32(t.encode()) % 97 / 97 for t in texts]
    tasks = load_tasks("smoke", "math", "train")
    completions = {}
    weights = {}
    try:
        for backend in ("sequential", "batched"):
            model = (build_agent_model("smoke", len(tok), 0, 512, tok) if family == "qwen3"
                     else build_qwen35("tiny", len(tok), 0, tokenizer=tok)).eval()
            objective = AgentObjective(tok, env, tasks, tasks[:2], RolloutConfig(max_new_tokens=6), 3, 5)
            seen = completions[backend] = []
            generate = objective._generate

            def spy(*a, _generate=generate, _seen=seen, **kw):
                out = _generate(*a, **kw)
                _seen.extend(out.completion_ids)
                return out
            objective._generate = spy
            es = ES(model, lowrank(population=4, sigma=0.05, backend=backend))
            rewards = es_step(es, 1, objective, make_backend(es)).rewards
            weights[backend] = flat(model)
            assert len(set(rewards.ravel().tolist())) > 1
    finally:
        env.close()
    assert completions["sequential"] == completions["batched"] and len(completions["batched"]) == 12
    assert torch.allclose(weights["sequential"], weights["batched"], atol=1e-6)


def test_notebooks_offer_noise_rank():
    from copes_lib.protocols import params

    for cls in (params.StandardESNotebookParams, params.CoPESNotebookParams, params.FixedBudgetParams):
        assert cls().es_config().noise_rank == 0  # the paper's full-rank noise by default
        assert cls(NOISE_RANK=4).es_config().noise_rank == 4
    assert params.AblationParams().es_config().noise_rank == 0  # 06 keeps full rank (not a parameter there)
    with pytest.raises(ConfigError, match=r"NOISE_RANK = 2 with BACKEND = 'ray'.*valid noise_rank with 'ray': 0"):
        params.CoPESNotebookParams(NOISE_RANK=2, BACKEND="ray")
    with pytest.raises(ConfigError, match="NOISE_RANK"):
        params.FixedBudgetParams(NOISE_RANK=-1)


def test_copes_update_touches_each_subspace_s_rows_only():
    model = tiny_qwen(3)
    before = [p.detach().clone() for p in model.parameters()]
    es = ES(model, lowrank(population=4, subspaces=2, chunk_size=64))
    plan = es.plan(2)
    rhat = np.array([[1.0, -1.0], [0.5, -2.0]])
    expected = [torch.zeros_like(b) for b in before]
    for k, chunk_ids in enumerate(plan.partition):
        for c in chunk_ids:
            chunk = es.chunks[c]
            in_f = before[chunk.tensor].shape[1]
            rows = slice(chunk.start // in_f, chunk.stop // in_f)
            for i in range(2):
                a, b = es.factors(plan.seeds[k][i], chunk.tensor)
                expected[chunk.tensor][rows] += float(rhat[k][i]) * (a[rows] @ b.T) * (0.1 / 2 / 2 ** 0.5)
    norms = es.update(plan, rhat)
    for p, b, e in zip(model.parameters(), before, expected):
        assert torch.allclose(p - b, e, atol=1e-6)
    assert len(norms) == 2 and all(n > 0 for n in norms)
    assert np.isclose(np.hypot(*norms), float(torch.cat([e.view(-1) for e in expected]).norm()), rtol=1e-4)
