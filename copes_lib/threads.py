"""One CPU thread count for everything that trains or evaluates, whatever the machine.

Floating-point sums depend on how a reduction is split over threads, so a run's numbers could depend
on the core count, on ``JOBS`` (the runner divides the cores among concurrent notebooks) or on the
user's ``OMP_NUM_THREADS``. The suite therefore fixes torch's intra-op thread count to
:data:`N_FIXED` for

- every notebook kernel the runner starts (:func:`kernel_environment`, set by ``copes_lib.cli``),
- every :class:`copes_lib.runs.Run` (a notebook run from JupyterLab too), and
- the warm start (:func:`fixed_threads` around its training and evaluation),

and records what was in effect in every ``manifest.json`` (:func:`thread_info`).

``N_FIXED = 1``: it is the committed cpu run's setting (two notebooks at once on 2 cores). On the
development machine (AMD EPYC, AVX512, MKL 2024.2, torch 2.13) 1 and 2 threads gave bitwise equal
warm-start training in the short runs we could afford (tests/test_determinism.py checks the smoke
substrate), which is too little to trust 2 everywhere. The price: ``JOBS=1`` leaves the other cores
idle; use ``JOBS`` to fill them. What the thread count cannot fix: the instruction set of the CPU
(AVX512 vs AVX2 vs ARM) changes the kernels torch and MKL pick: forcing AVX2 on the development
machine changed the smoke warm start's stopping step (300 -> 350) and base accuracy (0.297 -> 0.266);
see docs/reproducibility.md.

The kernel pin (:data:`KERNEL_PIN`) reaches every process that imports the library, whatever started it
(``make``, the papermill command of docs/running.md, JupyterLab, a conda environment): ``import copes_lib``
calls :func:`apply_kernel_pin`, which sets the variables a process lacks. torch, MKL and oneDNN read them
lazily, at their first operation, not at ``import torch`` (measured with torch 2.13: ``get_cpu_capability()``,
``MKL_VERBOSE`` and ``ONEDNN_VERBOSE`` all follow variables set after ``import torch`` and before the first
tensor operation, and ignore them after it). Where the pin cannot take effect (a variable set to another value,
or torch already computing before the library was imported) it says so on the process's terminal (the
papermill or Jupyter console, not only inside the notebook) and the manifest records it
(``kernel_pin_problems``). The registered kernel (``make venv``) and environment.yml set the same variables
from the start.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

#: torch's intra-op thread count in every kernel, run and warm start of the suite.
N_FIXED = 1

#: the variables a kernel's math libraries read at start-up (OpenMP, MKL, OpenBLAS).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: variables that change which kernels (instruction set, reproducibility mode) torch, MKL and oneDNN pick.
KERNEL_CHOICE_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
#: the kernel choice every kernel the runner starts gets: AVX2, which every x86-64 CPU of the last decade
#: has, so machines with or without AVX512 pick the same kernels (issue 32 item 5); an AMD and an Intel machine
#: still differ bitwise under it (measured: docs/reproducibility.md). Read by
#: torch, MKL and oneDNN at start-up: they must be set before torch is imported.
KERNEL_PIN: dict[str, str] = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def kernel_environment(n: int = N_FIXED) -> dict[str, str]:
    """Environment variables that give a new process ``n`` math-library threads and the pinned kernels."""
    return {**{name: str(n) for name in THREAD_VARIABLES}, **KERNEL_PIN}


def kernel_pin_mismatch() -> dict[str, str | None]:
    """The :data:`KERNEL_PIN` variables this process lacks or has with another value (name -> value found)."""
    return {k: os.environ.get(k) for k, v in KERNEL_PIN.items() if os.environ.get(k) != v}


def kernel_pin_problems() -> list[str]:
    """Why :data:`KERNEL_PIN` is not in effect in this process, one sentence each ([] when it is): a variable
    set to another value, or torch's CPU kernels chosen before the pin was set (an AVX512 capability on a
    machine where the pin asks for AVX2; MKL and oneDNN cannot be asked, so this stands for all three)."""
    problems = [f"{name}={found!r} is set, the pin is {KERNEL_PIN[name]!r}" if found is not None else
                f"{name} is not set (the pin: {KERNEL_PIN[name]!r})" for name, found in kernel_pin_mismatch().items()]
    torch = sys.modules.get("torch")
    if torch is not None and not problems and KERNEL_PIN["ATEN_CPU_CAPABILITY"] == "avx2":
        capability = torch.backends.cpu.get_cpu_capability()  # fixed at torch's first operation
        if capability.upper().startswith("AVX512"):
            problems.append(f"torch had chosen its {capability} kernels before copes_lib set the pin (torch ran "
                            "an operation before the first `import copes_lib`)")
    return problems


#: ``COPES_KERNEL_PIN=off`` keeps ``import copes_lib`` from setting the pin (to measure without it, as
#: benchmarks/bench_kernel_pin.py does); the process still says that the pin is not in effect.
PIN_SWITCH = "COPES_KERNEL_PIN"


def apply_kernel_pin(warn: bool = True) -> list[str]:
    """Set the :data:`KERNEL_PIN` variables this process lacks (a variable already set is left as found;
    none with ``COPES_KERNEL_PIN=off``), then return :func:`kernel_pin_problems`; with ``warn``, each problem
    is also written to the process's terminal (``sys.__stderr__``: the papermill or Jupyter server console)
    and raised as a warning (shown in the notebook). Called by ``import copes_lib``, before any module of the
    library imports torch."""
    if os.environ.get(PIN_SWITCH, "").strip().lower() not in ("0", "off", "no", "false"):
        for name, value in KERNEL_PIN.items():
            os.environ.setdefault(name, value)
    problems = kernel_pin_problems()
    if problems and warn:
        warn_kernel_pin(problems)
    return problems


def warn_kernel_pin(problems: list[str]) -> None:
    """Say loudly, on the terminal and in the notebook, that the kernel pin is not in effect."""
    import warnings

    pin = " ".join(f"{k}={v}" for k, v in KERNEL_PIN.items())
    message = (f"copes_lib: the CPU-kernel pin is NOT in effect ({'; '.join(problems)}): this process's numbers "
               f"may differ from the committed ones. Start it with {pin} in its environment (make lab / make "
               "reproduce / the registered kernel / environment.yml do), or import copes_lib before any torch "
               "operation (docs/reproducibility.md).")
    terminal = sys.__stderr__
    if terminal is not None:
        with contextlib.suppress(OSError, ValueError):
            print(f"\n*** WARNING *** {message}\n", file=terminal, flush=True)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def cpu_model() -> dict[str, str]:
    """The CPU's vendor and model name, from /proc/cpuinfo (Linux), else from :mod:`platform`."""
    import platform

    found: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            key, _, value = line.partition(":")
            if key.strip() in ("vendor_id", "model name") and key.strip() not in found:
                found[key.strip()] = value.strip()
    return {"vendor": found.get("vendor_id") or platform.machine() or "unknown",
            "model": found.get("model name") or platform.processor() or "unknown"}


