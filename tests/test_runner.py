"""The suite runner on throwaway notebooks: it keeps going past a failure, records the failing cell,
exits non-zero, and --rerun-failed reruns only the failed notebook."""

import os
import subprocess

import nbformat
import pytest

from copes_lib import cli, config, runs, threads
from copes_lib.protocols import notebooks as registry


def _notebook(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell('PROFILE = "cpu"  # suite profile')
    params.metadata["tags"] = ["parameters"]
    log = nbformat.v4.new_code_cell(f'with open("ran.log", "a") as f:\n    f.write("{path.stem}\\n")')
    nb.cells = [params, log, *(nbformat.v4.new_code_cell(s) for s in sources)]
    nbformat.write(nb, path)


@pytest.fixture
def suite(tmp_path):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _notebook(notebooks / "01_first.ipynb", "x = 1 + 1")
    _notebook(notebooks / "02_broken.ipynb", "y = 2",
              'import pathlib\nif pathlib.Path("fail.flag").exists():\n    raise ValueError("deliberate failure")',
              "z = 3")
    _notebook(notebooks / "03_last.ipynb", "assert PROFILE == 'smoke', PROFILE")
    (notebooks / "fail.flag").touch()
    (notebooks / "README.md").write_text("not a notebook")
    return {"notebooks_dir": notebooks, "reports_dir": tmp_path / "reports", "results_root": tmp_path / "results",
            "figures_root": tmp_path / "figures"}


def _ran(suite):
    return (suite["notebooks_dir"] / "ran.log").read_text().split()


def test_runner_continues_records_failure_and_reruns_failed_only(suite, capsys):
    runs.atomic_write_json(suite["results_root"] / "smoke" / "01_first" / "summary.json",
                           {"profile": "smoke", "notebook": "01_first", "val_accuracy": 0.123456})
    figure = suite["figures_root"] / "smoke" / "01_curve.png"
    figure.parent.mkdir(parents=True)
    figure.write_bytes(b"\x89PNG")
    assert cli.run_suite("smoke", **suite) == 1
    assert _ran(suite) == ["01_first", "02_broken", "03_last"]  # kept going past 02
    reports = suite["reports_dir"]
    status = runs.read_json(reports / "status.json")
    records = status["notebooks"]
    assert {k: v["status"] for k, v in records.items()} == {"01_first": "ok", "02_broken": "failed", "03_last": "ok"}
    error = records["02_broken"]["error"]
    assert error["ename"] == "ValueError" and "deliberate failure" in error["evalue"]
    executed = nbformat.read(reports / "02_broken.ipynb", as_version=4)
    failing = [c for c in executed.cells if c.get("execution_count") == error["exec_count"]]
    assert len(failing) == 1 and "raise ValueError" in failing[0].source
    assert error["cell_source"] == "import pathlib" and error["cell_index"] >= 3
    assert records["03_last"]["parameters"] == {"PROFILE": "smoke"}
    assert all(records[nb]["duration_s"] > 0 for nb in records)
    for name in ("01_first.html", "02_broken.html", "03_last.html", "01_first.ipynb"):
        assert (reports / name).exists(), name
    index = (reports / "index.html").read_text()
    assert "deliberate failure" in index and 'href="02_broken.html"' in index
    assert "<td class='label'>validation accuracy</td><td class='num'>0.1235</td>" in index  # the key in words (report.plain_key)
    assert 'href="../figures/smoke/01_curve.png"' in index and 'src="../figures/smoke/01_curve.png"' in index
    assert 'href="../results/smoke/01_first/summary.json"' in index
    out = capsys.readouterr().out
    assert "[suite 2/3] 02_broken start" in out and "[suite 2/3] 02_broken failed in" in out
    assert "FAILED: 02_broken" in out

    first_started = records["01_first"]["started"]
    (suite["notebooks_dir"] / "fail.flag").unlink()
    assert cli.run_suite("smoke", rerun_failed=True, **suite) == 0
    assert _ran(suite) == ["01_first", "02_broken", "03_last", "02_broken"]  # only the failed one
    records = runs.read_json(reports / "status.json")["notebooks"]
    assert records["02_broken"]["status"] == "ok" and records["02_broken"]["error"] is None
    assert records["01_first"]["started"] == first_started  # untouched

    assert cli.run_suite("smoke", rerun_failed=True, **suite) == 0  # nothing failed: nothing runs
    assert len(_ran(suite)) == 4


def test_interrupted_notebook_counts_as_failed(suite):
    """A run killed mid-notebook leaves status "running"; --rerun-failed picks it up."""
    runs.atomic_write_json(suite["reports_dir"] / "status.json", {"notebooks": {
        "01_first": {"status": "ok"}, "02_broken": {"status": "ok"}, "03_last": {"status": "running"}}})
    assert cli.run_suite("smoke", rerun_failed=True, **suite) == 0
    assert _ran(suite) == ["03_last"]


def test_only_and_force(suite):
    (suite["notebooks_dir"] / "fail.flag").unlink()
    assert cli.run_suite("smoke", only="3", force=True, **suite) == 0
    assert _ran(suite) == ["03_last"]
    record = runs.read_json(suite["reports_dir"] / "status.json")["notebooks"]["03_last"]
    assert record["parameters"] == {"PROFILE": "smoke", "FORCE": True}
    with pytest.raises(config.ConfigError, match=r"no notebook matches \['07'\]"):
        cli.run_suite("smoke", only="03,07", **suite)


def test_bad_profile_fails_before_anything_runs(suite, tmp_path, monkeypatch, capsys):
    nb00 = suite["notebooks_dir"] / "00_suite_overview.ipynb"
    _notebook(nb00)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "smoke.yaml").write_text("00_suite_overview:\n  NOT_A_PARAM: 1\n")
    monkeypatch.setattr(config, "PROFILE_DIR", profiles)
    argv = ["run", "--profile", "smoke", "--notebooks-dir", str(suite["notebooks_dir"]),
            "--reports-dir", str(suite["reports_dir"])]
    assert cli.main(argv) == 2
    assert "00_suite_overview has unknown parameters ['NOT_A_PARAM']" in capsys.readouterr().err
    assert not (suite["notebooks_dir"] / "ran.log").exists()
    assert cli.main(["validate", "--profile", "smoke"]) == 2


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ([], "-m copes_lib.cli run --profile cpu --jobs 2\n"),
        (["PROFILE=smoke", "ONLY=02,03", "FORCE=1", "RERUN_FAILED=1", "JOBS=1"],
         "-m copes_lib.cli run --profile smoke --jobs 1 --only 02,03 --force --rerun-failed\n"),
        (["PROFILE=gpu", "FORCE=0", "RERUN_FAILED=no"], "-m copes_lib.cli run --profile gpu --jobs 1\n"),
        (["PART=paper-b", "UNCHECKED_BASES=1"], "-m copes_lib.cli run --profile cpu --jobs 2 --part paper-b --unchecked-bases\n"),
        (["PART=norm-curve", "UNCHECKED_BASES=0"], "-m copes_lib.cli run --profile cpu --jobs 2 --part norm-curve\n"),
    ],
)
def test_make_reproduce_passes_options(options, expected):
    """`make -n` prints the command without running it (nor building .venv)."""
    proc = subprocess.run(["make", "-n", "reproduce", *options], cwd=config.REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout, proc.stdout


def test_ci_entrypoint_runs_make_test():
    ci = config.REPO_ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK)
    text = ci.read_text()
    assert "set -euo pipefail" in text and "make test" in text


