"""Ship the bases a run uses with the repository, and rebuild them to compare (docs/reproducibility.md#shipped-bases).

``make bases PROFILE=cpu [RECIPE=name] [KINDS=math,qa] [SEEDS=0] [JOBS=2] [REPLACE=1]``
(``python -m copes_lib.protocols.testbed.shipped_bases --profile cpu ...``) writes ``bases/<profile>/`` from the cache
(training what is missing, ``JOBS`` bases at once): each (kind, seed) base of the profile's recipe (under
``RECIPE``, the overlay's) as its weights file and sidecar (:mod:`copes_lib.bases`), with its entry of the
committed pre-run seed check (``results/preflight/<profile>[-<recipe>].json``) when it has one. The default
pairs are the bases a run uses: math and QA at notebook 01's ``SEED`` and math at its spread seeds
(:func:`copes_lib.protocols.testbed.substrate_setup.run_seeds`). A shipped base is never overwritten by a different one
without ``REPLACE=1``.

``make bases ... REBUILD_BASES=1`` (``--rebuild``) retrains each shipped base from scratch in a temporary cache
and compares bitwise with the shipped file: ``equal``, or ``differs (CPU vendor X vs Y)`` naming the vendor the
shipped base was trained on and this machine's (docs/reproducibility.md: the kernel pin makes one vendor's
machines agree, not two vendors'). Exit 0 when every base is equal, 1 when one differs (or on an error, one
line), 2 when one is not shipped. Notebook 01 does the same for the bases it loaded from ``bases/`` with
``REBUILD_BASES`` (its parameter, or the environment variable ``COPES_REBUILD_BASES`` that ``make reproduce
REBUILD_BASES=1`` exports) and says in its output and summary which bases came from ``bases/`` (:func:`report`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from copes_lib import __version__, bases, runs, threads
from copes_lib.config import ConfigError, active_recipe

#: ``make reproduce REBUILD_BASES=1`` exports this, so notebook 01 rebuilds what it loaded from bases/.
REBUILD_ENV = "COPES_REBUILD_BASES"
EXIT_EQUAL, EXIT_DIFFERS, EXIT_NOT_SHIPPED = 0, 1, 2


def rebuild_requested(parameter: bool = False) -> bool:
    """01's ``REBUILD_BASES``, or ``COPES_REBUILD_BASES`` set to a true value (1, yes, true)."""
    return bool(parameter) or os.environ.get(REBUILD_ENV, "").strip().lower() in ("1", "yes", "true")


def default_pairs(profile: str, kinds: Sequence[str] | None = None,
                  seeds: Sequence[int] | None = None) -> list[tuple[str, int]]:
    """The (kind, seed) bases to ship: ``kinds`` (default math and QA) x ``seeds`` (default: the seeds a run of
    ``profile`` builds for that kind)."""
    from copes_lib.protocols.testbed.substrate_setup import run_seeds
    from copes_lib.tasks import TASK_KINDS

    kinds = list(kinds or ("math", "qa"))
    bad = [k for k in kinds if k not in TASK_KINDS]
    if bad:
        raise ConfigError(f"KINDS: {bad[0]!r} is not a task kind; valid values: {list(TASK_KINDS)}")
    return [(kind, int(seed)) for kind in kinds for seed in (seeds if seeds else run_seeds(profile, kind))]


def cpu_vendor(trained_on: Mapping[str, Any] | None) -> str:
    cpu = (trained_on or {}).get("cpu") or {}
    return cpu.get("vendor") or "unknown"


def verdict(rebuilt_digest: str, sidecar: Mapping[str, Any]) -> str:
    """``equal``, or ``differs (CPU vendor X vs Y)``: X the shipped base's, Y this machine's.

    >>> verdict("a", {"state_digest": "a"})
    'equal'
    >>> verdict("b", {"state_digest": "a", "trained_on": {"cpu": {"vendor": "GenuineIntel"}}}).startswith("differs (CPU vendor GenuineIntel vs ")
    True
    """
    if rebuilt_digest == sidecar["state_digest"]:
        return "equal"
    return f"differs (CPU vendor {cpu_vendor(sidecar.get('trained_on'))} vs {threads.cpu_model()['vendor']})"


