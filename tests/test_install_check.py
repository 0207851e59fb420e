"""`make venv-gpu` on a researcher's box: Python 3.11-3.13, SYSTEM_TORCH=1 reusing an installed CUDA
torch >= 2.7 (clear messages when there is none), the CPU `make venv` path untouched."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_env_pins import _canonical, _pins, requirements_pins

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
    assert ic.torch_error("2.7.0+cu126", "12.6") is None
    assert ic.torch_error("2.11.0", "13.0") is None  # from a venv too (parent-site makes it visible)
    assert "no torch" in ic.torch_error(None, None)
    assert "older than 2.7" in ic.torch_error("2.6.0+cu124", "12.4")
    cpu = ic.torch_error("2.13.0+cpu", None)
    assert "CPU build" in cpu and "no CUDA torch found" in cpu and ic.REFERENCE_TORCH in cpu
    assert ic.REFERENCE_TORCH == requirements_pins()["torch"]  # 2.13 stays the tested reference


def test_existing_venv_must_match_the_switch():
    shared = "home = /usr/bin\ninclude-system-site-packages = true\n"
    assert ic.venv_error(shared, True) is None
    assert "delete .venv-gpu" in ic.venv_error(shared, False)
    assert "delete .venv-gpu" in ic.venv_error("include-system-site-packages = false\n", True)


def test_cli_judges_torch_not_whether_python_is_a_venv():
    done = subprocess.run([sys.executable, str(REPO_ROOT / "copes_lib" / "install_check.py"), "torch"],
                          capture_output=True, text=True)
    assert "itself a venv" not in done.stderr
    import torch

    if torch.version.cuda is None:  # this venv's torch is a CPU build: refused for that reason alone
        assert done.returncode == 1 and "CPU build" in done.stderr
    bad = subprocess.run([sys.executable, str(REPO_ROOT / "copes_lib" / "install_check.py"), "nonsense"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "valid values" in bad.stderr


def test_a_venv_made_from_a_venv_sees_the_parents_torch(tmp_path):
    """SYSTEM_TORCH=1 from a Python that is itself a venv (the test venv): the child venv, made with
    --system-site-packages, sees only the base interpreter's packages until parent-site links the parent's."""
    assert sys.prefix != sys.base_prefix, "run from the venv"
    child = tmp_path / "venv-gpu"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(child)], check=True)
    probe = [str(child / "bin" / "python"), "-c", "import torch, sys; print(torch.__file__)"]
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    before = subprocess.run(probe, capture_output=True, text=True, env=env)
    base_has_torch = before.returncode == 0 and not before.stdout.strip().startswith(sys.prefix)
    done = subprocess.run([sys.executable, str(REPO_ROOT / "copes_lib" / "install_check.py"), "parent-site",
                           str(child)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = subprocess.run(probe, capture_output=True, text=True, env=env, check=True)
    import torch

    assert base_has_torch or after.stdout.strip() == torch.__file__  # the parent venv's torch
    missing = subprocess.run([sys.executable, str(REPO_ROOT / "copes_lib" / "install_check.py"), "parent-site",
                              str(tmp_path / "nothing")], capture_output=True, text=True)
    assert missing.returncode == 1 and "no lib/python" in missing.stderr


def test_offline_venv_gpu_from_a_wheelhouse():
    """WHEELHOUSE=dir: every pip call of make venv-gpu is --no-index --find-links dir; a missing folder is
    a clear error naming the command that makes it."""
    out = _make_n("venv-gpu", "WHEELHOUSE=/tmp/wheelhouse", f"PYTHON_GPU={sys.executable}")
    pip_calls = [line for line in out.splitlines() if " -m pip install" in line]
    assert len(pip_calls) == 2 and all("--no-index --find-links /tmp/wheelhouse" in c for c in pip_calls)
    assert "--no-index" not in _make_n("venv-gpu", f"PYTHON_GPU={sys.executable}")
    assert "make gpu-wheelhouse WHEELHOUSE=/tmp/wheelhouse" in out
    download = _make_n("gpu-wheelhouse", "WHEELHOUSE=/tmp/wheelhouse", f"PYTHON_GPU={sys.executable}")
    assert "pip download -d /tmp/wheelhouse -r requirements-gpu.txt" in download and "setuptools" in download


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
    assert f"{sys.executable} copes_lib/install_check.py parent-site .venv-gpu" in system
    stamp = lambda out: out.split("touch ")[-1].strip()  # noqa: E731
    assert stamp(plain) != stamp(system)  # switching rebuilds
    assert stamp(_make_n("venv-gpu", "SYSTEM_TORCH=0", f"PYTHON_GPU={sys.executable}")) == stamp(plain)


def test_cpu_venv_takes_python_311_to_313_and_cpu_torch():
    out = _make_n("venv")
    assert "install -r requirements.txt" in out and "--system-site-packages" not in out
    assert "not (3, 11) <= sys.version_info[:2] <= (3, 13)" in out and "valid versions: 3.11, 3.12, 3.13" in out
    torch_pin = f"torch=={requirements_pins()['torch']}"
    assert f"pip install --no-deps --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu {torch_pin}" in out
    assert out.index(torch_pin) < out.index("install -r requirements.txt")  # CPU torch first, then the rest
    # pip writes no bytecode (one file at a time); one compileall on every core after the last install does
    installs = [line for line in out.splitlines() if " -m pip install " in line and " -e ." not in line]
    assert installs and all("--no-compile" in line for line in installs), installs
    assert out.index("-m compileall -q -j 0 .venv/lib") > out.index("pip install --no-deps -e .")
    assert "--extra-index-url" not in _make_n("venv", "TORCH_INDEX=")
    chosen = _make_n("venv", "PYTHON_CPU=/opt/python3.12/bin/python3")
    assert "/opt/python3.12/bin/python3 -m venv .venv" in chosen


def test_registered_kernel_gets_the_kernel_pin():
    from copes_lib import threads

    out = _make_n("venv")
    line = next(x for x in out.splitlines() if "ipykernel install" in x)
    assert all(f"--env {k} {v}" in line for k, v in threads.KERNEL_PIN.items()), line


def test_system_torch_requirements_are_the_pins_without_torch():
    """requirements-system-torch.txt and its --no-deps part hold every pin but torch, each once."""
    system = _pins(_lines("requirements-system-torch.txt"), "system-torch")
    nodeps = _pins(_lines("requirements-system-torch-nodeps.txt"), "system-torch-nodeps")
    assert not set(system) & set(nodeps)
    gpu_lines = [line for line in _lines("requirements-gpu.txt") if not line.startswith("-r")]
    expected = {k: v for k, v in requirements_pins().items() if k != "torch"} | _pins(gpu_lines, "gpu")
    assert {k: v for k, v in (system | nodeps).items() if k in expected} == expected
    assert set(nodeps) - set(expected) == {"accelerate"}  # peft's dependency, pinned for --no-deps


TORCH_FAMILY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def _lines(name: str) -> list[str]:
    return (REPO_ROOT / name).read_text().splitlines()


def _requires(name: str) -> set[str] | None:
    """The names a distribution installed here needs (extras left out, markers judged here), None when
    it is not installed here (.venv lacks the GPU extras)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        lines = metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return None
    needs = set()
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            needs.add(_canonical(requirement.name))
    return needs


