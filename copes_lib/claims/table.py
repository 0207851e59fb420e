"""The claims table: every claim judged over a profile's results (:func:`judge_claims`), the
significant results, the markdown of the table and the generated pages (docs/statistics.md's rules,
the README's short results table and docs/results.md's full one)."""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from copes_lib import paper, stats
from copes_lib.claims.paper_a import BENCHMARK_CLAIMS, PAPER_A_CLAIMS
from copes_lib.claims.paper_b import PAPER_B_CLAIMS
from copes_lib.claims.predictions import MOLORA_REGIME_KEY, OUR_CLAIMS, OURS, P_MOLORA_REGIME, SCALE_CLAIMS
from copes_lib.claims.verdicts import (
    CLAIM_TASK,
    CONTRAST_CLAIM,
    FAMILIES,
    GATE_TASKS,
    MISSING,
    NOT_ACTIONABLE,
    NOT_CHECKED,
    NOT_IN_REGIME,
    REGIME_CLAIMS,
    REGIME_KEY,
    REGIME_NOTEBOOK,
    REGION_MAP,
    SCORES,
    STALE,
    VERDICTS,
    WRITTEN,
    Context,
    Families,
    Judgement,
    _provisional,
    gate_task,
    gates_per_task,
    regime_key,
)
from copes_lib.runs import RESULTS_ROOT, atomic_write_text, read_json

CLAIMS = PAPER_A_CLAIMS + PAPER_B_CLAIMS  # the papers' claims, in the table's order


class UnreadableResultError(ValueError):
    """A result file (summary, scores, a table) cannot be read; the message names it and what to do."""


def _rerun_hint(profile: str, notebook: str, path: Path) -> str:
    number = notebook.split("_", 1)[0]
    return (f"rerun the notebook (make reproduce PROFILE={profile} ONLY={number}) or delete {path} "
            "to drop its results")


