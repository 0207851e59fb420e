"""Tasks of the agent: the generated math and multi-hop QA miniatures, and real data for the gpu profile.

``load_tasks(profile, kind, split)`` is the entry point. For ``smoke`` and ``cpu`` the problems are
generated deterministically; the split id lists are saved in ``data/splits/<profile>_<kind>.json``
with a fingerprint of their content, checked on every load (a changed generator fails loudly instead
of silently changing the validation set). Splits are disjoint in ids and in question text, and
validation/test problems come from a "world" of entities disjoint from training (see
:mod:`copes_lib.tasks.math_tasks`, :mod:`copes_lib.tasks.qa_tasks`). The ``gpu`` profile reads the
local JSONL files named by :class:`GPUDataPaths` (:func:`use_gpu_data`; the notebooks set them from
notebook 01's parameters in ``profiles/gpu.yaml``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from copes_lib.config import REPO_ROOT, Config, ConfigError, param
from copes_lib.tasks.math_tasks import generate_math_tasks, make_fact_items
from copes_lib.tasks.protocol import (
    SPLITS,
    TAGS,
    TASK_KINDS,
    Task,
    format_prompt,
    python_observation,
    search_observation,
    split_trace,
)
from copes_lib.tasks.qa_tasks import generate_qa_tasks, make_knowledge_base
from copes_lib.tasks.rewards import (
    extract_answer,
    format_reward,
    math_correctness,
    math_equal,
    math_reward,
    qa_metrics,
    qa_reward,
    qa_scores,
)
from copes_lib.tasks.units import UNIT_SPECS, UnitSpec, check_units, describe_units

__all__ = ["GPUDataPaths", "use_gpu_data", "AgentToolSettings", "use_tool_settings", "Task", "load_tasks", "load_benchmarks", "load_passages", "task_ids", "data_fingerprint", "describe_split_file", "tool_settings", "SPLITS", "TASK_KINDS", "TAGS", "SEARCH_K",
           "TOOL_LIMITS", "TUNING_SPLIT", "check_tuning_disjoint", "format_prompt", "split_trace", "extract_answer", "math_reward", "qa_reward",
           "format_reward", "math_correctness", "qa_scores", "qa_metrics", "math_equal", "GENERATED_SIZES",
           "QA_DATA_VARIANTS", "LARGE_QA_SIZES", "use_qa_data", "data_variant", "generated_sizes", "recipe_data",
           "UnitSpec", "UNIT_SPECS", "describe_units", "unit_report", "profile_splits"]

SPLITS_DIR = REPO_ROOT / "data" / "splits"
#: docs/paper_a_copes.md#a4-task-agent-reward-and-data: math allows 3 search + 5 Python calls, QA 5 + 5.
TOOL_LIMITS = {"math": {"python": 5, "search": 3}, "qa": {"python": 5, "search": 5}}
#: passages returned per search call in the miniature (short contexts for tiny models).
SEARCH_K = {"math": 1, "qa": 1}
DATA_SEED = 1234  # the generated world is the same for every experiment seed

#: Sizes of the generated miniature per profile (train / val / test problems, world sizes).
GENERATED_SIZES = {
    "smoke": {"math": {"train": 3000, "val": 64, "test": 64, "fact_items": 30},
              "qa": {"train": 2000, "val": 64, "test": 64, "people": 500, "cities": 60, "companies": 500}},
    "cpu": {"math": {"train": 10000, "val": 512, "test": 512, "fact_items": 150},
            "qa": {"train": 5000, "val": 512, "test": 512, "people": 1100, "cities": 150, "companies": 1100}},
}

#: The tuning split the sweeps of notebooks 02-04 choose on (never the validation split the best
#: checkpoints and every reported number use): problems of the held-out "eval" world drawn after
#: validation and test (the generators are prefix-stable, so val and test are unchanged). Kept out of
#: ``SPLITS`` and ``GENERATED_SIZES`` so the saved split records and every cache key stay as they were;
#: its ids live in ``data/splits/<profile>_<kind>_tune.json``, checked disjoint from train, val and test.
TUNING_SPLIT = "tune"
TUNE_SIZES = {"smoke": {"math": 32, "qa": 32}, "cpu": {"math": 256, "qa": 256}}

#: The QA data variants notebook 01's ``QA_DATA`` chooses (docs/preflight.md P8.9 (b)): ``standard`` is
#: ``GENERATED_SIZES`` (every split file and cache key as before); ``large`` has twice the training problems
#: (cpu: 10,000, as many as math, so 3,000 warm-start steps are ~10 epochs, not 19) from worlds twice as large
#: (people, cities, companies; company names of 3 syllables, since 2 allow only ~2,300 over both worlds), with
#: the same val / test / tune sizes and unit floors. Its split files are ``<profile>_qa-large*.json`` and its
#: task ids start ``qa-large-``. The scaling keeps the training world as full as the standard one (10,000 of
#: 11,000 distinct questions vs 5,000 of 5,500), so drawing them costs the same ~2.6 draws per problem.
QA_DATA_VARIANTS = ("standard", "large")
LARGE_QA_SIZES = {
    "smoke": {"train": 4000, "val": 64, "test": 64, "people": 1000, "cities": 120, "companies": 1000,
              "company_syllables": 3},
    "cpu": {"train": 10000, "val": 512, "test": 512, "people": 2200, "cities": 300, "companies": 2200,
            "company_syllables": 3},
}


_qa_data: dict[str, str] = {}  # profile -> QA data variant, set by the notebooks' parameter loading


def use_qa_data(profile: str, variant: str) -> None:
    """Give ``profile``'s QA tasks in this process the data variant ``variant`` (:data:`QA_DATA_VARIANTS`) from
    now on; the gpu profile reads its QA data from local files, so only ``standard`` is valid there."""
    valid = ["standard"] if profile == "gpu" else list(QA_DATA_VARIANTS)
    if variant not in valid:
        where = " on the gpu profile (its QA data are QA_TRAIN_JSONL / QA_TEST_FILES)" if profile == "gpu" else ""
        raise ConfigError(f"QA_DATA = {variant!r} is not valid{where}; valid values: {valid}")
    _qa_data[profile] = variant


def data_variant(profile: str, kind: str) -> str:
    """The data variant of ``kind`` in effect for ``profile`` in this process (math: always ``standard``)."""
    return _qa_data.get(profile, "standard") if kind == "qa" else "standard"


def recipe_data(profile: str) -> dict:
    """What a record of a recipe (a preflight record, a shipped base) names beside its warm-start config
    about the data: ``{}`` for the standard data (records as before variants existed), else ``{"qa_data": ...}``.
    """
    variant = data_variant(profile, "qa")
    return {} if variant == "standard" else {"qa_data": variant}


def _variant(profile: str, kind: str, variant: str | None) -> str:
    """``variant``, or the one in effect when None; a variant math has not, or an unknown one, is an error."""
    if variant is None:
        return data_variant(profile, kind)
    valid = list(QA_DATA_VARIANTS) if kind == "qa" else ["standard"]
    if variant not in valid:
        raise ConfigError(f"data variant = {variant!r} is not valid for {kind}; valid values: {valid}")
    return variant


def _data_name(kind: str, variant: str) -> str:
    """``kind`` for the standard data, ``<kind>-<variant>`` otherwise (split file names, task id prefixes)."""
    return kind if variant == "standard" else f"{kind}-{variant}"


def generated_sizes(profile: str, kind: str, variant: str = "standard") -> dict:
    """The generated miniature's sizes of ``kind`` (train / val / test problems, world sizes) in ``variant``."""
    return GENERATED_SIZES[profile][kind] if variant == "standard" else LARGE_QA_SIZES[profile]


