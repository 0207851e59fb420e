"""Reports for readers: each notebook's HTML and the index of a profile.

Each notebook's HTML (:func:`export_notebook_html`) opens with what a reader came for: the claims the
notebook tests (:mod:`copes_lib.claims`), our numbers beside the paper's, the verdicts and the
figures; the notebook follows with its code hidden behind a toggle (the executed ``.ipynb`` keeps
everything). Progress bars and library warnings are left out of the HTML; ``np.float64(0.5)`` reprs
read ``0.5``.

``reports/<profile>/index.html`` (:func:`render_index`) has one row per notebook: status and
duration (from ``status.json``, written by :mod:`copes_lib.cli`; for a notebook it does not list, from
the results themselves, :func:`status_from_results`: so ``python -m copes_lib.cli report --profile cpu``
shows the committed run as it ended), the headline numbers of its
``results/<profile>/<NN_topic>/summary.json`` beside the paper's with verdicts, figure thumbnails
(``figures/<profile>/<NN>_*.png``) and links. Plain HTML with inline CSS, no template engine, so the
pages open from disk anywhere.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import os
import re
import sys
from pathlib import Path
from typing import Any

from copes_lib import claims, paper, runs

PAPER_A = "A: CoPES (cooperative coevolution ES for agentic LLM post-training)"
PAPER_B = "B: decomposing evolutionary mixture-of-LoRA"

# notebook stem -> (paper, what it reproduces). The README's notebook map says the same.
SUITE_MAP: dict[str, tuple[str, str]] = {
    "00_suite_overview": ("suite", "map of the suite, environment (versions, device, threads), profile check"),
    "01_substrate_and_agent": (PAPER_A, "substrate and agent: the base model (small Qwen3-style models on smoke and "
                               "cpu, the paper's checkpoint on gpu), tool-using agent, rewards (A4)"),
    "02_standard_es": (PAPER_A, "standard ES baseline (Algorithm of A1; CoPES with K = 1)"),
    "03_copes": (PAPER_A, "CoPES (Algorithm 1): cooperative subspace ES"),
    "04_grpo": (PAPER_A, "GRPO baselines: full-parameter and LoRA"),
    "05_fixed_budget_math": (PAPER_A, "Table 1 + Fig. 3 (pass@k) + Fig. S4 (validation curves): fixed-budget math"),
    "06_copes_ablations": (PAPER_A, "Table 3: ablations (K, independent z-score, 2 sigma)"),
    "07_multihop_qa": (PAPER_A, "Table 4: multi-hop QA with search"),
    "08_memory_and_gpu_hours": (PAPER_A, "Table S7 + Fig. 2 (memory vs context) + Table 2 (feasibility) + GPU-hours"),
    "09_scale_study": ("beyond the papers", "scale and mechanism study: ES / CoPES vs GRPO across model size, "
                       "protocol and warm start; updates vs random directions, d_eff, rho^2 N / d_eff"),
    "10_molora_substrate": (PAPER_B, "frozen substrate and adapter pool (B1)"),
    "11_molora_router": (PAPER_B, "router collapse: softmax monopoly vs sigmoid router (R)"),
    "12_molora_factorial": (PAPER_B, "2^3 factorial R x E x L with paired t-tests (B2)"),
    "13_molora_sandbox": (PAPER_B, "synthetic sandbox: substrate-conditional boundary (B3)"),
    "99_summary": ("A + B", "claims summary vs the papers; regenerates the README results section"),
}

# Keys every summary.json carries (runs.Run.finish); not headline numbers.
META_KEYS = {"profile", "notebook", "seeds", "seed", "library_version", "git_sha", "git_dirty"}
FALLBACK_ROWS = 6


@dataclasses.dataclass(frozen=True)
class Headline:
    """One number of a notebook's summary.json worth a reader's glance, with the paper's counterpart."""

    key: str
    label: str
    paper: str | None = None  # the paper's figure, as text (None: the paper has none)
    unit: str = ""  # "%": a fraction shown in percent; "points": a difference of fractions, in points


def _pct(x: float) -> str:
    return f"{x:.2f}%"