def test_parallel_runs_respect_needs_and_run_the_summary_last(tmp_path, capsys):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    stamp = 'import time, os\nwith open("order.log", "a") as f:\n    f.write(f"{time.time()} {THIS} {os.environ.get(\'OMP_NUM_THREADS\')}\\n")'
    for stem in ("01_a", "02_b", "10_c", "11_d", "99_sum"):
        _notebook(notebooks / f"{stem}.ipynb", f"THIS = {stem!r}", stamp)
    kwargs = {"notebooks_dir": notebooks, "reports_dir": tmp_path / "reports", "results_root": tmp_path / "r",
              "figures_root": tmp_path / "f"}
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ.pop("OMP_NUM_THREADS", None)
    try:
        assert cli.run_suite("smoke", jobs=2, **kwargs) == 0
        assert "OMP_NUM_THREADS" not in os.environ  # restored after the run
    finally:
        if env_before is not None:
            os.environ["OMP_NUM_THREADS"] = env_before
    rows = [line.split() for line in (notebooks / "order.log").read_text().splitlines()]
    order = [name for _, name, _ in sorted(rows, key=lambda r: float(r[0]))]
    assert order.index("01_a") < order.index("02_b") and order.index("10_c") < order.index("11_d")
    assert order[-1] == "99_sum"
    expected_threads = str(threads.N_FIXED)  # whatever JOBS and the core count
    assert {threads for _, name, threads in rows if name != "99_sum"} == {expected_threads}
    status = runs.read_json(tmp_path / "reports" / "status.json")["notebooks"]
    assert all(v["status"] == "ok" for v in status.values()) and len(status) == 5
    record = runs.read_json(tmp_path / "r" / "smoke" / "suite_run.json")  # a complete run leaves its provenance
    part = record["parts"][cli.OTHER_PART]  # notebooks no part names: the full run's last part
    assert part["jobs"] == 2 and set(part["notebooks"]) == set(status) == set(record["notebooks"]) and part["wall_s"] > 0
    assert part["threads_per_kernel"] == expected_threads and "git_sha" in part
    (tmp_path / "r" / "smoke" / "suite_run.json").unlink()
    assert cli.run_suite("smoke", only="01", jobs=2, **kwargs) == 0
    assert not (tmp_path / "r" / "smoke" / "suite_run.json").exists()  # a partial run is not a suite run
    with pytest.raises(config.ConfigError, match="jobs"):
        cli.run_suite("smoke", jobs=0, **kwargs)