def _check(profile: str, kind: str, split: str | None = None) -> None:
    if profile not in ("smoke", "cpu", "gpu"):
        raise ConfigError(f"profile = {profile!r} is not valid; valid values: ['smoke', 'cpu', 'gpu']")
    if kind not in TASK_KINDS:
        raise ConfigError(f"kind = {kind!r} is not valid; valid values: {list(TASK_KINDS)}")
    if split is not None and split not in (*SPLITS, TUNING_SPLIT):
        raise ConfigError(f"split = {split!r} is not valid; valid values: {[*SPLITS, TUNING_SPLIT]}")


# --------------------------------------------------------------------------- generated miniature
@functools.lru_cache(maxsize=8)
def _generated_world(profile: str, kind: str, variant: str = "standard"
                     ) -> tuple[list[tuple[str, str, str]], dict, dict]:
    """(passages, {split: tasks without references}, {split: gold plans})."""
    sizes, n_tune = generated_sizes(profile, kind, variant), TUNE_SIZES[profile][kind]
    if kind == "math":
        facts = make_fact_items(sizes["fact_items"], DATA_SEED)
        passages = [(f"fact-{world}-{i}", f.name, f.passage())
                    for world in ("train", "eval") for i, f in enumerate(facts[world])]
        train, train_plans = generate_math_tasks(sizes["train"], DATA_SEED, "train", facts["train"])
        held, held_plans = generate_math_tasks(sizes["val"] + sizes["test"] + n_tune, DATA_SEED, "eval",
                                               facts["eval"], exclude={t.question for t in train})
    else:
        kb = make_knowledge_base(sizes["people"], sizes["cities"], sizes["companies"], DATA_SEED,
                                 company_syllables=sizes.get("company_syllables", 2))
        passages, prefix = kb.passages(), _data_name(kind, variant)
        train, train_plans = generate_qa_tasks(sizes["train"], DATA_SEED, "train", kb, id_prefix=prefix)
        held, held_plans = generate_qa_tasks(sizes["val"] + sizes["test"] + n_tune, DATA_SEED, "eval", kb,
                                             id_prefix=prefix)
    n_val, n_held = sizes["val"], sizes["val"] + sizes["test"]
    tasks = {"train": train, "val": held[:n_val], "test": held[n_val:n_held], TUNING_SPLIT: held[n_held:]}
    plans = {"train": train_plans, "val": held_plans[:n_val], "test": held_plans[n_val:n_held],
             TUNING_SPLIT: held_plans[n_held:]}
    return passages, tasks, plans


