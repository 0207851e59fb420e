"""Stop strings are matched by characters: a closing tag stops its turn however many tokens spell it
(one token per byte, long tags, tokens that decode to nothing), at the token that completes it, and a
token that runs past the tag's end is cut there; the same in every engine."""

import random

import pytest

from copes_lib.rollout import AgentEnv, RolloutConfig, StopMatcher, closing_tokens, encode
from copes_lib.substrate import build_agent_model
from copes_lib.tasks import Task
from copes_lib.tasks.protocol import ANSWER_CLOSE, PYTHON_CLOSE, SEARCH_CLOSE
from tests.test_rollout import assert_two_scripted_answers, scripted_logits

LONG_TAG = "</a_closing_tag_much_longer_than_eight_tokens_or_characters>"


class CharTokenizer:
    """One token per character; ``"\\0"`` is a token that decodes to nothing (as a byte piece or a
    leading metaspace can). Just what :class:`StopMatcher` calls."""

    eos_token_id = 0

    def __init__(self, alphabet: str):
        self.chars = ["<eos>", "\0"] + sorted(set(alphabet) - {"\0"})
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def __len__(self):
        return len(self.chars)

    def get_vocab(self):
        return dict(self.ids)

    def decode(self, ids, skip_special_tokens=False):
        if ids and isinstance(ids[0], list):
            return [self.decode(i) for i in ids]
        return "".join("" if i == 1 else self.chars[i] for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.ids[c] for c in text]}


def _byte_tokenizer(merges=((">", "<"), (">", "."))):
    """A byte-level BPE in which every byte is a token, plus the merges ``merges``: ``</python>`` is 9
    tokens, and with the default merges the 9th spans the tag's end (``><``, ``>.``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<eos>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def _first_stop(matcher, ids):
    """(index of the token at which ``check`` first stops, its kind), or (None, None)."""
    for n in range(1, len(ids) + 1):
        kind = matcher.check(ids[:n])
        if kind is not None:
            return n - 1, kind
    return None, None


@pytest.mark.parametrize("tag", [PYTHON_CLOSE, SEARCH_CLOSE, ANSWER_CLOSE, LONG_TAG])
def test_one_token_per_character_stops_at_the_tags_last_character(tag):
    tags = {PYTHON_CLOSE: "python", SEARCH_CLOSE: "search", ANSWER_CLOSE: "answer", LONG_TAG: "long"}
    text = "<python>print(8 > 7)</python" + "x" * 40 + tag + " and more"
    tok = CharTokenizer(text + "".join(tags))
    matcher = StopMatcher(tok, tags)
    assert not matcher.single_token and len(encode(tok, tag)) == len(tag) >= 9
    at, kind = _first_stop(matcher, encode(tok, text))
    assert (at, kind) == (text.index(tag) + len(tag) - 1, tags[tag])
    assert matcher.trim(encode(tok, text)[: at + 1]) is None  # the tag ends at its last token: nothing to cut


def test_tokens_that_decode_to_nothing_inside_and_before_a_tag_do_not_hide_it():
    """A window of a tag's length of tokens would be too short here: every other token is empty."""
    tok = CharTokenizer("<python>print(1)</python><answer>")
    matcher = StopMatcher(tok)
    rng = random.Random(0)
    for _ in range(20):
        ids = []
        for c in "<python>print(1)" * 3 + PYTHON_CLOSE + "<answer>":
            ids += [1] * rng.randrange(4) + [tok.ids[c]]
        at, kind = _first_stop(matcher, ids)
        assert kind == "python" and tok.decode(ids[: at + 1]).endswith(PYTHON_CLOSE)
        assert tok.decode(ids[: at + 1]).count(PYTHON_CLOSE) == 1


