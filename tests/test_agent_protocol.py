"""The paper's agent protocol as parameters: tool limits and turns per task kind, top-k passages,
and an explicit thinking-mode switch for chat templates."""

import dataclasses

import pytest
from transformers import PreTrainedTokenizerFast

from copes_lib.protocols.testbed.substrate_setup import substrate_config, substrate_params, use_profile_data
from copes_lib.rollout import AgentEnv, RolloutConfig, rollout
from copes_lib.substrate import get_tokenizer, warm_rollout_config
from copes_lib.tasks import Task, format_prompt, tool_settings
from tests.test_rollout import BigramLM


def test_paper_limits_per_task_kind_on_every_profile():
    for profile in ("gpu", "cpu"):
        use_profile_data(profile)  # what loading a notebook's parameters does
    assert tool_settings("gpu", "math") == ({"python": 5, "search": 3}, 3)  # paper: 3 search + 5 Python
    assert tool_settings("gpu", "qa") == ({"python": 5, "search": 5}, 3)    # paper: 5 + 5; Search-R1 top 3
    assert tool_settings("cpu", "qa") == ({"python": 5, "search": 5}, 1)    # the miniature: one passage


def test_gpu_turns_follow_the_limits_and_cpu_keeps_six():
    gpu, cpu = (warm_rollout_config(substrate_params(p).warm_start_config()) for p in ("gpu", "cpu"))
    assert gpu.max_turns == 0 and gpu.enable_thinking is True
    assert cpu.max_turns == 6 and cpu.enable_thinking is None
    assert "enable_thinking" not in cpu.to_dict()  # smoke / cpu cache keys unchanged
    assert gpu.to_dict()["enable_thinking"] is True


@pytest.mark.parametrize(("python_limit", "search_limit"), [(5, 3), (2, 1)])
def test_max_turns_zero_allows_every_call_then_ends(python_limit, search_limit):
    """A model that calls Python forever: with max_turns = 0 it makes python_limit calls, gets refusals
    after that, and stops after python + search + 1 turns (the paper's 9 for math)."""
    tokenizer = get_tokenizer("smoke", substrate_config("smoke").vocab_size)
    loop = BigramLM(tokenizer, [("?\n", "<python>print(7)</python>"), ("</output>", "<python>")], len(tokenizer))
    env = AgentEnv("math", None, 1, {"python": python_limit, "search": search_limit})
    try:
        batch = rollout(loop, tokenizer, [Task("t", "math", "What now?", ("7",), 1)], env,
                        RolloutConfig(max_new_tokens=400, max_context=2000, max_turns=0), seed=0)
    finally:
        env.close()
    assert batch.tool_calls[0]["python"] == python_limit
    assert batch.texts[0].count("<python>") == python_limit + search_limit + 1  # one call per turn
    assert batch.finish_reasons == ["turns"]


QWEN_LIKE_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_thinking_switch_reaches_the_chat_template():
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=get_tokenizer("smoke", substrate_config("smoke").vocab_size).backend_tokenizer)
    tokenizer.chat_template = QWEN_LIKE_TEMPLATE
    task = Task("t", "math", "What is 2+3?", ("5",), 1)
    off = format_prompt(task, "chat", tokenizer, enable_thinking=False)
    on = format_prompt(task, "chat", tokenizer, enable_thinking=True)
    default = format_prompt(task, "chat", tokenizer)
    assert off.endswith("<think>\n\n</think>\n\n") and "<think>" not in on and on == default
    assert "At most 5 Python and 3 search calls" in on


def test_rollout_config_rejects_negative_turns():
    from copes_lib.config import ConfigError

    with pytest.raises(ConfigError, match="max_turns = -1 is out of range"):
        dataclasses.replace(RolloutConfig(), max_turns=-1)
