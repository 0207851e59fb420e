"""Checks that ``make venv`` and ``make venv-gpu`` run before and after they build their venv, with a
clear message for what a researcher's box lacks. Standard library only: it runs on the interpreter the
venv is made from, before anything is installed (``python copes_lib/install_check.py python|torch|...``).

- ``python [--cpu]``: both environments take Python 3.11-3.13 (the pins have wheels for each; 3.11 is
  the tested reference). Run on ``PYTHON_GPU`` / ``PYTHON_CPU`` before the venv is created, so an
  unsupported Python is refused before anything exists.
- ``cpu-torch [--index URL] [--allow-cuda]`` (``make venv``, right after torch is installed without its
  dependencies): the torch pip took is the CPU build. Where the CPU index is unreachable or has no wheel
  for this Python, pip silently falls back to PyPI's torch, on Linux the CUDA build, whose dependencies
  are ~4.6 GB of CUDA libraries; this check stops there (before they are installed), says what was
  installed, why and how to get the CPU wheel. Read from ``torch/version.py`` without importing torch
  (a CUDA build does not import before its CUDA libraries are installed).
- ``torch`` (``SYSTEM_TORCH=1``): the interpreter already has a CUDA build of torch >= 2.7, which the
  venv then reuses (``--system-site-packages``) instead of installing torch 2.13 beside it. The
  interpreter may itself be a venv (a GPU box's ``python3`` often is): see ``parent-site``.
- ``parent-site VENV`` (``SYSTEM_TORCH=1``, run by that interpreter): a venv made from a venv sees the
  base interpreter's packages, not the parent venv's, so when this interpreter is a venv its
  site-packages folders are written into VENV's ``_copes_parent_venv.pth`` (after VENV's own on
  ``sys.path``: what pip installs into VENV comes first, the parent's torch is found). Nothing to do
  for a Python that is not a venv.
- ``venv``: an existing .venv-gpu was made the same way (with or without the system's packages).
- ``torch-in-venv`` (``SYSTEM_TORCH=1``): after the install, torch is still the system's.
- ``cuda``: after the install, whether torch in the venv sees a CUDA GPU (a warning only: a login
  node without a GPU can still build the environment).
"""

from __future__ import annotations

import sys
from pathlib import Path

GPU_PYTHONS = ((3, 11), (3, 12), (3, 13))
MIN_SYSTEM_TORCH = (2, 7)
REFERENCE_TORCH = "2.13.0"  # requirements.txt's pin: the version the suite is tested with


def python_error(version: tuple[int, int], cpu: bool = False, executable: str = "") -> str | None:
    """Why this Python cannot build the venv (``cpu``: .venv, chosen by PYTHON_CPU; else .venv-gpu)."""
    if tuple(version[:2]) in GPU_PYTHONS:
        return None
    valid = ", ".join(f"{a}.{b}" for a, b in GPU_PYTHONS)
    venv, variable = (".venv", "PYTHON_CPU") if cpu else (".venv-gpu", "PYTHON_GPU")
    which = f" ({executable})" if executable else ""
    return (f"error: Python {version[0]}.{version[1]}{which} cannot build {venv}; valid versions: {valid} "
            f"(set {variable}=/path/to/python3.12, for example); nothing was created")


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def torch_error(version: str | None, cuda: str | None) -> str | None:
    """Why ``SYSTEM_TORCH=1`` cannot reuse this interpreter's torch (None: it can; a venv's too)."""
    if version is None:
        return ("error: SYSTEM_TORCH=1 but this Python has no torch: install a CUDA build of torch >= "
                f"{'.'.join(map(str, MIN_SYSTEM_TORCH))}, or run `make venv-gpu` without SYSTEM_TORCH "
                f"(installs torch {REFERENCE_TORCH}, the tested reference)")
    if _release(version) < MIN_SYSTEM_TORCH:
        return (f"error: SYSTEM_TORCH=1 but torch {version} is older than "
                f"{'.'.join(map(str, MIN_SYSTEM_TORCH))}; upgrade it, or run `make venv-gpu` without "
                f"SYSTEM_TORCH (torch {REFERENCE_TORCH})")
    if cuda is None:
        return (f"error: SYSTEM_TORCH=1 but torch {version} is a CPU build (torch.version.cuda is None); no CUDA "
                f"torch found. Install a CUDA build, or run `make venv-gpu` without SYSTEM_TORCH (torch "
                f"{REFERENCE_TORCH})")
    return None


