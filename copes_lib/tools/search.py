"""Passage search for the agent's ``<search>`` tool: BM25 through ``bm25s`` or a dense retriever
(:mod:`copes_lib.tools.dense`, a local embedding model + FAISS), behind one small Protocol.

Departure from the paper: the paper searches a Wikipedia dump with an E5 dense retriever and FAISS
(the Search-R1 setup, top 3 passages). The smoke / cpu miniature searches its generated knowledge
base with BM25 (lower-cased word tokens, English stop words removed, no stemmer), one passage per
call. The gpu profile reads a local corpus file (Search-R1's ``{id, contents}`` JSONL) and uses BM25 by
default or, with ``RETRIEVER: dense`` and ``EMBEDDING_MODEL_PATH`` (e.g. a local E5 checkpoint), the
dense retriever; either index is built once, saved under ``cache/<profile>/`` keyed on the corpus
fingerprint, and memory-mapped on load, so notebooks and Ray workers share one build and the
operating system's page cache. Passages of a corpus file are read from disk on demand
(:class:`CorpusFile`), never all held in memory.

Ranking is deterministic: by score, ties broken by the passage's position in the corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Passage:
    """One retrievable unit of the corpus."""

    id: str
    title: str
    text: str


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns, for each query, its top-``k`` passages (best first)."""

    def search(self, queries: list[str], k: int) -> list[list[Passage]]: ...


def _check_queries(queries: list[str], k: int) -> None:
    if isinstance(queries, str):
        raise ValueError("queries must be a list of strings, got a single str; wrap it in a list")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    for i, query in enumerate(queries):
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"queries[{i}] must be a non-empty string, got {query!r}")


class BM25Retriever:
    """BM25 over ``title + text`` of every passage.

    >>> corpus = [Passage("a", "Vorlan", "Vorlan is a river in Estmark."),
    ...           Passage("b", "Estmark", "Estmark is a country; its capital is Lirra.")]
    >>> [p.id for p in BM25Retriever(corpus).search(["Which country holds the Vorlan river?"], k=1)[0]]
    ['a']
    """

    def __init__(self, passages: Sequence[Passage], k1: float = 1.5, b: float = 0.75, index=None):
        import bm25s

        if isinstance(passages, (list, tuple)) or not hasattr(passages, "__getitem__"):
            passages = list(passages)
            ids = [p.id for p in passages]
            if len(set(ids)) != len(ids):
                duplicates = sorted({i for i in ids if ids.count(i) > 1})[:5]
                raise ValueError(f"passages must have unique ids; duplicated: {duplicates}")
        if not len(passages):
            raise ValueError("passages must be a non-empty list of Passage")
        self.passages = passages
        self._bm25s = bm25s
        if index is None:
            tokens = bm25s.tokenize([f"{p.title} {p.text}" for p in passages], stopwords="en",
                                    show_progress=False)
            index = bm25s.BM25(k1=k1, b=b)
            index.index(tokens, show_progress=False)
        self._index = index

    def save(self, folder: str | Path) -> None:
        """The index (not the passages) as bm25s files in ``folder``."""
        self._index.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: str | Path, passages: Sequence[Passage], mmap: bool = True) -> BM25Retriever:
        """The index saved by :meth:`save`, memory-mapped (``mmap``), over the same ``passages``."""
        import bm25s

        index = bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False)
        return cls(passages, index=index)

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (zeros when no query word is in the corpus)."""
        words = self._bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        known = [w for w in words if w in self._index.vocab_dict]
        if not known:
            return np.zeros(len(self.passages), dtype=np.float32)
        return np.asarray(self._index.get_scores(known))

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages for each query, best first; ties go to the earlier passage."""
        _check_queries(queries, k)
        k = min(k, len(self.passages))
        results = []
        for query in queries:
            scores = self.scores(query)
            # every passage scoring at least the k-th best is a candidate, so ties at the cut are
            # resolved by position and not by argpartition's arbitrary order
            threshold = np.partition(scores, len(scores) - k)[len(scores) - k]
            candidates = np.flatnonzero(scores >= threshold)
            order = candidates[np.lexsort((candidates, -scores[candidates]))][:k]
            results.append([self.passages[i] for i in order])
        return results


def format_passages(passages: list[Passage]) -> str:
    """The search observation shown to the model (Search-R1 style: ``Doc 1 (Title: ...) text``)."""
    return "\n".join(f"Doc {i} (Title: {p.title}) {p.text}" for i, p in enumerate(passages, start=1))


class CorpusFile(Sequence):
    """The passages of a local corpus JSONL file, read on demand: a byte offset per line (``offsets``,
    a memory-mapped ``.npy``) and one ``seek`` per passage, so a 21M-passage corpus is never held in
    memory. Rows: Search-R1's ``{id, contents: '"Title"\\ntext'}`` or ``{id, title, text}``."""

    def __init__(self, path: str | Path, offsets: np.ndarray):
        self.path, self.offsets = Path(path), offsets
        self._handle = None

    @staticmethod
    def line_offsets(path: str | Path) -> np.ndarray:
        """Byte offset of every non-blank line of ``path`` (one pass over the file)."""
        offsets, position = [], 0
        with open(path, "rb") as handle:
            for line in handle:
                if line.strip():
                    offsets.append(position)
                position += len(line)
        return np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):
        from copes_lib.tasks.loaders import corpus_passage

        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._handle is None or self._handle.closed:
            self._handle = open(self.path, "rb")  # noqa: SIM115 (kept open for the retriever's lifetime)
        self._handle.seek(int(self.offsets[i]))
        line = self._handle.readline()
        return Passage(*corpus_passage(json.loads(line), i, self.path))

    def __getstate__(self):  # a Ray worker reopens the file
        return {"path": self.path, "offsets": self.offsets}

    def __setstate__(self, state):
        self.path, self.offsets, self._handle = state["path"], state["offsets"], None


