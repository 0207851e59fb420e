"""CI's second pass (.ci/run): the sandbox's tests again on the newest supported Python (3.13) when one is on
the machine, said and skipped otherwise (issue 50). The block is checked here without running make."""

from __future__ import annotations

import subprocess

from copes_lib.config import REPO_ROOT

CI = (REPO_ROOT / ".ci" / "run").read_text()


def _newest_python(env: dict[str, str]) -> subprocess.CompletedProcess:
    function = CI[CI.index("newest_python() {"):CI.index("\n}\n", CI.index("newest_python() {")) + 3]
    return subprocess.run(["/bin/bash", "-c", f"set -euo pipefail\n{function}\nnewest_python"], capture_output=True,
                          text=True, timeout=30, env=env)


def test_ci_finds_a_working_python_313_or_says_there_is_none(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3.13").write_text("#!/bin/sh\nexit 127\n")  # a pyenv shim of a version that is not active
    (bare / "python3.13").chmod(0o755)
    none = _newest_python({"PATH": f"{bare}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert none.returncode == 1 and none.stdout == ""
    chosen = _newest_python({"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CI_NEWEST_PYTHON": "/opt/py/bin/python3"})
    assert chosen.stdout.strip() == "/opt/py/bin/python3"


def test_ci_runs_the_sandbox_tests_on_it_after_the_reference_run():
    block = CI[CI.index("make test"):]
    assert "make venv VENV=.venv-py313" in block and ".venv-py313/bin/python -m pytest" in block
    assert "tests/test_sandbox.py" in block and "tests/test_sandbox_nonroot.py" in block
    assert "no Python 3.13 on this machine" in block and "CI_NEWEST_PYTHON=0" in block
    assert ".venv-py313/" in (REPO_ROOT / ".gitignore").read_text()