def read_torch_build(version_py: str) -> tuple[str | None, str | None, str | None]:
    """(``__version__``, ``cuda``, ``hip``) from the text of an installed ``torch/version.py``.

    >>> read_torch_build("__version__ = '2.13.0+cu130'\\ncuda: Optional[str] = '13.0'\\nhip: Optional[str] = None\\n")
    ('2.13.0+cu130', '13.0', None)
    """
    import re

    found = {}
    for name in ("__version__", "cuda", "hip"):
        match = re.search(rf"^{name}(?:\s*:[^=]*)?\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", version_py, re.M)
        found[name] = (match.group(1) or match.group(2)) if match and (match.group(1) or match.group(2)) else None
    return found["__version__"], found["cuda"], found["hip"]


def cpu_torch_error(version: str | None, cuda: str | None, hip: str | None, python: tuple[int, int],
                    index: str = "", pin: str = REFERENCE_TORCH) -> str | None:
    """Why the torch ``make venv`` just installed is not the CPU build it asked for (None: it is).

    ``version``, ``cuda``, ``hip``: from torch/version.py (:func:`read_torch_build`); ``index``: the CPU
    index pip was given (``TORCH_INDEX``; empty: none)."""
    if version is None:
        return "error: make venv installed no torch (torch/version.py not found); rerun `make venv`"
    if cuda is None and hip is None:
        return None
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}"
    py = f"{python[0]}.{python[1]}"
    tag = f"cp{python[0]}{python[1]}"
    why = (f"the CPU index {index} was unreachable or had no torch {pin} wheel for Python {py} here (a local "
           f"wheel folder, PIP_FIND_LINKS, holding only other Pythons' CPU wheels does the same), so pip took "
           "PyPI's torch, which on Linux is the CUDA build" if index else
           "TORCH_INDEX is empty, so pip took PyPI's torch, which on Linux is the CUDA build")
    return (f"error: make venv asked for torch {pin}'s CPU build but pip installed torch {version} ({build}): "
            f"{why}. It was removed again and nothing else was installed: its dependencies are ~4.6 GB of "
            f"{build.split()[0]} libraries, which the suite's CPU profiles do not use.\n"
            f"  Get the CPU wheel: rerun `make venv` where {index or 'https://download.pytorch.org/whl/cpu'} is "
            f"reachable (TORCH_INDEX={index or 'https://download.pytorch.org/whl/cpu'}); or offline, on a networked machine: "
            f"pip download --no-deps --only-binary=:all: --python-version {py} --platform manylinux_2_28_x86_64 "
            f"--index-url https://download.pytorch.org/whl/cpu -d wheels torch=={pin} "
            f"(a torch-{pin}+cpu-{tag}-... wheel), then here: PIP_FIND_LINKS=wheels make venv.\n"
            "  Or keep a CUDA torch on purpose: `make venv ALLOW_CUDA_TORCH=1` (this build, with its CUDA "
            "libraries), or the gpu environment, `make venv-gpu` (`make venv-gpu SYSTEM_TORCH=1` reuses a CUDA "
            "torch already installed; docs/gpu_install.md).")


def installed_torch_build() -> tuple[str | None, str | None, str | None]:
    """:func:`read_torch_build` of the torch installed for this interpreter, without importing it."""
    from importlib import metadata

    try:
        version_py = metadata.distribution("torch").locate_file("torch/version.py")
        return read_torch_build(Path(version_py).read_text())
    except (metadata.PackageNotFoundError, OSError):
        return None, None, None


