"""The notebook contract (every committed notebook), and the suite's main integration test: the real
runner executes ALL notebooks under the smoke profile."""

import ast
import dataclasses
import json
import math
import re
import subprocess
import sys
import time

import nbformat
import papermill
import pytest

from copes_lib import runs
from copes_lib.config import REPO_ROOT
from copes_lib.protocols import notebooks as suite

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
FIRST_PARAMETERS = ["PROFILE", "SEED", "FORCE"]


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=lambda p: p.stem)
def notebook(request):
    return request.param, nbformat.read(request.param, as_version=4)


def _parameters_cells(nb):
    return [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks():
    assert (NOTEBOOKS_DIR / "00_suite_overview.ipynb") in NOTEBOOKS


def test_committed_without_outputs(notebook):
    path, nb = notebook
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernel must be python3"
    nbformat.validate(nb)


def test_opens_with_markdown_and_deviations(notebook):
    path, nb = notebook
    assert nb.cells[0].cell_type == "markdown", f"{path.name}: cell 1 must be markdown"
    assert "deviations from the paper" in nb.cells[0].source.lower(), f"{path.name}: no 'Deviations from the paper' box"


def test_one_parameters_cell_then_validation(notebook):
    path, nb = notebook
    tagged = _parameters_cells(nb)
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters'; exactly one is required"
    following = [c for c in nb.cells[tagged[0] + 1:] if c.cell_type == "code"]
    assert following, f"{path.name}: no cell after the parameters cell"
    call = f'load_params("{path.stem}", globals())'
    assert call in following[0].source, f"{path.name}: the cell after the parameters must call {call}"


# Notebooks narrate: a table or a figure is one call into copes_lib/protocols/, so no code cell (the parameters
# cell aside) runs past 40 lines (CONTRIBUTING.md, Notebooks).
CELL_LINES_MAX = 40


def test_code_cells_are_short(notebook):
    path, nb = notebook
    parameters = set(_parameters_cells(nb))
    long = [(i, len(c.source.splitlines())) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and i not in parameters and len(c.source.splitlines()) > CELL_LINES_MAX]
    assert not long, (f"{path.name}: code cells {long} (index, lines) exceed {CELL_LINES_MAX} lines: move the table or "
                      "figure they build into a copes_lib/protocols/ function and call it")


def test_notebook_states_its_cost_and_cites_no_tracker(notebook):
    # a reader deciding whether to run a notebook sees its measured cost first; prose cites files in the
    # repository, never the project's issue tracker (issue numbers mean nothing to a reader)
    path, nb = notebook
    intro = nb.cells[0]
    assert intro.cell_type == "markdown" and "**Cost**" in intro.source, f"{path.name}: the first cell states no **Cost**"
    cited = [(i, m.group(0)) for i, c in enumerate(nb.cells)
             for m in re.finditer(r"\b[Ii]ssues? \d+|\(issue\b|the issue's\b", c.source)]
    assert not cited, f"{path.name}: cells cite the issue tracker: {cited}"


def test_parameters_match_dataclass(notebook):
    """`papermill --help-notebook` lists every parameter with help text; defaults = the dataclass's."""
    path, _ = notebook
    assert path.stem in suite.NOTEBOOKS, f"{path.stem} is not registered in copes_lib.protocols.notebooks.NOTEBOOKS"
    fields = {f.name: f for f in dataclasses.fields(suite.params_class(path.stem))}
    _, nb = notebook
    source = nb.cells[_parameters_cells(nb)[0]].source
    for number, line in enumerate(source.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            assert line.count("=") == 1, (
                f"{path.name}: parameters line {number} {line!r} has {line.count('=')} '=' signs; papermill "
                "cannot parse a line with more than one (avoid '=', '>=', '<=' in the help text)"
            )
    inspected = papermill.inspect_notebook(str(path))
    names = list(inspected)
    assert names[:3] == FIRST_PARAMETERS, f"{path.name}: parameters must start with {FIRST_PARAMETERS}, got {names[:3]}"
    assert set(names) == set(fields), (
        f"{path.name}: parameters cell and dataclass differ: only in the cell {sorted(set(names) - set(fields))}, "
        f"only in the dataclass {sorted(set(fields) - set(names))}"
    )
    for name, info in inspected.items():
        assert name.isupper(), f"{path.name}: parameter {name} must be UPPER_CASE (load_params only sees those)"
        assert info["help"].strip(), f"{path.name}: parameter {name} has no '# help' comment"
        assert info["inferred_type_name"] != "None", f"{path.name}: parameter {name} has no type annotation"
        default = ast.literal_eval(info["default"])
        assert default == fields[name].default and type(default) is type(fields[name].default), (
            f"{path.name}: {name} = {default!r} in the parameters cell, but the dataclass default is "
            f"{fields[name].default!r}"
        )


def test_help_notebook_cli_lists_parameters():
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", "--help-notebook", str(NOTEBOOKS_DIR / "00_suite_overview.ipynb")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    for line in ("PROFILE: str (default \"cpu\")", "SEED: int (default 0)", "FORCE: bool (default False)"):
        assert line in proc.stdout, proc.stdout
    assert "suite profile" in proc.stdout


def _finite(value):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, (int, float)):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return False


ES_NOTEBOOKS = ("02_standard_es", "03_copes", "05_fixed_budget_math", "06_copes_ablations", "07_multihop_qa")


@pytest.mark.slow(cost=480)
def test_every_notebook_runs_under_smoke():
    """`make reproduce PROFILE=smoke`, in effect: every notebook succeeds and writes a finite summary.

    No wall-clock limit (a busy machine makes the run slow, not wrong): the work is bounded by the smoke
    profile, and each notebook's duration is printed (pytest -rP shows it). ``--wait`` queues behind a
    `make reproduce PROFILE=smoke` already running instead of failing on its lock."""
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "copes_lib.cli", "run", "--profile", "smoke", "--wait"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    reports = runs.REPORTS_ROOT / "smoke"  # the session's temporary root (tests/conftest.py), not the checkout
    status = json.loads((reports / "status.json").read_text()) if (reports / "status.json").exists() else {}
    records = status.get("notebooks", {})
    print(f"smoke suite: {time.time() - started:.0f} s wall; per notebook (s):")
    for stem, record in sorted(records.items()):
        print(f"  {stem:28s} {record.get('status', '?'):12s} {record.get('duration_s', float('nan')):8.1f}")
    failures = {p.stem: records.get(p.stem, {}).get("error") for p in NOTEBOOKS
                if records.get(p.stem, {}).get("status") != "ok"}
    output = proc.stdout + proc.stderr
    suite_lines = "\n".join(line for line in output.splitlines() if line.startswith("[suite"))
    assert proc.returncode == 0 and not failures, (
        f"failed notebooks: {json.dumps(failures, indent=1)}\n--- runner progress ---\n{suite_lines}\n"
        f"--- runner output (tail) ---\n{output[-3000:]}\n(executed notebooks and HTML: {reports})"
    )
    for path in NOTEBOOKS:
        assert records.get(path.stem, {}).get("status") == "ok", f"{path.stem} was not run"
        summary_path = runs.RESULTS_ROOT / "smoke" / path.stem / "summary.json"
        assert summary_path.exists(), f"{path.stem} wrote no {summary_path}"
        assert summary_path.stat().st_mtime >= started - 1, f"{summary_path} is stale (not written by this run)"
        summary = json.loads(summary_path.read_text())
        assert summary.get("profile") == "smoke" and summary.get("notebook") == path.stem, summary_path
        bad = {k: v for k, v in summary.items() if not _finite(v)}
        assert not bad, f"{path.stem}: non-finite or nested summary values {bad}"
        assert (reports / f"{path.stem}.html").exists(), f"no HTML report for {path.stem}"
    index = reports / "index.html"
    assert index.exists() and index.stat().st_mtime >= started - 1
    assert all(p.stem in index.read_text() for p in NOTEBOOKS)
    # The smoke substrate must move: every ES-family notebook makes non-zero updates at most steps.
    for stem in ES_NOTEBOOKS:
        rows = [json.loads(line) for line in (runs.RESULTS_ROOT / "smoke" / stem / "metrics.jsonl").read_text()
                .splitlines() if line.strip()]
        norms = [row["es/update_norm"] for row in rows if "es/update_norm" in row]
        assert norms and sum(n > 0 for n in norms) > len(norms) / 2, f"{stem}: ES update norms under smoke {norms}"
