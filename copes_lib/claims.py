"""The claims of both papers, judged against the suite's own ``summary.json`` files.

Each claim names the notebook and summary keys it reads and a rule, fixed here before any result
exists, that turns our numbers into a verdict: ``agrees``, ``partly``, ``does not``, or ``missing``
when a notebook has not written the keys (missing is never counted as agreement). The rules judge the
DIRECTION and significance of an effect, not its size: our models are 1000x smaller than the papers',
so the papers' magnitudes are shown beside ours for reading, not as targets.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from copes_lib import paper
from copes_lib.runs import RESULTS_ROOT, atomic_write_text, read_json

AGREES, PARTLY, DISAGREES, MISSING = "agrees", "partly", "does not", "missing"

Verdict = tuple[str, str]  # (verdict, our figure as text)


@dataclasses.dataclass(frozen=True)
class Claim:
    claim_id: str
    paper: str  # "A" (CoPES) or "B" (mixture-of-LoRA)
    statement: str
    paper_figure: str
    notebook: str
    keys: tuple[str, ...]
    judge: Callable[[dict[str, Any]], Verdict]
    none_means: tuple[str, ...] = ()  # keys whose None is a result (e.g. "never reached"), not missing


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _greater(a_key: str, b_key: str, sig_key: str | None = None) -> Callable[[dict], Verdict]:
    """agrees: a > b and the notebook's significance flag is true; partly: a > b but not significant,
    or no significance test exists (a direction alone within noise is not agreement)."""
    def judge(s: dict) -> Verdict:
        a, b = s[a_key], s[b_key]
        text = f"{a_key} {_fmt(a)} vs {b_key} {_fmt(b)}"
        if a <= b:
            return DISAGREES, text
        if sig_key is None or sig_key not in s:
            return PARTLY, text + " (direction only: no significance test)"
        return (AGREES, text + " (significant)") if s[sig_key] else (PARTLY, text + " (not significant)")
    return judge


def _judge_es_steps(s: dict) -> Verdict:
    steps, budget = s["es_steps_to_match_copes"], s["budget_steps"]
    if steps is None or steps < 0:
        return AGREES, f"standard ES never reached CoPES's {budget}-step level in the steps run"
    ratio = steps / budget
    verdict = AGREES if ratio >= 2 else PARTLY if ratio > 1 else DISAGREES
    return verdict, f"{steps} steps = {ratio:.2g}x the {budget}-step budget"


def _judge_k_sweep(s: dict) -> Verdict:
    """agrees: K = 4 beats K = 1 and K = 8, both significant (paired over seeds); partly: K = 4 beats
    at least one of them (in direction); does not: it beats neither."""
    k1, k4, k8 = s["val_accuracy_k1"], s["val_accuracy_k4"], s["val_accuracy_k8"]
    text = f"K=1 {_fmt(k1)}, K=4 {_fmt(k4)}, K=8 {_fmt(k8)}"
    flags = [s.get(f"k4_minus_{arm}_significant") for arm in ("k1", "k8")]
    if None in flags:
        text += " (direction only: no significance test)"
    else:
        text += f" (K=4 > K=1 significant: {flags[0]}; K=4 > K=8 significant: {flags[1]})"
    wins = (k4 > k1) + (k4 > k8)
    if wins == 2 and all(flags):
        return AGREES, text
    return (PARTLY if wins >= 1 else DISAGREES), text


def _judge_memory(s: dict) -> Verdict:
    ours = (s["qwen35_4b_es_gib_at_128k"], s["qwen35_4b_full_grpo_gib_at_128k"],
            s["qwen35_4b_lora_grpo_gib_at_128k"])
    theirs = (paper.TABLE_S7["es"]["at_128k_gib"], paper.TABLE_S7["full_grpo"]["at_128k_gib"],
              paper.TABLE_S7["lora_grpo"]["at_128k_gib"])
    close = [abs(o - t) <= 0.01 * t for o, t in zip(ours, theirs)]
    text = " / ".join(f"{o:.2f}" for o in ours) + " GiB"
    return (AGREES if all(close) else PARTLY if any(close) else DISAGREES), text


def _judge_feasibility(s: dict) -> Verdict:
    es, grpo = s["qwen35_4b_es_gib_at_128k"], s["qwen35_4b_full_grpo_gib_at_128k"]
    text = f"ES {es:.1f} GiB vs full GRPO {grpo:.1f} GiB at 128K"
    return (AGREES if es <= 24 < grpo else DISAGREES), text


def _judge_ratio(s: dict) -> Verdict:
    measured, predicted = s["measured_grpo_to_es_peak_ratio"], s["predicted_grpo_to_es_peak_ratio"]
    rel = abs(measured - predicted) / predicted
    text = f"measured {measured:.3g}x vs predicted {predicted:.3g}x"
    return (AGREES if rel <= 0.25 else PARTLY if rel <= 0.5 else DISAGREES), text


def _judge_significant(delta_key: str, p_key: str, sign: int) -> Callable[[dict], Verdict]:
    """agrees: the effect has the paper's sign and p < 0.05; partly: the sign only."""
    def judge(s: dict) -> Verdict:
        delta, p = s[delta_key], s[p_key]
        text = f"Delta {delta:+.4f} nats, p = {_fmt(p, 2)}"
        if delta * sign <= 0:
            return DISAGREES, text
        return (AGREES if p < 0.05 else PARTLY), text
    return judge


