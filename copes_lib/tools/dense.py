"""Dense passage retrieval: a local sentence-embedding model + a FAISS inner-product index.

The paper's search tool is the Search-R1 setup: E5 embeddings of a Wikipedia dump in a FAISS index,
top 3 passages per query. :class:`DenseRetriever` is that retriever for any local Hugging Face
encoder folder (E5, MiniLM, ...; nothing is downloaded): texts are embedded by mean pooling of the
last hidden states over the attention mask, L2-normalised, so the inner product is the cosine
similarity (what E5 and all-MiniLM-L6-v2 are trained for). E5 expects ``query: `` / ``passage: ``
prefixes (the gpu profile's ``EMBEDDING_QUERY_PREFIX`` / ``EMBEDDING_PASSAGE_PREFIX``).

Departure from Search-R1: an exact flat index (``IndexFlatIP``) instead of a compressed one; it is
exact and needs no training, at 4 x 768 bytes per passage for E5-base (~60 GB for 21M passages, read
memory-mapped). Ties are broken by the passage's position in the corpus, as in BM25.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from copes_lib.tools.search import Passage, _check_queries


def model_fingerprint(path: str | Path) -> dict:
    """What identifies a local encoder: its folder and a hash of its config and weights' sizes."""
    folder = Path(path)
    if not folder.is_dir() or not (folder / "config.json").exists():
        raise FileNotFoundError(f"EMBEDDING_MODEL_PATH = {str(path)!r} is not a local Hugging Face model folder "
                                "(config.json, weights, tokenizer files); e.g. a local copy of intfloat/e5-base-v2")
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    for weights in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return {"path": str(folder.resolve()), "sha256": digest.hexdigest()}


class Encoder:
    """Mean-pooled, L2-normalised sentence embeddings from a local transformers encoder."""

    def __init__(self, path: str | Path, device: str | None = None, max_length: int = 256, batch_size: int = 64):
        import torch
        from transformers import AutoModel, AutoTokenizer

        model_fingerprint(path)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).to(self.device).eval()
        self.max_length, self.batch_size = max_length, batch_size

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        out = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(list(texts[start:start + self.batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
                out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 0), dtype=np.float32)


class DenseRetriever:
    """Top-k passages by cosine similarity of embeddings (FAISS ``IndexFlatIP``).

    ``passages`` is any sequence of :class:`Passage` (a list, or a :class:`~copes_lib.tasks.retrieval.CorpusFile`).
    """

    def __init__(self, passages: Sequence[Passage], model_path: str | Path, index=None, *,
                 query_prefix: str = "", passage_prefix: str = "", encoder: Encoder | None = None):
        import faiss

        if not len(passages):
            raise ValueError("passages must be a non-empty list of Passage")
        self.passages, self.query_prefix = passages, query_prefix
        self.encoder = encoder or Encoder(model_path)
        if index is None:
            vectors = self.encoder([f"{passage_prefix}{p.title} {p.text}".strip() for p in passages])
            index = faiss.IndexFlatIP(vectors.shape[1])
            index.add(vectors)
        self.index = index

    def __len__(self) -> int:
        return len(self.passages)

    def save(self, folder: str | Path) -> None:
        import faiss

        Path(folder).mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(Path(folder) / "index.faiss"))
        (Path(folder) / "info.json").write_text(json.dumps({"passages": len(self.passages), "dim": self.index.d}))

    @classmethod
    def load(cls, folder: str | Path, passages: Sequence[Passage], model_path: str | Path, mmap: bool = True,
             **kwargs) -> DenseRetriever:
        """The index saved by :meth:`save`, memory-mapped (``mmap``), over the same ``passages``."""
        import faiss

        flags = faiss.IO_FLAG_MMAP if mmap else 0
        index = faiss.read_index(str(Path(folder) / "index.faiss"), flags)
        if index.ntotal != len(passages):
            raise ValueError(f"{folder}: the index holds {index.ntotal} passages, the corpus {len(passages)}")
        return cls(passages, model_path, index, **kwargs)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages for each query, best first; ties go to the earlier passage."""
        _check_queries(queries, k)
        k = min(k, len(self.passages))
        vectors = self.encoder([f"{self.query_prefix}{q}" for q in queries])
        # ask for a few more than k, so ties at the cut can be re-ordered by position
        scores, ids = self.index.search(vectors, min(len(self.passages), k + 8))
        results = []
        for row_scores, row_ids in zip(scores, ids):
            ranked = sorted((-s, i) for s, i in zip(row_scores.tolist(), row_ids.tolist()) if i >= 0)
            results.append([self.passages[i] for _, i in ranked[:k]])
        return results
