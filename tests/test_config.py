"""Parameter validation: unknown, ill-typed and out-of-range values fail with a message that says why."""

import dataclasses
import json
import subprocess
import sys

import pytest

from copes_lib import config
from copes_lib.config import REPO_ROOT, ConfigError, NotebookParams, build, param
from copes_lib.protocols import notebooks
from copes_lib.protocols.notebooks import load_params
from copes_lib.protocols.params import SummaryParams


@dataclasses.dataclass(frozen=True)
class ToyParams(NotebookParams):
    SIGMA: float = param(0.001, "perturbation scale", gt=0.0)
    POPULATION: int = param(40, "population size N", ge=2)
    BACKEND: str = param("batched", "evaluation backend", choices=("serial", "batched", "ray"))

    def check(self) -> None:
        if self.POPULATION % 2:
            raise ConfigError(f"ToyParams.POPULATION = {self.POPULATION} must be even (antithetic pairs)")


def test_defaults_build():
    p = build(ToyParams, {})
    assert (p.PROFILE, p.SEED, p.FORCE, p.SIGMA) == ("cpu", 0, False, 0.001)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        build(ToyParams, {"SIGMAA": 0.1})
    msg = str(err.value)
    assert "SIGMAA" in msg and "valid names" in msg and "SIGMA" in msg and "POPULATION" in msg


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"SEED": "banana"}, "ToyParams.SEED must be int, got 'banana' (str)"),
        ({"SEED": 1.5}, "ToyParams.SEED must be int"),
        ({"SEED": True}, "ToyParams.SEED must be int"),  # bool is not an int here
        ({"FORCE": 1}, "ToyParams.FORCE must be bool"),
        ({"SIGMA": "big"}, "ToyParams.SIGMA must be float"),
        ({"SIGMA": float("nan")}, "ToyParams.SIGMA must be finite"),
    ],
)
def test_wrong_type_names_the_parameter(values, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        build(ToyParams, values)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"SEED": -1}, "ToyParams.SEED = -1 is out of range; it must be >= 0"),
        ({"SIGMA": 0.0}, "ToyParams.SIGMA = 0.0 is out of range; it must be > 0.0"),
        ({"POPULATION": 1}, "ToyParams.POPULATION = 1 is out of range; it must be >= 2"),
        ({"BACKEND": "gpu"}, "ToyParams.BACKEND = 'gpu' is not valid; valid values: ['serial', 'batched', 'ray']"),
        ({"PROFILE": "laptop"}, "ToyParams.PROFILE = 'laptop' is not valid; valid values: ['smoke', 'cpu', 'gpu']"),
        ({"POPULATION": 41}, "POPULATION = 41 must be even"),
    ],
)
def test_out_of_range_names_the_bound(values, expected):
    with pytest.raises(ConfigError) as err:
        build(ToyParams, values)
    assert expected in str(err.value)


def test_int_widens_to_float():
    assert build(ToyParams, {"SIGMA": 1}).SIGMA == 1.0
    assert isinstance(build(ToyParams, {"SIGMA": 1}).SIGMA, float)


