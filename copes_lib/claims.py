"""The claims of both papers, judged against the suite's own results.

Each claim names the notebook whose ``summary.json`` it reads and a rule, fixed here before any result
exists, that turns our numbers into a verdict: ``agrees``, ``partly``, ``does not``, ``inconclusive``
(the study could not tell: its interval is too wide, or a noise source is unmeasured), or ``missing``
(the notebook has not written the keys; missing is never counted as agreement).

Statistical claims compare two methods on the same problems with :mod:`copes_lib.stats`: per-seed
per-problem scores (``scores.npz`` beside the summary, written with ``stats.save_scores``), both noise
sources counted (training seeds and the evaluation set), Holm over the notebook's family of tests
(:data:`FAMILIES`), an equivalence test (TOST) against a margin declared in ``paper.py`` for "no effect"
readings, and the minimum detectable effect at 80% power in the row's ``power`` column. A claim that
"X beats Y" agrees with an ``effect``, does not with an ``opposite`` or an interval inside the margin
(an effect of the paper's size ruled out), and is inconclusive otherwise. Without per-problem scores a
statistical claim is inconclusive: the point estimates are shown, never judged.

Our models are ~1000x smaller than the papers', so effects are compared as a share of the reference gain
(full GRPO's best minus the base), see ``paper.EFFECT_SHARE_A``; paper B's as a share of the router
effect measured in the same run.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from copes_lib import paper, stats
from copes_lib.runs import RESULTS_ROOT, atomic_write_text, read_json

AGREES, PARTLY, DISAGREES, INCONCLUSIVE, MISSING = "agrees", "partly", "does not", "inconclusive", "missing"
VERDICTS = (AGREES, PARTLY, DISAGREES, INCONCLUSIVE, MISSING)
SCORES = "_scores"  # load_summaries puts a notebook's stats.load_scores() under this key of its summary
NO_SCORES = "inconclusive (no per-problem scores)"
DETERMINISTIC = "deterministic (analytic or one measurement): no sampling noise to test"


@dataclasses.dataclass(frozen=True)
class Judgement:
    verdict: str
    ours: str
    power: str = ""


@dataclasses.dataclass(frozen=True)
class Contrast:
    """One test of a notebook's family: mean(a) - mean(b) of ``metric``, predicted sign ``sign``."""

    name: str
    metric: str
    a: str
    b: str
    sign: int = 1


# Every test a notebook reports belongs to its family; Holm runs over the contrasts whose arms exist.
FAMILIES: dict[str, tuple[Contrast, ...]] = {
    "05_fixed_budget_math": (
        Contrast("copes_vs_es", "val_accuracy_at_budget", "copes", "es"),
        Contrast("copes_vs_lora_grpo", "val_accuracy_at_budget", "copes", "lora_grpo"),
    ),
    "06_copes_ablations": tuple(
        Contrast(f"k4_vs_{arm}", "val_accuracy_at_budget", "k4", arm)
        for arm in ("k1", "k2", "k8", "indep_z", "es_2sigma", "es_sqrtk_alpha", "copes_matched_step")),
    "07_multihop_qa": (Contrast("copes_vs_es_f1", "test_f1", "copes", "es"),),
    # log-PPL: lower is better, so a = the reference cell, b = the test cell (Delta = ref - test > 0 helps).
    # The chain's eval-scope contrast (+R+E vs +R) is the same computation by construction: not a test.
    "12_molora_factorial": (
        Contrast("router", "log_ppl", "b3", "r", +1),
        Contrast("eval_scope_with_lifecycle", "log_ppl", "r_l_e0", "r_e_l", +1),
        Contrast("lifecycle", "log_ppl", "r_e", "r_e_l", -1),
        Contrast("lifecycle_global_scope", "log_ppl", "r", "r_l_e0", -1),
        Contrast("full_vs_b3", "log_ppl", "b3", "r_e_l", +1),
        Contrast("inheritance_alpha0", "log_ppl", "r_e_l_alpha0", "r_e_l", +1),
    ),
    # excess loss: lower is better; evolution "helps" when evolution - gradient < 0
    "13_molora_sandbox": tuple(Contrast(f"evo_vs_grad_{r}", f"excess_loss_{r}", "evolution", "gradient", -1)
                               for r in ("prealigned", "random", "misaligned", "cotrained")),
}
PAPER_B_DELTA = {"router": 0.0426, "lifecycle": -0.028, "full_vs_b3": 0.015, "eval_scope_with_lifecycle": 0.0}