def _judge_not_significant(delta_key: str, p_key: str) -> Callable[[dict], Verdict]:
    def judge(s: dict) -> Verdict:
        delta, p = s[delta_key], s[p_key]
        text = f"Delta {delta:+.4f} nats, p = {_fmt(p, 2)}"
        return (AGREES if p >= 0.05 else DISAGREES), text
    return judge


def _judge_eval_scope(s: dict) -> Verdict:
    delta = s["delta_eval_scope"]
    text = f"Delta {delta:+.4f} nats"
    return (AGREES if abs(delta) < 0.005 else DISAGREES), text + " (abs(Delta) < 0.005 counts as ~0)"


def _judge_collapse(s: dict) -> Verdict:
    r0, r1 = s["monopoly_slots_r0"], s["monopoly_slots_r1"]
    text = f"R0 {r0} slots, R1 {r1} slots carry 90% of the gate mass"
    if r0 <= paper.MONOPOLY_SLOTS_R0 and r1 > r0:
        return AGREES, text
    return (PARTLY if r1 > r0 else DISAGREES), text


def _judge_sandbox(s: dict) -> Verdict:
    """Evolution "helps" in a regime when the 95% interval of evo - grad excess loss lies below 0 and
    "does not help" when it does not (the rule of notebook 13's own verdict). agrees: helps with
    pre-aligned adapters and nowhere else; partly: one of the two halves; does not: neither."""
    regimes = ("prealigned", "random", "misaligned", "cotrained")
    means = {r: s[f"evo_minus_grad_excess_loss_{r}"] for r in regimes}
    highs = {r: s.get(f"evo_minus_grad_excess_loss_{r}_high") for r in regimes}
    helps = {r: (highs[r] if highs[r] is not None else means[r]) < 0 for r in regimes}
    text = (f"evo - grad excess loss: pre-aligned {means['prealigned']:+.3g}; others "
            + ", ".join(f"{means[r]:+.3g}" for r in regimes[1:]))
    if any(h is None for h in highs.values()):
        text += " (sign of the mean only: no interval)"
    helps_pre = helps["prealigned"]
    not_elsewhere = not any(helps[r] for r in regimes[1:])
    return (AGREES if helps_pre and not_elsewhere else PARTLY if helps_pre or not_elsewhere else DISAGREES), text


