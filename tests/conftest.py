"""Test-wide environment: nothing from a model hub, few threads (2 cores are shared), quiet kernels, and a
per-session temporary root for every tree the suite writes.

Set at import, before any test imports torch or copes_lib, so the papermill kernels and worker processes that
tests start inherit it.

**Outputs.** The session (the xdist controller; its workers inherit the environment) makes one temporary folder,
``COPES_TEST_ROOT``, and points ``COPES_OUTPUT_ROOT`` (results/, figures/, reports/, cache/; see
``copes_lib.runs``) and ``COPES_CACHE_ROOT`` at it. No test reads or writes the checkout's cache/, results/,
figures/ or reports/ through ``copes_lib.runs``' roots; a test that reads a committed file (results/cpu/...) names
it by ``REPO_ROOT``. At the end of the session the checkout's four trees are compared with what they held at its
start: a file that appeared, changed or went away fails the session, named. The folder is removed after a session
that passed and kept (its path printed) after one that failed, for the executed notebooks and logs in it.
``COPES_TEST_GUARD=warn`` reports such changes without failing (for a checkout where another run writes at the
same time on purpose).

**Order.** pytest-randomly shuffles the tests (seeded; the seed is printed in the header, ``Using
--randomly-seed=N``): ``pytest -p randomly --randomly-seed=N`` repeats an order, ``-p no:randomly`` turns it off.
The slow tests are then moved to the heads of the xdist workers' parts (below), in an order that does not depend
on the seed.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warning
os.environ.setdefault("JUPYTER_PREFER_ENV_PATH", "1")  # the venv's python3 kernel, not a user one
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One root per session: the process that makes it owns it (removes it at the end); xdist workers and nested
# processes find it in the environment and share it.
_OWNS_ROOT = not os.environ.get("COPES_TEST_ROOT")
if _OWNS_ROOT:
    os.environ["COPES_TEST_ROOT"] = tempfile.mkdtemp(prefix="copes-tests-")
TEST_ROOT = Path(os.environ["COPES_TEST_ROOT"])
os.environ["COPES_OUTPUT_ROOT"] = str(TEST_ROOT)
os.environ["COPES_CACHE_ROOT"] = str(TEST_ROOT / "cache")

from copes_lib import runs  # noqa: E402  (after the environment it reads)

if not runs.CACHE_ROOT.is_relative_to(TEST_ROOT.resolve()):  # something imported copes_lib.runs before us
    raise RuntimeError(f"copes_lib.runs was imported before tests/conftest.py set COPES_OUTPUT_ROOT: its cache root "
                       f"is {runs.CACHE_ROOT}, not under the session's {TEST_ROOT}")

#: the checkout's trees no test may write (compared at the end of the session); COPES_TEST_GUARD_ROOT names
#: another folder to guard instead of the checkout (tests/test_session_root.py's own inner session)
GUARDED = ("cache", "results", "figures", "reports")
GUARD_ROOT = Path(os.environ.get("COPES_TEST_GUARD_ROOT") or runs.REPO_ROOT)


def _snapshot() -> dict[str, tuple[int, int]]:
    """Every file and folder under the checkout's guarded trees: relative path -> (size, mtime in ns)."""
    found = {}
    for name in GUARDED:
        if (GUARD_ROOT / name).is_dir():  # the tree itself: a test that makes an empty reports/ wrote too
            found[name] = (0, 0)
        for folder, dirs, files in os.walk(GUARD_ROOT / name):
            for entry in dirs + files:
                path = Path(folder) / entry
                try:
                    stat = path.lstat()
                except FileNotFoundError:  # removed while we walked
                    continue
                # a folder's mtime moves when an entry is added or removed; that entry is reported itself
                found[str(path.relative_to(GUARD_ROOT))] = (stat.st_size, 0 if entry in dirs else stat.st_mtime_ns)
    return found


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if _is_controller(config):
        config.stash[_BEFORE] = _snapshot()


_BEFORE = pytest.StashKey[dict]()
_WRITTEN = pytest.StashKey[list]()
_FAILED = pytest.StashKey[bool]()


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _is_controller(config) or _BEFORE not in config.stash:
        return
    before, after = config.stash[_BEFORE], _snapshot()
    written = ([f"new      {p}" for p in sorted(set(after) - set(before))]
               + [f"changed  {p}" for p in sorted(p for p in set(after) & set(before) if after[p] != before[p])]
               + [f"removed  {p}" for p in sorted(set(before) - set(after))])
    config.stash[_WRITTEN] = written
    if written and os.environ.get("COPES_TEST_GUARD") != "warn":
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    config.stash[_FAILED] = session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    written = config.stash.get(_WRITTEN, [])
    if written:
        shown = written[:40] + ([f"... and {len(written) - 40} more"] if len(written) > 40 else [])
        terminalreporter.write_sep("=", "tests wrote the checkout's outputs", red=True)
        terminalreporter.write_line(
            f"A test wrote outside the session's temporary root ({TEST_ROOT}); the checkout's "
            f"{', '.join(GUARDED)} trees in {GUARD_ROOT} changed (a `make reproduce` in this checkout during the tests does this "
            "too; COPES_TEST_GUARD=warn reports without failing):")
        for line in shown:
            terminalreporter.write_line(f"  {line}")