def test_ready_notebooks_start_by_critical_path_with_costs_of_the_last_suite_run(tmp_path, monkeypatch):
    """Issue 32 item 4: with two jobs, the long chain (01 -> 04 -> 05 in the suite) starts before short
    notebooks that are ready at the same time; costs come from the last complete run."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    stamp = 'import time\nwith open("order.log", "a") as f:\n    f.write(f"{time.time()} {THIS}\\n")'
    for stem in ("01_a", "02_short", "03_long", "04_end"):
        _notebook(notebooks / f"{stem}.ipynb", f"THIS = {stem!r}", stamp)
    monkeypatch.setattr(cli, "NEEDS", {"01_a": (), "02_short": (), "03_long": (), "04_end": ("01_a", "02_short", "03_long")})
    kwargs = {"notebooks_dir": notebooks, "reports_dir": tmp_path / "reports", "results_root": tmp_path / "r",
              "figures_root": tmp_path / "f"}
    record = tmp_path / "r" / "smoke" / "suite_run.json"
    runs.atomic_write_json(record, {"notebooks": {"01_a": {"duration_s": 1.0}, "02_short": {"duration_s": 1.0},
                                                  "03_long": {"duration_s": 50.0}, "04_end": {"duration_s": 1.0}}})
    assert cli.critical_paths(cli.needs(sorted(notebooks.glob("*.ipynb"))), cli.notebook_costs("smoke", tmp_path / "r"))[
        "03_long"] > 50
    assert cli.run_suite("smoke", jobs=2, **kwargs) == 0
    rows = [line.split() for line in (notebooks / "order.log").read_text().splitlines()]
    order = [name for _, name in sorted(rows, key=lambda r: float(r[0]))]
    # number order would start 01 and 02; the critical path starts 03 (and 01) first; 04 (needs all) is last
    assert set(order[:2]) == {"01_a", "03_long"} and order[-1] == "04_end", order
    record.write_text("not json")  # an unreadable record: chain lengths only, still a valid order
    assert cli.notebook_costs("smoke", tmp_path / "r") == {}


def _base_suite(tmp_path, summary01=None):
    """Fake notebooks with the suite's own names (so the runner's NEEDS, parts and base kinds apply); the fake 01
    writes ``summary01`` as its summary, as the real one does at its end."""
    import json

    notebooks, results = tmp_path / "notebooks", tmp_path / "results"
    notebooks.mkdir()
    for stem in registry.NOTEBOOKS:
        body = ["x = 1"]
        if stem == cli.SUBSTRATE and summary01 is not None:
            target = results / "smoke" / stem / "summary.json"
            body = [f"import json, pathlib\np = pathlib.Path({str(target)!r})\np.parent.mkdir(parents=True, "
                    f"exist_ok=True)\np.write_text({json.dumps(summary01)!r})"]
        _notebook(notebooks / f"{stem}.ipynb", *body)
    return {"notebooks_dir": notebooks, "reports_dir": tmp_path / "reports", "results_root": results,
            "figures_root": tmp_path / "figures"}


MATH_NOTEBOOKS = ["02_standard_es", "03_copes", "04_grpo", "05_fixed_budget_math", "06_copes_ablations"]


def test_a_failed_math_preflight_skips_exactly_the_math_notebooks_and_paper_b_still_runs(tmp_path, capsys):
    """Issue 47 decision 3: 01's enforced preflight fails for math -> 02-06 skipped (not failures), 07 (QA), 00, 08
    and 99 run; the skip is said per notebook on the console, in status.json, suite_run.json and the index."""
    kwargs = _base_suite(tmp_path, {"preflight_enforced": True, "preflight_met": False, "preflight_math_met": False,
                                    "preflight_qa_met": True, "preflight_failed": ["math E1", "math E2"]})
    assert cli.run_suite("smoke", part="paper-a", jobs=2, **kwargs) == 0  # a skip is not a failure
    ran = _ran(kwargs)
    assert sorted(ran) == sorted(["00_suite_overview", cli.SUBSTRATE, "07_multihop_qa", "08_memory_and_gpu_hours",
                                  "99_summary"])
    assert ran[-1] == "99_summary"  # after everything, skipped ones included
    status = runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]
    for stem in MATH_NOTEBOOKS:
        assert status[stem]["status"] == "skipped" and "math base" in status[stem]["skipped"], stem
        assert "math E1" in status[stem]["skipped"]
    assert status["07_multihop_qa"]["status"] == "ok"
    out = capsys.readouterr().out
    assert sum(f"{stem} SKIPPED (not a failure)" in out for stem in MATH_NOTEBOOKS) == 5
    assert "SKIPPED by the base gate, not failures (5)" in out and "FAILED" not in out
    index = (kwargs["reports_dir"] / "index.html").read_text()
    assert index.count("class='skipped'") == 5 and "math E1" in index and "5 skipped" in index
    record = runs.read_json(kwargs["results_root"] / "smoke" / "suite_run.json")
    part = record["parts"]["paper-a"]
    assert set(part["notebooks"]) == set(registry.PARTS["paper-a"]) and part["wall_s"] > 0
    assert part["notebooks"]["03_copes"]["status"] == "skipped" and "math E1" in part["notebooks"]["03_copes"]["skipped"]
    assert {"git_sha", "git_dirty", "recipe", "started", "ended"} <= set(part)
    # paper B never waits on paper A's preflight; its record joins paper A's, which it keeps
    assert cli.run_suite("smoke", part="paper-b", jobs=2, **kwargs) == 0
    assert sorted(_ran(kwargs)[len(ran):]) == sorted([*registry.PARTS["paper-b"]])
    record = runs.read_json(kwargs["results_root"] / "smoke" / "suite_run.json")
    assert set(record["parts"]) == {"paper-a", "paper-b"} and record["parts"]["paper-a"] == part
    assert record["notebooks"]["03_copes"]["status"] == "skipped" and record["notebooks"]["12_molora_factorial"][
        "status"] == "ok"


@pytest.mark.parametrize(("summary01", "skipped"), [
    ({"preflight_enforced": True, "preflight_met": False, "preflight_math_met": True, "preflight_qa_met": False,
      "preflight_failed": ["qa R"]}, ["07_multihop_qa"]),
    ({"preflight_enforced": True, "preflight_met": True, "preflight_math_met": True, "preflight_qa_met": True}, []),
    ({"base_check_math": "not checked", "base_check_math_reason": "no check is recorded", "base_check_qa": "passed"},
     ["02_standard_es"]),
    ({"base_check_math": "unchecked", "base_check_qa": "unchecked", "preflight_enforced": False}, []),
])
def test_the_skip_follows_the_kind_01_closed(tmp_path, capsys, summary01, skipped):
    """QA's preflight failed -> 07 skipped, 02 runs; nothing failed -> nothing skipped; a kind 01 did not build
    (its 5-seed check) -> its notebooks skipped; built unchecked (the escape hatch) -> nothing skipped."""
    kwargs = _base_suite(tmp_path, summary01)
    assert cli.run_suite("smoke", only="01,02,07", **kwargs) == 0
    status = runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]
    assert sorted(s for s, r in status.items() if r["status"] == "skipped") == skipped
    assert sorted(_ran(kwargs)) == sorted({cli.SUBSTRATE, "02_standard_es", "07_multihop_qa"} - set(skipped))
    assert capsys.readouterr().out.count("SKIPPED (not a failure)") == len(skipped)


def test_a_closed_gate_skips_before_anything_runs_even_without_01(tmp_path, monkeypatch, capsys):
    """The gate is decided before the run (the recorded 5-seed check), so ONLY=02,03 does not train a math base whose
    check did not pass; the QA notebook and 08 run."""
    kwargs = _base_suite(tmp_path)
    gate = {"math": {"state": "not checked", "build": False, "reason": "no check is recorded",
                     "command": "make preflight KINDS=math"},
            "qa": {"state": "passed", "build": True, "reason": "checked", "command": "make preflight KINDS=qa"}}
    seen = []
    monkeypatch.setattr(cli, "substrate_gate", lambda profile, values: seen.append(values) or gate)
    assert registry.WITHOUT_BASE["08_memory_and_gpu_hours"] == ("math", {"ACCOUNT_ENGINE": "plain"})  # smoke's already
    monkeypatch.setitem(registry.WITHOUT_BASE, "08_memory_and_gpu_hours", ("math", {"ACCOUNT_GROUP": 3}))
    assert cli.run_suite("smoke", only="02,03,07,08", **kwargs) == 0
    assert sorted(_ran(kwargs)) == ["07_multihop_qa", "08_memory_and_gpu_hours"]
    status = runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]
    assert status["08_memory_and_gpu_hours"]["parameters"]["ACCOUNT_GROUP"] == 3  # runs without training the base
    assert "08_memory_and_gpu_hours runs with {'ACCOUNT_GROUP': 3}: the math base is closed" in capsys.readouterr().out
    assert "no check is recorded" in status["02_standard_es"]["skipped"]
    assert "make preflight KINDS=math" in status["02_standard_es"]["skipped"]
    assert not (kwargs["results_root"] / "smoke" / "suite_run.json").exists()  # ONLY is no part: not recorded
    assert cli.run_suite("smoke", only="99", unchecked_bases=True, **kwargs) == 0
    assert seen[-1]["UNCHECKED_BASES"] is True and "UNCHECKED_BASES" not in seen[0]


def test_parts_choose_their_notebooks_and_a_wrong_part_is_one_line_naming_the_valid_values(tmp_path):
    kwargs = _base_suite(tmp_path)
    with pytest.raises(config.ConfigError, match=r"PART = 'paper-c' is not a part of the suite; valid values: "
                       r"paper-a, paper-b, study, norm-curve"):
        cli.run_suite("smoke", part="paper-c", **kwargs)
    with pytest.raises(config.ConfigError, match="cannot be combined"):
        cli.run_suite("smoke", part="study", only="09", **kwargs)
    assert cli.run_suite("smoke", part="norm-curve", **kwargs) == 0
    assert _ran(kwargs) == ["06_copes_ablations", "99_summary"]
    status = runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]
    smoke_curve = registry.profile_params("smoke", "06_copes_ablations")["NORM_CURVE_SEEDS"]
    assert status["06_copes_ablations"]["parameters"]["NORM_CURVE_SEEDS"] == smoke_curve >= 1  # the profile's curve
    plan = dict(cli.part_plan(cli.discover_notebooks(kwargs["notebooks_dir"]), None))
    assert list(plan) == ["paper-a", "paper-b", "study", "norm-curve"]  # every part, in order; no 'other' here
    assert {p.stem for paths in plan.values() for p in paths} == set(registry.NOTEBOOKS)
    params = {stem: cli.notebook_parameters("smoke", stem, False, registry.PART_PARAMS["paper-a"].get(stem))
              for stem in ("06_copes_ablations",)}
    assert params["06_copes_ablations"]["NORM_CURVE_SEEDS"] == 0  # paper-a runs 06 without its curve


def test_every_notebook_is_in_a_part_and_paper_a_is_the_headline():
    assert {s for stems in registry.PARTS.values() for s in stems} == set(registry.NOTEBOOKS)
    assert registry.PARTS["paper-a"] == (*(s for s in registry.NOTEBOOKS if s < "09"), "99_summary")
    assert all(stems[-1] == "99_summary" for stems in registry.PARTS.values())
    assert set(registry.USES_BASE) == set(MATH_NOTEBOOKS) | {"07_multihop_qa"}
    assert [registry.base_kinds(s) for s in registry.USES_BASE] == [("math",)] * 5 + [("qa",)]


def test_needs_are_registered_notebooks_and_acyclic():
    stems = {p.stem for p in cli.discover_notebooks(config.REPO_ROOT / "notebooks")}
    assert set(cli.NEEDS) == stems == set(registry.NOTEBOOKS)
    for stem, wanted in cli.NEEDS.items():
        assert set(wanted) <= stems - {stem}, stem
        assert all(w < stem for w in wanted), f"{stem} needs a later notebook: {wanted}"  # number order = a topological order


def test_report_with_an_empty_summary_names_the_file(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    bad = results / "smoke" / "05_fixed_budget_math" / "summary.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("")
    monkeypatch.setattr(runs, "RESULTS_ROOT", results)
    monkeypatch.setattr(runs, "FIGURES_ROOT", tmp_path / "figures")
    monkeypatch.setattr(config, "REPO_ROOT", tmp_path)
    (tmp_path / "notebooks").mkdir()
    assert cli.main(["report", "--profile", "smoke"]) == 0  # the other files still render
    err = capsys.readouterr().err
    assert str(bad) in err and "JSONDecodeError" in err and "ONLY=05" in err
    assert "Traceback" not in err


def test_runner_survives_a_full_disk_and_names_the_file(suite, monkeypatch, capsys):
    import errno

    def fake_run_one(path, parameters, reports_dir, cwd, results_root=None, figures_root=None):
        return {"status": "ok", "started": "x", "ended": "y", "duration_s": 0.0, "error": None, "html": None,
                "executed": path.name, "parameters": parameters}

    real = runs.atomic_write_bytes

    def full_disk(path, data):
        if path.name in ("status.json", "index.html"):
            raise OSError(errno.ENOSPC, f"could not write {path}: {os.strerror(errno.ENOSPC)}", str(path))
        return real(path, data)

    monkeypatch.setattr(cli, "run_one", fake_run_one)
    monkeypatch.setattr(runs, "atomic_write_bytes", full_disk)
    code = cli.run_suite("smoke", only="01", **suite)
    err = capsys.readouterr().err
    assert code == 0
    assert f"could not write {suite['reports_dir'].resolve() / 'status.json'}" in err and "No space left" in err
    assert "index.html" in err


def test_an_unreadable_status_file_is_announced_and_kept(tmp_path, capsys):
    path = tmp_path / "status.json"
    path.write_text('{"notebooks": {')
    assert cli.load_status(path) == {"notebooks": {}}
    err = capsys.readouterr().err
    assert str(path) in err and (tmp_path / "status.json.unreadable").read_text() == '{"notebooks": {'


def test_an_empty_profile_is_an_error_naming_it(tmp_path, monkeypatch):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "smoke.yaml").write_text("")
    monkeypatch.setattr(config, "PROFILE_DIR", profiles)
    with pytest.raises(config.ConfigError, match=r"smoke\.yaml is empty"):
        config.load_profile("smoke")


def test_ci_installs_chromium_when_it_can_and_warns_when_it_cannot(tmp_path):
    text = (config.REPO_ROOT / ".ci" / "run").read_text()
    assert "apt-get -qq install -y --no-install-recommends" in text and "chromium" in text
    function = text[text.index("install_chromium() {"):text.index("\n}\n") + 3]
    bare = tmp_path / "bin"  # no chromium, no apt-get
    bare.mkdir()
    proc = subprocess.run(["/bin/bash", "-c", f"set -euo pipefail\n{function}\nPATH={bare}\ninstall_chromium\necho after"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.strip() == "after"
    assert "no apt-get" in proc.stderr and "browser test will skip" in proc.stderr


def test_only_with_no_notebook_named_is_an_error():
    """`make reproduce ONLY=,` ran nothing and exited 0 (issue 33)."""
    from pathlib import Path

    from copes_lib import cli, config

    notebooks = [Path("notebooks/00_environment.ipynb"), Path("notebooks/02_x.ipynb")]
    for only in (",", " , ,"):
        with pytest.raises(config.ConfigError, match="names no notebook"):
            cli.select(notebooks, only)
    assert cli.select(notebooks, "02") == [notebooks[1]]


# ----------------------------------------------------------------------------- one run per profile
_HOLDER = """
import sys
from copes_lib import cli
kwargs = dict(notebooks_dir=sys.argv[1], reports_dir=sys.argv[2], results_root=sys.argv[3], figures_root=sys.argv[4])
try:
    sys.exit(cli.run_suite("smoke", **kwargs))
