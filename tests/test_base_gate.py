"""The base gate (issue 47 decision 3): 01 builds a kind's base only when the recorded 5-seed check of the run's
recipe passed for it; each other case is said with its reason, and the claims on a base not checked read so."""

import dataclasses

import pytest

from copes_lib import claims, config, runs
from copes_lib.protocols import notebooks as registry
from copes_lib.protocols.params import SubstrateNotebookParams
from copes_lib.protocols.testbed import base_gate


def _params(profile="cpu", **values):
    return config.build(SubstrateNotebookParams, {**registry.profile_params(profile, SubstrateNotebookParams.NOTEBOOK),
                                                  "PROFILE": profile, **values})


def _data(p):
    """The run's data variant as a record names it (tasks.recipe_data): the cpu default's QA data are 'large'."""
    return {} if p.QA_DATA == "standard" else {"qa_data": p.QA_DATA}


def _record(root, recipe, seeds_met, profile="cpu", data=None):
    """A record as `make preflight RECORD=1` writes it: per "<kind> seed <s>" met and what failed; ``data``: the
    data variant it names beside the recipe."""
    kinds = {f"{kind} seed {seed}": {"met": met, "failed": [] if met else ["E1"], "shape": {}, "values": {},
                                     "verdicts": {}}
             for kind, seeds in seeds_met.items() for seed, met in seeds.items()}
    recipe = {**dataclasses.asdict(recipe), **(data or {})}
    path = root / "preflight" / f"{profile}.json"
    runs.atomic_write_json(path, {"profile": profile, "recipe": recipe, "kinds": kinds,
                                  "seeds": sorted({s for seeds in seeds_met.values() for s in seeds})})
    return path


def _decide(p, root):
    return base_gate.decide(p.PROFILE, p.SEED, p.warm_start_config(), enforce=p.PREFLIGHT_ENFORCE,
                            trains=p.trains_base(), unchecked=p.UNCHECKED_BASES, root=root, data=_data(p))


FIVE = dict.fromkeys(range(5), True)
SIX = dict.fromkeys(range(6), True)


def test_each_kind_is_gated_on_its_own_check(tmp_path, monkeypatch):
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    p = _params()
    gate = _decide(p, tmp_path)
    assert {k: g["state"] for k, g in gate.items()} == {"math": "not checked", "qa": "not checked"}
    assert "does not exist" in gate["math"]["reason"] and not gate["math"]["build"]
    assert gate["qa"]["command"] == "make preflight PROFILE=cpu KINDS=qa SEEDS=0,1,2,3,4 JOBS=2 RECORD=1"

    _record(tmp_path, p.warm_start_config(), {"math": FIVE, "qa": {**FIVE, 3: False}}, data=_data(p))
    gate = _decide(p, tmp_path)
    assert gate["math"]["state"] == "passed" and gate["math"]["build"]
    assert gate["qa"]["state"] == "failed" and "seed 3: E1" in gate["qa"]["reason"] and not gate["qa"]["build"]
    assert base_gate.built(gate) == ["math"]
    words = base_gate.lines(gate)
    assert "[qa] base NOT built, failed" in words[1] and "rejected" in words[1] and "UNCHECKED_BASES=1" in words[1]

    _record(tmp_path, p.warm_start_config(), {"math": {s: True for s in (1, 2, 3, 4, 5)}, "qa": {0: True, 1: True}},
            data=_data(p))
    gate = _decide(p, tmp_path)  # five math seeds but not the run's seed 0; two QA seeds
    assert gate["math"]["state"] == "not checked" and "0 not yet recorded" in gate["math"]["reason"]
    assert gate["qa"]["state"] == "not checked" and "seeds 0, 1" in gate["qa"]["reason"]

    other = dataclasses.replace(p.warm_start_config(), latent_math_steps=p.WARM_LATENT_MATH_STEPS + 1)
    _record(tmp_path, other, {"math": FIVE, "qa": FIVE})
    gate = _decide(p, tmp_path)
    assert gate["math"]["state"] == "not checked" and "another warm-start recipe" in gate["math"]["reason"]
    assert "latent_math_steps" in gate["math"]["reason"]


def test_the_escape_hatch_smoke_and_loaded_bases_build_and_say_so(tmp_path, monkeypatch):
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    gate = _decide(_params(UNCHECKED_BASES=True), tmp_path)
    assert all(g["state"] == "unchecked" and g["build"] for g in gate.values())
    keys = base_gate.summary_keys(gate)
    assert keys["unchecked_bases"] is True and keys["base_check_math"] == "unchecked"
    assert "not checked" in keys["base_check_math_reason"]
    smoke = _decide(_params("smoke"), tmp_path)  # PREFLIGHT_ENFORCE false: nothing gated
    assert all(g["state"] == "not enforced" and g["build"] for g in smoke.values())
    assert base_gate.summary_keys(smoke)["unchecked_bases"] is False
    loaded = base_gate.decide("gpu", 0, None, enforce=True, trains=False, root=tmp_path)
    assert all(g["state"] == "not enforced" and "checkpoint" in g["reason"] for g in loaded.values())


def test_an_unreadable_record_is_not_checked_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    path = tmp_path / "preflight" / "cpu.json"
    path.parent.mkdir(parents=True)
    path.write_text("{")
    gate = _decide(_params(), tmp_path)
    assert gate["math"]["state"] == "not checked" and str(path) in gate["math"]["reason"]


