"""The gpu profile's real data: every format of Tables 1 and 4 (small files written here in the real
formats), named benchmarks, clear errors for wrong-format input, the subject-stratified hold-out."""

import json
from collections import Counter

import pytest

from copes_lib import config, tasks
from copes_lib.config import ConfigError
from copes_lib.protocols.testbed.substrate_setup import use_profile_data
from copes_lib.tasks.loaders import (
    BENCHMARKS,
    DataFormatError,
    load_corpus_jsonl,
    parse_test_files,
    read_tasks,
)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SUBJECTS = ("Algebra", "Geometry", "Number Theory", "Precalculus")


def hendrycks_rows(n):
    """MATH train/test as released: {problem, level, type, solution}, no id."""
    return [{"problem": f"Compute ${i}+{i}$.", "level": f"Level {1 + i % 5}", "type": SUBJECTS[i % 4 if i % 2 else 0],
             "solution": f"We add: ${i}+{i}=\\boxed{{{2 * i}}}$."} for i in range(n)]


def math500_rows(n):
    return [{"problem": f"What is ${i}\\cdot 3$?", "answer": str(3 * i), "subject": "Prealgebra", "level": 2,
             "unique_id": f"test/prealgebra/{i}.json", "solution": "..."} for i in range(n)]


def aime_rows(n, capital=False):
    p, a = ("Problem", "Answer") if capital else ("problem", "answer")
    return [{"id": f"2024-I-{i}", p: f"Find the number {i}.", a: str(100 + i)} for i in range(n)]


def gsm8k_rows(n):
    return [{"question": f"Ann has {i} apples and buys 1,000 more. How many?",
             "answer": f"{i}+1000={i + 1000}\n#### {i + 1000:,}"} for i in range(n)]


def hotpot_rows(n):
    return [{"_id": f"5a8b{i}", "question": f"Who founded company {i}?", "answer": f"Person {i}", "type": "bridge",
             "level": "hard", "supporting_facts": [["Company", 0]], "context": [["Company", ["It exists."]]]}
            for i in range(n)]


def twowiki_rows(n):
    return [{"_id": f"2w{i}", "question": f"Where was {i} born?", "answer": "Paris", "type": "compositional",
             "evidences": [], "supporting_facts": [], "context": []} for i in range(n)]


def musique_rows(n):
    return [{"id": f"2hop__{i}", "question": f"When was {i}?", "answer": "1815", "answer_aliases": ["in 1815"],
             "answerable": i != 0, "paragraphs": [], "question_decomposition": []} for i in range(n)]


def test_every_format_loads(tmp_path):
    math, subjects = read_tasks(write_jsonl(tmp_path / "m.jsonl", hendrycks_rows(6)), "math")
    assert [t.answers[0] for t in math] == [str(2 * i) for i in range(6)]
    assert subjects[:2] == ["Algebra", "Geometry"] and math[3].difficulty == 4
    m500, subjects = read_tasks(write_jsonl(tmp_path / "m500.jsonl", math500_rows(3)), "math")
    assert m500[2].id == "test/prealgebra/2.json" and m500[2].answers == ("6",) and subjects == ["Prealgebra"] * 3
    for capital in (False, True):
        aime, _ = read_tasks(write_jsonl(tmp_path / "a.jsonl", aime_rows(2, capital)), "aime")
        assert [(t.id, t.answers) for t in aime] == [("2024-I-0", ("100",)), ("2024-I-1", ("101",))]
    gsm, _ = read_tasks(write_jsonl(tmp_path / "g.jsonl", gsm8k_rows(2)), "gsm8k")
    assert gsm[1].answers == ("1001",)
    hot, _ = read_tasks(write_jsonl(tmp_path / "h.jsonl", hotpot_rows(2)), "qa")
    assert hot[0].id == "5a8b0" and hot[0].difficulty == 3
    wiki, _ = read_tasks(write_jsonl(tmp_path / "w.jsonl", twowiki_rows(2)), "qa")
    assert wiki[1].answers == ("Paris",)
    mus, _ = read_tasks(write_jsonl(tmp_path / "mu.jsonl", musique_rows(3)), "qa")
    assert [t.id for t in mus] == ["2hop__1", "2hop__2"] and mus[0].answers == ("1815", "in 1815")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "0", "contents": '"Paris"\nParis is the capital of France.'}])
    assert load_corpus_jsonl(corpus) == [("0", "Paris", "Paris is the capital of France.")]


