"""Strict vs lenient scoring, protocol failures, and the base-regime criterion (docs/regime.md).

The paper's reward asks for two things at once: the right answer (the skill) and the right form
(an ``<answer>`` block with a ``\\boxed{}`` value, tool calls in their tags: the protocol). Paper A's
base has the skill and misses the form (docs/regime.md#r1-why-a-second-regime); these functions
tell the two apart on any base, from the model-written text the reward sees:

- :func:`strict_correctness`: the reward fully earned (r_f = 0 and the extracted answer right;
  math a = 1, QA exact match);
- :func:`lenient_correctness`: strict, or the right answer anywhere in the final turn (the text after
  the last tool call);
- :func:`classify_trajectory` / :func:`protocol_failures`: one class per trajectory, protocol
  failures (no / malformed / misplaced answer, malformed tool call) vs skill failures;
- :class:`RegimeCriterion` and :func:`judge_regime`: the four values of docs/regime.md#r2-the-base-regime-criterion
  and whether a base meets the declared targets.

All are TRL-style (``prompts, completions, answers, **kw``) and touch no model: the caller rolls out
(``copes_lib.rollout.evaluate(..., return_batches=True)``) and passes the batches' model texts and
tool-call counts (:func:`regime_from_batches` does it for rollout batches).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from copes_lib.config import Config, ConfigError, param
from copes_lib.tasks.protocol import ANSWER_OPEN, BOXED, PYTHON_CLOSE, SEARCH_CLOSE, last_call
from copes_lib.tasks.rewards import (
    _ANSWER_BLOCK,
    _golds,
    _text,
    boxed_values,
    extract_answer,
    format_reward_value,
    math_equal,
    normalize_qa,
    qa_metrics,
)

#: Classes of :func:`classify_trajectory`; every class but ``strict`` and ``wrong_answer`` is a
#: protocol failure (docs/regime.md#r2-the-base-regime-criterion).
STRICT, WRONG = "strict", "wrong_answer"
PROTOCOL_FAILURES = ("no_answer", "malformed_answer", "malformed_tool_call", "misplaced_answer")
CLASSES = (STRICT, *PROTOCOL_FAILURES, WRONG)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_TOOL_CLOSE = re.compile(f"{re.escape(PYTHON_CLOSE)}|{re.escape(SEARCH_CLOSE)}")


def _check_kind(kind: str) -> None:
    if kind not in ("math", "qa"):
        raise ConfigError(f"kind = {kind!r} is not valid; valid values: ['math', 'qa']")


def final_turn(text: str) -> str:
    """The model text after its last tool call (every earlier turn ends on a closing tool tag).

    >>> final_turn("<python>print(2+3)</python>Answer: 5")
    'Answer: 5'
    >>> final_turn("Answer: 5")
    'Answer: 5'
    """
    ends = [m.end() for m in _TOOL_CLOSE.finditer(text)]
    return text[ends[-1]:] if ends else text


def _right(prediction: str, golds: tuple[str, ...], kind: str) -> bool:
    """The reward's own notion of a right extracted answer: math a = 1; QA exact match (F1 = 1)."""
    if kind == "math":
        return any(math_equal(prediction, g) for g in golds)
    return qa_metrics(prediction, golds)["em"] == 1.0


def _in_final_turn(text: str, golds: tuple[str, ...], kind: str) -> bool:
    turn = final_turn(text)
    if kind == "qa":
        t = normalize_qa(turn)
        return any(normalize_qa(g) and normalize_qa(g) in t for g in golds)
    candidates = [*boxed_values(turn), *_ANSWER_BLOCK.findall(turn), *_NUMBER.findall(turn)]
    return any(math_equal(c, g) for c in candidates if c.strip() for g in golds)


def strict_correctness(prompts, completions, answers, kind: str = "math", **kw) -> list[float]:
    """1.0 where the paper's reward is fully earned: answer block + boxed value (r_f = 0) and the
    extracted answer right (math a = 1; QA exact match).

    >>> strict_correctness(None, [r"<answer>\\boxed{66}</answer>", "<answer>66</answer>", "Answer: 66"],
    ...                    [("66",)] * 3)
    [1.0, 0.0, 0.0]
    """
    _check_kind(kind)
    return [float(format_reward_value(_text(c)) == 0.0 and _right(extract_answer(_text(c)), _golds(a), kind))
            for c, a in zip(completions, answers)]