def _retriever(profile: str, kind: str, variant: str):
    from copes_lib.tasks.retrieval import shared_retriever

    return shared_retriever(profile, kind, variant)  # the search tool's own index: one build per process


def _reference(plan: list, answer: str, passages: list[list]) -> str:
    """A gold trace: the plan's tool calls with the observations the real tools return."""
    parts, searches = [], iter(passages)
    for step in plan:
        if step[0] == "search":
            parts.append(f"<search>{step[1]}</search>{search_observation([p.text for p in next(searches)])}")
        else:
            parts.append(f"<python>{step[1]}</python>{python_observation(step[2])}")
    return "".join(parts) + f"<answer>\\boxed{{{answer}}}</answer>"


@functools.lru_cache(maxsize=8)
def _generated_tasks(profile: str, kind: str, variant: str = "standard") -> dict[str, list[Task]]:
    _, tasks, plans = _generated_world(profile, kind, variant)
    retriever = _retriever(profile, kind, variant)
    out = {}
    for split in (*SPLITS, TUNING_SPLIT):
        queries = sorted({step[1] for plan in plans[split] for step in plan if step[0] == "search"})
        results = dict(zip(queries, retriever.search(queries, SEARCH_K[kind]) if queries else []))
        with_refs = []
        for task, plan in zip(tasks[split], plans[split]):
            found = [results[step[1]] for step in plan if step[0] == "search"]
            with_refs.append(dataclasses.replace(task, reference=_reference(plan, task.answers[0], found)))
        out[split] = with_refs
    name = _data_name(kind, variant)
    for split in ("val", "test", TUNING_SPLIT):  # docs/preflight.md#p8-many-independent-units-registered-2026-12-03
        check_units(out[split], UNIT_SPECS[profile], f"{profile}/{name} {split} split")
    _check_split_file(profile, kind, {s: out[s] for s in SPLITS}, variant)
    _check_tuning_file(profile, kind, out, variant)
    return out


