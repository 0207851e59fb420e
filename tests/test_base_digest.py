"""Every base has a digest (sha256 of its state dict, names, dtypes and shapes in it), and a rebuild of a base
in a fresh process, from scratch, in a temporary cache, gives the same digest (smoke size, few steps)."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from copes_lib import runs
from copes_lib.protocols.testbed import base_digest
from copes_lib.protocols.testbed.substrate_setup import substrate_config

# a smoke-size math base trained for a handful of steps: the rebuild path, not the recipe, is under test
REBUILD = ("import dataclasses; from copes_lib.protocols.testbed import base_digest; "
           "from copes_lib.protocols.testbed.substrate_setup import substrate_config; "
           "cfg = dataclasses.replace(substrate_config('smoke'), math_steps=12, math_target=0.0, eval_every=6, "
           "eval_problems=4); print(base_digest.rebuild_digest('smoke', 'math', 0, config=cfg, log=lambda *a, **k: None))")


def _small_config():
    return dataclasses.replace(substrate_config("smoke"), math_steps=12, math_target=0.0, eval_every=6, eval_problems=4)


def test_the_digest_sees_values_names_dtypes_and_shapes():
    model = torch.nn.Linear(3, 2)
    digest = base_digest.state_digest(model)
    assert digest == base_digest.state_digest(model.state_dict()) and len(digest) == 64
    with torch.no_grad():
        model.weight[0, 0] += 1e-7
    assert base_digest.state_digest(model) != digest
    renamed = {f"x.{k}": v for k, v in model.state_dict().items()}
    assert base_digest.state_digest(renamed) != base_digest.state_digest(model)
    assert base_digest.summary_keys({("math", 2): "ab", ("qa", 0): model}) == {
        "base_digest_math_seed2": "ab", "base_digest_qa_seed0": base_digest.state_digest(model)}


def test_a_rebuild_in_a_fresh_process_gives_the_same_digest(tmp_path, monkeypatch):
    # the cache root is this test's alone (the session's is shared with the smoke run on another worker), so an
    # empty cache afterwards shows the rebuilds neither read nor wrote it
    cache = tmp_path / "cache"
    monkeypatch.setattr(runs, "CACHE_ROOT", cache)
    here = base_digest.rebuild_digest("smoke", "math", 0, config=_small_config(), log=lambda *a, **k: None)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", runs.CACHE_ROOT_VARIABLE: str(cache)}
    out = subprocess.run([sys.executable, "-c", REBUILD + "; from copes_lib import runs; print(runs.CACHE_ROOT)"],
                         capture_output=True, text=True, env=env, check=True)
    printed = out.stdout.strip().splitlines()
    assert printed[-2] == here and printed[-1] == str(cache)
    assert not cache.exists() or not any(cache.rglob("*"))  # the cache is neither read nor written


@pytest.mark.parametrize("rebuilt,expected,code", [("a" * 64, "a" * 64, 0), ("a" * 64, "b" * 64, 1), ("a" * 64, None, 2)])
def test_the_command_compares_with_01s_summary(tmp_path, monkeypatch, capsys, rebuilt, expected, code):
    folder = tmp_path / "cpu" / "01_substrate_and_agent"
    folder.mkdir(parents=True)
    runs.atomic_write_json(folder / "summary.json", {} if expected is None else {"base_digest_math_seed0": expected})
    monkeypatch.setattr(base_digest, "rebuild_digest", lambda *a, **k: rebuilt)
    assert base_digest.main(["--profile", "cpu", "--kind", "math", "--seed", "0", "--results-root", str(tmp_path)]) == code
    text = capsys.readouterr().out
    assert rebuilt in text and ({0: "IDENTICAL", 1: "DIFFERENT", 2: "no recorded digest"}[code] in text)


def test_an_unknown_kind_is_refused_with_the_valid_values(capsys):
    with pytest.raises(SystemExit):
        base_digest.main(["--profile", "cpu", "--kind", "code"])
    assert "invalid choice: 'code'" in capsys.readouterr().err


def test_the_command_falls_back_to_the_pre_run_seed_check(tmp_path, monkeypatch, capsys):
    """A seed the run no longer trains (WARM_SPREAD_SEEDS: 0) has its digest in results/preflight/<profile>.json."""
    (tmp_path / "preflight").mkdir()
    runs.atomic_write_json(tmp_path / "preflight" / "cpu.json", {"seeds": [0, 3], "kinds": {
        "math seed 3": {"met": True, "base_digest": "c" * 64}, "qa seed 3": {"met": True, "base_digest": "d" * 64}}})
    monkeypatch.setattr(base_digest, "rebuild_digest", lambda *a, **k: "c" * 64)
    assert base_digest.main(["--profile", "cpu", "--kind", "math", "--seed", "3", "--results-root", str(tmp_path)]) == 0
    assert base_digest.recorded_digest("cpu", "qa", 3, tmp_path) == "d" * 64
    assert base_digest.recorded_digest("cpu", "math", 1, tmp_path) is None
    assert "IDENTICAL" in capsys.readouterr().out