def test_closed_kinds_read_from_01s_summary():
    s01 = {"base_check_math": "failed", "base_check_math_reason": "seed 1: E1", "base_check_qa": "passed",
           "preflight_enforced": True, "preflight_qa_met": False, "preflight_failed": ["qa R", "qa U"]}
    closed = base_gate.closed_kinds(s01)
    assert "seed 1: E1" in closed["math"] and "qa R, qa U" in closed["qa"]
    assert base_gate.closed_kinds({"base_check_math": "unchecked", "base_check_qa": "not enforced"}) == {}


@pytest.mark.parametrize(("state", "words"), [("unchecked", "built without a passing 5-seed check"),
                                              ("failed", "did not build math's base")])
def test_claims_on_a_base_not_checked_read_not_checked(state, words):
    s01 = {"base_check_math": state, "base_check_math_reason": "cpu.json: seed 2: E2", "base_check_qa": "passed",
           "gate_rule": "per_task", "regime_criterion_met_math": True, "regime_criterion_met_qa": True}
    rows = {r["claim"]: r for r in claims.judge_claims({"01_substrate_and_agent": s01})}
    assert rows["A1"]["verdict"] == claims.NOT_CHECKED and words in rows["A1"]["reason"]
    assert "seed 2: E2" in rows["A1"]["reason"] and rows["A1"]["gate"] == "closed: math's base not checked"
    assert rows["A8"]["verdict"] != claims.NOT_CHECKED  # QA's base passed: its claims are judged as usual
    assert claims.NOT_CHECKED in claims.VERDICTS and "**not checked**" in claims.rules_markdown()


def test_a_record_of_the_larger_qa_data_gates_only_a_run_on_those_data(tmp_path, monkeypatch):
    """P8.11's record (the cpu default's) names its QA data beside the warm-start recipe (tasks.recipe_data); the
    gate compares both."""
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    p = _params()
    assert p.QA_DATA == "large"
    path = _record(tmp_path, p.warm_start_config(), {"math": SIX, "qa": FIVE})
    record = runs.read_json(path)
    record["recipe"]["qa_data"] = "large"
    runs.atomic_write_json(path, record)
    gate = base_gate.decide_for(p, root=tmp_path)
    assert {k: g["state"] for k, g in gate.items()} == {"math": "passed", "qa": "passed"}
    standard = base_gate.decide(p.PROFILE, p.SEED, p.warm_start_config(), enforce=True, root=tmp_path, data={})
    assert standard["qa"]["state"] == "not checked" and "qa_data" in standard["qa"]["reason"]


def test_the_gate_requires_every_seed_the_designs_registration_names(tmp_path, monkeypatch):
    """P8.10 registered six math seeds (0-5; seed 0 was seen by P8.9's probes): five passing seeds do not open the
    gate, the sixth does; QA's registration keeps 0-4. The command to finish the check names the registered seeds."""
    monkeypatch.setenv(config.RECIPE_ENV, "p8.10")
    p = _params()
    assert p.check_seeds() == {"math": (0, 1, 2, 3, 4, 5), "qa": (0, 1, 2, 3, 4)}
    _record(tmp_path, p.warm_start_config(), {"math": FIVE, "qa": FIVE}, profile="cpu-p8.10")
    gate = base_gate.decide_for(p, root=tmp_path)
    assert gate["math"]["state"] == "not checked" and not gate["math"]["build"]
    assert "5 not yet recorded" in gate["math"]["reason"] and "BASE_CHECK_SEEDS_MATH" in gate["math"]["reason"]
    assert gate["math"]["command"] == ("make preflight PROFILE=cpu RECIPE=p8.10 KINDS=math SEEDS=0,1,2,3,4,5 JOBS=2 "
                                       "RECORD=1")
    assert gate["qa"]["state"] == "passed"
    _record(tmp_path, p.warm_start_config(), {"math": SIX, "qa": FIVE}, profile="cpu-p8.10")
    gate = base_gate.decide_for(p, root=tmp_path)
    assert gate["math"]["state"] == "passed" and "registered: 0, 1, 2, 3, 4, 5" in gate["math"]["reason"]
    _record(tmp_path, p.warm_start_config(), {"math": {**SIX, 5: False}, "qa": FIVE}, profile="cpu-p8.10")
    assert base_gate.decide_for(p, root=tmp_path)["math"]["state"] == "failed"


def test_a_run_seed_outside_the_registered_check_is_not_checked(tmp_path, monkeypatch):
    monkeypatch.delenv(config.RECIPE_ENV, raising=False)
    p = _params(SEED=7)
    _record(tmp_path, p.warm_start_config(), {"math": FIVE, "qa": FIVE}, data=_data(p))
    gate = base_gate.decide_for(p, root=tmp_path)
    assert gate["math"]["state"] == "not checked" and "seed 7 is not among" in gate["math"]["reason"]


@pytest.mark.parametrize("seeds", ["0,1,2,3", "0,1,2,3,3", "0,1,x,3,4", "", "-1,0,1,2,3"])
def test_a_registered_seed_list_that_is_not_a_check_is_an_error_naming_it(seeds):
    with pytest.raises(config.ConfigError, match="BASE_CHECK_SEEDS_QA"):
        _params(BASE_CHECK_SEEDS_QA=seeds)
