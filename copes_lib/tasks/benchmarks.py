"""Test decoding per benchmark (the paper's Tables 1 and 4).

The paper evaluates every method on five math benchmarks (AIME24, AIME25, GSM8K test, MATH-500,
MATH-Test) and three QA sets (HotpotQA, 2Wiki, MuSiQue), each with temperature 0.3, top-p 1.0 and
32 samples per problem (256 for AIME), scored by unbiased pass@k (math) or Acc / EM / F1 (QA).
:func:`evaluate_benchmarks` runs that protocol over :func:`copes_lib.tasks.load_benchmarks`; the
notebook supplies the sampler (its cached ``sample_test``). On smoke / cpu there is one benchmark,
the generated test split named ``test``, and the notebooks' summaries keep their single-split keys;
the per-benchmark keys of :func:`benchmark_summary` appear only for named benchmarks (gpu).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from copes_lib.tasks.protocol import Task

#: the benchmark a notebook's single headline numbers (pass@k figure, Table 1 / 4 frame) use.
HEADLINE = {"math": ("math500", "test"), "qa": ("2wiki", "test")}
#: the paper's names of the benchmarks.
PAPER_NAMES = {"aime24": "AIME24", "aime25": "AIME25", "gsm8k": "GSM8K", "math500": "MATH-500",
               "math_test": "MATH-Test", "hotpotqa": "HotpotQA", "2wiki": "2Wiki", "musique": "MuSiQue"}


def samples_for(benchmark: str, samples: int, aime_samples: int) -> int:
    """Samples per problem: ``aime_samples`` for AIME (paper: 256), ``samples`` otherwise (paper: 32)."""
    return aime_samples if benchmark.startswith("aime") else samples


def headline_benchmark(names: Sequence[str], kind: str) -> str:
    """MATH-500 for math, 2Wiki for QA (the paper's figures' benchmarks), else the generated ``test``
    split, else the first given."""
    if not names:
        raise ValueError("no benchmarks: set MATH_TEST_FILES / QA_TEST_FILES (notebook 01, gpu profile)")
    return next((n for n in HEADLINE[kind] if n in names), names[0])


def evaluate_benchmarks(models: dict[str, Any], benchmarks: dict[str, list[Task]],
                        sample: Callable[[Any, list[Task], int, str], dict], *, samples: int,
                        aime_samples: int, max_problems: int = 0) -> dict[str, dict[str, dict]]:
    """``{method: {benchmark: sample(model, tasks, n, label)}}`` with n from :func:`samples_for` and
    the first ``max_problems`` problems of each benchmark (0 = all). ``label`` is the method's name,
    followed by the benchmark's for named benchmarks."""
    out: dict[str, dict[str, dict]] = {}
    for method, model in models.items():
        out[method] = {}
        for name, tasks in benchmarks.items():
            chosen = list(tasks[:max_problems] if max_problems else tasks)
            label = method if name == "test" else f"{method} {name}"
            out[method][name] = sample(model, chosen, samples_for(name, samples, aime_samples), label)
    return out


def _pass_at_k(result: dict, k: int) -> float:
    from copes_lib import stats

    return float(stats.pass_at_k_curve(result["correct_counts"], result["samples"])[k - 1])


def benchmark_summary(results: dict[str, dict[str, dict]], kind: str, keys: dict[str, str]) -> dict[str, Any]:
    """Flat summary keys per named benchmark; ``keys`` maps the notebook's method names to the short
    names of its summary keys (e.g. ``{"CoPES @16": "copes"}``). Math: ``test_pass1_<method>_<bench>``
    and ``test_pass<n>_<method>_<bench>`` (unbiased pass@k at k = 1 and k = n); QA: ``acc_`` / ``em_``
    / ``f1_<method>_<bench>``. Also ``test_problems_<bench>`` and ``test_samples_<bench>``. The
    generated ``test`` split (smoke / cpu) adds nothing: those notebooks keep their own keys."""
    out: dict[str, Any] = {}
    for method, by_bench in results.items():
        short = keys[method]
        for bench, result in by_bench.items():
            if bench == "test":
                continue
            out[f"test_problems_{bench}"] = result["problems"]
            out[f"test_samples_{bench}"] = result["samples"]
            if kind == "math":
                out[f"test_pass1_{short}_{bench}"] = _pass_at_k(result, 1)
                out[f"test_pass{result['samples']}_{short}_{bench}"] = _pass_at_k(result, result["samples"])
            else:
                for metric in ("acc", "em", "f1"):
                    out[f"{metric}_{short}_{bench}"] = float(result[metric])
    return out


def benchmark_frame(results: dict[str, dict[str, dict]], kind: str):
    """One row per (method, benchmark): problems, samples, pass@1 (math, %) or Acc / EM / F1 (QA, %)."""
    import pandas as pd

    rows = []
    for method, by_bench in results.items():
        for bench, result in by_bench.items():
            row = {"method": method, "benchmark": PAPER_NAMES.get(bench, bench), "problems": result["problems"],
                   "samples": result["samples"]}
            if kind == "math":
                row["pass@1 %"] = 100 * _pass_at_k(result, 1)
                row[f"pass@{result['samples']} %"] = 100 * _pass_at_k(result, result["samples"])
            else:
                row.update({f"{m} %": 100 * float(result[m]) for m in ("acc", "em", "f1")})
            rows.append(row)
    return pd.DataFrame(rows)