def _fingerprint(tasks: list[Task]) -> str:
    blob = "\n".join(f"{t.id}\t{t.question}\t{'|'.join(t.answers)}" for t in tasks)
    return hashlib.sha256(blob.encode()).hexdigest()


def split_file(profile: str, kind: str, variant: str | None = None) -> Path:
    """``data/splits/<profile>_<kind>.json`` (a non-standard variant: ``<profile>_<kind>-<variant>.json``);
    ``variant`` defaults to the one in effect (:func:`data_variant`)."""
    variant = data_variant(profile, kind) if variant is None else variant
    return SPLITS_DIR / f"{profile}_{_data_name(kind, variant)}.json"


def _variant_field(variant: str) -> dict:
    return {} if variant == "standard" else {"variant": variant}  # the standard records stay as they were


def _check_split_file(profile: str, kind: str, tasks: dict[str, list[Task]], variant: str = "standard") -> None:
    """Save the split id lists on first use; afterwards check them (ids, content, disjointness)."""
    from copes_lib.runs import atomic_write_json, read_json

    ids = {s: [t.id for t in tasks[s]] for s in SPLITS}
    for a in SPLITS:
        for b in SPLITS:
            if a < b and (set(ids[a]) & set(ids[b]) or {t.question for t in tasks[a]} & {t.question for t in tasks[b]}):
                raise ValueError(f"{profile}/{_data_name(kind, variant)}: splits {a} and {b} overlap")
    record = {"profile": profile, "kind": kind, **_variant_field(variant), "ids": ids,
              "fingerprint": {s: _fingerprint(tasks[s]) for s in SPLITS}}
    path = split_file(profile, kind, variant)
    if not path.exists():
        atomic_write_json(path, record)
        return
    saved = read_json(path)
    if saved["ids"] != ids or saved["fingerprint"] != record["fingerprint"]:
        raise ValueError(f"{path} does not match the generated {kind} tasks of profile {profile!r}: the "
                         "generator changed. Delete the file to regenerate the splits (and bump "
                         "copes_lib.__version__ so cached models are retrained).")


def check_tuning_disjoint(tuning: list[Task], others: dict[str, list[Task]], name: str = "tuning split") -> None:
    """Fail, naming ``name`` and the split it meets, when the tuning problems share an id or a question
    with any of ``others`` (train, val, test): a sweep that chose on validation problems would make the
    validation numbers optimistic."""
    ids, questions = {t.id for t in tuning}, {t.question for t in tuning}
    for split, tasks in others.items():
        shared = sorted(ids & {t.id for t in tasks}) + sorted(questions & {t.question for t in tasks})
        if shared:
            raise ConfigError(f"{name} overlaps the {split} split ({len(shared)} shared ids / questions, e.g. "
                              f"{shared[0]!r}); a tuning split must be disjoint from {sorted(others)}")


def tuning_file(profile: str, kind: str, variant: str | None = None) -> Path:
    variant = data_variant(profile, kind) if variant is None else variant
    return SPLITS_DIR / f"{profile}_{_data_name(kind, variant)}_{TUNING_SPLIT}.json"


def _check_tuning_file(profile: str, kind: str, tasks: dict[str, list[Task]], variant: str = "standard") -> None:
    """Save the tuning split's id list on first use; afterwards check it; always check disjointness."""
    from copes_lib.runs import atomic_write_json, read_json

    tuning = tasks[TUNING_SPLIT]
    check_tuning_disjoint(tuning, {s: tasks[s] for s in SPLITS}, f"{profile}/{_data_name(kind, variant)} tuning split")
    record = {"profile": profile, "kind": kind, **_variant_field(variant), "ids": [t.id for t in tuning],
              "fingerprint": _fingerprint(tuning)}
    path = tuning_file(profile, kind, variant)
    if not path.exists():
        atomic_write_json(path, record)
    elif read_json(path) != record:
        raise ValueError(f"{path} does not match the generated {kind} tuning tasks of profile {profile!r}: "
                         "the generator changed. Delete the file to regenerate it.")


