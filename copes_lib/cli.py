"""Command line of the suite: run the notebooks under a profile, or validate a profile.

    python -m copes_lib.cli run --profile cpu [--part paper-a | --only 02,03] [--force] [--rerun-failed] [--jobs 2]
                                [--verbose] [--wait] [--unchecked-bases]
    python -m copes_lib.cli validate --profile smoke
    python -m copes_lib.cli report --profile cpu      # render reports/<profile>/ from the results there, run nothing
    python -m copes_lib.cli merge-runs --profile cpu ../clone-b   # parts run in other clones into suite_run.json

``run`` validates the profile's parameters for every selected notebook before anything runs, then
executes each ``notebooks/NN_*.ipynb`` with papermill (kernel ``python3``, working directory
``notebooks/``, parameters = the profile's section + ``PROFILE`` (+ ``FORCE``)).

Parts (:data:`PARTS`, issue 47 decision 1): ``--part paper-a|paper-b|study|norm-curve`` runs one; without
``--part`` or ``--only`` every part runs, one after another (so that each part's wall time is its own), and each
part's run is recorded in ``results/<profile>/suite_run.json`` (:func:`record_suite_run`). ``--only`` runs the
named notebooks, outside any part, and records nothing there.

The base gate (issue 47 decision 3, :mod:`copes_lib.protocols.testbed.base_gate`): before anything runs, the runner asks
which of notebook 01's bases the run may use (the recorded 5-seed check of the run's recipe, on a profile that
enforces the preflight); once 01 has run, its summary adds the kinds whose own preflight failed. A notebook that
trains on a closed kind's base (:func:`copes_lib.protocols.notebooks.base_kinds`: 02-06 math, 07 QA) is not run:
its status is ``skipped`` with the reason, in ``status.json``, one console line, the part's record and the HTML
index. Everything else runs (00, 08, 09, paper B, and 99, which tabulates what exists). A skip is not a failure:
it leaves the exit status alone.

Order: a notebook starts once the notebooks it reads from have finished (:data:`NEEDS`; an
unregistered notebook waits for every lower-numbered one); of the notebooks ready at once, the one with
the longest critical path starts first (:func:`critical_paths`: its own cost plus the longest chain of
notebooks waiting on it, costs from the profile's last complete run, ``suite_run.json``), so that with
``--jobs 2`` the long chain 01 -> 04 -> 05 is not queued behind short notebooks. ``--jobs N`` runs up
to N notebooks at once; a notebook that runs processes of its own (:data:`SLOTS`: 01 builds its bases and
preflights ``BUILD_JOBS`` at a time) takes that many of the N slots, at most N, and nothing overtakes it while it
waits for them; every kernel gets ``threads.N_FIXED`` threads whatever N, the core count or
``OMP_NUM_THREADS`` (numbers must not depend on the machine); ``--jobs 1`` is one notebook after
another in number order. Executed notebooks
and their HTML land in ``reports/<profile>/``; a failing notebook does not stop the others. Each
notebook's status, duration and failing cell go to ``reports/<profile>/status.json`` (written
atomically after every notebook), and ``reports/<profile>/index.html`` links everything. The exit
status is 1 if any notebook failed, else 0 (skipped notebooks included: the last lines name them and why).

Console: one line when a notebook starts and one when it ends (status, duration); each notebook's full
output (papermill's log of its cells) goes to ``reports/<profile>/logs/<NN_topic>.log``, whose path is
printed when the notebook fails; ``--verbose`` (``make reproduce VERBOSE=1``) also streams it to the console.

One run per profile: ``run`` holds an exclusive lock on ``results/<profile>/.suite.lock`` (``fcntl.flock``;
the kernel releases it when the holder exits or is killed, so a killed run never blocks the next one). A
second run of the same profile refuses at once, naming the holder (pid, start time, command), or with
``--wait`` (``WAIT=1``) waits for it. Holding the lock, a run first tidies what a killed run left: its
``.partial/`` folders (results and figures) are deleted and a notebook that ``status.json`` still calls
``running`` is marked ``interrupted``. A run stopped by Ctrl-C or SIGTERM marks its running notebooks
``interrupted`` before it exits, so ``status.json`` never says ``running`` for a run that is over.

Statuses: ``ok``, ``failed``, ``interrupted`` (the run stopped while the notebook ran; ``--rerun-failed``
treats it as failed, and ``running`` too, which only a run in progress shows), ``skipped`` (the base gate; not
rerun by ``--rerun-failed``: a plain run decides again).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import json
import logging
import os
import queue
import shutil
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from copes_lib import cli_args

if __name__ == "__main__":  # an unknown profile or notebook answers in one line before the heavy imports below
    cli_args.exit_on_bad_arguments(sys.argv[1:])

from copes_lib import claims, config, report, runs, threads  # noqa: E402
from copes_lib.cli_args import NOTEBOOK_PATTERN, discover_notebooks, select  # noqa: E402,F401 (cli.select etc.)
from copes_lib.protocols import notebooks as suite  # noqa: E402
from copes_lib.protocols.testbed import base_gate  # noqa: E402

# What each notebook reads from the others: suite.NEEDS (copes_lib/protocols/notebooks.py).
NEEDS = suite.NEEDS
# Notebooks that run processes of their own and the parameter that says how many: suite.SLOTS.
SLOTS = suite.SLOTS

# The suite's parts and the parameters a part sets: suite.PARTS, suite.PART_PARAMS (copes_lib/protocols/notebooks.py).
PARTS = suite.PARTS
PART_PARAMS = suite.PART_PARAMS
OTHER_PART = "other"  # a full run's last part: discovered notebooks no part names (unregistered ones)
SUBSTRATE = "01_substrate_and_agent"  # builds the bases; its summary says which kinds it did not build

# what --rerun-failed reruns: a failure, or a notebook a stopped run left unfinished
UNFINISHED = ("failed", "interrupted", "running")
LOCK_NAME = ".suite.lock"  # in results/<profile>/: one run of the suite per profile at a time
LOG_DIR = "logs"  # in reports/<profile>/: each notebook's full output

KERNEL = "python3"


def substrate_gate(profile: str, parameters01: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Notebook 01's gate per kind under ``profile`` with the parameters the run injects into 01
    (:func:`copes_lib.protocols.testbed.base_gate.decide_for`): which bases 01 builds, and why not."""
    params = config.build(suite.params_class(SUBSTRATE), {**parameters01, "PROFILE": profile},
                          source=f"parameters of {SUBSTRATE}")
    return base_gate.decide_for(params)


