"""The base-regime criterion (docs/regime.md): strict / lenient scoring, the protocol-failure
classes, the evaluator on known bases, and the registered predictions kept equal to the docs."""

import doctest
import re

import pytest

from copes_lib import regime
from copes_lib.config import REPO_ROOT, ConfigError
from copes_lib.tasks import regime as task_regime
from copes_lib.tasks.regime import (
    CRITERIA,
    RegimeCriterion,
    classify_trajectory,
    judge_regime,
    lenient_correctness,
    strict_correctness,
)

DOC = (REPO_ROOT / "docs" / "regime.md").read_text()
GOLD = ("66",)
TOOL = {"python": 1, "search": 0}
NO_TOOL = {"python": 0, "search": 0}
STRICT = r"<python>print(60+6)</python><answer>\boxed{66}</answer>"
LATENT = "<python>print(60+6)</python>Answer: 66"
WRONG = r"<python>print(60+5)</python><answer>\boxed{65}</answer>"


@pytest.mark.parametrize("module", [task_regime, regime])
def test_doctests_pass(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


def test_strict_needs_form_and_answer_lenient_needs_only_the_answer_in_the_final_turn():
    texts = [STRICT, LATENT, WRONG, "<answer>66</answer>", r"\boxed{66}", "Answer: 66 <python>print(1)</python>x"]
    assert strict_correctness(None, texts, [GOLD] * 6) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # the last one states 66 before a tool call: not in the final turn
    assert lenient_correctness(None, texts, [GOLD] * 6) == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    # QA: strict is exact match in the reward's place; lenient is the gold inside the final turn
    qa = [r"<search>x</search><answer>\boxed{Oskelia}</answer>", "<search>x</search>Answer: Oskelia",
          r"<search>x</search><answer>\boxed{in Oskelia}</answer>", "<search>Oskelia</search>Answer: Mirath"]
    assert strict_correctness(None, qa, [("Oskelia",)] * 4, kind="qa") == [1.0, 0.0, 0.0, 0.0]
    assert lenient_correctness(None, qa, [("Oskelia",)] * 4, kind="qa") == [1.0, 1.0, 1.0, 0.0]
    with pytest.raises(ConfigError, match="kind"):
        strict_correctness(None, texts, [GOLD] * 6, kind="chess")


def test_every_trajectory_gets_one_class():
    cases = {STRICT: "strict", LATENT: "no_answer", "<answer>66": "malformed_answer",
             "<python>print(1)</python><answer>66</answer>": "malformed_answer",
             r"<python></python><answer>\boxed{65}</answer>": "malformed_tool_call",
             r"<python>print(1)</python>66, so <answer>\boxed{65}</answer>": "misplaced_answer",
             WRONG: "wrong_answer"}
    for text, expected in cases.items():
        assert classify_trajectory(text, GOLD) == expected, text
    assert set(cases.values()) == set(task_regime.CLASSES)


def test_a_latent_protocol_base_meets_the_math_criterion():
    texts = [LATENT] * 90 + [STRICT] * 5 + [WRONG] * 5
    r = judge_regime(texts, [GOLD] * 100, [TOOL] * 100, "math")
    assert (r["strict"], r["lenient"], r["tool_rate"]) == (0.05, 0.95, 1.0)
    assert r["protocol_share"] == pytest.approx(90 / 95) and r["met"]
    assert r["classes"] == {"strict": 5, "no_answer": 90, "malformed_answer": 0, "malformed_tool_call": 0,
                            "misplaced_answer": 0, "wrong_answer": 5}


def test_bases_outside_the_regime_miss_the_criterion_for_the_right_reason():
    def missed(texts, calls, kind="math", golds=GOLD):
        r = judge_regime(texts, [golds] * len(texts), calls, kind)
        return sorted(k for k, ok in r["checks"].items() if not ok), r["met"]

    # the skill-gap control: the protocol is followed, the answers are wrong (like the committed cpu base)
    assert missed([STRICT] * 40 + [WRONG] * 60, [TOOL] * 100) == (["lenient", "protocol_share", "strict"], False)
    # a base that already earns the reward: strict too high
    assert missed([STRICT] * 80 + [LATENT] * 20, [TOOL] * 100) == (["strict"], False)
    # the latent form without tools: a tool gap, not the regime
    assert missed([LATENT] * 90 + [STRICT] * 10, [NO_TOOL] * 100) == (["tool_rate"], False)
    # the homogeneous latent base as measured (strict 0): greedy ES's fitness would be constant
    # (docs/regime.md#r3a-the-design-change-a-lower-bound-on-strict-accuracy-and-a-cued-prior)
    assert missed([LATENT] * 100, [TOOL] * 100) == (["strict"], False)
    # every answer wrong in the latent form: no skill (and no reward earned)
    assert missed(["<python>print(1)</python>Answer: 3"] * 100, [TOOL] * 100) == (["lenient", "strict"], False)
    # QA's own targets: lenient 0.3 meets QA's (>= 0.25) but not math's (>= 0.55)
    qa = (["<search>x</search>Answer: Oskelia"] * 27 + ["<search>x</search><answer>\\boxed{Oskelia}</answer>"] * 3
          + ["<search>x</search>Answer: Mirath"] * 70)
    assert missed(qa, [{"python": 0, "search": 1}] * 100, "qa", ("Oskelia",)) == ([], True)
    r = judge_regime(qa, [("Oskelia",)] * 100, None, "qa", CRITERIA["math"])
    assert not r["checks"]["lenient"] and r["tool_rate"] == 1.0  # calls counted from the text


def test_criterion_ranges_and_bad_input():
    with pytest.raises(ConfigError, match="max_strict"):
        RegimeCriterion(max_strict=1.5)
    with pytest.raises(ConfigError, match="min_lenient"):
        RegimeCriterion(min_lenient=-0.1)
    with pytest.raises(ConfigError, match="min_strict"):
        RegimeCriterion(min_strict=0.2, max_strict=0.1)
    with pytest.raises(ValueError, match="as many answers"):
        judge_regime([LATENT], [], None, "math")
    with pytest.raises(ValueError, match="as many answers"):
        judge_regime([], [], None, "math")


def _table(header_start: str) -> list[list[str]]:
    """The body rows of the docs table whose header line starts with ``header_start``."""
    lines = DOC.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([c.strip() for c in line.strip("|").split("|")])
    return body


def test_declared_targets_equal_the_docs():
    rows = {r[0]: r[1:] for r in _table("| kind | lenient accuracy |")[:2]}
    for kind, label in (("math", "math"), ("qa", "QA")):
        lenient, share, tools = (float(re.sub(r"[<>=\s]", "", rows[label][i])) for i in (0, 2, 3))
        low, high = (float(v) for v in re.findall(r"\d+\.\d+", rows[label][1]))
        c = CRITERIA[kind]
        assert (c.min_lenient, c.min_strict, c.max_strict, c.min_protocol_share, c.min_tool_rate) == \
            (lenient, low, high, share, tools)


def test_predictions_equal_the_docs_table():
    rows = [r for r in _table("| id | prediction |") if re.fullmatch(r"R\d+", r[0])]
    assert [r[0] for r in rows] == [p.prediction_id for p in regime.PREDICTIONS]
    for row, p in zip(rows, regime.PREDICTIONS):
        assert row[1:5] == [p.statement, p.quantity, p.agrees_if, p.disagrees_if], p.prediction_id


def test_paper_analogue_is_the_docs_arithmetic():
    math, qa = regime.paper_analogue("math"), regime.paper_analogue("qa")
    assert (math["strict"], math["lenient"]) == pytest.approx((0.0922, 0.5744))
    assert (qa["strict"], qa["lenient"]) == pytest.approx((0.0827, 0.2951))
    assert (round(math["protocol_share"], 2), round(qa["protocol_share"], 2)) == (0.53, 0.23)


def test_measure_regime_rolls_out_any_base_and_judges_it():
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.rollout import make_env
    from copes_lib.substrate import build_agent_model, get_tokenizer, warm_rollout_config
    from copes_lib.tasks import load_tasks

    config = substrate_config("smoke")
    tokenizer = get_tokenizer("smoke", config.vocab_size)
    model = build_agent_model("smoke", len(tokenizer), seed=0)  # untrained: babble, no skill, no protocol
    tasks = load_tasks("smoke", "math", "val")[:4]
    with make_env("math", "smoke") as env:
        r = regime.measure_regime(model, tokenizer, tasks, env, warm_rollout_config(config))
    assert r["n"] == 4 and r["evaluation"]["n"] == 4 and sum(r["classes"].values()) == 4
    assert r["strict"] == 0.0 and not r["met"] and not r["checks"]["lenient"]
    assert r["criterion"] == CRITERIA["math"].to_dict()

