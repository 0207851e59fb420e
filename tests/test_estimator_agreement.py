"""Estimator agreement: on the toy quadratic (truth known) and a toy GRPO sampler.

- the vector is exactly the step ``es.es_step`` applies, and measuring it leaves the model unchanged;
- ES and CoPES estimates align better with the true gradient, and two independent estimates agree
  more, as the population grows;
- the GRPO direction is an ascent direction of the sampled reward and agrees with itself more with
  more samples.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from copes_lib import es as es_engine
from copes_lib import estimator_agreement as ea
from copes_lib.es_objective import toy_quadratic

# the ~19K-parameter Qwen3 and the toy sampler of the GRPO tests (prompt -> 3 model tokens, a masked tool
# token, 2 model tokens; reward = share of TARGET_TOKEN)
from tests.test_grpo import ToyRolloutConfig, tiny_model, toy_rollout


def toy_config(population: int, subspaces: int = 1, seed: int = 33) -> es_engine.ESConfig:
    return es_engine.ESConfig(population=population, subspaces=subspaces, sigma=0.1, alpha=0.05, chunk_size=16,
                              backend="sequential", seed=seed)


@pytest.mark.parametrize("subspaces", [1, 4])
def test_vector_is_the_step_es_applies_and_model_is_unchanged(subspaces):
    model, objective = toy_quadratic(seed=1)
    config = toy_config(8, subspaces)
    before = ea.flat_parameters(model)
    vector, rewards = ea.es_update_vector(model, objective, config, step=3)
    assert torch.equal(ea.flat_parameters(model), before)
    assert rewards.shape == (subspaces, 8 // subspaces)
    trained = copy.deepcopy(model)
    result = es_engine.es_step(es_engine.ES(trained, config), 3, objective)
    torch.testing.assert_close(ea.flat_parameters(trained) - before, vector, rtol=0, atol=1e-6)
    assert math.isclose(float(vector.norm()), result.update_norm, rel_tol=1e-5)


def _mean_cosines(population: int, subspaces: int, populations: int = 4) -> tuple[float, float]:
    model, objective = toy_quadratic(seed=2)
    truth = ea.true_gradient_quadratic(model, objective)
    arm = ea.Arm("x", toy_config(population, subspaces))
    pops = ea.population_estimates(model, objective, arm, step=1, populations=populations, seed=5)
    (row,) = ea.summarize_agreement({"x": pops}, [truth])
    return row["cos_reference"], row["agreement"]


@pytest.mark.parametrize("subspaces", [1, 4])
def test_estimates_align_with_truth_and_agree_more_as_population_grows(subspaces):
    small_truth, small_agree = _mean_cosines(8, subspaces)
    large_truth, large_agree = _mean_cosines(128, subspaces)
    assert large_truth > small_truth + 0.1
    assert large_agree > small_agree + 0.05
    # with d = 528 coordinates and N = 128 members, the estimate carries real signal
    assert large_truth > 0.3


def test_summary_rows_count_pairs_and_skip_zero_vectors():
    a, b, zero = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]), torch.zeros(2)
    rows = ea.summarize_agreement({"x": [{"vector": a, "norm": 1.0}, {"vector": b, "norm": math.sqrt(2)},
                                         {"vector": zero, "norm": 0.0}]}, [a, b])
    x, ref = rows
    assert x["n_pairs"] == 1 and math.isclose(x["agreement"], 1 / math.sqrt(2))
    assert x["n_reference"] == 4 and ref["arm"] == "reference" and math.isclose(ref["agreement"], 1 / math.sqrt(2))
    assert math.isnan(ea.cosine(zero, a))


def _toy_direction(model, seed: int, group: int):
    return ea.grpo_direction(model, None, None, list(range(4)), ToyRolloutConfig(), group_size=group, seed=seed,
                             micro_batch_size=8, rollout_fn=toy_rollout)


def _sampled_reward(model, n: int = 2048) -> float:
    return float(np.mean(toy_rollout(model, None, list(range(n)), None, ToyRolloutConfig(), seed=99).rewards))


def test_grpo_direction_ascends_the_sampled_reward_and_leaves_weights_alone():
    model = tiny_model()
    before = ea.flat_parameters(model)
    direction, stats = _toy_direction(model, seed=0, group=32)
    assert torch.equal(ea.flat_parameters(model), before)
    assert all(p.grad is None for p in model.parameters())
    assert 0.0 <= stats["zero_std_group_frac"] < 1.0 and direction.norm() > 0
    stepped = copy.deepcopy(model)
    with torch.no_grad():
        offset = 0
        for p in stepped.parameters():
            n = p.numel()
            p.add_(2.0 * direction[offset:offset + n].view_as(p) / direction.norm())
            offset += n
    assert _sampled_reward(stepped) > _sampled_reward(model) + 0.02


def test_grpo_estimates_agree_more_with_more_samples():
    model = tiny_model()
    small = [_toy_direction(model, seed=s, group=2)[0] for s in range(4)]
    large = [_toy_direction(model, seed=s, group=64)[0] for s in range(4)]
    small_agree = np.nanmean(ea.pairwise_cosines(small))
    large_agree = np.nanmean(ea.pairwise_cosines(large))
    assert large_agree > small_agree + 0.1
