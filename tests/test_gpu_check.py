"""benchmarks/gpu_check.sh's CPU dry run end to end, laid out as on the GPU machine as far as a CPU
allows: the interpreter is a venv, bm25s does not import, no wheel folder; and the wheel installer
(pip --no-deps --target, no nested venv) on a wheel built here. Numbers of a dry run are not GPU figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow(cost=70)  # started first by tests/conftest.py (make test's worker balance)
def test_cpu_dry_run_writes_every_section_and_judges_nothing(tmp_path):
    assert sys.prefix != sys.base_prefix, "run from the venv: the GPU machine's python3 is a venv too"
    shim = tmp_path / "shim" / "bm25s"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('simulated: bm25s is not installed')\n")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(shim.parent), "WHEELS": str(tmp_path / "none"),
           "GPU_CHECK_SITE": str(tmp_path / "site"), "GPU_CHECK_RESULTS": str(tmp_path / "results"),
           "OUT": str(tmp_path / "out"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=3600)  # the sections have their own limits
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = (tmp_path / "results").iterdir()
    assert run.name.endswith("-cpu-dry-run")
    from copes_lib.engines import ENGINES

    names = {"kernels", "equality", "grpo", "summary"} | {f"engine-{e}" for e in ENGINES}
    assert {p.stem for p in run.glob("*.json")} == names
    assert {p.stem for p in (tmp_path / "out" / "gpu_check" / run.name).glob("*.json")} == names  # mirrored
    sections = {p.stem: json.loads(p.read_text()) for p in run.glob("*.json")}
    assert not any("error" in s for s in sections.values())
    summary = sections["summary"]
    assert summary["cpu_dry_run"] and not summary["judged"] and summary["all_pass"] is None
    assert all(g["pass"] is None for g in summary["goals"])  # never a GPU figure from a CPU
    names = [g["goal"] for g in summary["goals"]]
    # every section is judged on CUDA: equality (rows, each engine vs the loop) and GRPO too
    assert any(n.startswith("equality: batch rows") for n in names) and any(n.startswith("GRPO") for n in names)
    assert {n.split(":")[1].split()[0] for n in names if n.startswith("equality: ") and "gives" in n} \
        == {e for e in ENGINES if e != "loop" and "skipped" not in sections["equality"]["engines"][e]}
    for g in summary["goals"]:
        if g["goal"].startswith("equality"):  # the CPU measures them too: they hold here
            assert g["measured_pass_on_this_device"] is True, g
    assert set(summary["compile_s"]) >= {"loop"}
    # every engine is measured, unless it refuses a CPU with a ConfigError (then it says why)
    assert "loop" not in summary["engines_not_measured"]
    assert all(sections[f"engine-{e}"].get("skipped") for e in summary["engines_not_measured"])
    kernels = sections["kernels"]
    assert kernels["static_uses_fla"] is False  # no fla here: transformers' PyTorch fallback is what runs
    equality = sections["equality"]
    assert equality["rows_vs_single_same_tokens"] and equality["rows_vs_single_max_logit_diff"] < 1e-4
    for name in ENGINES:
        row = equality["engines"][name]
        if "skipped" in row:
            assert name in summary["engines_not_measured"]
            continue
        assert row["rewards_differ_across_members"] and row["update_norm"] > 0  # the ES update is exercised
        assert row["tool_calls"]["search"] > 0
        if name != "loop":
            assert row["same_tokens_as_loop"] and row["weights_max_abs_diff_vs_loop"] == 0.0
        engine = sections[f"engine-{name}"]
        assert engine["kv"]["forwards_seen"] > 0 and engine["es"]["weights_changed"]
        assert engine["warmup_s"] > 0 and engine["compile_s"] >= 0
        assert engine["row_tokens"]["max"] > 2 * engine["row_tokens"]["min"]  # varied row lengths
    assert sections["grpo"]["dry_run_on_cpu"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA machine runs the real check")
def test_gpu_check_refuses_cpu_without_allow_cpu(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--section", "kernels",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--allow-cpu" in done.stderr
    assert not list(tmp_path.iterdir())


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (one module that knows its version)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", f"VERSION = {version!r}\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def test_install_wheels_adds_only_what_the_interpreter_lacks(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "copes_fake_pkg", "1.0")
    _wheel(wheels, "packaging", "0.1")  # marked "if missing": the interpreter has packaging, so never installed
    listing = tmp_path / "list.txt"
    listing.write_text("copes_fake_pkg==1.0\npackaging==0.1  # if missing\nnot_in_folder==2.0\n")
    target = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(target)}
    cmd = [sys.executable, str(REPO / "benchmarks" / "install_wheels.py"), str(wheels), str(target), "--list",
           str(listing)]
    first = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    assert first["installed"] == ["copes_fake_pkg-1.0-py3-none-any.whl"]
    assert first["absent_from_folder"] == ["not_in_folder==2.0 (installed: None)"]
    assert any(p.startswith("packaging==") for p in first["present"])
    check = subprocess.run([sys.executable, "-c", "import copes_fake_pkg, packaging; print(copes_fake_pkg.VERSION,"
                            " packaging.__version__ != '0.1')"], env=env, capture_output=True, text=True, check=True)
    assert check.stdout.split() == ["1.0", "True"]
    second = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    assert second["installed"] == [] and "copes_fake_pkg==1.0" in second["present"]  # a rerun installs nothing


def test_wheel_list_pins_hub_below_2_and_every_line():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from install_wheels import read_list

    pins = {name.lower().replace("-", "_"): version for name, version, _ in read_list(REPO / "benchmarks" /
                                                                                          "gpu_wheels.txt")}
    assert int(pins["huggingface_hub"].split(".")[0]) < 2  # 2.x imports httpx2
    for name in ("transformers", "tokenizers", "flash_linear_attention", "fla_core", "einops"):
        assert name in pins
    assert pytest.importorskip("transformers").__version__ == pins["transformers"]  # the suite's reference


def test_the_row_exactness_probe_has_a_100x_margin(monkeypatch):
    """The equality section's probe (gpu_check.rows_vs_single on engines.build_probe_qwen35, 8 rows as on
    the GPU): batch rows within the bar of their single-row runs, and with the row-exact linear-attention
    path switched off >= 100x the bar away (on build_qwen35's flat logits: ~6x, issue 34)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    from copes_lib import rollout as rollout_module
    from copes_lib.engines import build_probe_qwen35

    tokenizer = gpu_check.make_tokenizer()
    model = build_probe_qwen35(len(tokenizer), seed=0, tokenizer=tokenizer)
    bar = gpu_check.GOALS["row_exact_logit_diff"]
    exact, same = gpu_check.rows_vs_single(model, tokenizer, 8)
    assert exact < bar and same
    # both looked up by the trajectory state (copes_lib.rollout.Trajectories), which then builds no row-exact path
    monkeypatch.setattr(rollout_module, "linear_attention_layers", lambda cache: [])
    monkeypatch.setattr(rollout_module, "check_hybrid_cache", lambda model, cache: None)
    drift, _ = gpu_check.rows_vs_single(model, tokenizer, 8)
    assert drift >= 100 * bar, (exact, drift)


def test_a_missing_wheel_folder_says_how_to_build_it(tmp_path):
    """No wheel folder and a Python that lacks a pinned package: exit 1 at once with the command that
    builds the folder (not a silent skip that lets every section fail on import)."""
    listing = tmp_path / "list.txt"
    listing.write_text("copes_not_installed_pkg==1.0\n")
    env = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(tmp_path / "none"), "GPU_WHEEL_LIST": str(listing),
           "GPU_CHECK_RESULTS": str(tmp_path / "results")}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "copes_not_installed_pkg==1.0" in done.stderr and "make gpu-wheels PY_TAG=" in done.stderr
    assert "GPU_CHECK_NO_WHEELS=1" in done.stderr and not (tmp_path / "results").exists()


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for the check's Python: sections return at once, except kernels, which takes 3 s
case "$*" in
    *"-c from copes_lib.engines"*) echo "loop slots static" ;;
    *"--section kernels"*) exec sleep 3 ;;
