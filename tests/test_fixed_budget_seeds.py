"""Notebook 05's references with every seed (docs/reference.md R4): full GRPO's reference seeds are
notebook 04's cached runs (same configurations), every gain recovery divides by their mean best,
LoRA-GRPO at the budget runs LORA_SEEDS seeds, and the reference's seed noise widens the interval."""
import dataclasses
import math

import numpy as np
import pytest
from test_protocols import _history, _run

from copes_lib import stats
from copes_lib.config import ConfigError
from copes_lib.protocols import params
from copes_lib.protocols.paper_a import es_arm, fixed_budget, grpo_arm


def _grpo(points, seed):
    h = _history(points)
    return grpo_arm.GRPORun(f"grpo seed {seed}", h, dict(points), None, None, None, None, seed)


@pytest.fixture
def fake_training(monkeypatch):
    """run_fixed_budget on scripted histories: full GRPO seed i peaks at REFERENCE[i]; ES and CoPES at 0.5."""
    configs = []
    reference = [0.8, 0.6, 0.7]

    def grpo_run(profile, agent, config, *, label, force=False, **_):
        configs.append(config)
        i = config.seed - configs[0].seed
        if config.use_lora:
            return _grpo({0: 0.4, config.total_steps: 0.45 + 0.05 * i}, config.seed)
        return _grpo({0: 0.4, 4: reference[i], 8: reference[i] - 0.1}, config.seed)

    def seed_runs(p, agent, *, steps, seeds=None, **_):
        return [_run({0: 0.4, steps: 0.5}, i) for i in range(seeds or p.SEEDS)]

    monkeypatch.setattr(fixed_budget, "grpo_run", grpo_run)
    monkeypatch.setattr(fixed_budget, "seed_runs", seed_runs)
    monkeypatch.setattr(fixed_budget, "peak_report", lambda run: {
        "peak_step": run.best_step, "last_step": 8, "stopped_early": True, "peak_censored": False})
    monkeypatch.setattr(fixed_budget, "continue_runs", lambda p, agent, rs, steps: [
        _run({0: 0.4, 4: 0.5, steps: 0.6}, r.seed_index) for r in rs])
    return configs, reference


def _p():
    return params.FixedBudgetParams(PROFILE="smoke", SEEDS=2, CONTROL_SEEDS=1, LONG_SEEDS=1, BUDGET_STEPS=4,
                                    ES_LONG_STEPS=8, VAL_EVERY=4)


SETTINGS = {"es_sigma": 0.01, "es_alpha": 0.005, "full_lr": 1e-4, "lora_lr": 1e-3}


def test_every_reference_seed_enters_the_gain_recovery(fake_training):
    configs, reference = fake_training
    p = _p()
    arms = {"paper": ("CoPES", 0.01, 0.005)}
    one = fixed_budget.run_fixed_budget(p, None, SETTINGS, grpo_steps=8, copes_arms=arms)
    assert len(one.full_seeds) == 1 and one.reference_best == one.grpo_best == pytest.approx(0.8)
    configs.clear()
    three = fixed_budget.run_fixed_budget(p, None, SETTINGS, grpo_steps=8, copes_arms=arms, reference_seeds=3)
    # the same configurations notebook 04's seed_runs trains (so 05 reuses its cache), seed i = GRPO_SEED + i
    g = grpo_arm.grpo_params("smoke")
    assert configs == [g.grpo_config(False, lr=1e-4, steps=8, seed_index=i) for i in range(3)]
    assert three.s_star == 4 and three.grpo_best == pytest.approx(0.8)  # seed 0 sets the budget
    assert three.reference_best == pytest.approx(np.mean(reference))
    c = three.compare["paper"]
    assert c["gain_recovery_copes"] == pytest.approx((0.5 - 0.4) / (np.mean(reference) - 0.4))
    assert one.compare["paper"]["gain_recovery_copes"] == pytest.approx(0.25)
    with pytest.raises(ConfigError, match="reference_seeds"):
        fixed_budget.run_fixed_budget(p, None, SETTINGS, grpo_steps=8, copes_arms=arms, reference_seeds=0)