except cli.Interrupted as exc:
    sys.exit(128 + exc.signum)
"""


def _slow_suite(tmp_path):
    """A suite whose one notebook stages a result in .partial/ (as runs.Run does), says it is running, and
    then waits for a flag file (at most 10 minutes), so that a test can stop or race it."""
    notebooks, results = tmp_path / "notebooks", tmp_path / "results"
    notebooks.mkdir()
    partial = results / "smoke" / "01_slow" / ".partial"
    _notebook(notebooks / "01_slow.ipynb",
              f"import pathlib, time\npathlib.Path({str(partial)!r}).mkdir(parents=True, exist_ok=True)\n"
              f"pathlib.Path({str(partial / 'metrics.jsonl')!r}).write_text('{{}}')\n"
              "pathlib.Path('started.flag').touch()\n"
              "for _ in range(6000):\n    if pathlib.Path('release.flag').exists():\n        break\n    time.sleep(0.1)")
    kwargs = {"notebooks_dir": notebooks, "reports_dir": tmp_path / "reports", "results_root": results,
              "figures_root": tmp_path / "figures"}
    return kwargs, partial


def _start_holder(kwargs):
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, *(str(kwargs[k]) for k in (
        "notebooks_dir", "reports_dir", "results_root", "figures_root"))], cwd=config.REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (kwargs["notebooks_dir"] / "started.flag").exists():  # the notebook is running
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    return proc


def test_a_second_run_of_the_profile_refuses_naming_the_holder_and_a_killed_one_blocks_nothing(tmp_path, capsys):
    import signal

    kwargs, partial = _slow_suite(tmp_path)
    holder = _start_holder(kwargs)
    try:
        with pytest.raises(cli.SuiteBusyError) as refused:
            cli.run_suite("smoke", **kwargs)
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and "started 20" in message
        assert "command: python" in message and "--wait" in message and str(kwargs["results_root"] / "smoke") in message
        status = runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]
        assert status["01_slow"]["status"] == "running"  # the refused run touched nothing
        assert partial.is_dir()
        (partial / "left_by_the_killed_run").touch()
    finally:
        holder.send_signal(signal.SIGKILL)  # killed: no handler runs, the kernel drops its lock
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    (kwargs["notebooks_dir"] / "release.flag").touch()  # the next run's notebook need not wait
    capsys.readouterr()
    assert cli.run_suite("smoke", **kwargs) == 0  # not blocked by the dead holder
    out = capsys.readouterr().out
    assert f"deleted {partial}" in out and "01_slow: status 'running' left by a run that was killed" in out
    assert runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]["01_slow"]["status"] == "ok"
    assert not (partial / "left_by_the_killed_run").exists()  # (this run's notebook staged its own again)
    assert (kwargs["results_root"] / "smoke" / cli.LOCK_NAME).read_text() == ""  # released: names nobody


def test_a_stopped_run_marks_its_notebooks_interrupted_and_frees_the_profile(tmp_path):
    import signal

    kwargs, _ = _slow_suite(tmp_path)
    holder = _start_holder(kwargs)
    holder.send_signal(signal.SIGTERM)
    out, err = holder.communicate()
    assert holder.returncode == 128 + signal.SIGTERM, (out, err)
    record = runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]["01_slow"]
    assert record["status"] == "interrupted" and "SIGTERM" in record["interrupted"]
    assert "01_slow marked interrupted" in err and "RERUN_FAILED=1" in err
    (kwargs["notebooks_dir"] / "release.flag").touch()
    assert cli.run_suite("smoke", rerun_failed=True, **kwargs) == 0  # interrupted counts as failed; lock free
    assert runs.read_json(kwargs["reports_dir"] / "status.json")["notebooks"]["01_slow"]["status"] == "ok"


def test_wait_queues_behind_the_holder(tmp_path, capsys):
    import threading

    kwargs, _ = _slow_suite(tmp_path)
    holder = _start_holder(kwargs)
    threading.Timer(3.0, (kwargs["notebooks_dir"] / "release.flag").touch).start()  # the holder ends
    try:
        assert cli.run_suite("smoke", wait=True, **kwargs) == 0
    finally:
        holder.wait()
    assert f"waiting for the run that holds {kwargs['results_root'] / 'smoke' / cli.LOCK_NAME} (pid {holder.pid}" in (
        capsys.readouterr().out)
    assert holder.returncode == 0


def test_the_console_shows_one_line_per_notebook_and_the_log_holds_the_rest(suite, capsys):
    _notebook(suite["notebooks_dir"] / "01_first.ipynb", "print('OUTPUT OF A CELL')")
    assert cli.run_suite("smoke", **suite) == 1
    out = capsys.readouterr().out
    assert "OUTPUT OF A CELL" not in out and "-- cell" not in out and "Executing notebook" not in out
    log = suite["reports_dir"] / "logs" / "02_broken.log"
    assert "[suite 2/3] 02_broken failed in" in out and f"full output: {log}" in out
    assert "deliberate failure" in log.read_text() and "OUTPUT OF A CELL" in (log.parent / "01_first.log").read_text()
    assert [line for line in out.splitlines() if "01_first" in line and not line.startswith("[suite]")] == [
        line for line in out.splitlines() if line.startswith("[suite 1/3] 01_first")]  # start and end only
    assert runs.read_json(suite["reports_dir"] / "status.json")["notebooks"]["02_broken"]["log"] == "logs/02_broken.log"
    assert cli.run_suite("smoke", only="01", verbose=True, **suite) == 0
    out = capsys.readouterr().out
    assert "OUTPUT OF A CELL" in out and "-- cell" in out


def test_a_notebook_that_runs_its_own_processes_takes_its_slots(tmp_path, monkeypatch, capsys):
    """01 builds its bases and preflights BUILD_JOBS at a time (copes_lib.protocols.notebooks.SLOTS): with JOBS=2 it
    holds both slots, so nothing starts beside it; with JOBS=1 it takes 1 and runs with BUILD_JOBS lowered to 1."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    stamp = 'import time\nwith open("order.log", "a") as f:\n    f.write(f"{time.time()} {THIS} {WHEN}\\n")'
    for stem in ("01_wide", "02_a", "03_b"):
        _notebook(notebooks / f"{stem}.ipynb", f"THIS, WHEN = {stem!r}, 'start'", stamp,
                  "BUILD_JOBS = globals().get('BUILD_JOBS', 0)\nwith open('build_jobs.log', 'a') as f:\n"
                  "    f.write(f'{THIS} {BUILD_JOBS}\\n')", "WHEN = 'end'", stamp)
    monkeypatch.setattr(cli, "NEEDS", {"01_wide": (), "02_a": (), "03_b": ()})
    monkeypatch.setitem(cli.SLOTS, "01_wide", "BUILD_JOBS")
    plain = cli.notebook_parameters
    monkeypatch.setattr(cli, "notebook_parameters", lambda profile, stem, force, extra=None: {
        **plain(profile, stem, force, extra), **({"BUILD_JOBS": 2} if stem == "01_wide" else {})})
    kwargs = {"notebooks_dir": notebooks, "reports_dir": tmp_path / "reports", "results_root": tmp_path / "r",
              "figures_root": tmp_path / "f"}
    assert cli.run_suite("smoke", jobs=2, **kwargs) == 0
    rows = [line.split() for line in (notebooks / "order.log").read_text().splitlines()]
    at = {(name, when): float(t) for t, name, when in rows}
    assert at[("01_wide", "start")] < at[("01_wide", "end")]  # 01 first (number order among equal paths) ...
    assert min(at[(s, "start")] for s in ("02_a", "03_b")) > at[("01_wide", "end")], rows  # ... and alone
    assert "01_wide 2" in (notebooks / "build_jobs.log").read_text().splitlines()
    (notebooks / "build_jobs.log").unlink()
    assert cli.run_suite("smoke", only="01", jobs=1, **kwargs) == 0
    assert (notebooks / "build_jobs.log").read_text().split() == ["01_wide", "1"]
    assert "01_wide: BUILD_JOBS 2 lowered to 1 (--jobs 1)" in capsys.readouterr().out


