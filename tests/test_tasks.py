"""Generated tasks: splits (explicit, disjoint, saved), gold traces that match the real tools,
difficulty levels, and loaders of the real datasets' JSONL formats."""

import json

import pytest

from copes_lib.config import REPO_ROOT, ConfigError
from copes_lib.tasks import (
    SEARCH_K,
    SPLITS,
    TUNING_SPLIT,
    check_tuning_disjoint,
    describe_split_file,
    load_passages,
    load_tasks,
    split_trace,
)
from copes_lib.tasks.loaders import load_corpus_jsonl, load_jsonl_tasks, stratified_holdout
from copes_lib.tasks.protocol import last_call, python_observation
from copes_lib.tasks.rewards import math_equal


@pytest.mark.parametrize("kind", ["math", "qa"])
def test_splits_are_explicit_disjoint_and_saved(kind):
    tasks = {s: load_tasks("smoke", kind, s) for s in SPLITS}
    record = describe_split_file("smoke", kind)
    for s in SPLITS:
        assert record["ids"][s] == [t.id for t in tasks[s]]
        assert len(set(record["ids"][s])) == len(tasks[s]) > 0
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not set(record["ids"][a]) & set(record["ids"][b])
                assert not {t.question for t in tasks[a]} & {t.question for t in tasks[b]}
    assert load_tasks("smoke", kind, "val") == tasks["val"]  # deterministic


@pytest.mark.parametrize("kind", ["math", "qa"])
def test_tuning_split_is_explicit_and_disjoint_from_train_val_and_test(kind):
    tuning = load_tasks("smoke", kind, TUNING_SPLIT)
    saved = json.loads(open(REPO_ROOT / "data" / "splits" / f"smoke_{kind}_{TUNING_SPLIT}.json").read())
    assert saved["ids"] == [t.id for t in tuning] and len(set(saved["ids"])) == len(tuning) > 0
    for split in SPLITS:
        other = load_tasks("smoke", kind, split)
        assert not {t.id for t in tuning} & {t.id for t in other}
        assert not {t.question for t in tuning} & {t.question for t in other}


def test_overlapping_tuning_split_is_a_clear_error():
    val = load_tasks("smoke", "math", "val")
    tuning = load_tasks("smoke", "math", TUNING_SPLIT)[:4] + val[:1]
    with pytest.raises(ConfigError, match="SWEEP_SPLIT overlaps the val split"):
        check_tuning_disjoint(tuning, {"train": [], "val": val}, "SWEEP_SPLIT")
    check_tuning_disjoint(tuning[:4], {"val": val}, "SWEEP_SPLIT")  # disjoint: no error


def test_cpu_validation_is_large_enough():
    # the ES comparison needs >= 512 validation problems (FINDINGS: 2.2 points standard error)
    assert len(json.loads(open(REPO_ROOT / "data" / "splits" / "cpu_math.json").read())["ids"]["val"]) >= 512


def test_math_difficulties_and_tools():
    val = load_tasks("smoke", "math", "val")
    assert {t.difficulty for t in val} == {1, 2, 3, 4}
    for t in val:
        assert ("<search>" in t.reference) == (t.difficulty >= 3)
        assert "<python>" in t.reference and t.reference.endswith(f"<answer>\\boxed{{{t.answers[0]}}}</answer>")


def test_eval_facts_are_not_training_targets():
    """Validation problems need facts from a world disjoint from training: no training question and
    no model-written part of a training trace names them, so they must be searched. (BM25 can show an
    eval passage as a low-ranked distractor inside a training observation; observations carry no loss.)"""
    def targets(tasks):
        return " ".join(t.question + "".join(s for s, by_model in split_trace(t.reference) if by_model)
                        for t in tasks)

    train_math = targets(load_tasks("smoke", "math", "train"))
    for t in load_tasks("smoke", "math", "val"):
        if t.difficulty >= 3:
            item = last_call(t.reference.split("</search>")[0] + "</search>", "search")
            assert item not in train_math
    train_qa = targets(load_tasks("smoke", "qa", "train"))
    for t in load_tasks("smoke", "qa", "val")[:20]:
        entity = last_call(t.reference.split("</search>")[0] + "</search>", "search")
        assert entity not in train_qa and t.answers[0] not in train_qa or t.answers[0] in _countries()


