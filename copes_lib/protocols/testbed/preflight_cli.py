"""What ``make preflight`` (``python -m copes_lib.protocols.testbed.preflight``) shows and returns, apart from the
measurement itself (:func:`copes_lib.protocols.testbed.preflight.main`): the table with its header and legend, where
the files go, the exit status and the one-line errors.

Exit status: 0 every precondition holds (or the profile does not enforce them: smoke, whose bases are too
small to act, says so and exits 0 unless ``--strict``); 2 not actionable on a profile that enforces the
preflight (``PREFLIGHT_ENFORCE``: ``make reproduce`` would skip the notebooks on that kind's base), or with ``--strict``;
1 anything else: a bad option, a bad parameter, a crash (one line; the traceback goes to a file).

Files: by default ``reports/preflight/<profile>.json`` and ``.png`` (not tracked by git), so a preflight never
silently replaces the committed measurement ``results/preflight/<profile>[-<recipe>].json`` and its figure;
``--record`` (``make preflight RECORD=1``) adds the seeds it measures to that record (resumable: a (kind, seed)
the record holds for the same recipe, settings and criterion is not measured again; a record of another check
is an error naming the fields that differ), and says that it did.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from copes_lib import runs
from copes_lib.config import REPO_ROOT, ConfigError

#: where a preflight that is not recorded writes its JSON, figure and crash log (git ignores reports/)
REPORTS_ROOT = runs.REPORTS_ROOT

EXIT_HOLDS, EXIT_ERROR, EXIT_NOT_ACTIONABLE = 0, 1, 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse exits 2 on a bad option, the status that means "not actionable" here: exit 1 instead."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of this module: --record and --strict."""
    parser.add_argument("--record", action="store_true",
                        help="write results/preflight/<profile>.json and figures/preflight/<profile>.png (the "
                             "committed measurement, tracked by git) instead of reports/preflight/")
    parser.add_argument("--strict", action="store_true",
                        help="exit 2 when not actionable even on a profile that does not enforce the preflight "
                             "(smoke)")


def output_paths(profile: str, record: bool) -> tuple[Path, Path]:
    """The JSON and the figure of this preflight (see the module docstring)."""
    from copes_lib.protocols.testbed.prerun_seed_check import record_name

    name = record_name(profile)  # <profile>-<recipe> under a recipe overlay
    if record:
        return runs.RESULTS_ROOT / "preflight" / f"{name}.json", runs.FIGURES_ROOT / "preflight" / f"{name}.png"
    return REPORTS_ROOT / "preflight" / f"{name}.json", REPORTS_ROOT / "preflight" / f"{name}.png"


