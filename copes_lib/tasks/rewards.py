"""Answer extraction and rewards, as docs/paper_a_copes.md#a4-task-agent-reward-and-data states them, as TRL-style callables.

``reward(prompts, completions, answers, tool_calls, **kw) -> list[float]``: ``completions`` are the
texts the model wrote (the rollout passes the model's own tokens with tool observations removed, so
a tool's output can never supply the answer block), ``answers`` a tuple of gold strings per sample,
``tool_calls`` a ``{"python": n, "search": m}`` dict per sample.

- extraction: the last complete ``<answer>...</answer>`` block; inside it the last ``\\boxed{}``
  value, else the whole block; with no block, the last ``\\boxed{}`` anywhere; else the whole output.
- math: R = a + r_t + r_f, a in {0, 1} (exact number or ``math-verify`` / SymPy equivalence),
  r_t = +0.1 if correct and at least one tool call was made.
- QA: R = F1 + r_t + r_f, r_t = +0.1 if F1 > 0 and a tool was used; normalisation lowercases, drops
  articles and diacritics, collapses whitespace and keeps punctuation; Acc = a normalised gold answer
  is a substring of the normalised prediction; EM; token F1; max over gold answers.
- format: r_f = 0 with both an ``<answer>`` block and a ``\\boxed{}`` answer, -0.5 if one is missing,
  -1 if both are. Departure: the paper does not say where the boxed answer must be; here a complete
  ``\\boxed{}`` anywhere in the model's text counts.
- no wall clock in scoring: math-verify's own limits are wall-clock alarms (a call that runs past them
  under a busy CPU scores as wrong, so the same answers could score differently under load). Here they are
  off (``parsing_timeout=None``, ``timeout_seconds=None``) and the work is bounded by the input instead
  (:func:`bounded_work`: length, digits, powers, exponent towers, factorials, nesting), a rule that reads
  the same on any machine under any load. A CPU-time backstop (``signal.ITIMER_PROF``, main thread only,
  :data:`CPU_BACKSTOP_S` of process CPU, far above any bounded input's cost) guards against an input the
  rule did not foresee; when it fires the answer scores wrong, a warning names it and
  :data:`BACKSTOP_FIRED` counts it, so a load-dependent score can never pass silently.
"""

from __future__ import annotations

import collections
import functools
import re
import signal
import threading
import unicodedata
import warnings
from collections.abc import Sequence

from copes_lib.tasks.protocol import ANSWER_CLOSE, ANSWER_OPEN, BOXED

TOOL_BONUS = 0.1
_MAX_SYMBOLIC = 120  # characters of a prediction sent to SymPy (no dataset answer is longer)
_MAX_DIGITS = 32  # longest run of digits in one number
_MAX_POWERS = 3  # '^' / '**' in one prediction
_MAX_EXPONENT_DIGITS = 3  # digits of a literal exponent (10^999 is cheap; 10^99999 is not)
_MAX_FACTORIAL_DIGITS = 2  # digits of a factorial's argument (99! is cheap)
_MAX_NESTING = 8  # brace / parenthesis depth
CPU_BACKSTOP_S = 10.0  # process CPU seconds one symbolic check may use before it scores wrong (backstop only)
BACKSTOP_FIRED = collections.Counter()  # prediction -> times the CPU backstop fired (should stay empty)
_PROTOCOL_TAG = re.compile(r"</?(python|search|answer|output|result)>")
_ANSWER_BLOCK = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.S)


def _text(completion) -> str:
    """Accept TRL's conversational completions (a list of messages) as well as plain strings."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def boxed_values(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` (balanced braces) in order.

    >>> boxed_values(r"\\boxed{\\frac{1}{2}} and \\boxed{3")
    ['\\\\frac{1}{2}']
    """
    values, start = [], text.find(BOXED)
    while start >= 0:
        depth, i = 1, start + len(BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            values.append(text[start + len(BOXED):i - 1])
        start = text.find(BOXED, start + len(BOXED))
    return values


def extract_answer(text: str) -> str:
    """The predicted answer, by the paper's order of rules.

    >>> extract_answer(r"<answer>\\boxed{1}</answer> ... <answer>so \\boxed{42}</answer>")
    '42'
    >>> extract_answer("<answer> Paris </answer>")
    'Paris'
    >>> extract_answer(r"I think \\boxed{7}.")
    '7'
    >>> extract_answer("just 12")
    'just 12'
    """
    blocks = _ANSWER_BLOCK.findall(text)
    if blocks:
        inside = boxed_values(blocks[-1])
        return (inside[-1] if inside else blocks[-1]).strip()
    anywhere = boxed_values(text)
    return (anywhere[-1] if anywhere else text).strip()


def format_reward_value(text: str) -> float:
    """0 with an answer block and a boxed answer, -0.5 with one of them, -1 with neither.

    >>> [format_reward_value(t) for t in [r"<answer>\\boxed{1}</answer>", "<answer>1</answer>", "1"]]
    [0.0, -0.5, -1.0]
    """
    missing = (not _ANSWER_BLOCK.search(text)) + (not boxed_values(text))
    return {0: 0.0, 1: -0.5, 2: -1.0}[missing]


# --------------------------------------------------------------------------- math correctness
def _clean_math(text: str) -> str:
    text = text.strip().strip("$").strip()
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    text = text.replace("\\!", "").replace("\\,", "").replace("\\left", "").replace("\\right", "")
    text = text.replace("dfrac", "frac").replace("tfrac", "frac")
    return re.sub(r"\s+", "", text).rstrip(".")


def _as_number(text: str) -> float | None:
    candidate = text.replace(",", "") if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text) else text
    try:
        return float(candidate)
    except ValueError:
        return None


