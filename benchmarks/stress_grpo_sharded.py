"""Repeated 2-process sharded GRPO jobs (gloo, CPU, tiny model): none may fail (issue: a rank aborted at
teardown after process 0 had written result.pt, failing the notebook).

Each repeat is a fresh torchrun job of ``copes_lib.grpo_sharded`` with one GRPO update; a job counts as
failed when ``launch`` raises. Exit status 1 when any failed. tests/test_grpo_sharded.py runs 2 repeats;
the full 20 take ~5 minutes on 2 cores, too long for ``make test``:
  python benchmarks/stress_grpo_sharded.py --repeats 20
Measured on the shared 2-core CPU machine: without the barrier before ``destroy_process_group`` 2 of 20
jobs failed ("terminate called without an active exception", exit 1); with it 0 of 20 (~12 s per job).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from copes_lib import grpo  # noqa: E402
from copes_lib.budget import SubstrateSizes, build_substrate_model  # noqa: E402
from copes_lib.grpo_sharded import ShardingConfig, launch  # noqa: E402

SIZES = SubstrateSizes(layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=64, vocab=64)


def one_update(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    rows = 4
    batch = {"prompt_ids": [torch.randint(3, SIZES.vocab, (6,), generator=gen).tolist() for _ in range(rows)],
             "completion_ids": [torch.randint(3, SIZES.vocab, (5,), generator=gen).tolist() for _ in range(rows)],
             "model_mask": [[1] * 5 for _ in range(rows)]}
    from types import SimpleNamespace

    return {"batch": SimpleNamespace(**batch), "advantages": torch.linspace(-1.0, 1.0, rows), "pad_id": 0}


def run_jobs(repeats: int, work_dir: str | Path) -> dict:
    """``repeats`` jobs in ``work_dir``; returns counts, per-job seconds and the failures' messages."""
    work_dir = Path(work_dir)
    build_substrate_model(SIZES, seed=0).save_pretrained(work_dir / "model")
    config = grpo.GRPOConfig(group_size=2, prompt_batch_size=2, mini_batch_size=2, micro_batch_size=4, lr=1e-3,
                             kl_coef=0.0, seed=3)
    sharding = ShardingConfig(processes=2, backend="gloo", param_dtype="float32", activation_checkpointing=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    failures, seconds, teardown_warnings = [], [], 0
    for k in range(repeats):
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = launch(work_dir / "model", [one_update(k)], config, sharding, work_dir / f"job_{k:02d}",
                                env=env)
                if result["processes"] != 2 or len(result["stats"]) != 1:
                    failures.append(f"job {k}: incomplete result {sorted(result)}")
            except Exception as err:  # counted: the point of the check
                failures.append(f"job {k}: {type(err).__name__}: {str(err)[:500]}")
        teardown_warnings += sum("teardown" in str(w.message) for w in caught)
        seconds.append(time.perf_counter() - t0)
    return {"repeats": repeats, "failed": len(failures), "failures": failures,
            "accepted_after_teardown_failure": teardown_warnings, "job_s": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stress_grpo_sharded_") as tmp:
        out = run_jobs(args.repeats, tmp)
    print(f"{out['repeats']} jobs, {out['failed']} failed, {out['accepted_after_teardown_failure']} accepted "
          f"after a teardown failure, {sum(out['job_s']) / len(out['job_s']):.1f} s per job")
    for line in out["failures"]:
        print(line)
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