def lenient_correctness(prompts, completions, answers, kind: str = "math", **kw) -> list[float]:
    """1.0 where the completion is strict, or the right answer appears anywhere in its final turn
    (math: a boxed value, answer block or number equal to the gold; QA: a normalised gold answer is a
    substring of the normalised final turn).

    >>> lenient_correctness(None, ["<python>print(60+6)</python>Answer: 66", "<python>print(6)</python>Answer: 65",
    ...                            "The total is 66 apples."], [("66",)] * 3)
    [1.0, 0.0, 1.0]
    >>> lenient_correctness(None, ["<search>Brightfold</search>Answer: Oskelia", "<search>Oskelia</search>No idea"],
    ...                     [("Oskelia",)] * 2, kind="qa")
    [1.0, 0.0]
    """
    strict = strict_correctness(prompts, completions, answers, kind)
    return [float(s == 1.0 or _in_final_turn(_text(c), _golds(a), kind))
            for s, c, a in zip(strict, completions, answers)]


def _malformed_tool_call(text: str) -> bool:
    """A turn that closed a tool tag without a matching opening tag or with an empty body."""
    start = 0
    for m in _TOOL_CLOSE.finditer(text):
        tool = "python" if m.group(0) == PYTHON_CLOSE else "search"
        body = last_call(text[start:m.end()], tool)
        if body is None or not body.strip():
            return True
        start = m.end()
    return False


def classify_trajectory(text: str, answers, kind: str = "math") -> str:
    """One class of :data:`CLASSES`, decided in order: strict; answer form (no answer: neither block
    nor boxed value; malformed: one of them missing or an unclosed one); a malformed tool call;
    misplaced (well-formed, extracted answer wrong, right answer elsewhere in the final turn); else a
    skill failure (``wrong_answer``).

    >>> [classify_trajectory(t, ("66",)) for t in [r"<answer>\\boxed{66}</answer>", "Answer: 66",
    ...  "<answer>66</answer>", r"print(1)</python><answer>\\boxed{65}</answer>",
    ...  r"66 <answer>\\boxed{65}</answer>", r"<python>print(65)</python><answer>\\boxed{65}</answer>"]]
    ['strict', 'no_answer', 'malformed_answer', 'malformed_tool_call', 'misplaced_answer', 'wrong_answer']
    """
    _check_kind(kind)
    text, golds = _text(text), _golds(answers)
    if strict_correctness(None, [text], [golds], kind)[0]:
        return STRICT
    has_block, has_boxed = bool(_ANSWER_BLOCK.search(text)), bool(boxed_values(text))
    if not has_block and not has_boxed and ANSWER_OPEN not in text and BOXED not in text:
        return "no_answer"
    if not (has_block and has_boxed):
        return "malformed_answer"
    if _malformed_tool_call(text):
        return "malformed_tool_call"
    if _in_final_turn(text, golds, kind):
        return "misplaced_answer"
    return WRONG


def protocol_failures(prompts, completions, answers, kind: str = "math", **kw) -> list[float]:
    """1.0 where a trajectory fails by its form (a protocol failure), 0.0 where it is strict or a
    skill failure.

    >>> protocol_failures(None, ["Answer: 66", r"<answer>\\boxed{65}</answer>"], [("66",)] * 2)
    [1.0, 0.0]
    """
    return [float(classify_trajectory(c, a, kind) in PROTOCOL_FAILURES) for c, a in zip(completions, answers)]


# --------------------------------------------------------------------------- the criterion
@dataclasses.dataclass(frozen=True)
class RegimeCriterion(Config):
    """The declared targets of one task kind (docs/regime.md#the-papers-analogue-and-the-targets-derived-from-it).
    A base is in regime when all four hold (strict between its two bounds)."""

    def check(self) -> None:
        if self.min_strict > self.max_strict:
            raise ConfigError(f"min_strict = {self.min_strict} must be <= max_strict = {self.max_strict}")

    min_lenient: float = param(0.55, "lenient accuracy at least this (paper: MATH-500 57.4%)", ge=0.0, le=1.0)
    max_strict: float = param(0.15, "strict accuracy at most this (paper: GSM8K 9.2%)", ge=0.0, le=1.0)
    min_strict: float = param(0.05, "strict accuracy at least this: greedy ES needs members that earn the reward "
                              "(paper: GSM8K 9.2%; docs/regime.md#r2-the-base-regime-criterion)", ge=0.0, le=1.0)
    min_protocol_share: float = param(0.50, "share of failures that are protocol failures at least this "
                                      "(paper: >= 53% of GSM8K's)", ge=0.0, le=1.0)
    min_tool_rate: float = param(0.50, "share of trajectories with a valid tool call at least this", ge=0.0, le=1.0)