def _closure(names) -> dict[str, str]:
    """Every distribution ``names`` pull in, each with the one that asked for it first (a pin: itself)."""
    via = {name: name for name in names}
    todo = list(names)
    while todo:
        name = todo.pop()
        for need in (_requires(name) or set()) - set(via):
            via[need] = name
            todo.append(need)
    return via


def test_system_torch_install_pulls_no_torch_or_cuda_wheel():
    """What pip installs with dependencies for SYSTEM_TORCH=1 reaches no torch, triton, nvidia-* or cuda-*
    package (judged on the metadata of the distributions installed here, the same pins), and what the
    --no-deps file leaves out (torch aside) comes with the rest. A pin that starts to need torch fails here
    until it moves to requirements-system-torch-nodeps.txt."""
    system = _pins(_lines("requirements-system-torch.txt"), "system-torch")
    nodeps = _pins(_lines("requirements-system-torch-nodeps.txt"), "system-torch-nodeps")
    pulled = _closure(system)
    assert len(pulled) > 2 * len(system)  # the metadata was read (.venv has these pins installed)
    torchy = {name: via for name, via in pulled.items() if TORCH_FAMILY.match(name)}
    assert not torchy, f"pulled in by (first asker): {torchy}; move those pins to requirements-system-torch-nodeps.txt"
    for name in nodeps:
        needs = _requires(name)
        assert needs is not None and "torch" in needs, f"{name} no longer needs torch: move it back"
        missing = {n for n in needs if not TORCH_FAMILY.match(n)} - set(pulled) - set(nodeps)
        assert not missing, f"{name} needs {missing}, which nothing else installs: pin them in requirements-system-torch.txt"


