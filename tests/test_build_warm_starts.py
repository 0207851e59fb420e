"""Notebook 01's bases built in worker processes (copes_lib.substrate.build_warm_starts): the same bits as a base
trained in the caller's process, nothing rebuilt when cached, nothing done with one job or a loaded base, and a
failed worker one error naming its kind, seed and log."""

import dataclasses
import json
import subprocess
import sys

import pytest

from copes_lib import config, runs, substrate
from copes_lib.config import ConfigError
from copes_lib.protocols.testbed import preflight, preflight_cli
from copes_lib.protocols.testbed.base_digest import state_digest
from copes_lib.protocols.testbed.substrate_setup import substrate_config, substrate_params

# a smoke-size latent (graded) base, a handful of steps: the worker path, not the recipe, is under test
TINY = dict(protocol="latent", latent_prior="graded", latent_math_steps=6, latent_qa_steps=6, batch=4, eval_every=3,
            eval_problems=2, max_new_tokens=8)


def _config():
    return dataclasses.replace(substrate_config("smoke"), **TINY)


def _quiet(*args, **kwargs):
    pass


@pytest.mark.slow(cost=25)  # started first by tests/conftest.py (make test's worker balance); 22 s measured
def test_a_base_trained_in_a_worker_process_is_the_same_bits_as_one_trained_here(tmp_path, monkeypatch):
    config, pairs = _config(), [("math", 5), ("qa", 5)]
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "workers")
    built = substrate.build_warm_starts("smoke", pairs, config, jobs=2, log_dir=tmp_path / "logs", log=_quiet)
    assert set(built) == set(pairs) and all(s > 0 for s in built.values())
    assert all((tmp_path / "logs" / f"warm_start_{k}_seed{s}.log").exists() for k, s in pairs)
    from_workers = {k: substrate.warm_start("smoke", k, s, config=config, log=_quiet) for k, s in pairs}
    assert all(info["cached"] for _, _, info in from_workers.values())  # found where this process looks
    # already cached: nothing is rebuilt
    assert substrate.build_warm_starts("smoke", pairs, config, jobs=2, log_dir=tmp_path / "logs", log=_quiet) == {}

    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "here")
    for kind, seed in pairs:
        model, _, info = substrate.warm_start("smoke", kind, seed, config=config, log=_quiet)
        assert not info["cached"]
        worker_model, _, worker_info = from_workers[kind]
        assert state_digest(worker_model) == state_digest(model), kind
        def curve(i):  # the validation curve without its clock (json: the first point's loss is NaN)
            return json.dumps([{k: v for k, v in p.items() if k != "time_s"} for p in i["curve"]], sort_keys=True)

        assert curve(worker_info) == curve(info)


def test_nothing_is_built_with_one_job_or_a_loaded_base(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path)
    config = _config()
    assert substrate.build_warm_starts("smoke", [("math", 0)], config, jobs=1, log=_quiet) == {}
    assert substrate.build_warm_starts("gpu", [("math", 0)], substrate_config("gpu"), jobs=2, log=_quiet) == {}
    assert substrate.build_warm_starts("smoke", [("math", 0)], dataclasses.replace(config, model_path="/m"),
                                       jobs=2, log=_quiet) == {}
    assert not (tmp_path / "smoke").exists()  # nothing trained, not even the tokenizer
    with pytest.raises(ConfigError, match="jobs = 0"):
        substrate.build_warm_starts("smoke", [("math", 0)], config, jobs=0)
    with pytest.raises(ConfigError, match="kind = 'chess'.*valid values"):
        substrate.build_warm_starts("smoke", [("chess", 0)], config, jobs=2)


def test_a_failed_worker_is_one_error_naming_its_kind_seed_and_log(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(substrate, "_tool_limits", lambda profile: {"no_such_setting": 1})  # the worker cannot start
    with pytest.raises(substrate.WarmStartBuildError) as error:
        substrate.build_warm_starts("smoke", [("qa", 4)], _config(), jobs=2, log_dir=tmp_path / "logs", log=_quiet)
    text = str(error.value)
    log = tmp_path / "logs" / "warm_start_qa_seed4.log"
    assert "qa seed 4 (exit 1" in text and str(log) in text and "no_such_setting" in text and log.exists()


def test_a_preflight_worker_measures_under_the_key_of_01s_own_call(tmp_path, monkeypatch):
    """01 with BUILD_JOBS > 1 measures its kinds through preflight_cli.measure_in_parallel(seeded=False): each worker
    runs the preflight module for one kind in the kernel's environment, whose COPES_EXPLICIT_PARAMS carries 01's
    parameters (here SEED 3, not the profile's 0, and a tiny base), so 01's own call afterwards is a cache hit."""
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "cache")
    monkeypatch.setattr(preflight_cli, "REPORTS_ROOT", tmp_path / "reports")
    given = {"SEED": 3, "WARM_MATH_STEPS": 4, "WARM_MATH_TARGET": 0.0, "WARM_EVAL_EVERY": 2, "WARM_EVAL_PROBLEMS": 2,
             "WARM_BATCH": 4, "MAX_NEW_TOKENS": 8}
    monkeypatch.setenv(config.EXPLICIT_ENV, json.dumps({"profile": "smoke", "notebook": "01_substrate_and_agent",
                                                        "values": given}))  # what 01's load_params leaves
    P = substrate_params("smoke")
    assert P.SEED == 3 and P.preflight_kinds() == ["math"]
    started = []
    with monkeypatch.context() as m:  # the worker's command line and environment, as measure_in_parallel starts it
        m.setattr(subprocess, "run", lambda command, **kw: started.append((command, kw))
                  or subprocess.CompletedProcess(command, 0))
        preflight_cli.measure_in_parallel("smoke", [("math", P.SEED)], 2, seeded=False)
    (command, kw), = started
    assert command[:3] == [sys.executable, "-m", "copes_lib.protocols.testbed.preflight"] and "--seeds" not in command
    assert "env" not in kw  # the worker inherits this environment, COPES_EXPLICIT_PARAMS with it
    assert preflight.main(command[3:]) == 0  # the worker's work, here (a subprocess would write the real cache)
    warm = P.warm_start_config()
    report = preflight.run_preflight("smoke", "math", P.preflight_settings(), preflight.PreflightCriterion(),
                                     prior=warm.latent_prior if warm.protocol == "latent" else None,
                                     graded=(warm.graded_low, warm.graded_high), warm_seed=P.SEED, force=False,
                                     log=_quiet)  # 01's call, as its preflight cell makes it
    assert report["cached"] is True and report["warm_seed"] == 3
