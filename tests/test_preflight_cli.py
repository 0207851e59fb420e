"""`make preflight` as a reader and a script see it: a table with a header row and what each id means, exit
0 / 2 / 1 for holds / not actionable / error, smoke explaining its expected "not actionable", and the
committed results/preflight/cpu.json never rewritten without --record."""

from __future__ import annotations

import subprocess
import sys

import pytest

from copes_lib import runs
from copes_lib.config import REPO_ROOT, ConfigError
from copes_lib.protocols.testbed import preflight as pf
from copes_lib.protocols.testbed import preflight_cli
from tests.test_preflight import _fake_report

GOOD = {"G1": 0.8, "G2": 0.6, "E1": 0.7, "E2": 0.0, "R": 0.3, "R_low": 0.1, "R_high": 0.5, "U": 0.3}


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path / "figures")
    monkeypatch.setattr(preflight_cli, "REPORTS_ROOT", tmp_path / "reports")
    return tmp_path


def _measured(monkeypatch, values):
    monkeypatch.setattr(pf, "run_preflight", lambda profile, kind, *a, **kw: _fake_report(values))


def test_the_table_has_a_header_row_and_says_what_each_id_means(roots, monkeypatch, capsys):
    _measured(monkeypatch, GOOD)
    assert pf.main(["--profile", "cpu", "--kinds", "math"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["kind", "id", "verdict", "ours", "floor"] and set(lines[1]) <= {"-", " "}
    assert [line.split()[1] for line in lines[2:2 + len(pf.PRECONDITIONS)]] == list(pf.PRECONDITIONS)
    legend = lines[lines.index("what the ids mean (docs/preflight.md#p1-the-preconditions):") + 1:]
    assert all(any(line.split(None, 1) == [pid, text] for line in legend) for pid, text in pf.MEANING.items())


def test_a_preflight_does_not_touch_the_committed_measurement_unless_recorded(roots, monkeypatch, capsys):
    _measured(monkeypatch, GOOD)
    assert pf.main(["--profile", "cpu", "--kinds", "math"]) == 0
    assert (roots / "reports" / "preflight" / "cpu.json").exists() and (roots / "reports" / "preflight" / "cpu.png").exists()
    assert not (roots / "results").exists() and not (roots / "figures").exists()
    assert "results/preflight/ is untouched" in capsys.readouterr().out
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--record"]) == 0
    assert (roots / "results" / "preflight" / "cpu.json").exists() and (roots / "figures" / "preflight" / "cpu.png").exists()
    assert "recorded: wrote" in capsys.readouterr().out


@pytest.mark.parametrize(("profile", "extra", "status", "said"), [
    ("cpu", [], 2, "NOT ACTIONABLE: math G2. `make reproduce PROFILE=cpu` would skip the notebooks on that kind's base"),
    ("smoke", [], 0, "not actionable: math G2. Expected on the smoke profile"),
    ("smoke", ["--strict"], 2, "NOT ACTIONABLE: math G2."),
])
def test_not_actionable_exits_2_where_the_profile_enforces_it(roots, monkeypatch, capsys, profile, extra, status, said):
    _measured(monkeypatch, {**GOOD, "G2": 0.0})
    assert pf.main(["--profile", profile, "--kinds", "math", *extra]) == status
    out = capsys.readouterr().out
    assert said in out and out.rstrip().endswith(f"Exit {status}." if status == 2 else "Exit 0 (--strict: 2).")


def test_bad_options_exit_1_not_2(capsys):
    with pytest.raises(SystemExit) as stop:
        pf.main(["--profile", "gpu"])
    assert stop.value.code == 1 and "invalid choice: 'gpu'" in capsys.readouterr().err


def test_errors_are_one_line_and_exit_1(roots, monkeypatch, capsys):
    def bad(argv):
        raise ConfigError("PREFLIGHT_KINDS = 'maths': valid kinds: ['math', 'qa']")

    assert preflight_cli.guarded(bad) == 1
    assert capsys.readouterr().err == "preflight: error: PREFLIGHT_KINDS = 'maths': valid kinds: ['math', 'qa']\n"

    def crash(argv):
        raise RuntimeError("out of memory")

    assert preflight_cli.guarded(crash) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("preflight: crashed: RuntimeError: out of memory (traceback in ")
    assert "RuntimeError: out of memory" in (roots / "reports" / "preflight" / "error.txt").read_text()


def test_a_bad_kind_from_the_command_line_is_one_line():
    """End to end through `python -m copes_lib.protocols.testbed.preflight` (what `make preflight` runs)."""
    done = subprocess.run([sys.executable, "-m", "copes_lib.protocols.testbed.preflight", "--profile", "smoke", "--kinds",
                           "maths"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("preflight: error: "), done.stderr
    assert "maths" in done.stderr and "Traceback" not in done.stderr + done.stdout


def test_make_preflight_passes_record_and_strict():
    def dry(*args):
        return subprocess.run(["make", "-n", "preflight", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout

    assert "--record" not in dry() and "--strict" not in dry("PROFILE=smoke")
    assert "--record" in dry("RECORD=1") and "--strict" in dry("STRICT=1")
    assert "--jobs 2" in dry("PROFILE=cpu") and "--jobs 3" in dry("JOBS=3")


def test_jobs_measure_each_pair_in_its_own_process_then_tabulate_them_together(roots, monkeypatch, capsys):
    _measured(monkeypatch, GOOD)
    commands, real_run = [], subprocess.run

    def fake_run(command, **kw):
        if "copes_lib.protocols.testbed.preflight" not in command:  # git state and the like
            return real_run(command, **kw)
        commands.append(command)
        stdout = kw["stdout"]
        stdout.write(f"measured {command}\n")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert pf.main(["--profile", "cpu", "--kinds", "math,qa", "--seeds", "0,1", "--jobs", "2"]) == 0
    pairs = sorted((c[c.index("--kinds") + 1], c[c.index("--seeds") + 1]) for c in commands)
    assert pairs == [("math", "0"), ("math", "1"), ("qa", "0"), ("qa", "1")]
    assert all(c[:3] == [sys.executable, "-m", "copes_lib.protocols.testbed.preflight"] and "--measure-only" in c
               for c in commands)
    out = capsys.readouterr().out
    assert "measuring 4 (kind, seed) pairs, 2 at a time" in out and "qa seed 1: measured" in out
    assert "math seed 1" in runs.read_json(roots / "reports" / "preflight" / "cpu.json")["kinds"]
    assert (roots / "reports" / "preflight" / "logs" / "cpu_qa_seed1.log").read_text().startswith("measured")


def test_a_failed_worker_is_one_line_naming_its_pair_and_log(roots, monkeypatch, capsys):
    _measured(monkeypatch, GOOD)
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: subprocess.CompletedProcess(command, 1)
                        if "copes_lib.protocols.testbed.preflight" in command else real_run(command, **kw))
    assert preflight_cli.guarded(pf.main, ["--profile", "cpu", "--kinds", "math", "--seeds", "0,1", "--jobs", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "math seed 0 failed (exit 1)" in err[0] and "cpu_math_seed0.log" in err[0]


def test_a_measure_only_worker_writes_no_table_and_no_file(roots, monkeypatch, capsys):
    _measured(monkeypatch, GOOD)
    import copes_lib.substrate

    watched = []
    monkeypatch.setattr(copes_lib.substrate, "exit_with_parent", lambda: watched.append(True))
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "1", "--measure-only"]) == 0
    assert "kind" not in capsys.readouterr().out and not (roots / "reports" / "preflight" / "cpu.json").exists()
    assert watched == [True]  # a worker ends with the process that started it


def test_a_worker_ends_when_the_process_that_started_it_is_killed(tmp_path):
    """exit_with_parent: the grandchild (a worker) notices its parent's death and exits instead of working on."""
    import os
    import signal
    import time

    flag = tmp_path / "worker.pid"
    worker = ("import os, time; from copes_lib.substrate import exit_with_parent; exit_with_parent(); "
              f"open({str(flag)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(600)"], cwd=REPO_ROOT)
    for _ in range(3000):  # the worker has started once it wrote its pid (importing torch may be slow under load)
        if flag.exists() and flag.read_text():
            break
        time.sleep(0.1)
    pid = int(flag.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(3000):  # it polls every 2 s
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:  # reap it if it became our child (it does not: it is re-parented to init), or just wait
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the worker outlived the process that started it")


def test_jobs_below_one_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as stop:
        pf.main(["--profile", "cpu", "--jobs", "0"])
    assert stop.value.code == 1 and "--jobs 0: an integer >= 1 expected" in capsys.readouterr().err


def _counting(monkeypatch, values):
    measured = []

    def fake(profile, kind, *a, warm_seed=0, **kw):
        measured.append((kind, warm_seed))
        return {**_fake_report(values), "warm_seed": warm_seed}

    monkeypatch.setattr(pf, "run_preflight", fake)
    return measured


def test_recording_is_resumable_seed_by_seed(roots, monkeypatch, capsys):
    measured = _counting(monkeypatch, GOOD)
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "1", "--record"]) == 0
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "1,2", "--record"]) == 0
    assert measured == [("math", 1), ("math", 2)]  # seed 1 was recorded: not measured again
    assert "already recorded in cpu.json for this recipe, not measured again: math seed 1" in capsys.readouterr().out
    record = runs.read_json(roots / "results" / "preflight" / "cpu.json")
    assert sorted(record["kinds"]) == ["math seed 1", "math seed 2"] and record["seeds"] == [1, 2]
    assert all(e["recorded_utc"] and e["groups"]["protocol_rate"] for e in record["kinds"].values())
    assert {"recipe", "settings", "criterion"} <= set(record)
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "1", "--record", "--force"]) == 0
    assert measured[-1] == ("math", 1)