class Context:
    """What a judge sees: its notebook's summary, every summary, and the notebook's tested family."""

    def __init__(self, notebook: str, summaries: dict[str, dict[str, Any]]):
        self.notebook, self.summaries = notebook, summaries
        self.summary = summaries.get(notebook, {})
        self._family: dict[str, stats.Comparison] | None = None

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def reference_gain(self, base_key: str, reference_key: str) -> float | None:
        """reference - base from this summary, else from notebook 05's (06 shares 05's substrate)."""
        for s in (self.summary, self.summaries.get("05_fixed_budget_math", {})):
            if s.get(base_key) is not None and s.get(reference_key) is not None:
                return float(s[reference_key]) - float(s[base_key])
        return None

    def family(self) -> dict[str, stats.Comparison]:
        """The notebook's contrasts that have scores, Holm-corrected together; {} without scores."""
        if self._family is None:
            self._family = _test_family(self)
        return self._family


def _scales(ctx: Context, contrast: Contrast, scores: dict[str, stats.ScoreSet]) -> tuple[float | None, float | None]:
    """(the paper's effect in our units, the equivalence margin) for one contrast, or None where none."""
    if ctx.notebook in ("05_fixed_budget_math", "06_copes_ablations", "07_multihop_qa"):
        share = paper.EFFECT_SHARE_A.get(contrast.name)
        gain = (ctx.reference_gain("f1_base", "f1_full_grpo") if ctx.notebook == "07_multihop_qa"
                else ctx.reference_gain("base_val_accuracy", "full_grpo_best_val_accuracy"))
        if share is None or gain is None or gain <= 0:
            return None, None
        effect = share * gain
        return effect, paper.EQUIVALENCE_FRACTION * abs(effect)
    if ctx.notebook == "12_molora_factorial" and contrast.name != "router":
        router = next(c for c in FAMILIES["12_molora_factorial"] if c.name == "router")
        ss = scores.get(router.metric)
        if ss is None or router.a not in ss.arms or router.b not in ss.arms:
            return None, None
        ours_router = float(ss.arms[router.a].mean() - ss.arms[router.b].mean())
        if ours_router == 0:
            return None, None
        paper_delta = PAPER_B_DELTA.get(contrast.name)
        effect = None if paper_delta is None else paper_delta / PAPER_B_DELTA["router"] * abs(ours_router)
        return effect, paper.EQUIVALENCE_FRACTION * abs(ours_router)
    return None, None


def _test_family(ctx: Context) -> dict[str, stats.Comparison]:
    scores = ctx.summary.get(SCORES) or {}
    tests = []
    for contrast in FAMILIES.get(ctx.notebook, ()):
        ss = scores.get(contrast.metric)
        if ss is None or contrast.a not in ss.arms or contrast.b not in ss.arms:
            continue
        effect, margin = _scales(ctx, contrast, scores)
        tests.append(ss.compare(contrast.a, contrast.b, name=contrast.name, expected_sign=contrast.sign,
                                margin=margin, paper_effect=effect, alpha=paper.ALPHA, power=paper.POWER))
    return {c.name: c for c in stats.holm_family(tests)}