def test_slots_follow_01s_build_jobs_under_each_profile():
    assert cli.SLOTS == {"01_substrate_and_agent": "BUILD_JOBS"} and set(cli.SLOTS) <= set(registry.NOTEBOOKS)
    stem = "01_substrate_and_agent"
    cpu = {stem: cli.notebook_parameters("cpu", stem, False), "02_standard_es": {}}
    assert cli.notebook_slots(cpu, 2) == {stem: 2, "02_standard_es": 1}  # the dataclass default, 2
    assert cli.notebook_slots({stem: cli.notebook_parameters("smoke", stem, False)}, 2) == {stem: 1}  # smoke: 1
    assert cli.notebook_slots({stem: {"BUILD_JOBS": 4}}, 3) == {stem: 3}


def test_a_refused_run_leaves_the_holders_record_in_the_lock_file(tmp_path):
    """Issue 48: only the lock's holder writes its file; a refused run used to empty it on the way out, so
    the next refusal named nobody."""
    with cli.profile_lock("smoke", results_root=tmp_path) as path:
        record = path.read_text()
        assert str(os.getpid()) in record
        for _ in range(2):
            with pytest.raises(cli.SuiteBusyError, match=f"kill {os.getpid()}"):
                with cli.profile_lock("smoke", results_root=tmp_path):
                    pass
            assert path.read_text() == record
    assert path.read_text() == ""  # the holder empties it when it lets go


