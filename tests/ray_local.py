"""A Ray cluster of the test's own, isolated from any other Ray user on the machine.

``address="local"`` always starts a new cluster (never joins one named by ``RAY_ADDRESS`` or found under
``/tmp/ray``); its session files go to a private temporary folder (short: Unix socket paths are limited to
107 bytes); every port is chosen free by the OS (``RAY_*`` port and address variables of the environment
are set aside while it starts); no dashboard; a namespace of its own; a small object store (the default,
30% of memory, competes with other clusters for ``/dev/shm``).

Ray waits a fixed 30 s for its raylet to register (ray/_private/node.py, not configurable); on a machine
loaded far beyond its cores that wait can run out while nothing is wrong, so a start that times out is
tried again, up to ``STARTS`` times in all (a bounded amount of work, not a longer clock).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid

# environment variables through which another Ray user's settings would reach our cluster
STARTS = 3
_FOREIGN = ("RAY_ADDRESS", "RAY_NAMESPACE", "RAY_GCS_SERVER_PORT", "RAY_TMPDIR", "RAY_JOB_CONFIG_JSON_ENV_VAR")


@contextlib.contextmanager
def isolated_ray(num_cpus: int = 2, prefix: str = "ray_test_"):
    """``ray`` initialised on a fresh local cluster for the duration; shut down and deleted afterwards."""
    import ray

    temp_dirs = []
    saved = {name: os.environ.pop(name) for name in _FOREIGN if name in os.environ}
    try:
        for attempt in range(1, STARTS + 1):
            temp_dirs.append(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
            try:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                         configure_logging=False, _temp_dir=temp_dirs[-1],
                         namespace=f"copes-test-{uuid.uuid4().hex[:12]}", object_store_memory=100 * 2**20)
                break
            except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception on this timeout
                ray.shutdown()
                if attempt == STARTS or "timed out during startup" not in str(exc):
                    raise
                print(f"[ray_local] start {attempt} of {STARTS} timed out (a loaded machine); starting again")
        os.environ.update(saved)
        yield ray
    finally:
        os.environ.update(saved)
        ray.shutdown()
        for temp_dir in temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)