esac
exit 0
"""


def _limits_run(tmp_path, *args, **env_vars):
    """gpu_check.sh with a stand-in Python: (exit code, stderr, the run's limits.txt, exit-*.txt files)."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    results = tmp_path / f"results{len(list(tmp_path.iterdir()))}"
    env = {**os.environ, "PYTHON": str(fake), "WHEELS": str(tmp_path / "none"), "GPU_CHECK_RESULTS": str(results),
           **env_vars}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    runs = list(results.iterdir()) if results.exists() else []
    limits = (runs[0] / "limits.txt").read_text() if runs else ""
    exits = {p.stem: json.loads(p.read_text()) for p in runs[0].glob("exit-*.txt")} if runs else {}
    return done.returncode, done.stderr, limits, exits


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "gpu"])
def test_section_time_limits_follow_the_environment(tmp_path, dry):
    """T_* set every section's limit in the dry run too (a busy CI box can relax them), and
    GPU_CHECK_TIME_SCALE multiplies them: a 3 s section fails under a 1 s limit, passes under 1 s x 6."""
    args = ["--dry-run"] if dry else []
    rc, err, limits, exits = _limits_run(tmp_path, *args, T_KERNELS="1", T_ENGINES="50", GPU_CHECK_TIME_SCALE="1")
    assert rc == 1 and "section kernels exit 124" in err, err
    assert exits["exit-kernels"]["limit_s"] == 1 and "T_KERNELS=1 " in limits and "T_ENGINES=50 " in limits
    default_grpo = 120 if dry else 40
    assert f"T_GRPO={default_grpo} " in limits  # unset: the default of this mode
    rc, err, limits, exits = _limits_run(tmp_path, *args, T_KERNELS="1", GPU_CHECK_TIME_SCALE="6")
    assert rc == 0 and not exits, err
    assert "T_KERNELS=6 " in limits and f"T_GRPO={6 * default_grpo} " in limits and "RESERVE=240 " in limits


