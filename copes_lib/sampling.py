"""The one seed scheme and the one prompt sampler, shared by ES, CoPES and GRPO.

- ``mix_seed(*ints)``: every seeded stream of the suite (ES noise and partitions, prompt orders,
  rollout sampling, the mechanism's random directions) is ``mix_seed(run seed, TAG, ...)`` with a tag
  naming the stream, so two streams never share a seed by accident (``seed * 1_000_003 + step``
  collides across runs whose seeds differ by a multiple of the step count).
- ``prompt_batch(tasks, step, B, seed)``: the B prompts of training step ``step`` (1-based), epochs of
  seeded shuffles cut into consecutive slices. It depends only on (seed, step), so a resumed run sees
  the prompts of an uninterrupted one, and within an epoch every training prompt is used once. ES's
  objective (all members of a step share the step's batch) and GRPO draw their batches here; a method
  given the same batch seed as another sees the same prompts at the same step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

_MASK64 = (1 << 64) - 1

PROMPT_ORDER_TAG = 0x5EED_0101
ROLLOUT_TAG = 0x5EED_0102
DIRECTION_TAG = 0x5EED_0103


def mix_seed(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 mixing): distinct inputs give unrelated streams."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


def prompt_batch(tasks: Sequence[Any], step: int, batch_size: int, seed: int) -> list[Any]:
    """The prompts of training step ``step`` (1-based): epochs of seeded shuffles, consecutive slices."""
    if batch_size < 1 or len(tasks) < batch_size:
        raise ValueError(f"{len(tasks)} training tasks < prompt batch size = {batch_size}; "
                         "lower the prompt batch size (PROMPT_BATCH / BATCH_SIZE) or load more tasks")
    if step < 1:
        raise ValueError(f"step = {step}: training steps are numbered from 1")
    per_epoch = len(tasks) // batch_size
    epoch, slot = divmod(step - 1, per_epoch)
    order = list(range(len(tasks)))
    random.Random(mix_seed(seed, PROMPT_ORDER_TAG, epoch)).shuffle(order)
    return [tasks[i] for i in order[slot * batch_size:(slot + 1) * batch_size]]


def rollout_seed(seed: int, step: int, part: int = 0) -> int:
    """Sampling seed of part ``part`` (a rollout micro-batch) of training step ``step``'s rollouts."""
    return mix_seed(seed, ROLLOUT_TAG, step, part)


__all__ = ["DIRECTION_TAG", "PROMPT_ORDER_TAG", "ROLLOUT_TAG", "mix_seed", "prompt_batch", "rollout_seed"]