def _countries():
    from copes_lib.tasks import DATA_SEED, GENERATED_SIZES
    from copes_lib.tasks.qa_tasks import make_knowledge_base

    s = GENERATED_SIZES["smoke"]["qa"]
    return make_knowledge_base(s["people"], s["cities"], s["companies"], DATA_SEED).countries + list(
        __import__("copes_lib.tasks.qa_tasks", fromlist=["OCCUPATIONS"]).OCCUPATIONS)


def test_gold_traces_match_the_real_tools():
    """A gold trace's observations are what the sandbox and retriever return, so the warm start
    trains on exactly what the rollout will show."""
    from copes_lib.tools import BM25Retriever, CodeSandboxConfig, Passage, PythonSandbox

    math_tasks = load_tasks("smoke", "math", "val")[:6]
    codes = [last_call(t.reference.split("</python>")[0] + "</python>", "python") for t in math_tasks]
    with PythonSandbox(CodeSandboxConfig(workers=1)) as sandbox:
        outputs = sandbox.run_many(codes)
    for task, result in zip(math_tasks, outputs):
        assert python_observation(result.observation()) in task.reference
        assert math_equal(result.output.strip(), task.answers[0])
    qa = load_tasks("smoke", "qa", "val")[:5]
    retriever = BM25Retriever([Passage(*p) for p in load_passages("smoke", "qa")])
    for task in qa:
        query = last_call(task.reference.split("</search>")[0] + "</search>", "search")
        passages = retriever.search([query], SEARCH_K["qa"])[0]
        assert passages[0].text in task.reference
        assert query in passages[0].text  # the gold first hop finds the entity's own passage


def test_qa_hops():
    val = load_tasks("smoke", "qa", "val")
    for t in val:
        assert t.reference.count("<search>") == t.difficulty in (2, 3)
        assert t.answers[0] not in t.question


def test_split_trace_marks_observations():
    t = load_tasks("smoke", "math", "val")[2]
    segments = split_trace(t.reference)
    assert "".join(s for s, _ in segments) == t.reference
    assert all(s.startswith(("<output>", "<result>")) for s, by_model in segments if not by_model)


def test_bad_arguments_name_the_valid_values():
    with pytest.raises(ConfigError, match="valid values"):
        load_tasks("smoke", "chess", "val")
    with pytest.raises(ConfigError, match="valid values"):
        load_tasks("smoke", "math", "dev")


def test_gpu_profile_without_paths_fails_clearly():
    from copes_lib.protocols.testbed.substrate_setup import use_profile_data

    use_profile_data("gpu")  # the committed gpu profile names no files
    with pytest.raises(ConfigError, match="MATH_TRAIN_JSONL"):
        load_tasks("gpu", "math", "val")