def closed_after(profile: str, stem: str, record: dict[str, Any],
                 results_root: Path | str | None = None) -> dict[str, str]:
    """The kinds whose notebooks must be skipped once ``stem`` has run: for 01, when it ended ``ok``, the kinds it
    did not build or whose enforced preflight failed (:func:`copes_lib.protocols.testbed.base_gate.closed_kinds` on the
    summary it just wrote), each with the reason; {} otherwise (a failed 01 wrote no new summary)."""
    if stem != SUBSTRATE or record.get("status") != "ok":
        return {}
    path = Path(results_root or runs.RESULTS_ROOT) / profile / stem / "summary.json"
    try:
        return base_gate.closed_kinds(runs.read_json(path))
    except (OSError, ValueError):
        return {}


def needs(notebooks: list[Path]) -> dict[str, set[str]]:
    """For each selected notebook, the selected notebooks that must finish before it starts.

    >>> names = ["02_standard_es", "05_fixed_budget_math", "10_molora_substrate", "41_unregistered", "99_summary"]
    >>> {k: sorted(v) for k, v in needs([Path(n + ".ipynb") for n in names]).items()}  # doctest: +NORMALIZE_WHITESPACE
    {'02_standard_es': [], '05_fixed_budget_math': ['02_standard_es'], '10_molora_substrate': [],
     '41_unregistered': ['02_standard_es', '05_fixed_budget_math', '10_molora_substrate'],
     '99_summary': ['02_standard_es', '05_fixed_budget_math', '10_molora_substrate']}
    """
    stems = [p.stem for p in sorted(notebooks)]
    out = {}
    for i, stem in enumerate(stems):
        wanted = NEEDS.get(stem, stems[:i])
        out[stem] = {s for s in wanted if s in stems}  # a need outside the selection: its cached work
    return out


def notebook_costs(profile: str, results_root: str | Path | None = None) -> dict[str, float]:
    """Seconds each notebook took in the profile's last complete run (``suite_run.json``); empty when
    there is none or it cannot be read (the order then falls back to chain lengths)."""
    path = Path(results_root or runs.RESULTS_ROOT) / profile / "suite_run.json"
    try:
        record = runs.read_json(path)
        return {stem: float(row["duration_s"]) for stem, row in record.get("notebooks", {}).items()
                if isinstance(row, dict) and isinstance(row.get("duration_s"), (int, float))}
    except (OSError, ValueError, runs.UnreadableFileError):
        return {}


