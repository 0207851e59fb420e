"""`make lab` starts as root (GPU containers) and opens at the repository root."""

import subprocess

import pytest

from copes_lib import config


@pytest.mark.parametrize(("uid", "root_flag"), [("0", True), ("1000", False)])
def test_make_lab_roots_at_the_repository_and_allows_root_only_for_root(uid, root_flag):
    proc = subprocess.run(["make", "-n", "lab", f"LAB_UID={uid}", "LAB_ARGS=--no-browser"], cwd=config.REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "jupyter lab" in x)
    assert f'--ServerApp.root_dir="{config.REPO_ROOT}"' in line
    assert ("--allow-root" in line) == root_flag
    assert line.rstrip().endswith("--no-browser") and "notebooks/" not in line
