"""The sweep rule of notebooks 02, 03 and 04: a geometric grid widened until its best value is inside it.

A sweep evaluates every value of its grid (each a short run scored on the tuning split,
``copes_lib.tasks.TUNING_SPLIT``, never on validation). When the best value sits at an edge of the grid
the optimum may lie beyond it, so the grid grows by one step in that direction (the ratio of the two
values next to that edge) and the new value is evaluated; this repeats until the best is an interior
point or ``max_extend`` values have been added. A sweep still at an edge then says so
(``GridSweep.at_edge``): its choice is a bound, not a bracketed optimum. Every method's sweep gets the
same rule, the same steps per value and the same extension limit (the same budget per method):
docs/reference.md#r3-each-sweep-brackets-its-optimum-at-the-same-budget-per-method.
"""

from __future__ import annotations

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

    @property
    def at_edge(self) -> bool:
        """The choice is the smallest or largest value evaluated (with >= 2 values): not bracketed."""
        return len(self.values) >= 2 and self.chosen in (self.values[0], self.values[-1])

    def describe(self) -> str:
        added = f", added {self.added}" if self.added else ""
        if len(self.values) < 2:
            return f"{self.name}: one value ({self.chosen:g}), nothing to bracket"
        if self.at_edge:
            return (f"{self.name}: chose {self.chosen:g} STILL AT THE EDGE of {self.values} after widening by "
                    f"{len(self.added)} of at most {self.max_extend} steps{added}: a bound, not an optimum")
        return f"{self.name}: chose {self.chosen:g}, bracketed inside {self.values}{added}"


def widen_to_bracket(evaluate: Callable[[float], Any], grid: Sequence[float], *, key: Callable[[Any], Any],
                     max_extend: int, name: str = "grid") -> GridSweep:
    """Evaluate ``grid`` and widen it geometrically until ``key``'s best value is interior (module
    docstring). ``evaluate(value)`` returns a row; ``key(row)`` orders rows (higher is better; put the
    tie-breaks in it); ``max_extend`` >= 0 bounds the values added."""
    values = sorted({float(v) for v in grid})
    if not values:
        raise ConfigError(f"{name} is empty: give at least one value")
    if any(v <= 0 for v in values):
        raise ConfigError(f"{name} = {values}: a geometric grid needs values > 0")
    if max_extend < 0:
        raise ConfigError(f"max_extend = {max_extend} must be >= 0 (the values {name}'s widening may add)")
    rows = {v: evaluate(v) for v in values}
    added: list[float] = []

    def best() -> float:
        return max(values, key=lambda v: key(rows[v]))

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
    return GridSweep(name, values, rows, best(), added, max_extend)