_T1 = paper.TABLE1
# Numbers that no claim of copes_lib.claims covers: the settings and intermediate results. Notebooks
# with claims show their claims first and these after them.
HEADLINES: dict[str, tuple[Headline, ...]] = {
    "00_suite_overview": (
        Headline("notebooks_total", "notebooks in the suite"),
        Headline("profile_valid", "profile valid for every notebook"),
        Headline("torch_version", "torch"),
        Headline("torch_threads", "torch threads"),
    ),
    "01_substrate_and_agent": (
        Headline("substrate_params", "substrate parameters", f"{paper.QWEN35_4B_PARAMS:,} (Qwen3.5-4B)"),
        Headline("base_math_val_accuracy", "base model, math validation accuracy", _pct(_T1["base"]["val_acc"]), "%"),
        Headline("base_qa_val_f1", "base model, QA validation F1", None, "%"),
        Headline("math_tool_use_rate", "math trajectories that call a tool", None, "%"),
    ),
    "02_standard_es": (
        Headline("base_val_accuracy", "base validation accuracy", _pct(_T1["base"]["val_acc"]), "%"),
        Headline("val_accuracy_at_16", "standard ES, validation accuracy at step 16",
                 _pct(_T1["es_at_16"]["val_acc"]), "%"),
        Headline("best_val_accuracy", "standard ES, best validation accuracy",
                 f"{_pct(_T1['es_best']['val_acc'])} (step {paper.ES_BEST_STEP})", "%"),
        Headline("device_hours", "device-hours of the run", f"{_T1['es_at_16']['gpu_hours']} GPU-h (16 steps)"),
        Headline("chosen_sigma", "sigma", f"{paper.HYPERPARAMETERS_A['sigma']:g}"),
    ),
    "03_copes": (
        Headline("val_accuracy_at_16", "CoPES, validation accuracy at step 16", _pct(_T1["copes_at_16"]["val_acc"]), "%"),
        Headline("es_val_accuracy_at_16", "standard ES, same settings, step 16", _pct(_T1["es_at_16"]["val_acc"]), "%"),
        Headline("copes_minus_es_best_val_accuracy", "CoPES minus ES (points of accuracy)",
                 f"{_T1['copes_at_16']['val_acc'] - _T1['es_at_16']['val_acc']:+.2f} points", "points"),
        Headline("mean_update_norm_ratio_copes_over_es", "update norm, CoPES / ES", "not reported"),
    ),
    "04_grpo": (
        Headline("base_val_accuracy", "base validation accuracy", _pct(_T1["base"]["val_acc"]), "%"),
        Headline("full_best_val_accuracy", "full GRPO, best validation accuracy",
                 _pct(_T1["full_grpo_best"]["val_acc"]), "%"),
        Headline("lora_best_val_accuracy", "LoRA-GRPO, best validation accuracy",
                 _pct(_T1["lora_grpo_best"]["val_acc"]), "%"),
        Headline("lora_val_accuracy_at_16", "LoRA-GRPO at step 16", _pct(_T1["lora_grpo_at_16"]["val_acc"]), "%"),
    ),
    "09_scale_study": (
        Headline("n_sizes", "substrate sizes studied"),
        Headline("params_largest", "largest substrate (parameters)", f"{paper.QWEN35_4B_PARAMS:,} (one size)"),
        Headline("copes_paper_minus_es_slope_per_decade", "CoPES - ES per decade of parameters", "not studied"),
        Headline("gain_recovery_es_slope_per_decade", "ES gain recovery per decade of parameters", "not studied"),
    ),
    "10_molora_substrate": (
        Headline("substrate_params", "substrate parameters", "~150M"),
        Headline("d_model", "model width", "1536"),
        Headline("vocab_size", "vocabulary", "32,000"),
        Headline("test_balanced_log_ppl", "test balanced log-PPL (nats)"),
    ),
    "99_summary": (
        Headline("claims_agree", "claims that agree"),
        Headline("claims_partly", "claims that partly agree"),
        Headline("claims_disagree", "claims that do not agree"),
        Headline("claims_missing", "claims not yet measured"),
    ),
}


def format_value(value: Any, unit: str = "") -> str:
    """A summary value for reading: 4 significant digits, fractions in percent where ``unit`` is "%", a
    difference of fractions in points where it is "points"; never a negative zero; a missing value reads
    "not measured" (the row's notebook did not record it).

    >>> format_value(0.4567891), format_value(0.4567891, "%"), format_value(1373856), format_value(None)
    ('0.4568', '45.68%', '1,373,856', 'not measured')
    >>> format_value(-0.125, "points"), format_value(-0.00001, "%"), format_value(-0.0)
    ('-12.50 points', '0.00%', '0')
    """
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if unit == "%":
            return _no_negative_zero(f"{100 * value:.2f}%")
        if unit == "points":
            return _no_negative_zero(f"{100 * value:+.2f} points")
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return _no_negative_zero(f"{value:.4g}")
    if isinstance(value, list):
        return ", ".join(format_value(v) for v in value[:6]) + (" ..." if len(value) > 6 else "")
    return str(value)


NOT_MEASURED = "not measured"
_NEGATIVE_ZERO = re.compile(r"(?<![\w.])[-\u2212]((?:0\.)?0+)(?![\d.])")
# a summary key, a rule's ``<metric>_x`` or a key family's ``x_<size>``: snake_case that starts with a letter
# (a notebook's stem starts with its number and stays), not a path, module or function (next to / or .)
_RAW_KEY = re.compile(r"(?<![\w/.#-])<?[A-Za-z][A-Za-z0-9]*>?(?:_<?[A-Za-z0-9]+>?)+(?![\w/(]|\.\w)")
_KEY_WORDS = {"val": "validation", "acc": "accuracy", "copes": "CoPES", "es": "ES", "grpo": "GRPO", "lora": "LoRA",
              "qa": "QA", "f1": "F1", "indep": "independent", "sqrtk": "sqrt(K)", "2sigma": "2 sigma",
              "lowrank": "low-rank", "n": "N", "p": "p", "mech": "mechanism", "params": "parameters",
              "ppl": "PPL", "log": "log", "pct": "%", "met": "met", "std": "s.d.", "mde": "MDE"}


_NONE_PAIR = re.compile(r"\[None, None\]")
_NONE = re.compile(r"\bNone\b")


def _no_negative_zero(text: str) -> str:
    """``-0.0000`` -> ``0.0000`` (a value that rounds to zero has no sign worth reading).

    >>> _no_negative_zero("-0.0000 nats, -0.3 pts, [-0, +1], x-0.0")
    '0.0000 nats, -0.3 pts, [0, +1], x-0.0'
    """
    return _NEGATIVE_ZERO.sub(r"\1", text)


