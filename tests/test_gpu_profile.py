"""The gpu profile, end to end on CPU: every gpu-profile notebook (01-08, 99) runs through the runner on
tiny random checkpoints of the real architectures and small files in the real data formats.

What a researcher with GPUs runs is ``make reproduce PROFILE=gpu`` after pointing ``profiles/gpu.yaml``
at a checkpoint and the datasets. Here the same file is used with only its paths and sizes changed: the
repository (library, notebooks, profiles) is copied into a temporary folder, so the run's results,
caches, figures and reports land there and never in this checkout's ``results/gpu``; the copy's
``profiles/gpu.yaml`` gets 01's data and model paths and tiny sizes, every other key as committed.

The checkpoint is created here with ``save_pretrained`` (nothing is downloaded): a randomly initialised
Qwen3.5 (hybrid attention: Gated-DeltaNet linear attention with every 4th layer full attention, as
Qwen3.5-4B) for the whole suite and a Qwen3 for notebook 01, each with a byte-level BPE tokenizer
trained on the data files and a chat template with Qwen3's ``enable_thinking`` switch. The data files
have the released datasets' fields: hendrycks MATH (problem, level, type, solution), MATH-500
(problem, answer, subject, level, unique_id), HotpotQA (_id, question, answer, type, level), 2Wiki,
MuSiQue (id, question, answer, answer_aliases, answerable) and a Search-R1 corpus (id, contents).

On CPU the gpu profile runs in fp32 (``substrate.load_pretrained`` picks CUDA + bf16 only where CUDA
is), notebook 04's bf16 autocast and sharded updates run on CPU/gloo, and notebook 08 measures on
``DEVICE: cpu``. A random model earns no reward: notebook 07's check that rewards vary is reported as
"not actionable on this base" (its code path still runs), which this test asserts it says.

The guard for every other profile x notebook pair (parameters validate; the gpu profile's missing
tuning split is never read when no sweep is asked for) is in the first tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from copes_lib.config import REPO_ROOT, ConfigError

GPU_NOTEBOOKS = ("01", "02", "03", "04", "05", "06", "07", "08", "99")

# --------------------------------------------------------------------------- data files in the real formats
SUBJECTS = ("Algebra", "Geometry", "Number Theory", "Precalculus", "Prealgebra", "Counting & Probability")


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def hendrycks_math(n: int, offset: int = 0) -> list[dict]:
    """MATH train / test as released: {problem, level, type, solution}, no id."""
    return [{"problem": f"Compute ${i} + {i + 3}$.", "level": f"Level {1 + i % 5}", "type": SUBJECTS[i % len(SUBJECTS)],
             "solution": f"We add: ${i} + {i + 3} = \\boxed{{{2 * i + 3}}}$."} for i in range(offset, offset + n)]


def math500(n: int) -> list[dict]:
    return [{"problem": f"What is ${i} \\cdot 3$?", "answer": str(3 * i), "subject": SUBJECTS[i % len(SUBJECTS)],
             "level": 1 + i % 5, "unique_id": f"test/{SUBJECTS[i % len(SUBJECTS)].lower()}/{i}.json",
             "solution": f"${i} \\cdot 3 = {3 * i}$"} for i in range(n)]


def hotpotqa(n: int, offset: int = 0) -> list[dict]:
    return [{"_id": f"5a8b{i:04d}", "question": f"Who founded the company Vinqua {i}?", "answer": f"Person {i}",
             "type": "bridge" if i % 2 else "comparison", "level": ("easy", "medium", "hard")[i % 3],
             "supporting_facts": [[f"Vinqua {i}", 0]], "context": [[f"Vinqua {i}", [f"Vinqua {i} was founded by Person {i}."]]]}
            for i in range(offset, offset + n)]


def twowiki(n: int) -> list[dict]:
    return [{"_id": f"2w{i:04d}", "question": f"Where was the founder of Vinqua {i} born?", "answer": "Paris",
             "type": "compositional", "evidences": [], "supporting_facts": [], "context": []} for i in range(n)]


def musique(n: int) -> list[dict]:
    return [{"id": f"2hop__{i}", "question": f"When was Vinqua {i} founded?", "answer": str(1800 + i),
             "answer_aliases": [f"in {1800 + i}"], "answerable": True, "paragraphs": [],
             "question_decomposition": []} for i in range(n)]


def search_r1_corpus(n: int) -> list[dict]:
    """Search-R1's wiki corpus rows: {id, contents} with contents = '"title"\\ntext'."""
    return [{"id": str(i), "contents": f'"Vinqua {i}"\nVinqua {i} was founded by Person {i} in {1800 + i} in Paris.'}
            for i in range(n)]