def test_every_split_of_every_tag_stops_at_the_completing_token_and_is_cut_at_the_tags_end():
    """Random splits of the text into pieces of 1-5 characters, each piece one token of a vocabulary
    made of those pieces: the stop is the first token whose text completes a tag, and ``trim`` keeps
    exactly the text up to the tag's end."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(1)
    for tag in (PYTHON_CLOSE, SEARCH_CLOSE, ANSWER_CLOSE):
        for _ in range(25):
            text = "Let x = 2 > 1. " + tag + "><output>"
            pieces, i = [], 0
            while i < len(text):
                n = rng.randrange(1, 6)
                pieces.append(text[i:i + n])
                i += n
            vocab = {"<eos>": 0, **{c: k + 1 for k, c in enumerate(sorted(set(text)))}}
            for p in pieces:
                vocab.setdefault(p, len(vocab))
            backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
            backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # encodes char by char
            backend.decoder = decoders.Fuse()
            tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", padding_side="left")
            ids = [vocab[p] for p in pieces]
            matcher = StopMatcher(tok)
            at, kind = _first_stop(matcher, ids)
            end = text.index(tag) + len(tag)
            assert kind == tag[2:-1] and len("".join(pieces[:at])) < end <= len("".join(pieces[: at + 1]))
            cut = matcher.trim(ids[: at + 1])
            kept = ids[:at] + (cut if cut is not None else [ids[at]])
            assert tok.decode(kept) == text[:end]


def test_closing_tokens_keep_every_token_that_can_end_a_tag():
    tok = _byte_tokenizer()
    closers = closing_tokens(tok, [PYTHON_CLOSE])
    assert closing_tokens(tok, [PYTHON_CLOSE]) is closers  # built once per tokenizer
    texts = {i: tok.decode([i]) for i in range(len(tok))}
    assert {i for i, t in texts.items() if ">" in t} <= closers
    assert encode(tok, "a")[0] not in closers and encode(tok, "><")[0] in closers
    merging = _byte_tokenizer(((">", "<"), ("<", "/"), ("/", "p")))
    assert {i for i in range(len(merging)) if ">" in merging.decode([i])} <= closing_tokens(merging, [PYTHON_CLOSE])
    # a tag that ends in a character the pieces may spell otherwise: every token decoded, empty ones kept
    chars = CharTokenizer("ab»")
    assert closing_tokens(chars, ["</b»"]) == {chars.ids["»"], 1}
    matcher = StopMatcher(chars, {"ab»": "x"})
    assert _first_stop(matcher, [chars.ids["a"], 1, chars.ids["b"], 1, chars.ids["»"], chars.ids["a"]]) == (4, "x")


class _PrintedOutput(AgentEnv):
    """Python calls observe their printed number without a sandbox."""

    def run_python(self, codes):
        return [f"<output>{code.strip()[6:-1]}</output>" for code in codes]


@pytest.mark.parametrize("engine", ["loop", "slots", "static"])
@pytest.mark.parametrize("merges", [(), ((">", "<"), (">", "."))], ids=["bytes", "bytes+merges"])
def test_a_tag_written_one_byte_per_token_stops_in_every_engine(engine, merges):
    """``</python>`` and ``</answer>`` written as 9 tokens (one per byte): each ends its turn, the tool
    call runs, and the observation follows the tag directly; with merges the 9th token (``><``,
    ``>.``) runs past the tag's end and is cut there."""
    from copes_lib.engines import make_engine

    tok = _byte_tokenizer(merges)
    assert len(encode(tok, PYTHON_CLOSE)) == len(encode(tok, ANSWER_CLOSE)) == 9
    tail = "<" if merges else ""
    turns = [[f"<python>print({r + 1})</python>{tail}", f"<answer>\\boxed{{{r + 1}}}</answer>{'.' if merges else ''}"]
             for r in range(2)]
    scripts = [encode(tok, a) + encode(tok, b) for a, b in turns]
    force = scripted_logits(scripts)

    model = build_agent_model("smoke", len(tok), seed=0, tokenizer=tok)
    tasks = [Task("t0", "math", "Question 1?", ("1",), 1), Task("t1", "math", "Question 2 or 3?", ("2",), 1)]
    config = RolloutConfig(max_new_tokens=80, max_context=512, prompt_style="plain")
    out = make_engine(engine, model, tok).generate(tasks, _PrintedOutput("math"), config, seed=0, logits_hook=force)
    assert_two_scripted_answers(out, tok)
