"""Which of notebook 01's bases a run may build: the 5-seed check gates each kind before it is trained.

The team's rule (issue 47, decision 3; docs/preflight.md P8.5): the default never runs a rejected design. On a
profile that enforces the preflight (``PREFLIGHT_ENFORCE``: cpu, gpu; not smoke, whose bases are too small to act)
notebook 01 builds a kind's base only when the recorded check of the run's recipe
(``results/preflight/<profile>[-<recipe>].json``, :func:`copes_lib.protocols.testbed.prerun_seed_check.record_path`)
passed for that kind:

- the record's warm-start recipe equals the run's (every field of ``WarmStartConfig``; an entry that carries its
  own ``recipe`` must equal it too),
- it holds every seed of the kind's registered check (01's ``BASE_CHECK_SEEDS_<KIND>``: the seeds its design's
  registration names, at least :data:`MIN_SEEDS`; P8.10 names six for math), 01's ``SEED`` among them,
- and every one of them ``met`` P1, U and P2's targets.

Otherwise the kind is ``not checked`` (no record, another recipe, too few seeds, the run's seed missing) or
``failed`` (a checked seed of this recipe missed: the design is seed-fragile, P8.5), 01 neither trains nor
preflights it, and the runner skips the notebooks that use it (:func:`copes_lib.protocols.notebooks.base_kinds`).
A base loaded from a checkpoint (gpu, ``MODEL_PATH``) has no warm-start seed: nothing to check, it is built.

``UNCHECKED_BASES`` (01's parameter; ``make reproduce UNCHECKED_BASES=1``) is the escape hatch for exploration: a
kind whose gate is closed is built anyway and marked ``unchecked``; every claim measured on it then reads
``not checked`` (``copes_lib.claims.table``), whatever its data say.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from copes_lib import runs
from copes_lib.config import REPO_ROOT, active_recipe
from copes_lib.protocols.testbed import prerun_seed_check

KINDS = ("math", "qa")
MIN_SEEDS = 5  # docs/preflight.md P8.5: at least 5 warm-start seeds per kind
# a kind's state: the first two build its base, the last three do not ... except unchecked, the escape hatch
PASSED, NOT_ENFORCED, UNCHECKED = "passed", "not enforced", "unchecked"
NOT_CHECKED, FAILED = "not checked", "failed"
BUILDS = (PASSED, NOT_ENFORCED, UNCHECKED)
CLOSED = (NOT_CHECKED, FAILED)
#: 01's summary keys the runner and the claims read
KEY = "base_check_{kind}"
REASON_KEY = "base_check_{kind}_reason"
UNCHECKED_KEY = "unchecked_bases"


def command(profile: str, kind: str, recipe: str | None = None,
            seeds: Sequence[int] = prerun_seed_check.DEFAULT_SEEDS) -> str:
    """The command that records the check of ``kind`` on its registered ``seeds`` for the run's recipe
    (:func:`copes_lib.protocols.testbed.prerun_seed_check.record_command`)."""
    return prerun_seed_check.record_command(profile, kind, seeds, recipe if recipe is not None else active_recipe())


def _kind_state(kind: str, record: Mapping[str, Any], rows: list[dict[str, Any]], seed: int,
                differences: list[str] | None, registered: Sequence[int]) -> tuple[str, str]:
    """(state, reason) of one kind from a readable record; ``registered``: the seeds its design's check names."""
    if differences is None:
        return NOT_CHECKED, "the record holds no warm-start recipe to compare with this run's"
    if differences:
        return NOT_CHECKED, (f"the record was measured on another warm-start recipe (differs in "
                             f"{', '.join(differences)})")
    entries = {label: e for label, e in (record.get("kinds") or {}).items() if label.split(" ")[0] == kind}
    foreign = sorted(label for label, e in entries.items() if isinstance(e, Mapping) and e.get("recipe") is not None
                     and prerun_seed_check._recipe_differences(e["recipe"], record.get("recipe")))
    mine = [r for r in rows if r["kind"] == kind and r["seed"] is not None]
    if foreign:
        return NOT_CHECKED, f"entries {', '.join(foreign)} were measured on another recipe than the record's"
    missed = [r for r in mine if r["met"] is not True]
    if missed:
        what = "; ".join(f"seed {r['seed']}: {', '.join(r['failed']) or 'not judged'}" for r in missed)
        return FAILED, f"failed its check ({what})"
    seeds = sorted({r["seed"] for r in mine})
    name, listed = f"BASE_CHECK_SEEDS_{kind.upper()}", ", ".join(map(str, registered))
    if seed not in registered:
        return NOT_CHECKED, (f"the run's seed {seed} is not among the seeds of {kind}'s registered check ({name}: "
                             f"{listed}); a base is gated on the check of its own seed")
    missing = [s for s in registered if s not in seeds]
    if missing:
        have = f"seeds {', '.join(map(str, seeds))}" if seeds else "no seed"
        return NOT_CHECKED, (f"checked on {have}; its registered check names seeds {listed} ({name}), "
                             f"{', '.join(map(str, missing))} not yet recorded")
    return PASSED, (f"checked on seeds {', '.join(map(str, seeds))} (registered: {listed}), every one met P1, U and "
                    "P2's targets")