def test_config_is_frozen():
    p = build(ToyParams, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.SEED = 3  # type: ignore[misc]


@pytest.fixture
def tmp_profiles(tmp_path, monkeypatch):
    """Point the profile loader at a scratch folder; returns a writer for profiles/<name>.yaml."""
    monkeypatch.setattr(config, "PROFILE_DIR", tmp_path)

    def write(profile: str, text: str) -> None:
        (tmp_path / f"{profile}.yaml").write_text(text)

    return write


def test_profile_value_precedence(tmp_profiles):
    tmp_profiles("smoke", "99_summary:\n  SEED: 5\n")
    base = {"PROFILE": "smoke", "SEED": 0, "FORCE": False, "WRITE_README": True}
    assert load_params("99_summary", base).SEED == 5  # profile beats the default
    assert load_params("99_summary", {**base, "SEED": 7}).SEED == 7  # an explicit -p beats the profile
    assert load_params("99_summary", {**base, "PROFILE": "cpu"}).SEED == 0  # no cpu.yaml: defaults


def test_load_params_rejects_injected_unknown_name(tmp_profiles):
    namespace = {"PROFILE": "smoke", "SEED": 0, "FORCE": False, "NOT_A_PARAM": 1, "_hidden": 3, "In": []}
    with pytest.raises(ConfigError, match=r"unknown parameters \['NOT_A_PARAM'\] for OverviewParams; valid names"):
        load_params("00_suite_overview", namespace)


def test_load_params_ignores_the_notebooks_own_variables(tmp_profiles):
    """Re-running the validation cell after later cells defined lower-case variables still works."""
    namespace = {"PROFILE": "smoke", "SEED": 2, "FORCE": False, "line": "[env] ...", "profile_valid": True,
                 "n": 3, "load_params": load_params}
    assert load_params("00_suite_overview", namespace).SEED == 2


def test_load_params_rejects_bad_profile():
    with pytest.raises(ConfigError, match=r"PROFILE = 'tiny' is not valid; valid values: \['smoke', 'cpu', 'gpu'\]"):
        load_params("00_suite_overview", {"PROFILE": "tiny"})


def test_profile_key_matching_no_parameter(tmp_profiles):
    tmp_profiles("smoke", "00_suite_overview:\n  SEED: 1\n  NOT_A_PARAM: 3\n")
    with pytest.raises(ConfigError) as err:
        notebooks.validate_profile("smoke")
    msg = str(err.value)
    assert "profiles/smoke.yaml: 00_suite_overview has unknown parameters ['NOT_A_PARAM']" in msg
    assert "valid names: ['FORCE', 'PROFILE', 'SEED']" in msg
    assert "00_suite_overview" in notebooks.profile_problems("smoke", ["00_suite_overview"])


def test_profile_value_out_of_range(tmp_profiles):
    tmp_profiles("gpu", "00_suite_overview:\n  SEED: -4\n")
    with pytest.raises(ConfigError, match=r"OverviewParams.SEED = -4 is out of range; it must be >= 0"):
        notebooks.validate_profile("gpu")


def test_profile_unknown_notebook_section(tmp_profiles):
    tmp_profiles("cpu", "42_not_a_notebook: {}\n")
    with pytest.raises(ConfigError, match=r"unknown notebook '42_not_a_notebook'; valid notebooks"):
        notebooks.load_profile("cpu")


@pytest.mark.parametrize("profile", config.PROFILES)
def test_committed_profiles_are_valid_for_present_notebooks(profile):
    present = sorted(p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    registered = [s for s in present if s in notebooks.NOTEBOOKS]
    assert registered == present, f"notebooks missing from copes_lib.protocols.notebooks.NOTEBOOKS: {set(present) - set(registered)}"
    assert notebooks.profile_problems(profile, registered) == {}


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("NOT_A_PARAM", "1", "unknown parameters ['NOT_A_PARAM'] for OverviewParams; valid names: ['PROFILE', 'SEED', 'FORCE']"),
        ("SEED", "banana", "OverviewParams.SEED must be int, got 'banana' (str)"),
    ],
)
def test_papermill_bad_parameter_fails_clearly(tmp_path, name, value, expected):
    """`papermill ... -p NOT_A_PARAM 1` or `-p SEED banana` stops notebook 00 in its validation cell."""
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(REPO_ROOT / "notebooks" / "00_suite_overview.ipynb"),
         str(tmp_path / "out.ipynb"), "-k", "python3", "--cwd", str(REPO_ROOT / "notebooks"),
         "-p", "PROFILE", "smoke", "-p", name, value],
        capture_output=True, text=True, timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-2000:]
    assert "ParameterError" in output and expected in output, output[-3000:]
    # the notebook's part of the error is one line, not a traceback through copes_lib (papermill's own
    # frames of its CLI come before it)
    kernel_part = output.split('Exception encountered at "In [')[-1].strip().splitlines()
    assert len(kernel_part) == 2 and kernel_part[-1].startswith("ParameterError: 00_suite_overview: "), output[-3000:]
    assert "copes_lib/config.py" not in output, output[-3000:]