def critical_paths(waiting: dict[str, set[str]], costs: dict[str, float]) -> dict[str, float]:
    """Each notebook's cost plus the costliest chain of notebooks that wait on it (unknown costs: the
    median of the known ones, or 1). The runner starts the ready notebook with the longest first.

    >>> waiting = {"01": set(), "02": {"01"}, "03": {"02"}, "04": {"01"}, "05": {"03", "04"}, "13": set()}
    >>> paths = critical_paths(waiting, {"01": 30, "02": 5, "03": 5, "04": 12, "05": 17, "13": 2})
    >>> paths["01"], paths["04"], paths["02"], paths["13"]
    (59.0, 29.0, 27.0, 2.0)
    """
    known = sorted(costs[s] for s in waiting if s in costs)
    fallback = known[len(known) // 2] if known else 1.0
    later = {stem: [s for s, needed in waiting.items() if stem in needed] for stem in waiting}
    paths: dict[str, float] = {}

    def path(stem: str) -> float:
        if stem not in paths:
            paths[stem] = float(costs.get(stem, fallback)) + max((path(s) for s in later[stem]), default=0.0)
        return paths[stem]

    for stem in sorted(waiting):
        path(stem)
    return paths


def notebook_slots(parameters: dict[str, dict[str, Any]], jobs: int) -> dict[str, int]:
    """How many of the run's ``jobs`` slots each notebook takes: 1, or for a notebook of :data:`SLOTS` its
    parameter's value (injected, else the parameter class's default), at most ``jobs``. A value above ``jobs`` is
    lowered to ``jobs`` in ``parameters`` (so the notebook starts no more processes than the slots it holds) and
    said on the console (tests/test_runner.py)."""
    import dataclasses

    slots = {}
    for stem, values in parameters.items():
        name = SLOTS.get(stem)
        if name is None:
            slots[stem] = 1
            continue
        defaults = {f.name: f.default for f in dataclasses.fields(suite.params_class(stem))} \
            if stem in suite.NOTEBOOKS else {}
        wanted = int(values.get(name, defaults.get(name, 1)))
        if wanted > jobs:
            values[name] = jobs
            print(f"[suite] {stem}: {name} {wanted} lowered to {jobs} (--jobs {jobs}): a notebook runs no more "
                  "processes than the runner's slots", flush=True)
        slots[stem] = max(1, min(wanted, jobs))
    return slots


def notebook_parameters(profile: str, stem: str, force: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parameters injected into ``stem``, validated: the profile's section, then ``extra`` (a part's
    :data:`PART_PARAMS`, the run's ``UNCHECKED_BASES``). Unregistered notebooks get PROFILE only."""
    values: dict[str, Any] = {}
    if stem in suite.NOTEBOOKS:
        values = {**suite.profile_params(profile, stem), **(extra or {})}
        config.build(suite.params_class(stem), {**values, "PROFILE": profile},
                     source=f"parameters in profiles/{profile}.yaml")
    values["PROFILE"] = profile
    if force:
        values["FORCE"] = True
    return values


def load_status(path: Path) -> dict[str, Any]:
    """``status.json``, or a fresh one. An unreadable file (empty, truncated) or one of another layout is
    announced, kept beside as ``status.json.unreadable`` (never lost) and replaced by a fresh status."""
    if path.exists():
        try:
            data = runs.read_json(path)
            if isinstance(data, dict) and isinstance(data.get("notebooks"), dict):
                return data
            problem = "is not a status file of this layout"
        except (OSError, ValueError) as exc:
            problem = f"cannot be read ({exc})"
        kept = path.with_name(path.name + ".unreadable")
        try:
            os.replace(path, kept)
            where = f"kept as {kept}"
        except OSError as exc:
            where = f"could not be moved aside ({exc})"
        print(f"[suite] warning: {path} {problem}; starting a fresh status (the old file {where}; the "
              "notebooks' results are untouched, only their last run status is forgotten)", file=sys.stderr, flush=True)
    return {"notebooks": {}}


def _write_or_warn(write, path: Path, *args: Any) -> bool:
    """Write a runner file; a failure (a full disk) is reported with the file and the runner goes on: the
    notebooks' results are written (or kept) by their own runs, never by this file."""
    try:
        write(path, *args)
        return True
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        print(f"[suite] error: could not write {path} ({reason}); the run goes on without it. Free space and "
              f"rerun with --rerun-failed (or `python -m copes_lib.cli report`) to write it again.",
              file=sys.stderr, flush=True)
        return False


def _failure(exc: BaseException) -> dict[str, Any]:
    """What to record about a failed notebook; papermill's error names the failing cell."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        first_line = next((ln for ln in (exc.source or "").splitlines() if ln.strip()), "")
        return {"cell_index": exc.cell_index, "exec_count": exc.exec_count, "ename": exc.ename,
                "evalue": str(exc.evalue)[:2000], "cell_source": first_line[:200]}
    return {"cell_index": None, "exec_count": None, "ename": type(exc).__name__,
            "evalue": str(exc)[:2000] or "".join(traceback.format_exception_only(exc)).strip(),
            "cell_source": ""}


def export_html(executed: Path, html_path: Path, profile: str, record: dict[str, Any] | None = None,
                results_root: str | Path | None = None, figures_root: str | Path | None = None) -> None:
    """The reader's HTML of an executed notebook (claims, numbers and figures first; code hidden), atomically."""
    report.export_notebook_html(executed, html_path, profile, record=record, results_root=results_root,
                                figures_root=figures_root)


def render_reports(profile: str, reports_dir: str | Path | None = None, notebooks_dir: str | Path | None = None,
                   results_root: str | Path | None = None, figures_root: str | Path | None = None) -> Path:
    """Render the HTML of every executed notebook in ``reports/<profile>/`` and the index again, from
    what is there (after a change to the report layout, or to results written since): runs nothing."""
    reports_dir = Path(reports_dir or runs.REPORTS_ROOT / profile).resolve()
    notebooks_dir = Path(notebooks_dir or config.REPO_ROOT / "notebooks").resolve()
    status = load_status(reports_dir / "status.json")
    for stem, record in status["notebooks"].items():
        executed = reports_dir / f"{stem}.ipynb"
        if executed.exists():
            export_html(executed, executed.with_suffix(".html"), profile, record, results_root, figures_root)
    return report.render_index(profile, reports_dir, status, results_root=results_root, figures_root=figures_root,
                               notebooks=[p.stem for p in discover_notebooks(notebooks_dir)])


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class SuiteBusyError(RuntimeError):
    """Another run of the suite holds the profile's lock (the message names it and what to do)."""


@contextlib.contextmanager
def profile_lock(profile: str, results_root: str | Path | None = None, wait: bool = False):
    """Hold the exclusive lock of ``results/<profile>/`` (``fcntl.flock`` on :data:`LOCK_NAME`) for the
    duration: one run of the suite per profile. The kernel drops a flock when its holder exits, however it
    dies, so a killed run never blocks the next. Taken: :class:`SuiteBusyError` naming the holder, or with
    ``wait`` block until it is free. The file keeps the holder's pid, start time and command while held."""
    folder = Path(results_root or runs.RESULTS_ROOT) / profile
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # CLOEXEC: kernels never inherit it
    held = False  # only the holder writes the file: a refused run leaves the holder's record for the next
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = runs.lock_holder(path)
            if not wait:
                raise SuiteBusyError(
                    f"another run of the suite is using {folder}/ ({holder}). Two runs of one profile would "
                    f"write the same .partial/ folders, notebooks and status.json. Wait for it to end, stop it "
                    f"(kill {json.loads(path.read_text() or '{}').get('pid', '<pid>')}), or queue behind it "
                    "with --wait (make reproduce WAIT=1)") from None
            print(f"[suite] waiting for the run that holds {path} ({holder})", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        held = True
        runs.write_lock_holder(fd)
        yield path
    finally:
        if held:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # a lock file that names nobody: no run holds it
        os.close(fd)  # releases the lock (when held)


def tidy_after_killed_run(profile: str, status: dict[str, Any], results_root: str | Path | None = None,
                          figures_root: str | Path | None = None) -> list[str]:
    """With the profile's lock held (so no run of the suite is using them): delete the ``.partial/`` folders
    a killed run left in ``results/<profile>/*/`` and ``figures/<profile>/.partial/``, except those of a
    notebook another process runs now (its ``runs.notebook_lock`` is held: a notebook open in JupyterLab),
    mark the notebooks that ``status`` still calls ``running`` as ``interrupted``, and delete the kernel
    connection files no live process uses (:func:`stale_kernel_files`). Returns what was done, one line each."""
    done = []
    results = Path(results_root or runs.RESULTS_ROOT) / profile
    figures = Path(figures_root or runs.FIGURES_ROOT) / profile / ".partial"
    staged = [*((folder, folder.parent.name) for folder in sorted(results.glob("*/.partial"))),
              *((folder, folder.name) for folder in sorted(figures.glob("*")))]
    for folder, stem in staged:
        if not folder.is_dir():
            continue
        if runs.notebook_folder_in_use(results / stem):  # that notebook runs now, outside the suite (JupyterLab)
            done.append(f"kept {folder}: {stem} is being run by another process ({runs.notebook_lock(results / stem)})")
            continue
        shutil.rmtree(folder, ignore_errors=True)
        done.append(f"deleted {folder}, left by an interrupted run (its previous results are untouched)")
    with contextlib.suppress(OSError):  # the figures' staging folder goes once empty
        figures.rmdir()
    for stem, record in status.get("notebooks", {}).items():
        if record.get("status") == "running":
            record.update(status="interrupted", interrupted="the run was killed while this notebook ran")
            done.append(f"{stem}: status 'running' left by a run that was killed, now 'interrupted'")
    stale = stale_kernel_files()
    if stale:
        done.append(f"deleted {len(stale)} kernel connection file(s) no live process uses (left by killed kernels), "
                    f"in {stale[0].parent}")
    return done


def stale_kernel_files(runtime_dir: str | Path | None = None, *, min_age_s: float = 60.0) -> list[Path]:
    """Delete the Jupyter kernel connection files (``kernel-*.json`` in Jupyter's runtime folder) that no live
    process uses: a run killed with its kernels (SIGKILL, a crashed host) leaves them, each holding a kernel's
    ports and signing key. A file is kept when any process still names it on its command line (``-f <file>``:
    a kernel of JupyterLab or of another run) or when it is younger than ``min_age_s`` (a kernel starting now).
    Linux only (it reads ``/proc``); elsewhere nothing is deleted. Returns the files deleted."""
    import time

    proc = Path("/proc")
    if not proc.is_dir():
        return []
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = jupyter_runtime_dir()
    files = sorted(Path(runtime_dir).glob("kernel-*.json"))
    if not files:
        return []
    used = set()
    for cmdline in proc.glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            used.update(arg for arg in cmdline.read_bytes().decode(errors="replace").split("\0") if arg.endswith(".json"))
    deleted = []
    now = time.time()
    for path in files:
        with contextlib.suppress(OSError):
            if str(path) in used or any(arg.endswith(path.name) for arg in used) or now - path.stat().st_mtime < min_age_s:
                continue
            path.unlink()
            deleted.append(path)
    return deleted


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (Ctrl-C, SIGTERM); its running notebooks are marked interrupted."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM (and SIGHUP) raise :class:`Interrupted` in the main thread, as Ctrl-C does, so a stopped run
    can mark its notebooks before it exits; elsewhere (not the main thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def run_one(path: Path, parameters: dict[str, Any], reports_dir: Path, cwd: Path,
            results_root: str | Path | None = None, figures_root: str | Path | None = None) -> dict[str, Any]:
    """Execute one notebook with papermill; return its status record (never raises on notebook errors).
    Its cells' output (papermill's log) goes to ``reports_dir/logs/<stem>.log`` (record ``log``)."""
    import papermill

    executed = reports_dir / path.name
    log_path = reports_dir / LOG_DIR / f"{path.stem}.log"
    record: dict[str, Any] = {"status": "running", "started": _now(), "parameters": parameters,
                              "executed": executed.name, "html": None, "error": None,
                              "log": f"{LOG_DIR}/{log_path.name}"}
    for stale in (executed, executed.with_suffix(".html")):  # never show a previous run's output
        stale.unlink(missing_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        _CURRENT.log = log  # _NotebookLogs writes this thread's papermill records here
        try:
            papermill.execute_notebook(
                # the kernel starts in `cwd` (nbclient's resources path), and this process stays where it is:
                # papermill's own cwd= is an os.chdir of the whole process, which two notebooks run at once in
                # threads (JOBS=2) restore out of order, leaving the runner (or a test's worker) in a notebook
                # folder and a kernel started in the wrong one
                str(path), str(executed), parameters=parameters, kernel_name=KERNEL,
                resources={"metadata": {"path": str(cwd)}}, log_output=True, progress_bar=False,
                # the kernel process writes its own log (a warning per start about its local TCP sockets)
                # to our terminal; only its errors there, unless verbose
                extra_arguments=[] if getattr(_CURRENT, "verbose", False) else ["--IPKernelApp.log_level=ERROR"],
            )
            record["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - a failing notebook must not stop the suite
            record["status"] = "failed"
            record["error"] = _failure(exc)
            log.write(f"\n[suite] {path.stem} failed:\n{''.join(traceback.format_exception(exc))}")
        finally:
            _CURRENT.log = None
    record["duration_s"] = round(time.perf_counter() - t0, 2)
    record["ended"] = _now()
    if executed.exists():
        try:
            export_html(executed, executed.with_suffix(".html"), parameters["PROFILE"], record,
                        results_root, figures_root)
            record["html"] = executed.with_suffix(".html").name
        except Exception as exc:  # noqa: BLE001 - a report problem must not hide the run's status
            print(f"  (HTML export of {executed.name} to {executed.with_suffix('.html')} failed: "
                  f"{type(exc).__name__}: {exc})", flush=True)
    return record


def part_plan(discovered: list[Path], part: str | None) -> list[tuple[str, list[Path]]]:
    """The parts to run, in order, each with its discovered notebooks: ``part`` alone, or (None) every part of
    :data:`PARTS` and then :data:`OTHER_PART`, the discovered notebooks no part names (none in the suite itself;
    a folder of unregistered notebooks is one such part). A part none of whose notebooks is discovered is left out."""
    names = [part] if part else list(PARTS)
    plan = []
    for name in names:
        stems = suite.part_notebooks(name)  # an unknown name: a one-line error naming the valid values
        chosen = [p for p in discovered if p.stem in stems]
        if chosen:
            plan.append((name, chosen))
    if part is None:
        named = {stem for stems in PARTS.values() for stem in stems}
        other = [p for p in discovered if p.stem not in named]
        if other:
            plan.append((OTHER_PART, other))
    return plan


def run_suite(
    profile: str,
    only: str | None = None,
    force: bool = False,
    rerun_failed: bool = False,
    notebooks_dir: str | Path | None = None,
    reports_dir: str | Path | None = None,
    results_root: str | Path | None = None,
    figures_root: str | Path | None = None,
    jobs: int = 1,
    verbose: bool = False,
    wait: bool = False,
    part: str | None = None,
    unchecked_bases: bool = False,
) -> int:
    """Run the selected notebooks under ``profile``; return the exit status (1 if any failed; a notebook skipped by
    the base gate is not a failure).

    ``only`` names notebooks; else ``part`` (one of :data:`PARTS`) or, with neither, every part one after another,
    each recorded in ``suite_run.json`` (:func:`record_suite_run`). ``unchecked_bases``: 01 builds the bases whose
    check did not pass anyway (``UNCHECKED_BASES``), and nothing is skipped for it. Holds the profile's lock
    (:func:`profile_lock`; ``wait``: queue behind a run that holds it) from the first read of ``status.json`` to
    the index. ``verbose``: stream every notebook's output to the console too (it always goes to
    ``reports/<profile>/logs/``)."""
    if not isinstance(jobs, int) or jobs < 1:
        raise config.ConfigError(f"jobs = {jobs!r}: must be an integer >= 1 (notebooks run at once)")
    if only and part:
        raise config.ConfigError(f"PART = {part!r} and ONLY = {only!r} cannot be combined: a part is a set of "
                                 "notebooks; give one or the other")
    notebooks_dir = Path(notebooks_dir or config.REPO_ROOT / "notebooks").resolve()
    reports_dir = Path(reports_dir or runs.REPORTS_ROOT / profile).resolve()
    suite.load_profile(profile)  # unknown profile or unknown notebook sections fail here
    discovered = discover_notebooks(notebooks_dir)
    plan = [(None, select(discovered, only))] if only else part_plan(discovered, part)
    extra01 = {"UNCHECKED_BASES": True} if unchecked_bases else {}
    # Validate everything first, so a typo in a profile fails before an hour of work.
    parameters = {name: {p.stem: notebook_parameters(profile, p.stem, force, {
        **PART_PARAMS.get(name or "", {}).get(p.stem, {}), **(extra01 if p.stem == SUBSTRATE else {})})
        for p in notebooks} for name, notebooks in plan}
    slots = {name: notebook_slots(values, jobs) for name, values in parameters.items()}
    # which of 01's bases this run may use: decided before anything runs, whether or not 01 is selected, so that
    # `ONLY=02` never trains a base whose check did not pass either
    gate = substrate_gate(profile, notebook_parameters(profile, SUBSTRATE, force, extra01))
    closed = {kind: f"{g['state']}: {g['reason']} ({g['command'] if g['state'] == base_gate.NOT_CHECKED else 'rejected'})"
              for kind, g in gate.items() if not g["build"]}
    for values in parameters.values():
        for stem, (kind, instead) in suite.WITHOUT_BASE.items():
            changed = {k: v for k, v in instead.items() if stem in values and values[stem].get(k) != v}
            if kind in closed and changed:
                values[stem].update(changed)
                print(f"[suite] {stem} runs with {changed}: the {kind} base is closed ({closed[kind]})", flush=True)
    with profile_lock(profile, results_root, wait=wait), _signals_interrupt(), _papermill_logs(verbose):
        status_path = reports_dir / "status.json"
        status = load_status(status_path)
        tidied = tidy_after_killed_run(profile, status, results_root, figures_root)
        for line in tidied:
            print(f"[suite] {line}", flush=True)
        if tidied and status["notebooks"]:
            reports_dir.mkdir(parents=True, exist_ok=True)
            _write_or_warn(runs.atomic_write_json, status_path, status)
        for _, notebooks in plan:
            for p in notebooks:
                if p.stem not in suite.NOTEBOOKS:
                    print(f"[suite] warning: {p.stem} is not registered in copes_lib.protocols.notebooks.NOTEBOOKS; "
                          "its parameters are not validated here", flush=True)
        if unchecked_bases:
            print("[suite] UNCHECKED_BASES: 01 builds every base, checked or not; the claims on a base whose check did "
                  f"not pass read 'not checked'{'' if any(p.stem == SUBSTRATE for _, nbs in plan for p in nbs) else ' (01 is not in this run: its last summary decides which)'}",
                  flush=True)
        reports_dir.mkdir(parents=True, exist_ok=True)
        status.update(profile=profile, notebooks_dir=str(notebooks_dir))
        code = 0
        for name, notebooks in plan:
            if rerun_failed:
                previous = status["notebooks"]
                notebooks = [p for p in notebooks if previous.get(p.stem, {}).get("status") in UNFINISHED]
                if not notebooks:
                    print(f"[suite] --rerun-failed: no failed notebook{f' of part {name}' if name else ''} in "
                          f"{status_path}; nothing to run", flush=True)
                    continue
            if name and len(plan) > 1 or part:
                print(f"[suite] part {name}: {', '.join(p.stem for p in notebooks)}", flush=True)
            code = max(code, _run_locked(
                profile, notebooks, discovered, parameters[name], status, status_path, part=name, closed=closed,
                force=force, rerun_failed=rerun_failed, notebooks_dir=notebooks_dir, reports_dir=reports_dir,
                results_root=results_root, figures_root=figures_root, jobs=jobs, verbose=verbose, slots=slots[name]))
        return code


def _skip_record(reason: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """status.json's record of a notebook skipped by the base gate (not a failure: nothing ran)."""
    now = _now()
    return {"status": "skipped", "skipped": reason, "started": now, "ended": now, "duration_s": 0.0,
            "parameters": parameters, "executed": None, "html": None, "error": None, "log": None}


def _run_locked(profile: str, notebooks: list[Path], discovered: list[Path],
                parameters: dict[str, dict[str, Any]], status: dict[str, Any], status_path: Path, *,
                part: str | None, closed: dict[str, str], force: bool, rerun_failed: bool, notebooks_dir: Path,
                reports_dir: Path, results_root: str | Path | None, figures_root: str | Path | None, jobs: int,
                verbose: bool = False, slots: dict[str, int] | None = None) -> int:
    """The body of :func:`run_suite` for one part (``part`` None: an ``--only`` selection), with the profile's
    lock held. ``closed``: the kinds of 01's base this run may not use, with the reason (more are added when 01
    runs and its summary closes them). ``slots``: how many of the ``jobs`` slots each notebook takes
    (:func:`notebook_slots`; 1 when not given)."""
    slots = slots or {}
    closed = dict(closed)
    total = len(notebooks)
    suite_t0, suite_started, code = time.perf_counter(), _now(), runs.git_state()
    lock = threading.Lock()
    started = [0]
    skipped: dict[str, str] = {}

    def run_notebook(path: Path) -> None:
        with lock:
            started[0] += 1
            tag = f"[suite {started[0]}/{total}] {path.stem}"
            print(f"{tag} start ({profile})", flush=True)
            status["notebooks"][path.stem] = {"status": "running", "started": _now()}
            _write_or_warn(runs.atomic_write_json, status_path, status)
        _CURRENT.stem = path.stem if jobs > 1 else None
        _CURRENT.verbose = verbose
        record = run_one(path, parameters[path.stem], reports_dir, cwd=notebooks_dir, results_root=results_root,
                         figures_root=figures_root)
        with lock:
            status["notebooks"][path.stem] = record
            status["updated"] = _now()
            _write_or_warn(runs.atomic_write_json, status_path, status)
            line = f"{tag} {record['status']} in {record['duration_s']:.1f}s"
            if record["error"]:
                err = record["error"]
                first = err["evalue"].splitlines()[0][:200] if err["evalue"] else ""
                line += f" (cell {err['cell_index']}, In [{err['exec_count']}]: {err['ename']}: {first})"
                if record.get("log"):
                    line += f"; full output: {reports_dir / record['log']}"
            print(line, flush=True)

    def skip_closed() -> None:
        """Take the pending notebooks on a closed kind out of the run, each recorded and said in one line."""
        for path in list(pending):
            kinds = [k for k in suite.base_kinds(path.stem, parameters.get(path.stem)) if k in closed]
            if not kinds:
                continue
            pending.remove(path)
            finished.add(path.stem)  # what waits on it runs (99 tabulates what exists) or is skipped by its own kind
            reason = f"uses the {kinds[0]} base: {closed[kinds[0]]}"
            skipped[path.stem] = reason
            with lock:
                status["notebooks"][path.stem] = _skip_record(reason, parameters[path.stem])
                for stale in (reports_dir / path.name, (reports_dir / path.name).with_suffix(".html")):
                    stale.unlink(missing_ok=True)  # never show a previous run's output for a notebook not run
                _write_or_warn(runs.atomic_write_json, status_path, status)
            print(f"[suite] {path.stem} SKIPPED (not a failure): {reason}", flush=True)

    waiting = needs(notebooks)
    priority = critical_paths(waiting, notebook_costs(profile, results_root))
    # the longest critical path first; number order among equals (and for --jobs 1, one after another)
    pending = sorted(notebooks, key=lambda p: (-priority[p.stem], p.stem)) if jobs > 1 else list(notebooks)
    finished: set[str] = set()
    ended: queue.Queue[tuple[str, BaseException | None]] = queue.Queue()

    def worker(path: Path) -> None:
        try:
            run_notebook(path)
            ended.put((path.stem, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            ended.put((path.stem, exc))

    running: set[str] = set()
    try:
        with _kernel_threads(jobs):
            skip_closed()
            while pending or running:
                for path in [p for p in pending if waiting[p.stem] <= finished]:
                    held = sum(slots.get(stem, 1) for stem in running)
                    if held + slots.get(path.stem, 1) > jobs:
                        break  # it waits for its slots, and the ready notebooks behind it wait too (none overtakes)
                    pending.remove(path)
                    running.add(path.stem)
                    # daemon threads: a stopped run exits at once (its kernels follow, ipykernel's parent poller)
                    threading.Thread(target=worker, args=(path,), name=f"suite-{path.stem}", daemon=True).start()
                if not running:
                    if not pending:
                        break
                    # cannot happen with an acyclic NEEDS; fail loudly rather than hang
                    raise RuntimeError(f"notebooks {[p.stem for p in pending]} wait on each other: check NEEDS")
                stem, exc = ended.get()
                running.discard(stem)
                if exc is not None:
                    raise exc
                finished.add(stem)
                more = {k: v for k, v in closed_after(profile, stem, status["notebooks"][stem], results_root).items()
                        if k not in closed}
                if more:
                    closed.update(more)
                    skip_closed()
    except BaseException as exc:  # Ctrl-C, SIGTERM, a runner bug: status.json must not say "running"
        with lock:
            stopped = [stem for stem, rec in status["notebooks"].items() if rec.get("status") == "running"]
            for stem in stopped:
                status["notebooks"][stem].update(status="interrupted", ended=_now(),
                                                 interrupted=f"the run stopped ({type(exc).__name__}: {exc})")
            status["updated"] = _now()
            _write_or_warn(runs.atomic_write_json, status_path, status)
        print(f"[suite] STOPPED ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''}): "
              f"{', '.join(stopped) or 'no notebook'} marked interrupted in {status_path}; not run: "
              f"{', '.join(p.stem for p in pending) or 'none'}. Rerun them with --rerun-failed / RERUN_FAILED=1",
              file=sys.stderr, flush=True)
        raise

    try:
        index = report.render_index(profile, reports_dir, status, results_root=results_root,
                                    figures_root=figures_root, notebooks=[p.stem for p in discovered])
    except OSError as exc:
        index = reports_dir / "index.html"
        print(f"[suite] error: could not write {exc.filename or index} ({os.strerror(exc.errno) if exc.errno else exc}); "
              "free space and run `python -m copes_lib.cli report` to write it again", file=sys.stderr, flush=True)
    failed = [p.stem for p in notebooks if status["notebooks"][p.stem]["status"] not in ("ok", "skipped")]
    if part and not rerun_failed:
        suite_run = Path(results_root or runs.RESULTS_ROOT) / profile / "suite_run.json"
        _write_or_warn(lambda path: record_suite_run(
            path, profile=profile, part=part, jobs=jobs, force=force, code=code, started=suite_started,
            wall_s=time.perf_counter() - suite_t0, notebooks={p.stem: status["notebooks"][p.stem] for p in notebooks}),
            suite_run)
    ran = total - len(skipped)
    print(f"[suite] {ran} notebook(s) run{f' in part {part}' if part else ''} in "
          f"{time.perf_counter() - suite_t0:.1f}s; report: {index}", flush=True)
    if skipped:
        print(f"[suite] SKIPPED by the base gate, not failures ({len(skipped)}): {', '.join(skipped)}; why: "
              + "; ".join(f"{kind}: {reason}" for kind, reason in closed.items()), flush=True)
    if failed:
        logs = [str(reports_dir / status["notebooks"][s]["log"]) for s in failed if status["notebooks"][s].get("log")]
        print(f"[suite] FAILED: {', '.join(failed)} (details in {status_path}; "
              f"{'full output in ' + ', '.join(logs) + '; ' if logs else ''}"
              "rerun them with --rerun-failed / RERUN_FAILED=1)", flush=True)
        return 1
    return 0


SUITE_RUN_ROW = ("status", "started", "ended", "duration_s", "skipped")  # what suite_run.json keeps per notebook


def record_suite_run(path: Path, *, profile: str, part: str, jobs: int, force: bool, code: dict[str, Any],
                     started: str, wall_s: float, notebooks: dict[str, dict[str, Any]]) -> None:
    """Record one part's run in ``suite_run.json``, beside the results it produced: its wall time, start and end,
    the commit (and whether the tree was dirty), the recipe overlay, the settings, and each notebook's status and
    duration (a skipped one with its reason). The file keeps every part's last run (``parts``; merged, never
    another part's entry lost) and, under ``notebooks``, each notebook's row from the last part that ran it (the
    runner's costs and the report read those). A file of the layout before parts is kept whole under
    ``before_parts``. Written atomically."""
    try:
        record = runs.read_json(path) if path.exists() else {}
    except (OSError, ValueError) as exc:
        kept = path.with_name(path.name + ".unreadable")
        os.replace(path, kept)
        print(f"[suite] warning: {path} cannot be read ({exc}); kept as {kept}, a fresh record started", flush=True)
        record = {}
    if not isinstance(record, dict):
        record = {}
    if "notebooks" in record and "parts" not in record:  # one complete run, before parts existed
        record = {"before_parts": record}
    rows = {stem: {k: rec.get(k) for k in SUITE_RUN_ROW if k in rec or k != "skipped"}
            for stem, rec in sorted(notebooks.items())}
    record.setdefault("parts", {})[part] = {
        **code, "recipe": config.active_recipe(), "jobs": jobs, "force": force, "cpu_count": os.cpu_count(),
        "threads_per_kernel": _threads_per_kernel(jobs), "started": started, "ended": _now(),
        "wall_s": round(wall_s, 1), "notebooks": rows,
    }
    record["profile"] = profile
    runs.atomic_write_json(path, _with_notebooks(record))


def _with_notebooks(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with ``notebooks`` rebuilt from ``before_parts`` and its parts in order of their end (the latest
    run of each notebook wins), and ``started`` the earliest part's start."""
    merged = dict((record.get("before_parts") or {}).get("notebooks") or {})
    for entry in sorted(record["parts"].values(), key=lambda e: str(e.get("ended"))):
        merged.update(entry["notebooks"])
    return {**record, "notebooks": dict(sorted(merged.items())),
            "started": min(str(e.get("started")) for e in record["parts"].values())}


def merge_suite_runs(ours: dict[str, Any], theirs: dict[str, Any], *, source: str = "theirs") -> dict[str, Any]:
    """Two ``suite_run.json`` records of one profile (parts run in separate clones) as one, merged as the runner
    merges its own: the union of their parts (a part in both: the run that ended later), then ``notebooks``
    rebuilt (:func:`_with_notebooks`). Records of other profiles, of different older complete runs
    (``before_parts``) or without parts are a ConfigError naming ``source``."""
    for name, record in (("ours", ours), (source, theirs)):
        if not isinstance(record, dict) or not isinstance(record.get("parts"), dict) or not record["parts"]:
            raise config.ConfigError(f"{name}: not a suite_run.json with parts (a run of `make reproduce PART=...` "
                                     "or of every part writes one)")
    if ours.get("profile") != theirs.get("profile"):
        raise config.ConfigError(f"{source} is a run of profile {theirs.get('profile')!r}, ours of "
                                 f"{ours.get('profile')!r}: only runs of one profile can be merged")
    older = [r["before_parts"] for r in (ours, theirs) if r.get("before_parts")]
    if len(older) == 2 and older[0] != older[1]:
        raise config.ConfigError(f"{source} keeps another older complete run (before_parts) than ours: merge the "
                                 "clones' histories first, or remove before_parts from one of them")
    parts = dict(ours["parts"])
    for name, entry in theirs["parts"].items():
        if name not in parts or str(entry.get("ended")) > str(parts[name].get("ended")):
            parts[name] = entry
    merged = {**ours, "parts": dict(sorted(parts.items()))}
    if older:
        merged["before_parts"] = older[0]
    return _with_notebooks(merged)


_CURRENT = threading.local()  # the notebook a runner thread executes, to label its log lines


def _threads_per_kernel(jobs: int) -> str:
    """Math-library threads of each kernel: always ``threads.N_FIXED``, whatever ``jobs``, the core count or
    the user's OMP_NUM_THREADS, so that a run's numbers do not depend on the machine (``copes_lib.threads``)."""
    return str(threads.N_FIXED)


@contextlib.contextmanager
def _kernel_threads(jobs: int):
    """Give every kernel ``threads.N_FIXED`` math-library threads (kernels inherit the environment);
    restore the environment afterwards. ``jobs`` only sets how many kernels run at once."""
    fixed = threads.kernel_environment()
    saved = {k: os.environ.get(k) for k in fixed}
    overridden = {k: v for k, v in saved.items() if v is not None and v != fixed[k]}
    if overridden:
        print(f"[suite] ignoring {overridden}: every kernel runs with {threads.N_FIXED} thread(s) so that "
              "results do not depend on the machine (copes_lib/threads.py)", flush=True)
    os.environ.update(fixed)
    print(f"[suite] up to {jobs} notebooks at once, {threads.N_FIXED} thread(s) per kernel", flush=True)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _QuietCellMarkers(logging.Filter):
    """Shorten papermill's ``Executing Cell 3-----`` banners to ``-- cell 3``; drop ``Ending Cell``."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Ending Cell"):
            return False
        if message.startswith("Executing Cell"):
            record.msg, record.args = "-- cell " + message.removeprefix("Executing Cell").strip(" -"), ()
        stem = getattr(_CURRENT, "stem", None)
        if stem:  # parallel notebooks: say whose output this is
            record.msg, record.args = f"[{stem}] {record.getMessage()}", ()
        return True


class _NotebookLogs(logging.Handler):
    """Write each record to the log file of the notebook the logging thread runs (``_CURRENT.log``)."""

    def emit(self, record: logging.LogRecord) -> None:
        log = getattr(_CURRENT, "log", None)
        if log is not None:
            try:
                log.write(self.format(record) + "\n")
                log.flush()
            except Exception:  # noqa: BLE001 - logging must not fail a notebook
                self.handleError(record)


@contextlib.contextmanager
def _papermill_logs(verbose: bool):
    """papermill's log of every cell (its ``log_output``, the "papermill" logger at INFO) goes to the
    running notebook's file in ``reports/<profile>/logs/``, and with ``verbose`` to the console too; the
    logger's previous set-up comes back afterwards."""
    logger = logging.getLogger("papermill")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    formatter = logging.Formatter("%(message)s")
    handlers: list[logging.Handler] = [_NotebookLogs()]
    if verbose:
        handlers.append(logging.StreamHandler(sys.stdout))
    for handler in handlers:
        handler.setFormatter(formatter)
    quiet = _QuietCellMarkers()  # on the logger: it rewrites each record once, whatever the handlers
    logger.handlers[:] = handlers
    logger.addFilter(quiet)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeFilter(quiet)
        logger.handlers[:], level, logger.propagate = saved[0], saved[1], saved[2]
        logger.setLevel(level)


def merge_runs(profile: str, sources: list[str], results_root: Path | None = None) -> int:
    """``python -m copes_lib.cli merge-runs``: merge each source's record (a clone's folder, or a suite_run.json)
    into ``results/<profile>/suite_run.json`` (:func:`merge_suite_runs`), written atomically once all merged, with
    the profile's lock held (a run of the profile in progress here: :class:`SuiteBusyError`, naming it)."""
    target = Path(results_root or runs.RESULTS_ROOT) / profile / "suite_run.json"
    if not target.exists():
        raise config.ConfigError(f"{target} does not exist: run a part of profile {profile} here first, or copy "
                                 "one clone's suite_run.json there")
    with profile_lock(profile, results_root):
        record = runs.read_json(target)
        for source in sources:
            path = Path(source)
            if path.is_dir():
                path = path / "results" / profile / "suite_run.json"
            if not path.is_file():
                raise config.ConfigError(f"sources: {source!r} is neither a suite_run.json nor a clone's folder "
                                         f"with results/{profile}/suite_run.json")
            record = merge_suite_runs(record, runs.read_json(path), source=str(path))
        runs.atomic_write_json(target, record)
    for name, entry in record["parts"].items():
        print(f"{name:12s} {str(entry.get('git_sha'))[:7]}  ended {entry.get('ended')}  {len(entry['notebooks'])} "
              "notebook(s)")
    print(f"merged into {target}; now run `make reproduce PROFILE={profile} ONLY=99` for the summary over them all")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copes_lib.cli", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the notebooks under a profile and render reports/<profile>/")
    run.add_argument("--profile", default="cpu", choices=config.PROFILES)
    run.add_argument("--only", default=None, help="comma-separated notebook numbers or names, e.g. 02,03")
    run.add_argument("--force", action="store_true", help="pass FORCE=True: ignore cached work")
    run.add_argument("--rerun-failed", action="store_true",
                     help="run only the notebooks whose last status in status.json is failed")
    run.add_argument("--notebooks-dir", default=None, help="default: notebooks/")
    run.add_argument("--reports-dir", default=None, help="default: reports/<profile>/")
    run.add_argument("--jobs", type=int, default=1,
                     help="notebooks run at once, each after those it reads from (NEEDS); 1 = in number order")
    run.add_argument("--verbose", action="store_true",
                     help="stream every notebook's output to the console (default: one line as each notebook "
                     "starts and ends; the full output is in reports/<profile>/logs/<notebook>.log)")
    run.add_argument("--wait", action="store_true",
                     help="if another run of this profile is in progress, wait for it (default: refuse, naming it)")
    run.add_argument("--part", default=None, help=f"run one part of the suite: {', '.join(PARTS)} (default: every "
                     "part, one after another; each recorded in results/<profile>/suite_run.json)")
    run.add_argument("--unchecked-bases", action="store_true",
                     help="exploration: 01 builds the bases whose 5-seed check did not pass anyway; their claims read "
                     "'not checked'")
    rerender = sub.add_parser("report", help="render reports/<profile>/ (HTML + index) from the executed notebooks "
                              "there, or from the committed results/<profile>/ and figures/<profile>/; runs nothing")
    rerender.add_argument("--profile", default="cpu", choices=config.PROFILES)
    validate = sub.add_parser("validate", help="check profiles/<profile>.yaml against every notebook")
    validate.add_argument("--profile", default="cpu", choices=config.PROFILES)
    merge = sub.add_parser("merge-runs", help="merge the suite_run.json of parts run in other clones into "
                           "results/<profile>/suite_run.json (docs/running.md); then run `make reproduce ONLY=99`")
    merge.add_argument("--profile", default="cpu", choices=config.PROFILES)
    merge.add_argument("sources", nargs="+", help="another clone's folder, or a suite_run.json file")
    args = parser.parse_args(argv)

    # Prefer the venv's kernelspec over a user-level "python3" that may point at another Python.
    os.environ.setdefault("JUPYTER_PREFER_ENV_PATH", "1")
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        if args.command == "validate":
            sections = list(suite.load_profile(args.profile))
            problems = suite.profile_problems(args.profile, sections)
            for notebook, problem in problems.items():
                print(f"error: {notebook}: {problem}", file=sys.stderr)
            if problems:
                return 2
            print(f"profiles/{args.profile}.yaml is valid for its {len(sections)} notebook section(s)")
            return 0
        if args.command == "report":
            print(f"report: {render_reports(args.profile)}")
            return 0
        if args.command == "merge-runs":
            return merge_runs(args.profile, args.sources)
        return run_suite(args.profile, only=args.only, force=args.force, rerun_failed=args.rerun_failed,
                         notebooks_dir=args.notebooks_dir, reports_dir=args.reports_dir, jobs=args.jobs,
                         verbose=args.verbose, wait=args.wait, part=args.part,
                         unchecked_bases=args.unchecked_bases)
    except SuiteBusyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except Interrupted as exc:  # SIGTERM / SIGHUP: status.json already says which notebooks stopped
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 130
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (runs.UnreadableFileError, claims.UnreadableResultError) as exc:  # names the file and what to do
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
