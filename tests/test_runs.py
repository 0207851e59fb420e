"""The run store: atomic writes, keep-previous-results-on-failure, cache keys, checkpoints."""

import dataclasses
import json
import os

import pytest
import torch

from copes_lib import runs
from copes_lib.config import NotebookParams, param


@dataclasses.dataclass(frozen=True)
class ToyParams(NotebookParams):
    SIGMA: float = param(0.001, "perturbation scale", gt=0.0)


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "a.json"
    runs.atomic_write_json(path, {"x": 1})
    runs.atomic_write_json(path, {"x": 2, "y": [1, 2]})
    assert runs.read_json(path) == {"x": 2, "y": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temporary files left behind


def test_atomic_write_gives_a_plain_files_mode(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic = runs.atomic_write_text(tmp_path / "atomic.txt", "x")
    assert atomic.stat().st_mode == plain.stat().st_mode  # not mkstemp's 0600


def test_crash_mid_write_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    runs.atomic_write_json(path, {"val_accuracy": 0.5})

    def crash(fd):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "fsync", crash)  # dies after the bytes were written to the temp file
    with pytest.raises(OSError, match="simulated"):
        runs.atomic_write_json(path, {"val_accuracy": 0.9, "padding": "x" * 100_000})
    assert runs.read_json(path) == {"val_accuracy": 0.5}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def _finished_run(root, value):
    run = runs.Run("smoke", "05_fixed_budget_math", ToyParams(SEED=3), seeds=[3], root=root)
    run.log(0, {"reward/mean": value})
    return run, run.finish({"val_accuracy": value})


def test_run_writes_the_results_contract(tmp_path):
    run, summary = _finished_run(tmp_path, 0.25)
    folder = tmp_path / "smoke" / "05_fixed_budget_math"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "manifest.json", "metrics.jsonl", "summary.json"]
    assert summary["val_accuracy"] == 0.25 and summary["profile"] == "smoke" and summary["seeds"] == [3]
    written = json.loads((folder / "summary.json").read_text())
    assert list(written)[-1] == "val_accuracy" and list(written)[:2] == ["profile", "notebook"]  # order kept
    assert {"git_sha", "git_dirty", "library_version"} <= set(summary)
    manifest = runs.read_json(folder / "manifest.json")
    assert manifest["config"]["SEED"] == 3 and manifest["wall_time_s"] >= 0
    assert {"torch", "transformers", "papermill"} <= set(manifest["packages"])
    assert "torch_threads" in manifest["device"] and manifest["ended"] >= manifest["started"]
    assert [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 0, "reward/mean": 0.25}
    ]
    assert runs.load_summary("smoke", "05_fixed_budget_math", root=tmp_path)["val_accuracy"] == 0.25


def test_failed_rerun_keeps_previous_results(tmp_path):
    _finished_run(tmp_path, 0.25)
    folder = tmp_path / "smoke" / "05_fixed_budget_math"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}

    # a rerun that dies before finish (an exception in the notebook): nothing of it is visible
    crashed = runs.Run("smoke", "05_fixed_budget_math", ToyParams(SEED=4), seeds=[4], root=tmp_path)
    crashed.log(0, {"reward/mean": 0.99})
    crashed.write_table("table.csv", __import__("pandas").DataFrame({"a": [1]}))
    # a rerun whose summary is not finite is refused at finish, also leaving the old results
    bad = runs.Run("smoke", "05_fixed_budget_math", ToyParams(SEED=5), seeds=[5], root=tmp_path)
    with pytest.raises(ValueError, match="not finite"):
        bad.finish({"val_accuracy": float("nan")})
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert after == before
    assert runs.load_summary("smoke", "05_fixed_budget_math", root=tmp_path)["val_accuracy"] == 0.25


def test_summary_must_be_flat():
    with pytest.raises(ValueError, match="summaries are flat"):
        runs.check_summary({"table": {"a": 1}})
    runs.check_summary({"acc": 0.5, "ok": True, "name": "x", "seeds": [0, 1], "missing": None})


def test_cache_key_changes_with_config_data_and_version():
    base = runs.cache_key(ToyParams(), ["t1", "t2"])
    assert base == runs.cache_key(ToyParams(), ["t1", "t2"])  # deterministic
    assert len(base) == 16
    assert runs.cache_key(ToyParams(SIGMA=0.002), ["t1", "t2"]) != base
    assert runs.cache_key(ToyParams(), ["t1", "t3"]) != base
    assert runs.cache_key(ToyParams(), ["t1", "t2"], version="9.9.9") != base
    assert runs.cache_key({"a": 1}) == runs.cache_key({"a": 1}) != runs.cache_key({"a": 2})


def test_cached_computes_once_unless_forced(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"n": len(calls)}

    path = tmp_path / "work.json"
    assert runs.cached(path, compute) == {"n": 1}
    assert runs.cached(path, compute) == {"n": 1}
    assert runs.cached(path, compute, force=True) == {"n": 2}
    assert len(calls) == 2


def test_cache_dir_layout(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path)
    key = runs.cache_key(ToyParams())
    path = runs.cache_dir("smoke", "warm_start", key)
    assert path == tmp_path / "smoke" / f"warm_start-{key}" and path.is_dir()


def test_checkpoint_roundtrip(tmp_path):
    path = tmp_path / "ckpt" / "step_3.pt"
    assert runs.load_checkpoint(path) is None  # a fresh start
    gen = torch.Generator().manual_seed(0)
    state = {"step": 3, "theta": torch.randn(5, generator=gen), "rng": gen.get_state()}
    runs.save_checkpoint(path, state)
    loaded = runs.load_checkpoint(path)
    assert loaded["step"] == 3 and torch.equal(loaded["theta"], state["theta"])
    resumed = torch.Generator()
    resumed.set_state(loaded["rng"])
    assert torch.equal(torch.randn(2, generator=resumed), torch.randn(2, generator=gen))


def test_save_figure_writes_png_and_svg(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    paths = runs.save_figure(fig, "smoke", "05_fixed_budget_math", "passk")
    plt.close(fig)
    assert [p.name for p in paths] == ["05_passk.png", "05_passk.svg"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert paths[0].read_bytes()[:4] == b"\x89PNG"


def test_summary_line_is_one_line(capsys):
    line = runs.summary_line("es", 8, {"reward/mean": 0.41234, "eval/val_accuracy": 0.5})
    assert line == "[es] step 8 reward/mean=0.4123 eval/val_accuracy=0.5"
    assert capsys.readouterr().out == line + "\n"


def test_git_state_ignores_the_suites_own_outputs(tmp_path, monkeypatch):
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "init")
    monkeypatch.setattr(runs, "REPO_ROOT", tmp_path)
    assert runs.git_state()["git_dirty"] is False
    (tmp_path / "results" / "summary.json").write_text('{"new": 1}')  # an output: still clean
    assert runs.git_state()["git_dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert runs.git_state()["git_dirty"] is True