def _power(c: stats.Comparison, scale: float, unit: str) -> str:
    text = (f"MDE {c.mde * scale:.2g}{unit} at {c.power:.0%} power (alpha {c.alpha}/{c.family_size}); "
            f"{c.n_seeds[0]}/{c.n_seeds[1]} seeds x {c.n_problems} problems")
    if c.paper_effect is not None:
        text += f"; paper's effect here {c.paper_effect * scale:.2g}{unit}"
    return text


def _stat(c: stats.Comparison, scale: float, unit: str) -> str:
    f = lambda x: f"{x * scale:+.2g}{unit}"  # noqa: E731
    return f"{f(c.estimate)} [{f(c.low)}, {f(c.high)}], Holm p = {c.p_holm:.2g} -> {c.verdict}"


def _beats(c: stats.Comparison) -> str:
    """A claim that a beats b: agrees with an effect; does not with the opposite or an effect of the
    paper's size ruled out (equivalence); inconclusive otherwise."""
    return {stats.EFFECT: AGREES, stats.OPPOSITE: DISAGREES, stats.EQUIVALENT: DISAGREES}.get(c.verdict, INCONCLUSIVE)


def _no_effect(c: stats.Comparison) -> str:
    """A claim of no effect: agrees only with equivalence inside the declared margin."""
    return {stats.EQUIVALENT: AGREES, stats.EFFECT: DISAGREES, stats.OPPOSITE: DISAGREES}.get(c.verdict, INCONCLUSIVE)


def _tested(contrast: str, figure: Callable[[Context], str], rule: Callable[[stats.Comparison], str] = _beats,
            scale: float = 100.0, unit: str = " pts") -> Callable[[Context], Judgement]:
    def judge(ctx: Context) -> Judgement:
        c = ctx.family().get(contrast)
        if c is None:
            return Judgement(INCONCLUSIVE, f"{figure(ctx)}; {NO_SCORES}", "no per-problem scores: no power")
        return Judgement(rule(c), f"{figure(ctx)}; {_stat(c, scale, unit)}", _power(c, scale, unit))
    return judge


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _pair(a_key: str, b_key: str) -> Callable[[Context], str]:
    return lambda ctx: f"{a_key} {_fmt(ctx[a_key])} vs {b_key} {_fmt(ctx[b_key])}"


def _judge_es_steps(ctx: Context) -> Judgement:
    """ES's steps to reach CoPES's budget-level accuracy, as a ratio to the budget. Validation every g
    steps puts the crossing in (s - g, s]; agrees when even s - g is >= ES_STEPS_RATIO_AGREES x the budget,
    partly when ES surely needs more than the budget but surely less than that, does not when ES got there
    within the budget; "never reached" agrees only if the run went to the paper's 3x the budget (a shorter
    horizon cannot tell the paper's 3x from less)."""
    steps, budget = ctx["es_steps_to_match_copes"], ctx["budget_steps"]
    horizon, every = ctx.summary.get("es_long_steps"), ctx.summary.get("val_every")
    seeds = ctx.summary.get("es_long_n_seeds")
    need = paper.ES_STEPS_RATIO_AGREES
    power = (f"validated every {every} steps = {every / budget:.2g}x the budget" if every else
             "validation granularity not recorded (val_every)") + (f"; {seeds} ES seed(s)" if seeds else "")
    power += "; the target (CoPES's seed-mean accuracy at the budget) is taken as exact"
    if steps is None or steps < 0:
        if horizon is None:
            return Judgement(INCONCLUSIVE, "standard ES never reached CoPES's level; horizon not recorded", power)
        ratio = horizon / budget
        text = f"standard ES never reached CoPES's {budget}-step level within {horizon} steps (> {ratio:.2g}x)"
        return Judgement(AGREES if ratio >= paper.ES_STEPS_RATIO_PAPER else INCONCLUSIVE, text, power)
    upper = steps / budget
    lower = max(0, steps - every) / budget if every else 0.0
    text = f"{steps} steps: ratio in ({lower:.2g}, {upper:.2g}]x the {budget}-step budget"
    if upper <= 1:
        return Judgement(DISAGREES, text, power)
    if lower >= need:
        return Judgement(AGREES, text, power)
    if lower >= 1 and upper < need:
        return Judgement(PARTLY, text, power)
    return Judgement(INCONCLUSIVE, text + " (the validation grid straddles a threshold)", power)


