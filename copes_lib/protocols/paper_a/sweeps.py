"""The sweep rule of notebooks 02, 03 and 04: a geometric grid widened until its best value is inside it.

A sweep evaluates every value of its grid (each a short run scored on the tuning split,
``copes_lib.tasks.TUNING_SPLIT``, never on validation). When the best value sits at an edge of the grid
the optimum may lie beyond it, so the grid grows by one step in that direction (the ratio of the two
values next to that edge) and the new value is evaluated; this repeats until the best is an interior
point or ``max_extend`` values have been added. A sweep still at an edge then says so
(``GridSweep.at_edge``): its choice is a bound, not a bracketed optimum. Every method's sweep gets the
same rule, the same steps per value and the same extension limit (the same budget per method):
docs/reference.md#r3-each-sweep-brackets-its-optimum-at-the-same-budget-per-method.

A sweep cannot quietly choose "change nothing" (docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op):
the grid is centred on a registered default, values that tie on the score and its tie-break go to the default
(or the value geometrically closest to it), never to the value that changes the model least, and a sweep in
which every value ties is reported ``uninformative`` and keeps the default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from copes_lib.config import ConfigError


@dataclass
class GridSweep:
    """What a widened sweep evaluated, in grid order, and its choice."""

    name: str  # the parameter swept (e.g. SWEEP_SIGMAS), for messages
    values: list[float]  # every value evaluated, ascending
    rows: dict[float, Any]  # value -> what ``evaluate`` returned
    chosen: float
    added: list[float] = field(default_factory=list)  # values the widening added, in the order added
    max_extend: int = 0
    default: float | None = None  # the registered default the grid is centred on (ties go to it)
    tied: list[float] = field(default_factory=list)  # values tied with the choice on the key (>= 2: a tie)
    uninformative: bool = False  # every value tied: the sweep told nothing, the default was kept

    @property
    def at_edge(self) -> bool:
        """The choice is the smallest or largest value evaluated (with >= 2 values): not bracketed."""
        return not self.uninformative and len(self.values) >= 2 and self.chosen in (self.values[0], self.values[-1])

    def describe(self) -> str:
        added = f", added {self.added}" if self.added else ""
        if len(self.values) < 2:
            return f"{self.name}: one value ({self.chosen:g}), nothing to bracket"
        if self.uninformative:
            return (f"{self.name}: UNINFORMATIVE, every value of {self.values} scored the same and earned the same "
                    f"training reward; kept the registered default {self.chosen:g}")
        tie = (f" (tie among {self.tied} broken towards the registered default {self.default:g})"
               if len(self.tied) > 1 and self.default is not None else "")
        if self.at_edge:
            return (f"{self.name}: chose {self.chosen:g}{tie} STILL AT THE EDGE of {self.values} after widening by "
                    f"{len(self.added)} of at most {self.max_extend} steps{added}: a bound, not an optimum")
        return f"{self.name}: chose {self.chosen:g}{tie}, bracketed inside {self.values}{added}"


def centred_grid(default: float, factors: Sequence[float]) -> list[float]:
    """``default`` times each factor, rounded to readable values (cache keys and tables show them).

    >>> centred_grid(0.01, (0.5, 1, 2))
    [0.005, 0.01, 0.02]
    """
    if not (default > 0 and math.isfinite(default)):
        raise ConfigError(f"the sweep's registered default = {default!r} must be finite and > 0")
    return sorted({float(f"{default * f:.6g}") for f in factors})


def break_tie(tied: Sequence[float], default: float) -> float:
    """Of values that tie, the registered default if it is one of them, else the value geometrically closest
    to it (the smaller of two equally close): never "the one that changes the model least".

    >>> break_tie([0.0025, 0.005, 0.01], 0.005), break_tie([0.0025, 0.02], 0.005)
    (0.005, 0.0025)
    """
    return min(tied, key=lambda v: (round(abs(math.log(v / default)), 9), v))


def widen_to_bracket(evaluate: Callable[[float], Any], grid: Sequence[float], *, key: Callable[[Any], Any],
                     max_extend: int, name: str = "grid", default: float | None = None) -> GridSweep:
    """Evaluate ``grid`` and widen it geometrically until the best value is interior (module docstring).
    ``evaluate(value)`` returns a row; ``key(row)`` orders rows (higher is better: the score, then its
    tie-break); values still tied go to ``default`` by :func:`break_tie` (None: the grid's middle value);
    a ``default`` missing from the grid is added to it. Every value tied: ``uninformative``, the default
    is kept and nothing is widened. ``max_extend`` >= 0 bounds the values added."""
    values = sorted({float(v) for v in grid} | ({float(default)} if default is not None else set()))
    if not values:
        raise ConfigError(f"{name} is empty: give at least one value")
    if any(v <= 0 for v in values):
        raise ConfigError(f"{name} = {values}: a geometric grid needs values > 0")
    if max_extend < 0:
        raise ConfigError(f"max_extend = {max_extend} must be >= 0 (the values {name}'s widening may add)")
    if default is None:
        default = values[len(values) // 2]
    rows = {v: evaluate(v) for v in values}
    added: list[float] = []

    def tied() -> list[float]:
        top = max(key(rows[v]) for v in values)
        return [v for v in values if key(rows[v]) == top]

    def best() -> float:
        return break_tie(tied(), default)

    if len(values) >= 2 and len(tied()) == len(values):
        return GridSweep(name, values, rows, default, [], max_extend, default, list(values), uninformative=True)

    while len(values) >= 2 and len(added) < max_extend:
        top = best()
        if top == values[0]:
            new = values[0] * values[0] / values[1]
        elif top == values[-1]:
            new = values[-1] * values[-1] / values[-2]
        else:
            break
        new = float(f"{new:.6g}")  # a readable grid value (cache keys and tables show it)
        rows[new] = evaluate(new)
        added.append(new)
        values = sorted(values + [new])
    return GridSweep(name, values, rows, best(), added, max_extend, default, tied())
