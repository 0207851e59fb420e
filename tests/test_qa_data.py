"""The QA data variants (notebook 01's QA_DATA; docs/preflight.md P8.9 (b)): ``standard`` leaves every split
file, task and cache key as it was; ``large`` (twice the training problems from twice-as-large worlds) has its
own split files, ids, unit floors and cache keys; a wrong name is a one-line error naming the valid values."""

from __future__ import annotations

import hashlib
import json

import pytest

from copes_lib import config, runs, tasks
from copes_lib.config import ConfigError
from copes_lib.tasks import (
    GENERATED_SIZES,
    LARGE_QA_SIZES,
    SPLITS,
    TUNE_SIZES,
    TUNING_SPLIT,
    UNIT_SPECS,
    data_fingerprint,
    data_variant,
    describe_split_file,
    load_passages,
    load_tasks,
    use_qa_data,
)
from copes_lib.tasks.retrieval import shared_retriever
from copes_lib.tasks.units import describe_units

ALL_SPLITS = (*SPLITS, TUNING_SPLIT)


@pytest.fixture(autouse=True)
def fresh_variants(monkeypatch):
    """Each test sets variants on its own copy of the module's state (a later test sees the default)."""
    monkeypatch.setattr(tasks, "_qa_data", {})


def _digests(profile: str) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(tasks.SPLITS_DIR.glob(f"{profile}_*.json"))}


def _check_variant(profile: str) -> dict:
    """Sizes, disjointness, unit floors and the saved files of ``profile``'s large QA variant."""
    use_qa_data(profile, "large")
    sizes, split = LARGE_QA_SIZES[profile], {s: load_tasks(profile, "qa", s) for s in ALL_SPLITS}
    assert [len(split[s]) for s in ALL_SPLITS] == [sizes["train"], sizes["val"], sizes["test"], TUNE_SIZES[profile]["qa"]]
    assert sizes["train"] == 2 * GENERATED_SIZES[profile]["qa"]["train"]  # the variant's reason
    assert (sizes["val"], sizes["test"]) == (GENERATED_SIZES[profile]["qa"]["val"], GENERATED_SIZES[profile]["qa"]["test"])
    for a in ALL_SPLITS:
        assert all(t.id.startswith("qa-large-") for t in split[a])
        assert len({t.question for t in split[a]}) == len(split[a])  # distinct within a split
        for b in ALL_SPLITS:
            if a < b:
                assert not {t.id for t in split[a]} & {t.id for t in split[b]}
                assert not {t.question for t in split[a]} & {t.question for t in split[b]}
    spec = UNIT_SPECS[profile]
    for s in ("val", "test", TUNING_SPLIT):
        d = describe_units(split[s])
        assert d["units"] >= spec.min_units and d["max_share"] <= spec.max_unit_share, (s, d)
    record = json.loads((tasks.SPLITS_DIR / f"{profile}_qa-large.json").read_text())
    assert record["variant"] == "large" and record["ids"] == {s: [t.id for t in split[s]] for s in SPLITS}
    tuning = json.loads((tasks.SPLITS_DIR / f"{profile}_qa-large_{TUNING_SPLIT}.json").read_text())
    assert tuning["ids"] == [t.id for t in split[TUNING_SPLIT]]
    return split


def test_the_standard_data_are_the_default_and_unchanged():
    """QA_DATA's default is standard, whose split files loading (of either variant) leaves byte for byte, whose
    records and cache key carry no variant, and whose tasks match the committed fingerprints (a load checks them)."""
    from copes_lib.protocols.params import SubstrateNotebookParams

    assert SubstrateNotebookParams().QA_DATA == "standard" and data_variant("smoke", "qa") == "standard"
    before = _digests("smoke")
    standard = {s: load_tasks("smoke", "qa", s) for s in ALL_SPLITS}
    assert all(t.id.startswith("qa-") and not t.id.startswith("qa-large") for t in standard["train"])
    assert "variant" not in describe_split_file("smoke", "qa")
    key = data_fingerprint("smoke", "qa")
    assert "variant" not in key and key["sizes"] == GENERATED_SIZES["smoke"]["qa"]
    use_qa_data("smoke", "large")
    load_tasks("smoke", "qa", "train")
    use_qa_data("smoke", "standard")
    assert {s: load_tasks("smoke", "qa", s) for s in ALL_SPLITS} == standard
    assert _digests("smoke") == before  # no file rewritten (the large files were committed before this test)