def test_ids_without_an_id_field_are_stable_and_unique(tmp_path):
    rows = hendrycks_rows(3) + hendrycks_rows(1)  # the same problem twice, as in real files
    first, _ = read_tasks(write_jsonl(tmp_path / "m.jsonl", rows), "math")
    again, _ = read_tasks(tmp_path / "m.jsonl", "math")
    assert [t.id for t in first] == [t.id for t in again] and len({t.id for t in first}) == 4


@pytest.mark.parametrize(("rows", "fmt", "missing", "looks"), [
    (gsm8k_rows(2), "math", "['problem']", "gsm8k"),
    (hotpot_rows(2), "math", "['problem']", "qa"),
    (twowiki_rows(2)[:1] + [{"question": "q"}], "math", "['problem']", "qa"),
    (hendrycks_rows(2), "qa", "['question', 'answer']", "math"),
    (math500_rows(2), "gsm8k", "['question']", "math"),
    (hotpot_rows(2), "gsm8k", "[\"an answer ending in '#### N'\"]", "qa"),
    (gsm8k_rows(2), "aime", "['problem | Problem']", "gsm8k"),
])
def test_wrong_format_names_file_line_expected_fields_and_the_likely_format(tmp_path, rows, fmt, missing, looks):
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    with pytest.raises(DataFormatError) as err:
        read_tasks(path, fmt)
    message = str(err.value)
    assert message.startswith(f"{path}:1: expected a ") and f"missing {missing}" in message, message
    assert "the row has fields [" in message and f"looks like {looks}" in message, message


def test_corpus_in_the_wrong_format_and_broken_lines(tmp_path):
    with pytest.raises(DataFormatError, match=r"c\.jsonl:1: expected a search-corpus row .* looks like qa"):
        load_corpus_jsonl(write_jsonl(tmp_path / "c.jsonl", hotpot_rows(1)))
    broken = tmp_path / "b.jsonl"
    broken.write_text(json.dumps(gsm8k_rows(1)[0]) + "\n\n{oops\n")
    with pytest.raises(DataFormatError, match=r"b\.jsonl:3: not valid JSON"):
        read_tasks(broken, "gsm8k")
    with pytest.raises(DataFormatError, match="is a folder"):
        read_tasks(tmp_path, "math")


def test_parse_test_files():
    spec = " aime24=/d/a24.jsonl, gsm8k = /d/g.jsonl ,math500=/d/m.jsonl"
    assert parse_test_files(spec, "math") == {"aime24": "/d/a24.jsonl", "gsm8k": "/d/g.jsonl", "math500": "/d/m.jsonl"}
    assert parse_test_files("", "qa") == {}
    assert set(BENCHMARKS) == {"aime24", "aime25", "gsm8k", "math500", "math_test", "hotpotqa", "2wiki", "musique"}
    for bad, match in [("hotpotqa=/x", r"unknown math benchmark 'hotpotqa'; valid names: \['aime24'"),
                       ("aime24", "must be benchmark=path"), ("aime24=/a,aime24=/b", "given twice")]:
        with pytest.raises(ValueError, match=match):
            parse_test_files(bad, "math", "MATH_TEST_FILES")


def test_bad_test_files_spec_fails_at_validation():
    from copes_lib.protocols.params import SubstrateNotebookParams

    with pytest.raises(ConfigError, match=r"SubstrateNotebookParams.QA_TEST_FILES: unknown qa benchmark 'aime24'"):
        SubstrateNotebookParams(PROFILE="gpu", QA_TEST_FILES="aime24=/x.jsonl")


def test_subject_stratified_holdout_from_the_type_field(tmp_path):
    """Hendrycks files have no ids: the hold-out is still stratified by the `type` field."""
    rows = hendrycks_rows(200)  # Algebra 100, Geometry 50, Precalculus 50
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    split = tasks._gpu_train_val("math", str(path), 20)
    by_question = {r["problem"]: r["type"] for r in rows}
    held = Counter(by_question[t.question] for t in split["val"])
    assert held == Counter({"Algebra": 10, "Geometry": 5, "Precalculus": 5})
    assert len(split["train"]) == 180 and not {t.id for t in split["train"]} & {t.id for t in split["val"]}