def decide(profile: str, seed: int, recipe: Any, *, enforce: bool, trains: bool = True, unchecked: bool = False,
           root: str | Path | None = None, kinds: tuple[str, ...] = KINDS,
           data: Mapping[str, Any] | None = None,
           check_seeds: Mapping[str, Sequence[int]] | None = None) -> dict[str, dict[str, Any]]:
    """Per kind: ``state`` (:data:`BUILDS` or :data:`CLOSED` values), ``build`` (whether 01 trains it),
    ``reason`` and ``command`` (what records its check). ``recipe``: the run's ``WarmStartConfig``; ``enforce``:
    01's ``PREFLIGHT_ENFORCE``; ``trains``: False when the base is loaded from a checkpoint; ``unchecked``: 01's
    ``UNCHECKED_BASES``; ``root``: another results folder (tests); ``data``: the run's non-standard data variant
    as a record names it (:func:`copes_lib.tasks.recipe_data`; default: the one in effect in this process);
    ``check_seeds``: per kind the seeds of its registered check (01's ``BASE_CHECK_SEEDS_<KIND>``; default
    :data:`copes_lib.protocols.testbed.prerun_seed_check.DEFAULT_SEEDS`), every one of which must be recorded and pass."""
    if data is None:
        from copes_lib.tasks import recipe_data

        data = recipe_data(profile)
    path = prerun_seed_check.record_path(profile, root)
    shown = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
    out = {}
    record, rows, problem = None, [], None
    if enforce and trains:
        try:
            record = runs.read_json(path)
            rows = prerun_seed_check.seed_rows(record)
        except FileNotFoundError:
            problem = f"no check is recorded ({shown} does not exist)"
        except (OSError, ValueError) as exc:
            problem = f"{shown} cannot be read ({exc})"
    check_seeds = check_seeds or {}
    for kind in kinds:
        registered = tuple(check_seeds.get(kind, prerun_seed_check.DEFAULT_SEEDS))
        if not trains:
            state, reason = NOT_ENFORCED, "the base is loaded from a checkpoint: no warm-start seed to check"
        elif not enforce:
            state, reason = NOT_ENFORCED, "this profile does not enforce the preflight (PREFLIGHT_ENFORCE false)"
        elif problem:
            state, reason = NOT_CHECKED, problem
        else:
            differences = prerun_seed_check._recipe_differences(record.get("recipe"), recipe, data)
            state, reason = _kind_state(kind, record, rows, int(seed), differences, registered)
            reason = f"{shown}: {reason}"
        if state in CLOSED and unchecked:
            state, reason = UNCHECKED, f"built UNCHECKED (UNCHECKED_BASES): {state}: {reason}"
        out[kind] = {"state": state, "build": state in BUILDS, "reason": reason, "command": command(profile, kind, seeds=registered)}
    return out