CLAIMS: tuple[Claim, ...] = (
    Claim("A1", "A", "At a fixed 16-step budget CoPES recovers more of full GRPO's gain than standard ES",
          "91.8% vs 67.2%", "05_fixed_budget_math",
          ("gain_recovery_copes", "gain_recovery_es"),
          _greater("gain_recovery_copes", "gain_recovery_es", "copes_minus_es_significant")),
    Claim("A2", "A", "Standard ES needs about 3x the steps to reach CoPES's budget-level validation accuracy",
          "48 vs 16 steps", "05_fixed_budget_math", ("es_steps_to_match_copes", "budget_steps"),
          _judge_es_steps, none_means=("es_steps_to_match_copes",)),
    Claim("A3", "A", "At the same budget CoPES beats LoRA-GRPO", "91.8% vs 57.7% gain recovery",
          "05_fixed_budget_math", ("gain_recovery_copes", "gain_recovery_lora_grpo"),
          _greater("gain_recovery_copes", "gain_recovery_lora_grpo")),
    Claim("A4", "A", "K = 4 beats both K = 1 (standard ES) and K = 8 at fixed N = 40",
          "MATH-500 88.3 vs 78.9 / 58.1", "06_copes_ablations",
          ("val_accuracy_k1", "val_accuracy_k4", "val_accuracy_k8"), _judge_k_sweep),
    Claim("A5", "A", "Joint z-scoring beats independent per-subspace z-scores", "MATH-500 88.3 vs 87.7",
          "06_copes_ablations", ("val_accuracy_k4", "val_accuracy_indep_z"),
          _greater("val_accuracy_k4", "val_accuracy_indep_z", "k4_minus_indep_z_significant")),
    Claim("A6", "A", "Standard ES with 2 sigma does not reproduce CoPES's gain", "MATH-500 65.3 vs 88.3",
          "06_copes_ablations", ("val_accuracy_k4", "val_accuracy_es_2sigma"),
          _greater("val_accuracy_k4", "val_accuracy_es_2sigma", "k4_minus_es_2sigma_significant")),
    Claim("A7", "A", "(our control) CoPES beats standard ES given the same update norm (sqrt(K) x alpha)",
          "not tested in the paper", "06_copes_ablations", ("val_accuracy_k4", "val_accuracy_es_sqrtk_alpha"),
          _greater("val_accuracy_k4", "val_accuracy_es_sqrtk_alpha", "k4_minus_es_sqrtk_alpha_significant")),
    Claim("A8", "A", "On multi-hop QA at a 48-step budget CoPES beats standard ES in F1",
          "2Wiki 55.50 vs 51.53", "07_multihop_qa", ("f1_copes", "f1_es"),
          _greater("f1_copes", "f1_es", "copes_minus_es_f1_significant")),
    Claim("A9", "A", "Analytic memory at 128K context (ES / full GRPO / LoRA-GRPO, Qwen3.5-4B)",
          "12.78 / 453.44 / 402.55 GiB", "08_memory_and_gpu_hours",
          ("qwen35_4b_es_gib_at_128k", "qwen35_4b_full_grpo_gib_at_128k", "qwen35_4b_lora_grpo_gib_at_128k"),
          _judge_memory),
    Claim("A10", "A", "ES / CoPES fit one 24 GB GPU at 128K context; full GRPO does not", "Table 2",
          "08_memory_and_gpu_hours", ("qwen35_4b_es_gib_at_128k", "qwen35_4b_full_grpo_gib_at_128k"),
          _judge_feasibility),
    Claim("A11", "A", "(our check) the memory model predicts the measured GRPO / ES peak-memory ratio",
          "not in the paper", "08_memory_and_gpu_hours",
          ("measured_grpo_to_es_peak_ratio", "predicted_grpo_to_es_peak_ratio"), _judge_ratio),
    Claim("B1", "B", "The old softmax router collapses into a monopoly; the sigmoid router does not",
          "4 of 16 adapters", "11_molora_router", ("monopoly_slots_r0", "monopoly_slots_r1"), _judge_collapse),
    Claim("B2", "B", "The router rewrite improves balanced log-PPL", "+0.0426 nats, p = 0.006",
          "12_molora_factorial", ("delta_router", "p_router"), _judge_significant("delta_router", "p_router", +1)),
    Claim("B3", "B", "The lifecycle is a net penalty", "-0.028 nats, p = 0.047", "12_molora_factorial",
          ("delta_lifecycle", "p_lifecycle"), _judge_significant("delta_lifecycle", "p_lifecycle", -1)),
    Claim("B4", "B", "The full system is not significantly better than the static baseline B3",
          "+0.015 nats, p = 0.19", "12_molora_factorial", ("delta_full_vs_b3", "p_full_vs_b3"),
          _judge_not_significant("delta_full_vs_b3", "p_full_vs_b3")),
    Claim("B5", "B", "The evaluation scope has no effect", "~0 nats", "12_molora_factorial",
          ("delta_eval_scope",), _judge_eval_scope),
    Claim("B6", "B", "Evolutionary routing search helps only with pre-aligned adapters",
          "sandbox boundary", "13_molora_sandbox",
          ("evo_minus_grad_excess_loss_prealigned", "evo_minus_grad_excess_loss_random",
           "evo_minus_grad_excess_loss_misaligned", "evo_minus_grad_excess_loss_cotrained"), _judge_sandbox),
)