def test_named_benchmarks_on_the_gpu_profile(tmp_path, monkeypatch):
    files = {"aime24": write_jsonl(tmp_path / "aime24.jsonl", aime_rows(3)),
             "gsm8k": write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(4)),
             "math500": write_jsonl(tmp_path / "math500.jsonl", math500_rows(2)),
             "hotpotqa": write_jsonl(tmp_path / "hotpot.jsonl", hotpot_rows(2)),
             "musique": write_jsonl(tmp_path / "musique.jsonl", musique_rows(3))}
    math_spec = ",".join(f"{b}={files[b]}" for b in ("aime24", "gsm8k", "math500"))
    qa_spec = f"hotpotqa={files['hotpotqa']},musique={files['musique']}"
    monkeypatch.setenv(config.EXPLICIT_ENV, json.dumps({"profile": "gpu", "notebook": "01_substrate_and_agent",
                                                        "values": {"MATH_TEST_FILES": math_spec,
                                                                   "QA_TEST_FILES": qa_spec}}))
    use_profile_data("gpu")  # what loading notebook 01's parameters does
    math = tasks.load_benchmarks("gpu", "math")
    assert list(math) == ["aime24", "gsm8k", "math500"] and [len(v) for v in math.values()] == [3, 4, 2]
    assert math["aime24"][0].id == "aime24/2024-I-0"
    assert len(tasks.load_tasks("gpu", "math", "test")) == 9
    qa = tasks.load_benchmarks("gpu", "qa")
    assert {b: len(v) for b, v in qa.items()} == {"hotpotqa": 2, "musique": 2}


def test_wrong_format_benchmark_file_fails_with_its_path(tmp_path, monkeypatch):
    gsm = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(2))
    monkeypatch.setenv(config.EXPLICIT_ENV, json.dumps({"profile": "gpu", "notebook": "01_substrate_and_agent",
                                                        "values": {"MATH_TEST_FILES": f"math500={gsm}"}}))
    use_profile_data("gpu")  # what loading notebook 01's parameters does
    with pytest.raises(DataFormatError, match=r"gsm8k\.jsonl:1: expected a MATH .* looks like gsm8k"):
        tasks.load_benchmarks("gpu", "math")


def test_cpu_profile_has_one_benchmark_named_test():
    bench = tasks.load_benchmarks("smoke", "math")
    assert list(bench) == ["test"] and bench["test"] == tasks.load_tasks("smoke", "math", "test")


def test_model_folder_without_a_model_fails_clearly(tmp_path):
    from copes_lib.substrate import load_pretrained

    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"is not a Hugging Face checkpoint folder: expected config\.json, "
                                          r"weights .*found \['tokenizer\.json'\]"):
        load_pretrained(str(tmp_path))


# ---------------------------------------------------------------------------- issue 33: small error paths
def test_corpus_errors_name_the_file_and_the_line(tmp_path):
    from copes_lib.tasks.retrieval import CorpusFile

    array = tmp_path / "array.jsonl"
    array.write_text(json.dumps({"id": "a", "title": "T", "text": "x"}) + "\n\n" + json.dumps(["not", "a row"]) + "\n")
    with pytest.raises(DataFormatError, match=r"array\.jsonl:3: expected a JSON object, got list"):
        load_corpus_jsonl(array)
    corpus = CorpusFile(array, CorpusFile.line_offsets(array))  # the gpu profile's file-backed corpus
    assert corpus[0].id == "a"
    with pytest.raises(DataFormatError, match=r"array\.jsonl:3: expected a JSON object .*got list"):
        corpus[1]
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"id": "a", "text": "x"}] * 0 + [{"id": "b", "body": "x"}])
    with pytest.raises(DataFormatError, match=r"wrong\.jsonl:1: expected a search-corpus row"):  # the line, not 'passage 0'
        CorpusFile(wrong, CorpusFile.line_offsets(wrong))[0]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataFormatError, match=r"empty\.jsonl: the search corpus has no passages"):
        load_corpus_jsonl(empty)


def test_gpu_file_errors_name_the_parameter_and_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"MATH_TRAIN_JSONL: .*missing\.jsonl does not exist"):
        tasks._require(str(tmp_path / "missing.jsonl"), "MATH_TRAIN_JSONL")
    with pytest.raises(ConfigError, match=r"MATH_TEST_FILES: .*gone\.jsonl does not exist"):
        tasks._require(f"aime24={tmp_path / 'gone.jsonl'}", "MATH_TEST_FILES")
    with pytest.raises(ConfigError, match=r"EMBEDDING_MODEL_PATH: .* is not a folder"):
        tasks._require(str(write_jsonl(tmp_path / "f.jsonl", [])), "EMBEDDING_MODEL_PATH", "folder")
    assert tasks._require(str(tmp_path), "EMBEDDING_MODEL_PATH", "folder") == str(tmp_path)
    path = write_jsonl(tmp_path / "train.jsonl", hendrycks_rows(10))
    with pytest.raises(ConfigError, match=rf"VAL_HOLDOUT = 10: MATH_TRAIN_JSONL \({path}\) has 10 usable problems"):
        tasks._gpu_train_val("math", str(path), 10)
