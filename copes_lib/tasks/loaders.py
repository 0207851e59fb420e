"""Loaders for the paper's real datasets from local JSONL files (gpu profile).

Formats (one JSON object per line); ``fmt`` names the parser:

- ``math``: hendrycks MATH ``{problem, level, type, solution}`` (answer = the solution's last
  ``\\boxed{}``; a row without one is dropped, as the paper drops 2 unusable problems) or MATH-500
  ``{problem, answer, subject, level, unique_id}``.
- ``aime``: ``{problem | Problem, answer | Answer, id | ID}`` (AIME 2024 / 2025 releases).
- ``gsm8k``: ``{question, answer}`` with the answer ending in ``#### 72``.
- ``qa``: HotpotQA ``{_id, question, answer, supporting_facts, context, level}``, 2Wiki
  ``{_id, question, answer, ...}``, MuSiQue ``{id, question, answer, answer_aliases, answerable}``
  (rows with ``answerable: false`` are dropped).
- Search corpus (:func:`load_corpus_jsonl`): ``{id, contents: '"Title"\\ntext'}`` (Search-R1) or
  ``{id, title, text}``.

A row missing a required field fails with the file, the line, the expected fields and, when the row
looks like another known format, that format (a GSM8K or HotpotQA file given as MATH, a MATH file
given as QA). Rows without an id get ``<prefix>-<line>-<hash of the question>``, stable for a given
file. Real data has no gold agent traces, so ``Task.reference`` is empty (the gpu profile starts from
a pretrained checkpoint instead of a warm start). The validation hold-out follows the paper (see
docs/paper_a_copes.md): a subject-stratified sample of the training file (:func:`stratified_holdout`),
the subject being MATH's ``type`` (hendrycks) or ``subject`` (MATH-500) field.

Named test sets (Tables 1 and 4): :data:`BENCHMARKS` maps each benchmark name to its task kind and
format; :func:`parse_test_files` reads the ``name=path,name=path`` parameters.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from pathlib import Path

from copes_lib.tasks.protocol import Task
from copes_lib.tasks.rewards import boxed_values

_LEVELS = {"easy": 1, "medium": 2, "hard": 3}

#: benchmark name -> (task kind, row format). Tables 1 (math) and 4 (QA) of the paper.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "aime24": ("math", "aime"), "aime25": ("math", "aime"), "gsm8k": ("math", "gsm8k"),
    "math500": ("math", "math"), "math_test": ("math", "math"),
    "hotpotqa": ("qa", "qa"), "2wiki": ("qa", "qa"), "musique": ("qa", "qa"),
}

#: format -> (description, required fields; a tuple inside means "one of these").
FORMATS: dict[str, tuple[str, tuple]] = {
    "math": ("MATH (hendrycks {problem, level, type, solution} or MATH-500 {problem, answer, subject, "
             "level, unique_id})", ("problem", ("solution", "answer"))),
    "aime": ("AIME {problem | Problem, answer | Answer, id}", (("problem", "Problem"), ("answer", "Answer"))),
    "gsm8k": ("GSM8K {question, answer ending in '#### N'}", ("question", "answer")),
    "qa": ("multi-hop QA (HotpotQA / 2Wiki {_id, question, answer, ...}, MuSiQue {id, question, answer, "
           "answer_aliases, ...})", ("question", "answer")),
}


class DataFormatError(ValueError):
    """A data file does not have the expected format; the message names the file, line and fields."""


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON objects of a JSONL file (blank lines skipped); each gets its line number as ``__line__``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist; set the path parameter to a local JSONL file")
    if path.is_dir():
        raise DataFormatError(f"dataset path {path} is a folder; it must be a JSONL file (one JSON object a line)")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                row = json_object(line, lambda number=number: f"{path}:{number}")
                row["__line__"] = number
                rows.append(row)
    return rows


def json_object(line: str | bytes, where, what: str = "") -> dict:
    """One JSONL line as a dict, else a :class:`DataFormatError` that starts with ``where()`` (``file:line``,
    computed only on error) and says what was expected (``what``: e.g. "a search-corpus row")."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataFormatError(f"{where()}: not valid JSON ({error}); expected one JSON object per line") from error
    if not isinstance(row, dict):
        raise DataFormatError(f"{where()}: expected a JSON object{f' ({what})' if what else ''}, got "
                              f"{type(row).__name__}")
    return row


def guess_format(row: dict) -> str | None:
    """The format a row looks like (for error messages), or None."""
    if "contents" in row or ("title" in row and "text" in row):
        return "search corpus"
    if ("problem" in row or "Problem" in row) and ("solution" in row or "type" in row):
        return "math"
    if "Problem" in row or ("problem" in row and ("answer" in row or "Answer" in row)):
        return "math" if "subject" in row or "unique_id" in row else "aime"
    if "question" in row and "####" in str(row.get("answer", "")):
        return "gsm8k"
    if "question" in row and ("supporting_facts" in row or "_id" in row or "answer_aliases" in row):
        return "qa"
    return None


