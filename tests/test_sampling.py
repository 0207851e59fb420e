"""One prompt sampler and one seed scheme for ES and GRPO (issue 25)."""

import pytest

from copes_lib import es_objective, grpo, sampling


def test_an_epoch_uses_every_prompt_once_and_depends_only_on_seed_and_step():
    tasks = list(range(12))
    epoch = [t for step in (1, 2, 3) for t in sampling.prompt_batch(tasks, step, 4, seed=5)]
    assert sorted(epoch) == tasks
    assert sampling.prompt_batch(tasks, 2, 4, seed=5) == sampling.prompt_batch(tasks, 2, 4, seed=5)
    assert sampling.prompt_batch(tasks, 1, 4, seed=5) != sampling.prompt_batch(tasks, 1, 4, seed=6)
    assert sorted(t for s in (4, 5, 6) for t in sampling.prompt_batch(tasks, s, 4, seed=5)) == tasks


def test_bad_batch_size_or_step_is_named():
    with pytest.raises(ValueError, match="prompt batch size = 5"):
        sampling.prompt_batch([1, 2, 3], 1, 5, seed=0)
    with pytest.raises(ValueError, match="step = 0"):
        sampling.prompt_batch([1, 2, 3], 0, 1, seed=0)


def test_es_objective_and_grpo_share_the_sampler():
    assert grpo.prompt_batch is sampling.prompt_batch
    objective = es_objective.AgentObjective.__new__(es_objective.AgentObjective)
    objective.train_tasks, objective.batch_size, objective.batch_seed = list(range(40)), 8, 42
    for step in (1, 2, 7):
        assert objective.batch(step) == grpo.prompt_batch(list(range(40)), step, 8, 42)


def test_seed_streams_are_tagged_apart():
    seeds = {sampling.rollout_seed(42, step) for step in range(1, 50)}
    seeds |= {sampling.mix_seed(42, sampling.PROMPT_ORDER_TAG, e) for e in range(50)}
    assert len(seeds) == 99 and all(0 <= s < 2 ** 63 for s in seeds)
    # the former scheme seed * 1_000_003 + step collided: (0, 1_000_003) and (1, 0)
    assert sampling.rollout_seed(0, 1_000_003) != sampling.rollout_seed(1, 0)
