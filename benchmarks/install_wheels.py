"""Install the wheels of benchmarks/gpu_wheels.txt that this interpreter lacks into a --target folder.

On the GPU machine ``python3`` is itself a venv: a nested venv would see the base interpreter's
packages, not this one's torch. So nothing is created: missing wheels go with ``pip install --no-deps
--no-index --target DIR`` into DIR, which gpu_check.sh puts first on PYTHONPATH. A pinned line is
installed unless the interpreter (with DIR on its path) already has that exact version; a line
marked ``# if missing`` only when it has no version at all. Without pip the wheels are unpacked
(a wheel is a zip of its files). Prints what it did as one JSON line; exit 0 even when some wheel is
absent from the folder (the check records the versions it then runs with).

  python benchmarks/install_wheels.py WHEELS_DIR TARGET_DIR [--list benchmarks/gpu_wheels.txt]
  python benchmarks/install_wheels.py --check [--list ...]   # no folder: does this Python have them all?

``--check`` installs nothing: it prints what this interpreter lacks of the list and exits 1 if it lacks
anything (gpu_check.sh runs it when the wheel folder is missing, and says how to build the folder).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def read_list(path: Path) -> list[tuple[str, str, bool]]:
    """(name, version, only_if_missing) of each ``name==version`` line."""
    out = []
    for line in path.read_text().splitlines():
        spec, _, comment = line.partition("#")
        spec = spec.strip()
        if not spec:
            continue
        name, sep, version = spec.partition("==")
        if not sep:
            raise SystemExit(f"{path}: {line!r} is not pinned as name==version")
        out.append((name.strip(), version.strip(), "if missing" in comment))
    return out


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan(wanted: list[tuple[str, str, bool]], wheels: list[Path]) -> dict[str, list]:
    by_name = {}
    for wheel in wheels:
        name, version = wheel.name.split("-")[:2]
        by_name[(norm(name), version)] = wheel
    out = {"install": [], "present": [], "absent_from_folder": []}
    for name, version, if_missing in wanted:
        have = installed_version(name)
        if have == version or (if_missing and have is not None):
            out["present"].append(f"{name}=={have}")
            continue
        wheel = by_name.get((norm(name), version))
        if wheel is None:
            out["absent_from_folder"].append(f"{name}=={version} (installed: {have})")
        else:
            out["install"].append(wheel)
    return out


def install(wheels: list[Path], target: Path) -> str:
    target.mkdir(parents=True, exist_ok=True)
    if not wheels:
        return "nothing"
    has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if has_pip:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--upgrade",
                        "--target", str(target), *map(str, wheels)], check=True)
        return "pip"
    for wheel in wheels:  # a wheel's files, as pip would lay them (no .data scripts are needed here)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    return "unzip"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", type=Path, nargs="?")
    parser.add_argument("target", type=Path, nargs="?")
    parser.add_argument("--list", type=Path, default=HERE / "gpu_wheels.txt")
    parser.add_argument("--check", action="store_true", help="install nothing; exit 1 if this Python lacks a line")
    args = parser.parse_args()
    if args.check:
        todo = plan(read_list(args.list), [])
        print("; ".join(todo["absent_from_folder"]) or "nothing")
        return 1 if todo["absent_from_folder"] else 0
    if args.wheels is None or args.target is None:
        parser.error("WHEELS_DIR and TARGET_DIR are required (or --check)")
    todo = plan(read_list(args.list), sorted(args.wheels.glob("*.whl")))
    how = install(todo["install"], args.target)
    print(json.dumps({"installed": [w.name for w in todo["install"]], "with": how, "present": todo["present"],
                      "absent_from_folder": todo["absent_from_folder"], "target": str(args.target)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