def check_fields(row: dict, fmt: str, path: str | Path) -> None:
    """Raise :class:`DataFormatError` unless ``row`` has the required fields of ``fmt``."""
    description, required = FORMATS[fmt]
    missing = [f if isinstance(f, str) else " | ".join(f) for f in required
               if not any(name in row for name in ((f,) if isinstance(f, str) else f))]
    if fmt == "gsm8k" and not missing and "####" not in str(row["answer"]):
        missing = ["an answer ending in '#### N'"]
    if missing:
        looks = guess_format(row)
        hint = f"; this row looks like {looks}" if looks and looks != fmt else ""
        fields = sorted(k for k in row if k != "__line__")
        raise DataFormatError(f"{path}:{row.get('__line__', '?')}: expected a {description} row; missing "
                              f"{missing}; the row has fields {fields}{hint}")


def _hash_id(prefix: str, row: dict, text: str) -> str:
    return f"{prefix}-{row.get('__line__', 0)}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def _level(value) -> int:
    if isinstance(value, str) and value.lower() in _LEVELS:
        return _LEVELS[value.lower()]
    found = re.search(r"\d+", str(value if value is not None else ""))
    return int(found.group()) if found else 0


def parse_math_row(row: dict, prefix: str = "math") -> Task | None:
    """One MATH-format row; None when no answer can be found (the paper drops 2 such problems)."""
    answer = row.get("answer")
    if answer is None:
        boxed = boxed_values(row.get("solution", ""))
        answer = boxed[-1] if boxed else None
    if answer is None or not str(answer).strip():
        return None
    ident = row.get("unique_id") or _hash_id(prefix, row, row["problem"])
    return Task(str(ident), "math", row["problem"], (str(answer).strip(),), _level(row.get("level")))


def parse_aime_row(row: dict, prefix: str = "aime") -> Task | None:
    """One AIME row (``Problem``/``Answer`` capitalised in some releases)."""
    problem = row.get("problem", row.get("Problem"))
    answer = row.get("answer", row.get("Answer"))
    if answer is None or not str(answer).strip():
        return None
    ident = row.get("id", row.get("ID")) or _hash_id(prefix, row, problem)
    return Task(str(ident), "math", problem, (str(answer).strip(),), 0)


def parse_gsm8k_row(row: dict, prefix: str = "gsm8k") -> Task | None:
    """One GSM8K row: the answer follows ``####``; thousands separators are removed."""
    tail = str(row.get("answer", "")).split("####")
    if len(tail) < 2:
        return None
    answer = tail[-1].strip().replace(",", "")
    return Task(str(row.get("id") or _hash_id(prefix, row, row["question"])), "math", row["question"], (answer,), 0)


def parse_qa_row(row: dict, prefix: str = "qa") -> Task | None:
    """One HotpotQA / 2Wiki / MuSiQue row (gold answer plus any aliases)."""
    if row.get("answerable") is False:
        return None
    answers = [row.get("answer")] + list(row.get("answer_aliases") or [])
    answers = tuple(str(a) for a in answers if a not in (None, ""))
    if not answers:
        return None
    ident = row.get("_id") or row.get("id") or _hash_id(prefix, row, row["question"])
    return Task(str(ident), "qa", row["question"], answers, _level(row.get("level")))


_PARSERS = {"math": parse_math_row, "aime": parse_aime_row, "gsm8k": parse_gsm8k_row, "qa": parse_qa_row}


def read_tasks(path: str | Path, fmt: str, prefix: str | None = None) -> tuple[list[Task], list[str]]:
    """(tasks, subject of each task) of one local file in format ``fmt`` (see the module docstring).
    The subject is MATH's ``type`` / ``subject`` field ("" when absent); ids get ``prefix/`` when given."""
    if fmt not in _PARSERS:
        raise ValueError(f"fmt = {fmt!r} is not valid; valid values: {sorted(_PARSERS)}")
    tasks, subjects = [], []
    rows = read_jsonl(path)
    if not rows:
        raise DataFormatError(f"{path}: the file has no rows; expected {FORMATS[fmt][0]} rows")
    for row in rows:
        check_fields(row, fmt, path)
        task = _PARSERS[fmt](row)
        if task is None:
            continue
        if prefix:
            task = Task(f"{prefix}/{task.id}", task.kind, task.question, task.answers, task.difficulty)
        tasks.append(task)
        subjects.append(str(row.get("type", row.get("subject", "")) or ""))
    if not tasks:
        raise DataFormatError(f"{path}: none of its {len(rows)} rows has a usable answer ({FORMATS[fmt][0]})")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        duplicated = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise DataFormatError(f"{path}: duplicate ids {duplicated}; ids must be unique")
    return tasks, subjects


def load_jsonl_tasks(path: str | Path, fmt: str) -> list[Task]:
    """Tasks of one local file; ``fmt`` in math / aime / gsm8k / qa (HotpotQA, 2Wiki and MuSiQue share one)."""
    return read_tasks(path, fmt)[0]