def _judge_k_sweep(ctx: Context) -> Judgement:
    """agrees: K = 4 beats K = 1 and K = 8 (both effects after Holm); partly: one of them; does not: no
    win and at least one opposite or equivalent; inconclusive otherwise."""
    figure = " ".join(f"K={k} {_fmt(ctx[f'val_accuracy_k{k}'])}" for k in (1, 4, 8))
    tests = [ctx.family().get(f"k4_vs_{arm}") for arm in ("k1", "k8")]
    if None in tests:
        return Judgement(INCONCLUSIVE, f"{figure}; {NO_SCORES}", "no per-problem scores: no power")
    verdicts = [c.verdict for c in tests]
    wins = verdicts.count(stats.EFFECT)
    losses = sum(v in (stats.OPPOSITE, stats.EQUIVALENT) for v in verdicts)
    verdict = AGREES if wins == 2 else PARTLY if wins == 1 else DISAGREES if losses else INCONCLUSIVE
    text = f"{figure}; K4-K1 {_stat(tests[0], 100, ' pts')}; K4-K8 {_stat(tests[1], 100, ' pts')}"
    return Judgement(verdict, text, " | ".join(_power(c, 100, " pts") for c in tests))


def _judge_memory(ctx: Context) -> Judgement:
    """agrees: each figure rounds to the paper's printed GiB (the paper's convention); the exact-GiB ES
    value, when the notebook reports it, must NOT match, so the check tells the conventions apart."""
    names = ("es", "full_grpo", "lora_grpo")
    ours = [ctx[f"qwen35_4b_{n}_gib_at_128k"] for n in names]
    close = [abs(o - paper.TABLE_S7[n]["at_128k_gib"]) <= paper.MEMORY_PRINT_TOLERANCE_GIB
             for o, n in zip(ours, names, strict=True)]
    text = " / ".join(f"{o:.3f}" for o in ours) + " GiB"
    exact = ctx.summary.get("qwen35_4b_es_gib_at_128k_exact")
    if exact is not None:
        exact_matches = abs(exact - paper.TABLE_S7["es"]["at_128k_gib"]) <= paper.MEMORY_PRINT_TOLERANCE_GIB
        text += f"; exact-GiB ES {exact:.3f} {'also matches' if exact_matches else 'does not match'}"
        if exact_matches:  # the check cannot tell the conventions apart
            return Judgement(INCONCLUSIVE, text, DETERMINISTIC)
    return Judgement(AGREES if all(close) else PARTLY if any(close) else DISAGREES, text, DETERMINISTIC)


def _judge_feasibility(ctx: Context) -> Judgement:
    es, grpo = ctx["qwen35_4b_es_gib_at_128k"], ctx["qwen35_4b_full_grpo_gib_at_128k"]
    text = f"ES {es:.1f} GiB vs full GRPO {grpo:.1f} GiB at 128K"
    return Judgement(AGREES if es <= 24 < grpo else DISAGREES, text, DETERMINISTIC)


def _judge_ratio(ctx: Context) -> Judgement:
    measured, predicted = ctx["measured_grpo_to_es_peak_ratio"], ctx["predicted_grpo_to_es_peak_ratio"]
    rel = abs(measured - predicted) / predicted
    text = f"measured {measured:.3g}x vs predicted {predicted:.3g}x"
    return Judgement(AGREES if rel <= 0.25 else PARTLY if rel <= 0.5 else DISAGREES, text,
                     "one memory measurement per method (tensor bytes are deterministic)")


