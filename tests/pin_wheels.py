"""Which wheel each pin of requirements.txt resolves to on Python 3.11, 3.12 and 3.13 (Linux x86-64), without
downloading the wheels: ``pip install --dry-run --no-deps --only-binary=:all: --python-version X.Y --report``
reads the index's metadata only. Writes results/install/python_wheels.json, which tests/test_env_pins.py
checks against the current pins (a pin changed without running this again fails there).

    .venv/bin/python tests/pin_wheels.py            # needs the package index (PyPI), about a minute

Only the pins are resolved (``--no-deps``): the packages they pull in are not pinned, and pip chooses a
version with a wheel for the Python at hand when it installs them. torch is resolved on the index pip is
configured with (PyPI: the CUDA build, whose cp311-cp313 tags match the CPU build's); the CPU index
(download.pytorch.org/whl/cpu) is tried too and recorded as unreachable where it is.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "install" / "python_wheels.json"
PYTHONS = ("3.11", "3.12", "3.13")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "linux_x86_64")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def resolve(python: str, requirements: list[str], extra: list[str] = (), only_index: bool = False
            ) -> tuple[dict[str, str], str]:
    """{canonical name: wheel URL} for ``requirements`` on ``python``, and pip's stderr; ``only_index``: without
    pip's configuration files and PIP_* variables (no local wheel folder), so the index in ``extra`` alone."""
    import os

    env = dict(os.environ)
    if only_index:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
        env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                   "--only-binary=:all:", "--python-version", python, *(f"--platform={p}" for p in PLATFORMS),
                   "--target", str(Path(tmp) / "target"), "--report", str(report), "--quiet", *extra, *requirements]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        if done.returncode or not report.exists():
            return {}, done.stderr
        installs = json.loads(report.read_text())["install"]
    return ({item["metadata"]["name"].lower().replace("_", "-"): item["download_info"]["url"] for item in installs},
            done.stderr)


def main() -> int:
    pins = [line.split("#", 1)[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    pins = [p for p in pins if p and not p.startswith("-")]
    record = {"checked": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "pins": pins,
              "platforms": list(PLATFORMS), "pip": "--dry-run --no-deps --only-binary=:all:", "python": {}}
    failed = False
    for python in PYTHONS:
        wheels, errors = resolve(python, pins)
        missing = [p for p in pins if p.split("==")[0].lower().replace("_", "-") not in wheels]
        torch_pin = next(p for p in pins if p.startswith("torch=="))
        cpu, cpu_errors = resolve(python, [torch_pin], ["--index-url", CPU_INDEX], only_index=True)
        record["python"][python] = {"wheels": wheels, "missing": missing,
                                    "torch_cpu_index": cpu.get("torch") or f"not checked: {CPU_INDEX} unreachable "
                                    f"or without it ({cpu_errors.strip().splitlines()[-1] if cpu_errors.strip() else ''})"}
        failed |= bool(missing)
        print(f"Python {python}: {len(wheels)} of {len(pins)} pins have a wheel; missing {missing}; torch on the CPU "
              f"index: {record['python'][python]['torch_cpu_index']}")
        if missing:
            print(errors[-2000:], file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