# --------------------------------------------------------------------------- gpu: local files
@dataclasses.dataclass(frozen=True)
class GPUDataPaths(Config):
    """Where the gpu profile's real data lie (local files; nothing is downloaded) and how its search
    corpus is indexed."""

    math_train_jsonl: str = param("", "MATH train JSONL (problem, solution, type)")
    math_test_files: str = param("", "Table 1's math test sets, name=path,... (tasks.loaders.BENCHMARKS)")
    qa_train_jsonl: str = param("", "HotpotQA train JSONL")
    qa_test_files: str = param("", "Table 4's QA test sets, name=path,... (hotpotqa, 2wiki, musique)")
    search_corpus_jsonl: str = param("", "search corpus JSONL (id, title, text | contents)")
    val_holdout: int = param(750, "training problems held out for validation (paper: 750)", ge=1)
    retriever: str = param("bm25", "search index: bm25, or dense (embedding_model_path + FAISS)",
                           choices=("bm25", "dense"))
    embedding_model_path: str = param("", "dense retriever: local encoder folder (e.g. e5-base-v2)")
    embedding_query_prefix: str = param("", "dense retriever: text put before each query (E5: 'query: ')")
    embedding_passage_prefix: str = param("", "dense retriever: text put before each passage (E5: 'passage: ')")


@dataclasses.dataclass(frozen=True)
class AgentToolSettings(Config):
    """The agent's tool budget per trajectory and the passages a search returns (the paper's limits:
    math 5 Python + 3 search calls, QA 5 + 5; Search-R1 returns 3 passages)."""

    math_python_calls: int = param(5, "Python calls per math trajectory (paper: 5)", ge=0)
    math_search_calls: int = param(3, "search calls per math trajectory (paper: 3)", ge=0)
    qa_python_calls: int = param(5, "Python calls per QA trajectory (paper: 5)", ge=0)
    qa_search_calls: int = param(5, "search calls per QA trajectory (paper: 5)", ge=0)
    search_top_k: int = param(1, "passages returned per search call (Search-R1 / the paper: 3)", ge=1)


_tool_settings: dict[str, AgentToolSettings] = {}  # profile -> settings, set by the notebooks' parameter loading


def use_tool_settings(profile: str, settings: AgentToolSettings) -> None:
    """Give agents of ``profile`` in this process these tool limits and search depth from now on."""
    _tool_settings[profile] = settings


_gpu_data: list[GPUDataPaths] = []  # set by use_gpu_data; the notebooks' parameter loading calls it


def use_gpu_data(paths: GPUDataPaths) -> None:
    """Read the gpu profile's tasks and corpus from ``paths`` from now on (in this process)."""
    _gpu_data[:] = [paths]


def _gpu_paths() -> GPUDataPaths:
    if not _gpu_data:
        raise ConfigError("the gpu profile reads real data from local files, but no paths are set in this "
                          "process: load the notebook's parameters first (copes_lib.protocols.notebooks."
                          "load_params does it from profiles/gpu.yaml, 01_substrate_and_agent), or call "
                          "copes_lib.tasks.use_gpu_data(GPUDataPaths(...))")
    return _gpu_data[0]


def _require(value: str, name: str, what: str = "file") -> str:
    """``value`` of the gpu parameter ``name``; an error naming the parameter when it is empty or its
    path (``what``: a JSONL file, or a folder) does not exist."""
    if not value:
        raise ConfigError(f"{name} is empty: the gpu profile reads real data from local files; set {name} in "
                          "profiles/gpu.yaml (01_substrate_and_agent) or pass it to notebook 01 with "
                          f"papermill -p {name} ...")
    for path in _paths_of(value) if what == "file" else [value]:
        found = Path(path).is_file() if what == "file" else Path(path).is_dir()
        if not found:
            problem = "does not exist" if not Path(path).exists() else f"is not a {what}"
            raise ConfigError(f"{name}: {path} {problem}; set {name} in profiles/gpu.yaml (01_substrate_and_agent) "
                              f"to a local {'JSONL file' if what == 'file' else 'folder'}")
    return value