def parse_test_files(spec: str, kind: str, name: str = "TEST_FILES") -> dict[str, str]:
    """``"aime24=/p/a.jsonl,gsm8k=/p/g.jsonl"`` -> {benchmark: path}, in the given order; each name
    must be a benchmark of ``kind`` (:data:`BENCHMARKS`), once. An empty spec gives {}."""
    valid = [b for b, (k, _) in BENCHMARKS.items() if k == kind]
    out: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        bench, sep, path = (x.strip() for x in item.partition("="))
        if not sep or not path:
            raise ValueError(f"{name}: {item!r} must be benchmark=path; e.g. {valid[0]}=/data/{valid[0]}.jsonl")
        if bench not in valid:
            raise ValueError(f"{name}: unknown {kind} benchmark {bench!r}; valid names: {valid}")
        if bench in out:
            raise ValueError(f"{name}: benchmark {bench!r} is given twice")
        out[bench] = path
    return out


def corpus_passage(row: dict, index: int, path: str | Path, line=None) -> tuple[str, str, str]:
    """(id, title, text) of one corpus row (its id defaults to its position ``index``). ``line``: its line
    number, or a function that counts it (called only for an error message); default: ``row['__line__']``."""
    if "contents" in row:
        title, _, text = str(row["contents"]).partition("\n")
        title = title.strip().strip('"')
    elif "text" in row:
        title, text = row.get("title", ""), row["text"]
    else:
        looks = guess_format(row)
        raise DataFormatError(
            f"{path}:{line() if callable(line) else line or row.get('__line__', f'passage {index}')}: expected a search-corpus row "
            "{id, contents: '\"Title\"\\ntext'} (Search-R1) or {id, title, text}; the row has fields "
            f"{sorted(k for k in row if k != '__line__')}" + (f"; it looks like {looks}" if looks else ""))
    return str(row.get("id", index)), title, text


def load_corpus_jsonl(path: str | Path) -> list[tuple[str, str, str]]:
    """(id, title, text) rows of a local search corpus; a duplicated id is an error naming the first
    duplicate and its line (:func:`check_unique_ids`)."""
    rows = read_jsonl(path)
    if not rows:
        raise DataFormatError(f"{path}: the search corpus has no passages; expected one JSON object a line, "
                              "{id, contents} (Search-R1) or {id, title, text}")
    passages = [corpus_passage(row, i, path) for i, row in enumerate(rows)]
    check_unique_ids(((p[0], row["__line__"]) for p, row in zip(passages, rows, strict=True)), path)
    return passages


def check_unique_ids(ids_and_lines, path: str | Path) -> None:
    """Raise :class:`DataFormatError` at the first (id, line) whose id an earlier line already used: the
    search tool returns passages by id, so two passages with one id would answer for each other."""
    first: dict[str, int] = {}
    for ident, line in ids_and_lines:
        if ident in first:
            raise DataFormatError(f"{path}:{line}: duplicate passage id {ident!r} (first used at line "
                                  f"{first[ident]}); every corpus row needs its own id")
        first[ident] = line


def corpus_file_ids(path: str | Path):
    """(id, line number) of every non-blank row of a corpus JSONL file, streamed (for files too large to
    hold in memory); a row without an id gets its position, as :func:`corpus_passage` does."""
    index = 0
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(f"{path}:{number}: not valid JSON ({error}); expected one JSON "
                                      "object per line") from error
            yield str(row.get("id", index)) if isinstance(row, dict) else str(index), number
            index += 1


def stratified_holdout(tasks: list[Task], n_holdout: int, strata: list[str], seed: int) -> tuple[list[Task], list[Task]]:
    """(train, holdout): ``n_holdout`` tasks drawn proportionally from each stratum (e.g. MATH subject)."""
    if len(strata) != len(tasks):
        raise ValueError("strata must give one label per task")
    if not 0 < n_holdout < len(tasks):
        raise ValueError(f"n_holdout = {n_holdout} must be between 1 and {len(tasks) - 1} "
                         f"(the training file has {len(tasks)} usable problems); lower VAL_HOLDOUT")
    groups: dict[str, list[int]] = defaultdict(list)
    for i, label in enumerate(strata):
        groups[label].append(i)
    rng = random.Random(seed)
    chosen: set[int] = set()
    labels = sorted(groups)
    quotas = {g: int(n_holdout * len(groups[g]) / len(tasks)) for g in labels}
    for g in sorted(labels, key=lambda g: -len(groups[g]))[: n_holdout - sum(quotas.values())]:
        quotas[g] += 1
    for g in labels:
        chosen.update(rng.sample(groups[g], min(quotas[g], len(groups[g]))))
    train = [t for i, t in enumerate(tasks) if i not in chosen]
    holdout = [t for i, t in enumerate(tasks) if i in chosen]
    return train, holdout
