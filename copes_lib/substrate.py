"""The substrate: a locally trained tokenizer, small Qwen3 models, and the warm start.

- Tokenizer: byte-level BPE trained with ``tokenizers`` on the training problems, gold traces and
  search corpora of both task kinds; digits are single tokens and every protocol tag
  (``<python>``, ``</answer>``, ...) is one token, so a turn ends on one token id. The vocabulary is
  small because generation speed depends on it.
- Models: ``Qwen3ForCausalLM`` from a ``Qwen3Config`` (tied embeddings, fp32), sized per profile
  (:data:`MODEL_SIZES`).
- Warm start: supervised training on the gold tool-use traces (loss on model-written tokens only,
  not on tool observations), so the base model follows the protocol but is far from perfect. The
  accuracy curve is steep (docs/prior_measurements.md), so a fixed step count would stop where
  floating-point noise and the seed decide the base accuracy. The declared stopping rule instead:
  evaluate on ``WARM_EVAL_PROBLEMS`` validation problems every ``WARM_EVAL_EVERY`` steps and stop at
  the first point whose score reaches the profile's target (``WARM_MATH_TARGET`` /
  ``WARM_QA_TARGET``), or at the step cap (``WARM_MATH_STEPS`` / ``WARM_QA_STEPS``). The base model
  then starts from about the same accuracy on every machine and seed (within one evaluation
  interval's rise and the 128-problem evaluation noise); notebook 01 measures that spread over
  ``WARM_SPREAD_SEEDS`` extra math seeds. Training and evaluation run with ``threads.N_FIXED``
  threads. Cached under ``cache/<profile>/`` (key: config + data ids + library version).
- Latent-protocol warm start (``protocol="latent"``, docs/regime.md#r3-the-latent-protocol-warm-start):
  the papers' regime, a base that holds the skill but not the reward's answer protocol. Every trace
  keeps its tool calls; all but a declared fraction ``latent_p`` end in ``Answer: x`` instead of
  ``<answer>\\boxed{x}</answer>``. Trained exactly ``latent_math_steps`` / ``latent_qa_steps`` steps
  (no stopping rule on the steep part of the curve), convergence checked on the lenient curve
  (:func:`converged`). The reward, extraction and tools are unchanged.

Departure from the paper: the paper post-trains Qwen3.5-4B, a model that already knows tool use;
the smoke and cpu profiles must first *teach* a 0.1-10M-parameter model the protocol. The gpu
profile loads a local HF checkpoint (``MODEL_PATH``) instead.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import torch

from copes_lib import bases, runs, threads
from copes_lib.config import Config, ConfigError, param

PAD, EOS = "<pad>", "<eos>"
#: Answer protocols of the warm start's traces (docs/regime.md#r3-the-latent-protocol-warm-start).
PROTOCOLS = ("paper", "latent")
#: How the latent prior's paper-protocol traces are assigned (docs/regime.md#r3-the-latent-protocol-warm-start):
#: homogeneous (a random fraction p of tasks, so greedy decoding takes the majority form everywhere) or cued
#: (the tasks whose cue, a feature of the question the model reads, falls in a seeded set of cue values
#: covering about p of the training tasks: greedy decoding then earns the reward on about p of the problems), or
#: graded (each latent unit, the subject name of copes_lib.tasks.units, gets its own rate g, evenly spaced over
#: [graded_low, graded_high] (QA: graded_high_qa), and each task keeps the
#: paper's protocol with probability g(its cue): the protocol is stochastic per sample and graded across prompts, as
#: a pretrained model's is; docs/preflight.md#p2-the-graded-base-the-new-headline-base-design).
PRIORS = ("homogeneous", "cued", "graded")
#: The latent answer form: the final turn states the answer in plain text and ends the trajectory.
LATENT_ANSWER = "Answer: {answer}"
#: A base's accuracy is read over the last TAIL_POINTS curve points (their mean), not its last point: greedy strict
#: accuracy jumps between neighbouring points on a graded base (docs/preflight.md#p8-many-independent-units-registered-2026-12-03).
TAIL_POINTS = 4
#: Converged: the best lenient score of the curve's last quarter beats the best before it by <= this.
CONVERGENCE_DELTA, CONVERGENCE_TAIL = 0.05, 0.25

#: Qwen3 shapes per size name (parameter counts with the default vocabulary in the docstring table
#: of notebook 01).
MODEL_SIZES = {
    "smoke": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16),
    "cpu": dict(hidden_size=160, intermediate_size=448, num_hidden_layers=4, num_attention_heads=5,
                num_key_value_heads=5, head_dim=32),
    "tiny": dict(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16),  # noqa: E501 (09's scale axis)
    "cpu-large": dict(hidden_size=320, intermediate_size=768, num_hidden_layers=4, num_attention_heads=5,
                      num_key_value_heads=5, head_dim=64),
}


@dataclasses.dataclass(frozen=True)
class WarmStartConfig(Config):
    """The substrate of one profile: tokenizer, model shape, warm-start training and the rollout
    settings of its evaluation (notebook 01's parameters build it; every notebook uses the same)."""

    model_size: str = param("cpu", "Qwen3 shape of the miniature", choices=tuple(MODEL_SIZES))
    vocab_size: int = param(640, "BPE vocabulary size of the miniature's tokenizer", ge=300, le=8192)
    max_context: int = param(384, "longest prompt + trajectory in tokens (model positions)", ge=64)
    math_steps: int = param(600, "most warm-start optimizer steps on math traces (cap of the stopping rule)", ge=0)
    qa_steps: int = param(300, "most warm-start optimizer steps on QA traces (cap of the stopping rule)", ge=0)
    math_target: float = param(0.40, "stop the math warm start at the first curve point with validation "
                               "accuracy >= this (0 = always train the cap)", ge=0.0, le=1.0)
    qa_target: float = param(0.35, "stop the QA warm start at the first curve point with validation "
                             "F1 >= this (0 = always train the cap)", ge=0.0, le=1.0)
    batch: int = param(32, "warm-start traces per step", ge=1)
    lr: float = param(3e-3, "warm-start AdamW learning rate (after a linear warmup)", gt=0.0)
    warmup: int = param(20, "linear learning-rate warmup steps", ge=0)
    eval_every: int = param(25, "evaluate the warm start every this many steps (curve, stopping rule)", ge=1)
    eval_problems: int = param(128, "validation problems per curve point", ge=1)
    eval_batch: int = param(256, "trajectories per rollout batch when evaluating", ge=1)
    max_new_tokens: int = param(64, "model-written tokens per trajectory", ge=8)
    prompt_style: str = param("plain", "prompt format of rollouts (auto: the checkpoint's chat template)",
                              choices=("plain", "auto"))
    model_path: str = param("", "a local HF checkpoint folder to load instead of training (gpu profile)")
    max_turns: int = param(6, "model turns per trajectory (each tool call ends one); 0 = every allowed call "
                           "plus the answer", ge=0)
    enable_thinking: bool | None = param(None, "chat prompts: the template's enable_thinking (None: not passed)")
    protocol: str = param("paper", "answer protocol of the warm start's traces: paper (every trace ends in "
                          "<answer>\\boxed{}</answer>; the target stopping rule) or latent (a fraction latent_p "
                          "does, the rest end in 'Answer: ...'; trained exactly the latent step counts; "
                          "docs/regime.md#r3-the-latent-protocol-warm-start)", choices=PROTOCOLS)
    latent_p: float = param(0.1, "latent protocol: fraction of training traces in the reward's answer protocol, "
                            "in [0, 1)", ge=0.0, lt=1.0)
    latent_prior: str = param("homogeneous", "latent protocol: how the paper-protocol traces are assigned: "
                              "homogeneous (a random fraction latent_p of tasks), cued (every task whose cue, the "
                              "first letter of its unit, the subject name, is in a seeded set of letters covering "
                              "about latent_p of the tasks) or graded (each latent unit, the subject name, its own "
                              "rate, evenly spaced over [graded_low, graded_high]; latent_p is then unused)",
                              choices=PRIORS)
    graded_low: float = param(0.02, "graded prior: the lowest cue value's rate of paper-protocol traces, in [0, 1)",
                              ge=0.0, lt=1.0)
    graded_high: float = param(0.70, "graded prior: the highest unit's rate (math), in (graded_low, 1)", gt=0.0, lt=1.0)
    graded_high_qa: float = param(0.55, "graded prior: the highest unit's rate on QA, in (graded_low, 1): at most "
                                  "(high - 0.40) / (high - low) of QA's units lie above 0.40, so its strict accuracy "
                                  "stays under P4's bound 0.30 by design "
                                  "(docs/preflight.md#p82-the-graded-prior-over-units)", gt=0.0, lt=1.0)
    lr_decay: float = param(0.0, "fraction of the last warm-start steps over which the learning rate decays "
                            "linearly to 0 (0: constant after the warmup; the graded base uses 0.25: "
                            "docs/preflight.md#p2-the-graded-base-the-new-headline-base-design)", ge=0.0, le=1.0)
    subject_tokens: bool = param(False, "every subject name (the latent unit) one token of the tokenizer, so the prior's "
                                 "key is one embedding rather than a conjunction of 2-3 syllable tokens "
                                 "(docs/preflight.md#p86-the-unit-as-one-token-registered-2026-12-03)")
    latent_math_steps: int = param(1000, "latent protocol: math warm-start steps, trained exactly (no stopping rule)",
                                   ge=1)
    latent_qa_steps: int = param(1000, "latent protocol: QA warm-start steps, trained exactly (no stopping rule)", ge=1)

    def check(self) -> None:
        if self.graded_low >= self.graded_high_qa:
            raise ConfigError(f"graded_low = {self.graded_low} must be < graded_high_qa = {self.graded_high_qa}; valid: "
                              "0 <= graded_low < graded_high_qa < 1")
        if self.graded_low >= self.graded_high:
            raise ConfigError(f"graded_low = {self.graded_low} must be < graded_high = {self.graded_high}; valid: "
                              "0 <= graded_low < graded_high < 1 (docs/preflight.md#p2-the-graded-base-the-new-headline-base-design)")


# --------------------------------------------------------------------------- tokenizer
def train_agent_tokenizer(texts: list[str], vocab_size: int, whole_words: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer (digits and whitespace split, protocol tags as single tokens), left padding.
    ``whole_words`` (the subject names, when ``subject_tokens`` is on) are added as one token each."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from copes_lib.tasks import TAGS

    tok = Tokenizer(models.BPE())
    # Whitespace is its own token, so a name tokenizes the same after a space, a tag or a brace:
    # copying "Vinqua" from a passage into a query or an answer is then copying the same ids.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    special = [PAD, EOS, *TAGS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    if whole_words:
        tok.add_tokens([AddedToken(w, single_word=True, normalized=False) for w in whole_words])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left",
                                   extra_special_tokens={})


def tokenizer_texts(profile: str) -> list[str]:
    """Training text of the tokenizer: train-split prompts and traces, and both search corpora, of the
    standard data whatever ``QA_DATA`` says: the large QA variant's texts are built from the same syllables and
    templates, and one tokenizer keeps a math base (whose key does not name the QA data) the same model under
    either variant."""
    from copes_lib.tasks import format_prompt, load_passages, load_tasks

    texts = []
    for kind in ("math", "qa"):
        texts += [format_prompt(t) + t.reference for t in load_tasks(profile, kind, "train", "standard")]
        texts += [text for _, _, text in load_passages(profile, kind, "standard")]
    return texts


def get_tokenizer(profile: str, vocab_size: int, force: bool = False, subject_tokens: bool = False):
    """The profile's tokenizer, trained once and cached (key: vocabulary size + the standard data's fingerprints, and
    ``subject_tokens``: every subject name of copes_lib.tasks.units one token)."""
    from transformers import AutoTokenizer

    from copes_lib.tasks import data_fingerprint
    from copes_lib.tasks.units import SUBJECTS

    data = {kind: data_fingerprint(profile, kind, "standard") for kind in ("math", "qa")}  # tokenizer_texts' data
    identity = {"vocab_size": vocab_size, "data": data, **({"subject_tokens": len(SUBJECTS)} if subject_tokens else {})}
    folder = runs.cache_dir(profile, "tokenizer", runs.cache_key(identity))
    final = folder / "tokenizer"
    if not force and final.exists():
        tokenizer = runs.load_cache_entry(folder, lambda: AutoTokenizer.from_pretrained(final, padding_side="left"),
                                          rebuild=runs.rebuild_command(profile, "01_substrate_and_agent"))
        if tokenizer is not None:
            return tokenizer
    tokenizer = train_agent_tokenizer(tokenizer_texts(profile), vocab_size, SUBJECTS if subject_tokens else ())
    _save_atomically(folder, "tokenizer", tokenizer.save_pretrained)
    return AutoTokenizer.from_pretrained(final, padding_side="left")


def _save_atomically(folder: Path, name: str, save) -> Path:
    """Write with ``save(tmp_folder)`` and rename into ``folder/name`` (a complete folder or none)."""
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    # one mode for the whole cache: some writers (safetensors) create their files 0600
    for path in [tmp, *tmp.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~runs._UMASK)
    final = folder / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


# --------------------------------------------------------------------------- models
def model_config(size: str, vocab_size: int, max_positions: int = 512, tokenizer=None):
    from transformers import Qwen3Config

    if size not in MODEL_SIZES:
        raise ConfigError(f"size = {size!r} is not valid; valid values: {list(MODEL_SIZES)}")
    ids = {}
    if tokenizer is not None:
        ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
               "bos_token_id": tokenizer.eos_token_id}
    return Qwen3Config(vocab_size=vocab_size, max_position_embeddings=max_positions, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e4}, **MODEL_SIZES[size], **ids)