def plain_key(key: str) -> str:
    """A summary key in words, for a reader (the key itself stays in summary.json and the claim rules).

    >>> plain_key("gain_recovery_copes"), plain_key("val_accuracy_k4"), plain_key("f1_es_sqrtk_alpha")
    ('gain recovery CoPES', 'validation accuracy K=4', 'F1 ES sqrt(K) alpha')
    >>> plain_key("regime_criterion_met_math"), plain_key("norm_curve_copes_norm"), plain_key("x_<size>")
    ('regime criterion met (math)', 'norm curve CoPES norm', 'x at each size')
    """
    words = key.split("_")
    tail = ""
    if words[-1] in ("math", "qa") and len(words) > 2:
        tail = f" ({words.pop()})"
    out = []
    for word in words:
        if re.fullmatch(r"k\d+", word):
            out.append(f"K={word[1:]}")
        elif word == "<size>":
            out.append("at each size")
        elif word.startswith("<") and word.endswith(">"):
            out.append(f"each {word[1:-1]}")
        else:
            out.append(_KEY_WORDS.get(word, word))
    return " ".join(out) + tail


def readable(text: str) -> str:
    """A claim's text for the reports: summary keys in words (:func:`plain_key`), no negative zero.

    >>> readable("gain_recovery_copes 0.881 vs gain_recovery_es -0.0000; 01_substrate_and_agent's regime_criterion_met is false")
    "gain recovery CoPES 0.881 vs gain recovery ES 0.0000; 01_substrate_and_agent's regime criterion met is false"
    >>> readable("E meas [None, None], p = None")
    'E meas not measured, p = not measured'
    >>> readable("docs/statistics.md#s2-two-sources-of-noise and factorial.paired_test and copes_lib/cli.py stay")
    'docs/statistics.md#s2-two-sources-of-noise and factorial.paired_test and copes_lib/cli.py stay'
    """
    text = _NONE_PAIR.sub(NOT_MEASURED, text)
    return _no_negative_zero(_NONE.sub(NOT_MEASURED, _RAW_KEY.sub(lambda m: plain_key(m.group()), text)))


def headline(summary: dict[str, Any] | None, stem: str | None = None,
             claim_rows: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """A notebook's headline rows: the claims it tests (paper, ours, verdict, the study's power), then
    :data:`HEADLINES`. ``claim_rows``: :func:`copes_lib.claims.judge_claims` of the whole profile
    (some claims read several notebooks); by default the claims are judged on ``summary`` alone.

    >>> [r["ours"] for r in headline({"val_accuracy_at_16": 0.5}, "02_standard_es")][:2]
    ['not measured', '50.00%']
    """
    summary = summary or {}
    rows = []
    if stem is not None:
        if claim_rows is None:
            claim_rows = claims.judge_claims({stem: summary})
        for row in claim_rows:
            if row["notebook"] == stem:
                ours, reason = row["ours"], row.get("reason", "")
                if row["verdict"] == claims.MISSING:  # the keys it lacks stay in the claim rules, not here
                    ours = NOT_MEASURED
                    reason = (f"{stem} has not recorded it: its results predate this measurement or its run left "
                              f"it out (make reproduce ONLY={stem.split('_', 1)[0]} measures it)")
                rows.append({"label": readable(f"{row['claim']}: {row['statement']}"), "ours": readable(ours),
                             "paper": readable(row["paper_figure"]), "verdict": row["verdict"],
                             "reason": readable(reason), "power": readable(row.get("power", ""))})
    for item in HEADLINES.get(stem or "", ()):
        value = summary.get(item.key)
        rows.append({"label": item.label, "ours": format_value(value, item.unit), "paper": item.paper or "\u2014",
                     "verdict": "", "reason": "" if value is not None else
                     f"{stem} did not record it ({'no results yet' if not summary else 'not in this run'})"})
    if not rows:  # a notebook the suite map does not know: its first numbers, in its own order
        for key, value in [(k, v) for k, v in summary.items() if k not in META_KEYS][:FALLBACK_ROWS]:
            rows.append({"label": plain_key(key), "ours": format_value(value), "paper": "\u2014", "verdict": ""})
    return rows


_WARNED: set[str] = set()  # messages already printed in this process (every page reads every summary)


def _warn(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"[report] warning: {message}", file=sys.stderr, flush=True)


def _read_result(path: Path, profile: str, stem: str, problems: list[str]) -> dict[str, Any] | None:
    """A result JSON (summary, manifest) of ``stem``, or None when absent; an unreadable one is None and
    its message (the path and what to do) is added to ``problems`` and printed, never a bare decoder error."""
    if not path.exists():
        return None
    try:
        data = runs.read_json(path)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return data
    except (OSError, ValueError) as exc:
        message = (f"{path} cannot be read ({exc}); rerun the notebook (make reproduce PROFILE={profile} "
                   f"ONLY={stem.split('_', 1)[0]}) or delete the file")
        if message not in problems:
            problems.append(message)
            _warn(message)
        return None


def suite_run_record(profile: str, results_root: str | Path | None = None) -> dict[str, Any] | None:
    """``results/<profile>/suite_run.json`` (the profile's last complete run, :func:`copes_lib.cli.record_suite_run`),
    or None when there is none or it cannot be read."""
    path = Path(results_root or runs.RESULTS_ROOT) / profile / "suite_run.json"
    try:
        record = runs.read_json(path)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("notebooks"), dict) else None


