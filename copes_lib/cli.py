"""Command line of the suite: run the notebooks under a profile, or validate a profile.

    python -m copes_lib.cli run --profile cpu [--only 02,03] [--force] [--rerun-failed] [--jobs 2]
    python -m copes_lib.cli validate --profile smoke
    python -m copes_lib.cli report --profile smoke    # render reports/<profile>/ again, run nothing

``run`` validates the profile's parameters for every selected notebook before anything runs, then
executes each ``notebooks/NN_*.ipynb`` with papermill (kernel ``python3``, working directory
``notebooks/``, parameters = the profile's section + ``PROFILE`` (+ ``FORCE``)).

Order: a notebook starts once the notebooks it reads from have finished (:data:`NEEDS`; an
unregistered notebook waits for every lower-numbered one); of the notebooks ready at once, the one with
the longest critical path starts first (:func:`critical_paths`: its own cost plus the longest chain of
notebooks waiting on it, costs from the profile's last complete run, ``suite_run.json``), so that with
``--jobs 2`` the long chain 01 -> 04 -> 05 is not queued behind short notebooks. ``--jobs N`` runs up
to N notebooks at once; every kernel gets ``threads.N_FIXED`` threads whatever N, the core count or
``OMP_NUM_THREADS`` (numbers must not depend on the machine); ``--jobs 1`` is one notebook after
another in number order. Executed notebooks
and their HTML land in ``reports/<profile>/``; a failing notebook does not stop the others. Each
notebook's status, duration and failing cell go to ``reports/<profile>/status.json`` (written
atomically after every notebook), and ``reports/<profile>/index.html`` links everything. The exit
status is 1 if any notebook failed.

Statuses: ``ok``, ``failed``, and ``running`` (left behind by an interrupted run; ``--rerun-failed``
treats it as failed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import logging
import os
import re
import sys
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from copes_lib import claims, config, report, runs, threads
from copes_lib.protocols import notebooks as suite

# What each notebook reads from the others: suite.NEEDS (copes_lib/protocols/notebooks.py).
NEEDS = suite.NEEDS

# Notebooks with a budget of their own under a profile: a run without --only leaves them out and says so;
# `make reproduce ONLY=09` (then ONLY=99 to refresh the claims) runs them (docs/cost.md).
OWN_BUDGET: dict[str, tuple[str, ...]] = {"cpu": ("09_scale_study",)}

NOTEBOOK_PATTERN = re.compile(r"^(\d{2})_[A-Za-z0-9_]+\.ipynb$")
KERNEL = "python3"


def preflight_halt(profile: str, stem: str, results_root: Path | str | None = None) -> str | None:
    """Why the run must stop after ``stem``, or None: notebook 01's summary says its preflight was enforced and
    failed (docs/preflight.md#p1-the-preconditions), so the later notebooks could only tabulate zeros."""
    if stem != "01_substrate_and_agent":
        return None
    path = Path(results_root or runs.RESULTS_ROOT) / profile / stem / "summary.json"
    try:
        summary = runs.read_json(path)
    except (OSError, ValueError):
        return None
    if summary.get("preflight_enforced") and summary.get("preflight_met") is False:
        failed = ", ".join(summary.get("preflight_failed") or [])
        return (f"the testbed's preflight failed ({failed}; {path}): no method could show a difference on this base "
                "(docs/preflight.md). Change the base design (registered first in docs/preflight.md), or run single "
                "notebooks with ONLY=... (their claims then read 'not actionable')")
    return None


def discover_notebooks(notebooks_dir: Path) -> list[Path]:
    """``NN_topic.ipynb`` files of ``notebooks_dir`` in suite order."""
    return sorted(p for p in Path(notebooks_dir).iterdir() if NOTEBOOK_PATTERN.match(p.name))


def select(notebooks: list[Path], only: str | None) -> list[Path]:
    """Keep the notebooks named by ``only``: comma-separated numbers (``02,03``) or stems."""
    if not only:
        return notebooks
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    if not wanted:
        raise config.ConfigError(f"--only {only!r} names no notebook; give comma-separated numbers or names, "
                                 f"e.g. --only 02,03 (ONLY=02,03); notebooks: {[p.stem for p in notebooks]}")
    chosen = [p for p in notebooks if any(p.stem == w or p.stem.split("_", 1)[0] == w.zfill(2) for w in wanted)]
    matched = {w for w in wanted for p in chosen if p.stem == w or p.stem.split("_", 1)[0] == w.zfill(2)}
    missing = [w for w in wanted if w not in matched]
    if missing:
        raise config.ConfigError(
            f"--only {only}: no notebook matches {missing}; notebooks: {[p.stem for p in notebooks]}"
        )
    return chosen


def needs(notebooks: list[Path]) -> dict[str, set[str]]:
    """For each selected notebook, the selected notebooks that must finish before it starts.

    >>> names = ["02_standard_es", "03_copes", "10_molora_substrate", "41_unregistered", "99_summary"]
    >>> {k: sorted(v) for k, v in needs([Path(n + ".ipynb") for n in names]).items()}  # doctest: +NORMALIZE_WHITESPACE
    {'02_standard_es': [], '03_copes': ['02_standard_es'], '10_molora_substrate': [],
     '41_unregistered': ['02_standard_es', '03_copes', '10_molora_substrate'],
     '99_summary': ['02_standard_es', '03_copes', '10_molora_substrate']}
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


def notebook_parameters(profile: str, stem: str, force: bool) -> dict[str, Any]:
    """The parameters injected into ``stem``, validated. Unregistered notebooks get PROFILE only."""
    values: dict[str, Any] = {}
    if stem in suite.NOTEBOOKS:
        values = dict(suite.profile_params(profile, stem))
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
    reports_dir = Path(reports_dir or config.REPO_ROOT / "reports" / profile).resolve()
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


def run_one(path: Path, parameters: dict[str, Any], reports_dir: Path, cwd: Path,
            results_root: str | Path | None = None, figures_root: str | Path | None = None) -> dict[str, Any]:
    """Execute one notebook with papermill; return its status record (never raises on notebook errors)."""
    import papermill

    executed = reports_dir / path.name
    record: dict[str, Any] = {"status": "running", "started": _now(), "parameters": parameters,
                              "executed": executed.name, "html": None, "error": None}
    for stale in (executed, executed.with_suffix(".html")):  # never show a previous run's output
        stale.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(path), str(executed), parameters=parameters, kernel_name=KERNEL, cwd=str(cwd),
            log_output=True, progress_bar=False,
        )
        record["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a failing notebook must not stop the suite
        record["status"] = "failed"
        record["error"] = _failure(exc)
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
) -> int:
    """Run the selected notebooks under ``profile``; return the exit status (1 if any failed)."""
    if not isinstance(jobs, int) or jobs < 1:
        raise config.ConfigError(f"jobs = {jobs!r}: must be an integer >= 1 (notebooks run at once)")
    notebooks_dir = Path(notebooks_dir or config.REPO_ROOT / "notebooks").resolve()
    reports_dir = Path(reports_dir or config.REPO_ROOT / "reports" / profile).resolve()
    suite.load_profile(profile)  # unknown profile or unknown notebook sections fail here
    discovered = discover_notebooks(notebooks_dir)
    notebooks = select(discovered, only)
    if not only:
        apart = [p.stem for p in notebooks if p.stem in OWN_BUDGET.get(profile, ())]
        notebooks = [p for p in notebooks if p.stem not in apart]
        for stem in apart:
            print(f"[suite] {stem} has a budget of its own under {profile} and is not run by default: "
                  f"`make reproduce PROFILE={profile} ONLY={stem[:2]}` runs it (docs/cost.md)",
                  flush=True)
    default_selection = [p for p in discovered if p.stem not in OWN_BUDGET.get(profile, ())]
    status_path = reports_dir / "status.json"
    status = load_status(status_path)
    if rerun_failed:
        previous = status["notebooks"]
        notebooks = [p for p in notebooks if previous.get(p.stem, {}).get("status") in ("failed", "running")]
        if not notebooks:
            print(f"[suite] --rerun-failed: no failed notebook in {status_path}; nothing to run", flush=True)

    # Validate everything first, so a typo in a profile fails before an hour of work.
    parameters = {p.stem: notebook_parameters(profile, p.stem, force) for p in notebooks}
    for p in notebooks:
        if p.stem not in suite.NOTEBOOKS:
            print(f"[suite] warning: {p.stem} is not registered in copes_lib.protocols.notebooks.NOTEBOOKS; "
                  "its parameters are not validated here", flush=True)

    reports_dir.mkdir(parents=True, exist_ok=True)
    status.update(profile=profile, notebooks_dir=str(notebooks_dir))
    total = len(notebooks)
    suite_t0, suite_started, code = time.perf_counter(), _now(), runs.git_state()
    lock = threading.Lock()
    started = [0]

    def run_notebook(path: Path) -> None:
        with lock:
            started[0] += 1
            tag = f"[suite {started[0]}/{total}] {path.stem}"
            print(f"{tag} start ({profile})", flush=True)
            status["notebooks"][path.stem] = {"status": "running", "started": _now()}
            _write_or_warn(runs.atomic_write_json, status_path, status)
        _CURRENT.stem = path.stem if jobs > 1 else None
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
            print(line, flush=True)

    waiting = needs(notebooks)
    priority = critical_paths(waiting, notebook_costs(profile, results_root))
    # the longest critical path first; number order among equals (and for --jobs 1, one after another)
    pending = sorted(notebooks, key=lambda p: (-priority[p.stem], p.stem)) if jobs > 1 else list(notebooks)
    finished: set[str] = set()
    halted: list[str] = []  # the preflight's reason, and the notebooks it left unrun
    with _kernel_threads(jobs), ThreadPoolExecutor(max_workers=jobs) as pool:
        running: dict[Any, str] = {}
        while pending or running:
            for path in [p for p in pending if waiting[p.stem] <= finished][: jobs - len(running)]:
                pending.remove(path)
                running[pool.submit(run_notebook, path)] = path.stem
            if not running:  # cannot happen with an acyclic NEEDS; fail loudly rather than hang
                raise RuntimeError(f"notebooks {[p.stem for p in pending]} wait on each other: check NEEDS")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()
                stem = running.pop(future)
                finished.add(stem)
                reason = None if only else preflight_halt(profile, stem, results_root)
                if reason and pending:
                    halted[:] = [reason, *(p.stem for p in pending)]
                    pending.clear()
                    print(f"[suite] STOPPING after {stem}: {reason}. Not run: {', '.join(halted[1:])}", flush=True)

    try:
        index = report.render_index(profile, reports_dir, status, results_root=results_root,
                                    figures_root=figures_root, notebooks=[p.stem for p in discovered])
    except OSError as exc:
        index = reports_dir / "index.html"
        print(f"[suite] error: could not write {exc.filename or index} ({os.strerror(exc.errno) if exc.errno else exc}); "
              "free space and run `python -m copes_lib.cli report` to write it again", file=sys.stderr, flush=True)
    failed = [p.stem for p in notebooks if p.stem not in halted[1:] and status["notebooks"][p.stem]["status"] != "ok"]
    if halted:
        print(f"[suite] STOPPED by the preflight: {halted[0]}", flush=True)
        return 2
    if not only and not rerun_failed and notebooks == default_selection:
        suite_run = Path(results_root or runs.RESULTS_ROOT) / profile / "suite_run.json"
        _write_or_warn(lambda path: record_suite_run(
            path, profile=profile, jobs=jobs, force=force, code=code, started=suite_started,
            wall_s=time.perf_counter() - suite_t0, notebooks=status["notebooks"]), suite_run)
    print(f"[suite] {total} notebook(s) run in {time.perf_counter() - suite_t0:.1f}s; "
          f"report: {index}", flush=True)
    if failed:
        print(f"[suite] FAILED: {', '.join(failed)} (details in {status_path}; "
              "rerun them with --rerun-failed / RERUN_FAILED=1)", flush=True)
        return 1
    return 0


def record_suite_run(path: Path, *, profile: str, jobs: int, force: bool, code: dict[str, Any], started: str,
                     wall_s: float, notebooks: dict[str, dict[str, Any]]) -> None:
    """Provenance of the last complete run of the suite (every notebook, one command), written beside
    the results it produced: the commit, the settings, and each notebook's status and duration."""
    runs.atomic_write_json(path, {
        "profile": profile, **code, "jobs": jobs, "force": force, "cpu_count": os.cpu_count(),
        "threads_per_kernel": _threads_per_kernel(jobs), "started": started, "ended": _now(),
        "wall_s": round(wall_s, 1),
        "notebooks": {stem: {k: rec.get(k) for k in ("status", "started", "ended", "duration_s")}
                      for stem, rec in sorted(notebooks.items())},
    })


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


def _setup_logging() -> None:
    # papermill's --log-output goes through the "papermill" logger at INFO.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(_QuietCellMarkers())
    logger = logging.getLogger("papermill")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


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
    rerender = sub.add_parser("report", help="render reports/<profile>/ (HTML + index) again from the executed "
                              "notebooks and results there; runs nothing")
    rerender.add_argument("--profile", default="cpu", choices=config.PROFILES)
    validate = sub.add_parser("validate", help="check profiles/<profile>.yaml against every notebook")
    validate.add_argument("--profile", default="cpu", choices=config.PROFILES)
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
        _setup_logging()
        return run_suite(args.profile, only=args.only, force=args.force, rerun_failed=args.rerun_failed,
                         notebooks_dir=args.notebooks_dir, reports_dir=args.reports_dir, jobs=args.jobs)
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (runs.UnreadableFileError, claims.UnreadableResultError) as exc:  # names the file and what to do
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
