"""The CPU-kernel pin (copes_lib/threads.py KERNEL_PIN) reaches every process that runs the suite's code,
whatever starts it: the documented papermill command without the Makefile's environment, the registered
kernel, conda's environment.yml, a bare `import copes_lib`; where it cannot take effect the process says so
on its terminal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from copes_lib import threads
from copes_lib.config import REPO_ROOT

VENV_BIN = Path(sys.executable).parent
#: does this CPU have AVX512 (where an unpinned torch picks other kernels than the pin's AVX2)?
AVX512 = "avx512f" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False


def _unpinned_env(**extra: str) -> dict[str, str]:
    """This process's environment without the pin (as a shell that never ran make has it)."""
    env = {k: v for k, v in os.environ.items() if k not in threads.KERNEL_CHOICE_VARIABLES}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


PROBE = ("import os, sys, json\n{before}\nimport copes_lib, torch\nfrom copes_lib import threads\n"
         "torch.ones(3) @ torch.ones(3)\n"
         "print(json.dumps({{'env': {{k: os.environ.get(k) for k in threads.KERNEL_PIN}}, "
         "'capability': torch.backends.cpu.get_cpu_capability(), 'problems': threads.kernel_pin_problems()}}))")


def _probe(before: str = "", **env: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], env=_unpinned_env(**env),
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_import_copes_lib_sets_the_pin_before_torch_computes():
    found, stderr = _probe()
    assert found["env"] == threads.KERNEL_PIN and found["problems"] == [] and "NOT in effect" not in stderr
    if AVX512:
        assert found["capability"] == "AVX2"  # unpinned, this machine would use AVX512 kernels


def test_import_after_torch_but_before_its_first_operation_still_pins():
    found, _ = _probe(before="import torch")
    assert found["env"] == threads.KERNEL_PIN and found["problems"] == []
    if AVX512:
        assert found["capability"] == "AVX2"


@pytest.mark.skipif(not AVX512, reason="only an AVX512 CPU shows that torch chose its kernels before the pin")
def test_too_late_is_said_on_the_terminal():
    found, stderr = _probe(before="import torch; torch.ones(2) + 1")
    assert found["capability"].startswith("AVX512") and found["problems"], found
    assert "*** WARNING *** copes_lib: the CPU-kernel pin is NOT in effect" in stderr


def test_the_switch_leaves_a_process_unpinned_and_says_so():
    """COPES_KERNEL_PIN=off (benchmarks/bench_kernel_pin.py's unpinned arm) measures without the pin."""
    found, stderr = _probe(COPES_KERNEL_PIN="off")
    assert found["env"] == {k: None for k in threads.KERNEL_PIN} and len(found["problems"]) == 3
    assert "NOT in effect" in stderr
    if AVX512:
        assert found["capability"] == "AVX512"


def test_a_different_value_is_kept_and_said_on_the_terminal():
    found, stderr = _probe(MKL_CBWR="AUTO")
    assert found["env"]["MKL_CBWR"] == "AUTO" and found["env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert found["problems"] == ["MKL_CBWR='AUTO' is set, the pin is 'AVX2,STRICT'"]
    assert "*** WARNING ***" in stderr and "MKL_CBWR='AUTO'" in stderr


def test_registered_kernel_carries_the_pin():
    """`make venv` registers the venv's python3 kernel with the pin in kernel.json's env, so papermill and
    JupyterLab started from any shell start kernels with it."""
    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    if not spec.exists() or sys.prefix == sys.base_prefix:
        pytest.skip(f"no venv kernel at {spec} (run `make venv`)")
    assert json.loads(spec.read_text()).get("env") == threads.KERNEL_PIN, f"{spec}: rerun `make venv`"


def test_environment_yml_sets_the_pin():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    assert env.get("variables") == threads.KERNEL_PIN


def _copy_of_the_suite(root: Path) -> Path:
    """The files a notebook run reads, in a folder of its own, so its results/ do not touch the repository's
    (the smoke suite may be writing results/smoke/00_suite_overview at the same time)."""
    for part in ("copes_lib", "notebooks", "profiles", "data"):
        shutil.copytree(REPO_ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    return root


@pytest.mark.parametrize("kernel", ["registered", "bare"])
def test_the_documented_papermill_command_records_the_pin(tmp_path, kernel):
    """docs/running.md's papermill command, from a shell that never ran make (no pin, no JUPYTER_* variables):
    notebook 00 under smoke writes a manifest whose kernel settings are the pin's. ``registered``: the venv's
    kernel (kernel.json carries the pin); ``bare``: a kernel without it, as conda's or a user's own kernel
    spec may be (then `import copes_lib` sets it)."""
    papermill = VENV_BIN / "papermill"
    if not papermill.exists():
        pytest.skip(f"{papermill} not installed")
    suite = _copy_of_the_suite(tmp_path / "suite")
    env = _unpinned_env(PYTHONPATH=str(suite), COPES_OUTPUT_ROOT=str(suite), COPES_CACHE_ROOT=str(suite / "cache"))
    env = {k: v for k, v in env.items() if not k.startswith("JUPYTER_")}
    command = [str(papermill), "notebooks/00_suite_overview.ipynb", str(tmp_path / "out.ipynb"), "-p", "PROFILE",
               "smoke"]
    if kernel == "bare":
        spec = tmp_path / "jupyter" / "kernels" / "bare"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                                               "{connection_file}"], "language": "python",
                                                      "display_name": "bare"}))
        env["JUPYTER_PATH"] = str(tmp_path / "jupyter")
        command += ["-k", "bare"]
    done = subprocess.run(command, cwd=suite, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "NOT in effect" not in done.stderr, done.stderr[-2000:]
    manifest = json.loads((suite / "results" / "smoke" / "00_suite_overview" / "manifest.json").read_text())
    recorded = manifest["threads"]
    assert {k: recorded["env"][k] for k in threads.KERNEL_PIN} == threads.KERNEL_PIN, recorded
    assert recorded["kernel_pin_missing"] == {} and recorded["kernel_pin_problems"] == []
    if AVX512:
        assert recorded["cpu_capability"] == "AVX2", recorded