def suite_run_provenance(suite_run: dict[str, Any]) -> str:
    """Which runs a ``suite_run.json`` holds, in words: each part's last run (commit and end, oldest first) and,
    from a record of the layout before parts, the complete run the other notebooks' rows come from.

    >>> suite_run_provenance({"git_sha": "ba2d9ce32efe91", "ended": "2026-12-02T16:47:25+00:00", "notebooks": {}})
    'the last complete run, commit ba2d9ce32e, ended 2026-12-02T16:47'
    >>> suite_run_provenance({"parts": {"paper-a": {"git_sha": "5ede7eed7a0b", "ended": "2026-12-07T17:07:14"}},
    ...                       "before_parts": {"git_sha": "ba2d9ce32efe91", "ended": "2026-12-02T16:47:25"}})
    'part paper-a: commit 5ede7eed7a, ended 2026-12-07T17:07; the other notebooks: the complete run of commit ba2d9ce32e, ended 2026-12-02T16:47'
    >>> suite_run_provenance({"parts": {"paper-b": {"git_sha": "7280547220", "ended": "2026-12-07T19:37",
    ...                                             "notebooks": {"10_molora_substrate": {}}}},
    ...                       "before_parts": {"git_sha": "ba2d9ce32efe91", "notebooks": {"10_molora_substrate": {}}}})
    'part paper-b: commit 7280547220, ended 2026-12-07T19:37'
    """
    def run(entry: dict[str, Any]) -> str:
        return f"commit {str(entry.get('git_sha') or 'unknown')[:10]}, ended {str(entry.get('ended') or 'unknown')[:16]}"

    parts = suite_run.get("parts")
    if not isinstance(parts, dict) or not parts:
        return f"the last complete run, {run(suite_run)}"
    pieces = [f"part {name}: {run(entry)}" for name, entry in
              sorted(parts.items(), key=lambda item: str(item[1].get("ended")))]
    before = suite_run.get("before_parts")
    if isinstance(before, dict) and before:
        # named only while some notebook's row still comes from it (a record without rows: assume some do)
        covered = {stem for entry in parts.values() for stem in (entry.get("notebooks") or {})}
        if not before.get("notebooks") or set(before["notebooks"]) - covered:
            pieces.append(f"the other notebooks: the complete run of {run(before)}")
    return "; ".join(pieces)


