"""The suite map and the HTML index of a profile's reports.

``reports/<profile>/index.html`` lists every notebook of the suite with what it reproduces, its last
status and duration (from ``status.json``, written by :mod:`copes_lib.cli`), the headline numbers of
its ``results/<profile>/<NN_topic>/summary.json``, and links to its HTML report, executed notebook,
summary and figures (``figures/<profile>/<NN>_*.png``). Plain HTML with inline CSS, no template engine,
so the page opens from disk anywhere.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
from pathlib import Path
from typing import Any

from copes_lib import runs

PAPER_A = "A: CoPES (cooperative coevolution ES for agentic LLM post-training)"
PAPER_B = "B: decomposing evolutionary mixture-of-LoRA"

# notebook stem -> (paper, what it reproduces). The README's notebook map says the same.
SUITE_MAP: dict[str, tuple[str, str]] = {
    "00_suite_overview": ("suite", "map of the suite, environment (versions, device, threads), profile check"),
    "01_substrate_and_agent": (PAPER_A, "substrate and agent: small Qwen3 models, tool-using agent, rewards (A4)"),
    "02_standard_es": (PAPER_A, "standard ES baseline (Algorithm of A1; CoPES with K = 1)"),
    "03_copes": (PAPER_A, "CoPES (Algorithm 1): cooperative subspace ES"),
    "04_grpo": (PAPER_A, "GRPO baselines: full-parameter and LoRA"),
    "05_fixed_budget_math": (PAPER_A, "Table 1 + Fig. 3 (pass@k) + Fig. S4 (validation curves): fixed-budget math"),
    "06_copes_ablations": (PAPER_A, "Table 3: ablations (K, independent z-score, 2 sigma)"),
    "07_multihop_qa": (PAPER_A, "Table 4: multi-hop QA with search"),
    "08_memory_and_gpu_hours": (PAPER_A, "Table S7 + Fig. 2 (memory vs context) + Table 2 (feasibility) + GPU-hours"),
    "10_molora_substrate": (PAPER_B, "frozen substrate and adapter pool (B1)"),
    "11_molora_router": (PAPER_B, "router collapse: softmax monopoly vs sigmoid router (R)"),
    "12_molora_factorial": (PAPER_B, "2^3 factorial R x E x L with paired t-tests (B2)"),
    "13_molora_sandbox": (PAPER_B, "synthetic sandbox: substrate-conditional boundary (B3)"),
    "99_summary": ("A + B", "claims summary vs the papers; regenerates the README results section"),
}

# Keys every summary.json carries (runs.Run.finish); not headline numbers.
META_KEYS = {"profile", "notebook", "seeds", "seed", "library_version", "git_sha", "git_dirty"}
HEADLINE_MAX = 8


def headline(summary: dict[str, Any] | None, limit: int = HEADLINE_MAX) -> list[tuple[str, str]]:
    """The first ``limit`` non-metadata entries of a summary (in the notebook's order), formatted.

    >>> headline({"profile": "smoke", "val_accuracy": 0.4567891, "steps": 3})
    [('val_accuracy', '0.4568'), ('steps', '3')]
    """
    rows = []
    for key, value in (summary or {}).items():
        if key in META_KEYS:
            continue
        if isinstance(value, float):
            text = f"{value:.4g}"
        elif isinstance(value, list):
            text = ", ".join(str(v) for v in value[:6]) + (" ..." if len(value) > 6 else "")
        else:
            text = str(value)
        rows.append((key, text))
        if len(rows) == limit:
            break
    return rows


def _link(target: Path, base: Path, text: str) -> str:
    href = os.path.relpath(target, base).replace(os.sep, "/")
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; width: 100%; }
th, td { border: 1px solid #ccc; padding: 6px 8px; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
.ok { color: #11691b; font-weight: bold; } .failed, .running { color: #b00020; font-weight: bold; }
.notrun { color: #777; } .err { font-family: monospace; font-size: 90%; white-space: pre-wrap; }
td.nums { font-family: monospace; font-size: 90%; } .what { color: #555; font-size: 90%; }
"""


def render_index(
    profile: str,
    reports_dir: str | Path,
    status: dict[str, Any],
    results_root: str | Path | None = None,
    figures_root: str | Path | None = None,
    notebooks: list[str] | None = None,
) -> Path:
    """Write ``reports_dir/index.html`` from ``status`` (as in status.json) and the run store.

    ``notebooks`` (stems; default: those in ``status``) are the rows, so notebooks without a status
    yet show as "not run" and records of deleted notebooks are left out.
    """
    reports_dir = Path(reports_dir)
    results_root = Path(results_root or runs.RESULTS_ROOT)
    figures_root = Path(figures_root or runs.FIGURES_ROOT)
    records = status.get("notebooks", {})
    stems = sorted(notebooks if notebooks is not None else records)
    counts = {"ok": 0, "failed": 0}
    rows = []
    for stem in stems:
        rec = records.get(stem, {})
        state = rec.get("status", "not run")
        counts[state] = counts.get(state, 0) + 1
        paper, what = SUITE_MAP.get(stem, ("", ""))
        summary_path = results_root / profile / stem / "summary.json"
        summary = runs.read_json(summary_path) if summary_path.exists() else None
        shown = headline(summary)
        nums = "<br>".join(f"{html.escape(k)} = {html.escape(v)}" for k, v in shown) or "&mdash;"
        hidden = len([k for k in (summary or {}) if k not in META_KEYS]) - len(shown)
        if hidden > 0:
            nums += f"<br><i>(+{hidden} more in summary.json)</i>"
        links = []
        if rec.get("html") and (reports_dir / rec["html"]).exists():
            links.append(_link(reports_dir / rec["html"], reports_dir, "report"))
        if rec.get("executed") and (reports_dir / rec["executed"]).exists():
            links.append(_link(reports_dir / rec["executed"], reports_dir, "notebook"))
        if summary is not None:
            links.append(_link(summary_path, reports_dir, "summary.json"))
        number = stem.split("_", 1)[0]
        figures = sorted((figures_root / profile).glob(f"{number}_*.png")) if (figures_root / profile).exists() else []
        figs = "<br>".join(_link(f, reports_dir, f.stem) for f in figures) or "&mdash;"
        err = rec.get("error")
        err_html = ""
        if err:
            first = (err.get("evalue") or "").splitlines()[:1]
            err_html = (f'<div class="err">cell {err.get("cell_index")} (In [{err.get("exec_count")}]): '
                        f'{html.escape(str(err.get("ename")))}: '
                        f'{html.escape(first[0] if first else "")}</div>')
        duration = rec.get("duration_s")
        rows.append(
            "<tr>"
            f"<td><b>{html.escape(stem)}</b><div class='what'>{html.escape(what)}</div>"
            f"<div class='what'>{html.escape(paper)}</div></td>"
            f"<td class='{state.replace(' ', '')}'>{html.escape(state)}{err_html}</td>"
            f"<td>{'' if duration is None else f'{duration:.1f}'}</td>"
            f"<td class='nums'>{nums}</td><td>{' &middot; '.join(links) or '&mdash;'}</td><td>{figs}</td>"
            "</tr>"
        )
    generated = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>reports/{html.escape(profile)}</title>
<style>{_CSS}</style></head><body>
<h1>Reproducibility suite: profile <code>{html.escape(profile)}</code></h1>
<p>{counts.get('ok', 0)} ok, {counts.get('failed', 0) + counts.get('running', 0)} failed or interrupted,
of {len(stems)} notebook(s). Generated {generated} by <code>python -m copes_lib.cli run</code>;
raw status in <a href="status.json">status.json</a>.</p>
<table><thead><tr><th>notebook</th><th>status</th><th>seconds</th><th>headline numbers (summary.json)</th>
<th>links</th><th>figures</th></tr></thead><tbody>
{chr(10).join(rows)}
</tbody></table></body></html>
"""
    path = reports_dir / "index.html"
    runs.atomic_write_text(path, page)
    return path