def preflight_entry(profile: str, kind: str, seed: int, digest: str) -> dict[str, Any] | None:
    """The base's entry in the committed pre-run seed check of this recipe (file, entry label, met, whether the
    check measured these very weights), or None when no record is committed."""
    from copes_lib.protocols.testbed import prerun_seed_check

    path = prerun_seed_check.record_path(profile)
    if not path.exists():
        return None
    try:
        rows = prerun_seed_check.seed_rows(runs.read_json(path))
    except (OSError, ValueError) as exc:
        return {"file": bases.shown(path), "entry": None, "note": f"unreadable: {exc}"}
    row = next((r for r in rows if (r["kind"], r["seed"]) == (kind, int(seed))), None)
    if row is None:
        return {"file": bases.shown(path), "entry": None, "note": f"{kind} seed {seed} is not in the record"}
    return {"file": bases.shown(path), "entry": f"{kind} seed {seed}", "met": row.get("met"),
            "same_weights": (row["base_digest"] == digest) if row.get("base_digest") else None}


def ship(profile: str, pairs: Sequence[tuple[str, int]], config=None, *, jobs: int = 1, replace: bool = False,
         root: str | Path | None = None, log=print) -> list[dict[str, Any]]:
    """Write the shipped base of each pair from the cache (training the missing ones, ``jobs`` at a time); one
    row per pair: kind, seed, file, bytes, state digest, ``written`` / ``unchanged`` / ``replaced``."""
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.substrate import (
        build_warm_starts,
        get_tokenizer,
        warm_start,
        warm_start_folder,
        warm_start_recipe,
    )

    config = config or substrate_config(profile)
    build_warm_starts(profile, pairs, config, jobs=jobs, log=log)
    tokenizer = get_tokenizer(profile, config.vocab_size, subject_tokens=config.subject_tokens)
    rows = []
    for kind, seed in pairs:
        model, _, info = warm_start(profile, kind, seed, config=config, log=log)
        recipe, key = warm_start_recipe(profile, kind, seed, config)
        digest = bases.state_digest(model)
        weights, sidecar = bases.paths(profile, kind, seed, key, root)
        status = "written"
        if sidecar.exists():
            old = bases.read_sidecar(sidecar)
            if old["state_digest"] == digest and weights.exists() and bases.file_sha256(weights) == old["weights_sha256"]:
                rows.append({"kind": kind, "seed": seed, "file": bases.shown(weights), "bytes": old["weights_bytes"],
                             "state_digest": digest, "status": "unchanged"})
                continue
            if not replace:
                raise bases.ShippedBaseError(
                    f"{bases.shown(sidecar)} already ships {kind} seed {seed} of this recipe with state digest "
                    f"{old['state_digest'][:12]} (trained on {cpu_vendor(old.get('trained_on'))}); the cache's base is "
                    f"{digest[:12]}: REPLACE=1 replaces the shipped one, or delete {info['cache_dir']} to use it")
            status = "replaced"
        extra: dict[str, Any] = {"recipe": {"config": recipe, "library_version": __version__},
                                 "recipe_overlay": active_recipe(), "shipped_from": runs.git_state(),
                                 "preflight": preflight_entry(profile, kind, seed, digest)}
        if not info.get("trained_on"):  # a cache entry older than the record
            extra["trained_on"] = {"cpu": threads.cpu_model(), "note": "not recorded by the cache entry; the CPU of "
                                   "the machine `make bases` ran on"}
        folder = warm_start_folder(profile, kind, seed, config=config, log=log)[0]
        bases.write(profile, kind, seed, key, folder, recipe=extra.pop("recipe"), tokenizer=tokenizer, state=digest,
                    extra=extra, root=root)
        rows.append({"kind": kind, "seed": seed, "file": bases.shown(weights), "bytes": weights.stat().st_size,
                     "state_digest": digest, "status": status})
        log(f"[bases] {kind} seed {seed}: {status} {bases.shown(weights)} ({weights.stat().st_size / 1e6:.2f} MB)")
    return rows


