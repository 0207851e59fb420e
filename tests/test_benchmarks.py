"""Per-benchmark test decoding (Tables 1 and 4): samples per benchmark, unbiased pass@k, summary keys
and the claims rows they add (only on named benchmarks, so smoke / cpu outputs are unchanged)."""

import pytest

from copes_lib import claims
from copes_lib.stats import pass_at_k
from copes_lib.tasks import Task
from copes_lib.tasks import benchmarks as tb


def _tasks(prefix, n):
    return [Task(f"{prefix}/{i}", "math", f"q{i}", ("1",), 0) for i in range(n)]


def fake_sampler(calls):
    """Problem j of a benchmark is solved by the first j samples (a known pass@k)."""
    def sample(model, tasks, n, label):
        calls.append((model, label, len(tasks), n))
        scores = [[1.0 if s < j else 0.0 for s in range(n)] for j in range(len(tasks))]
        return {"label": label, "samples": n, "problems": len(tasks), "scores": scores,
                "correct_counts": [min(j, n) for j in range(len(tasks))], "acc": 0.5, "em": 0.25, "f1": 0.4}
    return sample


def test_paper_samples_per_benchmark_and_problem_cap():
    calls = []
    bench = {"aime24": _tasks("aime24", 3), "gsm8k": _tasks("gsm8k", 5), "math500": _tasks("math500", 4)}
    out = tb.evaluate_benchmarks({"CoPES @16": "m1", "standard ES @16": "m2"}, bench, fake_sampler(calls),
                                 samples=32, aime_samples=256, max_problems=4)
    assert [(m, label, n_tasks, n) for m, label, n_tasks, n in calls[:3]] == [
        ("m1", "CoPES @16 aime24", 3, 256), ("m1", "CoPES @16 gsm8k", 4, 32), ("m1", "CoPES @16 math500", 4, 32)]
    assert tb.headline_benchmark(list(bench), "math") == "math500"
    summary = tb.benchmark_summary(out, "math", {"CoPES @16": "copes", "standard ES @16": "es"})
    # problem j solved by j of n samples: unbiased pass@1 is the mean of j / n
    assert summary["test_pass1_copes_aime24"] == pytest.approx((0 + 1 + 2) / 256 / 3)
    assert summary["test_pass256_copes_aime24"] == pytest.approx(2 / 3)
    assert summary["test_pass32_es_gsm8k"] == pytest.approx(sum(pass_at_k(32, c, 32) for c in range(4)) / 4)
    assert summary["test_samples_aime24"] == 256 and summary["test_problems_gsm8k"] == 4
    frame = tb.benchmark_frame(out, "math")
    assert list(frame["benchmark"][:3]) == ["AIME24", "GSM8K", "MATH-500"]


def test_generated_split_adds_no_keys_and_keeps_labels():
    calls = []
    out = tb.evaluate_benchmarks({"base": "m"}, {"test": _tasks("t", 2)}, fake_sampler(calls), samples=8,
                                 aime_samples=256)
    assert calls == [("m", "base", 2, 8)]  # the label (and so the cpu cache entry) is the method's name
    assert tb.benchmark_summary(out, "math", {"base": "base"}) == {}
    assert tb.headline_benchmark(["test"], "qa") == "test"


def test_qa_summary_keys_and_claim_rows_only_when_measured():
    out = tb.evaluate_benchmarks({"copes": 1, "es": 2}, {"2wiki": _tasks("2wiki", 2), "musique": _tasks("m", 2)},
                                 fake_sampler([]), samples=4, aime_samples=4)
    summary = tb.benchmark_summary(out, "qa", {"copes": "copes", "es": "es"})
    assert summary["f1_copes_2wiki"] == 0.4 and summary["em_es_musique"] == 0.25
    base_rows = claims.judge_claims({})
    rows = claims.judge_claims({"07_multihop_qa": {**summary, "f1_copes_musique": 0.5}})
    added = [r for r in rows if r["claim"].startswith("A8-")]
    assert len(rows) == len(base_rows) + 2 and [r["claim"] for r in added] == ["A8-2wiki", "A8-musique"]
    assert added[0]["paper_figure"] == "55.5 vs 51.53" and added[1]["verdict"] == claims.PARTLY
    assert added[0]["verdict"] == claims.DISAGREES  # 0.4 vs 0.4: not higher
