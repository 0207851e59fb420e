"""The run store: atomic writes, keep-previous-results-on-failure, cache keys, checkpoints."""

import dataclasses
import json
import os
import warnings

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
    import torch

    # the full version with its build tag (+cpu, +cu130): PyPI's CUDA build's metadata says plain 2.13.0
    assert manifest["packages"]["torch"] == torch.__version__
    assert manifest["device"]["torch_cuda_build"] == torch.version.cuda
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


def _figure(value: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [value, 0])
    return fig


def test_save_figure_writes_png_and_svg_on_finish(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path / "figures")
    fig = _figure(1.0)
    paths = runs.save_figure(fig, "smoke", "05_fixed_budget_math", "passk")  # before the Run exists
    plt.close(fig)
    assert [p.name for p in paths] == ["05_passk.png", "05_passk.svg"]
    assert not any(p.exists() for p in paths)  # staged, not yet visible
    run = runs.Run("smoke", "05_fixed_budget_math", ToyParams(), root=tmp_path / "results")
    run.finish({"val_accuracy": 0.5})
    assert all(p.stat().st_size > 0 for p in paths)
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (tmp_path / "figures" / "smoke").iterdir()) == ["05_passk.png", "05_passk.svg"]


def test_failed_rerun_keeps_previous_figures(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path / "figures")
    first = _figure(1.0)
    png, _ = runs.save_figure(first, "smoke", "05_fixed_budget_math", "passk")
    runs.Run("smoke", "05_fixed_budget_math", ToyParams(), root=tmp_path / "results").finish({"val_accuracy": 0.5})
    before = png.read_bytes()

    rerun = runs.Run("smoke", "05_fixed_budget_math", ToyParams(SEED=1), root=tmp_path / "results")
    second = _figure(-3.0)
    runs.save_figure(second, "smoke", "05_fixed_budget_math", "passk")
    runs.save_figure(second, "smoke", "05_fixed_budget_math", "new_plot")
    with pytest.raises(ValueError, match="not finite"):  # the rerun fails at finish
        rerun.finish({"val_accuracy": float("nan")})
    assert png.read_bytes() == before
    assert not (png.parent / "05_new_plot.png").exists()

    # the next successful run publishes only its own figures, not the failed run's leftovers
    runs._STAGED_FIGURES.clear()  # a new kernel: the failed run's figures were staged by another process
    third = _figure(2.0)
    runs.save_figure(third, "smoke", "05_fixed_budget_math", "passk")
    runs.Run("smoke", "05_fixed_budget_math", ToyParams(SEED=2), root=tmp_path / "results").finish({"val_accuracy": 1})
    plt.close("all")
    assert png.read_bytes() != before
    assert not (png.parent / "05_new_plot.png").exists()
    assert not (tmp_path / "figures" / "smoke" / ".partial").exists()


# --------------------------------------------------------------------------- damaged cache entries
def test_truncated_json_cache_is_reported_and_recomputed(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path)
    path = runs.cache_dir("smoke", "pass_at_k", "abc") / "result.json"
    calls = []

    def compute():
        calls.append(1)
        return {"scores": list(range(50)), "n": len(calls)}

    assert runs.cached(path, compute)["n"] == 1
    path.write_text(path.read_text()[:40])  # a copy cut short
    with pytest.warns(runs.CorruptCacheWarning) as caught:
        assert runs.cached(path, compute, rebuild="make reproduce PROFILE=smoke ONLY=05 FORCE=1")["n"] == 2
    message = str(caught[0].message)
    assert str(path) in message and "JSONDecodeError" in message
    assert "make reproduce PROFILE=smoke ONLY=05 FORCE=1" in message
    assert runs.cached(path, compute)["n"] == 2 and len(calls) == 2  # the rebuilt entry is reused


def test_default_rebuild_hint_names_profile_and_open_notebook(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "cache")
    path = runs.cache_dir("cpu", "budget", "k") / "costs.json"
    path.write_text("{")
    run = runs.Run("cpu", "08_memory_and_gpu_hours", ToyParams(), root=tmp_path / "results")
    with pytest.warns(runs.CorruptCacheWarning, match="make reproduce PROFILE=cpu ONLY=08 FORCE=1"):
        assert runs.cached(path, lambda: {"ok": 1}) == {"ok": 1}
    run.finish({"x": 1})