def pytest_unconfigure(config):
    if not (_OWNS_ROOT and _is_controller(config)):
        return
    if config.stash.get(_FAILED, False):
        print(f"\n(the session's outputs are kept for a look: {TEST_ROOT})")
    else:
        shutil.rmtree(TEST_ROOT, ignore_errors=True)


def _slow_cost(item) -> float | None:
    """A slow test's cost from ``@pytest.mark.slow(cost=seconds)``: its rough wall seconds in `make test` on a
    2-core machine; 0 for a slow test without one, None for a test without the mark."""
    marker = item.get_closest_marker("slow")
    return None if marker is None else float(marker.kwargs.get("cost", 0))


def _first_split(n_items: int, workers: int) -> list[int]:
    """The sizes of the parts `--dist worksteal` first hands out: each idle worker in turn gets
    ``len(pending) // workers left`` of the items, in collection order (xdist/scheduler/worksteal.py)."""
    sizes, left = [], n_items
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def pytest_collection_modifyitems(config, items):
    """The slow tests at the heads of the parts that `make test`'s `-n 3 --dist worksteal` first hands to its
    workers: those with a cost spread so that each worker's slow work is about the same (longest first, each
    to the part with the least so far); those without one after the costliest (the smoke run of every
    notebook), in its part, in collection order: they read the smoke base its notebook 01 builds (e.g.
    tests/test_preflight.py), which is cached by then instead of trained a second time at once.

    Worksteal gives each worker one contiguous part of the collection and steals only from the tail of a
    busy worker's queue, so a test at the head of a part starts at once and stays there. (With every slow
    test at the head of the first part, one worker ran the smoke run and the gpu profile back to back, ~12 of
    the run's ~13 min.) Without xdist: the slow tests first, costliest first."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    costed = sorted((item for item in items if _slow_cost(item)), key=_slow_cost, reverse=True)
    after = [item for item in items if _slow_cost(item) == 0]
    fast = [item for item in items if _slow_cost(item) is None]
    sizes = _first_split(len(items), workers)
    heads, loads = [[] for _ in sizes], [0.0] * len(sizes)
    for item in costed:  # longest processing time first, to the part with the least slow work so far
        part = min(range(len(sizes)), key=lambda i: (len(heads[i]) >= sizes[i], loads[i]))
        heads[part].append(item)
        loads[part] += _slow_cost(item)
    heads[0 if not costed else next(i for i, head in enumerate(heads) if costed[0] in head)][1:1] = after
    ordered, rest = [], iter(fast)
    for head, size in zip(heads, sizes):
        ordered += head + [next(rest) for _ in range(max(0, size - len(head)))]
    ordered += list(rest)
    assert len(ordered) == len(items) and {id(i) for i in ordered} == {id(i) for i in items}
    items[:] = ordered


@pytest.fixture(autouse=True)
def _process_data_settings_restored():
    """What a test's use_profile_data / use_qa_data / use_tool_settings set stays in that test: the cpu default's
    QA data are 'large', so a variant left behind by one test would change the recipe key another reads
    (copes_lib.tasks keeps them per process, as a notebook's parameter loading sets them)."""
    from copes_lib import tasks

    saved = dict(tasks._qa_data), dict(tasks._tool_settings), list(tasks._gpu_data)
    yield
    tasks._qa_data.clear()
    tasks._qa_data.update(saved[0])
    tasks._tool_settings.clear()
    tasks._tool_settings.update(saved[1])
    tasks._gpu_data[:] = saved[2]


_START_CWD = os.getcwd()


@pytest.fixture(autouse=True)
def _working_directory_unchanged():
    """A test that leaves the process in another folder fails at its teardown, naming the folder (relative paths
    in every later test of that xdist worker would resolve there); the folder is restored for the next test."""
    yield
    try:
        now = os.getcwd()
    except FileNotFoundError:  # left in a folder that has since been removed
        now = "(a removed folder)"
    if now != _START_CWD:
        os.chdir(_START_CWD)
        pytest.fail(f"the test left the process's working directory in {now}, not {_START_CWD}", pytrace=False)