def decide_for(params: Any, root: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """:func:`decide` with notebook 01's parameters (``SubstrateNotebookParams``)."""
    data = {} if params.QA_DATA == "standard" else {"qa_data": params.QA_DATA}  # as tasks.recipe_data names it
    return decide(params.PROFILE, params.SEED, params.warm_start_config(), enforce=params.PREFLIGHT_ENFORCE,
                  trains=params.trains_base(), unchecked=params.UNCHECKED_BASES, root=root, data=data,
                  check_seeds=params.check_seeds())


def not_built() -> collections.defaultdict:
    """A stand-in for the results of a base 01 did not build: every value reads None (its summary keys are then
    ``null``, not a number measured on nothing)."""
    return collections.defaultdict(lambda: None)


def built(gate: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The kinds 01 builds, in :data:`KINDS` order."""
    return [kind for kind in KINDS if gate.get(kind, {}).get("build")]


def lines(gate: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The gate in words, one line per kind, each closed kind with the command that would check it."""
    out = []
    for kind, g in gate.items():
        if g["build"]:
            out.append(f"[{kind}] base built: {g['state']} ({g['reason']})")
        else:
            todo = (f"to check it: {g['command']}" if g["state"] == NOT_CHECKED else
                    "the design is rejected (docs/preflight.md P8.5): register another before its check")
            out.append(f"[{kind}] base NOT built, {g['state']}: {g['reason']}. The notebooks on it are skipped; "
                       f"{todo}; to explore it anyway: make reproduce UNCHECKED_BASES=1 (its claims then read "
                       "'not checked')")
    return out


def summary_keys(gate: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """01's ``base_check_<kind>`` (state), ``base_check_<kind>_reason`` and ``unchecked_bases`` (some kind built
    unchecked) keys."""
    out: dict[str, Any] = {}
    for kind, g in gate.items():
        out[KEY.format(kind=kind)] = g["state"]
        out[REASON_KEY.format(kind=kind)] = g["reason"]
    out[UNCHECKED_KEY] = any(g["state"] == UNCHECKED for g in gate.values())
    return out


def closed_kinds(summary01: Mapping[str, Any]) -> dict[str, str]:
    """From 01's summary: the kinds whose notebooks must be skipped, with the reason. A kind is closed when 01
    did not build it (its gate, :data:`CLOSED`) or when 01's own preflight of it failed and was enforced
    (``preflight_enforced`` and ``preflight_<kind>_met`` false; a summary without per-kind keys: the combined
    ``preflight_met``; docs/preflight.md#p1-the-preconditions)."""
    out = {}
    for kind in KINDS:
        state = summary01.get(KEY.format(kind=kind))
        if state in CLOSED:
            out[kind] = f"01 did not build the {kind} base: {state}: {summary01.get(REASON_KEY.format(kind=kind))}"
        elif summary01.get("preflight_enforced") and summary01.get(f"preflight_{kind}_met",
                                                                 summary01.get("preflight_met")) is False:
            failed = [f for f in summary01.get("preflight_failed") or []
                      if str(f).startswith(f"{kind} ") or f"preflight_{kind}_met" not in summary01]
            out[kind] = (f"01's preflight of the {kind} base failed ({', '.join(failed) or 'see 01'}; "
                         "docs/preflight.md#p1-the-preconditions)")
    return out


__all__ = ["KINDS", "MIN_SEEDS", "PASSED", "NOT_ENFORCED", "UNCHECKED", "NOT_CHECKED", "FAILED", "BUILDS", "CLOSED",
           "command", "decide", "decide_for", "not_built", "built", "lines", "summary_keys", "closed_kinds"]