def _paths_of(value: str) -> list[str]:
    """The file paths in a parameter: one path, or ``benchmark=path`` pairs (MATH_TEST_FILES ...)."""
    if "=" not in value:
        return [value]
    return [part.partition("=")[2].strip() for part in value.split(",") if part.partition("=")[2].strip()]


_TRAIN_FILE = {"math": "MATH_TRAIN_JSONL", "qa": "QA_TRAIN_JSONL"}
_TEST_FILES = {"math": "MATH_TEST_FILES", "qa": "QA_TEST_FILES"}


@functools.lru_cache(maxsize=4)
def _gpu_train_val(kind: str, path: str, holdout: int) -> dict[str, list[Task]]:
    """Training file minus a validation hold-out, stratified by MATH subject (``type`` / ``subject``)."""
    from copes_lib.tasks.loaders import read_tasks, stratified_holdout

    tasks, subjects = read_tasks(path, "math" if kind == "math" else "qa")
    strata = subjects if kind == "math" else [""] * len(tasks)
    if not 0 < holdout < len(tasks):
        raise ConfigError(f"VAL_HOLDOUT = {holdout}: {_TRAIN_FILE[kind]} ({path}) has {len(tasks)} usable problems; "
                          f"VAL_HOLDOUT must be between 1 and {len(tasks) - 1}")
    train, val = stratified_holdout(tasks, holdout, strata, DATA_SEED)
    return {"train": train, "val": val}


@functools.lru_cache(maxsize=4)
def _gpu_benchmarks(kind: str, spec: str) -> dict[str, list[Task]]:
    from copes_lib.tasks.loaders import BENCHMARKS, parse_test_files, read_tasks

    files = parse_test_files(spec, kind, _TEST_FILES[kind])
    return {bench: read_tasks(path, BENCHMARKS[bench][1], prefix=bench)[0] for bench, path in files.items()}


def _gpu_tasks(kind: str, split: str) -> list[Task]:
    p = _gpu_paths()
    if split == TUNING_SPLIT:  # holding it out of MATH's train file would change the training set
        raise ConfigError("the gpu profile has no tuning split: its sweeps are off (SWEEP_SIGMAS / SWEEP_LRS_* "
                          "empty in profiles/gpu.yaml, the paper's settings)")
    if split == "test":
        spec = _require(getattr(p, _TEST_FILES[kind].lower()), _TEST_FILES[kind])
        return [t for tasks in _gpu_benchmarks(kind, spec).values() for t in tasks]
    path = _require(getattr(p, _TRAIN_FILE[kind].lower()), _TRAIN_FILE[kind])
    return _gpu_train_val(kind, path, p.val_holdout)[split]


def load_benchmarks(profile: str, kind: str) -> dict[str, list[Task]]:
    """The named test sets of ``kind``: on the gpu profile those of ``MATH_TEST_FILES`` /
    ``QA_TEST_FILES`` (Tables 1 and 4: aime24, aime25, gsm8k, math500, math_test; hotpotqa, 2wiki,
    musique), task ids prefixed with the benchmark's name; on smoke / cpu the one generated test split,
    named ``test``. The test split of :func:`load_tasks` is their concatenation."""
    _check(profile, kind)
    if profile == "gpu":
        p = _gpu_paths()
        return {b: list(t) for b, t in _gpu_benchmarks(kind, _require(getattr(p, _TEST_FILES[kind].lower()),
                                                                       _TEST_FILES[kind])).items()}
    return {"test": load_tasks(profile, kind, "test")}


