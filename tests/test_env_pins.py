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


def environment_pins():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    assert "pip" in deps, "environment.yml must list pip"
    assert any(isinstance(d, str) and d.replace(" ", "") in ("python=3.11", "python==3.11") for d in deps), deps
    pip_sections = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    return _pins(pip_sections[0], "environment.yml")


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
