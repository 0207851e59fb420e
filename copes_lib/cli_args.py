"""The command line's cheap checks, before :mod:`copes_lib.cli` imports the library (seconds: torch, the
claims, the notebooks' parameter classes): an unknown ``--profile``, a ``--only`` that names no notebook or
a ``--jobs`` that is no positive integer answers at once, in one line naming the valid values, not after the
imports and argparse's usage block.

Standard library and :mod:`copes_lib.config` only. The full parser in :func:`copes_lib.cli.main` still
checks everything (abbreviated options, the other arguments); this module only moves the common
typos ahead of the imports, and holds the notebook selection both use (:func:`select`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from copes_lib import config

NOTEBOOK_PATTERN = re.compile(r"^(\d{2})_[A-Za-z0-9_]+\.ipynb$")


def discover_notebooks(notebooks_dir: Path) -> list[Path]:
    """``NN_topic.ipynb`` files of ``notebooks_dir`` in suite order."""
    return sorted(p for p in Path(notebooks_dir).iterdir() if NOTEBOOK_PATTERN.match(p.name))


def select(notebooks: list[Path], only: str | None) -> list[Path]:
    """Keep the notebooks named by ``only``: comma-separated numbers (``02,03``) or stems."""
    if not only:
        return notebooks
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    if not wanted:
        raise config.ConfigError(f"--only {only!r} names no notebook; give comma-separated numbers or names, "
                                 f"e.g. --only 02,03 (ONLY=02,03); notebooks: {[p.stem for p in notebooks]}")
    chosen = [p for p in notebooks if any(p.stem == w or p.stem.split("_", 1)[0] == w.zfill(2) for w in wanted)]
    matched = {w for w in wanted for p in chosen if p.stem == w or p.stem.split("_", 1)[0] == w.zfill(2)}
    missing = [w for w in wanted if w not in matched]
    if missing:
        raise config.ConfigError(
            f"--only {only}: no notebook matches {missing}; notebooks: {[p.stem for p in notebooks]}"
        )
    return chosen


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` in ``argv`` (the last one, as argparse), else None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


#: the suite's parts (``make reproduce PART=``), named here so a wrong one is refused before the heavy imports;
#: tests/test_cli_args.py checks they are the keys of copes_lib.protocols.notebooks.PARTS
PART_NAMES = ("paper-a", "paper-b", "study", "norm-curve")


def argument_error(argv: list[str]) -> str | None:
    """The one-line error for an unknown profile or notebook in ``argv`` (``python -m copes_lib.cli``'s
    arguments), or None (then the full parser judges them)."""
    if not argv or argv[0] not in ("run", "report", "validate"):
        return None
    profile = _option(argv, "--profile")
    if profile is not None and profile not in config.PROFILES:
        return f"profile {profile!r} (--profile, PROFILE=) is not valid; valid values: {', '.join(config.PROFILES)}"
    jobs = _option(argv, "--jobs")
    if argv[0] == "run" and jobs is not None and not (jobs.isdigit() and int(jobs) >= 1):
        return f"jobs = {jobs!r} (--jobs, JOBS=) is not valid; valid values: an integer >= 1 (notebooks run at once)"
    part = _option(argv, "--part")
    if argv[0] == "run" and part is not None and part not in PART_NAMES:
        return f"part {part!r} (--part, PART=) is not valid; valid values: {', '.join(PART_NAMES)}"
    only = _option(argv, "--only")
    if argv[0] == "run" and only is not None:
        folder = Path(_option(argv, "--notebooks-dir") or config.REPO_ROOT / "notebooks")
        if folder.is_dir():
            try:
                select(discover_notebooks(folder), only)
            except config.ConfigError as exc:
                return str(exc)
    return None


def exit_on_bad_arguments(argv: list[str]) -> None:
    """Print :func:`argument_error`'s line and exit 2 (as argparse and :func:`copes_lib.cli.main` do)."""
    error = argument_error(argv)
    if error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)