def test_lora_runs_seeds_and_the_summary_means(fake_training):
    configs, reference = fake_training
    p = _p()
    frb = fixed_budget.run_fixed_budget(p, None, SETTINGS, grpo_steps=8, copes_arms={"paper": ("CoPES", 0.01, 0.005)},
                                        reference_seeds=3)
    configs.clear()
    loras = fixed_budget.lora_runs(p, None, frb, SETTINGS)
    assert len(loras) == grpo_arm.grpo_params("smoke").LORA_SEEDS >= 3
    assert all(c.use_lora and c.total_steps == frb.budget and c.early_stop_patience == 0 for c in configs)
    assert [c.seed for c in configs] == [configs[0].seed + i for i in range(len(loras))]
    with pytest.raises(ConfigError, match="seeds"):
        fixed_budget.lora_runs(p, None, frb, SETTINGS, seeds=0)
    summary = fixed_budget.math_summary(
        dataclasses.replace(p, HEADLINE="paper"), frb, {**SETTINGS, "es_source": "p", "copes_sigma": 0.01,
                                                        "copes_alpha": 0.005, "copes_source": "p", "grpo_source": "p"},
        lora=loras, es_best=(8, 0.6), pass1={}, step_hours=(1.0, 1.0), n_val=8, n_test=8, budget_note="")
    lora_vals = [0.45 + 0.05 * i for i in range(len(loras))]
    assert summary["val_accuracy_lora_grpo_at_budget_seeds"] == pytest.approx(lora_vals)
    assert summary["gain_recovery_lora_grpo"] == pytest.approx((np.mean(lora_vals) - 0.4) / (np.mean(reference) - 0.4))
    assert summary["full_grpo_best_val_accuracy_seeds"] == pytest.approx(reference)
    assert summary["full_grpo_n_seeds"] == 3 and summary["full_grpo_best_val_accuracy"] == pytest.approx(0.8)
    assert summary["full_grpo_reference_val_accuracy"] == pytest.approx(np.mean(reference))


def test_the_references_seed_noise_widens_the_recovery_interval():
    rng = np.random.default_rng(0)
    p = 200
    base = (rng.random((1, p)) < 0.3).astype(float)
    method = (rng.random((3, p)) < 0.5).astype(float)
    noisy_ref = np.stack([(rng.random(p) < q).astype(float) for q in (0.6, 0.9, 0.75)])
    # the same reference mean either way: one row of each problem's seed mean, or the three seeds' rows
    one = stats.ScoreSet("m", {"base": base, "copes": method, "full_grpo": noisy_ref.mean(axis=0, keepdims=True)},
                         {"base": (0,), "copes": (33, 34, 35), "full_grpo": (42,)})
    three = dataclasses.replace(one, arms={**one.arms, "full_grpo": noisy_ref}, seeds={**one.seeds,
                                                                                     "full_grpo": (42, 43, 44)})
    g1, g3 = stats.gain_recovery_interval(one, "copes"), stats.gain_recovery_interval(three, "copes")
    assert "full_grpo ran 1 seed" in g1.note and "ran 1 seed" not in g3.note
    assert g3.estimate == pytest.approx(g1.estimate)
    assert (g3.high - g3.low) > (g1.high - g1.low)


def test_es_run_fake_is_an_esrun():  # the fakes above stand for the real run types
    assert isinstance(_run({0: 0.4, 4: 0.5}), es_arm.ESRun)


def test_the_norm_matched_control_is_es_at_sqrt_k_alpha_over_every_seed(monkeypatch):
    calls = []
    monkeypatch.setattr(fixed_budget, "seed_runs", lambda p, agent, **kw: calls.append(kw) or [])
    p = params.MultihopQAParams(PROFILE="smoke")
    fixed_budget.norm_matched_runs(p, None, SETTINGS, 4)
    (kw,) = calls
    assert kw["subspaces"] == 1 and kw["sigma"] == SETTINGS["es_sigma"] and kw["steps"] == 4
    assert kw["alpha"] == pytest.approx(math.sqrt(p.SUBSPACES) * SETTINGS["es_alpha"])
    assert kw.get("seeds") is None  # SEEDS: as many as ES and CoPES