# --------------------------------------------------------------------------- what papermill passes
def _sweep_params(injected: dict):
    from copes_lib.protocols.params import StandardESNotebookParams

    return load_params("02_standard_es", _papermill_namespace("smoke", injected, StandardESNotebookParams))


@pytest.mark.parametrize(("value", "grid"), [
    ("0.005,0.01", [0.005, 0.01]),          # -p SWEEP_SIGMAS 0.005,0.01 (text)
    ([0.005, 0.01], [0.005, 0.01]),         # -y 'SWEEP_SIGMAS: [0.005, 0.01]' (a list)
    ((0.005, "0.02"), [0.005, 0.02]),       # mixed items
    ([1e-05, 0.001], [1e-05, 0.001]),       # small floats keep their value through the text
    ("", []),                               # no sweep
])
def test_grid_parameter_takes_text_or_a_list(value, grid):
    params = _sweep_params({"SWEEP_SIGMAS": value})
    assert isinstance(params.SWEEP_SIGMAS, str) and params.sweep_grid(0.01) == grid


def test_a_single_number_for_a_grid_is_judged_as_a_grid_not_a_type():
    """`-p SWEEP_SIGMAS 0.01` arrives as a float: it used to fail with "must be str, got float"; now the
    grid's own rule answers (one value is no sweep), naming the parameter and what is valid."""
    with pytest.raises(config.ParameterError) as err:
        _sweep_params({"SWEEP_SIGMAS": 0.01})
    message = str(err.value)
    assert "SWEEP_SIGMAS = '0.01' holds one value" in message and "give at least two" in message
    assert "must be str" not in message
    assert _sweep_params({"SWEEP_FACTORS": [0.5, 1, 2]}).sweep_grid(0.01) == pytest.approx([0.005, 0.01, 0.02])


def test_list_parameters_take_a_number_or_a_list():
    from copes_lib.protocols.params import AblationParams, BudgetNotebookParams

    lengths = [64, 128, 256, 512]
    namespace = _papermill_namespace("smoke", {"CONTEXTS": lengths}, BudgetNotebookParams)
    assert load_params("08_memory_and_gpu_hours", namespace).context_lengths == lengths
    namespace = _papermill_namespace("smoke", {"CONTEXTS": 256}, BudgetNotebookParams)  # -p CONTEXTS 256
    with pytest.raises(config.ParameterError, match=r"CONTEXTS = '256' must list >= 4 distinct lengths"):
        load_params("08_memory_and_gpu_hours", namespace)  # the parameter's own rule, not "must be str"
    namespace = _papermill_namespace("smoke", {"ARMS": ["k1", "k4"]}, AblationParams)  # -y 'ARMS: [k1, k4]'
    assert load_params("06_copes_ablations", namespace).arms() == ["k1", "k4"]


@pytest.mark.parametrize(("name", "text", "value"), [("SEED", "3", 3), ("SEED", " 7 ", 7), ("SIGMA", "0.02", 0.02),
                                                     ("SIGMA", "1e-3", 0.001), ("FORCE", "true", True),
                                                     ("FORCE", "False", False)])
def test_numbers_and_bools_written_as_text_are_read(name, text, value):
    """`papermill -r NAME VALUE` passes text."""
    assert getattr(build(ToyParams, {name: text}), name) == value


@pytest.mark.parametrize(("values", "expected"), [
    ({"SEED": "3.5"}, "ToyParams.SEED must be int, got '3.5' (str); valid values: a whole number >= 0"),
    ({"SIGMA": [0.1, 0.2]}, "ToyParams.SIGMA must be float, got [0.1, 0.2] (list); valid values: a number > 0.0"),
    ({"BACKEND": 3}, "ToyParams.BACKEND = '3' is not valid; valid values: ['serial', 'batched', 'ray']"),
    ({"BACKEND": {"a": 1}}, "ToyParams.BACKEND must be str, got {'a': 1} (dict); valid values: ['serial', "),
    ({"FORCE": "yes"}, "ToyParams.FORCE must be bool, got 'yes' (str); valid values: True or False"),
])
def test_what_cannot_be_read_names_the_parameter_and_the_valid_values(values, expected):
    with pytest.raises(ConfigError) as err:
        build(ToyParams, values)
    assert expected in str(err.value)