def status_from_results(profile: str, stem: str, results_root: str | Path | None = None,
                        suite_run: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A status record for a notebook that ``reports/<profile>/status.json`` does not list (no run in this
    checkout: the committed results), from what the results say, or None when they say nothing:

    - its row of ``suite_run`` (``suite_run.json``: status, start, end and duration in the last complete
      run), when its ``summary.json`` is there;
    - else ``ok`` from its own ``summary.json`` and ``manifest.json`` (a notebook's run writes them last,
      when it finishes: a run that failed leaves none), with the duration and end the manifest records.

    ``source`` names the file the status comes from; ``older_than_suite_run`` is set when the results
    predate the profile's last complete run (a notebook run on its own earlier, e.g. one with a budget of
    its own)."""
    folder = Path(results_root or runs.RESULTS_ROOT) / profile
    if not (folder / stem / "summary.json").exists():
        return None
    row = (suite_run or {}).get("notebooks", {}).get(stem)
    if isinstance(row, dict) and row.get("status"):
        return {**row, "source": f"results/{profile}/suite_run.json", "source_path": str(folder / "suite_run.json")}
    try:
        manifest = runs.read_json(folder / stem / "manifest.json")
    except (OSError, ValueError):
        manifest = {}
    manifest = manifest if isinstance(manifest, dict) else {}
    record = {"status": "ok", "source": f"results/{profile}/{stem}/summary.json",
              "source_path": str(folder / stem / "summary.json"),
              "ended": manifest.get("ended"), "duration_s": manifest.get("wall_time_s")}
    started = (suite_run or {}).get("started")
    if started and record["ended"] and str(record["ended"])[:19] < str(started)[:19]:
        record["older_than_suite_run"] = True
    return record


SMOKE_NOTE = ("Smoke profile: a check that every notebook runs, on tiny models for a few steps. Its verdicts judge "
              "nothing about the papers' claims (they are computed the same way, on numbers too small to mean anything); "
              "the study is the cpu profile (make report PROFILE=cpu) and, on a GPU, the gpu profile.")


def scale_note(profile: str, summaries: dict[str, dict[str, Any]] | None = None) -> str:
    """What a verdict can judge on this profile, from the size of its substrate (01's ``substrate_params``)
    beside the paper's Qwen3.5-4B; by profile where 01 has no results yet.

    >>> scale_note("cpu", {"01_substrate_and_agent": {"substrate_params": 1373856}}).split(", so")[0]
    "Our substrate has 1,373,856 parameters, about 3,400x fewer than the paper's Qwen3.5-4B (4,659,865,088)"
    >>> "the paper's own model" in scale_note("gpu")
    True
    """
    params = ((summaries or {}).get("01_substrate_and_agent") or {}).get("substrate_params")
    reference = f"the paper's Qwen3.5-4B ({paper.QWEN35_4B_PARAMS:,})"
    if isinstance(params, int) and not isinstance(params, bool) and params > 0:
        ratio = paper.QWEN35_4B_PARAMS / params
        if ratio >= 3:
            shown = f"{float(f'{ratio:.2g}'):,.0f}"
            return (f"Our substrate has {params:,} parameters, about {shown}x fewer than {reference}, so verdicts "
                    "judge the direction and significance of an effect, not its size.")
        return (f"Our substrate has {params:,} parameters, the size of {reference}: verdicts judge an effect's "
                "direction, significance and size against the paper's.")
    return {
        "smoke": "The smoke profile's models are tiny: its verdicts judge nothing.",
        "cpu": "Our models are thousands of times smaller than the papers' (notebook 01 gives the count), so "
               "verdicts judge the direction and significance of an effect, not its size.",
        "gpu": "The gpu profile runs the paper's own model and datasets from local paths (profiles/gpu.yaml: "
               "MODEL_PATH, e.g. Qwen3.5-4B), so verdicts judge an effect's size against the paper's as well as "
               "its direction; notebook 01's results give the model's parameter count.",
    }.get(profile, "")


def _problems_html(problems: list[str]) -> str:
    return "".join(f"<p class='stale'>{html.escape(m)}</p>" for m in problems)


def _load_claims(profile: str, results_root: Path, problems: list[str]) -> list[dict[str, str]]:
    from copes_lib.protocols.notebooks import NEEDS

    found: list[str] = []
    rows = claims.judge_claims(claims.load_summaries(profile, results_root, problems=found), needs=NEEDS)
    for message in found:
        if message not in problems:
            problems.append(message)
            _warn(message)
    return rows


def _link(target: Path, base: Path, text: str) -> str:
    return f'<a href="{html.escape(_href(target, base))}">{html.escape(text)}</a>'


def _href(target: Path, base: Path) -> str:
    return os.path.relpath(target, base).replace(os.sep, "/")


def _figures(figures_root: Path, profile: str, stem: str) -> list[Path]:
    folder = figures_root / profile
    return sorted(folder.glob(f"{stem.split('_', 1)[0]}_*.png")) if folder.exists() else []


_VERDICT_CLASS = {claims.AGREES: "agrees", claims.PARTLY: "partly", claims.DISAGREES: "disagrees",
                  claims.OPPOSITE: "opposite", claims.INCONCLUSIVE: "inconclusive",
                  claims.NOT_IN_REGIME: "notinregime", claims.NOT_ACTIONABLE: "notinregime",
                  claims.NOT_CHECKED: "notinregime", claims.MISSING: "missing",
                  "stale": "missing"}  # claims.STALE: results older than a notebook they build on

_CSS = """
body.cr { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1.5em 2em; max-width: 1500px; color: #222;
          line-height: 1.4; }
.cr table { border-collapse: collapse; }
.cr table.index { width: 100%; table-layout: fixed; }
.cr table.headline { width: 100%; }
.cr th, .cr td { border-bottom: 1px solid #e3e3e3; padding: 5px 10px; vertical-align: top; text-align: left; }
.cr th { background: #f5f5f5; font-weight: 600; }
.cr .ok { color: #11691b; font-weight: 600; }
.cr .failed, .cr .running, .cr .interrupted { color: #b00020; font-weight: 600; }
.cr .notrun { color: #888; }
.cr .skipped { color: #8a5a00; font-weight: 600; }
.cr .src { color: #555; font-size: 85%; font-weight: normal; overflow-wrap: anywhere; }
.cr .err { font-family: monospace; font-size: 85%; white-space: pre-wrap; color: #b00020; }
.cr .what { color: #555; font-size: 90%; }
.cr .num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.cr .verdict { font-weight: 600; white-space: nowrap; padding: 1px 6px; border-radius: 4px; }
.cr .agrees { background: #e3f4e4; color: #11691b; } .cr .partly { background: #fff4d6; color: #805b00; }
.cr .disagrees { background: #fde3e3; color: #b00020; } .cr .missing { background: #eee; color: #666; }
.cr .inconclusive { background: #e6eef8; color: #2c4f7c; }
.cr .opposite { background: #f9d2e4; color: #8a0045; } .cr .notinregime { background: #eee; color: #444; }
.cr .reason { display: block; color: #555; font-size: 85%; white-space: normal; font-weight: normal; }
.cr .power { display: block; color: #777; font-size: 85%; }
.cr .thumbs img { max-width: 100%; max-height: 110px; border: 1px solid #ddd; margin: 2px; background: white; }
.cr .figs { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
.cr .figs figure { margin: 0; } .cr .figs figcaption { font-size: 85%; color: #555; text-align: center; }
.cr .figs img { max-width: 100%; max-height: 380px; border: 1px solid #ddd; background: white; }
.cr .note { color: #555; font-size: 90%; }
.cr .stale { background: #fff4d6; padding: 6px 10px; border-radius: 4px; }
.cr table.headline td.label { width: 45%; } .cr table.headline td.num { white-space: normal; }
/* a long notebook name wraps inside its column instead of running into the status beside it */
.cr table.index > tbody > tr > td:first-child { overflow-wrap: anywhere; }
"""


def _headline_table(rows: list[dict[str, str]], compact: bool = False) -> str:
    if not rows:
        return "<span class='note'>no summary yet</span>"
    # Columns with nothing in them (no paper figure, no verdict) are left out.
    show_paper = any(r["paper"] != "\u2014" for r in rows)
    show_verdict = any(r["verdict"] for r in rows)
    body = []
    for r in rows:
        power = f"<span class='power'>{html.escape(r['power'])}</span>" if r.get("power") else ""
        if not r["verdict"] and r.get("reason"):  # why a number without a verdict is not there
            power += f"<span class='reason'>{html.escape(r['reason'])}</span>"
        cells = [f"<td class='label'>{html.escape(r['label'])}</td>",
                 f"<td class='num'>{html.escape(r['ours'])}{power}</td>"]
        if show_paper:
            cells.append(f"<td class='num'>{html.escape(r['paper'])}</td>")
        if show_verdict:
            reason = (f"<span class='reason'>{html.escape(r['reason'])}</span>" if r.get("reason") else "")
            cells.append(f"<td><span class='verdict {_VERDICT_CLASS.get(r['verdict'], '')}'>"
                         f"{html.escape(r['verdict'])}</span>{reason}</td>" if r["verdict"] else "<td></td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    heads = ["" if compact else "quantity", "ours"] + ["paper"] * show_paper + ["verdict (reason)"] * show_verdict
    size = " style='font-size:90%'" if compact else ""
    return (f"<table class='headline'{size}><thead><tr>{''.join(f'<th>{h}</th>' for h in heads)}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def render_index(
    profile: str,
    reports_dir: str | Path,
    status: dict[str, Any],
    results_root: str | Path | None = None,
    figures_root: str | Path | None = None,
    notebooks: list[str] | None = None,
) -> Path:
    """Write ``reports_dir/index.html`` from ``status`` (as in status.json) and the run store.

    ``notebooks`` (stems; default: those in ``status``) are the rows, so records of deleted notebooks are
    left out; a notebook that ``status`` does not list takes its status from the results
    (:func:`status_from_results`), or shows as "not run" when there are none.
    """
    reports_dir = Path(reports_dir)
    results_root = Path(results_root or runs.RESULTS_ROOT)
    figures_root = Path(figures_root or runs.FIGURES_ROOT)
    suite_run = suite_run_record(profile, results_root)
    records = dict(status.get("notebooks", {}))
    from_results = []
    for stem in (notebooks if notebooks is not None else []):
        if stem not in records and (derived := status_from_results(profile, stem, results_root, suite_run)):
            records[stem] = derived
            from_results.append(stem)
    stems = sorted(notebooks if notebooks is not None else records)
    problems: list[str] = []
    claim_rows = _load_claims(profile, results_root, problems)
    summaries = {stem: _read_result(results_root / profile / stem / "summary.json", profile, stem, problems) or {}
                 for stem in ("01_substrate_and_agent",)}
    counts = {"ok": 0, "failed": 0}
    verdicts: dict[str, int] = {}
    rows = []
    for stem in stems:
        rec = records.get(stem, {})
        state = rec.get("status", "not run")
        counts[state] = counts.get(state, 0) + 1
        paper_name, what = SUITE_MAP.get(stem, ("", ""))
        summary_path = results_root / profile / stem / "summary.json"
        summary = _read_result(summary_path, profile, stem, problems)
        lines = headline(summary, stem, claim_rows) if summary is not None else []
        for line in lines:
            if line["verdict"]:
                verdicts[line["verdict"]] = verdicts.get(line["verdict"], 0) + 1
        links = []
        if rec.get("html") and (reports_dir / rec["html"]).exists():
            links.append(_link(reports_dir / rec["html"], reports_dir, "report"))
        if rec.get("executed") and (reports_dir / rec["executed"]).exists():
            links.append(_link(reports_dir / rec["executed"], reports_dir, "notebook"))
        if summary is not None:
            links.append(_link(summary_path, reports_dir, "summary.json"))
        thumbs = "".join(f'<a href="{html.escape(_href(f, reports_dir))}" title="{html.escape(f.stem)}">'
                         f'<img src="{html.escape(_href(f, reports_dir))}" alt="{html.escape(f.stem)}"></a>'
                         for f in _figures(figures_root, profile, stem))
        err = rec.get("error")
        err_html = ""
        if rec.get("skipped"):  # by the base gate (copes_lib/protocols/testbed/base_gate.py): why, in its words
            err_html = f'<div class="err">{html.escape(str(rec["skipped"]))}</div>'
        if err:
            first = (err.get("evalue") or "").splitlines()[:1]
            err_html = (f'<div class="err">cell {err.get("cell_index")} (In [{err.get("exec_count")}]): '
                        f'{html.escape(str(err.get("ename")))}: {html.escape(first[0] if first else "")}</div>')
        duration = rec.get("duration_s")
        source = ""
        if rec.get("source"):
            where = Path(rec.get("source_path") or rec["source"])
            name = Path(rec["source"]).name  # the column is narrow: the file's name, its path in the link
            source = (f"<div class='src'>from {_link(where, reports_dir, name)}" if where.exists()
                      else f"<div class='src'>from {html.escape(name)}")
            if rec.get("older_than_suite_run"):
                source += " (an earlier run than the suite run)"
            source += "</div>"
        has_report = bool(rec.get("html")) and (reports_dir / rec["html"]).exists()
        title = _link(reports_dir / rec["html"], reports_dir, stem) if has_report else html.escape(stem)
        unreadable = [m for m in problems if str(results_root / profile / stem) + os.sep in m]
        numbers = (_headline_table(lines, compact=True) if summary is not None else
                   _problems_html(unreadable) if unreadable else "<span class='note'>no results yet</span>")
        rows.append(
            "<tr>"
            f"<td><b>{title}</b><div class='what'>{html.escape(what)}</div>"
            f"<div class='what'>paper {html.escape(paper_name.split(':')[0])}</div>"
            f"<div class='what'>{' &middot; '.join(links)}</div></td>"
            f"<td class='{state.replace(' ', '')}'>{html.escape(state)}{err_html}"
            f"<div class='num note'>{'' if duration is None else f'{duration:.1f} s'}</div>{source}</td>"
            f"<td>{numbers}</td><td class='thumbs'>{thumbs or '&mdash;'}</td>"
            "</tr>"
        )
    generated = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    order = list(_VERDICT_CLASS)
    verdict_text = ", ".join(f"<span class='verdict {_VERDICT_CLASS.get(v, '')}'>{n} {html.escape(v)}</span>"
                             for v, n in sorted(verdicts.items(),
                                                key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    status_file = reports_dir / "status.json"
    provenance = ("raw status in <a href=\"status.json\">status.json</a>" if status_file.exists() else
                  "no run of this profile in this checkout's reports/ yet")
    if from_results:
        run_file = results_root / profile / "suite_run.json"
        last_run = (f"{_link(run_file, reports_dir, f'results/{profile}/suite_run.json')} "
                    f"({html.escape(suite_run_provenance(suite_run))})" if suite_run and run_file.exists() else "")
        provenance += (f"; {len(from_results)} notebook(s) take their status from their results"
                       f"{': ' + last_run + ', else their own summary.json' if last_run else ' (summary.json)'}")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>reports/{html.escape(profile)}</title>
<style>{_CSS}</style></head><body class="cr">
<h1>Reproducibility suite: profile <code>{html.escape(profile)}</code></h1>
{f'<p class="stale smoke-note">{html.escape(SMOKE_NOTE)}</p>' if profile == "smoke" else ""}
<p>{counts.get('ok', 0)} ok, {counts.get('failed', 0) + counts.get('running', 0) + counts.get('interrupted', 0)} failed or interrupted,
{f"{counts['skipped']} skipped (the base gate: a base whose check did not pass is not used; not failures), " if counts.get('skipped') else ''}of {len(stems)} notebook(s). Claims: {verdict_text or 'none judged yet'}.</p>
{_problems_html(problems)}
<p class="note">Ours = this profile's <code>results/{html.escape(profile)}/*/summary.json</code>; paper = the
papers' own figures (docs/paper_a_copes.md, docs/paper_b_molora.md). {html.escape(scale_note(profile, summaries))}
Generated {generated} by <code>python -m copes_lib.cli</code>; {provenance}.</p>
<table class="index"><colgroup><col style="width:18%"><col style="width:9%"><col style="width:57%">
<col style="width:16%"></colgroup>
<thead><tr><th>notebook</th><th>status</th><th>headline numbers: ours beside the paper's</th><th>figures</th></tr>
</thead><tbody>
{chr(10).join(rows)}
</tbody></table></body></html>
"""
    path = reports_dir / "index.html"
    runs.atomic_write_text(path, page)
    return path


# --------------------------------------------------------------------------- one notebook's HTML
_PROGRESS_BAR = re.compile(r"^.*(\d+%\|.*\||\d+it \[|it/s\]|s/it\]).*$")
_WARNING_LINE = re.compile(r"^\S*:\d+: (\w*Warning): ")
_NOISY_WARNINGS = {"TqdmWarning", "FutureWarning", "DeprecationWarning", "UserWarning"}
_NUMPY_REPR = re.compile(r"np\.(?:float|int|uint|bool_?)(?:16|32|64)?\(([^()]*)\)")


def clean_stderr(text: str) -> str:
    """Drop progress bars and library warnings (each with the source line printed under it) from a
    stderr stream; keep everything else, including the suite's own warnings.

    >>> clean_stderr("x.py:3: FutureWarning: old\\n  call()\\n\\rsteps: 100%|##| 3/3 [00:01<00:00, 2.1it/s]\\nreal error\\n")
    'real error\\n'
    """
    kept, skip_source = [], False
    for line in text.replace("\r", "\n").splitlines(keepends=True):
        warning = _WARNING_LINE.match(line)
        if warning:  # keep the suite's own warnings; the source line printed under any warning goes
            if warning.group(1) not in _NOISY_WARNINGS:
                kept.append(line)
            skip_source = True
            continue
        if skip_source and line.startswith("  "):
            continue
        skip_source = False
        if _PROGRESS_BAR.match(line.rstrip("\n")) or not line.strip():
            continue
        kept.append(line)
    return "".join(kept)


def clean_numpy_reprs(text: str) -> str:
    """``np.float64(0.5)`` -> ``0.5`` in a printed value.

    >>> clean_numpy_reprs("{'a': np.float64(0.25), 'b': np.int64(3)}")
    "{'a': 0.25, 'b': 3}"
    """
    return _NUMPY_REPR.sub(r"\1", text)


def reader_notebook(nb: Any) -> Any:
    """A copy of an executed notebook for reading: stderr noise dropped, numpy reprs cleaned."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = clean_stderr(out["text"]) if out.get("name") == "stderr" else out["text"]
                if not text.strip():
                    continue
                out["text"] = clean_numpy_reprs(text)
            elif "text/plain" in out.get("data", {}):
                out["data"]["text/plain"] = clean_numpy_reprs(out["data"]["text/plain"])
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    return nb


_NOTEBOOK_CSS = """
body:not(.show-code) .jp-CodeCell .jp-Cell-inputWrapper,
body:not(.show-code) .jp-CodeCell.jp-mod-noOutputs,
body:not(.show-code) .jp-OutputPrompt, body:not(.show-code) .jp-InputPrompt { display: none; }
.cr-top { font-family: system-ui, sans-serif; max-width: 1100px; margin: 0 auto 1.5em; padding: 1.2em 1.5em;
          border: 1px solid #ddd; border-radius: 8px; background: #fbfbfb; line-height: 1.4; }
.cr-top h1 { margin-top: 0; font-size: 1.6em; } .cr-top h2 { font-size: 1.15em; margin: 1em 0 .4em; }
.cr-toggle { position: fixed; top: 10px; right: 14px; z-index: 10; padding: 6px 12px; border: 1px solid #aaa;
             border-radius: 6px; background: white; cursor: pointer; font: 14px system-ui, sans-serif; }
"""

# The button shows or hides the code; opening the page as ``<NN_topic>.html#code`` shows it at once.
_TOGGLE = """<button class="cr-toggle" id="cr-toggle" type="button"
onclick="var on=document.body.classList.toggle('show-code'); this.textContent = on ? 'Hide code' : 'Show code';"
>Show code</button>
<script>if (location.hash === "#code") { document.body.classList.add("show-code");
document.getElementById("cr-toggle").textContent = "Hide code"; }</script>"""


def reader_header(profile: str, stem: str, record: dict[str, Any] | None = None,
                  results_root: str | Path | None = None, figures_root: str | Path | None = None,
                  base: str | Path | None = None) -> str:
    """The block that opens a notebook's HTML: what it reproduces, status, claims and headline numbers
    beside the paper's with verdicts, and its figures (linked relative to ``base``)."""
    results_root = Path(results_root or runs.RESULTS_ROOT)
    figures_root = Path(figures_root or runs.FIGURES_ROOT)
    base = Path(base or Path.cwd())
    record = record or {}
    paper_name, what = SUITE_MAP.get(stem, ("", ""))
    summary_path = results_root / profile / stem / "summary.json"
    problems: list[str] = []
    summary = _read_result(summary_path, profile, stem, problems)
    state = record.get("status")
    meta = [f"profile <code>{html.escape(profile)}</code>"]
    if state:
        meta.append(f"<span class='{html.escape(state)}'>{html.escape(state)}</span>")
    if record.get("duration_s") is not None:
        meta.append(f"{record['duration_s']:.1f} s")
    if summary is not None:
        meta.append(f"results of commit <code>{html.escape(str(summary.get('git_sha', '?'))[:10])}</code>"
                    + (" (uncommitted changes)" if summary.get("git_dirty") else ""))
    parts = [f"<h1>{html.escape(stem)}</h1>",
             f"<p class='stale smoke-note'>{html.escape(SMOKE_NOTE)}</p>" if profile == "smoke" else "",
             f"<p class='what'>{html.escape(paper_name)} &middot; {html.escape(what)}</p>",
             f"<p>{' &middot; '.join(meta)}</p>"]
    manifest_path = summary_path.with_name("manifest.json")
    if summary is not None and state and state != "ok":
        parts.append("<p class='stale'>This run did not finish: the numbers below are those of the previous "
                     "complete run (results are only replaced by a run that finishes).</p>")
    elif summary is not None and record.get("started") and manifest_path.exists():
        ended = (_read_result(manifest_path, profile, stem, problems) or {}).get("ended", "")
        if ended and ended < record["started"]:
            parts.append("<p class='stale'>These numbers predate this execution of the notebook "
                         f"(written {html.escape(ended[:19])}).</p>")
    if summary is None and not problems:
        parts.append("<p class='note'>No summary.json yet: nothing to compare.</p>")
    elif summary is not None:
        rows = headline(summary, stem, _load_claims(profile, results_root, problems))
        title = ("Our numbers beside the paper's" if any(r["paper"] != "\u2014" for r in rows)
                 else "Headline numbers")
        parts.append(f"<h2>{title}</h2>" + _headline_table(rows))
    parts.append(_problems_html(problems))
    figures = _figures(figures_root, profile, stem)
    if figures:
        parts.append("<h2>Figures</h2><div class='figs'>" + "".join(
            f"<figure><a href='{html.escape(_href(f, base))}'><img src='{html.escape(_href(f, base))}' "
            f"alt='{html.escape(f.stem)}'></a><figcaption>{html.escape(f.name)}</figcaption></figure>"
            for f in figures) + "</div>")
    parts.append("<p class='note'>Below: the executed notebook (its prose, tables and figures). Code is "
                 "hidden; the button at the top right shows it (or open this page as <code>...html#code</code>). "
                 "Progress bars and library warnings are left out here and kept in the executed "
                 "<code>.ipynb</code>.</p>")
    return "<section class='cr cr-top'>" + "".join(parts) + "</section>"


def export_notebook_html(executed: str | Path, html_path: str | Path, profile: str, stem: str | None = None,
                         record: dict[str, Any] | None = None, results_root: str | Path | None = None,
                         figures_root: str | Path | None = None) -> Path:
    """The reader's HTML of an executed notebook (nbconvert, lab template), written atomically."""
    import nbformat
    from nbconvert import HTMLExporter

    executed, html_path = Path(executed), Path(html_path)
    stem = stem or executed.stem
    nb = reader_notebook(nbformat.read(executed, as_version=4))
    body, _ = HTMLExporter().from_notebook_node(nb)
    header = reader_header(profile, stem, record, results_root, figures_root, base=html_path.parent)
    body = body.replace("</head>", f"<style>{_CSS}{_NOTEBOOK_CSS}</style>\n</head>", 1)
    body = re.sub(r"(<body[^>]*>)", lambda m: f"{m.group(1)}\n{_TOGGLE}\n{header}", body, count=1)
    return runs.atomic_write_text(html_path, body)