def _judge_collapse(ctx: Context) -> Judgement:
    r0, r1 = ctx["monopoly_slots_r0"], ctx["monopoly_slots_r1"]
    text = f"R0 {r0} slots, R1 {r1} slots carry 90% of the gate mass"
    power = "a count from one run per router: no noise model"
    if r0 <= paper.MONOPOLY_SLOTS_R0 and r1 > r0:
        return Judgement(AGREES, text, power)
    return Judgement(PARTLY if r1 > r0 else DISAGREES, text, power)


def _nats(key: str) -> Callable[[Context], str]:
    return lambda ctx: f"summary Delta {ctx[key]:+.4f} nats"


def _judge_sandbox(ctx: Context) -> Judgement:
    """Evolution helps in a regime when evolution - gradient excess loss is an effect below 0 (Holm over
    the four regimes). agrees: helps with pre-aligned adapters and nowhere else; partly: pre-aligned and
    elsewhere too; does not: no help with pre-aligned adapters (opposite or equivalent); inconclusive
    when the pre-aligned test cannot tell."""
    regimes = ("prealigned", "random", "misaligned", "cotrained")
    figure = "evo - grad excess loss " + ", ".join(
        f"{r} {ctx[f'evo_minus_grad_excess_loss_{r}']:+.3g}" for r in regimes)
    tests = {r: ctx.family().get(f"evo_vs_grad_{r}") for r in regimes}
    if any(c is None for c in tests.values()):
        return Judgement(INCONCLUSIVE, f"{figure}; {NO_SCORES}", "no per-problem scores: no power")
    pre = tests["prealigned"].verdict
    elsewhere = any(tests[r].verdict == stats.EFFECT for r in regimes[1:])
    verdict = (INCONCLUSIVE if pre == stats.INCONCLUSIVE else DISAGREES if pre != stats.EFFECT
               else PARTLY if elsewhere else AGREES)
    text = f"{figure}; pre-aligned {_stat(tests['prealigned'], 1, '')}; elsewhere: " + ", ".join(
        tests[r].verdict for r in regimes[1:])
    return Judgement(verdict, text, _power(tests["prealigned"], 1, ""))


_NATS = {"scale": 1.0, "unit": " nats"}


@dataclasses.dataclass(frozen=True)
class Claim:
    claim_id: str
    paper: str  # "A" (CoPES) or "B" (mixture-of-LoRA)
    statement: str
    paper_figure: str
    notebook: str
    keys: tuple[str, ...]
    judge: Callable[[Context], Judgement]
    none_means: tuple[str, ...] = ()  # keys whose None is a result (e.g. "never reached"), not missing