def test_recording_over_another_recipes_record_is_a_one_line_error(roots, monkeypatch, capsys):
    _counting(monkeypatch, GOOD)
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "1", "--record"]) == 0
    path = roots / "results" / "preflight" / "cpu.json"
    record = runs.read_json(path)
    record["recipe"]["latent_math_steps"] += 1
    record["settings"]["calibration_batches"] += 1
    runs.atomic_write_json(path, record)
    capsys.readouterr()
    assert preflight_cli.guarded(pf.main, ["--profile", "cpu", "--kinds", "math", "--seeds", "2", "--record"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records another check" in err[0]
    assert "recipe.latent_math_steps" in err[0] and "settings.calibration_batches" in err[0]
    assert runs.read_json(path) == record  # untouched


def test_a_recipe_overlay_records_into_its_own_file(roots, monkeypatch, capsys):
    _counting(monkeypatch, GOOD)
    monkeypatch.setenv("COPES_RECIPE", "p8.10")
    assert pf.main(["--profile", "cpu", "--kinds", "math", "--seeds", "1", "--record"]) == 0
    record = runs.read_json(roots / "results" / "preflight" / "cpu-p8.10.json")
    assert record["recipe_name"] == "p8.10" and record["settings"]["calibration_batches"] == 4
    assert record["kinds"]["math seed 1"]["recorded_git"] == runs.git_state()["git_sha"]  # the code that measured it
    assert not (roots / "results" / "preflight" / "cpu.json").exists()
    assert (roots / "figures" / "preflight" / "cpu-p8.10.png").exists()