#: The targets docs/regime.md declares, per task kind.
CRITERIA = {"math": RegimeCriterion(),
            "qa": RegimeCriterion(min_lenient=0.25, max_strict=0.10, min_strict=0.02, min_protocol_share=0.20, min_tool_rate=0.50)}


#: The strict upper bound on a graded-prior base (docs/preflight.md#p4-the-criterion-on-a-graded-base): the
#: paper's base scores 49.2% on its own validation split (math) and 29.5% Acc on HotpotQA (QA).
GRADED_MAX_STRICT = {"math": 0.492, "qa": 0.30}


def criterion_for(kind: str, prior: str | None = None) -> RegimeCriterion:
    """The declared criterion of ``kind`` for a base built with latent ``prior`` (None, ``cued``,
    ``homogeneous``: :data:`CRITERIA`; ``graded``: its strict upper bound is :data:`GRADED_MAX_STRICT`).

    >>> criterion_for("math", "graded").max_strict, criterion_for("math", "cued").max_strict
    (0.492, 0.15)
    """
    _check_kind(kind)
    if prior == "graded":
        return dataclasses.replace(CRITERIA[kind], max_strict=GRADED_MAX_STRICT[kind])
    return CRITERIA[kind]


def judge_regime(completions: Sequence, answers: Sequence, tool_calls: Sequence[dict] | None, kind: str,
                 criterion: RegimeCriterion | None = None) -> dict:
    """The four values of the criterion on one base's trajectories, the failure classes' counts and
    whether ``criterion`` (default: :data:`CRITERIA`'s for ``kind``) is met. ``tool_calls``: the
    rollout's valid-call counts per trajectory; None counts well-formed calls in the text.

    >>> r = judge_regime(["<python>print(6)</python>Answer: 66"] * 9 + [r"<answer>\\boxed{66}</answer>"],
    ...                  [("66",)] * 10, [{"python": 1, "search": 0}] * 10, "math")
    >>> r["strict"], r["lenient"], r["protocol_share"], r["tool_rate"], r["met"]
    (0.1, 1.0, 1.0, 1.0, True)
    """
    _check_kind(kind)
    criterion = criterion or CRITERIA[kind]
    if not completions or len(completions) != len(answers):
        raise ValueError(f"judge_regime needs as many answers as completions (>= 1), got {len(completions)} "
                         f"and {len(answers)}")
    texts = [_text(c) for c in completions]
    n = len(texts)
    classes = [classify_trajectory(t, a, kind) for t, a in zip(texts, answers)]
    lenient = lenient_correctness(None, texts, answers, kind)
    if tool_calls is None:
        used = [bool(_TOOL_CLOSE.search(t)) and not _malformed_tool_call(t) for t in texts]
    else:
        used = [sum(c.values()) > 0 for c in tool_calls]
    failures = n - classes.count(STRICT)
    values = {
        "n": n,
        "strict": classes.count(STRICT) / n,
        "lenient": sum(lenient) / n,
        "protocol_share": (sum(c in PROTOCOL_FAILURES for c in classes) / failures) if failures else 0.0,
        "tool_rate": sum(used) / n,
        "classes": {c: classes.count(c) for c in CLASSES},
    }
    checks = {"lenient": values["lenient"] >= criterion.min_lenient,
              "strict": criterion.min_strict <= values["strict"] <= criterion.max_strict,
              "protocol_share": failures > 0 and values["protocol_share"] >= criterion.min_protocol_share,
              "tool_rate": values["tool_rate"] >= criterion.min_tool_rate}
    return {**values, "checks": checks, "met": all(checks.values()), "criterion": criterion.to_dict()}


def regime_from_batches(batches, kind: str, criterion: RegimeCriterion | None = None) -> dict:
    """:func:`judge_regime` on rollout batches (``model_texts``, ``tasks``, ``tool_calls``), e.g.
    ``copes_lib.rollout.evaluate(..., return_batches=True)["batches"]``."""
    texts = [t for b in batches for t in b.model_texts]
    answers = [task.answers for b in batches for task in b.tasks]
    calls = [c for b in batches for c in b.tool_calls]
    return judge_regime(texts, answers, calls, kind, criterion)


__all__ = ["CLASSES", "PROTOCOL_FAILURES", "CRITERIA", "GRADED_MAX_STRICT", "criterion_for", "RegimeCriterion", "final_turn", "strict_correctness",
           "lenient_correctness", "classify_trajectory", "protocol_failures", "judge_regime", "regime_from_batches"]
