"""Which notebooks the suite has and the parameter class of each; loading a notebook's parameters.

Every notebook's first code cell is ``P = load_params("<stem>", globals())``. The runner
(``copes_lib.cli``) validates a whole profile against these classes before it runs anything.
"""

from __future__ import annotations

from typing import Any

from copes_lib import config, runs
from copes_lib.config import ConfigError, NotebookParams, build
from copes_lib.protocols import params
from copes_lib.protocols import study as scale_study
from copes_lib.protocols.paper_b import molora_params
from copes_lib.protocols.testbed.substrate_setup import use_profile_data

_CLASSES: tuple[type[NotebookParams], ...] = (
    params.OverviewParams, params.SubstrateNotebookParams, params.StandardESNotebookParams,
    params.CoPESNotebookParams, params.GRPONotebookParams, params.FixedBudgetParams, params.AblationParams,
    params.MultihopQAParams, params.BudgetNotebookParams, scale_study.ScaleStudyParams,
    molora_params.MoloraSubstrateParams,
    molora_params.MoloraRouterParams, molora_params.MoloraFactorialParams, molora_params.SandboxNotebookParams,
    params.SummaryParams,
)
#: notebook stem -> its parameter dataclass, in suite order
NOTEBOOKS: dict[str, type[NotebookParams]] = {cls.NOTEBOOK: cls for cls in _CLASSES}


# What each notebook reads from the others (their summaries or cached work). The runner starts a
# notebook only after these have finished, so parallel runs (`make reproduce JOBS=2`) never race for
# a cache entry; a notebook missing here waits for every lower-numbered notebook.
NEEDS: dict[str, tuple[str, ...]] = {
    "00_suite_overview": (),
    "01_substrate_and_agent": (),  # trains and caches the math and QA warm starts
    "02_standard_es": ("01_substrate_and_agent",),
    # ES's setting in 03 is the registered default (01's calibrated sigma), not 02's sweep choice, so 03 runs
    # beside 02 (docs/cost.md, the P8.7 recipe against the 2-hour bound, plan item 2)
    "03_copes": ("01_substrate_and_agent",),
    "04_grpo": ("01_substrate_and_agent",),
    "05_fixed_budget_math": ("02_standard_es", "03_copes", "04_grpo"),  # tuned settings, 04's cached GRPO runs
    # 05's budget rule on 04's s* (not 05's summary), so 06 runs beside 05; its k1 / k4 (05's ES / CoPES runs)
    # come last and are cache hits once 05 has trained them
    "06_copes_ablations": ("02_standard_es", "04_grpo"),
    "07_multihop_qa": ("01_substrate_and_agent",),  # the QA warm start
    "08_memory_and_gpu_hours": ("01_substrate_and_agent",),
    "09_scale_study": ("01_substrate_and_agent",),  # 01's warm start at its own size (cached)
    "10_molora_substrate": (),
    "11_molora_router": ("10_molora_substrate",),
    "12_molora_factorial": ("10_molora_substrate",),
    "13_molora_sandbox": (),
    "99_summary": tuple(n for n in NOTEBOOKS if n != "99_summary"),
}


# Notebooks that run processes of their own: stem -> the parameter that says how many at once. The runner gives such
# a notebook that many of its JOBS slots, at most JOBS (a larger value is lowered to JOBS for the run, so a suite
# never keeps more than JOBS cores busy); nothing else starts in the slots it holds.
SLOTS: dict[str, str] = {
    "01_substrate_and_agent": "BUILD_JOBS",  # its math and QA bases, then its preflights, in parallel (docs/cost.md)
}


# Notebooks that train on notebook 01's base of their TASK_KIND (02's parameter; the class value of 03-07, 04's is
# math): the runner skips them when 01 did not build that base or its preflight of it failed
# (copes_lib/protocols/testbed/base_gate.py, issue 47 decision 3). 00 and paper B (10-13) use no base of 01; 08 times steps
# (no claim rests on its base being checked); 09 builds its own bases at other sizes: none of these is skipped.
USES_BASE: tuple[str, ...] = ("02_standard_es", "03_copes", "04_grpo", "05_fixed_budget_math", "06_copes_ablations",
                              "07_multihop_qa")