def test_kernel_connection_files_of_killed_kernels_are_deleted_live_ones_kept(tmp_path):
    """Issue 48: a killed run leaves its kernels' connection files (ports and signing keys); the next start
    deletes those no live process names, and keeps a live kernel's and a fresh one's."""
    import os
    import subprocess
    import time
    from pathlib import Path

    dead, live, fresh = (tmp_path / f"kernel-{n}.json" for n in ("dead", "live", "fresh"))
    for path in (dead, live, fresh):
        path.write_text("{}")
    old = time.time() - 3600
    os.utime(dead, (old, old))
    os.utime(live, (old, old))
    # a stand-in kernel naming its connection file on its command line (no Python: nothing of the test's
    # environment can make it exit early); the scan starts once the kernel's /proc entry shows the file
    holder = subprocess.Popen(["/bin/sh", "-c", "sleep 60; :", "sh", str(live)], env={"PATH": os.defpath},
                              start_new_session=True)  # "; :" keeps sh (and its command line) alive
    try:
        for _ in range(100):
            if str(live).encode() in Path(f"/proc/{holder.pid}/cmdline").read_bytes():
                break
            time.sleep(0.05)
        assert holder.poll() is None, "the stand-in kernel ended early"
        deleted = cli.stale_kernel_files(tmp_path)
    finally:
        os.killpg(holder.pid, 9)
        holder.wait()
    assert deleted == [dead] and not dead.exists() and live.exists() and fresh.exists()
    assert cli.stale_kernel_files(tmp_path / "absent") == []


def test_notebooks_run_at_once_start_in_their_folder_and_leave_the_runners_cwd_alone(tmp_path):
    """JOBS=2 runs two notebooks in threads; papermill's cwd= would os.chdir the whole process for each, and the two
    restores, out of order, left the process in a notebook folder (a fresh clone's random-order run found an xdist
    worker there). The kernels start in their folder; the runner's own cwd never moves."""
    import threading

    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        _notebook(folder / "01_where.ipynb", "import os, time\ntime.sleep(1.0)\nopen('cwd.txt', 'w').write(os.getcwd())")
    before = os.getcwd()
    records = {}
    threads_ = [threading.Thread(target=lambda f=f: records.update({f: cli.run_one(
        f / "01_where.ipynb", {"PROFILE": "smoke"}, f / "reports", cwd=f)})) for f in folders]
    for thread in threads_:
        thread.start()
    for thread in threads_:
        thread.join(120)
    assert os.getcwd() == before
    for folder in folders:
        assert records[folder]["status"] == "ok", records[folder]
        assert (folder / "cwd.txt").read_text() == str(folder)