def test_parameter_errors_render_as_one_line_in_ipython():
    """IPython shows an exception with `_render_traceback_` as what it returns: the notebook's validation cell
    ends in one line naming the parameter, not frames of copes_lib."""
    from copes_lib.protocols.params import StandardESNotebookParams

    namespace = _papermill_namespace("smoke", {"SEED": "banana"}, StandardESNotebookParams)
    with pytest.raises(config.ParameterError) as err:
        load_params("02_standard_es", namespace)
    assert err.value._render_traceback_() == [
        "ParameterError: 02_standard_es: StandardESNotebookParams.SEED must be int, got 'banana' (str); valid "
        "values: a whole number >= 0. base random seed of this notebook"]
    assert isinstance(err.value, ConfigError)  # callers catching ConfigError still catch it


# --------------------------------------------------------------------------- precedence (issue 15)
@pytest.fixture(autouse=True)
def _no_explicit_values_leak(monkeypatch):
    """load_params records explicit values in the environment; each test starts without them."""
    monkeypatch.delenv(config.EXPLICIT_ENV, raising=False)


def _papermill_namespace(profile: str, injected: dict, cls) -> dict:
    """A kernel's globals after the committed parameters cell and papermill's injected cell ran."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    cell = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in {"PROFILE": profile, **injected}.items())
    return {**defaults, "PROFILE": profile, **injected, "In": ["", "PROFILE: str = 'cpu'\n", cell]}


@pytest.mark.parametrize(("name", "value"), [("STEPS", 16), ("BACKEND", "batched"), ("SIGMA", 0.01),
                                             ("MAIN_FROM_SWEEP", True)])
def test_injected_value_wins_even_when_it_equals_the_cpu_default(name, value):
    """`-p STEPS 16` under gpu gave the profile's 128 because 16 is also the cpu default."""
    from copes_lib.protocols.params import StandardESNotebookParams

    assert getattr(StandardESNotebookParams(), name) == value  # the case of the bug: value == cpu default
    assert notebooks.profile_params("gpu", "02_standard_es")[name] != value
    namespace = _papermill_namespace("gpu", {name: value}, StandardESNotebookParams)
    params = load_params("02_standard_es", namespace)
    assert getattr(params, name) == value
    others = notebooks.profile_params("gpu", "02_standard_es")
    assert params.POPULATION == others["POPULATION"]  # the rest still comes from the profile


def test_without_injection_the_profile_beats_the_untouched_defaults():
    from copes_lib.protocols.params import StandardESNotebookParams

    namespace = _papermill_namespace("gpu", {}, StandardESNotebookParams)
    assert load_params("02_standard_es", namespace).STEPS == 128
    # JupyterLab: a hand-edited value (differs from the committed default) wins without injection
    edited = {**namespace, "STEPS": 20, "In": ["", "PROFILE = 'gpu'\nSTEPS = 20\n"]}
    assert load_params("02_standard_es", edited).STEPS == 20


@pytest.mark.parametrize("name", ["steps", "Steps", "not_a_param"])
def test_injected_unknown_name_in_any_case_is_an_error(name):
    from copes_lib.protocols.params import StandardESNotebookParams

    namespace = _papermill_namespace("gpu", {name: 16}, StandardESNotebookParams)
    with pytest.raises(ConfigError, match=rf"unknown parameters \['{name}'\] for StandardESNotebookParams; "
                                          r"valid names: \[") as err:
        load_params("02_standard_es", namespace)
    assert ("did you mean STEPS" in str(err.value)) == (name.upper() == "STEPS")


