"""The directions notebook 09's mechanism test measures (``mechanism.es_update_vector``,
``mechanism.grpo_direction``), on the toy quadratic and a toy GRPO sampler:

- the ES vector is exactly the step ``es.es_step`` applies, and measuring it leaves the model unchanged;
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
from copes_lib import mechanism as mech
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
    before = mech.flat_parameters(model)
    vector, rewards = mech.es_update_vector(model, objective, config, step=3)
    assert torch.equal(mech.flat_parameters(model), before)
    assert rewards.shape == (subspaces, 8 // subspaces)
    trained = copy.deepcopy(model)
    result = es_engine.es_step(es_engine.ES(trained, config), 3, objective)
    torch.testing.assert_close(mech.flat_parameters(trained) - before, vector, rtol=0, atol=1e-6)
    assert math.isclose(float(vector.norm()), result.update_norm, rel_tol=1e-5)


def _toy_direction(model, seed: int, group: int):
    return mech.grpo_direction(model, None, None, list(range(4)), ToyRolloutConfig(), group_size=group, seed=seed,
                             micro_batch_size=8, rollout_fn=toy_rollout)


def _sampled_reward(model, n: int = 2048) -> float:
    return float(np.mean(toy_rollout(model, None, list(range(n)), None, ToyRolloutConfig(), seed=99).rewards))


def test_grpo_direction_ascends_the_sampled_reward_and_leaves_weights_alone():
    model = tiny_model()
    before = mech.flat_parameters(model)
    direction, stats = _toy_direction(model, seed=0, group=32)
    assert torch.equal(mech.flat_parameters(model), before)
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


def pairwise_cosines(vectors: list[torch.Tensor]) -> list[float]:
    """cos of every pair (float64), skipping zero vectors."""
    unit = [v.double() / v.double().norm() for v in vectors if float(v.norm()) > 0]
    return [float(unit[i] @ unit[j]) for i in range(len(unit)) for j in range(i + 1, len(unit))]


def test_grpo_estimates_agree_more_with_more_samples():
    model = tiny_model()
    small = [_toy_direction(model, seed=s, group=2)[0] for s in range(4)]
    large = [_toy_direction(model, seed=s, group=64)[0] for s in range(4)]
    small_agree = np.mean(pairwise_cosines(small))
    large_agree = np.mean(pairwise_cosines(large))
    assert large_agree > small_agree + 0.1
