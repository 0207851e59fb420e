"""Tests of BM25 passage search: ranking, k, batch order, deterministic ties, input checks."""

import pytest

from copes_lib.tools import BM25Retriever, Passage, Retriever, format_passages

CORPUS = [
    Passage("p0", "Vorlan River", "The Vorlan River flows through Estmark and ends in the Grey Sea."),
    Passage("p1", "Estmark", "Estmark is a small country. Its capital is Lirra, founded in 1204."),
    Passage("p2", "Lirra", "Lirra is the capital of Estmark; the mathematician Odile Brask was born there."),
    Passage("p3", "Odile Brask", "Odile Brask proved the Brask lemma and taught at the Lirra academy."),
    Passage("p4", "Grey Sea", "The Grey Sea is cold. Fishing boats from Estmark sail on it."),
    Passage("p5", "Talmo Quarry", "Talmo Quarry produces blue granite for the bridges of Northvale."),
]


@pytest.fixture(scope="module")
def retriever():
    return BM25Retriever(CORPUS)


def test_is_a_retriever(retriever):
    assert isinstance(retriever, Retriever)
    assert len(retriever) == len(CORPUS)


def test_the_passage_naming_the_entity_ranks_first(retriever):
    queries = ["Who proved the Brask lemma?", "Where is Talmo Quarry granite used?",
               "Which sea does the Vorlan River end in?"]
    top = retriever.search(queries, k=1)
    assert [hits[0].id for hits in top] == ["p3", "p5", "p0"]


def test_k_is_respected_and_capped_by_the_corpus(retriever):
    assert [len(hits) for hits in retriever.search(["Estmark capital", "Lirra"], k=3)] == [3, 3]
    assert len(retriever.search(["Estmark"], k=100)[0]) == len(CORPUS)
    hits = retriever.search(["Estmark"], k=3)[0]
    scores = retriever.scores("Estmark")
    ranked = [scores[int(p.id[1:])] for p in hits]
    assert ranked == sorted(ranked, reverse=True)
    assert {p.id for p in hits} <= {"p0", "p1", "p2", "p4"}


def test_batch_order_is_kept(retriever):
    queries = ["Odile Brask", "Talmo Quarry", "Vorlan River", "Grey Sea"]
    batched = retriever.search(queries, k=2)
    single = [retriever.search([q], k=2)[0] for q in queries]
    assert batched == single
    assert [hits[0].id for hits in batched] == ["p3", "p5", "p0", "p4"]


def test_ties_are_broken_by_corpus_position():
    twins = [Passage(f"t{i}", "Same", "identical words here") for i in range(5)]
    hits = BM25Retriever(twins).search(["identical words"], k=3)[0]
    assert [p.id for p in hits] == ["t0", "t1", "t2"]
    # a query with no known word scores every passage 0: still deterministic, still k passages
    assert [p.id for p in BM25Retriever(twins).search(["zebra"], k=2)[0]] == ["t0", "t1"]


def test_bad_inputs_name_the_parameter(retriever):
    with pytest.raises(ValueError, match="k must be"):
        retriever.search(["Lirra"], k=0)
    with pytest.raises(ValueError, match=r"queries\[1\]"):
        retriever.search(["Lirra", "   "], k=1)
    with pytest.raises(ValueError, match="queries must be a list"):
        retriever.search("Lirra", k=1)
    with pytest.raises(ValueError, match="passages"):
        BM25Retriever([])
    with pytest.raises(ValueError, match="unique ids"):
        BM25Retriever([CORPUS[0], CORPUS[0]])


def test_format_passages_is_readable():
    text = format_passages(CORPUS[:2])
    assert text.splitlines()[0] == "Doc 1 (Title: Vorlan River) The Vorlan River flows through Estmark and ends in the Grey Sea."
    assert text.splitlines()[1].startswith("Doc 2 (Title: Estmark)")


def test_duplicate_corpus_ids_name_the_first_duplicate_and_its_line(tmp_path):
    import json

    from copes_lib.tasks.loaders import DataFormatError, load_corpus_jsonl
    from copes_lib.tasks.retrieval import file_retriever

    path = tmp_path / "corpus.jsonl"
    rows = [{"id": "a", "contents": '"A"\nfirst'}, {"id": "b", "contents": '"B"\nsecond'},
            {"id": "a", "contents": '"A2"\nthird'}, {"id": "b", "contents": '"B2"\nfourth'}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for load in (load_corpus_jsonl, lambda p: file_retriever(p, tmp_path / "cache", log=lambda _m: None)):
        with pytest.raises(DataFormatError, match=r"corpus\.jsonl:3: duplicate passage id 'a' \(first used at line 1\)"):
            load(path)


def test_a_corpus_without_words_is_an_error_not_a_bm25s_crash():
    with pytest.raises(ValueError, match="no indexable word"):
        BM25Retriever([Passage("a", "", "the"), Passage("b", "", "a")])