def test_injected_data_path_reaches_the_task_loader(tmp_path):
    """A data path given with -p is the one the gpu task loaders read, not the (empty) YAML one."""
    from copes_lib import tasks
    from copes_lib.protocols.params import SubstrateNotebookParams
    from copes_lib.protocols.testbed.substrate_setup import substrate_params

    train = tmp_path / "math_train.jsonl"
    rows = [{"problem": f"What is {i}+1?", "level": "Level 1", "type": "Algebra" if i % 2 else "Geometry",
             "solution": f"It is $\\boxed{{{i + 1}}}$."} for i in range(12)]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert notebooks.profile_params("gpu", "01_substrate_and_agent")["MATH_TRAIN_JSONL"] == ""
    namespace = _papermill_namespace("gpu", {"MATH_TRAIN_JSONL": str(train), "VAL_HOLDOUT": 4},
                                     SubstrateNotebookParams)
    params = load_params("01_substrate_and_agent", namespace)
    assert params.MATH_TRAIN_JSONL == str(train)
    assert substrate_params("gpu").MATH_TRAIN_JSONL == str(train)  # the library sees the same value
    assert len(tasks.load_tasks("gpu", "math", "train")) == 8
    assert len(tasks.load_tasks("gpu", "math", "val")) == 4


def test_explicit_values_reach_child_processes():
    namespace = _papermill_namespace("smoke", {"SEED": 9}, SummaryParams)
    load_params("99_summary", namespace)
    code = ("from copes_lib.protocols import notebooks; "
            "print(notebooks.profile_params('smoke', '99_summary')['SEED'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "9"


def test_papermill_injected_value_equal_to_the_cpu_default_wins(tmp_path):
    """End to end through papermill: -p STEPS 16 -p BACKEND batched -p SIGMA 0.01 under gpu."""
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                        "display_name": "Python 3"}})
    params_cell = nbformat.v4.new_code_cell('PROFILE: str = "cpu"\nSTEPS: int = 16\n')
    params_cell.metadata["tags"] = ["parameters"]
    check = ('from copes_lib.protocols.notebooks import load_params\nP = load_params("02_standard_es", globals())\n'
             'print("VALUES", P.STEPS, P.BACKEND, P.SIGMA, P.POPULATION)\n')
    nb.cells = [params_cell, nbformat.v4.new_code_cell(check)]
    source = tmp_path / "probe.ipynb"
    nbformat.write(nb, source)
    proc = subprocess.run(
        [sys.executable, "-m", "papermill", str(source), str(tmp_path / "out.ipynb"), "-k", "python3",
         "--log-output", "-p", "PROFILE", "gpu", "-p", "STEPS", "16", "-p", "BACKEND", "batched",
         "-p", "SIGMA", "0.01"], capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "VALUES 16 batched 0.01 40" in output, output[-3000:]


# --------------------------------------------------------------------------- strict profiles (issue 15)
def test_duplicated_profile_section_names_file_and_both_lines(tmp_profiles):
    tmp_profiles("gpu", "02_standard_es:\n  STEPS: 128\n  SIGMA: 0.001\n\n02_standard_es:\n  STEPS: 3\n")
    with pytest.raises(ConfigError, match=r"gpu\.yaml: '02_standard_es' is defined twice \(lines 1 and 5\)"):
        config.load_profile("gpu")


def test_duplicated_profile_key_names_file_and_both_lines(tmp_profiles):
    tmp_profiles("smoke", "02_standard_es:\n  STEPS: 3\n  SIGMA: 0.1\n  STEPS: 4\n")
    with pytest.raises(ConfigError, match=r"smoke\.yaml: 'STEPS' is defined twice \(lines 2 and 4\)"):
        notebooks.validate_profile("smoke")


def test_profile_syntax_error_names_file_and_line(tmp_profiles):
    tmp_profiles("gpu", "02_standard_es:\n  STEPS: 3\n  SIGMA: [0.1\n03_copes: {}\n")
    with pytest.raises(ConfigError, match=r"gpu\.yaml, line \d+, column \d+: not valid YAML"):
        config.load_profile("gpu")
