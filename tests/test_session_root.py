"""The suite's outputs live in a per-session temporary root (tests/conftest.py): copes_lib's roots follow
COPES_OUTPUT_ROOT / COPES_CACHE_ROOT, this session's point away from the checkout, and a session whose test writes
the checkout's cache/, results/, figures/ or reports/ fails, naming what it wrote."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from copes_lib import runs
from copes_lib.config import REPO_ROOT

CONFTEST = Path(__file__).with_name("conftest.py")
ROOTS = "from copes_lib import runs; print(runs.RESULTS_ROOT, runs.FIGURES_ROOT, runs.REPORTS_ROOT, runs.CACHE_ROOT)"


def _roots(**env) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("COPES_OUTPUT_ROOT", "COPES_CACHE_ROOT")}
    out = subprocess.run([sys.executable, "-c", ROOTS], env={**clean, "PYTHONPATH": str(REPO_ROOT), **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_roots_follow_the_environment(tmp_path):
    assert _roots() == [str(REPO_ROOT / name) for name in ("results", "figures", "reports", "cache")]
    out = tmp_path / "out"
    assert _roots(COPES_OUTPUT_ROOT=str(out)) == [str(out / name) for name in ("results", "figures", "reports", "cache")]
    assert _roots(COPES_OUTPUT_ROOT=str(out), COPES_CACHE_ROOT=str(tmp_path / "c"))[3] == str(tmp_path / "c")


def test_this_session_writes_under_its_own_root():
    root = Path(os.environ["COPES_TEST_ROOT"]).resolve()
    for path in (runs.RESULTS_ROOT, runs.FIGURES_ROOT, runs.REPORTS_ROOT, runs.CACHE_ROOT):
        assert path.is_relative_to(root) and not path.is_relative_to(REPO_ROOT), path


def _inner_session(tmp_path: Path, body: str, **extra_env) -> subprocess.CompletedProcess:
    """A pytest session with this suite's session hooks, guarding ``tmp_path/checkout`` instead of the checkout,
    that runs one test with ``body``."""
    (tmp_path / "checkout" / "reports").mkdir(parents=True, exist_ok=True)
    (tmp_path / "checkout" / "reports" / "old.txt").write_text("kept")
    (tmp_path / "inner").mkdir(exist_ok=True)
    (tmp_path / "inner" / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(CONFTEST)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        globals().update({{k: v for k, v in vars(module).items() if k.startswith("pytest_")}})
    """))
    (tmp_path / "inner" / "test_inner.py").write_text(
        "from pathlib import Path\nfrom copes_lib import runs\n\ndef test_one():\n" + textwrap.indent(body, "    "))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COPES_") and not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(REPO_ROOT), COPES_TEST_GUARD_ROOT=str(tmp_path / "checkout"), **extra_env)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "-n", "0",
                           "-q", "-s", "--rootdir", str(tmp_path / "inner"), str(tmp_path / "inner")],
                          cwd=tmp_path / "inner", env=env, capture_output=True, text=True)


def test_a_test_writing_outside_the_session_root_fails_the_session_naming_the_path(tmp_path):
    checkout = tmp_path / "checkout"
    proc = _inner_session(tmp_path, f"Path({str(checkout)!r}, 'cache', 'smoke').mkdir(parents=True)\n"
                                    f"Path({str(checkout)!r}, 'reports', 'old.txt').write_text('overwritten')\n",
                          COPES_TEST_ROOT=str(tmp_path / "root"))  # given, so not the inner session's to remove
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "tests wrote the checkout's outputs" in proc.stdout
    assert "new      cache/smoke" in proc.stdout and "changed  reports/old.txt" in proc.stdout, proc.stdout
    (checkout / "reports" / "old.txt").write_text("kept")
    (checkout / "cache" / "smoke").rmdir()
    warned = _inner_session(tmp_path, f"Path({str(checkout)!r}, 'results').mkdir()\n",
                            COPES_TEST_ROOT=str(tmp_path / "root"), COPES_TEST_GUARD="warn")
    assert warned.returncode == 0 and "new      results" in warned.stdout, warned.stdout + warned.stderr


def test_a_session_writing_only_its_own_root_passes_and_removes_it(tmp_path):
    proc = _inner_session(tmp_path, "import os\n(runs.RESULTS_ROOT / 'smoke').mkdir(parents=True)\n"
                                    "(runs.CACHE_ROOT / 'smoke' / 'x').mkdir(parents=True)\n"
                                    "print('ROOT', os.environ['COPES_TEST_ROOT'])\n"
                                    "assert runs.CACHE_ROOT.is_relative_to(os.environ['COPES_TEST_ROOT'])\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tests wrote" not in proc.stdout
    root = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("ROOT "))
    assert not Path(root).exists()  # the session owned its root and removed it


def test_the_tests_run_in_a_seeded_random_order(pytestconfig):
    """pytest-randomly is pinned and on in `make test` (CI included), so an order dependence shows up; the seed
    in the header (``Using --randomly-seed=N``) repeats the order. ``-p no:randomly`` turns it off on purpose."""
    if pytestconfig.pluginmanager.is_blocked("randomly"):
        pytest.skip("shuffling turned off with -p no:randomly")
    assert pytestconfig.pluginmanager.hasplugin("randomly"), "pytest-randomly is not installed (requirements.txt)"
    assert isinstance(pytestconfig.getoption("randomly_seed"), int)