def write_data(folder: Path) -> dict[str, str]:
    """The data files, and notebook 01's parameters that point at them."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"math_train": _write_jsonl(folder / "math_train.jsonl", hendrycks_math(48)),
             "math500": _write_jsonl(folder / "math500.jsonl", math500(6)),
             "math_test": _write_jsonl(folder / "math_test.jsonl", hendrycks_math(6, offset=100)),
             "qa_train": _write_jsonl(folder / "hotpotqa_train.jsonl", hotpotqa(48)),
             "hotpotqa": _write_jsonl(folder / "hotpotqa_dev.jsonl", hotpotqa(6, offset=100)),
             "2wiki": _write_jsonl(folder / "2wiki_dev.jsonl", twowiki(6)),
             "musique": _write_jsonl(folder / "musique_dev.jsonl", musique(6)),
             "corpus": _write_jsonl(folder / "wiki_corpus.jsonl", search_r1_corpus(64))}
    return {"MATH_TRAIN_JSONL": str(files["math_train"]),
            "MATH_TEST_FILES": f"math500={files['math500']},math_test={files['math_test']}",
            "QA_TRAIN_JSONL": str(files["qa_train"]),
            "QA_TEST_FILES": f"hotpotqa={files['hotpotqa']},2wiki={files['2wiki']},musique={files['musique']}",
            "SEARCH_CORPUS_JSONL": str(files["corpus"])}


# --------------------------------------------------------------------------- tiny checkpoints of the real architectures
#: Qwen3's chat template, reduced to what the agent prompt uses: messages and the enable_thinking switch.
CHAT_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}")


def write_tokenizer(folder: Path, texts: list[str]):
    from copes_lib.substrate import train_agent_tokenizer

    tokenizer = train_agent_tokenizer(texts, 512)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_checkpoint(folder: Path, architecture: str, texts: list[str]) -> Path:
    """A randomly initialised ``qwen3`` or ``qwen3_5`` (hybrid) causal LM and its tokenizer, saved."""
    import torch

    from copes_lib.engines import build_qwen35

    tokenizer = write_tokenizer(folder, texts)
    special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                   bos_token_id=tokenizer.bos_token_id)
    if architecture == "qwen3_5":
        model = build_qwen35("tiny", len(tokenizer), seed=0, tokenizer=tokenizer)
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=16, max_position_embeddings=4096, **special))
    model.save_pretrained(folder)
    return folder


def tokenizer_corpus(data: dict[str, str]) -> list[str]:
    from copes_lib.tasks.loaders import read_jsonl

    texts = []
    for path in Path(data["MATH_TRAIN_JSONL"]).parent.glob("*.jsonl"):
        texts += [json.dumps(row) for row in read_jsonl(path)]
    texts += ["<python>print(1 + 2)</python> <search>Vinqua 3</search> <answer>\\boxed{3}</answer> <think></think>"]
    return texts


# --------------------------------------------------------------------------- the suite in a copy of the repository
#: what the copy needs: the library, the notebooks, the profiles, committed data (splits, model descriptions)
#: and docs (notebooks and reports cite them)
COPIED = ("copes_lib", "notebooks", "profiles", "data", "docs", "pyproject.toml")

#: Only sizes change (and 08's device: this machine has no CUDA); every other key is the committed file's.
TINY_SIZES: dict[str, dict[str, object]] = {
    "01_substrate_and_agent": dict(VAL_HOLDOUT=8, MAX_CONTEXT=2048, MAX_NEW_TOKENS=8, EVAL_BATCH=8, BENCH_BATCH=4,
                                   N_TRAJECTORIES=2),
    "02_standard_es": dict(STEPS=1, POPULATION=2, BATCH_SIZE=2, VAL_EVERY=1, CHUNK_SIZE=4096),
    "03_copes": dict(STEPS=1, POPULATION=4, SUBSPACES=2, BATCH_SIZE=2, VAL_EVERY=1, CHUNK_SIZE=4096),
    "04_grpo": dict(STEPS=1, VAL_EVERY=1, PROMPT_BATCH=2, GROUP_SIZE=2, MINI_BATCH=2, MICRO_BATCH=1, LOGPROB_CHUNK=16,
                    ROLLOUT_BATCH=4, SHARD_PROCESSES=2, LORA_R=2, LORA_ALPHA=4, N_VAL=8, GRPO_SEEDS=1, LORA_SEEDS=1),
    "05_fixed_budget_math": dict(POPULATION=8, BATCH_SIZE=2, VAL_EVERY=1, CHUNK_SIZE=4096, TEST_PROBLEMS=4,
                                 TEST_SAMPLES=2, SEEDS=1, ES_LONG_STEPS=2),
    "06_copes_ablations": dict(POPULATION=16, BATCH_SIZE=2, VAL_EVERY=1, CHUNK_SIZE=4096, BUDGET_STEPS=1),
    "07_multihop_qa": dict(POPULATION=8, BATCH_SIZE=2, VAL_EVERY=1, CHUNK_SIZE=4096, TEST_PROBLEMS=4, TEST_SAMPLES=2,
                           BUDGET_STEPS=1, GRPO_STEPS=1, ES_LONG_STEPS=2),
    "08_memory_and_gpu_hours": dict(DEVICE="cpu", MEASURE_LAYERS=2, MEASURE_HIDDEN=32, MEASURE_HEADS=2,
                                    MEASURE_KV_HEADS=1, MEASURE_HEAD_DIM=16, MEASURE_INTERMEDIATE=64,
                                    MEASURE_VOCAB=256, CONTEXTS="16,24,32,48", SEQUENCES=1, LORA_RANK=2,
                                    ACCOUNT_POPULATION=2, ACCOUNT_PROMPTS=2, ACCOUNT_GROUP=2,
                                    ACCOUNT_PROMPT_LEN=16, ACCOUNT_NEW_TOKENS=4),
}


def copy_repo(dest: Path) -> Path:
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def edit_gpu_profile(repo: Path, values: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    """Set ``values`` ({notebook: {KEY: value}}) in the copy's profiles/gpu.yaml, as a user edits it; the
    notebooks' sections and every other key stay as committed. Returns the edited profile."""
    path = repo / "profiles" / "gpu.yaml"
    profile = yaml.safe_load(path.read_text())
    for notebook, section in values.items():
        assert notebook in profile, f"profiles/gpu.yaml has no section {notebook}"
        profile[notebook] = {**(profile[notebook] or {}), **section}
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return profile