def fix_threads(n: int = N_FIXED) -> None:
    """Set torch's intra-op threads to ``n`` (and inter-op threads where torch still allows it)."""
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # inter-op threads can only be set before the first parallel op
        torch.set_num_interop_threads(n)


@contextlib.contextmanager
def fixed_threads(n: int = N_FIXED) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads, then restore the previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def thread_info() -> dict[str, Any]:
    """What decided this process's CPU arithmetic: threads, instruction set, math libraries."""
    import torch

    build = torch.__config__.show()
    blas = next((part.split("=", 1)[1] for part in build.replace("\n", ",").split(",")
                 if part.strip().startswith("BLAS_INFO=")), "unknown")
    mkl = next((line.strip(" -") for line in build.splitlines() if "Math Kernel Library" in line), None)
    return {
        "fixed_threads": N_FIXED,
        "intra_op_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "env": {name: os.environ.get(name) for name in THREAD_VARIABLES + KERNEL_CHOICE_VARIABLES},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": cpu_model(),
        "kernel_pin": KERNEL_PIN,
        "kernel_pin_missing": kernel_pin_mismatch(),
        "kernel_pin_problems": kernel_pin_problems(),
        "blas": blas,
        "mkl": mkl,
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


__all__ = ["N_FIXED", "THREAD_VARIABLES", "KERNEL_CHOICE_VARIABLES", "KERNEL_PIN", "kernel_pin_mismatch",
           "kernel_pin_problems", "apply_kernel_pin", "warn_kernel_pin", "PIN_SWITCH", "cpu_model", "kernel_environment", "fix_threads", "fixed_threads", "thread_info"]