def test_the_large_smoke_variant_has_its_sizes_disjoint_splits_and_unit_floors():
    split = _check_variant("smoke")
    use_qa_data("smoke", "standard")
    standard = load_tasks("smoke", "qa", "train")
    assert not {t.question for t in standard} >= {t.question for t in split["train"]}  # another world
    assert len(load_passages("smoke", "qa", "large")) > len(load_passages("smoke", "qa", "standard"))


@pytest.mark.slow(cost=30)
def test_the_large_cpu_variant_has_10000_training_problems_and_the_unit_floors():
    split = _check_variant("cpu")
    assert len(split["train"]) == 10000 and describe_units(split["train"])["units"] == 128


def test_cache_keys_and_the_search_index_differ_between_variants():
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.substrate import warm_start_folder

    config_ = substrate_config("smoke")  # sets the profile's variant: standard
    keys, math_keys, folders, retrievers, tuning_ids = {}, {}, {}, {}, {}
    for variant in ("standard", "large"):
        use_qa_data("smoke", variant)
        keys[variant] = runs.cache_key(data_fingerprint("smoke", "qa"))
        math_keys[variant] = runs.cache_key(data_fingerprint("smoke", "math"))
        folders[variant] = warm_start_folder("smoke", "qa", 0, config=config_)[0]
        retrievers[variant] = shared_retriever("smoke", "qa")
        tuning_ids[variant] = {t.id for t in load_tasks("smoke", "qa", TUNING_SPLIT)}  # preflight keys read them
    assert keys["standard"] != keys["large"] and folders["standard"] != folders["large"]
    assert len(retrievers["large"].passages) == len(load_passages("smoke", "qa", "large")) > len(
        retrievers["standard"].passages)
    assert not tuning_ids["standard"] & tuning_ids["large"]
    assert math_keys["standard"] == math_keys["large"]  # math has no variant: its bases stay where they were


def test_the_tokenizer_is_the_standard_datas_under_either_variant():
    """A math base's key does not name the QA data, so the tokenizer it was trained with must not change with it."""
    from copes_lib.substrate import tokenizer_texts

    standard = tokenizer_texts("smoke")
    use_qa_data("smoke", "large")
    assert tokenizer_texts("smoke") == standard
    texts = set(standard)  # and the large variant's own passages are not in them
    assert any(text not in texts for _, _, text in load_passages("smoke", "qa", "large"))


@pytest.mark.parametrize(("profile", "variant", "said"), [
    ("cpu", "huge", "QA_DATA = 'huge' is not valid; valid values: ['standard', 'large']"),
    ("gpu", "large", "QA_DATA = 'large' is not valid on the gpu profile (its QA data are QA_TRAIN_JSONL / "
                     "QA_TEST_FILES); valid values: ['standard']"),
])
def test_a_wrong_variant_is_a_one_line_error_naming_the_valid_values(profile, variant, said):
    with pytest.raises(ConfigError) as error:
        use_qa_data(profile, variant)
    assert str(error.value) == said

    with pytest.raises(ConfigError, match=r"data variant = 'large' is not valid for math; valid values: \['standard'\]"):
        load_tasks("smoke", "math", "val", "large")


