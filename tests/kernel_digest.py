"""A short smoke warm start's weight digest, in a fresh process with the given kernel environment.

Run by tests/test_determinism.py (a committed digest) and benchmarks/bench_kernel_pin.py (the pin's
cost): ``python tests/kernel_digest.py [--steps 20]`` prints one JSON line with the sha256 of the
weights' bytes, the loss curve, the CPU and the kernel variables the process saw.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    import torch

    from copes_lib import runs, threads
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.substrate import warm_start

    runs.CACHE_ROOT = runs.Path(tempfile.mkdtemp(prefix="kernel-digest-"))
    config = dataclasses.replace(substrate_config("smoke"), math_steps=args.steps, batch=8, eval_every=args.steps,
                                 eval_problems=4, max_new_tokens=8, math_target=0.0)
    start = time.perf_counter()
    model, _, info = warm_start("smoke", "math", seed=11, force=True, config=config, log=lambda s: None)
    seconds = time.perf_counter() - start
    weights = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().contiguous().numpy().tobytes())
    print(json.dumps({"sha256": weights.hexdigest(), "steps": info["steps"],
                      "losses": [p["loss"] for p in info["curve"][1:]], "seconds": seconds,
                      "cpu": threads.cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "kernel_env": {k: os.environ.get(k) for k in threads.KERNEL_PIN}}))


if __name__ == "__main__":
    main()
