"""Bad input answers in one line, before the heavy imports: an unknown profile, a notebook that does not
exist, a JOBS that is no positive integer (copes_lib/cli_args.py), from `python -m copes_lib.cli` and from
`make reproduce` (whose PROFILE check runs in make itself, before the venv is built)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from copes_lib import cli_args, config
from copes_lib.config import REPO_ROOT


@pytest.mark.parametrize("argv, expected", [
    (["run", "--profile", "nope"], "profile 'nope' (--profile, PROFILE=) is not valid; valid values: smoke, cpu, gpu"),
    (["report", "--profile=gpux"], "valid values: smoke, cpu, gpu"),
    (["validate", "--profile", "Smoke"], "valid values: smoke, cpu, gpu"),
    (["run", "--profile", "smoke", "--only", "02,xyz"], "no notebook matches ['xyz']; notebooks: ['00_suite_overview'"),
    (["run", "--only=99_summry"], "no notebook matches ['99_summry']"),
    (["run", "--jobs", "0"], "jobs = '0' (--jobs, JOBS=) is not valid; valid values: an integer >= 1"),
    (["run", "--jobs", "two"], "valid values: an integer >= 1"),
])
def test_bad_arguments_are_named_with_the_valid_values(argv, expected):
    assert expected in cli_args.argument_error(argv)


@pytest.mark.parametrize("argv", [[], ["run"], ["run", "--profile", "smoke", "--only", "02,08_memory_and_gpu_hours"],
                                  ["run", "--only", "2", "--jobs", "3"], ["report", "--profile", "cpu"],
                                  ["--help"], ["nonsense", "--profile", "nope"]])
def test_good_or_other_arguments_go_to_the_full_parser(argv):
    assert cli_args.argument_error(argv) is None


def test_a_notebooks_dir_of_its_own_is_searched(tmp_path):
    (tmp_path / "05_mine.ipynb").write_text("{}")
    assert cli_args.argument_error(["run", "--notebooks-dir", str(tmp_path), "--only", "05"]) is None
    assert "notebooks: ['05_mine']" in cli_args.argument_error(["run", "--notebooks-dir", str(tmp_path), "--only", "02"])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def test_the_cli_answers_in_one_line_without_importing_torch():
    for argv in (["run", "--profile", "nope"], ["run", "--profile", "smoke", "--only", "42"]):
        done = subprocess.run([sys.executable, "-m", "copes_lib.cli", *argv], capture_output=True, text=True,
                              env=_env(), cwd=REPO_ROOT)
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
        assert "usage:" not in done.stderr
        # -X importtime lists every module the process imported: the check ran before torch and the claims
        traced = subprocess.run([sys.executable, "-X", "importtime", "-m", "copes_lib.cli", *argv],
                                capture_output=True, text=True, env=_env(), cwd=REPO_ROOT)
        imported = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines() if "|" in line}
        assert "copes_lib.cli_args" in imported and not imported & {"torch", "copes_lib.claims", "copes_lib.report"}


def test_profiles_of_make_are_the_configs():
    assert sorted(p.stem for p in (REPO_ROOT / "profiles").glob("*.yaml")) == sorted(config.PROFILES)


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-o", "venv", "-o", "venv-gpu", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, env=_env())


@pytest.mark.parametrize("goal", ["reproduce", "report", "validate", "preflight"])
def test_make_refuses_an_unknown_profile_before_anything(goal):
    done = _make(goal, "PROFILE=nope")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"Makefile:{_line('$(error PROFILE=')}: *** PROFILE=nope is not valid; "
                                        "valid values: cpu, gpu, smoke.  Stop."]


def _line(text: str) -> int:
    return next(i for i, line in enumerate((REPO_ROOT / "Makefile").read_text().splitlines(), 1) if text in line)


@pytest.mark.skipif(not Path(REPO_ROOT / ".venv" / "bin" / "python").exists(), reason="no .venv")
def test_make_reproduce_names_an_unknown_notebook_first():
    """ONLY= is judged by the suite (its rule: numbers or names); make adds only its own status line."""
    done = _make("reproduce", "PROFILE=smoke", "ONLY=02,xyz")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("error: --only 02,xyz: no notebook matches ['xyz']; notebooks: ['00_suite_overview'")
    # make's own closing line; "make[1]" when this test runs under `make test` (MAKELEVEL is inherited)
    assert len(lines) == 2 and re.match(r"make(\[\d+\])?: \*\*\* \[Makefile:", lines[1]) and "usage" not in done.stderr


def test_the_part_names_checked_early_are_the_suites_parts():
    from copes_lib.protocols import notebooks as suite

    assert tuple(suite.PARTS) == cli_args.PART_NAMES
    assert "valid values: paper-a, paper-b, study, norm-curve" in cli_args.argument_error(
        ["run", "--profile", "cpu", "--part", "nope"])
    assert cli_args.argument_error(["run", "--profile", "cpu", "--part", "study"]) is None