def test_other_load_errors_are_not_taken_for_damage(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("{}")

    def broken(_):
        raise KeyError("config")

    with pytest.raises(KeyError):
        runs.cached(path, lambda: {}, load=broken)
    assert path.exists()  # not deleted


def test_truncated_checkpoint_is_reported_and_resume_starts_afresh(tmp_path):
    path = tmp_path / "es_runs-abc" / "state.pt"
    runs.save_checkpoint(path, {"step": 3, "theta": torch.zeros(1000)})
    path.write_bytes(path.read_bytes()[:500])
    with pytest.warns(runs.CorruptCacheWarning, match="PytorchStreamReader") as caught:
        assert runs.load_checkpoint(path) is None
    assert str(path) in str(caught[0].message) and not path.exists()

    runs.save_checkpoint(path, {"step": 3})
    path.write_bytes(path.read_bytes()[:100])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "rebuilt now" promise for a file that is not rebuilt here
        with pytest.raises(runs.CorruptCacheError, match="is damaged .*ONLY=05 FORCE=1"):
            runs.load_checkpoint(path, required=True, rebuild="make reproduce PROFILE=cpu ONLY=05 FORCE=1")
    assert not path.exists()


def test_corrupted_warm_start_is_reported_and_rebuilt(tmp_path, monkeypatch):
    """The failure of issue 17: a truncated model.safetensors in the warm-start cache. The next notebook
    that asks for the warm start (02, 03, ...) reports the path and the command, then retrains it."""
    from copes_lib import bases, substrate
    from copes_lib.protocols.testbed.substrate_setup import substrate_config

    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path)
    monkeypatch.setattr(bases, "BASES_ROOT", tmp_path / "no-bases")  # a trained base, not the shipped smoke one
    config = substrate_config("smoke")
    trained = []

    def quick_training(*args, **kwargs):  # the real training is a minute; what is cached is what matters
        trained.append(1)
        return [{"step": 0, "loss": 1.0, "val_score": 0.0, "time_s": 0.0}]

    monkeypatch.setattr(substrate, "train_warm_start", quick_training)
    _, _, info = substrate.warm_start("smoke", "math", config=config)
    assert not info["cached"] and len(trained) == 1
    weights = tmp_path / "smoke" / info["cache_dir"].split("/")[-1] / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    with pytest.warns(runs.CorruptCacheWarning) as caught:
        _, _, info = substrate.warm_start("smoke", "math", config=config)
    message = str(caught[0].message)
    assert str(weights.parent.parent) in message and "SafetensorError" in message
    assert "make reproduce PROFILE=smoke ONLY=01 FORCE=1" in message
    assert not info["cached"] and len(trained) == 2  # rebuilt, not reused
    _, _, info = substrate.warm_start("smoke", "math", config=config)
    assert info["cached"] and len(trained) == 2


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


def test_finish_turns_numpy_scalars_into_python_numbers(tmp_path):
    import numpy as np

    run = runs.Run("smoke", "08_memory_and_gpu_hours", ToyParams(), root=tmp_path)
    full = run.finish({"ratio": np.float64(3.5), "count": np.int64(4), "values": [np.float64(0.5)]})
    assert type(full["ratio"]) is float and type(full["count"]) is int and type(full["values"][0]) is float
    assert repr(full["ratio"]) == "3.5"


# --------------------------------------------------------------------------- unreadable files name themselves
def test_read_json_names_an_empty_or_garbled_file(tmp_path):
    empty = tmp_path / "summary.json"
    empty.write_text("")
    with pytest.raises(runs.UnreadableFileError) as info:
        runs.read_json(empty)
    assert str(empty) in str(info.value) and "empty (0 bytes)" in str(info.value) and info.value.path == empty
    garbled = tmp_path / "manifest.json"
    garbled.write_text('{"a": 1')
    with pytest.raises(ValueError, match="manifest.json is not valid JSON"):
        runs.read_json(garbled)


def test_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    import errno

    path = tmp_path / "status.json"
    runs.atomic_write_json(path, {"old": True})

    def full(_fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runs.os, "fsync", full)
    with pytest.raises(OSError) as info:
        runs.atomic_write_json(path, {"new": True})
    assert info.value.errno == errno.ENOSPC and str(path) in str(info.value) and info.value.filename == str(path)
    monkeypatch.undo()
    assert runs.read_json(path) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary file left


def test_a_truncated_json_in_a_cache_entry_is_announced_when_the_entry_opens(tmp_path, monkeypatch):
    """An ES run's history.json is never read back, only rewritten: its rebuild must still be announced."""
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path)
    folder = runs.cache_dir("cpu", "es_run", "abc")
    runs.atomic_write_json(folder / "history.json", [{"step": 0, "eval/val_accuracy": 0.5}] * 20)
    (folder / "state.pt").write_bytes(b"kept")
    (folder / "history.json").write_text((folder / "history.json").read_text()[:50])
    with pytest.warns(runs.CorruptCacheWarning) as caught:
        again = runs.cache_dir("cpu", "es_run", "abc")
    message = str(caught[0].message)
    assert str(folder / "history.json") in message and "rebuil" in message
    assert again == folder and not (folder / "history.json").exists() and (folder / "state.pt").exists()


