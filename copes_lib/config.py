"""Typed, validated configuration: the machinery every config and every notebook's parameters use.

A notebook's parameters cell holds flat typed scalars (``NAME: type = value  # help``). The cell
after it calls :func:`load_params`, which turns them into a frozen dataclass and fails at once, with
the parameter's name and the valid names or range, on an unknown name, a wrong type or an
out-of-range value (papermill alone only warns about unknown names).

Precedence of values, always, for every parameter and type (data paths included): the dataclass
default (the ``cpu`` profile's value) < the value in ``profiles/<PROFILE>.yaml`` for that notebook <
a value given explicitly, which is

- every name papermill injected (``papermill -p NAME VALUE``, ``-y``, ``-r``, and the runner's own
  injection of the profile's values, which equal the YAML and so change nothing): papermill writes
  them into a cell starting with ``# Parameters``; :func:`load_params` finds that cell in IPython's
  input history (``In``) and reads its assignments with :mod:`ast`, so ``-p STEPS 128`` wins under
  the gpu profile even though 128 is also the cpu default; an injected name that is not a
  parameter, in any case (``-p steps 16`` too), is an error that lists the valid names;
- in JupyterLab, a value in the parameters cell that differs from the committed default (the
  dataclass default, which the committed parameters cell repeats). Setting a value by hand to
  exactly its cpu default under another profile is the one case that cannot be told apart from
  the untouched cell; the profile's value then wins (use papermill ``-p`` for that case).

The explicit values also hold for the rest of the kernel: :func:`profile_params` returns the
profile's section with them on top, so the library (``substrate_params``, the gpu data paths read
by :mod:`copes_lib.tasks`) sees the same values as the notebook, in the kernel and in worker
processes it starts (they inherit them through the ``COPES_EXPLICIT_PARAMS`` environment variable).

Profiles are read strictly: a notebook section or a key written twice is an error naming the file
and both lines, and a YAML syntax error names the file and line.

A **recipe overlay** (``profiles/recipes/<name>.yaml``, chosen by the ``COPES_RECIPE`` environment variable,
``make ... RECIPE=<name>``) lays a candidate design's values over one profile's sections: a base design
that has not passed its 5-seed check runs only this way, never as a profile's default
(docs/preflight.md#p810-the-next-design-registered-2026-12-04). The overlay names the profile it belongs
to; under another profile, or with an unknown name, it is an error naming the valid values. Worker
processes inherit the variable, so they read the same values.

The notebooks' parameter classes live in :mod:`copes_lib.protocols.params` (and
``protocols.paper_b.molora_params``); :mod:`copes_lib.protocols.notebooks` maps each notebook to its class.
This module knows no notebook: its helpers take a parameter class, whose ``NOTEBOOK`` names its
section of the profile files.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar

import yaml

PROFILES = ("smoke", "cpu", "gpu")
REPO_ROOT = Path(__file__).resolve().parent.parent
PROFILE_DIR = REPO_ROOT / "profiles"
RECIPE_DIR = PROFILE_DIR / "recipes"
#: Environment variable naming the recipe overlay of this process and the processes it starts.
RECIPE_ENV = "COPES_RECIPE"

class ConfigError(ValueError):
    """A parameter is unknown, of the wrong type, or out of range. The message says how to fix it."""


class ParameterError(ConfigError):
    """A notebook's parameters do not validate (raised by ``load_params`` in the notebook's validation cell).

    IPython shows it as its one-line message instead of a traceback through this library (a
    ``_render_traceback_`` method is IPython's hook for that), so the notebook, and the error papermill
    prints at its end, read ``ParameterError: SEED must be int, ...`` rather than thirty lines of frames."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def param(
    default: Any,
    help: str,
    *,
    choices: tuple | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A dataclass field with help text and declarative range checks (run by :class:`Config`)."""
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt}
    return dataclasses.field(default=default, metadata=meta)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


_NUMBER_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _coerce(value: Any, tp: Any) -> Any:
    """What papermill passes, as the field's type where the meaning is unambiguous: ``-p`` guesses types
    (``-p SWEEP_SIGMAS 0.01`` arrives as a float, ``-p SEEDS 3`` as an int), ``-r`` passes text and ``-y``
    may pass a list. A comma-separated text field (a grid, a list of arms) takes a number as its text and a
    list as its items joined by commas; a number field takes a number written as text; a bool field takes
    true / false written as text. Anything else is left for the type check to reject by name."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        if is_number:
            return repr(value) if isinstance(value, float) else str(value)
        if isinstance(value, (list, tuple)) and all(
                isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value):
            return ",".join(_coerce(v, str) for v in value)
        return value
    if tp is float and is_number:
        return float(value)
    if isinstance(value, str) and tp in (int, float) and _NUMBER_TEXT.fullmatch(value.strip()):
        text = value.strip()
        if tp is float:
            return float(text)
        if re.fullmatch(r"[+-]?\d+", text):
            return int(text)
    if tp is bool and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def _valid_text(tp: Any, meta: dict) -> str:
    """The valid values of a field, for an error message."""
    if meta.get("choices") is not None:
        return f"valid values: {list(meta['choices'])}"
    bounds = [f"{symbol} {meta[key]}" for key, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
              if meta.get(key) is not None]
    kind = {"int": "a whole number", "float": "a number", "bool": "True or False", "str": "text"}.get(
        _type_name(tp), _type_name(tp))
    return f"valid values: {kind}{' ' + ' and '.join(bounds) if bounds else ''}"


def _check_value(cls_name: str, name: str, value: Any, tp: Any, meta: dict) -> Any:
    """Return ``value`` (as the field's type where papermill's guess differs: :func:`_coerce`) or raise
    ConfigError naming the parameter and its valid values."""
    where = f"{cls_name}.{name}"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        tp = next(t for t in options if t is not type(None))
    value = _coerce(value, tp)
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(
            f"{where} must be {_type_name(tp)}, got {value!r} ({type(value).__name__}); {_valid_text(tp, meta)}. "
            f"{meta.get('help', '')}".strip()
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be finite, got {value!r}")
    if meta.get("choices") is not None and value not in meta["choices"]:
        raise ConfigError(f"{where} = {value!r} is not valid; valid values: {list(meta['choices'])}")
    bounds = [("ge", ">=", lambda a, b: a >= b), ("gt", ">", lambda a, b: a > b),
              ("le", "<=", lambda a, b: a <= b), ("lt", "<", lambda a, b: a < b)]
    for key, symbol, holds in bounds:
        bound = meta.get(key)
        if bound is not None and not holds(value, bound):
            raise ConfigError(f"{where} = {value!r} is out of range; it must be {symbol} {bound}")
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    """Base of every config: checks types and declared ranges, then calls :meth:`check`.

    Subclasses add cross-field invariants in ``check`` (raise :class:`ConfigError`).
    """

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _check_value(type(self).__name__, f.name, getattr(self, f.name), hints[f.name], f.metadata)
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Cross-field invariants; override in subclasses."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def help_text(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def build(cls: type[Config], values: dict[str, Any], source: str = "parameters") -> Config:
    """Instantiate ``cls`` from ``values``; an unknown name fails with the list of valid names."""
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise ConfigError(
            f"unknown {source} {unknown} for {cls.__name__}; valid names: {valid}"
        )
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class NotebookParams(Config):
    """Parameters every notebook has. Subclasses add their own (UPPER_CASE, flat scalars) and set
    ``NOTEBOOK``, the notebook's file stem: its section in ``profiles/<profile>.yaml``."""

    NOTEBOOK: ClassVar[str] = ""

    PROFILE: str = param("cpu", "suite profile: sizes and paths", choices=PROFILES)
    SEED: int = param(0, "base random seed of this notebook", ge=0)
    FORCE: bool = param(False, "recompute even when a cached result with the same key exists")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (plain YAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"{key_node.start_mark.name}: {key!r} is defined twice (lines {seen[key]} "
                                  f"and {line}); keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml_strict(path: Path) -> Any:
    """The YAML document at ``path``; a duplicated key or a syntax error names the file and the line(s)."""
    text = path.read_text()
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {error.problem or error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    finally:
        loader.dispose()


def load_profile(profile: str, notebooks: typing.Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """``profiles/<profile>.yaml`` as {notebook: {PARAM: value}}; a section not in ``notebooks`` (when
    given: the suite's notebooks), a duplicated section or key and a YAML syntax error fail loudly,
    naming the file and the line."""
    if profile not in PROFILES:
        raise ConfigError(f"PROFILE = {profile!r} is not valid; valid values: {list(PROFILES)}")
    path = PROFILE_DIR / f"{profile}.yaml"
    if path.exists() and not path.read_text().strip():
        raise ConfigError(f"{path} is empty ({path.stat().st_size} bytes): every notebook would silently run "
                          f"with its defaults; restore it (git checkout -- profiles/{profile}.yaml)")
    data = read_yaml_strict(path) if path.exists() else None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must map notebook names to parameter mappings")
    for notebook, values in data.items():
        if notebooks is not None and notebook not in notebooks:
            raise ConfigError(f"{path}: unknown notebook {notebook!r}; valid notebooks: {list(notebooks)}")
        if values is not None and not isinstance(values, dict):
            raise ConfigError(f"{path}: {notebook} must map parameter names to values")
    sections = {nb: dict(values or {}) for nb, values in data.items()}
    overlay = recipe_overlay(profile)
    for notebook, values in overlay.items():
        if notebooks is not None and notebook not in notebooks:
            raise ConfigError(f"{recipe_path(active_recipe())}: unknown notebook {notebook!r}; valid notebooks: "
                              f"{list(notebooks)}")
        sections[notebook] = {**sections.get(notebook, {}), **values}
    return sections


def recipe_names() -> list[str]:
    """The recipe overlays shipped in ``profiles/recipes/``."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def active_recipe() -> str | None:
    """The recipe overlay named by ``COPES_RECIPE`` (None when unset or empty)."""
    return (os.environ.get(RECIPE_ENV) or "").strip() or None


def recipe_path(name: str | None) -> Path:
    return RECIPE_DIR / f"{name}.yaml"


def recipe_overlay(profile: str, name: str | None = None) -> dict[str, dict[str, Any]]:
    """The sections the recipe overlay ``name`` (default: :func:`active_recipe`) lays over ``profile``; {}
    without one. An unknown name, a file without ``profile:`` / ``sections:``, or an overlay of another
    profile is a :class:`ConfigError` naming the valid values."""
    name = name if name is not None else active_recipe()
    if not name:
        return {}
    path = recipe_path(name)
    if not path.is_file():
        raise ConfigError(f"RECIPE ({RECIPE_ENV}) = {name!r} is not a recipe overlay; valid values: "
                          f"{recipe_names()} (files in {RECIPE_DIR.relative_to(REPO_ROOT)}/), or unset")
    data = read_yaml_strict(path) or {}
    if not isinstance(data, dict) or not isinstance(data.get("sections"), dict) or "profile" not in data:
        raise ConfigError(f"{path}: a recipe overlay maps 'profile' to a profile name and 'sections' to "
                          "{notebook: {PARAM: value}}")
    if data["profile"] != profile:
        raise ConfigError(f"RECIPE = {name!r} is an overlay of profile {data['profile']!r}, not {profile!r}; "
                          f"run it with PROFILE={data['profile']}, or unset RECIPE")
    for notebook, values in data["sections"].items():
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {notebook} must map parameter names to values")
    return {nb: dict(values) for nb, values in data["sections"].items()}


def yaml_params(profile: str, cls: type[NotebookParams]) -> dict[str, Any]:
    """The profile file's values for the notebook of ``cls`` (its ``NOTEBOOK`` section), checked against
    the class's fields."""
    notebook = cls.NOTEBOOK
    values = load_profile(profile).get(notebook, {})
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - valid)
    if unknown:
        raise ConfigError(
            f"profiles/{profile}.yaml: {notebook} has unknown parameters {unknown}; "
            f"valid names: {sorted(valid)}"
        )
    return values


#: Environment variable carrying this kernel's explicit values to the processes it starts.
EXPLICIT_ENV = "COPES_EXPLICIT_PARAMS"


def explicit_params(profile: str, notebook: str) -> dict[str, Any]:
    """The values given explicitly for ``notebook`` under ``profile`` in this process (recorded by
    :func:`load_params`, or inherited through ``COPES_EXPLICIT_PARAMS``); {} when none."""
    try:
        record = json.loads(os.environ.get(EXPLICIT_ENV) or "{}")
    except json.JSONDecodeError:
        return {}
    if record.get("profile") != profile or record.get("notebook") != notebook:
        return {}
    return dict(record.get("values") or {})


def profile_params(profile: str, cls: type[NotebookParams]) -> dict[str, Any]:
    """The profile's values for the notebook of ``cls``, with the values given explicitly to that
    notebook in this kernel on top (see the module docstring)."""
    return {**yaml_params(profile, cls), **explicit_params(profile, cls.NOTEBOOK)}


_NOT_PARAMS = {"In", "Out", "exit", "quit", "get_ipython", "open"}
_SCALARS = (bool, int, float, str, type(None))


def _notebook_values(namespace: dict[str, Any]) -> dict[str, Any]:
    """UPPER_CASE plain-scalar globals of a notebook: its parameters plus anything papermill injected.

    Lower-case globals are the notebook's own variables, so re-running the validation cell in
    JupyterLab after later cells have run still works.
    """
    return {
        k: v for k, v in namespace.items()
        if not k.startswith("_") and k not in _NOT_PARAMS and k.isupper() and isinstance(v, _SCALARS)
    }


def injected_names(namespace: dict[str, Any]) -> list[str]:
    """Names papermill injected into this kernel: the assignments of every executed cell that starts
    with papermill's ``# Parameters`` comment, read from IPython's input history ``In``."""
    names: list[str] = []
    for source in namespace.get("In") or []:
        if not isinstance(source, str) or not source.lstrip().startswith("# Parameters"):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in names]
    return names


def load_params(cls: type[NotebookParams], namespace: dict[str, Any]) -> NotebookParams:
    """Validate a notebook's parameters into ``cls`` (notebooks call
    ``copes_lib.protocols.notebooks.load_params("02_standard_es", globals())``, which finds the class).

    Every UPPER_CASE plain-scalar global defined so far counts as a parameter, so a misspelt
    ``papermill -p`` name stops the notebook with the list of valid names instead of being silently
    ignored; so does any injected name that is not a parameter (lower-case ones too). Precedence:
    see the module docstring. The explicit values are recorded for :func:`profile_params`.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    injected = injected_names(namespace)
    unknown = sorted(n for n in injected if n not in defaults)
    if unknown:
        hints = [n.upper() for n in unknown if n.upper() in defaults]
        raise ConfigError(f"unknown parameters {unknown} for {cls.__name__}; valid names: {list(defaults)} "
                          f"(names are case-sensitive{'; did you mean ' + ', '.join(hints) + '?' if hints else ''})")
    given = {**_notebook_values(namespace), **{n: namespace[n] for n in injected if n in namespace}}
    profile = given.get("PROFILE", defaults["PROFILE"])
    if profile not in PROFILES:
        raise ConfigError(f"PROFILE = {profile!r} is not valid; valid values: {list(PROFILES)}")
    explicit = {name: value for name, value in given.items()
                if name in injected or name not in defaults or value != defaults[name]}
    params = build(cls, {**yaml_params(profile, cls), **explicit, "PROFILE": profile})
    recorded = {k: getattr(params, k) for k in explicit if k != "PROFILE"}
    os.environ[EXPLICIT_ENV] = json.dumps({"profile": profile, "notebook": cls.NOTEBOOK, "values": recorded})
    return params
