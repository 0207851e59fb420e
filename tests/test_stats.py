import math
from itertools import combinations

import pytest

from copes_lib import stats


def test_pass_at_k_matches_brute_force():
    n, c = 6, 2
    outcomes = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(combinations(range(n), k))
        brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
        assert stats.pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="k must be"):
        stats.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c must be"):
        stats.pass_at_k(4, 5, 1)


def test_mean_ci_and_paired_difference():
    mean, low, high = stats.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and low < 2.0 < high
    assert math.isnan(stats.mean_ci([1.0])[1])
    d = stats.paired_difference([1.0, 2.0, 3.5], [0.5, 1.0, 2.0])
    assert d["mean"] == pytest.approx(1.0) and d["p"] < 0.2
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_difference([1.0], [1.0, 2.0])


def test_gain_recovery_and_first_step():
    assert stats.gain_recovery(0.88, 0.492, 0.9147) == pytest.approx(0.918, abs=1e-3)
    with pytest.raises(ValueError, match="undefined"):
        stats.gain_recovery(0.5, 0.4, 0.4)
    assert stats.first_step_reaching([0, 8], [0.1, 0.2], 0.5) is None