def test_wall_time_runs_from_the_notebooks_first_cell(tmp_path):
    import time

    runs.mark_notebook_start("98_wall_time")
    time.sleep(0.3)
    run = runs.Run("smoke", "98_wall_time", {"SEED": 0}, root=tmp_path)
    run.finish({"x": 1})
    manifest = runs.read_json(tmp_path / "smoke" / "98_wall_time" / "manifest.json")
    assert manifest["wall_time_s"] >= 0.3 and manifest["wall_time_from"] == "notebook start (load_params)"
    before = time.perf_counter()
    other = runs.Run("smoke", "97_no_mark", {"SEED": 0}, root=tmp_path)
    other.finish({"x": 1})
    took = time.perf_counter() - before
    # from its own creation, not from 98's mark (>= 0.3 s earlier); bounded by what we timed, not by a fixed
    # limit that a loaded machine exceeds (Run + finish took 0.46 s at a load of 30 on 2 cores)
    assert runs.read_json(tmp_path / "smoke" / "97_no_mark" / "manifest.json")["wall_time_s"] <= took


def test_an_unreadable_upstream_summary_says_what_to_do(tmp_path):
    path = tmp_path / "cpu" / "02_standard_es" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"chosen_sigma": ')
    with pytest.raises(runs.UnreadableFileError, match=r"ONLY=02\) or delete .*summary\.json"):
        runs.load_summary("cpu", "02_standard_es", root=tmp_path)


@pytest.mark.parametrize("loop", ["es", "grpo"])
@pytest.mark.parametrize("damage", ["truncated", "empty", "missing"])
def test_a_damaged_best_checkpoint_heals_on_the_first_rerun(tmp_path, loop, damage):
    """A cached run whose best.pt was cut short (a disk that filled up) is reset with a warning when it is
    next used and retrains at once: the first rerun gives the same run again, no FORCE, no error."""
    from copes_lib.training_run import BEST, LAST

    if loop == "es":
        from test_es import cfg, toy_quadratic

        from copes_lib.es_training import train_es
        from copes_lib.protocols.paper_a.es_arm import ESRun

        config = cfg(population=4, subspaces=2, sigma=0.1, alpha=0.05, chunk_size=64)

        def train():
            model, objective = toy_quadratic(4)
            return train_es(model, objective, config, steps=3, val_every=2, run_dir=tmp_path)

        def best_weights(result):
            return ESRun("es", config, result.history, tmp_path).weights("best")
    else:
        from test_grpo import run_toy

        from copes_lib.training_run import read_checkpoint

        def train():
            return run_toy(tmp_path, steps=4)

        def best_weights(result):
            return read_checkpoint(result.best_path, "trainable")

    first = train()
    good = best_weights(first)
    best = tmp_path / BEST
    if damage == "truncated":
        best.write_bytes(best.read_bytes()[:len(best.read_bytes()) // 2])
    elif damage == "empty":
        best.write_bytes(b"")
    else:
        best.unlink()
    with pytest.warns(runs.CorruptCacheWarning, match=f"{best} (is damaged|is missing).*retraining"):
        again = train()
    assert [r["step"] for r in again.history] == [r["step"] for r in first.history]  # retrained from step 0
    assert again.best_step == first.best_step and (tmp_path / LAST).exists()
    healed = best_weights(again)
    assert all(torch.equal(healed[k], good[k]) for k in good)  # the same run again (deterministic)
    with warnings.catch_warnings():  # a healthy cache is reused, silently
        warnings.simplefilter("error", runs.CorruptCacheWarning)
        assert train().history == again.history


def test_one_process_at_a_time_writes_a_notebooks_results(tmp_path):
    """A notebook running in one process (a JupyterLab kernel) and the same notebook started by another (make
    reproduce) would share results/<profile>/<NN_topic>/.partial/: the second refuses, naming the first; the
    same process may start it again (a notebook rerun in its kernel); a killed holder blocks nothing."""
    import signal
    import subprocess
    import sys

    from copes_lib import cli

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom copes_lib import runs\n"
        f"run = runs.Run('smoke', '05_x', config={{}}, root={str(tmp_path)!r})\n"
        "(run.partial / 'staged.txt').write_text('x')\nprint('ready', flush=True)\ntime.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        folder = tmp_path / "smoke" / "05_x"
        assert runs.notebook_folder_in_use(folder)
        with pytest.raises(runs.FolderBusyError, match=rf"05_x under profile smoke is being run by another process \(pid {holder.pid}"):
            runs.Run("smoke", "05_x", config={}, root=tmp_path)
        assert (folder / ".partial" / "staged.txt").exists()  # the refused run touched nothing
        done = cli.tidy_after_killed_run("smoke", {"notebooks": {}}, tmp_path, tmp_path / "figures")
        assert done == [f"kept {folder / '.partial'}: 05_x is being run by another process ({runs.notebook_lock(folder)})"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not runs.notebook_folder_in_use(folder)
    assert cli.tidy_after_killed_run("smoke", {"notebooks": {}}, tmp_path, tmp_path / "figures") == [
        f"deleted {folder / '.partial'}, left by an interrupted run (its previous results are untouched)"]
    run = runs.Run("smoke", "05_x", config={}, root=tmp_path)
    runs.Run("smoke", "05_x", config={}, root=tmp_path)  # again in the same process: allowed
    run.finish({"val_accuracy": 0.5})
    assert runs.notebook_lock(folder) not in runs._HELD  # finished: released
