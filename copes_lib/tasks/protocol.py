"""The agent protocol: tool-call tags, observations, prompts, and the Task record.

A trajectory is text in which the model writes tool calls and a final answer, and the environment
inserts observations::

    <python>print(37+48-19)</python><output>66</output><answer>\\boxed{66}</answer>
    <search>Valor Trenk</search><result>Valor Trenk is a painter born in Mirath.</result>...

Departures from the paper (docs/paper_a_copes.md#a4-task-agent-reward-and-data): the paper's agent uses Qwen3.5's chat template and a
Wikipedia search tool; the embedded miniature uses a bare ``Question: ...`` prompt (a 1M-parameter
model has no chat template) and returns the top-k passages' text only. Real checkpoints (gpu
profile) get the chat-style prompt of :func:`format_prompt` with ``style="chat"``. An invalid call
(no opening tag, empty body, over its limit) gets an error observation instead of being retried.
"""

from __future__ import annotations

import dataclasses
import re

PYTHON_OPEN, PYTHON_CLOSE = "<python>", "</python>"
OUTPUT_OPEN, OUTPUT_CLOSE = "<output>", "</output>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
BOXED = "\\boxed{"

#: Tags the tokenizer of the miniature keeps as single tokens.
TAGS = (PYTHON_OPEN, PYTHON_CLOSE, OUTPUT_OPEN, OUTPUT_CLOSE, SEARCH_OPEN, SEARCH_CLOSE,
        RESULT_OPEN, RESULT_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
#: Observation blocks are written by the environment, never trained on.
OBSERVATION_TAGS = ((OUTPUT_OPEN, OUTPUT_CLOSE), (RESULT_OPEN, RESULT_CLOSE))

TASK_KINDS = ("math", "qa")
SPLITS = ("train", "val", "test")

SYSTEM_PROMPT = (
    "Answer the question. You may call tools: write <python>code</python> to run Python (print the "
    "result; it comes back in <output>...</output>) and <search>query</search> to search a corpus "
    "(passages come back in <result>...</result>). At most {python} Python and {search} search calls. "
    "End with <answer>\\boxed{{final answer}}</answer>."
)


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem. ``reference`` is a gold agent trace (observations included) used for warm start;
    it is empty for real datasets, which have no traces."""

    id: str
    kind: str
    question: str
    answers: tuple[str, ...]
    difficulty: int
    reference: str = ""
    #: the latent unit the warm start's prior keys on (copes_lib.tasks.units: the subject name of a generated
    #: problem); a problem without one (real data) is its own unit
    unit_id: str = ""

    def __post_init__(self) -> None:
        if not self.unit_id:
            object.__setattr__(self, "unit_id", self.id)


def format_prompt(task: Task, style: str = "plain", tokenizer=None, python_limit: int = 5,
                  search_limit: int = 3, enable_thinking: bool | None = None) -> str:
    """The prompt text the model sees. ``enable_thinking`` goes to the chat template (Qwen3 / Qwen3.5
    thinking mode; templates without the switch ignore it); None leaves the template's default.

    >>> format_prompt(Task("m1", "math", "What is 2+3?", ("5",), 1))
    'Question: What is 2+3?\\n'
    """
    if style == "plain":
        return f"Question: {task.question}\n"
    if style == "chat":
        if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("style='chat' needs a tokenizer with a chat_template")
        system = SYSTEM_PROMPT.format(python=python_limit, search=search_limit)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task.question}]
        switch = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **switch)
    raise ValueError(f"style = {style!r} is not valid; valid values: ['plain', 'chat']")


def python_observation(output: str) -> str:
    """The text inserted after a ``</python>`` call.

    >>> python_observation("66\\n")
    '<output>66</output>'
    """
    return f"{OUTPUT_OPEN}{output.strip()}{OUTPUT_CLOSE}"


def search_observation(passages_text: list[str]) -> str:
    """The text inserted after a ``</search>`` call: the retrieved passages, one per line.

    >>> search_observation(["Mirath is a city in Oskelia."])
    '<result>Mirath is a city in Oskelia.</result>'
    """
    return f"{RESULT_OPEN}{chr(10).join(p.strip() for p in passages_text)}{RESULT_CLOSE}"


def error_observation(tool: str, message: str) -> str:
    """An invalid or refused tool call still gets an observation, so the trajectory continues."""
    open_tag, close_tag = (OUTPUT_OPEN, OUTPUT_CLOSE) if tool == "python" else (RESULT_OPEN, RESULT_CLOSE)
    return f"{open_tag}Error: {message}{close_tag}"


def split_trace(trace: str) -> list[tuple[str, bool]]:
    """Cut a trace into (text, written_by_model) segments; observation blocks are not model text.

    >>> split_trace("<python>print(1)</python><output>1</output><answer>1</answer>")
    [('<python>print(1)</python>', True), ('<output>1</output>', False), ('<answer>1</answer>', True)]
    """
    pattern = "|".join(f"{re.escape(o)}.*?{re.escape(c)}" for o, c in OBSERVATION_TAGS)
    segments, last = [], 0
    for match in re.finditer(pattern, trace, flags=re.S):
        if match.start() > last:
            segments.append((trace[last:match.start()], True))
        segments.append((match.group(0), False))
        last = match.end()
    if last < len(trace):
        segments.append((trace[last:], True))
    return segments


def last_call(text: str, tool: str) -> str | None:
    """The body of the last ``<tool>...</tool>`` call in ``text`` (None when there is no opening tag).

    >>> last_call("x <python>print(2)</python>", "python")
    'print(2)'
    >>> last_call("print(2)</python>", "python") is None
    True
    """
    open_tag, close_tag = f"<{tool}>", f"</{tool}>"
    end = text.rfind(close_tag)
    end = len(text) if end < 0 else end
    start = text.rfind(open_tag, 0, end)
    if start < 0:
        return None
    return text[start + len(open_tag):end]