def run_suite(repo: Path, only: str) -> subprocess.CompletedProcess:
    # the copy's own results/, reports/ and cache/ (this test's root), not the session's that tests/conftest.py
    # points COPES_OUTPUT_ROOT at: the two tests below would share cache/gpu there
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COPES_OUTPUT_ROOT": str(repo),
           "COPES_CACHE_ROOT": str(repo / "cache")}
    return subprocess.run([sys.executable, "-m", "copes_lib.cli", "run", "--profile", "gpu", "--only", only],
                          cwd=repo, env=env, capture_output=True, text=True)


def suite_status(repo: Path) -> dict[str, dict]:
    path = repo / "reports" / "gpu" / "status.json"
    return json.loads(path.read_text()).get("notebooks", {}) if path.exists() else {}


# --------------------------------------------------------------------------- every profile x notebook: the guard
@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu"])
def test_every_notebook_validates_under_every_profile(profile):
    from copes_lib.protocols import notebooks

    assert notebooks.profile_problems(profile) == {}


def _gpu_params(notebook: str, **values):
    from copes_lib.config import build, yaml_params
    from copes_lib.protocols.notebooks import params_class

    cls = params_class(notebook)
    return build(cls, {**yaml_params("gpu", cls), "PROFILE": "gpu", **values}, source="test")


def test_the_gpu_profile_asks_for_no_tuning_split():
    """The gpu profile has no tuning split: none of its notebooks' committed settings may need one."""
    assert not _gpu_params("01_substrate_and_agent").PREFLIGHT
    for notebook in ("02_standard_es", "03_copes"):
        params = _gpu_params(notebook)
        assert params.sweep_grid(params.SIGMA) == [], notebook
    grpo = _gpu_params("04_grpo")
    assert grpo.sweep("full") == [] and grpo.sweep("lora") == []


