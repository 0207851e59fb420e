"""The search index of each task kind: built once per process over the generated passages (smoke /
cpu) or, on the gpu profile, over a local corpus file whose index is built once under
``cache/<profile>/`` and memory-mapped on load (BM25 or the dense retriever of
:mod:`copes_lib.tools.dense`). Passages of a corpus file are read from disk on demand
(:class:`CorpusFile`), never all held in memory. The search tool itself is
:mod:`copes_lib.tools.search`; this module belongs to the data, so tools never import tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from copes_lib.tools.search import BM25Retriever, Passage, Retriever


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
        from copes_lib.tasks.loaders import corpus_passage, json_object

        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._handle is None or self._handle.closed:
            self._handle = open(self.path, "rb")  # noqa: SIM115 (kept open for the retriever's lifetime)
        self._handle.seek(int(self.offsets[i]))
        line = self._handle.readline()
        row = json_object(line, lambda: f"{self.path}:{self._line_number(i)}", "a search-corpus row")
        return Passage(*corpus_passage(row, i, self.path, line=lambda: self._line_number(i)))

    def _line_number(self, i: int) -> int:
        """The 1-based line of passage ``i`` (counted only for an error message)."""
        with open(self.path, "rb") as handle:
            return handle.read(int(self.offsets[i])).count(b"\n") + 1

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
        from copes_lib.tasks.loaders import DataFormatError, check_unique_ids, corpus_file_ids

        log(f"[search] building the {kind} index of {corpus_path} (once) in {folder}")
        check_unique_ids(corpus_file_ids(corpus_path), corpus_path)
        offsets = CorpusFile.line_offsets(corpus_path)
        if not len(offsets):
            raise DataFormatError(f"{corpus_path}: the search corpus (SEARCH_CORPUS_JSONL) has no passages; "
                                  "expected one JSON object a line, {id, contents} or {id, title, text}")
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


def shared_retriever(profile: str, kind: str, variant: str | None = None) -> Retriever:
    """The search tool's retriever of ``kind`` under ``profile``, built once per process and shared by
    every environment. smoke / cpu: BM25 over the generated passages of the data variant ``variant``
    (default: the one in effect, :func:`copes_lib.tasks.data_variant`), in memory. gpu: the corpus file
    of notebook 01's ``SEARCH_CORPUS_JSONL`` through :func:`file_retriever` (``RETRIEVER``,
    ``EMBEDDING_MODEL_PATH``), cached on disk and memory-mapped."""
    if profile != "gpu":
        from copes_lib.tasks import data_variant, load_passages

        variant = data_variant(profile, kind) if variant is None else variant
        if (profile, kind, variant) not in _SHARED:
            passages = load_passages(profile, kind, variant)
            _SHARED[(profile, kind, variant)] = BM25Retriever([Passage(i, t, x) for i, t, x in passages])
        return _SHARED[(profile, kind, variant)]
    from copes_lib import runs
    from copes_lib.tasks import _gpu_paths, _require

    p = _gpu_paths()
    key = (profile, p.search_corpus_jsonl, p.retriever, p.embedding_model_path)
    if key not in _SHARED:
        corpus = _require(p.search_corpus_jsonl, "SEARCH_CORPUS_JSONL")
        if not Path(corpus).is_file():
            raise FileNotFoundError(f"SEARCH_CORPUS_JSONL = {corpus!r} is not a file; set it to the local "
                                    "corpus JSONL (Search-R1's wiki-18 {id, contents})")
        model = _require(p.embedding_model_path, "EMBEDDING_MODEL_PATH", "folder") if p.retriever == "dense" else ""
        _SHARED[key] = file_retriever(corpus, runs.CACHE_ROOT / profile, p.retriever, model,
                                      p.embedding_query_prefix, p.embedding_passage_prefix)
    return _SHARED[key]