def test_dry_run_limits_scale_with_the_load_and_bad_values_are_refused(tmp_path):
    rc, err, limits, _ = _limits_run(tmp_path, "--dry-run")  # auto: 1 + load per CPU, at least the defaults
    assert rc == 0, err
    scale = float(limits.split("(scale ")[1].rstrip(")\n"))
    assert 1 <= scale <= 8 and f"T_KERNELS={round(120 * scale)} " in limits
    rc, err, _, _ = _limits_run(tmp_path, "--dry-run", GPU_CHECK_TIME_SCALE="fast")
    assert rc == 2 and "GPU_CHECK_TIME_SCALE=fast is not valid" in err and "auto" in err
    rc, err, _, _ = _limits_run(tmp_path, T_GRPO="soon")
    assert rc == 2 and "T_GRPO=soon is not valid" in err


def _sections(engine_shape: dict, rows: int, grpo_sizes: dict) -> dict:
    """Section JSONs of a CUDA run whose figures all meet their goals, measured at the given shapes."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    from copes_lib.engines import ENGINES

    out = {"kernels": {"fla_kernels_used": True},
           "equality": {"rows": rows, "dtype": "torch.float32", "rows_vs_single_max_logit_diff": 1e-6,
                        "rows_vs_single_same_tokens": True,
                        "engines": {e: {"same_tokens_as_loop": True, "rewards_max_abs_diff_vs_loop": 0.0,
                                        "weights_max_abs_diff_vs_loop": 0.0} for e in ENGINES}},
           "grpo": {"sizes": grpo_sizes, "tokens_per_trajectory": gpu_check.GRPO_SHAPE["tokens_per_trajectory"],
                    "trajectories": gpu_check.GRPO_SHAPE["trajectories"],
                    "single_process": {"measured_over_predicted": 1.05}, "sharded_2gpu": {"ran": False}}}
    for k, e in enumerate(ENGINES):
        out[f"engine-{e}"] = {**engine_shape, "new_tokens_per_s": 100.0 * (1 + 5 * k), "compile_s": 0.0,
                              "es": {"member_over_pure_inference": 0.95, "rewards_differ_across_members": True,
                                     "weights_changed": True, "rewards": [0.1, 0.2]},
                              "kv": {"kv_over_model": 1.02, "max_width_over_longest_row": 1.05}}
    return out


def _judge(tmp_path, sections: dict) -> dict:
    import gpu_check

    run = tmp_path / "run"
    run.mkdir(parents=True)
    for name, data in sections.items():
        (run / f"{name}.json").write_text(json.dumps(data))
    return gpu_check.summary(run, {"cpu_dry_run": False})


def test_the_judge_fails_figures_measured_at_another_shape(tmp_path):
    """The same good figures pass at the goals' shapes (0.8B, batch 64, 128 tokens, bf16; 8 equality rows;
    GRPO's GPU sizes) and fail as not measured at a tiny model, batch 4, fp32 (the CPU dry run's shape)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check
    import gpu_check_grpo

    assert gpu_check_grpo.GPU_SIZES.to_dict() == gpu_check.GRPO_SHAPE["sizes"]
    assert gpu_check_grpo.PROMPT + gpu_check_grpo.COMPLETION == gpu_check.GRPO_SHAPE["tokens_per_trajectory"]
    assert gpu_check_grpo.TRAJECTORIES == gpu_check.GRPO_SHAPE["trajectories"]
    good = _judge(tmp_path / "good", _sections(gpu_check.ENGINE_SHAPE, 8, gpu_check.GRPO_SHAPE["sizes"]))
    assert good["judged"] and good["all_pass"], [g for g in good["goals"] if not g["pass"]]
    small = {"size": "tiny", "batch": 4, "max_new_tokens": 32, "dtype": "torch.float32"}
    bad = _judge(tmp_path / "bad", _sections(small, 4, gpu_check_grpo.CPU_SIZES.to_dict()))
    assert bad["all_pass"] is False
    by_name = {g["goal"]: g for g in bad["goals"]}
    assert by_name.pop("fla kernels are what transformers calls for Qwen3.5")["pass"] is True
    assert len(by_name) >= 8 and all(g["pass"] is False and g["value"] is None for g in by_name.values())
    assert all(g["off_shape"] and g["value_at_other_shape"] is not None for g in by_name.values())
    speed = next(g for g in bad["goals"] if g["goal"].startswith("fast path"))
    assert speed["value_at_other_shape"] == 11.0 and speed["off_shape"]["batch"] == {"measured": 4, "goal": 64}
    # one field off is enough: the goal's model at batch 4
    one_off = _judge(tmp_path / "one", _sections({**gpu_check.ENGINE_SHAPE, "batch": 4}, 8,
                                                 gpu_check.GRPO_SHAPE["sizes"]))
    failed = {g["goal"] for g in one_off["goals"] if not g["pass"]}
    assert any(n.startswith("fast path") for n in failed) and any("KV memory" in n for n in failed)
    assert not any(n.startswith(("equality", "GRPO")) for n in failed)