_EXPONENT = re.compile(r"(?:\^|\*\*)\s*(\{(?:[^{}]|\{[^{}]*\})*\}|\(?[-+]?[\w.]+\)?)")
_FACTORIAL = re.compile(r"(\d*|[)}\]])\s*!")


def bounded_work(text: str) -> bool:
    """Whether SymPy's work on ``text`` is bounded by the rule of this module (a property of the text, the
    same on any machine under any load): at most _MAX_SYMBOLIC characters, numbers of at most _MAX_DIGITS
    digits, at most _MAX_POWERS powers, literal exponents of at most _MAX_EXPONENT_DIGITS digits and no
    power in an exponent (no towers), factorials only of literal numbers of at most _MAX_FACTORIAL_DIGITS
    digits, nesting at most _MAX_NESTING deep. Text outside the rule is scored wrong without parsing.

    >>> bounded_work(r"\\frac{3}{4}"), bounded_work("2^{10}"), bounded_work("2^{10^{10}}"), bounded_work("10^99999")
    (True, True, False, False)
    >>> bounded_work("5!"), bounded_work("1000!"), bounded_work("(2+3)!")
    (True, False, False)
    """
    if len(text) > _MAX_SYMBOLIC or any(len(run) > _MAX_DIGITS for run in re.findall(r"\d+", text)):
        return False
    if text.count("^") + text.count("**") > _MAX_POWERS:
        return False
    for match in _EXPONENT.finditer(text):
        exponent, after = match.group(1), text[match.end():].lstrip()
        if ("^" in exponent or "**" in exponent or after.startswith(("^", "**"))  # a tower: a power of a power
                or any(len(r) > _MAX_EXPONENT_DIGITS for r in re.findall(r"\d+", exponent))):
            return False
    if ("^" in text or "**" in text) and not _EXPONENT.search(text):
        return False  # a power whose exponent the rule cannot read
    for argument in _FACTORIAL.findall(text):
        if not argument.isdigit() or len(argument) > _MAX_FACTORIAL_DIGITS:
            return False
    depth = deepest = 0
    for ch in text:
        depth += {"{": 1, "(": 1, "[": 1, "}": -1, ")": -1, "]": -1}.get(ch, 0)
        deepest = max(deepest, depth)
    return deepest <= _MAX_NESTING


class _CPUBackstop(BaseException):
    """Raised by the CPU-time backstop; a BaseException so math-verify's ``except Exception`` passes it on."""


def _with_cpu_backstop(fn, *args, seconds: float = CPU_BACKSTOP_S):
    """``fn(*args)`` under a process-CPU-time limit (``signal.ITIMER_PROF``) where this thread may set
    signals (the main thread); elsewhere unlimited (the input rule is the bound there)."""
    if threading.current_thread() is not threading.main_thread() or seconds is None:
        return fn(*args)

    def expire(signum, frame):
        raise _CPUBackstop()

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _symbolic_equal(p: str, g: str) -> bool:
    import math_verify.grader
    import math_verify.parser
    from math_verify import parse, verify

    # math-verify warns once that its timeouts are off: the bound is ours (bounded_work + the CPU backstop)
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    gold_parsed = parse(f"${g}$", parsing_timeout=None)
    pred_parsed = parse(f"${p}$", parsing_timeout=None)
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))