def test_system_torch_wheelhouse_and_venv_use_no_deps_for_the_torch_dependents():
    """make -n: with SYSTEM_TORCH=1 both the wheelhouse and the venv take requirements-system-torch-nodeps.txt
    with --no-deps (offline too); without it, requirements-gpu.txt alone, as before."""
    python = f"PYTHON_GPU={sys.executable}"
    wheelhouse = _make_n("gpu-wheelhouse", "SYSTEM_TORCH=1", "WHEELHOUSE=/tmp/wh", python)
    assert "pip download -d /tmp/wh -r requirements-system-torch.txt" in wheelhouse
    assert "pip download --no-deps -d /tmp/wh -r requirements-system-torch-nodeps.txt" in wheelhouse
    venv = _make_n("venv-gpu", "SYSTEM_TORCH=1", "WHEELHOUSE=/tmp/wh", python)
    pip_calls = [line for line in venv.splitlines() if " -m pip install" in line]
    assert len(pip_calls) == 3 and all("--no-index --find-links /tmp/wh" in c for c in pip_calls)
    assert any("install --no-deps -r requirements-system-torch-nodeps.txt" in c for c in pip_calls)
    assert "nodeps" not in _make_n("gpu-wheelhouse", python) + _make_n("venv-gpu", python)


CUDA_VERSION_PY = "__version__ = '2.13.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
CPU_VERSION_PY = "__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"


def test_cpu_route_names_a_cuda_torch():
    """make venv's check after torch is installed: the CPU build passes; a CUDA (or ROCm) build is an error
    saying what was installed, why, how to get the CPU wheel for this Python, and the deliberate ways out."""
    assert ic.read_torch_build(CPU_VERSION_PY) == ("2.13.0+cpu", None, None)
    assert ic.read_torch_build(CUDA_VERSION_PY) == ("2.13.0+cu130", "13.0", None)
    assert ic.cpu_torch_error("2.13.0+cpu", None, None, (3, 13), "https://download.pytorch.org/whl/cpu") is None
    assert ic.cpu_torch_error("2.13.0", None, None, (3, 11)) is None  # macOS: PyPI's torch is a CPU build, no tag
    error = ic.cpu_torch_error("2.13.0+cu130", "13.0", None, (3, 13), "https://download.pytorch.org/whl/cpu")
    assert error.startswith("error: ") and "torch 2.13.0+cu130 (CUDA 13.0)" in error
    assert "https://download.pytorch.org/whl/cpu was unreachable" in error and "Python 3.13" in error
    assert "--python-version 3.13" in error and "cp313" in error and "PIP_FIND_LINKS" in error
    assert "ALLOW_CUDA_TORCH=1" in error and "SYSTEM_TORCH=1" in error
    assert "TORCH_INDEX is empty" in ic.cpu_torch_error("2.13.0", "13.0", None, (3, 12), "")
    assert "ROCm 6.4" in ic.cpu_torch_error("2.13.0+rocm6.4", None, "6.4", (3, 12), "x")
    assert "no torch" in ic.cpu_torch_error(None, None, None, (3, 12), "x")


