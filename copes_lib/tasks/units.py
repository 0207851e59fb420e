"""The testbed's latent units: the subject names a problem's answer-form prior is keyed on.

A base warm-started on a latent prior behaves alike on problems that share what the prior keys on, so
those problems are not independent draws: a method's gain can sit on a few of them. Here the prior keys
on the problem's **subject name** (math: the person of the story; QA: the person who asks), drawn from a
pool of :data:`SUBJECTS` shared by the training and the held-out problems, so a validation problem's
unit is one the warm start has seen. Names are assigned in rotation over a shuffled pool (a fresh
shuffle per pass), so every unit holds about the same number of problems in every split, and no unit
more than ceil(n / pool) + 1 of any window of n consecutive problems.

Every generated :class:`~copes_lib.tasks.protocol.Task` carries its ``unit_id`` (the name); a real
dataset's task (gpu profile) is its own unit. :class:`UnitSpec` holds the floors every evaluation split
must meet (docs/preflight.md#p8-many-independent-units-registered-2026-12-03): at least ``min_units``
distinct units, none holding more than ``max_unit_share`` of the split's problems. Departure from the
paper: a pretrained model's prompt-to-prompt variation has no named latent; the miniature needs one to
grade the prior, and states it so the statistics can resample it.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterator, Sequence

from copes_lib.config import Config, ConfigError, param

#: Syllables of the subject names; disjoint from the QA knowledge base's and the math fact items'
#: syllables, so a subject name never looks like a searchable entity.
_NAME_SYLLABLES = ("al", "be", "cor", "di", "em", "fa", "gil", "hu", "is", "jor", "ke", "lo", "mi", "nev",
                   "ol", "pra", "sti", "ul", "vey", "wa", "xan", "ez", "ith", "ra")
NAME_SEED = "subject-names-v1"


def subject_names(n: int, seed: str = NAME_SEED) -> tuple[str, ...]:
    """``n`` distinct two-syllable capitalised names, in a seeded order.

    >>> len(set(subject_names(128))) == 128 and subject_names(3) == subject_names(3)
    True
    """
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < n:
        name = (rng.choice(_NAME_SYLLABLES) + rng.choice(_NAME_SYLLABLES)).capitalize()
        if name not in names:
            names.append(name)
    return tuple(names)


@dataclasses.dataclass(frozen=True)
class UnitSpec(Config):
    """The latent units of a generated testbed and the floors every evaluation split meets."""

    units: int = param(128, "subject names in the shared pool (the latent units), at least min_units", ge=1)
    min_units: int = param(100, "floor: distinct units in every evaluation split (val, test, tune)", ge=1)
    max_unit_share: float = param(0.02, "floor: no unit may hold more than this share of an evaluation split's "
                                  "problems, in (0, 1]", gt=0.0, le=1.0)

    def check(self) -> None:
        if self.units < self.min_units:
            raise ConfigError(f"units = {self.units} is below the floor min_units = {self.min_units}: a prior spec "
                              f"needs at least min_units latent units; valid: units >= {self.min_units} "
                              "(docs/preflight.md#p8-many-independent-units-registered-2026-12-03)")


#: Per profile (the smoke splits hold 32-64 problems, so its floors are what 32 problems allow).
UNIT_SPECS = {"smoke": UnitSpec(units=128, min_units=32, max_unit_share=0.04), "cpu": UnitSpec()}
SUBJECTS = subject_names(UnitSpec().units)


def rotation(names: Sequence[str], seed: str) -> Iterator[str]:
    """The names in passes over the pool, each pass a fresh seeded shuffle (endless)."""
    rng = random.Random(seed)
    while True:
        order = list(names)
        rng.shuffle(order)
        yield from order


def unit_counts(tasks: Sequence) -> Counter:
    """Problems per ``unit_id``."""
    return Counter(t.unit_id for t in tasks)


def describe_units(tasks: Sequence) -> dict:
    """Distinct units, the largest unit's problems and share, and the smallest unit's problems.

    >>> from copes_lib.tasks.protocol import Task
    >>> describe_units([Task(str(i), "math", "q", ("1",), 1, unit_id="AB"[i % 2]) for i in range(4)])
    {'problems': 4, 'units': 2, 'max_problems': 2, 'max_share': 0.5, 'min_problems': 2}
    """
    counts = unit_counts(tasks)
    largest = max(counts.values()) if counts else 0
    return {"problems": len(tasks), "units": len(counts), "max_problems": largest,
            "max_share": largest / len(tasks) if tasks else 0.0, "min_problems": min(counts.values()) if counts else 0}


def check_units(tasks: Sequence, spec: UnitSpec, where: str) -> dict:
    """:func:`describe_units` of an evaluation split, or a clear error when it misses a floor."""
    d = describe_units(tasks)
    if d["units"] < spec.min_units:
        raise ConfigError(f"{where}: {d['units']} distinct units, below min_units = {spec.min_units}; valid: a split "
                          f"with >= {spec.min_units} units (raise UnitSpec.units or the split's size)")
    if d["max_share"] > spec.max_unit_share:
        raise ConfigError(f"{where}: one unit holds {d['max_share']:.3f} of the problems, above max_unit_share = "
                          f"{spec.max_unit_share}; valid: max_unit_share >= {d['max_share']:.3f} or more units")
    return d


__all__ = ["UnitSpec", "UNIT_SPECS", "SUBJECTS", "subject_names", "rotation", "unit_counts", "describe_units",
           "check_units"]