def _benchmark_claims() -> tuple[Claim, ...]:
    """Per-benchmark rows of Tables 1 and 4 (gpu profile: MATH_TEST_FILES / QA_TEST_FILES). They are
    judged only where the notebook wrote their keys, so smoke / cpu tables are unchanged."""
    math = [Claim(f"A1-{bench}", "A", f"At the budget CoPES's test pass@1 beats standard ES's on {name}",
                  f"{paper.TABLE1['copes_at_16']['pass1'][i]} vs {paper.TABLE1['es_at_16']['pass1'][i]}",
                  "05_fixed_budget_math", (f"test_pass1_copes_{bench}", f"test_pass1_es_{bench}"),
                  _greater(f"test_pass1_copes_{bench}", f"test_pass1_es_{bench}"))
            for i, (bench, name) in enumerate(zip(("aime24", "aime25", "gsm8k", "math500", "math_test"),
                                                  paper.BENCHMARKS_MATH))]
    qa = [Claim(f"A8-{bench}", "A", f"At the budget CoPES's test F1 beats standard ES's on {name}",
                f"{paper.TABLE4[name]['copes'][2]} vs {paper.TABLE4[name]['es'][2]}", "07_multihop_qa",
                (f"f1_copes_{bench}", f"f1_es_{bench}"), _greater(f"f1_copes_{bench}", f"f1_es_{bench}"))
          for bench, name in (("hotpotqa", "HotpotQA"), ("2wiki", "2Wiki"), ("musique", "MuSiQue"))]
    return tuple(math + qa)


BENCHMARK_CLAIMS = _benchmark_claims()


def load_summaries(profile: str, root: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Every ``results/<profile>/<notebook>/summary.json`` there is, keyed by notebook."""
    base = Path(root or RESULTS_ROOT) / profile
    return {p.parent.name: read_json(p) for p in sorted(base.glob("*/summary.json"))}


def judge_claims(summaries: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One row per claim: the paper's figure, ours, and the verdict (``missing`` if keys are absent)."""
    rows = []
    measured = tuple(c for c in BENCHMARK_CLAIMS if all(k in summaries.get(c.notebook, {}) for k in c.keys))
    for claim in CLAIMS + measured:
        summary = summaries.get(claim.notebook, {})
        absent = [k for k in claim.keys
                  if k not in summary or (summary[k] is None and k not in claim.none_means)]
        if absent:
            verdict, ours = MISSING, f"not yet measured ({', '.join(absent)})"
        else:
            verdict, ours = claim.judge(summary)
        rows.append({"claim": claim.claim_id, "paper": claim.paper, "statement": claim.statement,
                     "paper_figure": claim.paper_figure, "ours": ours, "verdict": verdict,
                     "notebook": claim.notebook})
    return rows


def to_markdown(rows: list[dict[str, str]], profile: str, link_prefix: str = "notebooks/") -> str:
    rows = [{k: str(v).replace("|", "/") for k, v in r.items()} for r in rows]  # keep the table intact
    lines = [f"Claims of both papers against the `{profile}` profile's results "
             "(generated by notebooks/99_summary.ipynb; do not edit by hand).", "",
             "| claim | statement | paper | ours | verdict | notebook |", "|---|---|---|---|---|---|"]
    for r in rows:
        link = f"[{r['notebook']}]({link_prefix}{r['notebook']}.ipynb)"
        lines.append(f"| {r['claim']} | {r['statement']} | {r['paper_figure']} | {r['ours']} | "
                     f"{r['verdict']} | {link} |")
    return "\n".join(lines) + "\n"


README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"


def update_readme(readme: str | Path, markdown: str) -> bool:
    """Replace the README's generated results section; False if the markers are absent."""
    readme = Path(readme)
    text = readme.read_text()
    pattern = re.compile(re.escape(README_START) + ".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(text):
        return False
    new = pattern.sub(lambda _: f"{README_START}\n{markdown}{README_END}", text)
    atomic_write_text(readme, new)
    return True