@pytest.mark.parametrize("notebook, name, value", [("01_substrate_and_agent", "PREFLIGHT", True),
                                                    ("02_standard_es", "SWEEP_SIGMAS", "centred"),
                                                    ("03_copes", "SWEEP_SIGMAS", "0.001,0.002"),
                                                    ("04_grpo", "SWEEP_LRS_LORA", "1e-6,5e-6")])
def test_a_setting_that_needs_the_tuning_split_fails_validation_on_gpu(notebook, name, value):
    with pytest.raises(ConfigError, match=rf"{name} = .* needs the tuning split, which the gpu profile does not have"):
        _gpu_params(notebook, **{name: value})


def test_sigma_sweep_without_a_grid_reads_no_tuning_split(monkeypatch):
    """02 / 03 on the gpu profile: no sweep asked for, so the (absent) tuning split is never loaded. Before
    the fix sigma_sweep loaded it first and every gpu run of 02 and 03 failed here."""
    from copes_lib import tasks
    from copes_lib.protocols.paper_a import es_arm

    def no_tuning_split(profile, kind, split):
        raise AssertionError(f"load_tasks({profile!r}, {kind!r}, {split!r}) was called")

    monkeypatch.setattr(tasks, "load_tasks", no_tuning_split)
    agent = SimpleNamespace(key={"profile": "gpu", "kind": "math"})
    for notebook, subspaces in (("02_standard_es", 1), ("03_copes", 4)):
        grid = es_arm.sigma_sweep(_gpu_params(notebook), agent, subspaces)
        assert grid.values == [] and es_arm.sweep_rows(grid) == []


# --------------------------------------------------------------------------- the suite, end to end
def _prepared_suite(root: Path, architecture: str) -> Path:
    repo = copy_repo(root / "repo")
    data = write_data(root / "data")
    model = write_checkpoint(root / architecture, architecture, tokenizer_corpus(data))
    edit_gpu_profile(repo, {**TINY_SIZES, "01_substrate_and_agent": {
        **TINY_SIZES["01_substrate_and_agent"], **data, "MODEL_PATH": str(model)}})
    return repo


def _check_ran(repo: Path, proc: subprocess.CompletedProcess, stems: list[str]) -> None:
    records = suite_status(repo)
    failures = {stem: (records.get(stem, {}).get("status"), records.get(stem, {}).get("error")) for stem in stems
                if records.get(stem, {}).get("status") != "ok"}
    assert proc.returncode == 0 and not failures, (
        f"failed notebooks: {json.dumps(failures, indent=1)}\n{(proc.stdout + proc.stderr)[-3000:]}\n"
        f"(logs: {repo / 'reports' / 'gpu' / 'logs'})")
    for stem in stems:
        summary = json.loads((repo / "results" / "gpu" / stem / "summary.json").read_text())
        assert summary["profile"] == "gpu" and summary["notebook"] == stem


@pytest.mark.slow(cost=250)
def test_gpu_profile_runs_end_to_end_on_a_tiny_hybrid_checkpoint(tmp_path):
    """01-08 and 99 under the gpu profile on a random Qwen3.5 (hybrid attention), through the runner."""
    repo = _prepared_suite(tmp_path, "qwen3_5")
    proc = run_suite(repo, ",".join(GPU_NOTEBOOKS))
    stems = sorted(p.stem for p in (repo / "notebooks").glob("*.ipynb") if p.stem[:2] in GPU_NOTEBOOKS)
    assert len(stems) == len(GPU_NOTEBOOKS)
    _check_ran(repo, proc, stems)
    # 04 trained both arms through sharded FSDP2 jobs (LoRA under bf16: the crash this test guards)
    assert list((repo / "cache" / "gpu").rglob("torchrun.log")), "04 ran no sharded GRPO job"
    # 07 says when the random base cannot act, instead of failing its check or hiding it
    executed = json.loads((repo / "reports" / "gpu" / "07_multihop_qa.ipynb").read_text())
    printed = "".join("".join(out.get("text", "")) for cell in executed["cells"] for out in cell.get("outputs", []))
    assert "not actionable on this base" in printed


@pytest.mark.slow(cost=20)
def test_gpu_profile_notebook_01_on_a_tiny_qwen3_checkpoint(tmp_path):
    """The other architecture the gpu profile takes: a random Qwen3 (full attention in every layer)."""
    repo = _prepared_suite(tmp_path, "qwen3")
    _check_ran(repo, run_suite(repo, "01"), ["01_substrate_and_agent"])
