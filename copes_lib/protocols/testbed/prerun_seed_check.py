"""The warm-start seeds checked before a run, as notebook 01 reports them.

docs/preflight.md#p85-the-bases-targets-gate-on-every-seed-the-run-uses asks that the base design hold the
preconditions (P1, U) and P2's targets on 5 warm-start seeds per kind *before* the run, measured by
``make preflight PROFILE=cpu SEEDS=0,1,2,3,4 RECORD=1`` and committed as ``results/preflight/<profile>.json``
(:func:`copes_lib.protocols.testbed.preflight.main` writes it: per ``"<kind> seed <s>"`` the values, verdicts, the
base's shape and, where recorded, the base's digest). With ``WARM_SPREAD_SEEDS: 0`` (docs/cost.md, trim 1) the
run trains no spread seed, so notebook 01 reads the seed spread from that file instead of measuring it:

- :func:`check` reads the file and tabulates every checked seed (the tail means of strict and lenient
  accuracy per docs/preflight.md#p83-a-bases-accuracy-is-read-over-its-last-curve-points, Spearman(margin, g),
  the verdicts, met or not), says when and from which code it was measured, whether it was measured on the
  run's recipe, whether the run's own seed is among the checked ones, and whether the run's base agrees with
  the checked base of that seed (the digest when both have one, the tail means otherwise);
- :func:`summary_keys` flattens that into notebook 01's ``prerun_seed_check_*`` keys.

A missing file, a file without the run's seed, or one measured on another recipe is reported plainly, never an
error: the run's own preflight (notebook 01) still gates the run's base. A base that differs from the checked
one is reported too, not failed: a rebuild on another CPU vendor can differ bitwise
(docs/reproducibility.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from copes_lib import runs
from copes_lib.config import REPO_ROOT
from copes_lib.tasks import recipe_data

#: the seeds of a check when its design names none (docs/preflight.md P8.5: 5 warm-start seeds, the run's 0 among them)
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
#: the preconditions shown per seed (docs/preflight.md#p1-the-preconditions, P8.4)
PRECONDITIONS = ("G1", "G2", "E1", "E2", "R", "U")
_LABEL = re.compile(r"^(?P<kind>\w+)(?: seed (?P<seed>\d+))?$")


def record_command(profile: str, kind: str | None = None, seeds=DEFAULT_SEEDS, recipe: str | None = None) -> str:
    """The one command that records the check notebook 01 and the base gate read (and that git then commits):
    ``kind`` alone, or every kind; ``seeds`` the registered ones; ``recipe`` default :func:`copes_lib.config.
    active_recipe`. Resumable: a (kind, seed) already recorded for the same recipe is not measured again."""
    from copes_lib.config import active_recipe

    recipe = recipe if recipe is not None else active_recipe()
    return (f"make preflight PROFILE={profile}{f' RECIPE={recipe}' if recipe else ''}{f' KINDS={kind}' if kind else ''} "
            f"SEEDS={','.join(str(s) for s in seeds)} JOBS=2 RECORD=1")


def record_name(profile: str, recipe: str | None = None) -> str:
    """The record's file stem: ``<profile>`` for the profile's own recipe, ``<profile>-<recipe>`` under a
    recipe overlay (``recipe``; default: :func:`copes_lib.config.active_recipe`), so a candidate's check never
    overwrites the default's."""
    from copes_lib.config import active_recipe

    recipe = recipe if recipe is not None else active_recipe()
    return f"{profile}-{recipe}" if recipe else profile


def record_path(profile: str, root: str | Path | None = None, recipe: str | None = None) -> Path:
    """``results/preflight/<record_name>.json`` (``root``: another results folder)."""
    return Path(root if root is not None else runs.RESULTS_ROOT) / "preflight" / f"{record_name(profile, recipe)}.json"