def test_loaders_on_hand_written_lines(tmp_path):
    math = tmp_path / "math.jsonl"
    math.write_text("\n".join(json.dumps(r) for r in [
        {"problem": "What is $1+1$?", "solution": "So $\\boxed{2}$.", "level": "Level 1", "type": "Algebra",
         "unique_id": "test/algebra/1.json"},
        {"problem": "Half?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 3", "type": "Prealgebra"},
        {"problem": "No answer here", "solution": "none", "level": "Level 2", "type": "Algebra"},
    ]) + "\n")
    tasks = load_jsonl_tasks(math, "math")
    assert [t.answers for t in tasks] == [("2",), ("\\frac{1}{2}",)]
    assert tasks[0].id == "test/algebra/1.json" and tasks[0].difficulty == 1 and tasks[1].difficulty == 3

    gsm = tmp_path / "gsm8k.jsonl"
    gsm.write_text(json.dumps({"question": "Ann has 2 and gets 1,000.", "answer": "2+1000=1002\n#### 1,002"}) + "\n")
    assert load_jsonl_tasks(gsm, "gsm8k")[0].answers == ("1002",)

    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps(r) for r in [
        {"_id": "5a8b", "question": "Who?", "answer": "Ada Lovelace", "level": "hard", "type": "bridge"},  # HotpotQA
        {"_id": "2w1", "question": "Where?", "answer": "Paris", "type": "compositional"},                  # 2Wiki
        {"id": "2hop__1", "question": "When?", "answer": "1815", "answer_aliases": ["in 1815"],
         "answerable": True},                                                                            # MuSiQue
        {"id": "2hop__2", "question": "Never?", "answer": "x", "answerable": False},
    ]) + "\n")
    tasks = load_jsonl_tasks(qa, "qa")
    assert [t.id for t in tasks] == ["5a8b", "2w1", "2hop__1"]
    assert tasks[0].difficulty == 3 and tasks[2].answers == ("1815", "in 1815")

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "contents": '"Paris"\nParis is a city.'}) + "\n"
                      + json.dumps({"id": "2", "title": "Ada", "text": "Ada wrote notes."}) + "\n")
    assert load_corpus_jsonl(corpus) == [("1", "Paris", "Paris is a city."), ("2", "Ada", "Ada wrote notes.")]

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_jsonl_tasks(bad, "qa")
    with pytest.raises(ValueError, match="valid values"):
        load_jsonl_tasks(qa, "hotpot")


def test_stratified_holdout_keeps_proportions():
    from copes_lib.tasks import Task

    tasks = [Task(str(i), "math", f"q{i}", ("1",), 1) for i in range(100)]
    strata = ["a"] * 80 + ["b"] * 20
    train, held = stratified_holdout(tasks, 10, strata, seed=0)
    assert len(held) == 10 and len(train) == 90
    assert sum(int(t.id) >= 80 for t in held) == 2
    assert not {t.id for t in train} & {t.id for t in held}


@pytest.mark.parametrize("profile", ["smoke", "cpu"])
@pytest.mark.parametrize("kind", ["math", "qa"])
def test_every_evaluation_split_has_many_small_units(profile, kind):
    """docs/preflight.md#p8-many-independent-units-registered-2026-12-03: every task carries its latent unit (the
    subject name, in the question), every evaluation split meets the floors, and train and held-out problems
    share the pool."""
    from copes_lib.tasks import TUNING_SPLIT, UNIT_SPECS, load_tasks, unit_report

    spec = UNIT_SPECS[profile]
    report = unit_report(profile, kind)
    for split in ("val", "test", TUNING_SPLIT):
        assert report[split]["units"] >= spec.min_units and report[split]["max_share"] <= spec.max_unit_share
    train_units = {t.unit_id for t in load_tasks(profile, kind, "train")}
    for task in load_tasks(profile, kind, "val"):
        assert task.unit_id in train_units and task.question.startswith(task.unit_id + " ")
    if profile == "cpu":  # the registered figures (P8.1)
        assert report["val"]["units"] == report["test"]["units"] == report[TUNING_SPLIT]["units"] == 128


def test_a_prior_spec_below_the_floor_is_a_clear_error():
    from copes_lib.tasks.protocol import Task
    from copes_lib.tasks.units import UnitSpec, check_units

    with pytest.raises(ConfigError, match="units = 24 is below the floor min_units = 100"):
        UnitSpec(units=24)
    with pytest.raises(ConfigError, match="max_unit_share"):
        UnitSpec(max_unit_share=0.0)
    few = [Task(str(i), "math", "q", ("1",), 1, unit_id="ABC"[i % 3]) for i in range(300)]
    with pytest.raises(ConfigError, match="3 distinct units, below min_units = 100"):
        check_units(few, UnitSpec(), "val")
    lopsided = [Task(str(i), "math", "q", ("1",), 1, unit_id="big" if i < 20 else f"u{i}") for i in range(400)]
    with pytest.raises(ConfigError, match="above max_unit_share = 0.02"):
        check_units(lopsided, UnitSpec(), "val")


def test_a_real_problem_is_its_own_unit():
    from copes_lib.tasks.protocol import Task

    assert Task("gsm8k-7", "math", "q", ("1",), 1).unit_id == "gsm8k-7"