def corpus_fingerprint(path: str | Path) -> dict:
    """What identifies a corpus file cheaply: its resolved path, size, modification time and a hash of
    its first and last MiB (hashing a 14 GB corpus on every load would take minutes). A file changed
    in place with the same size and time is not noticed; delete ``cache/<profile>/retriever-*`` then."""
    path = Path(path).resolve()
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(1 << 20))
        if stat.st_size > 2 << 20:
            handle.seek(stat.st_size - (1 << 20))
            digest.update(handle.read())
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256_ends": digest.hexdigest()}


def _build_once(folder: Path, build) -> None:
    """Run ``build(tmp_folder)`` and move the result to ``folder`` atomically, unless it exists
    (concurrent builders: the first to finish wins, the others discard their copy)."""
    if folder.exists():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        os.rename(tmp, folder)
    except OSError:
        if not folder.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def file_retriever(corpus_path: str | Path, cache_root: str | Path, kind: str = "bm25",
                   embedding_model: str = "", query_prefix: str = "", passage_prefix: str = "",
                   log=print) -> Retriever:
    """A retriever over a corpus file, built once into ``cache_root/retriever-<key>/`` (key: the corpus
    fingerprint and the retriever's settings) and memory-mapped from there afterwards."""
    from copes_lib import runs

    if kind not in ("bm25", "dense"):
        raise ValueError(f"RETRIEVER = {kind!r} is not valid; valid values: ['bm25', 'dense']")
    settings = {"retriever": kind, "corpus": corpus_fingerprint(corpus_path)}
    if kind == "dense":
        from copes_lib.tools.dense import model_fingerprint

        settings.update(model=model_fingerprint(embedding_model), query_prefix=query_prefix,
                        passage_prefix=passage_prefix)
    folder = Path(cache_root) / f"retriever-{runs.cache_key(settings)}"

    def build(tmp: Path) -> None:
        log(f"[search] building the {kind} index of {corpus_path} (once) in {folder}")
        offsets = CorpusFile.line_offsets(corpus_path)
        np.save(tmp / "offsets.npy", offsets)
        corpus = CorpusFile(corpus_path, offsets)
        if kind == "bm25":
            BM25Retriever(corpus).save(tmp / "bm25")
        else:
            from copes_lib.tools.dense import DenseRetriever

            DenseRetriever(corpus, embedding_model, query_prefix=query_prefix,
                           passage_prefix=passage_prefix).save(tmp / "dense")
        (tmp / "settings.json").write_text(json.dumps(settings, indent=1))

    _build_once(folder, build)
    corpus = CorpusFile(corpus_path, np.load(folder / "offsets.npy", mmap_mode="r"))
    if kind == "bm25":
        return BM25Retriever.load(folder / "bm25", corpus, mmap=True)
    from copes_lib.tools.dense import DenseRetriever

    return DenseRetriever.load(folder / "dense", corpus, embedding_model, query_prefix=query_prefix,
                               passage_prefix=passage_prefix)


_SHARED: dict[tuple, Retriever] = {}


def shared_retriever(profile: str, kind: str) -> Retriever:
    """The search tool's retriever of ``kind`` under ``profile``, built once per process and shared by
    every environment. smoke / cpu: BM25 over the generated passages, in memory. gpu: the corpus file
    of notebook 01's ``SEARCH_CORPUS_JSONL`` through :func:`file_retriever` (``RETRIEVER``,
    ``EMBEDDING_MODEL_PATH``), cached on disk and memory-mapped."""
    if profile != "gpu":
        if (profile, kind) not in _SHARED:
            from copes_lib.tasks import load_passages

            _SHARED[(profile, kind)] = BM25Retriever([Passage(i, t, x) for i, t, x in load_passages(profile, kind)])
        return _SHARED[(profile, kind)]
    from copes_lib import runs
    from copes_lib.substrate import substrate_params
    from copes_lib.tasks import _require

    p = substrate_params("gpu")
    key = (profile, p.SEARCH_CORPUS_JSONL, p.RETRIEVER, p.EMBEDDING_MODEL_PATH)
    if key not in _SHARED:
        corpus = _require(p.SEARCH_CORPUS_JSONL, "SEARCH_CORPUS_JSONL")
        if not Path(corpus).is_file():
            raise FileNotFoundError(f"SEARCH_CORPUS_JSONL = {corpus!r} is not a file; set it to the local "
                                    "corpus JSONL (Search-R1's wiki-18 {id, contents})")
        model = _require(p.EMBEDDING_MODEL_PATH, "EMBEDDING_MODEL_PATH") if p.RETRIEVER == "dense" else ""
        _SHARED[key] = file_retriever(corpus, runs.CACHE_ROOT / profile, p.RETRIEVER, model,
                                      p.EMBEDDING_QUERY_PREFIX, p.EMBEDDING_PASSAGE_PREFIX)
    return _SHARED[key]
