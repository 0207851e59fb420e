"""The parameters of every notebook of paper A and of the suite notebooks (00, 99).

A notebook's parameters cell holds flat typed scalars; :func:`copes_lib.protocols.notebooks.load_params`
turns them into one of these frozen dataclasses (defaults = the ``cpu`` profile's values) and fails at
once on an unknown name, a wrong type or an out-of-range value. The engines never see these classes:
each class turns itself into the engine-level configs (``ESConfig``, ``GRPOConfig``,
``WarmStartConfig``, ...) the library's algorithms take.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from copes_lib.budget import SubstrateSizes
from copes_lib.config import Config, ConfigError, NotebookParams, param
from copes_lib.engines import ENGINES
from copes_lib.es import ESConfig
from copes_lib.grpo import GRPOConfig
from copes_lib.grpo_sharded import ShardingConfig
from copes_lib.substrate import MODEL_SIZES, PROTOCOLS, WarmStartConfig
from copes_lib.tasks import AgentToolSettings, GPUDataPaths


@dataclass(frozen=True)
class OverviewParams(NotebookParams):
    """Parameters of 00_suite_overview."""

    NOTEBOOK = "00_suite_overview"


@dataclass(frozen=True)
class SummaryParams(NotebookParams):
    """Parameters of 99_summary."""

    NOTEBOOK = "99_summary"

    WRITE_README: bool = param(True, "rewrite the README's generated results section from the claims table")


@dataclass(frozen=True)
class PreflightSettings(Config):
    """How much the preflight measures (cpu: docs/preflight.md#p1-the-preconditions)."""

    prompts: int = param(64, "tuning prompts sampled for G1 / G2 and evaluated for E1 (a multiple of batch_size)",
                         ge=1)
    group_size: int = param(8, "G, samples per prompt (GRPO's group size)", ge=2)
    temperature: float = param(1.0, "sampling temperature of G1 / G2 (GRPO's)", gt=0.0)
    members: int = param(40, "E1 and the ES pilot: members N", ge=2)
    batch_size: int = param(16, "prompts per ES batch (the run's BATCH_SIZE)", ge=1)
    sigma_ladder: str = param("0.00125,0.0025,0.005,0.01,0.02,0.04,0.08", "sigmas tried by the calibration, "
                              "ascending (docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op)")
    calibration_members: int = param(16, "members per ladder rung", ge=2)
    calibration_batches: int = param(2, "training batches per ladder rung (each must reach the share)", ge=1)
    pilot_steps: int = param(8, "steps of the ES and GRPO pilots", ge=1)
    tuning_problems: int = param(256, "tuning problems the GRPO pilot's strict gain is measured on", ge=1)
    grpo_lr: float = param(0.0, "the GRPO pilot's learning rate; 0: notebook 04's FULL_LR (the registered "
                           "default)", ge=0.0)
    seed: int = param(0, "seed of the samples and of the ES members", ge=0)

    def check(self) -> None:
        ladder = self.ladder()
        if not ladder or any(s <= 0 for s in ladder) or ladder != sorted(set(ladder)):
            raise ConfigError(f"sigma_ladder = {self.sigma_ladder!r}: give ascending sigmas > 0, e.g. "
                              "'0.00125,0.0025,0.005'")
        if self.prompts % self.batch_size:
            raise ConfigError(f"prompts = {self.prompts} must be a multiple of batch_size = {self.batch_size}")

    def ladder(self) -> list[float]:
        try:
            return [float(v) for v in self.sigma_ladder.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"sigma_ladder = {self.sigma_ladder!r}: comma-separated numbers expected") from None


# =========================================================================== 01: substrate and agent
@dataclass(frozen=True)
class SubstrateNotebookParams(NotebookParams):
    """Parameters of notebook 01_substrate_and_agent (defaults = the cpu profile). Every notebook reads
    the same values from ``profiles/<profile>.yaml`` (``protocols.testbed.substrate_setup``), so all use one
    substrate."""

    NOTEBOOK = "01_substrate_and_agent"

    MODEL_SIZE: str = param("cpu", "Qwen3 shape of the miniature", choices=tuple(MODEL_SIZES))
    VOCAB_SIZE: int = param(640, "BPE vocabulary size of the miniature's tokenizer", ge=300, le=8192)
    MAX_CONTEXT: int = param(384, "longest prompt + trajectory in tokens (model positions)", ge=64)
    WARM_MATH_STEPS: int = param(600, "most warm-start optimizer steps on math traces (cap of the stopping rule)", ge=0)
    WARM_QA_STEPS: int = param(300, "most warm-start optimizer steps on QA traces (cap of the stopping rule)", ge=0)
    WARM_MATH_TARGET: float = param(0.40, "stop the math warm start at the first curve point with validation "
                                    "accuracy >= this (0 = always train the cap)", ge=0.0, le=1.0)
    WARM_QA_TARGET: float = param(0.35, "stop the QA warm start at the first curve point with validation "
                                  "F1 >= this (0 = always train the cap)", ge=0.0, le=1.0)
    WARM_SPREAD_SEEDS: int = param(2, "extra math warm-start seeds (SEED+1, ...) notebook 01 trains only to "
                                   "measure the base accuracy's spread over seeds (none when the base is loaded, "
                                   "not trained: MODEL_PATH / the gpu profile)", ge=0)
    WARM_PROTOCOL: str = param("latent", "answer protocol of the warm start's traces: latent (the papers' regime: "
                               "a fraction WARM_LATENT_P of traces in the reward's protocol, the rest end in "
                               "'Answer: ...'; docs/regime.md#r3-the-latent-protocol-warm-start) or paper (every "
                               "trace in the reward's protocol, the target stopping rule: the skill-gap control)",
                               choices=PROTOCOLS)
    WARM_LATENT_P: float = param(0.1, "latent protocol: fraction p of training traces in the reward's answer "
                                 "protocol, in [0, 1)", ge=0.0, lt=1.0)
    WARM_LATENT_PRIOR: str = param("graded", "latent protocol: how the paper-protocol traces are assigned: graded "
                                   "(each latent unit, the subject name, its own rate, evenly spaced over [WARM_GRADED_LOW, "
                                   "WARM_GRADED_HIGH] (QA: WARM_GRADED_HIGH_QA): the protocol is stochastic per sample "
                                   "and graded across prompts; docs/preflight.md#p82-the-graded-prior-over-units), "
                                   "cued (every task whose unit's first letter is in a seeded set covering about "
                                   "WARM_LATENT_P of the tasks: deterministic per prompt) or homogeneous (a random "
                                   "fraction WARM_LATENT_P); docs/regime.md#r3-the-latent-protocol-warm-start",
                                   choices=("homogeneous", "cued", "graded"))
    WARM_GRADED_LOW: float = param(0.02, "graded prior: the lowest unit's rate of paper-protocol traces, in "
                                   "[0, 1)", ge=0.0, lt=1.0)
    WARM_GRADED_HIGH: float = param(0.70, "graded prior: the highest unit's rate (math), above WARM_GRADED_LOW and "
                                    "below 1", gt=0.0, lt=1.0)
    WARM_GRADED_HIGH_QA: float = param(0.55, "graded prior: the highest unit's rate on QA, above WARM_GRADED_LOW and "
                                       "below 1 (QA's strict bound holds by design: "
                                       "docs/preflight.md#p82-the-graded-prior-over-units)", gt=0.0, lt=1.0)
    WARM_LR_DECAY: float = param(0.25, "fraction of the last latent warm-start steps over which the learning rate "
                                 "decays linearly to 0 (0: constant; docs/preflight.md#p2-the-graded-base-the-new-headline-base-design)",
                                 ge=0.0, le=1.0)
    WARM_SUBJECT_TOKENS: bool = param(False, "every subject name (the latent unit) one token of the miniature's tokenizer "
                                      "(docs/preflight.md#p86-the-unit-as-one-token-registered-2026-12-03; the cpu "
                                      "profile's recipe: docs/preflight.md#p87-the-recipe-of-the-5-seed-check-registered-2026-12-03)")
    WARM_LATENT_MATH_STEPS: int = param(1000, "latent protocol: math warm-start steps, trained exactly (no stopping "
                                        "rule; convergence is checked on the lenient curve)", ge=1)
    WARM_LATENT_QA_STEPS: int = param(1000, "latent protocol: QA warm-start steps, trained exactly (no stopping "
                                      "rule; convergence is checked on the lenient curve)", ge=1)
    BUILD_JOBS: int = param(2, "processes that build 01's bases and preflights at once, one thread each (1: in "
                            "this process, one after another; the runner gives 01 this many of its JOBS slots, at "
                            "most JOBS: docs/cost.md)", ge=1)
    REBUILD_BASES: bool = param(False, "retrain each base loaded from bases/<profile>/ (the shipped bases) in a "
                                "temporary cache and compare bitwise: equal, or differs (CPU vendor X vs Y); "
                                "make reproduce REBUILD_BASES=1 turns it on too (docs/reproducibility.md#shipped-bases)")
    PREFLIGHT: bool = param(True, "measure the testbed's preconditions on the base (docs/preflight.md; the gpu "
                            "profile has no tuning split: off there)")
    PREFLIGHT_ENFORCE: bool = param(True, "gate each base on the preflight: a kind whose recorded 5-seed check did not "
                                    "pass is not built, and a kind whose preflight fails here skips the notebooks on "
                                    "its base (copes_lib/protocols/testbed/base_gate.py; off in smoke, whose bases are too "
                                    "small to act)")
    UNCHECKED_BASES: bool = param(False, "exploration: build a base whose 5-seed check did not pass anyway; the claims "
                                  "on that kind then read 'not checked' (make reproduce UNCHECKED_BASES=1)")
    BASE_CHECK_SEEDS_MATH: str = param("0,1,2,3,4", "the warm-start seeds whose recorded check gates the math base "
                                       "(its design's registration names them, docs/preflight.md P8.5): every one "
                                       "must be recorded and pass; comma-separated, at least 5")
    BASE_CHECK_SEEDS_QA: str = param("0,1,2,3,4", "the warm-start seeds whose recorded check gates the QA base, as "
                                     "BASE_CHECK_SEEDS_MATH")
    PREFLIGHT_KINDS: str = param("math,qa", "task kinds the preflight measures, comma-separated")
    PREFLIGHT_PROMPTS: int = param(64, "preflight: tuning prompts sampled (G1/G2) and evaluated (E1)", ge=1)
    PREFLIGHT_GROUP: int = param(8, "preflight: samples per prompt at T 1 (GRPO's group size)", ge=2)
    PREFLIGHT_MEMBERS: int = param(40, "preflight: ES members of E1 and of the ES pilot (the run's N)", ge=2)
    PREFLIGHT_BATCH: int = param(16, "preflight: prompts per ES batch (the run's BATCH_SIZE)", ge=1)
    PREFLIGHT_SIGMAS: str = param("0.00125,0.0025,0.005,0.01,0.02,0.04,0.08", "preflight: the sigma ladder of the "
                                  "calibration, ascending (docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op)")
    PREFLIGHT_CALIBRATION_MEMBERS: int = param(16, "preflight: members per ladder rung", ge=2)
    PREFLIGHT_CALIBRATION_BATCHES: int = param(2, "preflight: training batches per ladder rung", ge=1)
    PREFLIGHT_PILOT_STEPS: int = param(8, "preflight: steps of the ES and full-GRPO pilots", ge=1)
    PREFLIGHT_TUNING_PROBLEMS: int = param(256, "preflight: tuning problems of the GRPO pilot's strict gain", ge=1)
    WARM_BATCH: int = param(32, "warm-start traces per step", ge=1)
    WARM_LR: float = param(3e-3, "warm-start AdamW learning rate (after a linear warmup)", gt=0.0)
    WARM_WARMUP: int = param(20, "linear learning-rate warmup steps", ge=0)
    WARM_EVAL_EVERY: int = param(25, "evaluate the warm start every this many steps (curve, stopping rule)", ge=1)
    WARM_EVAL_PROBLEMS: int = param(128, "validation problems per curve point", ge=1)
    EVAL_BATCH: int = param(256, "trajectories per rollout batch when evaluating", ge=1)
    MAX_NEW_TOKENS: int = param(64, "model-written tokens per trajectory", ge=8)
    N_TRAJECTORIES: int = param(4, "trajectories rendered per task kind", ge=0)
    BENCH_BATCH: int = param(64, "batch of the rollout-throughput measurement", ge=1)
    MODEL_PATH: str = param("", "gpu profile: local HF checkpoint folder (e.g. Qwen3.5-4B)")
    MATH_TRAIN_JSONL: str = param("", "gpu profile: MATH train JSONL (problem, solution, type)")
    MATH_TEST_FILES: str = param("", "gpu profile: Table 1's math test sets, name=path,... with names aime24, "
                                 "aime25, gsm8k, math500, math_test (tasks.loaders.BENCHMARKS)")
    QA_TRAIN_JSONL: str = param("", "gpu profile: HotpotQA train JSONL")
    QA_TEST_FILES: str = param("", "gpu profile: Table 4's QA test sets, name=path,... with names hotpotqa, "
                               "2wiki, musique")
    SEARCH_CORPUS_JSONL: str = param("", "gpu profile: search corpus JSONL (id, title, text | contents)")
    VAL_HOLDOUT: int = param(750, "gpu profile: training problems held out for validation (paper: 750)", ge=1)
    MAX_TURNS: int = param(6, "model turns per trajectory (each tool call ends one); 0 = every allowed call "
                           "plus the answer (the paper's limits: math 9, QA 11)", ge=0)
    MATH_PYTHON_CALLS: int = param(5, "Python calls per math trajectory (paper: 5)", ge=0)
    MATH_SEARCH_CALLS: int = param(3, "search calls per math trajectory (paper: 3)", ge=0)
    QA_PYTHON_CALLS: int = param(5, "Python calls per QA trajectory (paper: 5)", ge=0)
    QA_SEARCH_CALLS: int = param(5, "search calls per QA trajectory (paper: 5)", ge=0)
    SEARCH_TOP_K: int = param(1, "passages returned per search call (Search-R1 / the paper: 3)", ge=1)
    QA_DATA: str = param("standard", "generated QA data (smoke / cpu): standard, or large (twice the training "
                         "problems from twice-as-large worlds, cpu 10,000; docs/preflight.md P8.9 (b)); gpu: "
                         "standard only", choices=("standard", "large"))
    RETRIEVER: str = param("bm25", "gpu search tool: bm25, or dense (EMBEDDING_MODEL_PATH + FAISS, the paper's "
                           "E5 setup); built once under cache/ and memory-mapped", choices=("bm25", "dense"))
    EMBEDDING_MODEL_PATH: str = param("", "gpu, RETRIEVER dense: local encoder folder (e.g. e5-base-v2)")
    EMBEDDING_QUERY_PREFIX: str = param("", "dense retriever: text put before each query (E5: 'query: ')")
    EMBEDDING_PASSAGE_PREFIX: str = param("", "dense retriever: text put before each passage (E5: 'passage: ')")
    THINKING: bool = param(True, "chat prompts (gpu): the template's enable_thinking, Qwen3.5's thinking mode "
                           "(the paper does not say; on is the checkpoint's default)")

    def check(self) -> None:
        if self.WARM_GRADED_LOW >= min(self.WARM_GRADED_HIGH, self.WARM_GRADED_HIGH_QA):
            raise ConfigError(f"WARM_GRADED_LOW = {self.WARM_GRADED_LOW} must be < WARM_GRADED_HIGH = "
                              f"{self.WARM_GRADED_HIGH} and < WARM_GRADED_HIGH_QA = {self.WARM_GRADED_HIGH_QA}; valid: "
                              "0 <= WARM_GRADED_LOW < WARM_GRADED_HIGH, WARM_GRADED_HIGH_QA < 1")
        self.preflight_kinds()
        self.check_seeds()
        try:
            self.preflight_settings()
        except ConfigError as error:
            raise ConfigError(f"{error} (the PREFLIGHT_* parameters)") from None
        if self.PROFILE == "gpu" and self.QA_DATA != "standard":
            raise ConfigError(f"QA_DATA = {self.QA_DATA!r} is not valid on the gpu profile (its QA data are "
                              "QA_TRAIN_JSONL / QA_TEST_FILES); valid values: ['standard']")
        if self.PROFILE != "gpu" and self.MODEL_SIZE not in MODEL_SIZES:
            raise ConfigError(f"MODEL_SIZE = {self.MODEL_SIZE!r}; valid values: {list(MODEL_SIZES)}")
        from copes_lib.tasks.loaders import parse_test_files

        for kind, name in (("math", "MATH_TEST_FILES"), ("qa", "QA_TEST_FILES")):
            try:
                parse_test_files(getattr(self, name), kind, f"{type(self).__name__}.{name}")
            except ValueError as error:
                raise ConfigError(str(error)) from None
        if self.PREFLIGHT:
            no_tuning_split(self.PROFILE, "PREFLIGHT", self.PREFLIGHT, "false")

    def preflight_kinds(self) -> list[str]:
        kinds = [k.strip() for k in self.PREFLIGHT_KINDS.split(",") if k.strip()]
        if not kinds or any(k not in ("math", "qa") for k in kinds):
            raise ConfigError(f"PREFLIGHT_KINDS = {self.PREFLIGHT_KINDS!r}; valid: a comma-separated subset of "
                              "['math', 'qa']")
        return kinds

    def check_seeds(self) -> dict[str, tuple[int, ...]]:
        """Per kind, the warm-start seeds of its registered check (``BASE_CHECK_SEEDS_<KIND>``), which the base
        gate requires recorded and passing (:mod:`copes_lib.protocols.testbed.base_gate`)."""
        from copes_lib.protocols.testbed.base_gate import MIN_SEEDS

        out = {}
        for kind in ("math", "qa"):
            name = f"BASE_CHECK_SEEDS_{kind.upper()}"
            text = getattr(self, name)
            try:
                seeds = tuple(int(v) for v in text.split(",") if v.strip())
            except ValueError:
                seeds = ()
            if len(seeds) < MIN_SEEDS or len(set(seeds)) != len(seeds) or min(seeds) < 0:
                raise ConfigError(f"{name} = {text!r}; valid: at least {MIN_SEEDS} distinct comma-separated "
                                  "integers >= 0, e.g. '0,1,2,3,4' (docs/preflight.md P8.5)")
            out[kind] = tuple(sorted(seeds))
        return out

    def preflight_settings(self):
        """The preflight's settings."""
        return PreflightSettings(prompts=self.PREFLIGHT_PROMPTS, group_size=self.PREFLIGHT_GROUP,
                                 members=self.PREFLIGHT_MEMBERS, batch_size=self.PREFLIGHT_BATCH,
                                 sigma_ladder=self.PREFLIGHT_SIGMAS, calibration_members=self.PREFLIGHT_CALIBRATION_MEMBERS,
                                 calibration_batches=self.PREFLIGHT_CALIBRATION_BATCHES,
                                 pilot_steps=self.PREFLIGHT_PILOT_STEPS, tuning_problems=self.PREFLIGHT_TUNING_PROBLEMS,
                                 seed=self.SEED)

    def warm_start_config(self) -> WarmStartConfig:
        """The substrate these parameters describe (the gpu profile loads MODEL_PATH instead of training)."""
        gpu = self.PROFILE == "gpu"
        return WarmStartConfig(
            model_size=self.MODEL_SIZE, vocab_size=self.VOCAB_SIZE, max_context=self.MAX_CONTEXT,
            math_steps=self.WARM_MATH_STEPS, qa_steps=self.WARM_QA_STEPS, math_target=self.WARM_MATH_TARGET,
            qa_target=self.WARM_QA_TARGET, batch=self.WARM_BATCH,
            lr=self.WARM_LR, warmup=self.WARM_WARMUP, eval_every=self.WARM_EVAL_EVERY,
            eval_problems=self.WARM_EVAL_PROBLEMS, eval_batch=self.EVAL_BATCH, max_new_tokens=self.MAX_NEW_TOKENS,
            prompt_style="auto" if gpu else "plain", model_path=self.MODEL_PATH if gpu else "",
            max_turns=self.MAX_TURNS, enable_thinking=self.THINKING if gpu else None,
            # a loaded checkpoint is trained on no traces: the protocol is the miniature's construction
            protocol="paper" if gpu or self.MODEL_PATH else self.WARM_PROTOCOL, latent_p=self.WARM_LATENT_P,
            latent_prior=self.WARM_LATENT_PRIOR, graded_low=self.WARM_GRADED_LOW, graded_high=self.WARM_GRADED_HIGH,
            graded_high_qa=self.WARM_GRADED_HIGH_QA,
            lr_decay=self.WARM_LR_DECAY if self.WARM_PROTOCOL == "latent" else 0.0,
            subject_tokens=self.WARM_SUBJECT_TOKENS and not (gpu or self.MODEL_PATH),
            latent_math_steps=self.WARM_LATENT_MATH_STEPS, latent_qa_steps=self.WARM_LATENT_QA_STEPS)

    def trains_base(self) -> bool:
        """Whether notebook 01 trains its base (smoke / cpu) rather than loading ``MODEL_PATH`` (gpu)."""
        return not (self.PROFILE == "gpu" or self.MODEL_PATH)

    def spread_seeds(self) -> list[int]:
        """The extra warm-start seeds notebook 01 trains to measure the base's spread over seeds:
        ``SEED+1 .. SEED+WARM_SPREAD_SEEDS``, none when the base is loaded (every seed would load the
        same checkpoint: a spread of 0 by construction)."""
        return list(range(self.SEED + 1, self.SEED + 1 + self.WARM_SPREAD_SEEDS)) if self.trains_base() else []

    def gpu_data_paths(self) -> GPUDataPaths:
        return GPUDataPaths(
            math_train_jsonl=self.MATH_TRAIN_JSONL, math_test_files=self.MATH_TEST_FILES,
            qa_train_jsonl=self.QA_TRAIN_JSONL, qa_test_files=self.QA_TEST_FILES,
            search_corpus_jsonl=self.SEARCH_CORPUS_JSONL, val_holdout=self.VAL_HOLDOUT, retriever=self.RETRIEVER,
            embedding_model_path=self.EMBEDDING_MODEL_PATH, embedding_query_prefix=self.EMBEDDING_QUERY_PREFIX,
            embedding_passage_prefix=self.EMBEDDING_PASSAGE_PREFIX)

    def tool_settings(self) -> AgentToolSettings:
        return AgentToolSettings(
            math_python_calls=self.MATH_PYTHON_CALLS, math_search_calls=self.MATH_SEARCH_CALLS,
            qa_python_calls=self.QA_PYTHON_CALLS, qa_search_calls=self.QA_SEARCH_CALLS,
            search_top_k=self.SEARCH_TOP_K)


# =========================================================================== the ES settings (02, 03, 05, 06, 07)
def _es_param(field: str, default, help: str):
    """A notebook parameter for ``ESConfig.<field>``: its choices and range are ESConfig's own."""
    meta = {f.name: f.metadata for f in dataclasses.fields(ESConfig)}[field]
    return param(default, help, **{k: meta[k] for k in ("choices", "ge", "gt", "le", "lt")})


# notebook parameter -> ESConfig field, the one conversion (``ESSettings.es_config``)
ES_FIELDS = {"POPULATION": "population", "SUBSPACES": "subspaces", "SIGMA": "sigma", "ALPHA": "alpha",
             "CHUNK_SIZE": "chunk_size", "NOISE": "noise", "ZSCORE": "zscore", "BACKEND": "backend",
             "RAY_WORKERS": "ray_workers", "NOISE_RANK": "noise_rank"}


@dataclass(frozen=True)
class ESSettings(NotebookParams):
    """The ES / CoPES settings of every notebook that trains ES, declared once (ranges and choices are
    ``ESConfig``'s), and the agent they train: its prompt batches, validation problems and rollout
    engine. ``es_config`` is the one conversion to the engine's config. A notebook without a CoPES K or a
    z-score ablation keeps the class attributes ``SUBSPACES = 1`` and ``ZSCORE = "joint"``; one that has
    them declares them as parameters."""

    POPULATION: int = _es_param("population", 40, "N, members per ES / CoPES step (paper: 40)")
    SIGMA: float = _es_param("sigma", 1e-2, "sigma of standard ES (paper: 1e-3; chosen for this substrate "
                             "by the sweep, docs/prior_measurements.md)")
    ALPHA: float = _es_param("alpha", 5e-3, "alpha of standard ES (paper: 5e-4)")
    BATCH_SIZE: int = param(16, "prompts per ES step, shared by all members (paper: 64; 16 fits the cpu budget)",
                            ge=1)
    VAL_PROBLEMS: int = param(512, "validation problems, 0 for all of the val split (paper: 750)", ge=0)
    CHUNK_SIZE: int = _es_param("chunk_size", 4096, "elements per parameter chunk (paper: unstated)")
    BACKEND: str = _es_param("backend", "batched", "ES member evaluation: sequential, batched (members x "
                             "prompts in one rollout) or ray (same updates)")
    RAY_WORKERS: int = _es_param("ray_workers", 2, "BACKEND ray: workers (one per GPU on a GPU cluster; "
                                 "RAY_ADDRESS joins one)")
    ENGINE: str = param("loop", "rollout engine: loop, slots (continuous batching) or static (preallocated "
                        "cache, decode step compiled on CUDA); docs/engines.md", choices=ENGINES)
    NOISE: str = _es_param("noise", "iid", "noise seeding (iid or paper_correlated)")
    ES_SEED: int = _es_param("seed", 33, "seed of noise and partitions; seed i of a multi-seed notebook uses "
                             "ES_SEED + i (paper: 33)")
    BATCH_SEED: int = param(1088, "seed of the per-step prompt batches, shared by every method; seed i of a "
                            "multi-seed notebook uses BATCH_SEED + i", ge=0)

    SUBSPACES = 1  # not a parameter here: K of the main run (03, 05, 06, 07 declare it)
    ZSCORE = "joint"  # not a parameter here (03 declares it)
    TASK_KIND = "math"  # not a parameter here: the task family (02 declares it; 07 sets "qa")
    NOISE_RANK = 0  # not a parameter here: full-rank noise (02, 03 and 05 declare it)

    def check(self) -> None:
        try:
            self.es_config()
        except ConfigError as err:
            if self.NOISE_RANK and "noise_rank" in str(err):
                raise ConfigError(f"{type(self).__name__}: NOISE_RANK = {self.NOISE_RANK} with BACKEND = "
                                  f"{self.BACKEND!r}: {err}") from None
            raise ConfigError(f"{type(self).__name__}: POPULATION = {self.POPULATION} with SUBSPACES = "
                              f"{self.SUBSPACES}: {err}") from None

    def es_config(self, *, seed_index: int = 0, **overrides: Any) -> ESConfig:
        """The ESConfig of this notebook's main run, changed by ``overrides`` (ESConfig field names:
        subspaces, sigma, alpha, zscore, ...); run ``seed_index`` i uses noise seed ES_SEED + i."""
        values = {field: getattr(self, name) for name, field in ES_FIELDS.items()}
        return ESConfig(**{**values, "seed": self.ES_SEED + seed_index, **overrides})


# =========================================================================== 02, 03: ES and CoPES
@dataclass(frozen=True)
class StandardESNotebookParams(ESSettings):
    """Parameters of 02_standard_es (defaults = the cpu profile)."""

    NOTEBOOK = "02_standard_es"

    STEPS: int = param(16, "ES steps of the main run (paper: the 16-step budget; best ES checkpoint at 112)",
                       ge=0)
    VAL_EVERY: int = param(8, "validate every this many steps (paper: 8)", ge=1)
    SWEEP_SIGMAS: str = param("centred", "the sweep's sigmas: 'centred' (the registered default sigma x "
                              "SWEEP_FACTORS: notebook 01's calibrated sigma, else SIGMA), comma-separated sigmas "
                              "(the default is added), or empty for no sweep; widened while its best is at an edge "
                              "(docs/preflight.md#p3-settings-rules-that-cannot-choose-a-no-op)")
    SWEEP_FACTORS: str = param("0.5,1,2", "with SWEEP_SIGMAS 'centred': the factors of the registered default sigma")
    SWEEP_ALPHA_RATIO: float = param(0.5, "the sweep sets alpha to this ratio times sigma (paper: 0.5)", gt=0.0)
    SWEEP_STEPS: int = param(8, "steps per sweep run: the budget it serves (05's BUDGET_MAX; the same for every "
                             "method's sweep)", ge=1)
    SWEEP_VAL_PROBLEMS: int = param(256, "tuning-split problems each sweep run is scored on (the tuning split is "
                                    "disjoint from validation, tasks.TUNING_SPLIT)", ge=1)
    SWEEP_MAX_EXTEND: int = param(2, "values the sweep may add beyond an edge of SWEEP_SIGMAS (one grid step at a "
                                  "time, while the best is at the edge; the same limit for every method)", ge=0)
    TASK_KIND: str = param("math", "task family", choices=("math", "qa"))
    NOISE_RANK: int = _es_param("noise_rank", 0, "0: full-rank noise (paper); r >= 1: low-rank noise A B^T / "
                                "sqrt(r) on the weight matrices, members batched on shared weights (EGGROLL; "
                                "docs/lowrank_es.md)")
    MAIN_FROM_SWEEP: bool = param(True, "main run at the sweep's best (sigma, alpha); False: SIGMA, ALPHA")

    def check(self) -> None:
        super().check()
        if self.sweep_grid(self.SIGMA):
            no_tuning_split(self.PROFILE, "SWEEP_SIGMAS", self.SWEEP_SIGMAS, "''")

    def sweep_grid(self, default: float) -> list[float]:
        """The sweep's grid around the registered default ``default`` (empty: no sweep)."""
        if self.SWEEP_SIGMAS.strip() == "centred":
            from copes_lib.protocols.paper_a.sweeps import centred_grid

            return centred_grid(default, sweep_grid(self.SWEEP_FACTORS, "SWEEP_FACTORS"))
        return sweep_grid(self.SWEEP_SIGMAS, "SWEEP_SIGMAS")


@dataclass(frozen=True)
class CoPESNotebookParams(StandardESNotebookParams):
    """Parameters of 03_copes (defaults = the cpu profile)."""

    NOTEBOOK = "03_copes"

    SUBSPACES: int = _es_param("subspaces", 4, "K (paper: 4)")
    ZSCORE: str = _es_param("zscore", "joint", "z-score over all N (paper) or per subspace (ablation)")
    SIGMA: float = _es_param("sigma", 1e-2, "sigma; CoPES perturbs with sigma_k: sqrt(K) x sigma (the paper's "
                             "protocol shares ES's sigma)")
    SWEEP_SIGMAS: str = param("centred", "the CoPES sweep's sigmas, separate from ES's: 'centred' (the registered "
                              "default sigma x SWEEP_FACTORS), comma-separated sigmas, or empty for no sweep")
    STEP_CONTROL: bool = param(False, "also run ES with sqrt(K) x alpha (CoPES's update size; docs/prior_measurements.md)")


def sweep_grid(text: str, name: str) -> list[float]:
    """:func:`sweep_values` of a sweep's grid: empty (no sweep) or at least two distinct values, since one
    value is a sweep that can neither compare nor bracket anything."""
    values = sweep_values(text, name)
    if len(set(values)) == 1:
        raise ConfigError(f"{name} = {text!r} holds one value: give at least two (a geometric grid, e.g. "
                          "'0.5,1,2') or leave it empty for no sweep")
    return values


def sweep_values(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ConfigError(f"{name} = {text!r} must be comma-separated numbers, e.g. '0.005,0.01'") from err
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise ConfigError(f"{name} = {text!r}: every value must be finite and > 0")
    return values


def no_tuning_split(profile: str, name: str, value: Any, off: str) -> None:
    """The gpu profile has no tuning split (holding one out of MATH's train file would change the paper's
    training set), so a setting that scores on it is an error at validation, naming the setting, instead
    of a failure after the checkpoint has loaded. ``off``: the value that turns it off."""
    if profile == "gpu":
        raise ConfigError(f"{name} = {value!r} needs the tuning split, which the gpu profile does not have (its "
                          f"settings are the paper's); set {name} to {off} in profiles/gpu.yaml, or run it on "
                          "the smoke / cpu profile")


# =========================================================================== 04: GRPO
@dataclass(frozen=True)
class GRPONotebookParams(NotebookParams):
    """Parameters of notebooks/04_grpo.ipynb. Defaults are the cpu profile's values."""

    NOTEBOOK = "04_grpo"

    STEPS: int = param(64, "hard cap on GRPO training steps per run; PATIENCE stops it earlier once its "
                       "validation curve has peaked; a run that reaches the cap is reported censored (paper: "
                       "full GRPO's best at 16, LoRA-GRPO's at 64)", ge=1)
    PATIENCE: int = param(3, "stop a run after this many validations in a row without a new best (its peak "
                          "is then behind it, not censored by STEPS); 0 runs all STEPS", ge=0)
    GRPO_SEEDS: int = param(3, "full-GRPO seeds: seed i trains with GRPO_SEED + i (seed 0 is the run 05 reuses); "
                            "their spread is the reference's noise in every gain recovery", ge=1)
    LORA_SEEDS: int = param(3, "LoRA-GRPO seeds (GRPO_SEED + i)", ge=1)
    VAL_EVERY: int = param(4, "validate every this many steps (paper: 8)", ge=1)
    PROMPT_BATCH: int = param(16, "prompts per step (paper: 64)", ge=1)
    GROUP_SIZE: int = param(8, "G, trajectories per prompt (paper: 8)", ge=2)
    MINI_BATCH: int = param(8, "prompts per optimizer step (paper: 32 of 64, i.e. 2 updates per step)", ge=1)
    MICRO_BATCH: int = param(32, "trajectories per forward/backward (memory only)", ge=1)
    LOGPROB_CHUNK: int = param(0, "tokens per chunk of the output head when computing log-probs; 0 = all at once "
                               "(full-vocabulary logits; the gpu profile chunks so memory does not grow with "
                               "the vocabulary)", ge=0)
    ROLLOUT_BATCH: int = param(0, "trajectories per rollout micro-batch; 0 = the whole step at once", ge=0)
    SHARD_PROCESSES: int = param(0, "0: the update runs in the notebook's process; N >= 1: each update is a "
                                 "torchrun job of N processes (FSDP2, one per GPU) that the notebook drives", ge=0)
    FULL_LR: float = param(1e-4, "full-parameter learning rate (paper: 1e-6 on a 4B model)", gt=0)
    LORA_LR: float = param(1e-3, "LoRA learning rate (paper: 5e-6 on a 4B model)", gt=0)
    LORA_R: int = param(8, "LoRA rank (paper: 32)", ge=1)
    LORA_ALPHA: int = param(16, "LoRA alpha (paper: 64), twice the rank as in the paper", ge=1)
    KL_COEF: float = param(1e-3, "k3 KL coefficient (paper: 1e-3)", ge=0)
    TEMPERATURE: float = param(1.0, "sampling temperature of training rollouts (paper: 1.0)", gt=0)
    SWEEP_LRS_FULL: str = param("1e-5,1e-4,1e-3", "comma-separated full-parameter learning rates to sweep first "
                                "(a geometric grid centred on FULL_LR, the registered default ties go to; widened "
                                "while its best is at an edge; empty: no sweep, use FULL_LR)")
    SWEEP_LRS_LORA: str = param("1e-4,1e-3,1e-2", "comma-separated LoRA learning rates to sweep first (centred on "
                                "LORA_LR, widened as SWEEP_LRS_FULL; empty: use LORA_LR)")
    SWEEP_STEPS: int = param(8, "steps per sweep run: the budget it serves (05's BUDGET_MAX); the best "
                             "tuning-split accuracy after them picks the rate (the same steps as the ES sweeps of "
                             "02 / 03)", ge=1)
    SWEEP_VAL_PROBLEMS: int = param(256, "tuning-split problems each sweep run is scored on (disjoint from "
                                    "validation, tasks.TUNING_SPLIT)", ge=1)
    SWEEP_MAX_EXTEND: int = param(2, "rates a sweep may add beyond an edge of its grid (one grid step at a time, "
                                  "while the best is at the edge; the same limit as 02 / 03)", ge=0)
    N_VAL: int = param(512, "validation problems (paper: 750)", ge=1)
    GRPO_SEED: int = param(42, "GRPO seed (paper: 42)", ge=0)
    AMP: str = param("none", "autocast dtype of GRPO updates; with 'bfloat16' the model is trained in fp32 "
                             "(master weights) under bf16 autocast (gpu profile)", choices=("none", "bfloat16"))

    def check(self) -> None:
        if self.PROMPT_BATCH % self.MINI_BATCH:
            raise ConfigError(f"PROMPT_BATCH = {self.PROMPT_BATCH} is not divisible by MINI_BATCH = "
                              f"{self.MINI_BATCH}; choose a MINI_BATCH that divides it")
        for name in ("SWEEP_LRS_FULL", "SWEEP_LRS_LORA"):
            if sweep_grid(getattr(self, name), name):
                no_tuning_split(self.PROFILE, name, getattr(self, name), "''")

    def seeds(self, use_lora: bool) -> list[int]:
        """The GRPO seeds of the full (GRPO_SEEDS) or LoRA (LORA_SEEDS) reference runs."""
        return [self.GRPO_SEED + i for i in range(self.LORA_SEEDS if use_lora else self.GRPO_SEEDS)]

    def sweep(self, which: str) -> list[float]:
        """The learning-rate grid of the full or LoRA arm (empty: no sweep)."""
        return sweep_grid(self.SWEEP_LRS_FULL, "SWEEP_LRS_FULL") if which == "full" else sweep_grid(
            self.SWEEP_LRS_LORA, "SWEEP_LRS_LORA")

    def grpo_config(self, use_lora: bool, lr: float | None = None, steps: int | None = None,
                    patience: int | None = None, seed_index: int = 0) -> GRPOConfig:
        """The engine config; ``patience`` None: PATIENCE (0 for a run that must reach ``steps``, e.g. a
        method trained to a fixed budget); ``seed_index`` i: seed GRPO_SEED + i (prompt order, sampling)."""
        return GRPOConfig(
            group_size=self.GROUP_SIZE, prompt_batch_size=self.PROMPT_BATCH, mini_batch_size=self.MINI_BATCH,
            micro_batch_size=self.MICRO_BATCH, lr=lr if lr is not None else (self.LORA_LR if use_lora else self.FULL_LR),
            kl_coef=self.KL_COEF, temperature=self.TEMPERATURE, use_lora=use_lora, lora_r=self.LORA_R, lora_alpha=self.LORA_ALPHA,
            total_steps=steps or self.STEPS, val_every=self.VAL_EVERY, seed=self.GRPO_SEED + seed_index, amp_dtype=self.AMP,
            early_stop_patience=self.PATIENCE if patience is None else patience,
            logprob_chunk=self.LOGPROB_CHUNK, rollout_batch_size=self.ROLLOUT_BATCH)

    def sharding(self) -> ShardingConfig | None:
        """How updates are sharded (None: in the notebook's process); bf16 compute on GPUs, fp32 on CPU."""
        if not self.SHARD_PROCESSES:
            return None
        return ShardingConfig(processes=self.SHARD_PROCESSES,
                              param_dtype="bfloat16" if self.AMP == "bfloat16" else "float32")


# =========================================================================== 05, 06, 07: experiments
@dataclass(frozen=True)
class _ExperimentParams(ESSettings):
    """What every paper-A experiment notebook shares beyond the ES settings: the budget and the seeds."""

    VAL_EVERY: int = param(4, "validate every this many steps (paper: 8)", ge=1)
    BUDGET_STEPS: int = param(0, "the step budget; 0 means full GRPO's best validation step s* (the paper's "
                              "protocol; paper: 16)", ge=0)
    SEEDS: int = param(3, "seeds of ES and CoPES (paper: 1 run each)", ge=1)
    SUBSPACES: int = _es_param("subspaces", 4, "K of CoPES (paper: 4)")
    READ_UPSTREAM: bool = param(True, "take sigma / alpha / learning rates from notebooks 02-04's summaries "
                                "when they exist (else this notebook's values)")


@dataclass(frozen=True)
class _GRPOParams(_ExperimentParams):
    """Notebooks with GRPO arms. The GRPO configuration itself (batches, group, LoRA shape, KL,
    temperature, dtype policy, fallback learning rates) is notebook 04's, read from the profile by
    ``protocols.paper_a.grpo_arm``: one configuration, so 05 reuses the runs 04 cached."""

    BUDGET_MAX: int = param(8, "cap on the budget when it is s* (BUDGET_STEPS 0), stated in the notebook: the "
                            "cpu profile's 2-hour bound (README, Cost; paper: s* = 16); 0 = no cap", ge=0)
    ES_LONG_STEPS: int = param(16, "steps standard ES is continued to, for its best checkpoint and the "
                               "step it reaches CoPES (paper: 112; 48 to match)", ge=1)
    LONG_SEEDS: int = param(1, "ES seeds continued to ES_LONG_STEPS (their mean curve is used)", ge=1)
    TEST_PROBLEMS: int = param(128, "test problems for the test decoding (0 means the whole test split)", ge=0)
    TEST_SAMPLES: int = param(8, "samples per test problem, n of pass@k (paper: 32)", ge=1)
    TEST_TEMPERATURE: float = param(0.3, "test decoding temperature (paper: 0.3)", gt=0.0)
    TEST_TOP_P: float = param(1.0, "test decoding top-p (paper: 1.0)", gt=0.0, le=1.0)
    TEST_SAMPLES_AIME: int = param(256, "samples per AIME problem (paper: 256; gpu benchmarks only)", ge=1)

    def check(self) -> None:
        super().check()
        if self.LONG_SEEDS > self.SEEDS:
            raise ConfigError(f"LONG_SEEDS = {self.LONG_SEEDS} must be <= SEEDS = {self.SEEDS}")
        if self.BUDGET_STEPS and self.ES_LONG_STEPS < self.BUDGET_STEPS:
            raise ConfigError(f"ES_LONG_STEPS = {self.ES_LONG_STEPS} must be >= BUDGET_STEPS = "
                              f"{self.BUDGET_STEPS}: the long run continues the budget run")


@dataclass(frozen=True)
class FixedBudgetParams(_GRPOParams):
    """Parameters of 05_fixed_budget_math (defaults = the cpu profile). Full GRPO is notebook 04's run:
    its STEPS, configuration and learning rate."""

    NOTEBOOK = "05_fixed_budget_math"

    NOISE_RANK: int = _es_param("noise_rank", 0, "0: full-rank noise (paper); r >= 1: low-rank noise A B^T / "
                                "sqrt(r) on the weight matrices (EGGROLL; docs/lowrank_es.md)")
    COPES_SIGMA: float = param(5e-3, "CoPES's own sigma when notebook 03 has not tuned one", gt=0.0)
    COPES_ALPHA: float = param(2.5e-3, "CoPES's own alpha when notebook 03 has not tuned one", gt=0.0)
    SEEDS: int = param(5, "seeds of ES and the headline CoPES arm, paired (paper: 1 run each)", ge=1)
    CONTROL_SEEDS: int = param(2, "seeds of each CoPES control arm (the other protocols; at most SEEDS, the first "
                               "seeds of the same pairing)", ge=1)
    CONTROL_ARM: bool = param(True, "run the regime's control arm: ES and CoPES (CONTROL_SEEDS seeds, the same budget) "
                              "on the skill-gap base (WARM_PROTOCOL paper), strict and lenient accuracy split")
    HEADLINE: str = param("paper", "protocol of the headline keys: paper (CoPES at ES's sigma / alpha, as "
                          "published), tuned (CoPES at its own sweep's best) or step_matched (CoPES at ES's sigma "
                          "and alpha / sqrt(K))", choices=("paper", "tuned", "step_matched"))

    def check(self) -> None:
        super().check()
        if self.CONTROL_SEEDS > self.SEEDS:
            raise ConfigError(f"CONTROL_SEEDS = {self.CONTROL_SEEDS} must be <= SEEDS = {self.SEEDS}")


# 06's arms (Table 3 plus our two step-size controls) and those a claim (A4-A7) tests against k4
ABLATION_KEYS = ("k1", "k2", "k4", "k8", "indep_z", "es_2sigma", "es_sqrtk_alpha", "copes_matched_step")
CLAIM_ARMS = ("k1", "k4", "k8", "indep_z", "es_2sigma", "es_sqrtk_alpha")
# arms with SEEDS seeds: ES and CoPES (05's runs) and the norm-matched control (docs/regime.md R12)
FULL_SEED_ARMS = ("k1", "k4", "es_sqrtk_alpha")


@dataclass(frozen=True)
class AblationParams(_ExperimentParams):
    """Parameters of 06_copes_ablations (defaults = the cpu profile)."""

    NOTEBOOK = "06_copes_ablations"

    BUDGET_STEPS: int = param(0, "the step budget of every arm; 0 means notebook 05's: full GRPO's s* (notebook "
                              "04's run) capped at BUDGET_MAX, so k1 / k4 are 05's ES / CoPES runs (paper: 16)", ge=0)
    BUDGET_MAX: int = param(8, "cap on the budget when it is s* (BUDGET_STEPS 0): 05's (README, Cost)", ge=0)
    SEEDS: int = param(5, "seeds of k1 and k4 (notebook 05's ES and CoPES runs, reused from the cache; paper: 1 run "
                       "each) and of the norm-matched control es_sqrtk_alpha (as many as CoPES)", ge=1)
    ARM_SEEDS: int = param(3, "seeds of every other arm: the first seeds of the same pairing (cost; at most SEEDS)",
                           ge=1)
    ARMS: str = param(",".join(CLAIM_ARMS), "comma-separated arms to run, k4 included (all: "
                      + ",".join(ABLATION_KEYS) + "; the cpu default keeps the arms of claims A4-A7)")
    NORM_CURVE_SEEDS: int = param(3, "paired seeds of every point of the norm curve (docs/regime.md R12: ES at alpha "
                                  "x 1, sqrt(2), 2, 2 sqrt(2), 4 and CoPES K = 4 at alpha x 1/2 .. 2; the first seeds of "
                                  "the same pairing, runs shared with k1 / k4 / es_sqrtk_alpha reused; 0: off, claim "
                                  "A7-curve then reads not measured; at most SEEDS)", ge=0)

    def check(self) -> None:
        super().check()
        self.arms()
        if self.ARM_SEEDS > self.SEEDS:
            raise ConfigError(f"ARM_SEEDS = {self.ARM_SEEDS} must be <= SEEDS = {self.SEEDS}")
        if self.NORM_CURVE_SEEDS > self.SEEDS:
            raise ConfigError(f"NORM_CURVE_SEEDS = {self.NORM_CURVE_SEEDS} must be <= SEEDS = {self.SEEDS} (the curve "
                              "runs the first seeds of the same pairing as k1 / k4; 0 turns it off)")
        if self.POPULATION % 8 or self.POPULATION // 8 < 2:
            raise ConfigError(f"POPULATION = {self.POPULATION}: the K = 8 arm needs a multiple of 8 with at "
                              "least 2 members per subspace (paper: 40, N_k = 5)")

    def arm_seeds(self, arm: str) -> int:
        """Seeds of ``arm``: SEEDS for k1 and k4 (05's runs) and the norm-matched control es_sqrtk_alpha
        (``FULL_SEED_ARMS``: as many seeds as CoPES, docs/regime.md R12), ARM_SEEDS for the others."""
        return self.SEEDS if arm in FULL_SEED_ARMS else self.ARM_SEEDS

    def arms(self) -> list[str]:
        """The arms to run, in Table 3's order."""
        chosen = [a.strip() for a in self.ARMS.split(",") if a.strip()]
        unknown = sorted(set(chosen) - set(ABLATION_KEYS))
        if unknown or "k4" not in chosen:
            raise ConfigError(f"ARMS = {self.ARMS!r}: {'unknown ' + str(unknown) if unknown else 'k4 is missing'}; "
                              f"valid arms: {list(ABLATION_KEYS)}, k4 (the reference of every contrast) required")
        return [a for a in ABLATION_KEYS if a in chosen]


@dataclass(frozen=True)
class MultihopQAParams(_GRPOParams):
    """Parameters of 07_multihop_qa (defaults = the cpu profile)."""

    NOTEBOOK = "07_multihop_qa"

    SEEDS: int = param(4, "seeds of ES and CoPES, paired (paper: 1 run each; 4, not 5: the cpu profile's 2-hour "
                       "bound, README, Cost)", ge=1)
    BUDGET_STEPS: int = param(0, "the step budget; 0 means full GRPO's best step s* (the paper's protocol; "
                              "paper: 48)", ge=0)
    GRPO_STEPS: int = param(24, "cap on full GRPO steps on QA (notebook 04's PATIENCE stops it at its peak; "
                            "paper: 48); the rest of the GRPO configuration is notebook 04's", ge=1)
    ES_LONG_STEPS: int = param(12, "steps standard ES is continued to, to reach CoPES's F1 (paper: 64)", ge=1)
    TEST_PROBLEMS: int = param(128, "QA test problems (0 means the whole test split)", ge=0)
    TEST_SAMPLES: int = param(2, "samples per test problem (paper: 32)", ge=1)
    READ_UPSTREAM: bool = param(False, "take sigma / alpha / learning rates from notebooks 02-04 (tuned on "
                                "math, not QA)")
    COPES_SIGMA: float = param(1e-2, "CoPES sigma on QA (the paper's protocol: ES's sigma)", gt=0.0)
    COPES_ALPHA: float = param(5e-3, "CoPES alpha on QA (the paper's protocol: ES's alpha)", gt=0.0)

    TASK_KIND = "qa"

    def check(self) -> None:
        super().check()
        longest = min(self.GRPO_STEPS, self.BUDGET_MAX or self.GRPO_STEPS)
        if self.BUDGET_STEPS == 0 and self.ES_LONG_STEPS < longest:
            raise ConfigError(f"ES_LONG_STEPS = {self.ES_LONG_STEPS} must be >= {longest} (GRPO_STEPS = "
                              f"{self.GRPO_STEPS} capped at BUDGET_MAX = {self.BUDGET_MAX}) when the budget is s* "
                              "(BUDGET_STEPS = 0)")


# =========================================================================== 08: memory and GPU-hours
@dataclass(frozen=True)
class BudgetNotebookParams(NotebookParams):
    """Parameters of 08_memory_and_gpu_hours (defaults = the cpu profile)."""

    NOTEBOOK = "08_memory_and_gpu_hours"

    DEVICE: str = param("cpu", "device for the measurements: cpu or cuda")
    MEASURE_LAYERS: int = param(4, "substrate decoder layers for the measurements", gt=0)
    MEASURE_HIDDEN: int = param(256, "substrate hidden size", gt=0)
    MEASURE_HEADS: int = param(4, "substrate query heads", gt=0)
    MEASURE_KV_HEADS: int = param(2, "substrate KV heads (must divide MEASURE_HEADS)", gt=0)
    MEASURE_HEAD_DIM: int = param(64, "substrate head dimension", gt=0)
    MEASURE_INTERMEDIATE: int = param(768, "substrate MLP intermediate size", gt=0)
    MEASURE_VOCAB: int = param(4096, "substrate vocabulary size", gt=0)
    CONTEXTS: str = param("256,512,1024,2048", "comma-separated context lengths (tokens) to measure, >= 4")
    SEQUENCES: int = param(2, "sequences per measured step (batch)", gt=0)
    LORA_RANK: int = param(8, "LoRA rank of the measured LoRA-GRPO step", gt=0)
    ACCOUNT_ENGINE: str = param("agent", "step-cost split with the warm-started agent and its real tools "
                                "(agent: warm_start + rollout) or a random model with plain generate (plain)",
                                choices=("agent", "plain"))
    ACCOUNT_POPULATION: int = param(10, "ES population N of the measured ES step (paper: 40)", gt=1)
    ACCOUNT_PROMPTS: int = param(4, "prompt batch of the measured steps (paper: 64)", gt=0)
    ACCOUNT_GROUP: int = param(2, "GRPO group size of the measured step (paper: 8)", gt=1)
    ACCOUNT_PROMPT_LEN: int = param(64, "plain engine: prompt tokens of the measured steps", gt=0)
    ACCOUNT_NEW_TOKENS: int = param(32, "plain engine: generated tokens per trajectory", gt=0)

    def check(self) -> None:
        contexts = self.context_lengths
        if len(contexts) < 4 or any(c <= 8 for c in contexts) or len(set(contexts)) != len(contexts):
            raise ConfigError(f"CONTEXTS = {self.CONTEXTS!r} must list >= 4 distinct lengths > 8 tokens, "
                              "e.g. '256,512,1024,2048'")
        if self.MEASURE_HEADS % self.MEASURE_KV_HEADS:
            raise ConfigError(f"MEASURE_KV_HEADS = {self.MEASURE_KV_HEADS} must divide "
                              f"MEASURE_HEADS = {self.MEASURE_HEADS}")
        if not (self.DEVICE == "cpu" or self.DEVICE.startswith("cuda")):
            raise ConfigError(f"DEVICE = {self.DEVICE!r} is not valid; valid values: 'cpu', 'cuda', 'cuda:N'")

    @property
    def context_lengths(self) -> list[int]:
        try:
            return [int(c) for c in self.CONTEXTS.split(",") if c.strip()]
        except ValueError as exc:
            raise ConfigError(f"CONTEXTS = {self.CONTEXTS!r} must be comma-separated integers") from exc

    @property
    def sizes(self) -> SubstrateSizes:
        return SubstrateSizes(layers=self.MEASURE_LAYERS, hidden=self.MEASURE_HIDDEN, heads=self.MEASURE_HEADS,
                              kv_heads=self.MEASURE_KV_HEADS, head_dim=self.MEASURE_HEAD_DIM,
                              intermediate=self.MEASURE_INTERMEDIATE, vocab=self.MEASURE_VOCAB)