def _number(value: Any) -> float | None:
    """A finite float, or None (JSON has no nan; a missing value stays missing)."""
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _file_git(path: Path) -> dict[str, Any]:
    """The last commit of ``path`` (sha, ISO date) and whether the working tree changes it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=path.parent, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        last = git("log", "-1", "--format=%H %cI", "--", path.name).split()
        changed = bool(git("status", "--porcelain", "--", path.name))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "committed": None, "uncommitted_changes": None}
    return {"commit": last[0] if last else None, "committed": last[1] if len(last) > 1 else None,
            "uncommitted_changes": changed}


def seed_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per checked (kind, seed) of a preflight record: the base's shape, the preconditions' values and
    verdicts, met, what failed, and the base's digest when recorded. Sorted by kind, then seed."""
    seeds = record.get("seeds") or []
    rows = []
    for label, entry in (record.get("kinds") or {}).items():
        match = _LABEL.match(label)
        if not match:
            continue
        seed = match["seed"]
        if seed is None:  # a single-seed record: its label is the kind alone
            seed = entry.get("warm_seed", seeds[0] if len(seeds) == 1 else None)
        shape = entry.get("shape") or {}
        values, verdicts = entry.get("values") or {}, entry.get("verdicts") or {}
        rows.append({"kind": match["kind"], "seed": None if seed is None else int(seed), "met": entry.get("met"),
                     "failed": list(entry.get("failed") or []),
                     "strict_tail": _number(shape.get("strict_tail")),
                     "lenient_tail": _number(shape.get("lenient_tail")),
                     "margin_g_spearman": _number(shape.get("margin_g_spearman")),
                     "targets_failed": list(shape.get("failed_targets") or []),
                     **{pid: _number(values.get(pid)) for pid in PRECONDITIONS},
                     **{f"{pid}_verdict": verdicts.get(pid, "not measured") for pid in PRECONDITIONS},
                     "sigma": _number(entry.get("sigma")), "base_digest": entry.get("base_digest")})
    return sorted(rows, key=lambda r: (r["kind"], -1 if r["seed"] is None else r["seed"]))


def compare(row: Mapping[str, Any] | None, *, digest: str | None, strict_tail: float | None,
            lenient_tail: float | None) -> dict[str, Any]:
    """Whether the run's base agrees with the checked base of its seed: ``agrees`` when every value both sides
    hold is equal (the digest bitwise, the tail means exactly), ``differs`` when one is not, ``not compared``
    when they share none, ``not checked`` when the seed was not checked (``row`` None); with the numbers."""
    if row is None:
        return {"agreement": "not checked", "compared": [], "differing": [], "text": "this seed was not checked"}
    ours = {"digest": digest, "strict_tail": _number(strict_tail), "lenient_tail": _number(lenient_tail)}
    theirs = {"digest": row.get("base_digest"), "strict_tail": row.get("strict_tail"),
              "lenient_tail": row.get("lenient_tail")}
    compared = [k for k in ours if ours[k] is not None and theirs[k] is not None]
    differing = [k for k in compared if (ours[k] != theirs[k] if k == "digest" else abs(ours[k] - theirs[k]) > 1e-9)]
    agreement = "not compared" if not compared else ("differs" if differing else "agrees")

    def shown(k: str, v: Any) -> str:
        return "none" if v is None else (v[:12] if k == "digest" else f"{v:.4f}")

    text = "; ".join(f"{k} run {shown(k, ours[k])} vs checked {shown(k, theirs[k])}" for k in compared)
    return {"agreement": agreement, "compared": compared, "differing": differing,
            "text": text or "neither a digest nor the tail means on both sides"}


def _recipe_differences(recorded: Mapping[str, Any] | None, recipe: Any,
                        data: Mapping[str, Any] | None = None) -> list[str] | None:
    """Fields where the record's warm-start recipe differs from ``recipe`` with ``data`` (a non-standard data
    variant, :func:`copes_lib.tasks.recipe_data`) (None when the record has none)."""
    if recorded is None or recipe is None:
        return None
    ours = json.loads(json.dumps({**(dataclasses.asdict(recipe) if dataclasses.is_dataclass(recipe) else dict(recipe)),
                                  **(data or {})}, default=str))
    return sorted(k for k in set(ours) | set(recorded) if ours.get(k) != recorded.get(k))


