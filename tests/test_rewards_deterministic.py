"""The answer check has no wall-clock limit: its work is bounded by a rule on the input
(rewards.bounded_work), so the same answers score the same on an idle and on a busy CPU."""

import subprocess
import sys
import warnings

import pytest

from copes_lib.tasks import rewards

# answers that reach math-verify (symbolic, not plain numbers), right and wrong, cheap and costlier
PAIRS = [("2/4", r"\frac{1}{2}"), (r"\frac{6}{8}", "0.75"), ("x+1", "1+x"), (r"\sqrt{16}", "4"), ("2^{10}", "1024"),
         (r"\frac{1}{3}+\frac{1}{6}", "0.5"), (r"(x+1)^2", "x^2+2x+1"), (r"\sqrt{2}\cdot\sqrt{8}", "4"), ("3!", "6"),
         (r"\frac{7}{3}", "2.3"), (r"x^2-1", "(x-1)(x+1)"), (r"\pi", "3.14159"), ("2^{10^{10}}", "1"),
         ("1000!", "1"), (r"\frac{\frac{\frac{1}{2}}{3}}{4}", r"\frac{1}{24}"), ("e^{2}", "7.389")]


def _score_all() -> list[bool]:
    rewards.math_equal.cache_clear()  # score afresh, not from the cache
    return [rewards.math_equal(p, g) for p, g in PAIRS]


def test_math_verify_is_called_without_a_wall_clock_timeout(monkeypatch):
    import math_verify

    seen = []
    real_parse, real_verify = math_verify.parse, math_verify.verify

    def parse(text, **kw):
        seen.append(("parse", kw.get("parsing_timeout", "default")))
        return real_parse(text, **kw)

    def verify(gold, pred, **kw):
        seen.append(("verify", kw.get("timeout_seconds", "default")))
        return real_verify(gold, pred, **kw)

    monkeypatch.setattr(math_verify, "parse", parse)
    monkeypatch.setattr(math_verify, "verify", verify)
    _score_all()
    assert seen and all(limit is None for _, limit in seen), seen


def test_the_same_answers_score_the_same_under_a_busy_cpu():
    idle = _score_all()
    assert idle[:5] == [True] * 5 and idle[12:14] == [False, False]  # the check still works, towers are out
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        loaded = [_score_all() for _ in range(2)]
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    assert loaded == [idle, idle]
    assert not rewards.BACKSTOP_FIRED


def test_inputs_outside_the_rule_are_wrong_without_parsing(monkeypatch):
    import math_verify

    def never(*a, **k):
        raise AssertionError("parsed an input outside the rule")

    monkeypatch.setattr(math_verify, "parse", never)
    rewards.math_equal.cache_clear()
    for text in ("2^{10^{10}}", "10^{99999}", "9**9**9", "100000!", "1" * 40 + "x", "(" * 9 + "1" + ")" * 9):
        assert not rewards.bounded_work(text)
        assert rewards.math_equal(text, "1") is False


def test_the_cpu_backstop_scores_wrong_and_is_counted(monkeypatch):
    def spin(p, g):
        while True:
            pass

    monkeypatch.setattr(rewards, "_symbolic_equal", spin)
    monkeypatch.setattr(rewards, "CPU_BACKSTOP_S", 0.05)
    monkeypatch.setattr(rewards, "BACKSTOP_FIRED", rewards.collections.Counter())
    rewards.math_equal.cache_clear()
    with pytest.warns(RuntimeWarning, match="CPU-time backstop"):
        assert rewards.math_equal("x+1", "1+x") is False
    assert rewards.BACKSTOP_FIRED["x+1"] == 1
    rewards.math_equal.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rewards.math_equal("7", "7.0")  # plain numbers never reach the symbolic check