@functools.lru_cache(maxsize=1 << 16)  # rewards and details score the same answers twice
def math_equal(prediction: str, gold: str) -> bool:
    """Regex clean-up, then exact numbers, then ``math-verify`` (SymPy) equivalence on inputs whose work is
    bounded (:func:`bounded_work`); no wall-clock limit anywhere, so a score never depends on the load.

    >>> math_equal("66", "66"), math_equal("66.0", "66"), math_equal(r"\\frac{1}{2}", "0.5")
    (True, True, True)
    >>> math_equal("65", "66")
    False
    """
    p, g = _clean_math(prediction), _clean_math(gold)
    if not p:
        return False
    if p == g:
        return True
    pn, gn = _as_number(p), _as_number(g)
    if pn is not None and gn is not None:
        return abs(pn - gn) <= 1e-6 * max(1.0, abs(gn))
    # A prediction without a digit cannot equal a number; protocol tags are never an answer.
    if (gn is not None and not re.search(r"\d", p)) or _PROTOCOL_TAG.search(p):
        return False
    if not (bounded_work(p) and bounded_work(g)):
        return False
    try:
        return _with_cpu_backstop(_symbolic_equal, p, g)
    except _CPUBackstop:
        BACKSTOP_FIRED[p] += 1
        warnings.warn(f"math_equal: the CPU-time backstop ({CPU_BACKSTOP_S:g} s) fired on {p!r} vs {g!r}: scored wrong, "
                      "but this score may depend on the machine; tighten bounded_work's rule", RuntimeWarning,
                      stacklevel=2)
        return False
    except Exception:  # noqa: BLE001 - a malformed prediction is simply wrong
        return False


# --------------------------------------------------------------------------- QA metrics
def normalize_qa(text: str) -> str:
    """Lowercase, strip diacritics, drop articles, collapse whitespace; punctuation is kept.

    >>> normalize_qa("  The  Café of Ñorth ")
    'cafe of north'
    """
    text = unicodedata.normalize("NFKD", text.lower())
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def qa_metrics(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    """Acc, EM and token F1 of one prediction, each the max over the gold answers.

    >>> qa_metrics("Mirath city", ["Mirath"])
    {'acc': 1.0, 'em': 0.0, 'f1': 0.6666666666666666}
    """
    pred = normalize_qa(prediction)
    best = {"acc": 0.0, "em": 0.0, "f1": 0.0}
    for gold in golds:
        g = normalize_qa(gold)
        best["acc"] = max(best["acc"], float(bool(g) and g in pred))
        best["em"] = max(best["em"], float(pred == g))
        common = collections.Counter(pred.split()) & collections.Counter(g.split())
        overlap = sum(common.values())
        if overlap:
            precision, recall = overlap / len(pred.split()), overlap / len(g.split())
            best["f1"] = max(best["f1"], 2 * precision * recall / (precision + recall))
    return best


# --------------------------------------------------------------------------- TRL-style callables
def _golds(answer) -> tuple[str, ...]:
    return (answer,) if isinstance(answer, str) else tuple(answer)


def _used_tool(calls) -> bool:
    return bool(calls) and sum(calls.values()) > 0


def math_correctness(prompts, completions, answers, **kw) -> list[float]:
    """a in {0, 1} per sample.

    >>> math_correctness(None, [r"<answer>\\boxed{66}</answer>", "<answer>65</answer>"], [("66",), ("66",)])
    [1.0, 0.0]
    """
    return [float(any(math_equal(extract_answer(_text(c)), g) for g in _golds(a)))
            for c, a in zip(completions, answers)]


def math_reward(prompts, completions, answers, tool_calls=None, **kw) -> list[float]:
    """R = a + r_t + r_f (docs/paper_a_copes.md#a4-task-agent-reward-and-data).

    >>> math_reward(None, [r"<answer>\\boxed{66}</answer>"] * 2, [("66",)] * 2,
    ...             [{"python": 1, "search": 0}, {"python": 0, "search": 0}])
    [1.1, 1.0]
    >>> math_reward(None, ["66"], [("66",)], [{"python": 1, "search": 0}])
    [0.1]
    """
    tool_calls = tool_calls or [{}] * len(completions)
    correct = math_correctness(prompts, completions, answers)
    return [round(a + (TOOL_BONUS if a and _used_tool(t) else 0.0) + format_reward_value(_text(c)), 10)
            for a, c, t in zip(correct, completions, tool_calls)]


def qa_scores(prompts, completions, answers, **kw) -> list[dict[str, float]]:
    """Acc / EM / F1 per sample."""
    return [qa_metrics(extract_answer(_text(c)), _golds(a)) for c, a in zip(completions, answers)]


def qa_reward(prompts, completions, answers, tool_calls=None, **kw) -> list[float]:
    """R = F1 + r_t + r_f (docs/paper_a_copes.md#a4-task-agent-reward-and-data).

    >>> qa_reward(None, [r"<answer>\\boxed{Oskelia}</answer>", r"<answer>\\boxed{Mirath}</answer>"],
    ...           [("Oskelia",), ("Oskelia",)], [{"search": 2}, {"search": 2}])
    [1.1, 0.0]
    """
    tool_calls = tool_calls or [{}] * len(completions)
    scores = qa_scores(prompts, completions, answers)
    return [round(s["f1"] + (TOOL_BONUS if s["f1"] > 0 and _used_tool(t) else 0.0)
                  + format_reward_value(_text(c)), 10)
            for s, c, t in zip(scores, completions, tool_calls)]


def format_reward(prompts, completions, **kw) -> list[float]:
    """r_f alone, as its own callable (TRL sums several reward functions)."""
    return [format_reward_value(_text(c)) for c in completions]