# --------------------------------------------------------------------------- public
def load_tasks(profile: str, kind: str, split: str, variant: str | None = None) -> list[Task]:
    """The tasks of one split, in a fixed order (a fresh list; Task objects are immutable); generated data of
    ``variant`` (default: the one in effect, :func:`data_variant`)."""
    _check(profile, kind, split)
    if profile == "gpu":
        return list(_gpu_tasks(kind, split))
    return list(_generated_tasks(profile, kind, _variant(profile, kind, variant))[split])


def profile_splits(profile: str) -> tuple[str, ...]:
    """The splits ``profile`` has: train, val, test and, where the data are generated, the tuning split (the
    gpu profile has none: its sweeps are off).

    >>> profile_splits("cpu"), profile_splits("gpu")
    (('train', 'val', 'test', 'tune'), ('train', 'val', 'test'))
    """
    return tuple(SPLITS) if profile == "gpu" else (*SPLITS, TUNING_SPLIT)


def unit_report(profile: str, kind: str) -> dict[str, dict]:
    """Per split of ``profile``: problems, distinct latent units, the largest unit's problems and share
    (:func:`copes_lib.tasks.units.describe_units`); no model needed."""
    return {split: describe_units(load_tasks(profile, kind, split)) for split in profile_splits(profile)}


def task_ids(profile: str, kind: str, split: str) -> list[str]:
    return [t.id for t in load_tasks(profile, kind, split)]


def load_passages(profile: str, kind: str, variant: str | None = None) -> list[tuple[str, str, str]]:
    """(id, title, text) of the search corpus of one task kind (generated data: of ``variant``, default the
    one in effect, :func:`data_variant`)."""
    _check(profile, kind)
    if profile == "gpu":
        from copes_lib.tasks.loaders import load_corpus_jsonl

        return load_corpus_jsonl(_require(_gpu_paths().search_corpus_jsonl, "SEARCH_CORPUS_JSONL"))
    return list(_generated_world(profile, kind, _variant(profile, kind, variant))[0])


def tool_settings(profile: str, kind: str) -> tuple[dict[str, int], int]:
    """(tool limits {"python", "search"}, passages per search call) of ``kind`` under ``profile``: the
    :class:`AgentToolSettings` set by :func:`use_tool_settings` (notebook 01's ``MATH_PYTHON_CALLS`` ...
    ``QA_SEARCH_CALLS`` and ``SEARCH_TOP_K``) (defaults: the
    paper's limits, math 5 Python + 3 search, QA 5 + 5; one passage on smoke / cpu, Search-R1's 3 on gpu)."""
    _check(profile, kind)
    p = _tool_settings.get(profile, AgentToolSettings())
    return ({"python": getattr(p, f"{kind}_python_calls"), "search": getattr(p, f"{kind}_search_calls")},
            p.search_top_k)


def describe_split_file(profile: str, kind: str, variant: str | None = None) -> dict:
    """The saved split record (ids per split and content fingerprints) of ``variant`` (default: the one in
    effect); generated on first use. Reading it is cheap, so cache keys use it instead of generating the tasks."""
    _check(profile, kind)
    if profile == "gpu":
        raise ConfigError("the gpu profile's splits come from local files; use load_tasks")
    variant = _variant(profile, kind, variant)
    path = split_file(profile, kind, variant)
    if not path.exists():
        _generated_tasks(profile, kind, variant)
    return json.loads(path.read_text())


def data_fingerprint(profile: str, kind: str, variant: str | None = None) -> dict:
    """What a cache key needs to know about the generated data of ``variant`` (default: the one in effect):
    split fingerprints, sizes, search k (and a non-standard variant's name; the standard data's keys are as
    before variants existed)."""
    limits, top_k = tool_settings(profile, kind)
    variant = _variant(profile, kind, variant)
    return {"splits": describe_split_file(profile, kind, variant)["fingerprint"],
            "sizes": generated_sizes(profile, kind, variant),
            "search_k": top_k, "limits": limits, "seed": DATA_SEED, **_variant_field(variant)}