def rebuild(profile: str, pairs: Sequence[tuple[str, int]], config=None, *, jobs: int = 1,
            log=print) -> dict[tuple[str, int], str]:
    """Train each pair's base from scratch in a temporary cache (the real cache is neither read nor written;
    ``jobs`` at a time, worker logs in ``reports/<profile>/logs/rebuild/``); ``{(kind, seed): state digest}``."""
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.substrate import build_log_dir, build_warm_starts, warm_start

    config = config or substrate_config(profile)
    digests, saved = {}, runs.CACHE_ROOT
    with tempfile.TemporaryDirectory(prefix="copes-rebuild-") as tmp:
        runs.CACHE_ROOT = Path(tmp)
        try:
            built = build_warm_starts(profile, pairs, config, jobs=jobs, force=True,
                                      log_dir=build_log_dir(profile) / "rebuild", log=log)
            for kind, seed in pairs:
                model, _, _ = warm_start(profile, kind, seed, force=(kind, seed) not in built, config=config, log=log)
                digests[(kind, seed)] = bases.state_digest(model)
        finally:
            runs.CACHE_ROOT = saved
    return digests


def compare(profile: str, pairs: Sequence[tuple[str, int]], config=None, *, jobs: int = 1,
            log=print) -> dict[tuple[str, int], str]:
    """Rebuild each shipped pair and compare: ``{(kind, seed): verdict}`` (:func:`verdict`; ``not shipped`` for a
    pair with no shipped base of this recipe, which is not rebuilt)."""
    from copes_lib.protocols.testbed.substrate_setup import substrate_config
    from copes_lib.substrate import warm_start_recipe

    config = config or substrate_config(profile)
    sidecars = {}
    for kind, seed in pairs:
        path = bases.paths(profile, kind, seed, warm_start_recipe(profile, kind, seed, config)[1])[1]
        if path.exists():
            sidecars[(kind, seed)] = bases.read_sidecar(path)
    rebuilt = rebuild(profile, list(sidecars), config, jobs=jobs, log=log) if sidecars else {}
    out = {}
    for pair in pairs:
        out[pair] = verdict(rebuilt[pair], sidecars[pair]) if pair in sidecars else "not shipped"
    return out


def report(profile: str, seed: int, models: Mapping[str, Any], infos: Mapping[str, Mapping[str, Any]], *, config,
           rebuild: bool = False, jobs: int = 1, log=print) -> dict[str, Any]:
    """Notebook 01's account of its bases (``models``/``infos`` per kind, of warm-start seed ``seed``): per base
    ``base_source_<kind>_seed<seed>`` (``shipped``: loaded from bases/ with its sha256 verified, ``trained``
    here, or ``cached`` from an earlier run), ``base_shipped_<kind>_seed<seed>`` (the shipped file of this
    recipe, or None) and ``base_rebuild_<kind>_seed<seed>`` (``equal`` / ``differs (CPU vendor X vs Y)`` when
    compared, else None). A base trained here while a shipped one of its recipe exists is compared with it at no
    cost; ``rebuild`` (01's REBUILD_BASES, or ``COPES_REBUILD_BASES``) rebuilds each shipped one that was loaded."""
    from copes_lib.substrate import warm_start_recipe

    out, to_rebuild = {}, []
    for kind, info in infos.items():
        name = f"{kind}_seed{int(seed)}"
        if not info.get("curve") and info.get("steps") == 0:  # a loaded checkpoint (gpu): nothing to ship
            out.update({f"base_source_{name}": "checkpoint", f"base_shipped_{name}": None,
                        f"base_rebuild_{name}": None})
            continue
        weights, sidecar = bases.paths(profile, kind, seed, warm_start_recipe(profile, kind, seed, config)[1])
        shipped_file = bases.shown(weights) if sidecar.exists() else None
        source = "shipped" if info.get("shipped") else "cached" if info.get("cached") else "trained"
        compared = None
        if shipped_file and source != "shipped":  # a base trained here (or earlier) beside a shipped one
            compared = verdict(bases.state_digest(models[kind]), bases.read_sidecar(sidecar))
        elif source == "shipped":
            to_rebuild.append((kind, int(seed)))
        out.update({f"base_source_{name}": source, f"base_shipped_{name}": shipped_file,
                    f"base_rebuild_{name}": compared})
        if source == "shipped":
            log(f"[bases] {kind} seed {seed}: loaded from {shipped_file}, sha256 verified when it was copied into "
                "the cache (not trained here)")
        elif shipped_file:
            log(f"[bases] {kind} seed {seed}: {source} here, compared with the shipped {shipped_file}: {compared}")
        else:
            log(f"[bases] {kind} seed {seed}: {source} (no shipped base of this recipe in bases/{profile}/; "
                f"make bases PROFILE={profile} ships it)")
    if rebuild_requested(rebuild) and to_rebuild:
        log(f"[bases] REBUILD_BASES: retraining {len(to_rebuild)} shipped base(s) in a temporary cache to compare")
        for (kind, s), result in compare(profile, to_rebuild, config, jobs=jobs, log=log).items():
            out[f"base_rebuild_{kind}_seed{s}"] = result
            log(f"[bases] {kind} seed {s}: rebuilt, {result}")
    return out


