"""requirements.txt and environment.yml pin the same packages at the same versions, and .venv has them."""

import re
from importlib import metadata

import yaml

from copes_lib.config import REPO_ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lines, source):
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"{source}: {line!r} is not pinned as name==version"
        name = _canonical(match.group(1))
        assert name not in pins, f"{source}: {name} is listed twice"
        pins[name] = match.group(2)
    return pins


def requirements_pins():
    return _pins((REPO_ROOT / "requirements.txt").read_text().splitlines(), "requirements.txt")


CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def environment_pip_lines():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    assert "pip" in deps, "environment.yml must list pip"
    assert any(isinstance(d, str) and d.replace(" ", "") in ("python=3.11", "python==3.11") for d in deps), deps
    pip_sections = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    return pip_sections[0]


def environment_pins():
    """The name==version lines of environment.yml's pip section (its option lines, -e . and the index, aside)."""
    return _pins([line for line in environment_pip_lines() if not line.startswith("-")], "environment.yml")


def test_environment_yml_matches_requirements():
    req, env = requirements_pins(), environment_pins()
    only_req = {k: req[k] for k in sorted(set(req) - set(env))}
    only_env = {k: env[k] for k in sorted(set(env) - set(req))}
    differ = {k: (req[k], env[k]) for k in sorted(set(req) & set(env)) if req[k] != env[k]}
    assert not (only_req or only_env or differ), (
        f"pins disagree: only in requirements.txt {only_req}; only in environment.yml {only_env}; "
        f"different versions (requirements, environment) {differ}"
    )


def test_torch_is_pinned():
    assert requirements_pins()["torch"] == "2.13.0"


def test_installed_versions_match_pins():
    """A stale .venv (requirements.txt changed, `make venv` not rerun) fails here with the culprits."""
    wrong = {}
    for name, version in requirements_pins().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        if installed.split("+")[0] != version:  # torch reports 2.13.0+cpu
            wrong[name] = (version, installed)
    assert not wrong, f"installed versions differ from requirements.txt (pinned, installed): {wrong}; run `make venv`"


def test_environment_yml_is_a_complete_cpu_route():
    """`conda env create -f environment.yml` alone: CPU torch (the CPU index, where pip picks 2.13.0+cpu over
    PyPI's CUDA build), the suite itself, and no other option line that could change what is installed."""
    options = [line for line in environment_pip_lines() if line.startswith("-")]
    assert options == [f"--extra-index-url {CPU_TORCH_INDEX}", "-e ."], options
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"TORCH_INDEX ?= {CPU_TORCH_INDEX}" in makefile  # .venv takes torch from the same place


def test_pins_have_wheels_on_python_311_to_313():
    """results/install/python_wheels.json (tests/pin_wheels.py, resolved against the package index) covers the
    current pins on 3.11, 3.12 and 3.13 (Linux x86-64), each with a wheel whose tag fits that Python.
    A pin changed since: rerun `.venv/bin/python tests/pin_wheels.py`."""
    import json

    record = json.loads((REPO_ROOT / "results" / "install" / "python_wheels.json").read_text())
    assert _pins(record["pins"], "python_wheels.json") == requirements_pins(), "pins changed: rerun tests/pin_wheels.py"
    assert sorted(record["python"]) == ["3.11", "3.12", "3.13"]
    for python, found in record["python"].items():
        tag = "cp" + python.replace(".", "")
        assert found["missing"] == [], (python, found["missing"])
        assert set(found["wheels"]) == set(requirements_pins()), python
        for name, url in found["wheels"].items():
            wheel = url.rsplit("/", 1)[-1]
            assert wheel.endswith(".whl") and (f"-{tag}-{tag}-" in wheel or "-abi3-" in wheel or "-py3-none-" in wheel
                                               or "-py2.py3-none-" in wheel), (python, name, wheel)
            version = wheel.split("-")[1].replace("%2B", "+").split("+")[0]  # 2.13.0+cpu is torch 2.13.0
            assert version == requirements_pins()[name], (python, name, wheel)
