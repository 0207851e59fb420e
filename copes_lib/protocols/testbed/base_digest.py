"""A digest of every base model, and a command that rebuilds one and compares.

Notebook 01 records the sha256 of each base it builds (``base_digest_<kind>_seed<seed>`` in its summary: the
math and QA bases of ``SEED`` and the math spread seeds), so a user can check a reproduction bitwise on their
own machine::

    python -m copes_lib.protocols.testbed.base_digest --profile cpu --kind math --seed 0

trains that base from scratch in a temporary cache (the real cache is not touched), digests it and compares
with the digest the committed ``results/<profile>/01_substrate_and_agent/summary.json`` records; exit status
0 when they are equal, 1 when they differ, 2 when no digest is recorded for that base. A rebuild takes as long
as 01's warm start of that base (cpu: about 13 min per base on 2 cores). Bitwise equality needs the same
kernel pin (``copes_lib.threads``; docs/reproducibility.md) and the same CPU vendor.

The digest (:func:`copes_lib.bases.state_digest`) hashes the state dict in sorted key order, each entry's name, dtype and
shape before its raw bytes, so a renamed, retyped or reshaped tensor changes it as surely as a changed value.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from copes_lib import runs
from copes_lib.bases import state_digest

SUBSTRATE_NOTEBOOK = "01_substrate_and_agent"


def digest_key(kind: str, seed: int) -> str:
    """01's summary key of a base's digest.

    >>> digest_key("math", 0)
    'base_digest_math_seed0'
    """
    return f"base_digest_{kind}_seed{int(seed)}"


def summary_keys(models: Mapping[tuple[str, int], Any]) -> dict[str, str]:
    """``base_digest_<kind>_seed<seed>`` for each (kind, seed) -> model (or a digest already computed)."""
    return {digest_key(kind, seed): m if isinstance(m, str) else state_digest(m) for (kind, seed), m in models.items()}


def rebuild_digest(profile: str, kind: str, seed: int, *, config=None, log=print) -> str:
    """Train the base ``kind`` / ``seed`` of ``profile`` from scratch in a temporary cache (the real cache is
    neither read nor written) and return its digest. ``config``: the warm-start config (default: the
    profile's, ``substrate_setup.substrate_config``)."""
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.substrate import warm_start

    config = config or substrate_config(profile)
    saved = runs.CACHE_ROOT
    with tempfile.TemporaryDirectory(prefix="copes-rebuild-") as tmp:
        runs.CACHE_ROOT = Path(tmp)
        try:
            model, _, info = warm_start(profile, kind, seed=seed, force=True, config=config, log=log)
        finally:
            runs.CACHE_ROOT = saved
        if info.get("cached"):
            raise RuntimeError(f"the {kind} base of {profile} seed {seed} was loaded, not rebuilt (a local checkpoint: "
                               "config.model_path); there is nothing to rebuild")
        return state_digest(model)


def recorded_digest(profile: str, kind: str, seed: int, root: str | Path | None = None) -> str | None:
    """The digest 01's summary of ``profile`` records for that base, else the one the pre-run seed check
    (``results/preflight/<profile>.json``, :mod:`copes_lib.protocols.testbed.prerun_seed_check`) records, or None. The
    check holds the seeds a run no longer trains (``WARM_SPREAD_SEEDS: 0``)."""
    from copes_lib.protocols.testbed import prerun_seed_check

    summary = runs.load_summary(profile, SUBSTRATE_NOTEBOOK, root=root) or {}
    if summary.get(digest_key(kind, seed)):
        return summary[digest_key(kind, seed)]
    path = prerun_seed_check.record_path(profile, root)
    try:
        rows = prerun_seed_check.seed_rows(runs.read_json(path)) if path.exists() else []
    except (OSError, ValueError):
        rows = []
    return next((r["base_digest"] for r in rows if (r["kind"], r["seed"]) == (kind, int(seed)) and r["base_digest"]),
                None)


def main(argv: list[str] | None = None) -> int:
    from copes_lib.tasks import TASK_KINDS

    parser = argparse.ArgumentParser(prog="python -m copes_lib.protocols.testbed.base_digest",
                                     description="Rebuild one base model from scratch (temporary cache) and compare "
                                                 "its sha256 with the digest notebook 01 recorded.")
    parser.add_argument("--profile", required=True, help="suite profile: smoke | cpu")
    parser.add_argument("--kind", required=True, choices=list(TASK_KINDS), help="which base")
    parser.add_argument("--seed", type=int, default=0, help="warm-start seed (01's SEED, a spread seed, or a seed of "
                        "the pre-run seed check)")
    parser.add_argument("--expected", default=None, help="compare with this digest instead of 01's summary")
    parser.add_argument("--results-root", default=None, help="results folder holding <profile>/01_.../summary.json "
                        "(and preflight/<profile>.json)")
    args = parser.parse_args(argv)
    expected = args.expected or recorded_digest(args.profile, args.kind, args.seed, args.results_root)
    rebuilt = rebuild_digest(args.profile, args.kind, args.seed)
    print(f"rebuilt {args.kind} base, {args.profile} seed {args.seed}: {rebuilt}")
    if expected is None:
        print(f"no recorded digest ({digest_key(args.kind, args.seed)} is not in {SUBSTRATE_NOTEBOOK}'s summary of "
              f"{args.profile}, nor {args.kind} seed {args.seed} in results/preflight/{args.profile}.json); run notebook "
              f"01 (make reproduce PROFILE={args.profile} ONLY=01) or make preflight PROFILE={args.profile} "
              f"SEEDS={args.seed} RECORD=1 to record one")
        return 2
    same = rebuilt == expected
    print(f"recorded: {expected}\n{'IDENTICAL: the rebuild reproduces the base bit for bit' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
