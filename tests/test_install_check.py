"""`make venv-gpu` on a researcher's box: Python 3.11-3.13, SYSTEM_TORCH=1 reusing an installed CUDA
torch >= 2.7 (clear messages when there is none), the CPU `make venv` path untouched."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_env_pins import _pins, requirements_pins

from copes_lib import install_check as ic
from copes_lib.config import REPO_ROOT


@pytest.mark.parametrize("version, ok", [((3, 10), False), ((3, 11), True), ((3, 12), True), ((3, 13), True),
                                         ((3, 14), False)])
def test_gpu_python_versions(version, ok):
    error = ic.python_error(version)
    assert (error is None) == ok
    if not ok:
        assert "3.11, 3.12, 3.13" in error and "PYTHON_GPU" in error


def test_system_torch_messages():
    assert ic.torch_error("2.7.0+cu126", "12.6", False) is None
    assert ic.torch_error("2.11.0", "13.0", False) is None
    assert "no torch" in ic.torch_error(None, None, False)
    assert "older than 2.7" in ic.torch_error("2.6.0+cu124", "12.4", False)
    cpu = ic.torch_error("2.13.0+cpu", None, False)
    assert "CPU build" in cpu and "no CUDA torch found" in cpu and ic.REFERENCE_TORCH in cpu
    assert "itself a venv" in ic.torch_error("2.11.0", "12.8", True)
    assert ic.REFERENCE_TORCH == requirements_pins()["torch"]  # 2.13 stays the tested reference


def test_existing_venv_must_match_the_switch():
    shared = "home = /usr/bin\ninclude-system-site-packages = true\n"
    assert ic.venv_error(shared, True) is None
    assert "delete .venv-gpu" in ic.venv_error(shared, False)
    assert "delete .venv-gpu" in ic.venv_error("include-system-site-packages = false\n", True)


def test_cli_refuses_a_venv_python_for_system_torch():
    done = subprocess.run([sys.executable, str(REPO_ROOT / "copes_lib" / "install_check.py"), "torch"],
                          capture_output=True, text=True)
    if sys.prefix != sys.base_prefix:  # the test venv is a venv: its packages are invisible to a child venv
        assert done.returncode == 1 and "itself a venv" in done.stderr
    bad = subprocess.run([sys.executable, str(REPO_ROOT / "copes_lib" / "install_check.py"), "nonsense"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "valid values" in bad.stderr


def _make_n(*args: str) -> str:
    done = subprocess.run(["make", "-n", "-B", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return done.stdout


def test_make_venv_gpu_switch():
    plain = _make_n("venv-gpu", f"PYTHON_GPU={sys.executable}")
    assert "--system-site-packages" not in plain and "install -r requirements-gpu.txt" in plain
    assert "install_check.py torch" not in plain and "install_check.py cuda" in plain
    system = _make_n("venv-gpu", "SYSTEM_TORCH=1", f"PYTHON_GPU={sys.executable}")
    assert f"{sys.executable} -m venv --system-site-packages .venv-gpu" in system
    assert "install -r requirements-system-torch.txt" in system
    assert f"{sys.executable} copes_lib/install_check.py torch" in system  # checked before anything is made
    assert "install_check.py torch-in-venv" in system
    stamp = lambda out: out.split("touch ")[-1].strip()  # noqa: E731
    assert stamp(plain) != stamp(system)  # switching rebuilds
    assert stamp(_make_n("venv-gpu", "SYSTEM_TORCH=0", f"PYTHON_GPU={sys.executable}")) == stamp(plain)


def test_cpu_venv_stays_python_311():
    out = _make_n("venv")
    assert "install -r requirements.txt" in out and "--system-site-packages" not in out
    assert "sys.version_info[:2] != (3, 11)" in out


def test_system_torch_requirements_are_the_pins_without_torch():
    system = _pins((REPO_ROOT / "requirements-system-torch.txt").read_text().splitlines(), "system-torch")
    gpu_lines = [line for line in (REPO_ROOT / "requirements-gpu.txt").read_text().splitlines()
                 if not line.startswith("-r")]
    expected = {k: v for k, v in requirements_pins().items() if k != "torch"} | _pins(gpu_lines, "gpu")
    assert system == expected