def test_cpu_python_is_checked_before_anything_is_created():
    for version in ((3, 10), (3, 14)):
        error = ic.python_error(version, cpu=True, executable="/usr/bin/python3.10")
        assert "PYTHON_CPU" in error and ".venv" in error and "3.11, 3.12, 3.13" in error
        assert "nothing was created" in error and "/usr/bin/python3.10" in error
    out = _make_n("venv", "PYTHON_CPU=/opt/python3.12/bin/python3")
    check = out.index("/opt/python3.12/bin/python3 copes_lib/install_check.py python --cpu")
    assert check < out.index("-m venv .venv")
    torch_line = out.index("torch==")
    assert torch_line < out.index("install_check.py cpu-torch --index https://download.pytorch.org/whl/cpu")
    assert out.index("cpu-torch") < out.index("install -r requirements.txt")
    assert "--allow-cuda" not in out and "--allow-cuda" in _make_n("venv", "ALLOW_CUDA_TORCH=1")


def _fake_torch_wheel(folder, version_py: str):
    """A stand-in for PyPI's torch 2.13.0 wheel (no local tag, as PyPI's CUDA build): only torch/version.py."""
    import base64
    import hashlib
    import zipfile

    files = {"torch/__init__.py": "", "torch/version.py": version_py,
             "torch-2.13.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n",
             "torch-2.13.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for name, text in files.items()) + "torch-2.13.0.dist-info/RECORD,,\n"
    wheel = folder / "torch-2.13.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in {**files, "torch-2.13.0.dist-info/RECORD": record}.items():
            zf.writestr(name, text)
    return wheel


@pytest.mark.slow(cost=20)
def test_make_venv_stops_at_a_cuda_torch(tmp_path):
    """The real `make venv` recipe, offline, with a stand-in wheel for PyPI's CUDA torch in the only wheel
    folder: it stops after torch with the message, removes torch again, installs nothing else, no stamp.
    And a PYTHON_CPU of an unsupported version is refused before the venv exists."""
    import os
    import shutil

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_torch_wheel(wheels, CUDA_VERSION_PY)
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)  # a venv of the test venv's own base Python
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["make", "--no-print-directory", "venv", f"VENV={venv}", f"PYTHON_CPU={base}",
                           "TORCH_INDEX="], cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 0
    assert "error: make venv asked for torch 2.13.0's CPU build but pip installed torch 2.13.0+cu130 (CUDA 13.0)" \
        in done.stderr, done.stderr
    assert "install -r requirements.txt" not in done.stdout  # stopped before the CUDA libraries
    assert not list(venv.glob("lib/python*/site-packages/torch")), "the CUDA torch stays installed"
    assert not list(venv.glob(".installed-*"))
    candidates = [*sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python3.10")), shutil.which("python3.10")]
    old = next((str(c) for c in candidates if c and subprocess.run([str(c), "-c", ""], capture_output=True).returncode == 0),
               None)
    if old is None:
        return  # no Python 3.10 here: the unsupported-version check is covered by test_cpu_python_is_checked...
    refused = subprocess.run(["make", "--no-print-directory", "venv", f"VENV={tmp_path / 'old'}",
                              f"PYTHON_CPU={old}"], cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0 and "cannot build .venv; valid versions: 3.11, 3.12, 3.13" in refused.stderr
    assert not (tmp_path / "old").exists()


def test_importing_nbformat_builds_no_iri_grammar():
    """jsonschema 4.25+ (through the extra jupyter-events asks for) brings rfc3987-syntax, whose import builds 38
    Earley parsers: 1.3 s of CPU more in every process that imports nbformat, papermill or ray. The pin in
    requirements.txt keeps it out; this fails if an unpinned or newer jsonschema brings it back."""
    probe = ("import sys, nbformat.validator, jsonschema._format; "
             "print(sorted(m for m in ('rfc3987_syntax', 'lark') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
