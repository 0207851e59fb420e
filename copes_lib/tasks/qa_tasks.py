"""Multi-hop QA miniature: a generated knowledge base of fictional people, cities and companies.

Every fact lives in one short passage; questions chain 2 or 3 facts, so they are answerable only by
searching (no model has seen these names), e.g. "In which country was the founder of Brightfold
born?" needs Brightfold -> its founder -> the founder's birth city -> that city's country. Gold trace::

    <search>Brightfold</search><result>Brightfold is a company founded by Valor Trenk ...</result>
    <search>Valor Trenk</search><result>...</result> ... <answer>\\boxed{Oskelia}</answer>

Every question is asked by someone (``"Alvey asks: In which country ..."``): the asker is the question's
latent unit (``Task.unit_id``), a name of the pool :data:`copes_lib.tasks.units.SUBJECTS` shared by both
worlds (the entities are not, so a prior keyed on them could not carry over to validation), assigned in
rotation. The asker says nothing of the answer and is never searched.

Departure from the paper: HotpotQA / 2Wiki / MuSiQue over Wikipedia with an E5 retriever become
template questions over ~1-2K generated passages with BM25. Entities are split into two disjoint
worlds (train vs. val/test questions), so validation answers cannot be memorised from training
traces; only the small set of countries is shared.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from copes_lib.tasks.protocol import Task
from copes_lib.tasks.units import SUBJECTS, rotation

OCCUPATIONS = ("painter", "baker", "sailor", "doctor", "teacher", "poet", "farmer", "engineer",
               "singer", "pilot", "chemist", "architect")
_SYL = ("ba", "ko", "ri", "tel", "mar", "vin", "so", "dra", "lu", "pen", "qua", "zet", "ho", "fi",
        "gor", "na", "sel", "tru", "wim", "ye", "ax", "bro", "cal", "dus")


@dataclass
class World:
    """One disjoint set of entities. Countries are shared between worlds."""

    people: dict[str, tuple[str, str]] = field(default_factory=dict)     # name -> (occupation, city)
    cities: dict[str, str] = field(default_factory=dict)                 # name -> country
    companies: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (founder, city)


@dataclass
class KnowledgeBase:
    countries: list[str]
    worlds: dict[str, World]

    def passages(self) -> list[tuple[str, str, str]]:
        """(id, title, text) of every passage, in a fixed order."""
        out = []
        for world_name, world in self.worlds.items():
            for i, (name, (job, city)) in enumerate(world.people.items()):
                out.append((f"kb-{world_name}-person-{i}", name, f"{name} is a {job} born in {city}."))
            for i, (name, country) in enumerate(world.cities.items()):
                out.append((f"kb-{world_name}-city-{i}", name, f"{name} is a city in {country}."))
            for i, (name, (founder, city)) in enumerate(world.companies.items()):
                out.append((f"kb-{world_name}-company-{i}", name,
                            f"{name} is a company founded by {founder} and based in {city}."))
        return out


def _word(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYL) for _ in range(parts)).capitalize()


def make_knowledge_base(n_people: int, n_cities: int, n_companies: int, seed: int,
                        n_countries: int = 12, company_syllables: int = 2) -> KnowledgeBase:
    """A KB with two disjoint worlds (``train`` and ``eval``) of the given sizes each.

    Company names are ``company_syllables`` syllables and a suffix: two give about 2,300 distinct names over
    both worlds (the standard worlds use 2,200 of them), so a larger world needs three."""
    if 2 * n_companies > len(_SYL) ** company_syllables * 4:  # fresh() would never find enough names
        raise ValueError(f"n_companies = {n_companies} per world: {company_syllables}-syllable company names allow "
                         f"about {len(_SYL) ** company_syllables * 4} in all; use company_syllables = "
                         f"{company_syllables + 1} or fewer companies")
    rng = random.Random(f"qa-kb-{seed}")
    used: set[str] = set()

    def fresh(make) -> str:
        while True:
            name = make()
            if name not in used and name.lower() not in used:
                used.add(name)
                used.add(name.lower())
                return name

    countries = [fresh(lambda: _word(rng, 2) + "ia") for _ in range(n_countries)]
    worlds = {}
    for world_name in ("train", "eval"):
        w = World()
        for _ in range(n_cities):
            w.cities[fresh(lambda: _word(rng, 2) + rng.choice(("ton", "burg", "ville", "holm")))] = \
                rng.choice(countries)
        city_names = list(w.cities)
        for _ in range(n_people):
            w.people[fresh(lambda: f"{_word(rng, 2)} {_word(rng, 2)}")] = \
                (rng.choice(OCCUPATIONS), rng.choice(city_names))
        people_names = list(w.people)
        for _ in range(n_companies):
            w.companies[fresh(lambda: _word(rng, company_syllables) + rng.choice(("corp", "works", "soft", "labs")))] = \
                (rng.choice(people_names), rng.choice(city_names))
        worlds[world_name] = w
    return KnowledgeBase(countries, worlds)


QUESTION_TYPES = ("birth_country", "company_country", "founder_city", "founder_job", "founder_country")


def generate_qa_problem(rng: random.Random, world: World, qtype: str) -> tuple[str, str, list, int]:
    """(question, answer, gold plan of searches, hops)."""
    if qtype == "birth_country":
        person = rng.choice(list(world.people))
        city = world.people[person][1]
        return (f"In which country was {person} born?", world.cities[city],
                [("search", person), ("search", city)], 2)
    company = rng.choice(list(world.companies))
    founder, hq = world.companies[company]
    if qtype == "company_country":
        return f"In which country is {company} based?", world.cities[hq], [("search", company), ("search", hq)], 2
    job, city = world.people[founder]
    if qtype == "founder_city":
        return (f"In which city was the founder of {company} born?", city,
                [("search", company), ("search", founder)], 2)
    if qtype == "founder_job":
        return (f"What is the occupation of the founder of {company}?", job,
                [("search", company), ("search", founder)], 2)
    return (f"In which country was the founder of {company} born?", world.cities[city],
            [("search", company), ("search", founder), ("search", city)], 3)


def generate_qa_tasks(n: int, seed: int, world_name: str, kb: KnowledgeBase,
                      exclude: set[str] = frozenset(), id_prefix: str = "qa") -> tuple[list[Task], list[list]]:
    """``n`` distinct questions over one world, question types and askers (the units) in rotation; ids
    ``<id_prefix>-<world>-<index>``."""
    rng = random.Random(f"qa-{world_name}-{seed}")
    askers = rotation(SUBJECTS, f"qa-units-{world_name}-{seed}")
    world = kb.worlds[world_name]
    tasks, plans, seen = [], [], set(exclude)
    attempts = 0
    asker = next(askers)
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct QA questions from this knowledge base; enlarge it")
        qtype = QUESTION_TYPES[len(tasks) % len(QUESTION_TYPES)]
        question, answer, plan, hops = generate_qa_problem(rng, world, qtype)
        if question in seen:
            continue
        seen.add(question)
        tasks.append(Task(f"{id_prefix}-{world_name}-{len(tasks):06d}", "qa", f"{asker} asks: {question}", (answer,), hops,
                          unit_id=asker))
        plans.append(plan)
        asker = next(askers)
    return tasks, plans
