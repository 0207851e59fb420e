"""The kernel pin's cost: a short smoke warm start with and without threads.KERNEL_PIN, measured in the same run.

Each round starts two fresh processes (tests/kernel_digest.py; kernels are chosen when torch loads, so the pin
cannot be switched inside one process): one with the pin (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2,STRICT,
ONEDNN_MAX_CPU_ISA=AVX2), one with those variables removed (torch's own dispatch: AVX512 where the CPU has
it). Rounds alternate the order; the best round of each counts (the machine is shared). Saved to
results/bench/kernel_pin.json: seconds, the ratio pinned / unpinned, and whether the two give the same weights
(on a CPU with AVX512 they do not: that difference is what the pin removes between machines).

Run: ``.venv/bin/python benchmarks/bench_kernel_pin.py [--rounds 3] [--steps 40]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from copes_lib import runs, threads

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "kernel_digest.py"


def measure(pinned: bool, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in threads.KERNEL_PIN}
    env.update({name: "1" for name in threads.THREAD_VARIABLES}, HF_HUB_OFFLINE="1")
    if pinned:
        env.update(threads.KERNEL_PIN)
    else:
        env[threads.PIN_SWITCH] = "off"  # else `import copes_lib` in the child sets the pin itself
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", str(steps)], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    seen: dict[str, list[dict]] = {"pinned": [], "unpinned": []}
    for i in range(args.rounds):
        order = ("pinned", "unpinned") if i % 2 == 0 else ("unpinned", "pinned")
        for name in order:
            seen[name].append(measure(name == "pinned", args.steps))
            print(f"round {i + 1} {name}: {seen[name][-1]['seconds']:.2f} s ({seen[name][-1]['cpu_capability']})")
    best = {name: min(r["seconds"] for r in rows) for name, rows in seen.items()}
    out = {"steps": args.steps, "rounds": args.rounds, "cpu": seen["pinned"][0]["cpu"],
           "capability_unpinned": seen["unpinned"][0]["cpu_capability"],
           "capability_pinned": seen["pinned"][0]["cpu_capability"],
           "pinned_s": best["pinned"], "unpinned_s": best["unpinned"],
           "pinned_over_unpinned": best["pinned"] / best["unpinned"],
           "same_weights": seen["pinned"][0]["sha256"] == seen["unpinned"][0]["sha256"],
           "pinned_is_deterministic": len({r["sha256"] for r in seen["pinned"]}) == 1}
    print(json.dumps(out, indent=1))
    path = runs.REPO_ROOT / "results" / "bench" / "kernel_pin.json"
    runs.atomic_write_json(path, out)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