def base_kinds(notebook: str, values: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The kinds of 01's base ``notebook`` trains on (its ``TASK_KIND``, from ``values`` when given there), or ().

    >>> base_kinds("05_fixed_budget_math"), base_kinds("02_standard_es", {"TASK_KIND": "qa"}), base_kinds("08_memory_and_gpu_hours")
    (('math',), ('qa',), ())
    """
    if notebook not in USES_BASE:
        return ()
    return (str((values or {}).get("TASK_KIND", getattr(params_class(notebook), "TASK_KIND", "math"))),)


# Notebooks that read 01's base without resting a claim on it, and the parameters they run with when that kind's base
# is closed by its 5-seed check (so none of them trains a rejected or unchecked design on its own): 08 splits an ES
# and a GRPO step into phases on the math agent; without a checked math base it times the same steps on a random
# model with plain generate (ACCOUNT_ENGINE plain, its documented alternative; the summary records the engine).
WITHOUT_BASE: dict[str, tuple[str, dict[str, Any]]] = {
    "08_memory_and_gpu_hours": ("math", {"ACCOUNT_ENGINE": "plain"}),
}


# The suite's parts (issue 47 decision 1): `make reproduce PART=<name>` runs one, plain `make reproduce` runs them all,
# in this order, one after another, each recorded in results/<profile>/suite_run.json with its own wall time (the
# budgets: README and docs/cost.md). Each part ends with 99, which tabulates whatever results exist. The 2-hour bound
# covers paper-a. Notebook 06's norm curve is a part of its own: paper-a runs 06 without it (PART_PARAMS), the
# norm-curve part runs 06 again with the profile's NORM_CURVE_SEEDS, its arms cache hits (the same runs, keyed by their
# config), so 06's numbers are those of one run with the curve.
PARTS: dict[str, tuple[str, ...]] = {
    "paper-a": ("00_suite_overview", "01_substrate_and_agent", "02_standard_es", "03_copes", "04_grpo",
                "05_fixed_budget_math", "06_copes_ablations", "07_multihop_qa", "08_memory_and_gpu_hours", "99_summary"),
    "paper-b": ("10_molora_substrate", "11_molora_router", "12_molora_factorial", "13_molora_sandbox", "99_summary"),
    "study": ("09_scale_study", "99_summary"),
    "norm-curve": ("06_copes_ablations", "99_summary"),
}
#: parameters a part sets on top of the profile's, per notebook
PART_PARAMS: dict[str, dict[str, dict[str, Any]]] = {"paper-a": {"06_copes_ablations": {"NORM_CURVE_SEEDS": 0}}}


def part_notebooks(part: str) -> tuple[str, ...]:
    """The notebooks of ``part``; an unknown name is a one-line error naming the valid values."""
    if part not in PARTS:
        raise ConfigError(f"PART = {part!r} is not a part of the suite; valid values: {', '.join(PARTS)} "
                          "(or no PART: every part, one after another)")
    return PARTS[part]


def params_class(notebook: str) -> type[NotebookParams]:
    """The parameter dataclass of ``notebook`` (its file stem, e.g. ``"02_standard_es"``)."""
    if notebook not in NOTEBOOKS:
        raise ConfigError(f"unknown notebook {notebook!r}; valid notebooks: {list(NOTEBOOKS)}")
    return NOTEBOOKS[notebook]


def load_params(notebook: str, namespace: dict[str, Any]) -> NotebookParams:
    """Validate a notebook's parameters; call as ``P = load_params("02_standard_es", globals())``.

    Every UPPER_CASE plain-scalar global defined so far counts as a parameter, so a misspelt
    ``papermill -p`` name stops the notebook with the list of valid names instead of being silently
    ignored. Under the gpu profile it also points the task loaders at the profile's local data files.

    A value that does not validate stops the notebook with one line (:class:`config.ParameterError`) that
    names the parameter and its valid values, not a traceback through the library.
    """
    runs.mark_notebook_start(notebook)  # the manifest's wall time runs from here (the notebook's first cell)
    try:
        loaded = config.load_params(params_class(notebook), namespace)
        use_profile_data(loaded.PROFILE)
    except ConfigError as error:
        raise config.ParameterError(f"{notebook}: {error}") from None
    return loaded


def load_profile(profile: str) -> dict[str, dict[str, Any]]:
    """``profiles/<profile>.yaml``; a section naming no notebook of the suite fails loudly."""
    return config.load_profile(profile, NOTEBOOKS)


def profile_params(profile: str, notebook: str) -> dict[str, Any]:
    """The profile's values for one notebook, checked against the notebook's parameter class, with the
    values given explicitly to that notebook in this kernel on top (``config.profile_params``)."""
    load_profile(profile)
    return config.profile_params(profile, params_class(notebook))


def validate_profile(profile: str) -> None:
    """Build every notebook's parameters under ``profile``: any bad key or value raises."""
    for notebook in load_profile(profile):
        build(params_class(notebook), {**config.yaml_params(profile, params_class(notebook)), "PROFILE": profile},
              source=f"parameters in profiles/{profile}.yaml")


def profile_problems(profile: str, notebooks: list[str] | None = None) -> dict[str, str]:
    """``{notebook: what is wrong}`` for each of ``notebooks`` (default: every registered one) whose
    parameters under ``profile`` do not validate. An empty dict means the profile is valid for them."""
    sections = load_profile(profile)
    problems = {}
    for notebook in notebooks if notebooks is not None else list(NOTEBOOKS):
        try:
            values = config.yaml_params(profile, params_class(notebook)) if notebook in sections else {}
            build(params_class(notebook), {**values, "PROFILE": profile},
                  source=f"parameters in profiles/{profile}.yaml")
        except ConfigError as exc:
            problems[notebook] = f"{type(exc).__name__}: {exc}"
    return problems


def check_written(profile: str, notebook: str, files: tuple[str, ...] = ("summary.json", "metrics.jsonl"),
                  figures: tuple[str, ...] = ()) -> dict[str, Any]:
    """A notebook's last cell: the results folder holds ``files`` and the figures ``figures``, and every
    number of its summary is finite. Returns the written summary."""
    import math

    from copes_lib import runs

    out = runs.RESULTS_ROOT / profile / notebook
    for name in files:
        assert (out / name).exists(), f"{out / name} was not written"
    for what in figures:
        assert runs.figure_path(profile, notebook, what).exists(), f"figure {what!r} of {notebook} was not written"
    written = runs.read_json(out / "summary.json")
    bad = [k for k, v in written.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)]
    assert not bad, f"{notebook}: summary values are not finite: {bad}"
    print("ok:", out)
    return written
