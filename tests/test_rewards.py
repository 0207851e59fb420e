"""Answer extraction, math correctness, QA metrics and the paper's rewards (docs/paper_a_copes.md#a4-task-agent-reward-and-data)."""

import doctest

import pytest

from copes_lib.tasks import rewards
from copes_lib.tasks.rewards import (
    extract_answer,
    format_reward,
    format_reward_value,
    math_equal,
    math_reward,
    normalize_qa,
    qa_metrics,
    qa_reward,
)


def test_doctests_pass():
    failures, tried = doctest.testmod(rewards)
    assert tried > 10 and failures == 0


@pytest.mark.parametrize("text,expected", [
    (r"<answer>\boxed{3}</answer><answer>\boxed{1} then \boxed{2}</answer>", "2"),  # last block, last boxed
    (r"<answer>first</answer> <answer> second </answer>", "second"),                 # block without boxed
    (r"<answer>open but not closed \boxed{9}", "9"),                                 # no complete block
    (r"\boxed{4} and \boxed{5}", "5"),                                               # last boxed anywhere
    ("no markup at all", "no markup at all"),                                        # whole output
    (r"<answer>\boxed{\frac{1}{2}}</answer>", r"\frac{1}{2}"),                       # nested braces
])
def test_extraction_order(text, expected):
    assert extract_answer(text) == expected


def test_format_reward_levels():
    assert format_reward_value(r"<answer>\boxed{1}</answer>") == 0.0
    assert format_reward_value(r"\boxed{1}") == -0.5
    assert format_reward_value("<answer>1</answer>") == -0.5
    assert format_reward_value("<answer>1") == -1.0
    assert format_reward(None, ["x", r"<answer>\boxed{2}</answer>"]) == [-1.0, 0.0]


def test_math_equal_cases():
    assert math_equal("1,000", "1000")
    assert math_equal(r"\dfrac{3}{4}", r"\frac{3}{4}")
    assert math_equal("2/4", r"\frac{1}{2}")
    assert math_equal(r"\text{12}", "12")
    assert not math_equal("", "0")
    assert not math_equal("13", "12")
    assert not math_equal("garbage{{", "12")


def test_math_reward_tool_bonus_only_when_correct():
    ok, tool, none = r"<answer>\boxed{7}</answer>", {"python": 1, "search": 0}, {"python": 0, "search": 0}
    assert math_reward(None, [ok], [("7",)], [tool]) == [1.1]
    assert math_reward(None, [ok], [("7",)], [none]) == [1.0]
    assert math_reward(None, [ok], [("8",)], [tool]) == [0.0]          # wrong: no bonus
    assert math_reward(None, ["7"], [("7",)], [tool]) == [0.1]         # correct, both formats missing
    assert math_reward(None, ["<answer>7</answer>"], ["7"], [none]) == [0.5]  # a bare string gold works too


def test_qa_normalisation_and_metrics():
    assert normalize_qa("The  Élan, an Ode") == "elan, ode"  # punctuation kept
    m = qa_metrics("the Oskelia", ["Oskelia", "Osk"])
    assert m == {"acc": 1.0, "em": 1.0, "f1": 1.0}
    m = qa_metrics("Kotel Vinye of Mirath", ["Kotel Vinye"])
    assert m["acc"] == 1.0 and m["em"] == 0.0 and m["f1"] == pytest.approx(2 * (2 / 4) * 1 / (2 / 4 + 1))
    assert qa_metrics("", ["x"]) == {"acc": 0.0, "em": 0.0, "f1": 0.0}


def test_qa_reward():
    out = qa_reward(None, [r"<answer>\boxed{Kotel Vinye}</answer>", r"<answer>\boxed{Kotel}</answer>", "nothing"],
                    [("Kotel Vinye",)] * 3, [{"search": 2}, {"search": 0}, {"search": 1}])
    assert out == pytest.approx([1.1, 2 / 3, -1.0])