def _csv(text: str, what: str, cast=str) -> list:
    try:
        values = [cast(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} = {text!r}: comma-separated integers >= 0 expected, e.g. 0,1,2") from None
    if len(set(values)) != len(values) or (cast is int and any(v < 0 for v in values)):
        raise ConfigError(f"{what} = {text!r}: distinct values expected" + (", integers >= 0" if cast is int else ""))
    return values


def main(argv: Sequence[str] | None = None) -> int:
    from copes_lib.substrate import WarmStartBuildError

    parser = argparse.ArgumentParser(prog="python -m copes_lib.protocols.testbed.shipped_bases",
                                     description="Ship the bases a run uses into bases/<profile>/ (make bases), or "
                                                 "rebuild the shipped ones and compare bitwise (REBUILD_BASES=1).")
    parser.add_argument("--profile", required=True, choices=("smoke", "cpu"))
    parser.add_argument("--kinds", default="", help="comma-separated task kinds (default: math,qa)")
    parser.add_argument("--seeds", default="", help="comma-separated warm-start seeds (default: the seeds a run "
                        "builds: 01's SEED, and for math its spread seeds)")
    parser.add_argument("--jobs", type=int, default=1, help="bases trained at once, each in its own process")
    parser.add_argument("--replace", action="store_true", help="replace a shipped base the cache's differs from")
    parser.add_argument("--rebuild", action="store_true", help="retrain each shipped base in a temporary cache and "
                        "compare bitwise (writes nothing)")
    args = parser.parse_args(argv)
    try:
        if args.jobs < 1:
            raise ConfigError(f"JOBS = {args.jobs}: an integer >= 1 expected")
        pairs = default_pairs(args.profile, _csv(args.kinds, "KINDS"), _csv(args.seeds, "SEEDS", int))
        if args.rebuild:
            results = compare(args.profile, pairs, jobs=args.jobs)
            for (kind, seed), result in results.items():
                print(f"[bases] {kind} seed {seed}: {result}"
                      + (f" (make bases PROFILE={args.profile} ships it)" if result == "not shipped" else ""))
            if any(r == "not shipped" for r in results.values()):
                return EXIT_NOT_SHIPPED
            return EXIT_EQUAL if all(r == "equal" for r in results.values()) else EXIT_DIFFERS
        rows = ship(args.profile, pairs, jobs=args.jobs, replace=args.replace)
        total = sum(r["bytes"] for r in rows)
        print(f"[bases] {len(rows)} base(s) in bases/{args.profile}/, {total / 1e6:.2f} MB of weights: "
              + ", ".join(f"{r['kind']} seed {r['seed']} {r['status']}" for r in rows))
        return 0
    except (ConfigError, bases.ShippedBaseError, WarmStartBuildError) as error:
        print(f"bases: error: {error}", file=sys.stderr)
        return 1


__all__ = ["REBUILD_ENV", "rebuild_requested", "default_pairs", "verdict", "preflight_entry", "ship", "rebuild",
           "compare", "report", "main"]


if __name__ == "__main__":
    sys.exit(main())
