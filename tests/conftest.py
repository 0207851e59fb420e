"""Test-wide environment: nothing from a model hub, few threads (2 cores are shared), quiet kernels.

Set at import, before any test imports torch, so the papermill kernels that tests start inherit it.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warning
os.environ.setdefault("JUPYTER_PREFER_ENV_PATH", "1")  # the venv's python3 kernel, not a user one
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """Start slow tests (the all-notebooks smoke run) first, so with `-n 2` they overlap the unit tests."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