def check(profile: str, run_seed: int, run_bases: Mapping[str, Mapping[str, Any]], *, recipe: Any = None,
          trained: bool = True, root: str | Path | None = None, seeds=DEFAULT_SEEDS) -> dict[str, Any]:
    """Read ``results/preflight/<profile>.json`` and judge it against this run.

    ``run_bases``: per kind the run builds, its base's ``digest`` (:func:`copes_lib.protocols.testbed.base_digest.
    state_digest`), ``strict_tail`` and ``lenient_tail`` (:func:`copes_lib.substrate.tail_mean` of its curve).
    ``recipe``: the run's warm-start config; when given, a record measured on another recipe is said not to
    cover this run's base. ``seeds``: the registered check seeds (the union over kinds), for the command it names.
    Returns the rows (:func:`seed_rows`), the seeds per kind, ``met`` (every checked
    seed met everything; None without a record or on another recipe), ``run_seed_checked``, per kind the comparison
    (:func:`compare`), and ``lines``: what to tell the reader, in words. ``trained`` False (a base loaded from a
    local checkpoint, gpu profile): no warm-start seed exists, so nothing is read."""
    path = record_path(profile, root)
    shown = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)
    command = record_command(profile, seeds=seeds)
    out: dict[str, Any] = {"profile": profile, "file": None, "exists": path.exists(), "rows": [], "seeds": {},
                           "met": None, "failed": [], "run_seed": int(run_seed), "run_seed_checked": False,
                           "recipe_differences": None, "git": None, "file_git": None, "written": None,
                           "comparisons": {kind: compare(None, digest=None, strict_tail=None, lenient_tail=None)
                                           for kind in run_bases}}
    if not trained:
        out["lines"] = ["the base is loaded from a local checkpoint, not trained: there is no warm-start seed to check"]
        return out
    if not path.exists():
        out["lines"] = [f"no pre-run seed check committed for this profile ({shown} does not exist): run {command}"]
        return out
    try:
        record = runs.read_json(path)
    except (OSError, ValueError) as exc:
        out["lines"] = [f"the pre-run seed check {shown} is unreadable ({exc}); measure it again: {command}"]
        return out
    rows = seed_rows(record)
    out.update(file=shown, rows=rows, git=record.get("git"), file_git=_file_git(path), written=record.get("written_utc"),
               recipe_differences=_recipe_differences(record.get("recipe"), recipe, recipe_data(profile)))
    out["seeds"] = {kind: sorted({r["seed"] for r in rows if r["kind"] == kind and r["seed"] is not None})
                    for kind in dict.fromkeys(r["kind"] for r in rows)}
    out["failed"] = [f"{r['kind']} seed {r['seed']}: {', '.join(r['failed']) or 'not judged'}" for r in rows
                     if r["met"] is not True]
    same_recipe = not out["recipe_differences"]
    out["met"] = (bool(rows) and not out["failed"]) if same_recipe else None  # another recipe covers nothing here
    for kind in run_bases:
        row = next((r for r in rows if r["kind"] == kind and r["seed"] == int(run_seed)), None) if same_recipe else None
        out["comparisons"][kind] = compare(row, **{k: run_bases[kind].get(k)
                                                   for k in ("digest", "strict_tail", "lenient_tail")})
    out["run_seed_checked"] = bool(run_bases) and all(c["agreement"] != "not checked"
                                                      for c in out["comparisons"].values())
    out["lines"] = _lines(out, command)
    return out