def venv_error(pyvenv_cfg: str, system_torch: bool) -> str | None:
    """Whether an existing venv's ``pyvenv.cfg`` matches the requested kind."""
    shared = any(line.replace(" ", "").lower() == "include-system-site-packages=true"
                 for line in pyvenv_cfg.splitlines())
    if shared == system_torch:
        return None
    made = "with" if shared else "without"
    return (f"error: .venv-gpu was made {made} the system's packages but SYSTEM_TORCH="
            f"{'1' if system_torch else '0'} asks otherwise; delete .venv-gpu and rerun")


def parent_site(venv: Path) -> str | None:
    """When this interpreter is a venv, make ``venv`` (made from it with --system-site-packages) see this
    venv's packages too: a .pth file with this interpreter's site-packages folders, written atomically."""
    import os
    import site

    if sys.prefix == sys.base_prefix:
        return None  # --system-site-packages already shows this interpreter's packages
    targets = sorted(venv.glob("lib/python*/site-packages")) + sorted(venv.glob("Lib/site-packages"))
    if not targets:
        return f"error: {venv} has no lib/python*/site-packages: is it a venv made by `make venv-gpu`?"
    path = targets[0] / "_copes_parent_venv.pth"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(f"{folder}\n" for folder in site.getsitepackages()))
    os.replace(tmp, path)
    print(f"{venv} sees the packages of {sys.prefix} (its torch) through {path.name}")
    return None


def _torch_info() -> tuple[str | None, str | None, bool]:
    try:
        import torch
    except ImportError:
        return None, None, False
    return torch.__version__, torch.version.cuda, bool(torch.cuda.is_available())


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    if what == "python":
        error = python_error(sys.version_info[:2], cpu="--cpu" in argv, executable=sys.executable)
    elif what == "cpu-torch":
        version, cuda, hip = installed_torch_build()
        index = argv[argv.index("--index") + 1] if "--index" in argv[:-1] else ""
        error = cpu_torch_error(version, cuda, hip, sys.version_info[:2], index)
        if error and "--allow-cuda" in argv and version is not None:
            print(f"warning: torch {version} is a GPU build (ALLOW_CUDA_TORCH=1): its CUDA libraries come next, "
                  "GBs more than the CPU build", file=sys.stderr)
            error = None
        elif error is None:
            print(f"torch {version}: the CPU build")
    elif what == "torch":
        version, cuda, _ = _torch_info()
        error = torch_error(version, cuda)
        if error is None:
            where = f" (a venv: {sys.prefix})" if sys.prefix != sys.base_prefix else ""
            print(f"using this Python's torch {version} (CUDA {cuda}){where}; the tested reference is {REFERENCE_TORCH}")
    elif what == "parent-site":
        error = parent_site(Path(argv[1])) if len(argv) > 1 else "error: install_check parent-site needs the venv folder"
    elif what == "torch-in-venv":  # after the install: still the system's torch, not one pip added
        import torch

        version, cuda, _ = _torch_info()
        error = torch_error(version, cuda)
        if error is None and Path(torch.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()):
            error = (f"error: pip installed torch {version} into {sys.prefix} although SYSTEM_TORCH=1 (a pinned "
                     "package asked for another torch); delete .venv-gpu, and check the system torch's version")
    elif what == "venv":
        error = venv_error((Path(sys.prefix) / "pyvenv.cfg").read_text(), "--system-torch" in argv)
        error = error or python_error(sys.version_info[:2])
    elif what == "cuda":
        version, cuda, available = _torch_info()
        if not available:
            print(f"warning: torch {version} in {sys.prefix} sees no CUDA GPU (CUDA build: {cuda}); "
                  "requirements-gpu.txt says how to get the CUDA wheel", file=sys.stderr)
        return 0
    else:
        error = (f"error: install_check what = {what!r} is not valid; valid values: ['python', 'cpu-torch', 'torch', "
                 "'venv', 'parent-site', 'torch-in-venv', 'cuda']")
    if error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
