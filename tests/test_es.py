"""ES / CoPES engine: synthetic fitness functions, tiny Qwen3 models, a local Ray cluster."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.es import ES, ESConfig, es_step, random_partition
from copes_lib.es_backends import make_backend
from copes_lib.es_objective import QuadraticObjective, toy_quadratic
from copes_lib.es_training import train_es
from copes_lib.protocols.histories import summarize
from copes_lib.training_run import BEST, LAST, SCORE, TrainingRun

torch.set_num_threads(1)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def cfg(**kw) -> ESConfig:
    base = dict(population=8, subspaces=1, sigma=0.1, alpha=0.05, chunk_size=64, seed=3)
    return ESConfig(**{**base, **kw})


# ----------------------------------------------------------------------------- progress and formulas
@pytest.mark.parametrize("k", [1, 4])
def test_es_and_copes_climb_a_quadratic(k):
    model, objective = toy_quadratic(seed=1)
    es = ES(model, cfg(population=16, subspaces=k, sigma=0.05, alpha=0.5))
    start = objective.fitness(model, 0)
    for step in range(1, 41):
        es_step(es, step, objective)
    assert objective.fitness(model, 0) > start + 0.3 * abs(start)


def reference_step(model, objective, es: ES, step: int) -> torch.Tensor:
    """Algorithm 1 with materialised full-length noise vectors, for comparison."""
    c, theta = es.config, flat(model)
    plan = es.plan(step)
    offsets = np.cumsum([0] + [p.numel() for p in model.parameters()])
    def eps(k, i):
        e = torch.zeros_like(theta)
        for ci in plan.partition[k]:
            ch = es.chunks[ci]
            e[offsets[ch.tensor] + ch.start: offsets[ch.tensor] + ch.stop] = es.noise(plan.seeds[k][i], ch)
        return e
    def fit(vec):
        target = torch.cat([t.reshape(-1) for t in objective.target])
        return float(-(vec - target).pow(2).sum() / len(vec))
    noises = [[eps(k, i) for i in range(c.members_per_subspace)] for k in range(c.subspaces)]
    r = np.array([[fit(theta + plan.sigma_k * e) for e in row] for row in noises])
    rhat = (r - r.mean()) / r.std()
    update = sum(float(rhat[k, i]) * noises[k][i] / c.members_per_subspace
                 for k in range(c.subspaces) for i in range(c.members_per_subspace))
    return theta + c.alpha * update


@pytest.mark.parametrize("k", [1, 2, 4])
def test_step_matches_algorithm_1(k):
    model, objective = toy_quadratic(seed=2)
    # seeded: the global RNG's state depends on which tests ran before in this worker
    torch.nn.init.normal_(model.tensors[0], generator=torch.Generator().manual_seed(7))
    es = ES(model, cfg(subspaces=k))
    before = flat(model)
    expected = reference_step(model, objective, es, step=5)
    result = es_step(es, 5, objective)
    # float32 perturb-and-restore of weights up to ~2 in size leaves ~1e-6 of rounding; a wrong step is ~1e-2
    assert torch.allclose(flat(model), expected, atol=1e-5)
    assert result.rewards.shape == (k, 8 // k)
    assert math.isclose(result.update_norm, (expected - before).norm().item(), rel_tol=1e-4)


def test_k1_is_standard_es_one_full_subspace():
    model, _ = toy_quadratic()
    es = ES(model, cfg(subspaces=1, sigma=0.02))
    plan = es.plan(1)
    assert plan.partition == [list(range(len(es.chunks)))] and plan.sigma_k == 0.02


def test_sigma_k_is_sqrt_k_sigma_and_only_s_k_moves():
    model, _ = toy_quadratic()
    es = ES(model, cfg(population=8, subspaces=4, sigma=0.01))
    plan = es.plan(1)
    assert math.isclose(plan.sigma_k, 0.02)
    before = [p.detach().clone() for p in model.parameters()]
    es.perturb(plan, 2, 1)
    inside = set(plan.partition[2])
    for ci, ch in enumerate(es.chunks):
        delta = (list(model.parameters())[ch.tensor].detach().reshape(-1) - before[ch.tensor].reshape(-1))
        delta = delta[ch.start:ch.stop]
        if ci in inside:
            assert torch.allclose(delta, 0.02 * es.noise(plan.seeds[2][1], ch), atol=1e-7)
        else:
            assert torch.equal(delta, torch.zeros_like(delta))


# ----------------------------------------------------------------------------- z-scores, std == 0
def test_joint_and_independent_zscores():
    model, _ = toy_quadratic()
    rewards = np.array([[0.0, 1.0], [10.0, 12.0]])
    joint = ES(model, cfg(population=4, subspaces=2)).standardize(rewards)
    assert np.allclose(joint, (rewards - rewards.mean()) / rewards.std())
    indep = ES(model, cfg(population=4, subspaces=2, zscore="independent")).standardize(rewards)
    assert np.allclose(indep, [[-1, 1], [-1, 1]])
    assert not np.allclose(joint, indep)


def test_equal_rewards_give_zero_update():
    model, _ = toy_quadratic()
    torch.nn.init.normal_(model.tensors[0])
    before = flat(model)

    class Constant(QuadraticObjective):
        def fitness(self, model, step):
            return 0.1

    result = es_step(ES(model, cfg(subspaces=2)), 1, Constant([]))
    assert torch.equal(flat(model), before) and result.update_norm == 0.0


# ----------------------------------------------------------------------------- noise and partitions
def test_iid_noise_differs_between_same_shaped_tensors_and_paper_correlated_does_not():
    model, _ = toy_quadratic()
    a, b = (ES(model, cfg(noise=mode, chunk_size=1024)) for mode in ("iid", "paper_correlated"))
    # tensors 0 and 1 are both 16 x 16: one chunk each
    assert not torch.equal(a.noise(7, a.chunks[0]), a.noise(7, a.chunks[1]))
    assert torch.equal(b.noise(7, b.chunks[0]), b.noise(7, b.chunks[1]))
    assert torch.equal(a.noise(7, a.chunks[0]), a.noise(7, a.chunks[0]))  # replayable
    assert not torch.equal(a.noise(7, a.chunks[0]), a.noise(8, a.chunks[0]))


def test_partition_equal_disjoint_covering_fresh_per_step_and_replayable():
    model, _ = toy_quadratic()
    es = ES(model, cfg(population=8, subspaces=4, chunk_size=16))
    p1, p1_again, p2 = es.plan(1).partition, es.plan(1).partition, es.plan(2).partition
    assert p1 == p1_again and p1 != p2
    for part in (p1, p2):
        assert sorted(c for s in part for c in s) == list(range(len(es.chunks)))
        sizes = [sum(es.chunks[c].size for c in s) for s in part]
        assert max(sizes) - min(sizes) <= 16 and min(sizes) > 0
    other_seed = ES(model, cfg(population=8, subspaces=4, chunk_size=16, seed=4)).plan(1).partition
    assert other_seed != p1


# ----------------------------------------------------------------------------- restore
def test_backup_restore_is_bit_exact_and_subtract_is_close():
    model, _ = toy_quadratic()
    torch.nn.init.normal_(model.tensors[0])
    before = flat(model)
    es = ES(model, cfg(subspaces=2, sigma=0.37))
    plan = es.plan(1)
    backup = es.backup()
    es.perturb(plan, 1, 0)
    assert not torch.equal(flat(model), before)
    es.restore(plan, 1, 0, backup)
    assert torch.equal(flat(model), before)
    es.perturb(plan, 1, 0)
    es.restore(plan, 1, 0, None)
    assert torch.allclose(flat(model), before, atol=1e-6)


def test_subtract_restore_gives_nearly_the_same_step():
    (m1, obj), (m2, _) = toy_quadratic(5), toy_quadratic(5)
    es_step(ES(m1, cfg(restore="backup")), 1, obj)
    es_step(ES(m2, cfg(restore="subtract")), 1, obj)
    assert torch.allclose(flat(m1), flat(m2), atol=1e-5)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, needle", [
    (dict(population=10, subspaces=4), "population = 10"),
    (dict(population=4, subspaces=4), "N_k"),
    (dict(sigma=0.0), "sigma = 0.0"),
    (dict(sigma=-1.0), "sigma = -1.0"),
    (dict(noise="gaussian"), "gaussian"),
])
def test_bad_config_raises_naming_the_value(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        cfg(**kw)


def test_nan_reward_raises_and_leaves_model_unchanged():
    model, _ = toy_quadratic()
    before = flat(model)

    class Bad(QuadraticObjective):
        calls = 0

        def fitness(self, model, step):
            Bad.calls += 1
            return float("nan") if Bad.calls == 3 else float(Bad.calls)

    with pytest.raises(ConfigError, match="nan"):
        es_step(ES(model, cfg()), 1, Bad([]))
    assert torch.equal(flat(model), before)


def test_fitness_exception_restores_model():
    model, _ = toy_quadratic()
    before = flat(model)

    class Boom(QuadraticObjective):
        def fitness(self, model, step):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        es_step(ES(model, cfg()), 1, Boom([]))
    assert torch.equal(flat(model), before)


def test_empty_subspace_raises_and_leaves_model_unchanged():
    model, objective = toy_quadratic(shapes=((4,), (4,)))
    before = flat(model)
    es = ES(model, cfg(population=8, subspaces=4, chunk_size=1024))  # 2 chunks for 4 subspaces
    with pytest.raises(ConfigError, match="empty subspace"):
        es_step(es, 1, objective)
    es = ES(model, cfg(population=4, subspaces=2, chunk_size=1024))
    with pytest.raises(ConfigError, match="subspace 1 is empty"):
        es_step(es, 1, objective, partition=[[0, 1], []])
    assert torch.equal(flat(model), before)
    with pytest.raises(ConfigError, match="empty subspace"):
        random_partition(es.chunks, 3, seed=0)


# ----------------------------------------------------------------------------- batched backend
def tiny_qwen(seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         tie_word_embeddings=True, max_position_embeddings=64,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    model = Qwen3ForCausalLM(config).eval()
    return model


class GreedyTokens:
    """Fitness = share of greedy tokens equal to a target token, on fixed prompts (a tiny rollout)."""

    def __init__(self, prompts: torch.Tensor, new_tokens: int = 5, target: int = 3):
        self.prompts, self.new_tokens, self.target = prompts, new_tokens, target
        self.last_tokens = None

    def rows_per_member(self, step):
        return len(self.prompts)

    @torch.no_grad()
    def generate(self, model, ids, row_hook=None):
        for _ in range(self.new_tokens):
            if row_hook is not None:
                row_hook(list(range(len(ids))))
            logits = model(input_ids=ids, use_cache=False).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        return ids[:, -self.new_tokens:]

    def fitness(self, model, step):
        tokens = self.generate(model, self.prompts)
        self.last_tokens = (self.last_tokens or []) + [tokens]
        return float((tokens == self.target).float().mean())

    def population_fitness(self, model, step, n_members, row_hook):
        tokens = self.generate(model, self.prompts.repeat(n_members, 1), row_hook)
        self.last_tokens = list(tokens.split(len(self.prompts)))
        return [float((t == self.target).float().mean()) for t in self.last_tokens]

    def validate(self, model):
        return {"score": self.fitness(model, 0)}


@pytest.mark.parametrize("members_per_batch", [0, 3])
def test_batched_matches_sequential_tokens_and_update(members_per_batch):
    prompts = torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(0))
    config = cfg(population=6, subspaces=2, sigma=0.2, alpha=0.1, chunk_size=256)
    seq_model, bat_model = tiny_qwen(), tiny_qwen()
    seq_obj, bat_obj = GreedyTokens(prompts), GreedyTokens(prompts)
    seq_es, bat_es = ES(seq_model, config), ES(bat_model, ESConfig(**{**config.to_dict(), "backend": "batched",
                                                                     "members_per_batch": members_per_batch}))
    for step in (1, 2):
        seq_obj.last_tokens, bat_obj.last_tokens = None, None
        r_seq = es_step(seq_es, step, seq_obj).rewards
        tokens_seq = list(seq_obj.last_tokens)
        bat_tokens = []
        backend = make_backend(bat_es)
        orig = bat_obj.population_fitness

        def spy(*a, _orig=orig, _sink=bat_tokens, **kw):
            out = _orig(*a, **kw)
            _sink.extend(bat_obj.last_tokens)
            return out
        bat_obj.population_fitness = spy
        r_bat = es_step(bat_es, step, bat_obj, backend).rewards
        bat_obj.population_fitness = orig
        assert all(torch.equal(a, b) for a, b in zip(tokens_seq, bat_tokens))
        assert len(bat_tokens) == 6 and np.array_equal(r_seq, r_bat)
        assert len(set(r_seq.ravel().tolist())) > 1  # the perturbations matter
    assert torch.allclose(flat(seq_model), flat(bat_model), atol=1e-6)
    # the patched forwards are gone afterwards
    assert "forward" not in vars(bat_model.lm_head)


def test_batched_logits_match_per_member_models():
    from copes_lib.population import Population

    model = tiny_qwen(1)
    es = ES(model, cfg(population=4, subspaces=2, sigma=0.3, chunk_size=128))
    plan = es.plan(1)
    members = plan.members()
    ids = torch.randint(0, 20, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stacked = es.member_weights(plan, members)
        with Population(model, stacked, rows_per_member=2) as pop:
            pop.row_hook(list(range(8)))
            batched = model(input_ids=ids.repeat(4, 1), use_cache=False).logits
        backup = es.backup()
        for g, (k, i) in enumerate(members):
            es.perturb(plan, k, i)
            single = model(input_ids=ids, use_cache=False).logits
            es.restore(plan, k, i, backup)
            assert torch.allclose(batched[2 * g: 2 * g + 2], single, atol=1e-5)


# ----------------------------------------------------------------------------- training loop, resume
def test_resume_after_interruption_is_identical(tmp_path):
    config = cfg(subspaces=2)

    def run(run_dir, stop_after=None):
        model, objective = toy_quadratic(7)

        def on_step(step, row):
            if stop_after is not None and step == stop_after:
                raise KeyboardInterrupt("simulated kill")
        try:
            history = train_es(model, objective, config, steps=5, val_every=2, run_dir=run_dir, on_step=on_step).history
        except KeyboardInterrupt:
            return None, None
        return model, history

    full_model, full_history = run(tmp_path / "a")
    assert run(tmp_path / "b", stop_after=2) == (None, None)
    resumed_model, resumed_history = run(tmp_path / "b")
    assert torch.equal(flat(full_model), flat(resumed_model))
    assert [r["reward/mean"] for r in full_history[1:]] == [r["reward/mean"] for r in resumed_history[1:]]
    summary = summarize(full_history, budget_step=4, metric=SCORE)  # the toy's score is no accuracy
    assert summary["steps"] == 5 and summary["best_step"] in (0, 2, 4, 5)
    assert summary["best_val_accuracy"] >= summary["base_val_accuracy"]
    assert set(full_history[1]) >= {"reward/mean", "reward/std", "es/update_norm", "es/update_norm_k0",
                                    "es/update_norm_k1", "time/step_s", "time/rollout_s", "mem/peak_gib"}
    assert SCORE in full_history[2] and "eval/val_accuracy" not in full_history[2]
    assert (tmp_path / "a" / BEST).exists() and (tmp_path / "a" / LAST).exists()


def test_es_run_bookkeeping_is_the_shared_one(tmp_path):
    """train_es keeps its folder with copes_lib.training_run: last.pt / best.pt, .curve() on eval/val_score,
    step 0 a candidate for the best checkpoint, and a ConfigError for a folder of another config."""
    model, objective = toy_quadratic(4)
    config = cfg(population=4, subspaces=2, sigma=0.1, alpha=0.05, chunk_size=64)
    run = train_es(model, objective, config, steps=3, val_every=2, run_dir=tmp_path)
    assert isinstance(run, TrainingRun) and run.last_path == tmp_path / LAST
    assert run.curve() == ([0, 2, 3], [row[SCORE] for row in run.history if SCORE in row])
    assert run.best_step == max(run.val_by_step, key=lambda s: (run.val_by_step[s], -s))
    with pytest.raises(ConfigError, match="different ESConfig"):
        train_es(toy_quadratic(4)[0], objective, cfg(population=4, subspaces=2, sigma=0.2, chunk_size=64), steps=3,
                 val_every=2, run_dir=tmp_path)


# ----------------------------------------------------------------------------- ray
def test_ray_backend_gives_the_same_update_as_sequential():
    pytest.importorskip("ray")
    config = cfg(subspaces=2)
    seq_model, objective = toy_quadratic(9)
    seq_es = ES(seq_model, config)
    from ray_local import isolated_ray

    with isolated_ray(prefix="ray_es_"):  # a cluster of its own: never another Ray user's (tests/ray_local.py)
        ray_model, _ = toy_quadratic(9)
        ray_es = ES(ray_model, ESConfig(**{**config.to_dict(), "backend": "ray", "ray_workers": 2}))
        backend = make_backend(ray_es, worker_factory=functools.partial(toy_quadratic, 9))
        for step in (1, 2):
            a = es_step(seq_es, step, objective)
            b = es_step(ray_es, step, objective, backend)  # after_update checks the replicas' checksums
            assert np.array_equal(a.rewards, b.rewards)
        backend.close()
    assert torch.equal(flat(seq_model), flat(ray_model))



def test_batched_rollout_gives_the_same_tokens_as_sequential_rollouts():
    """The real agent rollout (rows leave the batch as they finish, tools run between turns)."""
    from copes_lib.population import Population
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.rollout import RolloutConfig, make_env, rollout
    from copes_lib.substrate import build_agent_model, get_tokenizer
    from copes_lib.tasks import load_tasks

    tokenizer = get_tokenizer("smoke", substrate_config("smoke").vocab_size)
    model = build_agent_model("smoke", len(tokenizer), seed=0, max_positions=256, tokenizer=tokenizer).eval()
    tasks = load_tasks("smoke", "qa", "train")[:3]
    config = RolloutConfig(max_new_tokens=12, max_context=256, prompt_style="plain")
    es = ES(model, cfg(population=4, subspaces=2, sigma=0.5, chunk_size=2048))
    plan = es.plan(1)
    with make_env("qa", "smoke") as env, torch.no_grad():
        backup, sequential = es.backup(), []
        for k, i in plan.members():
            es.perturb(plan, k, i)
            sequential += rollout(model, tokenizer, tasks, env, config).completion_ids
            es.restore(plan, k, i, backup)
        with Population(model, es.member_weights(plan, plan.members()), rows_per_member=3) as pop:
            batched = rollout(model, tokenizer, tasks * 4, env, config, row_hook=pop.row_hook).completion_ids
    assert batched == sequential
    assert len({tuple(c) for c in sequential}) > 3  # members generate different trajectories


def test_population_handles_interleaved_and_uneven_rows():
    """Rows of a call need not be grouped by member, nor equal in number per member."""
    from copes_lib.population import Population

    model = tiny_qwen(2)
    es = ES(model, cfg(population=4, subspaces=2, sigma=0.3, chunk_size=128))
    plan = es.plan(1)
    members = plan.members()
    ids = torch.randint(0, 20, (5, 6), generator=torch.Generator().manual_seed(2))
    rows = [0, 5, 1, 9, 6]  # members (rows_per_member=4): 0, 1, 0, 2, 1
    with torch.no_grad():
        with Population(model, es.member_weights(plan, members), rows_per_member=4) as pop:
            pop.row_hook(rows)
            batched = model(input_ids=ids, use_cache=False).logits
        backup = es.backup()
        for pos, row in enumerate(rows):
            k, i = members[row // 4]
            es.perturb(plan, k, i)
            single = model(input_ids=ids[pos:pos + 1], use_cache=False).logits
            es.restore(plan, k, i, backup)
            assert torch.allclose(batched[pos:pos + 1], single, atol=1e-5)


def test_a_truncated_best_checkpoint_stops_clearly_and_the_run_heals(tmp_path):
    """Issue 33: a damaged best.pt of a finished ES run raised a bare TypeError on every later run. Now the
    read names the file and the command, resets the run (it is no longer finished) and a rerun retrains."""
    from copes_lib import runs
    from copes_lib.protocols.paper_a.es_arm import ESRun

    model, objective = toy_quadratic(4)
    config = cfg(population=4, subspaces=2, sigma=0.1, alpha=0.05, chunk_size=64)
    first = train_es(model, objective, config, steps=3, val_every=2, run_dir=tmp_path)
    run = ESRun("es", config, first.history, tmp_path)
    good = run.weights("best")
    best = tmp_path / BEST
    best.write_bytes(best.read_bytes()[:200])
    with pytest.raises(runs.CorruptCacheError, match=f"{best} is damaged.*rerun its notebook"):
        run.weights("best")
    assert not best.exists() and not (tmp_path / LAST).exists()  # the run is no longer finished
    again = train_es(toy_quadratic(4)[0], objective, config, steps=3, val_every=2, run_dir=tmp_path)
    assert [r["step"] for r in again.history] == [0, 1, 2, 3]
    healed = ESRun("es", config, again.history, tmp_path).weights("best")
    assert all(torch.equal(healed[k], good[k]) for k in good)  # the same run again (deterministic)