def test_the_parameter_checks_its_value():
    from copes_lib.config import build
    from copes_lib.protocols.params import SubstrateNotebookParams

    with pytest.raises(ConfigError, match=r"QA_DATA = 'huge' is not valid; valid values: \['standard', 'large'\]"):
        build(SubstrateNotebookParams, {"QA_DATA": "huge"})
    with pytest.raises(ConfigError, match="QA_DATA = 'large' is not valid on the gpu profile"):
        build(SubstrateNotebookParams, {"PROFILE": "gpu", "QA_DATA": "large"})


def test_the_cpu_default_is_p8_10_plus_the_large_qa_data(monkeypatch):
    """P8.11, the default since its check passed (docs/preflight.md), is P8.10's design with QA on the large data;
    the P8.10 overlay differs from it only there."""
    from copes_lib.protocols.notebooks import load_profile
    from copes_lib.protocols.testbed.substrate_setup import substrate_params, use_profile_data

    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    default = load_profile("cpu")["01_substrate_and_agent"]
    p810 = config.recipe_overlay("cpu", "p8.10")["01_substrate_and_agent"]
    assert {**p810, "QA_DATA": "large"} == default
    assert substrate_params("cpu").QA_DATA == "large"
    use_profile_data("cpu")  # what every notebook and worker does: the tasks see the variant
    assert data_variant("cpu", "qa") == "large" and data_variant("cpu", "math") == "standard"
    monkeypatch.setenv(config.RECIPE_ENV, "p8.10")
    use_profile_data("cpu")
    assert data_variant("cpu", "qa") == "standard"
    monkeypatch.delenv(config.RECIPE_ENV)
    use_profile_data("cpu")
    assert data_variant("cpu", "qa") == "large"


def test_a_warm_start_worker_uses_the_callers_variant(monkeypatch, tmp_path):
    """build_warm_starts' worker reads the QA data variant from its spec file, so its cache key is the caller's."""
    from copes_lib import substrate
    from copes_lib.protocols.testbed.substrate_setup import substrate_config

    seen = []
    monkeypatch.setattr(substrate, "exit_with_parent", lambda: None)
    monkeypatch.setattr(substrate, "warm_start", lambda profile, kind, *a, **k: seen.append(data_variant(profile, kind))
                        or (None, None, {"steps": 0, "cached": True, "cache_dir": ""}))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"config": __import__("dataclasses").asdict(substrate_config("smoke")),
                                "tools": substrate._tool_limits("smoke"), "qa_data": "large"}))
    assert substrate.main(["build", "--profile", "smoke", "--kind", "qa", "--seed", "0", "--config", str(spec)]) == 0
    assert seen == ["large"]


def test_a_record_names_a_non_standard_data_variant_beside_its_recipe():
    """A preflight record (RECORD=1's resumable key, the pre-run check's comparison) measured on the large QA data
    is another recipe than one on the standard data with the same warm-start config; standard keys are as before."""
    import dataclasses

    from copes_lib.protocols.testbed.preflight import PreflightCriterion
    from copes_lib.protocols.testbed.preflight_cli import record_key
    from copes_lib.protocols.testbed.prerun_seed_check import _recipe_differences
    from copes_lib.protocols.testbed.substrate_setup import substrate_params
    from copes_lib.tasks import recipe_data

    params = substrate_params("cpu")
    warm, settings, criterion = params.warm_start_config(), params.preflight_settings(), PreflightCriterion()
    standard = record_key(warm, settings, criterion, recipe_data("cpu"))
    assert standard["recipe"] == json.loads(json.dumps(dataclasses.asdict(warm), default=str))  # no new field
    use_qa_data("cpu", "large")
    large = record_key(warm, settings, criterion, recipe_data("cpu"))
    assert large["recipe"] == {**standard["recipe"], "qa_data": "large"}
    assert _recipe_differences(standard["recipe"], warm, recipe_data("cpu")) == ["qa_data"]
    assert _recipe_differences(large["recipe"], warm, recipe_data("cpu")) == []
