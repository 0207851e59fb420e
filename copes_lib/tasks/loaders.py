"""Loaders for the paper's real datasets from local JSONL files (gpu profile).

Formats (one JSON object per line):
- MATH (hendrycks / MATH-500 style): ``problem``, ``solution`` (answer = its last ``\\boxed{}``) or
  ``answer``, optional ``level`` ("Level 3"), ``type``/``subject``, ``unique_id``.
- GSM8K: ``question``, ``answer`` ending in ``#### 72``.
- HotpotQA / 2Wiki: ``_id`` (or ``id``), ``question``, ``answer``, ``level`` (Hotpot: easy/medium/hard).
- MuSiQue: ``id``, ``question``, ``answer``, ``answer_aliases``, optional ``answerable`` (false rows dropped).
- Search corpus: ``id`` and either ``title`` + ``text`` or Search-R1's ``contents`` ("title"\\ntext).
Real data has no gold agent traces, so ``Task.reference`` is empty (the gpu profile starts from a
pretrained checkpoint instead of a warm start). The validation hold-out follows PAPERS.md A4: a
subject-stratified sample of the training file (:func:`stratified_holdout`).
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


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist; set the path parameter to a local JSONL file")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error
    return rows


def _hash_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def parse_math_row(row: dict, prefix: str = "math") -> Task | None:
    """One MATH-format row; None when no answer can be found (the paper drops 2 such problems)."""
    answer = row.get("answer")
    if answer is None:
        boxed = boxed_values(row.get("solution", ""))
        answer = boxed[-1] if boxed else None
    if answer is None or not str(answer).strip():
        return None
    level = re.search(r"\d+", str(row.get("level", "")))
    ident = row.get("unique_id") or _hash_id(prefix, row["problem"])
    return Task(str(ident), "math", row["problem"], (str(answer).strip(),), int(level.group()) if level else 0)


def parse_gsm8k_row(row: dict, prefix: str = "gsm8k") -> Task | None:
    """One GSM8K row: the answer follows ``####``; thousands separators are removed."""
    tail = str(row.get("answer", "")).split("####")
    if len(tail) < 2:
        return None
    answer = tail[-1].strip().replace(",", "")
    return Task(str(row.get("id") or _hash_id(prefix, row["question"])), "math", row["question"], (answer,), 0)


def parse_qa_row(row: dict, prefix: str = "qa") -> Task | None:
    """One HotpotQA / 2Wiki / MuSiQue row (gold answer plus any aliases)."""
    if row.get("answerable") is False:
        return None
    answers = [row.get("answer")] + list(row.get("answer_aliases") or [])
    answers = tuple(str(a) for a in answers if a not in (None, ""))
    if not answers:
        return None
    ident = row.get("_id") or row.get("id") or _hash_id(prefix, row["question"])
    level = _LEVELS.get(str(row.get("level", "")).lower(), 0)
    return Task(str(ident), "qa", row["question"], answers, level)


def load_jsonl_tasks(path: str | Path, fmt: str) -> list[Task]:
    """Tasks of one local file; ``fmt`` in math / gsm8k / qa (HotpotQA, 2Wiki and MuSiQue share one)."""
    parsers = {"math": parse_math_row, "gsm8k": parse_gsm8k_row, "qa": parse_qa_row}
    if fmt not in parsers:
        raise ValueError(f"fmt = {fmt!r} is not valid; valid values: {sorted(parsers)}")
    tasks = [t for t in (parsers[fmt](row) for row in read_jsonl(path)) if t is not None]
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate ids; ids must be unique")
    return tasks


def load_corpus_jsonl(path: str | Path) -> list[tuple[str, str, str]]:
    """(id, title, text) rows of a local search corpus."""
    out = []
    for i, row in enumerate(read_jsonl(path)):
        if "contents" in row:
            title, _, text = row["contents"].partition("\n")
            title = title.strip().strip('"')
        else:
            title, text = row.get("title", ""), row.get("text", "")
        out.append((str(row.get("id", i)), title, text))
    return out


def stratified_holdout(tasks: list[Task], n_holdout: int, strata: list[str], seed: int) -> tuple[list[Task], list[Task]]:
    """(train, holdout): ``n_holdout`` tasks drawn proportionally from each stratum (e.g. MATH subject)."""
    if len(strata) != len(tasks):
        raise ValueError("strata must give one label per task")
    if not 0 < n_holdout < len(tasks):
        raise ValueError(f"n_holdout = {n_holdout} must be between 1 and {len(tasks) - 1}")
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
