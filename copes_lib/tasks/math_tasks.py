"""Agentic math miniature: multi-step word problems that need the Python tool, and sometimes search.

Each problem is a little story: someone starts with a number of things and one or two events change
it (buys, gives away, grows k times, splits into k groups). Computing the total needs the Python
tool; difficulty 3 and 4 problems also ask for a weight or price that only the search corpus holds
(a fictional item, so no model can know it). Gold trace::

    <search>zorbin crystal</search><result>One zorbin crystal weighs 23 grams.</result>
    <python>print((37+48)*23)</python><output>1955</output><answer>\\boxed{1955}</answer>

The story's person is its latent unit (``Task.unit_id``): a name of the shared pool
:data:`copes_lib.tasks.units.SUBJECTS`, assigned in rotation so every unit holds about as many
problems as any other in every split.

Difficulty: 1 = one event; 2 = two events; 3 = one event + a looked-up fact; 4 = two events + fact.
Departure from the paper: MATH/GSM8K problems need reasoning a 1M-parameter model cannot do; here
the skill is translating the story into an expression, choosing the tool, copying facts. Items
with facts are split in two disjoint "worlds" (train vs. val/test), so the facts a validation
problem needs never appear in a training trace and must be searched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from copes_lib.tasks.protocol import Task
from copes_lib.tasks.units import SUBJECTS, rotation

NAMES = SUBJECTS
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "cards", "pencils", "stamps", "shells",
         "buttons", "beads", "eggs")
ADD_VERBS = ("buys {b} more", "finds {b} more", "gets {b} more from a friend", "receives {b} more")
SUB_VERBS = ("gives away {b}", "loses {b}", "sells {b}", "uses {b}")
MUL_VERBS = ("then gets {b} times as many", "then multiplies the pile by {b}")
DIV_VERBS = ("then splits them into {b} equal groups and keeps one", "then keeps one of {b} equal shares")
FACT_KINDS = {"weight": ("weighs {v} grams", "How many grams do the {item} weigh in total?"),
              "price": ("costs {v} coins", "How many coins are the {item} worth in total?")}
_SYLLABLES = ("zor", "bin", "kel", "vra", "mip", "tos", "lun", "dar", "quo", "fen", "gral", "sib",
              "nox", "pel", "rym", "tav", "wex", "yol", "cha", "dru")
_NOUNS = ("crystal", "berry", "gear", "shell", "stone", "seed", "coin", "leaf")


@dataclass(frozen=True)
class FactItem:
    """A fictional item whose weight or price is stated only in the search corpus."""

    name: str        # singular, e.g. "zorbin crystal"
    kind: str        # "weight" | "price"
    value: int

    @property
    def plural(self) -> str:
        return self.name + "s"

    def passage(self) -> str:
        return f"One {self.name} {FACT_KINDS[self.kind][0].format(v=self.value)}."


def make_fact_items(n_per_world: int, seed: int) -> dict[str, list[FactItem]]:
    """Two disjoint worlds of fictional items: ``train`` and ``eval``."""
    rng = random.Random(f"math-facts-{seed}")
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < 2 * n_per_world:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(2))
        name = f"{word} {rng.choice(_NOUNS)}"
        if name not in seen:
            seen.add(name)
            names.append(name)
    items = [FactItem(n, rng.choice(sorted(FACT_KINDS)), rng.randint(2, 30)) for n in names]
    return {"train": items[:n_per_world], "eval": items[n_per_world:]}


def _apply(expr: str, value: int, op: str, b: int) -> tuple[str, int]:
    """Append one operation to a Python expression, keeping left-to-right story order."""
    if op in "+-":
        return f"{expr}{op}{b}", value + b if op == "+" else value - b
    wrapped = f"({expr})" if ("+" in expr or "-" in expr) else expr
    symbol = "*" if op == "*" else "//"
    return f"{wrapped}{symbol}{b}", value * b if op == "*" else value // b


def _event(rng: random.Random, value: int) -> tuple[str, int, str]:
    """Pick an operation that keeps the quantity a positive integer of sensible size."""
    choices = ["+", "-", "*", "/"]
    while True:
        op = rng.choice(choices)
        if op == "+":
            b = rng.randint(2, 60)
        elif op == "-":
            if value <= 3:
                continue
            b = rng.randint(1, value - 1)
        elif op == "*":
            if value > 200:
                continue
            b = rng.randint(2, 9)
        else:
            divisors = [d for d in range(2, 10) if value % d == 0]
            if not divisors:
                continue
            b = rng.choice(divisors)
        verbs = {"+": ADD_VERBS, "-": SUB_VERBS, "*": MUL_VERBS, "/": DIV_VERBS}[op]
        return op, b, rng.choice(verbs).format(b=b)


def generate_math_problem(rng: random.Random, difficulty: int, facts: list[FactItem],
                          name: str | None = None) -> tuple[str, str, list]:
    """(question, answer, gold plan). The plan is the list of tool calls: ("search", query) and
    ("python", code), followed by the final answer. ``name``: the story's person (default: drawn)."""
    name = name or rng.choice(NAMES)
    fact = rng.choice(facts) if difficulty >= 3 else None
    item = fact.plural if fact else rng.choice(ITEMS)
    value = rng.randint(10, 99)
    expr = str(value)
    sentences = [f"{name} has {value} {item}."]
    for _ in range(1 if difficulty in (1, 3) else 2):
        op, b, phrase = _event(rng, value)
        expr, value = _apply(expr, value, op, b)
        sentences.append(f"{name} {phrase}.")
    plan: list = []
    if fact:
        expr, value = _apply(expr, value, "*", fact.value)
        sentences.append(FACT_KINDS[fact.kind][1].format(item=item))
        plan.append(("search", fact.name))
    else:
        sentences.append(f"How many {item} does {name} have now?")
    plan.append(("python", f"print({expr})", str(value)))
    return " ".join(sentences), str(value), plan


def generate_math_tasks(n: int, seed: int, world: str, facts: list[FactItem],
                        exclude: set[str] = frozenset()) -> tuple[list[Task], list[list]]:
    """``n`` distinct problems (none whose question is in ``exclude``), difficulties 1-4 equally often,
    the persons (the units) in rotation over :data:`NAMES`."""
    rng = random.Random(f"math-{world}-{seed}")
    names = rotation(NAMES, f"math-units-{world}-{seed}")
    tasks, plans, seen = [], [], set(exclude)
    name = next(names)
    while len(tasks) < n:
        difficulty = 1 + len(tasks) % 4
        question, answer, plan = generate_math_problem(rng, difficulty, facts, name)
        if question in seen:
            continue
        seen.add(question)
        tasks.append(Task(f"math-{world}-{len(tasks):06d}", "math", question, (answer,), difficulty, unit_id=name))
        plans.append(plan)
        name = next(names)
    return tasks, plans