def record_key(warm: Any, settings: Any, criterion: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """What makes two measurements the same check: the warm-start recipe (with ``data``, a non-standard data
    variant: :func:`copes_lib.tasks.recipe_data`), the preflight's settings and its criterion, as plain JSON
    (a record holds them at its top level)."""
    import dataclasses
    import json

    plain = {"recipe": {**dataclasses.asdict(warm), **(data or {})}, "settings": settings.to_dict(),
             "criterion": criterion.to_dict()}
    return json.loads(json.dumps(plain, default=str))


def earlier_record(path: Path, key: dict[str, Any]) -> dict[str, Any]:
    """The entries (``"<kind> seed <s>"``: report) a record at ``path`` already holds for the check ``key``
    (:func:`record_key`); {} when there is no record. A record of another recipe, settings or criterion is a
    :class:`ConfigError` naming the file, the fields that differ and what to do: a record is added to, never
    overwritten by another check."""
    if not path.exists():
        return {}
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    try:
        record = runs.read_json(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{shown} is unreadable ({error}); restore it (git checkout -- {shown}) before "
                          "recording into it") from None
    entries = record.get("kinds") or {}
    differing = sorted(f"recipe.{k}" for k in set(key["recipe"]) | set(record.get("recipe") or {})
                       if key["recipe"].get(k) != (record.get("recipe") or {}).get(k))
    for part in ("settings", "criterion"):  # older records keep them per entry only
        theirs = [record[part]] if part in record else [e.get(part) for e in entries.values() if e.get(part)]
        differing += sorted({f"{part}.{k}" for t in theirs for k in set(key[part]) | set(t)
                             if key[part].get(k) != t.get(k)})
    if differing:
        raise ConfigError(f"{shown} records another check (differs in {', '.join(differing[:6])}"
                          f"{', ...' if len(differing) > 6 else ''}); RECORD=1 only adds seeds to the record of the "
                          f"same recipe: choose the RECIPE it belongs to, or move it aside (git mv {shown} ...) first")
    return dict(entries)


def print_table(rows: list[dict[str, Any]], meaning: dict[str, str]) -> None:
    """The preconditions, one per line under a header row, then what each id means."""
    columns = [("kind", "kind"), ("precondition", "id"), ("verdict", "verdict"), ("ours", "ours"),
               ("floor", "floor")]
    cells = [[str(row[key]) for key, _ in columns] for row in rows]
    widths = [max([len(title)] + [len(line[i]) for line in cells]) for i, (_, title) in enumerate(columns)]
    print("  ".join(title.ljust(w) for (_, title), w in zip(columns, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for line in cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    print("what the ids mean (docs/preflight.md#p1-the-preconditions):")
    for pid, text in meaning.items():
        print(f"  {pid:<3} {text}")


def finish(profile: str, failed: dict[str, list[str]], path: Path, figure: Path, *, record: bool, enforce: bool,
           strict: bool) -> int:
    """Say where the files went and what the verdict means; return the exit status."""
    shown = [str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p) for p in (path, figure)]
    if record:
        print(f"recorded: wrote {shown[0]} and {shown[1]} (the seeds measured now added to those it held; "
              "`git diff` shows the change)")
    else:
        print(f"wrote {shown[0]} and {shown[1]} (the committed results/preflight/ is untouched; RECORD=1 / --record "
              "writes there)")
    if not failed:
        print("every precondition holds")
        return EXIT_HOLDS
    where = "; ".join(f"{kind} {', '.join(ids)}" for kind, ids in failed.items())
    if not enforce and not strict:
        print(f"not actionable: {where}. Expected on the {profile} profile, whose bases are too small for the methods "
              f"to act; it runs the preflight to exercise the code and does not enforce it (PREFLIGHT_ENFORCE false), "
              "so `make reproduce` would go on. Exit 0 (--strict: 2).")
        return EXIT_HOLDS
    print(f"NOT ACTIONABLE: {where}. `make reproduce PROFILE={profile}` would skip the notebooks on that kind's base; see "
          "docs/preflight.md for what each precondition needs. Exit 2.")
    return EXIT_NOT_ACTIONABLE


def measure_in_parallel(profile: str, pairs: Sequence[tuple[str, int]], jobs: int, *, seeded: bool,
                        force: bool = False) -> None:
    """Measure each (kind, seed) pair in its own process, ``jobs`` at a time, so that a later in-process
    pass finds every report cached. Each worker is this command for one pair (one thread, as every
    measurement here); its output goes to ``reports/preflight/logs/<profile>_<kind>_seed<s>.log``. A failed
    worker stops with one line naming its pair and its log."""
    logs = REPORTS_ROOT / "preflight" / "logs"

    def command(kind: str, seed: int) -> list[str]:
        return [sys.executable, "-m", "copes_lib.protocols.testbed.preflight", "--profile", profile, "--kinds", kind,
                "--measure-only", *(["--seeds", str(seed)] if seeded else []), *(["--force"] if force else [])]

    print(f"measuring {len(pairs)} (kind, seed) pairs, {jobs} at a time; logs in "
          f"{logs.relative_to(REPO_ROOT) if logs.is_relative_to(REPO_ROOT) else logs}", flush=True)
    done = runs.run_commands([((kind, seed), command(kind, seed), logs / f"{profile}_{kind}_seed{seed}.log")
                              for kind, seed in pairs], jobs)
    for (kind, seed), status, _log, _seconds in done:
        print(f"  {kind} seed {seed}: {'measured' if status == 0 else f'FAILED (exit {status})'}")
    failed = [(kind, seed, status, log) for (kind, seed), status, log, _ in done if status != 0]
    if failed:
        raise ConfigError("; ".join(f"the preflight of {kind} seed {seed} failed (exit {status}); its output: {log}"
                                    for kind, seed, status, log in failed) + " (pairs measured are cached: rerun "
                          "to retry the rest)")


def guarded(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """``main(argv)``, with every error as one line on stderr and exit 1 (a crash's traceback goes to
    ``reports/preflight/error.txt``, named in that line)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("preflight: interrupted", file=sys.stderr)
        return 130
    except ConfigError as error:
        print(f"preflight: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:  # noqa: BLE001 - a crash is reported, not shown as a traceback
        log = REPORTS_ROOT / "preflight" / "error.txt"
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(traceback.format_exc())
            where = f"traceback in {log.relative_to(REPO_ROOT) if log.is_relative_to(REPO_ROOT) else log}"
        except OSError:
            where = "traceback could not be written"
        print(f"preflight: crashed: {type(error).__name__}: {error} ({where})", file=sys.stderr)
        return EXIT_ERROR


__all__ = ["ArgumentParser", "add_options", "output_paths", "record_key", "earlier_record", "print_table", "finish", "guarded", "measure_in_parallel", "REPORTS_ROOT",
           "EXIT_HOLDS", "EXIT_ERROR", "EXIT_NOT_ACTIONABLE"]