def _lines(out: Mapping[str, Any], command: str) -> list[str]:
    """The check in words, for the notebook's output."""
    fg, git = out["file_git"] or {}, out["git"] or {}
    when = (f"committed in {fg['commit'][:10]} on {fg['committed']}" if fg.get("commit") else "not committed to git")
    if fg.get("commit") and fg.get("uncommitted_changes"):
        when += " (the working tree changes it since: not the committed measurement)"
    code = (f"measured from code {str(git.get('git_sha'))[:10]}{' with uncommitted changes' if git.get('git_dirty') else ''}"
            if git else "the code it was measured from is not recorded")
    seeds = "; ".join(f"{kind}: seeds {', '.join(map(str, s))}" if s else f"{kind}: seed not recorded"
                      for kind, s in out["seeds"].items()) or "no seed"
    lines = [f"pre-run seed check {out['file']}: {seeds}; measured before this run (01 reads it), {when}; {code}"
             + (f"; written {out['written']}" if out["written"] else "")]
    if out["recipe_differences"]:
        lines.append(f"it was measured on ANOTHER warm-start recipe (differs in {', '.join(out['recipe_differences'])}): "
                     f"it does not cover this run's base; measure it again: {command}")
    met = bool(out["rows"]) and not out["failed"]
    lines.append(("for that recipe, " if out["recipe_differences"] else "")
                 + ("every checked seed met P1, U and P2's targets" if met else
                    f"NOT every checked seed met P1, U and P2's targets: {'; '.join(out['failed']) or 'no seed recorded'}"
                    " (docs/preflight.md P8.5: a design that fails on a checked seed is seed-fragile)"))
    for kind, c in out["comparisons"].items():
        if c["agreement"] == "not checked":
            lines.append(f"[{kind}] the run's seed {out['run_seed']} is not among the checked seeds"
                         + ("" if out["recipe_differences"] else f" of {kind}") + f": run {command}")
        elif c["agreement"] == "differs":
            lines.append(f"[{kind}] the run's base (seed {out['run_seed']}) DIFFERS from the checked one: {c['text']} "
                         "(a rebuild on another CPU vendor can differ bitwise, docs/reproducibility.md; reported, "
                         "not a failure)")
        else:
            lines.append(f"[{kind}] the run's base (seed {out['run_seed']}) {c['agreement']} with the checked one: "
                         f"{c['text']}")
    return lines


def table(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One display row per checked (kind, seed): shape, preconditions (value and verdict), met, what failed."""
    rows = []
    for r in result["rows"]:
        rows.append({"kind": r["kind"], "seed": r["seed"], "run's seed": r["seed"] == result["run_seed"],
                     "met": r["met"], "strict_tail": r["strict_tail"], "lenient_tail": r["lenient_tail"],
                     "spearman_margin_g": r["margin_g_spearman"], "targets_failed": ",".join(r["targets_failed"]),
                     **{pid: r[pid] for pid in PRECONDITIONS},
                     "verdicts": " ".join(f"{pid}:{r[f'{pid}_verdict']}" for pid in PRECONDITIONS),
                     "sigma": r["sigma"], "digest": (r["base_digest"] or "")[:12]})
    return rows


def summary_keys(result: Mapping[str, Any]) -> dict[str, Any]:
    """Notebook 01's flat ``prerun_seed_check_*`` keys: per kind its checked seeds (a list), and per kind and seed
    ``prerun_seed_check_<kind>_seed<s>_<value>`` (a summary's list holds no None: a value not measured stays one)."""
    fg = result.get("file_git") or {}
    out: dict[str, Any] = {
        "prerun_seed_check_file": result["file"],
        "prerun_seed_check_commit": fg.get("commit"), "prerun_seed_check_committed": fg.get("committed"),
        "prerun_seed_check_uncommitted_changes": fg.get("uncommitted_changes"),
        "prerun_seed_check_recipe_matches": None if result["recipe_differences"] is None
        else not result["recipe_differences"],
        "prerun_seed_check_seeds": sorted({s for seeds in result["seeds"].values() for s in seeds}),
        "prerun_seed_check_met": result["met"], "prerun_seed_check_failed": list(result["failed"]),
        "prerun_seed_check_run_seed_checked": result["run_seed_checked"],
    }
    for kind, comparison in result["comparisons"].items():
        out[f"prerun_seed_check_{kind}_run_base"] = comparison["agreement"]
    for kind, seeds in result["seeds"].items():
        rows = {r["seed"]: r for r in result["rows"] if r["kind"] == kind}
        out[f"prerun_seed_check_{kind}_seeds"] = list(seeds)
        for seed in seeds:
            for key in ("strict_tail", "lenient_tail", "margin_g_spearman", "met"):
                out[f"prerun_seed_check_{kind}_seed{seed}_{key}"] = rows[seed][key]
    return out


__all__ = ["DEFAULT_SEEDS", "record_command", "record_name", "record_path", "seed_rows", "compare", "check", "table", "summary_keys"]