def load_summaries(profile: str, root: str | Path | None = None, *,
                   problems: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Every ``results/<profile>/<notebook>/summary.json`` there is, keyed by notebook; a notebook's
    per-problem scores (``scores.npz``) under the summary's ``SCORES`` key when the summary's
    ``scores_sha256`` names that very file (a file left by an earlier run is ignored); notebook 13's
    ``region_map.csv`` rows under ``REGION_MAP`` when their count is the summary's ``map_cells``.

    An unreadable summary (empty, truncated) raises :class:`UnreadableResultError` naming it and the
    command that rewrites it; pass a list as ``problems`` to collect those messages instead and skip
    the notebook (the reports do: one bad file does not hide the others)."""
    base = Path(root or RESULTS_ROOT) / profile
    out = {}
    for path in sorted(base.glob("*/summary.json")):
        notebook = path.parent.name
        bad = path
        try:
            summary = read_json(path)
            if not isinstance(summary, dict):
                raise ValueError(f"expected a JSON object, got {type(summary).__name__}")
            bad = path.parent / stats.SCORES_FILE
            digest = stats.scores_digest(path.parent)
            if digest is not None and digest == summary.get("scores_sha256"):
                summary[SCORES] = stats.load_scores(path.parent)
        except (OSError, ValueError, EOFError) as exc:
            first = (str(exc).splitlines() or [""])[0][:200]
            message = f"{bad} cannot be read ({type(exc).__name__}: {first}); {_rerun_hint(profile, notebook, bad)}"
            if problems is None:
                raise UnreadableResultError(message) from exc
            problems.append(message)
            continue
        table = path.parent / "region_map.csv"
        if summary.get("map_cells") and table.exists():
            try:
                with table.open(newline="") as handle:
                    cells = list(csv.DictReader(handle))
            except (OSError, UnicodeDecodeError, csv.Error) as exc:
                message = f"{table} cannot be read ({exc}); {_rerun_hint(profile, notebook, table)}"
                if problems is None:
                    raise UnreadableResultError(message) from exc
                problems.append(message)
                cells = []
            needed = {"alignment", "adapter_noise", "budget_evals", "outcome"}
            if len(cells) == summary["map_cells"] and cells and needed <= set(cells[0]):
                summary[REGION_MAP] = cells
        manifest = path.parent / "manifest.json"
        try:
            ended = read_json(manifest).get("ended") if manifest.exists() else None
        except (OSError, ValueError, AttributeError):
            ended = None  # a manifest is provenance, not a result: without it no staleness is judged
        if isinstance(ended, str) and ended:
            summary[WRITTEN] = ended
        out[notebook] = summary
    return out


def stale_notebooks(summaries: dict[str, dict[str, Any]], needs: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Notebook -> why its results are stale: a notebook it builds on (``needs``, followed transitively,
    the runner's ``NEEDS``) wrote its results after it did, so it was judged on an earlier upstream (e.g. 09's
    map on an earlier base than 01's). Notebooks without a run time (no manifest) are never stale."""
    out = {}
    for notebook, summary in summaries.items():
        mine = summary.get(WRITTEN)
        if not mine:
            continue
        seen, todo, newer = set(), list(needs.get(notebook, ())), []
        while todo:
            up = todo.pop()
            if up in seen:
                continue
            seen.add(up)
            todo += needs.get(up, ())
            theirs = summaries.get(up, {}).get(WRITTEN)
            if theirs and theirs > mine:
                newer.append(f"{up}'s ({theirs[:16]})")
        if newer:
            profile = summary.get("profile", "<profile>")
            out[notebook] = (f"{notebook}'s results (written {mine[:16]}) predate {', '.join(sorted(newer))}, which "
                             f"they build on; `make reproduce PROFILE={profile} ONLY={notebook[:2]}` refreshes them")
    return out


def _regime_gate(summaries: dict[str, dict[str, Any]], task: str) -> str | None:
    """The reason the claims measured on ``task`` (``math`` or ``qa``) are not in the papers' regime, or None
    (that task's criterion met or not recorded: then they are judged as usual). 01's per-task key
    (``regime_criterion_met_<task>``) decides when the summary was written under the per-task rule
    (:func:`gates_per_task`); a summary written before it is gated by the combined ``regime_criterion_met``,
    the rule registered for that run."""
    key = regime_key(task)  # validates task
    s = summaries.get(REGIME_NOTEBOOK, {})
    if key not in s or not gates_per_task(s):
        key = REGIME_KEY
    if s.get(key) is False:
        note = s.get("regime_note") or s.get("regime_reason")
        return (f"not in the papers' regime: {REGIME_NOTEBOOK}'s {key} is false"
                + (f" ({note})" if note else ""))
    return None


def _preflight_gate(summaries: dict[str, dict[str, Any]], task: str) -> str | None:
    """The reason the claims measured on ``task`` cannot show a difference, or None (that task's preflight met
    or not recorded): 01's ``preflight_<task>_met`` is false (docs/preflight.md#p1-the-preconditions); a summary
    without the per-task key or the per-task rule (:func:`gates_per_task`) uses the combined ``preflight_met``."""
    regime_key(task)  # validates task
    s = summaries.get(REGIME_NOTEBOOK, {})
    key = f"preflight_{task}_met" if f"preflight_{task}_met" in s and gates_per_task(s) else "preflight_met"
    if s.get(key) is False:
        failed = [f for f in s.get("preflight_failed") or [] if key == "preflight_met" or f.startswith(f"{task} ")]
        failed_text = ", ".join(failed) or "see 01's preflight"
        return f"not actionable: {failed_text} (docs/preflight.md#p1-the-preconditions)"
    return None


# 01's summary: per kind whether its base was built on a passing 5-seed check (copes_lib/protocols/testbed/base_gate.py,
# which this module does not import: claims read summaries only); these states mean it was not
BASE_CHECK_KEY, UNCHECKED_STATES = "base_check_{task}", ("unchecked", "not checked", "failed")


def _base_check_gate(summaries: dict[str, dict[str, Any]], task: str) -> str | None:
    """The reason the claims measured on ``task`` rest on no checked base, or None: 01's ``base_check_<task>`` is
    ``unchecked`` (built anyway, ``UNCHECKED_BASES``) or ``not checked`` / ``failed`` (not built: its notebooks were
    skipped, so any results on disk come from an earlier run)."""
    s = summaries.get(REGIME_NOTEBOOK, {})
    state = s.get(BASE_CHECK_KEY.format(task=task))
    if state not in UNCHECKED_STATES:
        return None
    why = s.get(BASE_CHECK_KEY.format(task=task) + "_reason") or "see 01"
    if state == "unchecked":
        return f"not checked: {task}'s base was built without a passing 5-seed check (UNCHECKED_BASES; {why})"
    return f"not checked: {REGIME_NOTEBOOK} did not build {task}'s base ({state}: {why}); its notebooks were skipped"


def judge_claims(summaries: dict[str, dict[str, Any]],
                 needs: dict[str, tuple[str, ...]] | None = None) -> list[dict[str, str]]:
    """One row per claim: the paper's figure, ours, the verdict (``missing`` if keys are absent), the
    reason for it and the study's power. With ``needs`` (the runner's ``NEEDS``), a claim whose notebook's
    results predate an upstream notebook's reads ``stale`` (:func:`stale_notebooks`; the reason keeps
    what its data would read)."""
    families = Families(summaries)
    stale = stale_notebooks(summaries, needs) if needs else {}
    contexts: dict[str, Context] = {}
    rows = []
    gates = {task: (_regime_gate(summaries, task), _preflight_gate(summaries, task)) for task in GATE_TASKS}
    checks = {task: _base_check_gate(summaries, task) for task in GATE_TASKS}
    measured = tuple(c for c in BENCHMARK_CLAIMS if all(k in summaries.get(c.notebook, {}) for k in c.keys))
    for claim in CLAIMS + SCALE_CLAIMS + OUR_CLAIMS + measured:
        summary = summaries.get(claim.notebook, {})
        absent = [k for k in claim.keys
                  if k not in summary or (summary[k] is None and k not in claim.none_means)]
        task = gate_task(claim.claim_id)
        gate, preflight = gates[task] if task else (None, None)
        gate_text = _gate_words(summaries, task, gate, preflight)
        if absent:
            j = Judgement(MISSING, f"not yet measured ({', '.join(absent)})", "",
                          f"{claim.notebook}'s summary lacks {', '.join(absent)}")
        else:
            ctx = contexts.setdefault(claim.notebook, Context(claim.notebook, summaries, families))
            j = claim.judge(ctx)
            if gate:
                j = dataclasses.replace(j, verdict=NOT_IN_REGIME,
                                        reason=f"{gate}; the data alone would read {j.verdict} ({j.reason})")
            elif preflight:
                j = dataclasses.replace(j, verdict=NOT_ACTIONABLE,
                                        reason=f"{preflight}; the data alone would read {j.verdict} ({j.reason})")
        unchecked = checks[task] if task else None
        if unchecked:  # before the other gates: no verdict rests on a base that was not checked
            j = dataclasses.replace(j, verdict=NOT_CHECKED, reason=f"{unchecked}; the data alone would read {j.verdict} "
                                    f"({j.reason})")
            gate_text = f"closed: {task}'s base not checked"
        if claim.notebook in stale and j.verdict not in (MISSING, NOT_CHECKED):
            j = dataclasses.replace(j, verdict=STALE,
                                    reason=f"{stale[claim.notebook]}; its data would read {j.verdict} ({j.reason})")
        rows.append({"claim": claim.claim_id, "paper": claim.paper, "statement": claim.statement,
                     "paper_figure": claim.paper_figure, "ours": j.ours, "verdict": j.verdict,
                     "reason": j.reason, "power": j.power, "notebook": claim.notebook,
                     "data": j.plain or j.ours, "gate": gate_text})
    return rows


def _gate_words(summaries: dict[str, dict[str, Any]], task: str | None, gate: str | None,
                preflight: str | None) -> str:
    """The gate column in plain words: none, passed, or which of the claim's task's gates closed."""
    if task is None:
        return "none"
    s = summaries.get(REGIME_NOTEBOOK, {})
    whose = f"{task}'s" if gates_per_task(s) else "the combined math and QA"  # the rule registered for the run
    if gate:
        return f"closed: {whose} regime criterion not met"
    if preflight:
        return f"closed: {whose} preflight failed"
    if s.get(regime_key(task) if gates_per_task(s) else REGIME_KEY) is None:
        return f"unknown: {whose} regime criterion not recorded"
    return f"open: {whose} criterion and preflight met"


def significant_results(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """One line per test of any notebook's family with Holm p < alpha, whichever way it points (each data
    set once), so that a summary can state every significant result, not only those a claim predicted."""
    lines = []
    for notebook, c in Families(summaries).significant():
        scale, unit = (1.0, " nats") if notebook == "12_molora_factorial" else (
            (1.0, "") if notebook == "13_molora_sandbox" else (100.0, " pts"))
        claim = CONTRAST_CLAIM.get(c.name, "")
        direction = ("in the contrast's predicted direction" if c.estimate * c.expected_sign > 0
                     else "the OTHER way from the contrast's predicted direction")
        lines.append(f"{notebook} {c.name}{f' ({claim})' if claim else ''}: {c.estimate * scale:+.2g}{unit} "
                     f"[{c.low * scale:+.2g}, {c.high * scale:+.2g}], Holm p = {c.p_holm:.2g}, {direction}"
                     + _provisional(c))
    return lines


def to_markdown(rows: list[dict[str, str]], profile: str, link_prefix: str = "notebooks/",
                significant: list[str] | None = None) -> str:
    rows = [{k: str(v).replace("|", "/") for k, v in r.items()} for r in rows]  # keep the table intact
    lines = [f"Claims of both papers against the `{profile}` profile's results "
             "(generated by notebooks/99_summary.ipynb; do not edit by hand).", "", glossary_markdown(), "",
             "| claim | statement | paper | ours | gate | verdict | reason | power | notebook |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        link = f"[{r['notebook']}]({link_prefix}{r['notebook']}.ipynb)"
        lines.append(f"| {r['claim']} | {r['statement']} | {r['paper_figure']} | {r['ours']} | {r.get('gate', '')} | "
                     f"{r['verdict']} | {r.get('reason', '')} | {r.get('power', '')} | {link} |")
    if significant is not None:
        lines += ["", "Every significant result (Holm p < 0.05 within its notebook's family), whichever way it "
                  "points:", ""]
        lines += [f"- {line}" for line in significant] or ["- none"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the rules, for docs/statistics.md
RULES_START, RULES_END = "<!-- rules:start -->", "<!-- rules:end -->"


def _doc(fn: Callable[..., Any]) -> str:
    return " ".join((fn.__doc__ or "").split())


def rules_markdown() -> str:
    """The rule of every claim and every declared margin, from this module and ``paper.py``: the text
    ``docs/statistics.md`` holds between its rules markers (a test keeps them equal)."""
    lines = ["Generated from `copes_lib/claims/` and `copes_lib/paper.py` (`claims.rules_markdown()`; "
             "`tests/test_claims.py` checks this copy is current).", "",
             f"Verdicts: {', '.join(f'`{v}`' for v in VERDICTS)}.", "",
             "- **not in regime**: each gated claim is judged against the criterion of the task it is measured on "
             "(docs/regime.md#r10-gates-per-claim-registered-2026-12-03): "
             + "; ".join(f"{', '.join(c for c in REGIME_CLAIMS if CLAIM_TASK[c] == task)} by {task}'s" for task in GATE_TASKS)
             + f". They read `{NOT_IN_REGIME}` when `results/<profile>/{REGIME_NOTEBOOK}/summary.json` has "
             f"`{REGIME_KEY}_<task>: false` for their task (a summary without the per-task keys: `{REGIME_KEY}: false`); "
             "the reason keeps what the data alone would read. Without the key they are judged as below.",
             f"- **not actionable**: the same claims read `{NOT_ACTIONABLE}` when that summary has `preflight_<task>_met: "
             "false` for their task (without per-task keys: `preflight_met: false`; docs/preflight.md#p1-the-preconditions: "
             "the testbed could not show a difference; the reason names the failed preconditions and keeps what the data "
             "alone would read).",
             f"- **not checked**: the same claims read `{NOT_CHECKED}` when that summary's `base_check_<task>` says their "
             "task's base was built without a passing 5-seed check (`unchecked`, the `UNCHECKED_BASES` escape hatch) or "
             "was not built at all (`not checked`, `failed`: its notebooks were skipped; results on disk are an earlier "
             "run's). This gate comes first and is never turned into `stale`; the reason keeps what the data alone would "
             "read (copes_lib/protocols/testbed/base_gate.py).",
             "- **one data set, one test**: a contrast whose two score arrays are byte-identical to an earlier "
             "notebook's contrast carries that test (its margin, its Holm family) and is left out of its own "
             "family; the reason names the first test.",
             "- **stale**: the claim's notebook wrote its results before a notebook it builds on (the "
             "runner's `NEEDS`, followed transitively; times from each `manifest.json`), so they were made on an "
             "earlier upstream; the reason keeps what its data would read and names the command that refreshes "
             "them. Never counted as agreement.",
             f"- **opposite**: Holm p < {paper.ALPHA} with the sign the claim does not predict; where an arm has one "
             "seed the reason adds `provisional` (that arm's seed noise is not measured). The predicted sign "
             "with one seed stays inconclusive.",
             f"- **ours**: rows {', '.join(c.claim_id for c in OUR_CLAIMS)} are our own predictions, each judged by "
             "the rule registered before its run (docs/regime.md#r4-predictions-ours-registered-before-the-run, "
             "docs/molora_regime.md#m5-predictions, docs/mechanism.md#m2-predictions-and-rules, "
             "docs/lowrank_es.md#l4-low-rank-on-the-map); R1 is judged on any "
             f"latent-protocol base, R2-R8 follow the not-in-regime rule above, {', '.join(P_MOLORA_REGIME)} read "
             f"`{NOT_IN_REGIME}` where P3 fails (12's `{MOLORA_REGIME_KEY}: false`), the mechanism rows are not gated "
             "(09 keeps the paper protocol), and L4 is not gated either: its quantity is a paired contrast of two "
             "arms on the same base and batches within one map cell (low rank minus full rank), its prediction is "
             "about low rank, not about the papers' regime, and one of its cells (the skill-gap control) is outside "
             "that regime by design, so 01's criterion would hide a reading it does not bear on; the case where the "
             "contrast is empty (neither arm moved) is L4's own `not judged`, read `inconclusive`, never agreement. "
             "Where a registered rule reads only holds / fails, a failure whose "
             "interval straddles the threshold reads `inconclusive` (the notebook's reading is in the reason).",
             "- **the collapsing router contrast** (12's `b3_collapsing` vs `r_collapsing`) is judged by its "
             "registered test, the 95% paired t-interval over seeds "
             "(docs/molora_regime.md#m4-the-router-contrast-in-a-collapsing-setting), and is not added to 12's Holm "
             "family: B2-B5's family and Holm levels are unchanged.", "",
             "| claim | statement | rule |", "|---|---|---|"]
    for claim in CLAIMS + SCALE_CLAIMS + OUR_CLAIMS:
        lines.append(f"| {claim.claim_id} | {claim.statement.replace('|', '/')} | {_doc(claim.judge).replace('|', '/')} |")
    lines += ["", "Equivalence margins (declared before the runs; from the papers' effect sizes by the rule "
              f"stated, never from an effect we measured). Paper A: margin = {paper.EQUIVALENCE_FRACTION} x the "
              "paper's effect as a share of its reference gain (full GRPO's best - base) x our reference gain. "
              f"Paper B: margin = {paper.EQUIVALENCE_FRACTION} x the paper's effect in nats where it is significant, "
              f"else {paper.EQUIVALENCE_FRACTION} x the smallest significant effect of Table B2 "
              f"({paper.PAPER_B_SMALLEST_SIGNIFICANT_NATS:g} nats).", "",
              "| contrast | claim | paper's effect | margin |", "|---|---|---|---|"]
    for name, share in paper.EFFECT_SHARE_A.items():
        text = "none (no paper figure)" if share is None else f"{paper.EQUIVALENCE_FRACTION} x {share:.3g} x our gain"
        effect = "--" if share is None else f"{share:.3g} of the reference gain"
        lines.append(f"| {name} | {CONTRAST_CLAIM.get(name, '--')} | {effect} | {text} |")
    for contrast in FAMILIES["12_molora_factorial"]:
        effect = paper.PAPER_B_EFFECT_NATS.get(contrast.name)
        margin = paper.equivalence_margin_b(contrast.name)
        lines.append(f"| {contrast.name} | {CONTRAST_CLAIM.get(contrast.name, '--')} | "
                     f"{'--' if effect is None else f'{effect:+g} nats'} | "
                     f"{'none' if margin is None else f'+-{margin:g} nats'} |")
    return "\n".join(lines) + "\n"


def _replace_block(text: str, start: str, end: str, body: str) -> str | None:
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        return None
    return pattern.sub(lambda _: f"{start}\n{body}{end}", text)


def update_docs(path: str | Path) -> bool:
    """Rewrite the rules block of ``docs/statistics.md``; False if its markers are absent."""
    path = Path(path)
    new = _replace_block(path.read_text(), RULES_START, RULES_END, rules_markdown())
    if new is None:
        return False
    atomic_write_text(path, new)
    return True


README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"
TERMS_START, TERMS_END = "<!-- terms:start -->", "<!-- terms:end -->"  # the README's glossary, before its story
RESULTS_PAGE = "docs/results.md"  # the full generated table (reason, power); the README holds the short one
GLOSSARY = (
    ("strict accuracy", "the paper's reward fully earned: the right answer inside `<answer>\\boxed{x}</answer>`"),
    ("lenient accuracy", "the right answer anywhere in the model's final turn, whatever its form (the skill "
     "without the reward's answer protocol)"),
    ("gain recovery", "(method - base) / (full GRPO's best - base): the share of the reference's gain a method "
     "recovers at the budget"),
    ("s*", "the step of full GRPO's best validation accuracy; the fixed budget of paper A's comparisons"),
    ("units", "the latent units problems fall in (the subject name the base's prior keys on); intervals resample "
     "them, and the table says how many an interval rests on"),
    ("precondition", "a check that the base gives the methods something to act on (varying rewards, differing ES "
     "members, a pilot that gains, a gain spread over units: G1-E2, R, U of docs/preflight.md)"),
    ("regime criterion", "the check that the base resembles the paper's starting point (docs/regime.md)"),
    ("gate", "a precondition a claim is judged under: the base-regime criterion and the preflight of the task the "
     "claim is measured on (docs/regime.md, docs/preflight.md), and its base's 5-seed check; closed, the verdict "
     "is `not in regime`, `not actionable` or `not checked` whatever the data show"),
)


def glossary_markdown() -> str:
    """The terms the results table uses, defined once before it."""
    return "Terms: " + "; ".join(f"**{term}**: {meaning}" for term, meaning in GLOSSARY) + "."


def readme_markdown(rows: list[dict[str, str]], profile: str, glossary: bool = True) -> str:
    """The README's short results table: for each of the papers' claims, what our data show in plain words
    (effect / no effect / undecided with the interval and the units it rests on; the full figure where a claim
    has no test), its gate (open, closed and why, or none) and the verdict, every cell whole; a glossary
    first (``glossary`` False: the page defines the terms in its own block, :data:`TERMS_START`); one line
    counting our registered predictions by verdict. The full table, with every row's reason and power, is
    :data:`RESULTS_PAGE` (:func:`to_markdown`)."""
    rows = [{k: str(v).replace("|", "/") for k, v in r.items()} for r in rows]
    papers = [r for r in rows if r["paper"] != OURS]
    ours = [r for r in rows if r["paper"] == OURS]
    lines = [f"What the committed `{profile}` run shows (generated by notebooks/99_summary.ipynb; do not edit by "
             f"hand; every row's reason, power and notebook: [{RESULTS_PAGE}]({RESULTS_PAGE})).", "",
             *([glossary_markdown(), ""] if glossary else []),
             "| claim | paper | what our data show | gate | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {r['claim']}: {r['statement']} | {r['paper_figure']} | {r.get('data') or r['ours']} | "
              f"{r.get('gate', '')} | {r['verdict']} |" for r in papers]
    if ours:
        counts: dict[str, int] = {}
        for r in ours:
            counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        tally = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        lines += ["", f"Our {len(ours)} registered predictions ({', '.join(r['claim'] for r in ours)}): {tally}."]
    return "\n".join(lines) + "\n"


def update_readme(readme: str | Path, markdown: str) -> bool:
    """Replace a page's generated results section (between :data:`README_START` and :data:`README_END`);
    False if the markers are absent."""
    readme = Path(readme)
    new = _replace_block(readme.read_text(), README_START, README_END, markdown)
    if new is None:
        return False
    atomic_write_text(readme, new)
    return True


def write_results_pages(root: str | Path, rows: list[dict[str, str]], profile: str,
                        significant: list[str] | None = None) -> dict[str, bool]:
    """Regenerate both results sections under ``root``: the short table of ``README.md``
    (:func:`readme_markdown`) and the full one of :data:`RESULTS_PAGE` (:func:`to_markdown`, notebook links
    relative to ``docs/``). Returns, per page, whether its markers were found (and the section rewritten)."""
    root = Path(root)
    readme = root / "README.md"
    # a README with its own terms block (before the story that first uses them) holds the glossary once, there
    terms = readme.exists() and TERMS_START in readme.read_text()
    if terms:
        new = _replace_block(readme.read_text(), TERMS_START, TERMS_END, glossary_markdown() + "\n")
        if new is not None:
            atomic_write_text(readme, new)
    pages = {"README.md": readme_markdown(rows, profile, glossary=not terms),
             RESULTS_PAGE: to_markdown(rows, profile, link_prefix="../notebooks/", significant=significant)}
    return {page: update_readme(root / page, markdown) for page, markdown in pages.items()}