CLAIMS: tuple[Claim, ...] = (
    Claim("A1", "A", "At a fixed 16-step budget CoPES recovers more of full GRPO's gain than standard ES",
          "91.8% vs 67.2%", "05_fixed_budget_math", ("gain_recovery_copes", "gain_recovery_es"),
          _tested("copes_vs_es", _pair("gain_recovery_copes", "gain_recovery_es"))),
    Claim("A2", "A", "Standard ES needs about 3x the steps to reach CoPES's budget-level validation accuracy",
          "48 vs 16 steps", "05_fixed_budget_math", ("es_steps_to_match_copes", "budget_steps"),
          _judge_es_steps, none_means=("es_steps_to_match_copes",)),
    Claim("A3", "A", "At the same budget CoPES beats LoRA-GRPO", "91.8% vs 57.7% gain recovery",
          "05_fixed_budget_math", ("gain_recovery_copes", "gain_recovery_lora_grpo"),
          _tested("copes_vs_lora_grpo", _pair("gain_recovery_copes", "gain_recovery_lora_grpo"))),
    Claim("A4", "A", "K = 4 beats both K = 1 (standard ES) and K = 8 at fixed N = 40",
          "MATH-500 88.3 vs 78.9 / 58.1", "06_copes_ablations",
          ("val_accuracy_k1", "val_accuracy_k4", "val_accuracy_k8"), _judge_k_sweep),
    Claim("A5", "A", "Joint z-scoring beats independent per-subspace z-scores", "MATH-500 88.3 vs 87.7",
          "06_copes_ablations", ("val_accuracy_k4", "val_accuracy_indep_z"),
          _tested("k4_vs_indep_z", _pair("val_accuracy_k4", "val_accuracy_indep_z"))),
    Claim("A6", "A", "Standard ES with 2 sigma does not reproduce CoPES's gain", "MATH-500 65.3 vs 88.3",
          "06_copes_ablations", ("val_accuracy_k4", "val_accuracy_es_2sigma"),
          _tested("k4_vs_es_2sigma", _pair("val_accuracy_k4", "val_accuracy_es_2sigma"))),
    Claim("A7", "A", "(our control) CoPES beats standard ES given the same update norm (sqrt(K) x alpha)",
          "not tested in the paper", "06_copes_ablations", ("val_accuracy_k4", "val_accuracy_es_sqrtk_alpha"),
          _tested("k4_vs_es_sqrtk_alpha", _pair("val_accuracy_k4", "val_accuracy_es_sqrtk_alpha"))),
    Claim("A8", "A", "On multi-hop QA at a 48-step budget CoPES beats standard ES in F1",
          "2Wiki 55.50 vs 51.53", "07_multihop_qa", ("f1_copes", "f1_es"),
          _tested("copes_vs_es_f1", _pair("f1_copes", "f1_es"))),
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
          "12_molora_factorial", ("delta_router",), _tested("router", _nats("delta_router"), **_NATS)),
    Claim("B3", "B", "The lifecycle is a net penalty", "-0.028 nats, p = 0.047", "12_molora_factorial",
          ("delta_lifecycle",), _tested("lifecycle", _nats("delta_lifecycle"), **_NATS)),
    Claim("B4", "B", "The full system is not significantly better than the static baseline B3",
          "+0.015 nats, p = 0.19", "12_molora_factorial", ("delta_full_vs_b3",),
          _tested("full_vs_b3", _nats("delta_full_vs_b3"), _no_effect, **_NATS)),
    Claim("B5", "B", "The evaluation scope has no effect (measured with the lifecycle on, where it can act)",
          "~0 nats", "12_molora_factorial", ("delta_eval_scope",),
          _tested("eval_scope_with_lifecycle", _nats("delta_eval_scope"), _no_effect, **_NATS)),
    Claim("B6", "B", "Evolutionary routing search helps only with pre-aligned adapters",
          "sandbox boundary", "13_molora_sandbox",
          ("evo_minus_grad_excess_loss_prealigned", "evo_minus_grad_excess_loss_random",
           "evo_minus_grad_excess_loss_misaligned", "evo_minus_grad_excess_loss_cotrained"), _judge_sandbox),
)


def _direction_only(a_key: str, b_key: str) -> Callable[[Context], Judgement]:
    """A per-benchmark row without per-problem scores: the direction alone, so at best "partly"."""
    def judge(ctx: Context) -> Judgement:
        a, b = ctx[a_key], ctx[b_key]
        return Judgement(PARTLY if a > b else DISAGREES, f"{_fmt(a)} vs {_fmt(b)}",
                         "direction only: one checkpoint per method, no per-problem test")
    return judge


def _judge_largest_gap(ctx: Context) -> Judgement:
    """Notebook 09, our own question: at the largest size, CoPES (paper protocol) vs ES with the
    notebook's seeds x problems test (stats.compare): effect -> agrees, opposite -> does not, else
    inconclusive."""
    tag = ctx["largest_size_tag"]
    verdict = ctx.summary.get(f"copes_paper_minus_es_verdict_{tag}")
    estimate = ctx.summary.get(f"copes_paper_minus_es_{tag}")
    low, high = ctx.summary.get(f"copes_paper_minus_es_low_{tag}"), ctx.summary.get(f"copes_paper_minus_es_high_{tag}")
    if verdict is None or estimate is None:
        return Judgement(MISSING, f"no CoPES - ES comparison for size {tag}", "")
    interval = f" [{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None and high is not None else ""
    text = f"{tag} ({_fmt(ctx.summary.get(f'n_params_{tag}'))} parameters): {100 * estimate:+.1f} points{interval}"
    mapped = {stats.EFFECT: AGREES, stats.OPPOSITE: DISAGREES}.get(verdict, INCONCLUSIVE)
    return Judgement(mapped, f"{text} ({verdict})", ctx.summary.get("power_note", ""))


