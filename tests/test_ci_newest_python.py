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
    assert "light_venv" in block and ".venv-py313/bin/python -m pytest" in block
    assert "make venv VENV=.venv-py313" not in block  # no torch for 3.13: a CUDA wheel could stall CI
    assert "tests/test_sandbox.py" in block and "tests/test_sandbox_nonroot.py" in block
    assert "no Python 3.13 on this machine" in block and "CI_NEWEST_PYTHON=0" in block
    assert ".venv-py313" in (REPO_ROOT / ".gitignore").read_text().split()  # a folder or a link to one


def test_the_light_venv_takes_requirements_pins(tmp_path):
    """The 3.13 venv installs exactly requirements.txt's pins of what the sandbox tests import (no torch)."""
    function = CI[CI.index("light_venv() {"):CI.index("\n}\n", CI.index("light_venv() {")) + 3]
    packages = CI[CI.index("NEWEST_PYTHON_PACKAGES=("):].split("\n", 1)[0]
    fake = tmp_path / "py"  # stands in for the interpreter: records the pip arguments instead of installing
    fake.write_text("#!/bin/sh\nmkdir -p .venv-py313/bin && printf '#!/bin/sh\\necho \"$@\" > pip-args\\n' "
                    "> .venv-py313/bin/python && chmod +x .venv-py313/bin/python\n")
    fake.chmod(0o755)
    (tmp_path / "requirements.txt").write_text((REPO_ROOT / "requirements.txt").read_text())
    done = subprocess.run(["/bin/bash", "-c", f"set -euo pipefail\n{packages}\n{function}\nlight_venv {fake}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "pip-args").read_text().split()
    pins = {line.split("==")[0].lower(): line.strip() for line in (REPO_ROOT / "requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    assert [a for a in args if "==" in a] == [pins[n] for n in ("numpy", "pyyaml", "pytest", "pytest-timeout",
                                                                  "pytest-xdist", "pytest-randomly")]
    assert not any(a.startswith("torch") for a in args)
