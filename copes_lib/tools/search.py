"""Passage search for the agent's ``<search>`` tool: BM25 through ``bm25s`` or a dense retriever
(:mod:`copes_lib.tools.dense`, a local embedding model + FAISS), behind one small Protocol.

Departure from the paper: the paper searches a Wikipedia dump with an E5 dense retriever and FAISS
(the Search-R1 setup, top 3 passages). The smoke / cpu miniature searches its generated knowledge
base with BM25 (lower-cased word tokens, English stop words removed, no stemmer), one passage per
call. The gpu profile reads a local corpus file (Search-R1's ``{id, contents}`` JSONL) and uses BM25 by
default or, with ``RETRIEVER: dense`` and ``EMBEDDING_MODEL_PATH`` (e.g. a local E5 checkpoint), the
dense retriever; either index is built once, saved under ``cache/<profile>/`` keyed on the corpus
fingerprint, and memory-mapped on load, so notebooks and Ray workers share one build and the
operating system's page cache (:mod:`copes_lib.tasks.retrieval`, which owns the corpus files and the
per-process index of each task kind).

Ranking is deterministic: by score, ties broken by the passage's position in the corpus.
"""

from __future__ import annotations

import dataclasses
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
            first: dict[str, int] = {}
            for position, p in enumerate(passages):
                if p.id in first:
                    raise ValueError(f"passages must have unique ids: passage {position} repeats id {p.id!r} "
                                     f"of passage {first[p.id]}")
                first[p.id] = position
        if not len(passages):
            raise ValueError("passages must be a non-empty list of Passage")
        self.passages = passages
        self._bm25s = bm25s
        if index is None:
            tokens = bm25s.tokenize([f"{p.title} {p.text}" for p in passages], stopwords="en",
                                    show_progress=False)
            if not tokens.vocab:  # bm25s would fail inside with "max() arg is an empty sequence"
                raise ValueError(f"the {len(passages)} passages hold no indexable word (empty or stop words "
                                 "only): a search corpus needs text")
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