def _judge_slope(metric: str, what: str) -> Callable[[Context], Judgement]:
    """A trend over sizes: the least-squares line of the per-size estimates ``<metric>_<size>`` in
    log10(parameters), with the slope's 95% interval from the per-size 95% intervals
    (``<metric>_low_<size>`` / ``_high_<size>``; sizes are independent models, so their variances
    add). Rising interval above 0 -> agrees, below 0 -> does not, else inconclusive; fewer than 3 sizes
    with an estimate (e.g. gain recovery is undefined where full GRPO gained nothing) -> inconclusive.
    A least-squares line through 3 noisy points with no interval could not tell a trend from noise."""
    def judge(ctx: Context) -> Judgement:
        sizes = list(ctx.summary.get("sizes") or [])
        points = []
        for tag in sizes:
            values = [ctx.summary.get(f"{metric}{part}_{tag}") for part in ("", "_low", "_high")]
            n_params = ctx.summary.get(f"n_params_{tag}")
            if n_params and all(v is not None and math.isfinite(v) for v in values):
                points.append((math.log10(n_params), *values))
        defined = f"defined at {len(points)} of {len(sizes)} sizes"
        if len(points) < 3:
            return Judgement(INCONCLUSIVE, f"{what}: {defined} (a trend needs 3)",
                             "gain recovery needs a positive full-GRPO gain at a size")
        x = np.array([p[0] for p in points])
        y = np.array([p[1] for p in points])
        se = np.array([(p[3] - p[2]) / (2 * 1.96) for p in points])
        sxx = float(((x - x.mean()) ** 2).sum())
        slope = float(((x - x.mean()) * y).sum() / sxx)
        slope_se = float(math.sqrt((((x - x.mean()) ** 2) * se ** 2).sum()) / sxx)
        low, high = slope - 1.96 * slope_se, slope + 1.96 * slope_se
        text = (f"{what}: slope {_fmt(slope)} per decade of parameters [{_fmt(low)}, {_fmt(high)}], "
                f"{defined}")
        power = (f"95% interval of the slope from the per-size 95% intervals (seeds x problems each); "
                 f"half-width {_fmt(1.96 * slope_se)} per decade")
        verdict = AGREES if low > 0 else DISAGREES if high < 0 else INCONCLUSIVE
        return Judgement(verdict, text, power)
    return judge


SCALE_CLAIMS: tuple[Claim, ...] = (
    Claim("S1", "ours", "(ours, beyond the papers) At the largest substrate size CoPES beats standard ES under "
          "the paper's protocol", "the paper: one 4B model, 88.0 vs 77.6 val acc", "09_scale_study",
          ("largest_size_tag",), _judge_largest_gap),
    Claim("S2", "ours", "(ours) CoPES's edge over standard ES grows with model size", "not studied in the papers",
          "09_scale_study", ("sizes",), _judge_slope("copes_paper_minus_es", "CoPES - ES")),
    Claim("S3", "ours", "(ours) Standard ES recovers more of full GRPO's gain at larger sizes",
          "not studied in the papers (4B: 67.2%)", "09_scale_study",
          ("sizes",), _judge_slope("gain_recovery_es", "ES gain recovery")),
)