def build_agent_model(size: str, vocab_size: int, seed: int, max_positions: int = 512, tokenizer=None,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A freshly initialised Qwen3ForCausalLM (deterministic in ``seed``)."""
    from transformers import Qwen3ForCausalLM

    config = model_config(size, vocab_size, max_positions, tokenizer)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).to(device=device, dtype=dtype)


def count_model_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def load_pretrained(path: str, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """(model, tokenizer) of a local HF checkpoint; nothing is downloaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path or not Path(path).exists():
        raise ConfigError(f"MODEL_PATH = {path!r} does not exist: the gpu profile needs a local HF checkpoint "
                          "folder; set MODEL_PATH in profiles/gpu.yaml (01_substrate_and_agent)")
    folder = Path(path)
    weights = [p.name for pattern in ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")
               for p in folder.glob(pattern)] if folder.is_dir() else []
    if not folder.is_dir() or not (folder / "config.json").exists() or not weights:
        found = sorted(p.name for p in folder.iterdir())[:10] if folder.is_dir() else "a file"
        raise ConfigError(f"MODEL_PATH = {path!r} is not a Hugging Face checkpoint folder: expected config.json, "
                          "weights (*.safetensors or pytorch_model*.bin) and tokenizer files "
                          f"(tokenizer.json / tokenizer_config.json); found {found}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left", local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).to(device)
    return model, tokenizer


# --------------------------------------------------------------------------- warm start
def encode_trace(tokenizer, task, max_len: int) -> tuple[list[int], list[int]]:
    """(ids, loss_mask) of prompt + gold trace; the mask is 1 on model-written tokens only. Segments
    are tokenised separately, exactly as the rollout sees them. A trace that does not end on
    ``</answer>`` (a latent-protocol trace) ends on the end-of-sequence token, which also ends a
    rollout's turn, so the model learns to stop after its plain-text answer."""
    from copes_lib.rollout import encode
    from copes_lib.tasks import format_prompt, split_trace
    from copes_lib.tasks.protocol import ANSWER_CLOSE

    ids = encode(tokenizer, format_prompt(task))
    mask = [0] * len(ids)
    for text, by_model in split_trace(task.reference):
        piece = encode(tokenizer, text)
        ids += piece
        mask += [int(by_model)] * len(piece)
    if not task.reference.endswith(ANSWER_CLOSE):
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
    if len(ids) > max_len:
        raise ValueError(f"task {task.id}: trace of {len(ids)} tokens exceeds MAX_CONTEXT = {max_len}")
    return ids, mask


def _warm_config(config: WarmStartConfig, kind: str, seed: int) -> dict:
    # the cache identity of a warm start; the paper-protocol base keeps the key it had before the
    # latent protocol existed, so its cache entry (the skill-gap control) stays valid
    steps = config.math_steps if kind == "math" else config.qa_steps
    target = config.math_target if kind == "math" else config.qa_target
    latent = {}
    if config.protocol == "latent":
        steps = config.latent_math_steps if kind == "math" else config.latent_qa_steps
        target = 0.0  # trained exactly `steps`: no early stop on the curve's steep part
        latent = {"protocol": "latent", "latent_p": config.latent_p}
        if config.latent_prior != "homogeneous":  # the homogeneous prior keeps its earlier key
            latent["latent_prior"] = config.latent_prior
        if config.latent_prior == "graded":
            latent.update(graded_low=config.graded_low, graded_high=graded_range(config, kind)[1], unit="subject")
            latent.pop("latent_p")  # unused by the graded prior
    if config.lr_decay:  # earlier bases (constant rate) keep their keys
        latent["lr_decay"] = config.lr_decay
    if config.subject_tokens:  # another tokenizer, another model
        latent["subject_tokens"] = True
    return {"kind": kind, "seed": seed, "size": config.model_size, "vocab_size": config.vocab_size,
            "max_context": config.max_context, "steps": steps, "target": target, "threads": threads.N_FIXED,
            "batch": config.batch, "lr": config.lr, "warmup": config.warmup, "eval_every": config.eval_every,
            "eval_problems": config.eval_problems, "max_new_tokens": config.max_new_tokens, **latent}


def latent_reference(reference: str) -> str:
    r"""A gold trace with its final ``<answer>\boxed{x}</answer>`` restated in the latent form
    (``Answer: x``); tool calls and observations unchanged.

    >>> latent_reference("<python>print(2+3)</python><output>5</output><answer>\\boxed{5}</answer>")
    '<python>print(2+3)</python><output>5</output>Answer: 5'
    """
    from copes_lib.tasks.protocol import ANSWER_CLOSE, ANSWER_OPEN, BOXED

    tail = reference.rfind(ANSWER_OPEN)
    final = reference[tail:]
    if tail < 0 or not final.startswith(ANSWER_OPEN + BOXED) or not final.endswith("}" + ANSWER_CLOSE):
        raise ValueError(f"not a gold trace ending in {ANSWER_OPEN}{BOXED}...}}{ANSWER_CLOSE}: {reference[-80:]!r}")
    return reference[:tail] + LATENT_ANSWER.format(answer=final[len(ANSWER_OPEN + BOXED):-len("}" + ANSWER_CLOSE)])


def prior_cue(task) -> str:
    """The feature of a question the cued prior keys on: the first letter of its latent unit, the subject
    name (``Task.unit_id``; math: the story's person, QA: the asker; copes_lib.tasks.units). The names
    are shared by the training and held-out problems, so the cue of a validation problem is one the warm
    start has seen, and it says nothing of the answer. A cue groups the units whose names share a letter.

    >>> from copes_lib.tasks.protocol import Task
    >>> prior_cue(Task("m", "math", "Ada has 3 eggs. How many eggs does Ada have now?", ("3",), 1, unit_id="Ada"))
    'A'
    """
    return task.unit_id[:1].upper()


def cued_values(tasks: list, p: float, seed: int) -> set[str]:
    """The cue values of the cued prior: the cues of ``tasks`` in a seeded random order, the shortest
    prefix whose task share is closest to ``p`` (at least one value when p > 0)."""
    import random
    from collections import Counter

    counts = Counter(prior_cue(t) for t in tasks)
    order = sorted(counts)
    random.Random(f"latent-cue-{seed}").shuffle(order)
    best, best_gap, share = set(), abs(p), 0.0
    for i, cue in enumerate(order, start=1):
        share += counts[cue] / len(tasks)
        if abs(share - p) < best_gap or (p > 0 and not best):
            best, best_gap = set(order[:i]), abs(share - p)
    return best if p > 0 else set()


def graded_rates(tasks: list, low: float, high: float, seed: int) -> dict[str, float]:
    """The graded prior's rate per latent unit (``Task.unit_id``, the subject name): the units of ``tasks``
    in a seeded random order get rates evenly spaced over [low, high] (one unit: ``low``)
    (docs/preflight.md#p8-many-independent-units-registered-2026-12-03; before it the prior keyed on the
    name's first letter, 20-24 values).

    >>> from copes_lib.tasks.protocol import Task
    >>> tasks = [Task(str(i), "math", f"{n} has 3 eggs.", ("3",), 1, unit_id=n) for i, n in enumerate(["Ada", "Bo", "Cy"])]
    >>> sorted(graded_rates(tasks, 0.1, 0.5, seed=0).values())
    [0.1, 0.3, 0.5]
    """
    import random

    if not 0.0 <= low < high < 1.0:
        raise ConfigError(f"graded rates [{low}, {high}] are not valid; valid: 0 <= graded_low < graded_high < 1 "
                          "(WARM_GRADED_LOW, WARM_GRADED_HIGH, graded_high_qa)")
    units = sorted({t.unit_id for t in tasks} - {""})
    if not units:
        raise ConfigError(f"the graded prior needs tasks with a latent unit (Task.unit_id); none of the {len(tasks)} "
                          "tasks has one")
    random.Random(f"graded-unit-{seed}").shuffle(units)
    step = (high - low) / (len(units) - 1) if len(units) > 1 else 0.0
    return {unit: round(low + i * step, 6) for i, unit in enumerate(units)}


def graded_range(config: WarmStartConfig, kind: str) -> tuple[float, float]:
    """(low, high) of the graded prior's rates for ``kind``: QA's high is ``graded_high_qa``, so that QA's
    strict accuracy stays under its bound by design (docs/preflight.md#p8-many-independent-units-registered-2026-12-03)."""
    return config.graded_low, config.graded_high_qa if kind == "qa" else config.graded_high


def unit_rates(tasks: list, config: WarmStartConfig, kind: str, seed: int) -> dict[str, float]:
    """The graded prior's rate per unit of ``kind`` under ``config`` and warm-start ``seed``."""
    return graded_rates(tasks, *graded_range(config, kind), seed)


def latent_trace_mix(tasks: list, p: float, seed: int, prior: str = "homogeneous",
                     graded: tuple[float, float] = (0.02, 0.70)) -> tuple[list, int]:
    """(tasks with their traces in the latent mix, number kept in the paper's protocol). Homogeneous:
    exactly round(p x len(tasks)) tasks, drawn with a generator seeded by ``seed``, keep the paper's
    answer protocol; cued: the tasks whose :func:`prior_cue` is in :func:`cued_values` do; graded: each
    task does with probability g(its unit) (:func:`graded_rates` over ``graded`` = (low, high); one
    seeded draw per task, ``p`` unused). The others get :func:`latent_reference`. Order unchanged."""
    import random

    if prior == "graded":
        rates = graded_rates(tasks, *graded, seed)
        draw = random.Random(f"graded-protocol-{seed}")
        keep = {i for i, t in enumerate(tasks) if draw.random() < rates.get(t.unit_id, 0.0)}
        mixed = [t if i in keep else dataclasses.replace(t, reference=latent_reference(t.reference))
                 for i, t in enumerate(tasks)]
        return mixed, len(keep)
    if not 0.0 <= p < 1.0:
        raise ConfigError(f"latent_p = {p!r} is out of range; it must be in [0, 1) (docs/regime.md"
                          "#r3-the-latent-protocol-warm-start)")
    if prior not in PRIORS:
        raise ConfigError(f"latent_prior = {prior!r} is not valid; valid values: {list(PRIORS)}")
    if prior == "cued":
        cues = cued_values(tasks, p, seed)
        keep = {i for i, t in enumerate(tasks) if prior_cue(t) in cues}
    else:
        keep = set(random.Random(f"latent-protocol-{seed}").sample(range(len(tasks)), round(p * len(tasks))))
    n_paper = len(keep)
    mixed = [t if i in keep else dataclasses.replace(t, reference=latent_reference(t.reference))
             for i, t in enumerate(tasks)]
    return mixed, n_paper


def tail_mean(curve: list[dict], key: str = "val_strict", k: int = TAIL_POINTS) -> dict[str, float]:
    """Mean, min and max of ``key`` over the last ``k`` curve points after the first (step 0 excluded).

    >>> tail_mean([{"val_strict": v} for v in (0.0, 0.1, 0.3, 0.2, 0.2, 0.3)], k=4)
    {'mean': 0.25, 'min': 0.2, 'max': 0.3, 'points': 4}
    """
    scores = [p[key] for p in curve[1:] if key in p and p[key] == p[key]][-k:]
    if not scores:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan"), "points": 0}
    return {"mean": round(sum(scores) / len(scores), 6), "min": min(scores), "max": max(scores), "points": len(scores)}


def converged(curve: list[dict], key: str = "val_lenient", delta: float = CONVERGENCE_DELTA,
              tail: float = CONVERGENCE_TAIL) -> bool:
    """Whether a warm-start curve has converged on ``key``: it has left its starting level (its best
    score beats the first point's by more than ``delta``; a curve flat at 0 has learned nothing) and
    the best score of its last ``tail`` of points (at least one) beats the best before them by at most
    ``delta`` (docs/regime.md#r3-the-latent-protocol-warm-start).

    >>> converged([{"val_lenient": v} for v in (0.0, 0.3, 0.6, 0.8, 0.82)])
    True
    >>> converged([{"val_lenient": v} for v in (0.0, 0.2, 0.4, 0.6, 0.8)])
    False
    >>> converged([{"val_lenient": v} for v in (0.0, 0.0, 0.0, 0.0, 0.01)])
    False
    """
    scores = [p[key] for p in curve if key in p]
    if len(scores) < 2 or max(scores) - scores[0] <= delta:
        return False
    n_tail = max(1, round(tail * len(scores)))
    return max(scores[-n_tail:]) - max(scores[:-n_tail]) <= delta


def warm_rollout_config(config: WarmStartConfig):
    """The rollout settings of the warm start's curve and of notebook 01's base evaluation."""
    from copes_lib.rollout import RolloutConfig

    return RolloutConfig(max_new_tokens=config.max_new_tokens, max_context=config.max_context,
                         batch_size=config.eval_batch, prompt_style=config.prompt_style,
                         max_turns=config.max_turns, enable_thinking=config.enable_thinking)


def train_warm_start(model, tokenizer, train_tasks, val_tasks, env, steps: int, batch: int, lr: float,
                     warmup: int, seed: int, eval_every: int, max_context: int, rollout_config,
                     log=print, on_point=None, target: float = 0.0, lr_decay: float = 0.0) -> list[dict]:
    """Supervised training on gold traces; returns the curve [{step, loss, val_score, val_strict,
    val_lenient, time_s}] (strict / lenient: :mod:`copes_lib.tasks.regime`).

    The stopping rule: evaluate every ``eval_every`` steps and stop at the first point whose
    validation score is >= ``target`` (``target`` 0: never), else after ``steps`` steps (the cap).
    ``lr_decay`` > 0: the rate decays linearly to 0 over that fraction of the last steps, so training
    ends settled rather than wherever the last constant-rate steps left it.
    """
    from copes_lib.rollout import evaluate
    from copes_lib.tasks.regime import regime_from_batches

    examples = [encode_trace(tokenizer, t, max_context) for t in train_tasks]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    decay_steps = round(lr_decay * steps)

    def rate(s: int) -> float:  # s: optimizer steps taken so far
        factor = min(1.0, (s + 1) / max(1, warmup))
        if decay_steps:
            factor = min(factor, (steps - s) / decay_steps)
        return max(factor, 0.0)

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    pad = tokenizer.pad_token_id
    curve, losses, t0 = [], [], time.perf_counter()

    def point(step: int) -> None:
        score = strict = lenient = float("nan")
        if val_tasks:
            result = evaluate(model, tokenizer, val_tasks, env, rollout_config, seed=seed, return_batches=True)
            regime = regime_from_batches(result["batches"], env.kind) if result.get("batches") else {}
            score, strict, lenient = result["score"], regime.get("strict", strict), regime.get("lenient", lenient)
        curve.append({"step": step, "loss": sum(losses) / len(losses) if losses else float("nan"),
                      "val_score": score, "val_strict": strict, "val_lenient": lenient,
                      "time_s": time.perf_counter() - t0})
        losses.clear()
        log(f"[warm_start {env.kind}] step {step} loss={curve[-1]['loss']:.4f} val_score={score:.3f} "
            f"strict={strict:.3f} lenient={lenient:.3f} t={curve[-1]['time_s']:.0f}s")
        if on_point is not None:
            on_point(step, model, curve)

    point(0)
    model.train()
    for step in range(1, steps + 1):
        picks = torch.randint(len(examples), (batch,), generator=generator).tolist()
        width = max(len(examples[i][0]) for i in picks)
        ids = torch.full((batch, width), pad, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, i in enumerate(picks):
            x, m = examples[i]
            ids[row, :len(x)] = torch.tensor(x)
            attention[row, :len(x)] = 1
            labels[row, :len(x)] = torch.where(torch.tensor(m, dtype=torch.bool), torch.tensor(x), -100)
        device = model.device
        loss = model(input_ids=ids.to(device), attention_mask=attention.to(device), labels=labels.to(device)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % eval_every == 0 or step == steps:
            point(step)
            if target > 0 and curve[-1]["val_score"] >= target:
                log(f"[warm_start {env.kind}] stopping rule: validation score {curve[-1]['val_score']:.3f} "
                    f">= target {target} at step {step}")
                break
            model.train()
    model.eval()
    return curve


def warm_start_recipe(profile: str, kind: str, seed: int, config: WarmStartConfig) -> tuple[dict, str]:
    """(the recipe a warm start's cache key hashes, that key): the config of the base, its data's fingerprint."""
    from copes_lib.tasks import data_fingerprint

    recipe = {**_warm_config(config, kind, seed), "data": data_fingerprint(profile, kind)}
    return recipe, runs.cache_key(recipe)


def warm_start_folder(profile: str, kind: str, seed: int = 0, *, config: WarmStartConfig, shipped: bool = True,
                      log=print) -> tuple[Path, bool]:
    """(cache folder of a warm start, whether a complete model is stored there). A folder without one whose key
    is shipped in ``bases/<profile>/`` (:mod:`copes_lib.bases`) gets it from there first, its sha256 checked
    (``shipped`` False: not, for a caller about to train anyway)."""
    _, key = warm_start_recipe(profile, kind, seed, config)
    folder = runs.cache_dir(profile, f"warm-{kind}", key)
    complete = (folder / "model").exists() and (folder / "info.json").exists()
    if not complete and shipped and bases.paths(profile, kind, seed, key)[1].exists():
        tokenizer = get_tokenizer(profile, config.vocab_size, subject_tokens=config.subject_tokens)
        complete = bases.materialise(profile, kind, seed, key, folder, tokenizer, log=log)
    return folder, complete


def warm_start(profile: str, kind: str = "math", seed: int = 0, force: bool = False, *,
               config: WarmStartConfig, log=print):
    """(model, tokenizer, info) of the profile's base model for ``kind``. Trained once, cached.

    ``seed`` selects the base model itself (initialisation and data order); training stops by the
    rule of :func:`train_warm_start` (target validation score or step cap), so another seed starts
    from about the same accuracy (notebook 01 measures the spread). Experiments that compare methods
    share seed 0's base model and vary their own seeds. In the gpu profile (or with
    ``config.model_path`` set) it loads the local checkpoint ``config.model_path`` instead. ``info``: steps (trained), max_steps, target, stopped ("target" or
    "cap"), params, curve (list of {step, loss, val_score, time_s}), train_time_s, threads,
    cache_dir, cached (whether it came from the cache), shipped (when the cache entry was copied from
    ``bases/<profile>/``: :func:`warm_start_folder`, :mod:`copes_lib.bases`), trained_on (CPU, torch, commit).
    ``force`` trains even when cached or shipped.
    """
    from copes_lib.rollout import make_env
    from copes_lib.tasks import TASK_KINDS, load_tasks

    if kind not in TASK_KINDS:
        raise ConfigError(f"kind = {kind!r} is not valid; valid values: {list(TASK_KINDS)}")
    if profile == "gpu" or config.model_path:
        model, tokenizer = load_pretrained(config.model_path)
        return model, tokenizer, {"steps": 0, "params": count_model_params(model), "curve": [], "cached": True,
                                  "cache_dir": config.model_path, "train_time_s": 0.0,
                                  "protocol": "paper", "converged": None}
    from transformers import Qwen3ForCausalLM

    tokenizer = get_tokenizer(profile, config.vocab_size, subject_tokens=config.subject_tokens)
    identity = _warm_config(config, kind, seed)
    folder, complete = warm_start_folder(profile, kind, seed, config=config, shipped=not force, log=log)

    def load():
        info = {**runs.read_json(folder / "info.json"), "cached": True}
        return Qwen3ForCausalLM.from_pretrained(folder / "model", dtype=torch.float32).eval(), tokenizer, info

    for _ in range(2):  # a damaged entry is reported and deleted; a shipped base of its key fills it again
        if force or not complete:
            break
        loaded = runs.load_cache_entry(folder, load, rebuild=runs.rebuild_command(profile, "01_substrate_and_agent"))
        if loaded is not None:
            return loaded
        folder, complete = warm_start_folder(profile, kind, seed, config=config, log=log)

    if not force:
        log(bases.not_shipped_line(profile, kind, seed, warm_start_recipe(profile, kind, seed, config)[1]))
    val = load_tasks(profile, kind, "val")[: config.eval_problems]
    train = load_tasks(profile, kind, "train")
    n_paper = len(train)
    if config.protocol == "latent":
        train, n_paper = latent_trace_mix(train, config.latent_p, seed, config.latent_prior,
                                          graded_range(config, kind))
    t0 = time.perf_counter()
    with threads.fixed_threads(), make_env(kind, profile) as env:
        model = build_agent_model(config.model_size, len(tokenizer), seed, config.max_context, tokenizer)
        curve = train_warm_start(model, tokenizer, train, val, env,
                                 identity["steps"], config.batch, config.lr, config.warmup, seed,
                                 config.eval_every, config.max_context, warm_rollout_config(config), log,
                                 target=identity["target"], lr_decay=config.lr_decay)
    trained = curve[-1]["step"]
    reached = identity["target"] > 0 and curve[-1]["val_score"] >= identity["target"]
    info = {"kind": kind, "steps": trained, "max_steps": identity["steps"], "target": identity["target"],
            "stopped": "target" if reached else "cap", "params": count_model_params(model), "curve": curve,
            "train_time_s": time.perf_counter() - t0, "threads": threads.N_FIXED, "cache_dir": str(folder),
            "config": identity, "protocol": config.protocol, "paper_traces": n_paper,
            "latent_traces": len(train) - n_paper, "converged": converged(curve),
            "trained_on": {"cpu": threads.cpu_model(), "torch": torch.__version__, **runs.git_state()}}
    _save_atomically(folder, "model", model.save_pretrained)
    runs.atomic_write_json(folder / "info.json", info)
    return model, tokenizer, {**info, "cached": False}


# --------------------------------------------------------------------------- bases built in worker processes
class WarmStartBuildError(RuntimeError):
    """A warm start trained in a worker process (:func:`build_warm_starts`) failed; names the base and its log."""


def build_log_dir(profile: str) -> Path:
    """Where :func:`build_warm_starts` puts each worker's output by default: beside the runner's notebook logs."""
    return runs.REPORTS_ROOT / profile / "logs"


def _tool_limits(profile: str) -> dict:
    """The agent tool settings in effect in this process (part of a warm start's cache key), as the
    keyword arguments of :class:`copes_lib.tasks.AgentToolSettings`, for a worker to set the same."""
    from copes_lib.tasks import tool_settings

    (math, top_k), (qa, _) = tool_settings(profile, "math"), tool_settings(profile, "qa")
    return {"math_python_calls": math["python"], "math_search_calls": math["search"],
            "qa_python_calls": qa["python"], "qa_search_calls": qa["search"], "search_top_k": top_k}


def build_warm_starts(profile: str, pairs, config: WarmStartConfig, *, jobs: int, force: bool = False,
                      log_dir: str | Path | None = None, log=print) -> dict[tuple[str, int], float]:
    """Train every missing base of ``pairs`` (``(kind, seed)``) in a process of its own, ``jobs`` at a time, so
    that :func:`warm_start` afterwards finds each one cached; returns ``{(kind, seed): seconds}`` of the bases
    trained here (``force``: every pair, cached or not).

    Each worker is ``python -m copes_lib.substrate build`` for one base (its output in
    ``log_dir/warm_start_<kind>_seed<seed>.log``, default ``reports/<profile>/logs/``, beside the runner's
    notebook logs). A worker trains exactly as :func:`warm_start` does in the caller's process, with the same
    config (sent as JSON of ``dataclasses.asdict``), the same agent tool settings and cache root and
    ``threads.N_FIXED`` threads (:func:`copes_lib.threads.fixed_threads`), so the weights are the same bits
    (tests/test_build_warm_starts.py). The tokenizer is built here first, so workers never race for it. A failed
    worker raises :class:`WarmStartBuildError` naming its kind, seed and log (after the others have finished).

    Nothing happens (``{}``) with ``jobs`` 1 (the caller trains in its own process, one base after another), when
    the base is loaded rather than trained (the gpu profile, ``config.model_path``), or when every base is cached.
    """
    import json
    import sys
    import tempfile

    from copes_lib.tasks import TASK_KINDS, data_variant

    if not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs = {jobs!r}: an integer >= 1 expected (worker processes at once; 1 = none, "
                          "in this process)")
    bad = [kind for kind, _ in pairs if kind not in TASK_KINDS]
    if bad:
        raise ConfigError(f"kind = {bad[0]!r} is not valid; valid values: {list(TASK_KINDS)}")
    if jobs == 1 or profile == "gpu" or config.model_path:
        return {}
    wanted = list(dict.fromkeys((kind, int(seed)) for kind, seed in pairs))
    missing = [(k, s) for k, s in wanted if force or not warm_start_folder(profile, k, s, config=config)[1]]
    if not missing:
        return {}
    get_tokenizer(profile, config.vocab_size, subject_tokens=config.subject_tokens)  # once, before the workers
    logs = Path(log_dir) if log_dir is not None else build_log_dir(profile)
    logs.mkdir(parents=True, exist_ok=True)
    shown = logs.relative_to(runs.REPO_ROOT) if logs.is_relative_to(runs.REPO_ROOT) else logs
    log(f"[warm_start] training {len(missing)} base(s) in worker processes, {jobs} at a time, "
        f"{threads.N_FIXED} thread(s) each: {', '.join(f'{k} seed {s}' for k, s in missing)}; logs in {shown}")

    with tempfile.TemporaryDirectory(prefix="copes-warm-") as tmp:
        spec = Path(tmp) / "config.json"
        spec.write_text(json.dumps({"config": dataclasses.asdict(config), "tools": _tool_limits(profile),
                                    "qa_data": data_variant(profile, "qa")}))

        def command(kind: str, seed: int) -> list[str]:
            return [sys.executable, "-m", "copes_lib.substrate", "build", "--profile", profile, "--kind", kind,
                    "--seed", str(seed), "--config", str(spec), "--cache-root", str(runs.CACHE_ROOT),
                    *(["--force"] if force else [])]

        done = runs.run_commands([((kind, seed), command(kind, seed), logs / f"warm_start_{kind}_seed{seed}.log")
                                  for kind, seed in missing], jobs)
    failed, built = [], {}
    for (kind, seed), status, out, seconds in done:
        lines = [line for line in out.read_text(errors="replace").splitlines() if line.strip()] if out.exists() else []
        if status == 0 and not warm_start_folder(profile, kind, seed, config=config)[1]:
            status, lines = "0 but no model where this process looks", lines + ["(a worker's cache key differs)"]
        if status != 0:
            failed.append(f"{kind} seed {seed} (exit {status}; its output: {out}; last line: "
                          f"{lines[-1][:300] if lines else 'none'})")
            continue
        built[(kind, seed)] = seconds
        log(f"[warm_start {kind}] seed {seed} trained in a worker process in {seconds:.0f} s")
    if failed:
        raise WarmStartBuildError(f"the warm start of {'; '.join(failed)} failed in its worker process; "
                                  "rerun to retry (bases already trained stay cached)")
    return built


def exit_with_parent() -> None:
    """End this worker when the process that started it is gone (a stopped notebook or a killed `make
    preflight`), instead of working on; a daemon thread polls the parent every 2 s."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(2.0)
        os._exit(130)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv=None) -> int:
    """``python -m copes_lib.substrate build --profile P --kind K --seed S --config FILE [--cache-root DIR]
    [--force]``: train (or find cached) one base, as :func:`warm_start` would in the caller's process; the worker
    of :func:`build_warm_starts`. ``FILE``: JSON ``{"config": dataclasses.asdict(WarmStartConfig), "tools":
    AgentToolSettings's fields, "qa_data": the QA data variant}``."""
    import argparse
    import json

    from copes_lib.tasks import AgentToolSettings, use_qa_data, use_tool_settings

    parser = argparse.ArgumentParser(prog="python -m copes_lib.substrate", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="train one base (a worker of build_warm_starts)")
    build.add_argument("--profile", required=True, choices=("smoke", "cpu"))
    build.add_argument("--kind", required=True)
    build.add_argument("--seed", type=int, required=True)
    build.add_argument("--config", required=True, help="JSON file: the WarmStartConfig and the tool settings")
    build.add_argument("--cache-root", default="", help="the cache root (default: the repository's cache/)")
    build.add_argument("--force", action="store_true", help="train even when the base is cached")
    args = parser.parse_args(argv)
    exit_with_parent()
    spec = json.loads(Path(args.config).read_text())
    if args.cache_root:
        runs.CACHE_ROOT = Path(args.cache_root)
    use_tool_settings(args.profile, AgentToolSettings(**spec["tools"]))
    use_qa_data(args.profile, spec.get("qa_data", "standard"))
    config = WarmStartConfig(**spec["config"])
    model, _, info = warm_start(args.profile, args.kind, args.seed, args.force, config=config,
                                log=lambda line: print(line, flush=True))
    print(f"[warm_start {args.kind}] seed {args.seed}: {info['steps']} steps, cached {info['cached']}, "
          f"{info['cache_dir']}", flush=True)
    return 0


def describe(model, tokenizer) -> dict:
    """Size facts of a substrate (for tables)."""
    cfg = model.config
    return {"params": count_model_params(model), "vocab_size": len(tokenizer), "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "intermediate": cfg.intermediate_size}


__all__ = ["WarmStartConfig", "MODEL_SIZES", "exit_with_parent", "train_agent_tokenizer", "get_tokenizer", "build_agent_model",
           "model_config", "count_model_params", "load_pretrained", "encode_trace", "warm_start", "warm_start_folder", "warm_start_recipe",
           "train_warm_start", "warm_rollout_config", "describe", "PROTOCOLS", "latent_reference", "latent_trace_mix", "PRIORS", "prior_cue", "cued_values",
           "graded_rates",
           "graded_range", "unit_rates", "tail_mean", "TAIL_POINTS", "converged", "build_warm_starts",
           "WarmStartBuildError", "build_log_dir"]


if __name__ == "__main__":  # the worker of build_warm_starts: the imported module's functions, not a second copy
    from copes_lib.substrate import main as _main

    raise SystemExit(_main())