def _benchmark_claims() -> tuple[Claim, ...]:
    """Per-benchmark rows of Tables 1 and 4 (gpu profile: MATH_TEST_FILES / QA_TEST_FILES). They are
    judged only where the notebook wrote their keys, so smoke / cpu tables are unchanged."""
    math = [Claim(f"A1-{bench}", "A", f"At the budget CoPES's test pass@1 beats standard ES's on {name}",
                  f"{paper.TABLE1['copes_at_16']['pass1'][i]} vs {paper.TABLE1['es_at_16']['pass1'][i]}",
                  "05_fixed_budget_math", (f"test_pass1_copes_{bench}", f"test_pass1_es_{bench}"),
                  _direction_only(f"test_pass1_copes_{bench}", f"test_pass1_es_{bench}"))
            for i, (bench, name) in enumerate(zip(("aime24", "aime25", "gsm8k", "math500", "math_test"),
                                                  paper.BENCHMARKS_MATH))]
    qa = [Claim(f"A8-{bench}", "A", f"At the budget CoPES's test F1 beats standard ES's on {name}",
                f"{paper.TABLE4[name]['copes'][2]} vs {paper.TABLE4[name]['es'][2]}", "07_multihop_qa",
                (f"f1_copes_{bench}", f"f1_es_{bench}"),
                _direction_only(f"f1_copes_{bench}", f"f1_es_{bench}"))
          for bench, name in (("hotpotqa", "HotpotQA"), ("2wiki", "2Wiki"), ("musique", "MuSiQue"))]
    return tuple(math + qa)


BENCHMARK_CLAIMS = _benchmark_claims()


def load_summaries(profile: str, root: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Every ``results/<profile>/<notebook>/summary.json`` there is, keyed by notebook; a notebook's
    per-problem scores (``scores.npz``) under the summary's ``SCORES`` key when the summary's
    ``scores_sha256`` names that very file (a file left by an earlier run is ignored)."""
    base = Path(root or RESULTS_ROOT) / profile
    out = {}
    for path in sorted(base.glob("*/summary.json")):
        summary = read_json(path)
        digest = stats.scores_digest(path.parent)
        if digest is not None and digest == summary.get("scores_sha256"):
            summary[SCORES] = stats.load_scores(path.parent)
        out[path.parent.name] = summary
    return out


def judge_claims(summaries: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One row per claim: the paper's figure, ours, the verdict (``missing`` if keys are absent) and the
    study's power."""
    contexts: dict[str, Context] = {}
    rows = []
    measured = tuple(c for c in BENCHMARK_CLAIMS if all(k in summaries.get(c.notebook, {}) for k in c.keys))
    for claim in CLAIMS + SCALE_CLAIMS + measured:
        summary = summaries.get(claim.notebook, {})
        absent = [k for k in claim.keys
                  if k not in summary or (summary[k] is None and k not in claim.none_means)]
        if absent:
            j = Judgement(MISSING, f"not yet measured ({', '.join(absent)})", "")
        else:
            ctx = contexts.setdefault(claim.notebook, Context(claim.notebook, summaries))
            j = claim.judge(ctx)
        rows.append({"claim": claim.claim_id, "paper": claim.paper, "statement": claim.statement,
                     "paper_figure": claim.paper_figure, "ours": j.ours, "verdict": j.verdict,
                     "power": j.power, "notebook": claim.notebook})
    return rows


def to_markdown(rows: list[dict[str, str]], profile: str, link_prefix: str = "notebooks/") -> str:
    rows = [{k: str(v).replace("|", "/") for k, v in r.items()} for r in rows]  # keep the table intact
    lines = [f"Claims of both papers against the `{profile}` profile's results "
             "(generated by notebooks/99_summary.ipynb; do not edit by hand).", "",
             "| claim | statement | paper | ours | verdict | power | notebook |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        link = f"[{r['notebook']}]({link_prefix}{r['notebook']}.ipynb)"
        lines.append(f"| {r['claim']} | {r['statement']} | {r['paper_figure']} | {r['ours']} | "
                     f"{r['verdict']} | {r.get('power', '')} | {link} |")
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
