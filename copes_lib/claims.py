"""The claims of both papers, judged against the suite's own results.

Each claim names the notebook whose ``summary.json`` it reads and a rule, fixed here before any result
exists, that turns our numbers into a verdict (:data:`VERDICTS`): ``agrees``, ``partly``, ``does not``,
``opposite`` (the data show the other direction, significantly), ``inconclusive`` (the study could not
tell: its interval is too wide, or a noise source is unmeasured), ``not in regime`` (paper A's method
claims, when notebook 01 says the substrate is not in the papers' regime) or ``missing`` (the notebook
has not written the keys; missing is never counted as agreement). Every verdict comes with its
``reason`` (why it is what it is), shown in ``claims.csv``, the README and the HTML reports.

Statistical claims compare two methods on the same problems with :mod:`copes_lib.stats`: per-seed
per-problem scores (``scores.npz`` beside the summary, written with ``stats.save_scores``), both noise
sources counted (training seeds and the evaluation set), Holm over the notebook's family of tests
(:data:`FAMILIES`), an equivalence test (TOST) against a margin declared in ``paper.py`` for "no effect"
readings, and the minimum detectable effect at 80% power in the row's ``power`` column. A data set is
tested once: a contrast whose two score arrays are byte-identical to an earlier notebook's contrast (06
reuses 05's K = 1 / K = 4 runs) takes that test, its margin and its Holm family, so two claims never
give two verdicts on the same arrays. Without per-problem scores a statistical claim is inconclusive:
the point estimates are shown, never judged.

Our models are ~1000x smaller than the papers', so paper A's effects are compared as a share of the
reference gain (full GRPO's best minus the base), see ``paper.EFFECT_SHARE_A``; paper B's effects are
in nats of log-perplexity (a perplexity ratio, the same unit at any model size), see
``paper.equivalence_margin_b``. No margin is ever derived from an effect we measured to be null.
``docs/statistics.md`` holds a copy of every rule generated from this module (:func:`rules_markdown`;
a test keeps them equal).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from copes_lib import paper, regime, stats
from copes_lib.runs import RESULTS_ROOT, atomic_write_text, read_json

AGREES, PARTLY, DISAGREES, INCONCLUSIVE, MISSING = "agrees", "partly", "does not", "inconclusive", "missing"
STALE = "stale"  # the notebook's results predate those of a notebook it builds on
OPPOSITE, NOT_IN_REGIME = "opposite", "not in regime"
VERDICTS = (AGREES, PARTLY, DISAGREES, OPPOSITE, INCONCLUSIVE, NOT_IN_REGIME, STALE, MISSING)
SCORES = "_scores"  # load_summaries puts a notebook's stats.load_scores() under this key of its summary
REGION_MAP = "_region_map"  # ... and notebook 13's region_map.csv rows (dicts) under this one
WRITTEN = "_written"  # ... and the time its run ended (manifest.json's ``ended``), when it has a manifest
NO_SCORES = "inconclusive (no per-problem scores)"
DETERMINISTIC = "deterministic (analytic or one measurement): no sampling noise to test"
# Paper A's method claims and our regime predictions R2-R8 need the papers' regime (notebook 01's
# regime_criterion_met); R1 is judged on any latent-protocol base (docs/regime.md#r4-predictions-ours-registered-before-the-run).
REGIME_NOTEBOOK, REGIME_KEY = "01_substrate_and_agent", "regime_criterion_met"
REGIME_CLAIMS = ("A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8", "R2", "R3", "R4", "R5", "R6", "R7", "R8")
A2_MIN_LONG_SEEDS = 3  # A2 reads a crossing only from the mean curve of at least this many long ES seeds


@dataclasses.dataclass(frozen=True)
class Judgement:
    verdict: str
    ours: str
    power: str = ""
    reason: str = ""


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
# Which claim reads each contrast (for the reasons that name a shared test).
CONTRAST_CLAIM = {"copes_vs_es": "A1", "copes_vs_lora_grpo": "A3", "k4_vs_k1": "A4", "k4_vs_k8": "A4",
                  "k4_vs_indep_z": "A5", "k4_vs_es_2sigma": "A6", "k4_vs_es_sqrtk_alpha": "A7",
                  "copes_vs_es_f1": "A8", "router": "B2", "lifecycle": "B3", "full_vs_b3": "B4",
                  "eval_scope_with_lifecycle": "B5"}


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for arr in arrays:
        arr = np.ascontiguousarray(arr, dtype=float)
        h.update(repr(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Shared:
    """A contrast whose arrays an earlier notebook's contrast already tested."""

    notebook: str
    contrast: str

    def text(self) -> str:
        claim = CONTRAST_CLAIM.get(self.contrast)
        return (f"the same score arrays as {self.notebook}'s {self.contrast}"
                + (f" ({claim})" if claim else "") + ": one data set, tested once there (its margin, its Holm family)")


class Families:
    """Every notebook's family of tests over a profile's summaries, each data set tested once.

    Notebooks are taken in :data:`FAMILIES` order; a contrast whose (a, b) arrays are byte-identical to
    an earlier contrast's is not tested again (nor counted in its own notebook's Holm family): it
    carries the earlier test, and :meth:`shared` says which."""

    def __init__(self, summaries: dict[str, dict[str, Any]]):
        self.summaries = summaries
        self._tests: dict[str, dict[str, stats.Comparison]] = {}
        self._shared: dict[tuple[str, str], Shared] = {}
        seen: dict[str, tuple[str, str]] = {}
        for notebook in FAMILIES:
            ctx = Context(notebook, summaries, families=self)
            scores = ctx.summary.get(SCORES) or {}
            tests, aliases = [], {}
            for contrast in FAMILIES[notebook]:
                ss = scores.get(contrast.metric)
                if ss is None or contrast.a not in ss.arms or contrast.b not in ss.arms:
                    continue
                key = _digest(ss.arms[contrast.a], ss.arms[contrast.b])
                if key in seen:
                    aliases[contrast.name] = seen[key]
                    continue
                seen[key] = (notebook, contrast.name)
                effect, margin = _scales(ctx, contrast)
                tests.append(ss.compare(contrast.a, contrast.b, name=contrast.name, expected_sign=contrast.sign,
                                        margin=margin, paper_effect=effect, alpha=paper.ALPHA, power=paper.POWER))
            self._tests[notebook] = {c.name: c for c in stats.holm_family(tests)}
            for name, (first_nb, first_name) in aliases.items():
                self._tests[notebook][name] = self._tests[first_nb][first_name]
                self._shared[(notebook, name)] = Shared(first_nb, first_name)

    def family(self, notebook: str) -> dict[str, stats.Comparison]:
        return self._tests.get(notebook, {})

    def shared(self, notebook: str, contrast: str) -> Shared | None:
        return self._shared.get((notebook, contrast))

    def significant(self) -> list[tuple[str, stats.Comparison]]:
        """(notebook, comparison) of every test with Holm p < alpha, whichever way it points (shared
        data sets once)."""
        return [(nb, c) for nb, tests in self._tests.items() for name, c in tests.items()
                if (nb, name) not in self._shared and math.isfinite(c.p_holm) and c.p_holm < c.alpha]


class Context:
    """What a judge sees: its notebook's summary, every summary, and the notebook's tested family."""

    def __init__(self, notebook: str, summaries: dict[str, dict[str, Any]], families: Families | None = None):
        self.notebook, self.summaries = notebook, summaries
        self.summary = summaries.get(notebook, {})
        self._families = families

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    @property
    def families(self) -> Families:
        if self._families is None:
            self._families = Families(self.summaries)
        return self._families

    def reference_gain(self, base_key: str, reference_key: str) -> float | None:
        """reference - base from this summary, else from notebook 05's (06 shares 05's substrate)."""
        for s in (self.summary, self.summaries.get("05_fixed_budget_math", {})):
            if s.get(base_key) is not None and s.get(reference_key) is not None:
                return float(s[reference_key]) - float(s[base_key])
        return None

    def family(self) -> dict[str, stats.Comparison]:
        """The notebook's contrasts that have scores, Holm-corrected together; {} without scores."""
        return self.families.family(self.notebook)

    def shared(self, contrast: str) -> Shared | None:
        return self.families.shared(self.notebook, contrast)


def _scales(ctx: Context, contrast: Contrast) -> tuple[float | None, float | None]:
    """(the paper's effect in our units, the equivalence margin) for one contrast, or None where none.

    Paper A: the paper's effect as a share of its reference gain (``paper.EFFECT_SHARE_A``) times our
    reference gain; margin ``paper.EQUIVALENCE_FRACTION`` x that. Paper B: the paper's effect in nats
    and ``paper.equivalence_margin_b`` (from the paper's effect sizes, never from ours)."""
    if ctx.notebook in ("05_fixed_budget_math", "06_copes_ablations", "07_multihop_qa"):
        share = paper.EFFECT_SHARE_A.get(contrast.name)
        gain = (ctx.reference_gain("f1_base", "f1_full_grpo") if ctx.notebook == "07_multihop_qa"
                else ctx.reference_gain("base_val_accuracy", "full_grpo_best_val_accuracy"))
        if share is None or gain is None or gain <= 0:
            return None, None
        effect = share * gain
        return effect, paper.EQUIVALENCE_FRACTION * abs(effect)
    if ctx.notebook == "12_molora_factorial":
        return paper.PAPER_B_EFFECT_NATS.get(contrast.name), paper.equivalence_margin_b(contrast.name)
    return None, None


def _power(c: stats.Comparison, scale: float, unit: str) -> str:
    text = (f"MDE {c.mde * scale:.2g}{unit} at {c.power:.0%} power (alpha {c.alpha}/{c.family_size}); "
            f"{c.n_seeds[0]}/{c.n_seeds[1]} seeds x {c.n_problems} problems")
    if c.paper_effect is not None:
        text += f"; paper's effect here {c.paper_effect * scale:.2g}{unit}"
    if c.margin is not None:
        text += f"; equivalence margin +-{c.margin * scale:.2g}{unit}"
    return text


def _stat(c: stats.Comparison, scale: float, unit: str) -> str:
    f = lambda x: f"{x * scale:+.2g}{unit}"  # noqa: E731
    return f"{f(c.estimate)} [{f(c.low)}, {f(c.high)}], Holm p = {c.p_holm:.2g} -> {c.verdict}"


def _significant_opposite(c: stats.Comparison) -> bool:
    """Holm p < alpha with the sign the claim does not predict (whether or not every seed noise is measured)."""
    return math.isfinite(c.p_holm) and c.p_holm < c.alpha and c.estimate * c.expected_sign < 0


def _provisional(c: stats.Comparison) -> str:
    return "" if c.seed_noise_counted else "; provisional: an arm has 1 seed (its seed noise is not measured)"


def _why(c: stats.Comparison, scale: float = 1.0, unit: str = "") -> str:
    """The reason behind a test's reading, in the claim's words."""
    f = lambda x: f"{x * scale:.2g}{unit}"  # noqa: E731
    if _significant_opposite(c):
        return f"interval excludes 0 on the wrong side (Holm p = {c.p_holm:.2g}){_provisional(c)}"
    if c.verdict == stats.EFFECT:
        return f"interval excludes 0 in the predicted direction (Holm p = {c.p_holm:.2g})"
    if c.verdict == stats.EQUIVALENT:
        return f"equivalent within margin +-{f(c.margin)} (TOST p = {c.tost_p:.2g})"
    if not c.seed_noise_counted:
        return "an arm has 1 seed: its seed noise is not measured"
    if c.se == 0:
        return "no variance in the scores: the noise cannot be estimated"
    text = "interval spans 0"
    text += (f" and is not inside the margin +-{f(c.margin)}" if c.margin is not None
             else " (no equivalence margin: the paper has no effect size here)")
    return text


def _beats(c: stats.Comparison) -> str:
    """A claim that a beats b: agrees with an effect (Holm p < alpha, predicted sign); opposite when Holm
    p < alpha the other way (provisional where an arm has one seed); does not when an effect of the
    paper's size is ruled out (the interval inside +-margin: equivalence); inconclusive otherwise."""
    if _significant_opposite(c):
        return OPPOSITE
    return {stats.EFFECT: AGREES, stats.EQUIVALENT: DISAGREES}.get(c.verdict, INCONCLUSIVE)


def _no_effect(c: stats.Comparison) -> str:
    """A claim of no effect: agrees only with equivalence inside the declared margin; does not with an
    effect either way (Holm p < alpha); inconclusive otherwise."""
    return {stats.EQUIVALENT: AGREES, stats.EFFECT: DISAGREES, stats.OPPOSITE: DISAGREES}.get(c.verdict, INCONCLUSIVE)


def _shared_note(ctx: Context, contrast: str) -> str:
    shared = ctx.shared(contrast)
    return f"; {shared.text()}" if shared else ""


def _tested(contrast: str, figure: Callable[[Context], str], rule: Callable[[stats.Comparison], str] = _beats,
            scale: float = 100.0, unit: str = " pts") -> Callable[[Context], Judgement]:
    def judge(ctx: Context) -> Judgement:
        c = ctx.family().get(contrast)
        if c is None:
            return Judgement(INCONCLUSIVE, f"{figure(ctx)}; {NO_SCORES}", "no per-problem scores: no power",
                             "no per-problem scores (scores.npz) to test")
        return Judgement(rule(c), f"{figure(ctx)}; {_stat(c, scale, unit)}", _power(c, scale, unit),
                         _why(c, scale, unit) + _shared_note(ctx, contrast))
    judge.__doc__ = rule.__doc__
    return judge


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _pair(a_key: str, b_key: str) -> Callable[[Context], str]:
    return lambda ctx: f"{a_key} {_fmt(ctx[a_key])} vs {b_key} {_fmt(ctx[b_key])}"


def _recovery(metric: str, arms: tuple[str, ...], base_key: str, reference_key: str) -> Callable[[Context], str]:
    """Gain recovery of ``arms`` with an interval over every noise source the design has: the methods'
    seeds, the problems (shared by every arm) and the reference's seeds (``stats.gain_recovery_interval``);
    the point figures alone without scores."""
    def figure(ctx: Context) -> str:
        ss = (ctx.summary.get(SCORES) or {}).get(metric)
        parts = []
        for arm in arms:
            key = f"gain_recovery_{arm}"
            point = ctx.summary.get(key)
            text = f"{key} {_fmt(point)}"
            if ss is not None and all(a in ss.arms for a in (arm, "base", "full_grpo")):
                g = stats.gain_recovery_interval(ss, arm, base="base", reference="full_grpo")
                if math.isfinite(g.low) and math.isfinite(g.high):
                    text += f" [{g.low:.2g}, {g.high:.2g}]"
                else:
                    text += " [unbounded: the reference's gain is not established]"
                note = g.note
            else:
                note = ""
            parts.append(text)
        return " vs ".join(parts) + (f" ({note})" if parts and note else "")
    return figure


def _judge_es_steps(ctx: Context) -> Judgement:
    """ES's steps to reach CoPES's budget-level accuracy, as a ratio to the budget. Inconclusive unless
    A1 shows an effect (CoPES above ES at the budget; otherwise the level ES is asked to reach is not
    established above its own) and the crossing is read from the mean curve of at least
    ``A2_MIN_LONG_SEEDS`` long ES seeds. Then: validation every g steps puts the crossing in (s - g, s];
    agrees when even s - g is >= ES_STEPS_RATIO_AGREES x the budget, partly when ES surely needs more
    than the budget but surely less than that, does not when ES got there within the budget; "never
    reached" agrees only if the run went to the paper's 3x the budget (a shorter horizon cannot tell the
    paper's 3x from less)."""
    steps, budget = ctx["es_steps_to_match_copes"], ctx["budget_steps"]
    horizon, every = ctx.summary.get("es_long_steps"), ctx.summary.get("val_every")
    seeds = ctx.summary.get("es_long_n_seeds")
    need = paper.ES_STEPS_RATIO_AGREES
    power = (f"validated every {every} steps = {every / budget:.2g}x the budget" if every else
             "validation granularity not recorded (val_every)") + (f"; {seeds} ES seed(s)" if seeds else "")
    power += "; the target (CoPES's seed-mean accuracy at the budget) is taken as exact"
    if steps is None or steps < 0:
        if horizon is None:
            verdict, text = INCONCLUSIVE, "standard ES never reached CoPES's level; horizon not recorded"
            why = "the horizon of the long ES run is not recorded"
        else:
            ratio = horizon / budget
            text = f"standard ES never reached CoPES's {budget}-step level within {horizon} steps (> {ratio:.2g}x)"
            verdict = AGREES if ratio >= paper.ES_STEPS_RATIO_PAPER else INCONCLUSIVE
            why = (f"never reached within {ratio:.2g}x >= the paper's {paper.ES_STEPS_RATIO_PAPER:.2g}x"
                   if verdict == AGREES else f"never reached, but the horizon {ratio:.2g}x is short of the "
                   f"paper's {paper.ES_STEPS_RATIO_PAPER:.2g}x")
    else:
        upper = steps / budget
        lower = max(0, steps - every) / budget if every else 0.0
        text = f"{steps} steps: ratio in ({lower:.2g}, {upper:.2g}]x the {budget}-step budget"
        if upper <= 1:
            verdict, why = DISAGREES, "ES reached CoPES's level within the budget"
        elif lower >= need:
            verdict, why = AGREES, f"the crossing is surely >= {need:.2g}x the budget"
        elif lower >= 1 and upper < need:
            verdict, why = PARTLY, f"ES needs more than the budget but surely less than {need:.2g}x"
        else:
            verdict, why = INCONCLUSIVE, "the validation grid straddles a threshold"
            text += " (the validation grid straddles a threshold)"
    a1 = ctx.family().get("copes_vs_es")
    gates = []
    if a1 is None or a1.verdict != stats.EFFECT:
        gates.append("A1 shows no effect (CoPES's level is not established above ES's)" if a1 is not None
                     else "A1 has no test (no per-problem scores)")
    if not seeds or seeds < A2_MIN_LONG_SEEDS:
        gates.append(f"{seeds or 0} long ES seed(s) (the rule needs >= {A2_MIN_LONG_SEEDS})")
    if gates:
        return Judgement(INCONCLUSIVE, text, power, "; ".join(gates) + f" (the data alone would read {verdict})")
    return Judgement(verdict, text, power, why)


def _judge_k_sweep(ctx: Context) -> Judgement:
    """agrees: K = 4 beats K = 1 and K = 8 (both effects after Holm); partly: one of them; opposite: no
    win and at least one significant opposite; does not: no win and at least one effect of the paper's
    size ruled out (equivalence); inconclusive otherwise. K = 4 vs K = 1 is 05's CoPES vs ES when the
    arrays are the same (one data set, one test: A1's)."""
    figure = " ".join(f"K={k} {_fmt(ctx[f'val_accuracy_k{k}'])}" for k in (1, 4, 8))
    names = ("k4_vs_k1", "k4_vs_k8")
    tests = [ctx.family().get(n) for n in names]
    if None in tests:
        return Judgement(INCONCLUSIVE, f"{figure}; {NO_SCORES}", "no per-problem scores: no power",
                         "no per-problem scores (scores.npz) to test")
    readings = [_beats(c) for c in tests]
    wins = readings.count(AGREES)
    verdict = (AGREES if wins == 2 else PARTLY if wins == 1 else OPPOSITE if OPPOSITE in readings
               else DISAGREES if DISAGREES in readings else INCONCLUSIVE)
    text = f"{figure}; K4-K1 {_stat(tests[0], 100, ' pts')}; K4-K8 {_stat(tests[1], 100, ' pts')}"
    why = "; ".join(f"K4-{n[-2:].upper()}: {_why(c, 100, ' pts')}{_shared_note(ctx, n)}"
                    for n, c in zip(names, tests, strict=True))
    return Judgement(verdict, text, " | ".join(_power(c, 100, " pts") for c in tests), why)


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
            return Judgement(INCONCLUSIVE, text, DETERMINISTIC,
                             "the exact-GiB convention matches too: the check cannot tell them apart")
    n_close = sum(close)
    return Judgement(AGREES if all(close) else PARTLY if any(close) else DISAGREES, text, DETERMINISTIC,
                     f"{n_close} of 3 figures round to the paper's printed GiB")


def _judge_feasibility(ctx: Context) -> Judgement:
    """agrees: ES at 128K fits 24 GB and full GRPO does not (analytic memory); does not otherwise."""
    es, grpo = ctx["qwen35_4b_es_gib_at_128k"], ctx["qwen35_4b_full_grpo_gib_at_128k"]
    text = f"ES {es:.1f} GiB vs full GRPO {grpo:.1f} GiB at 128K"
    fits = es <= 24 < grpo
    return Judgement(AGREES if fits else DISAGREES, text, DETERMINISTIC,
                     "ES fits 24 GB and full GRPO does not" if fits else "the 24 GB split is not as the paper's")


def _judge_ratio(ctx: Context) -> Judgement:
    """The measured / predicted GRPO-to-ES peak-memory ratio: agrees within 25%, partly within 50%, does not beyond."""
    measured, predicted = ctx["measured_grpo_to_es_peak_ratio"], ctx["predicted_grpo_to_es_peak_ratio"]
    rel = abs(measured - predicted) / predicted
    text = f"measured {measured:.3g}x vs predicted {predicted:.3g}x"
    return Judgement(AGREES if rel <= 0.25 else PARTLY if rel <= 0.5 else DISAGREES, text,
                     "one memory measurement per method (tensor bytes are deterministic)",
                     f"relative error {rel:.0%} (agrees <= 25%, partly <= 50%)")


def _judge_collapse(ctx: Context) -> Judgement:
    """agrees: the softmax router (R0) puts 90% of the gate mass on <= the paper's 4 slots and the sigmoid
    router (R1) spreads it over more; partly: R1 spreads wider but R0 does not collapse; does not otherwise."""
    r0, r1 = ctx["monopoly_slots_r0"], ctx["monopoly_slots_r1"]
    text = f"R0 {r0} slots, R1 {r1} slots carry 90% of the gate mass"
    power = "a count from one run per router: no noise model"
    if r0 <= paper.MONOPOLY_SLOTS_R0 and r1 > r0:
        return Judgement(AGREES, text, power, f"R0 collapses to <= {paper.MONOPOLY_SLOTS_R0} slots, R1 spreads wider")
    return Judgement(PARTLY if r1 > r0 else DISAGREES, text, power,
                     f"R0 uses {r0} slots (> the paper's {paper.MONOPOLY_SLOTS_R0}: no monopoly)"
                     + ("; R1 spreads wider" if r1 > r0 else "; R1 does not spread wider"))


def _nats(key: str) -> Callable[[Context], str]:
    return lambda ctx: f"summary Delta {ctx[key]:+.4f} nats"


def _judge_sandbox_grid(ctx: Context) -> Judgement:
    """(Without 13's map.) Evolution helps in a regime when evolution - gradient excess loss is an effect
    below 0 (Holm over the four regimes). agrees: helps with pre-aligned adapters and nowhere else;
    partly: pre-aligned and elsewhere too; does not: not with pre-aligned adapters; inconclusive: the
    pre-aligned test cannot tell."""
    regimes = ("prealigned", "random", "misaligned", "cotrained")
    figure = "evo - grad excess loss " + ", ".join(
        f"{r} {ctx[f'evo_minus_grad_excess_loss_{r}']:+.3g}" for r in regimes)
    tests = {r: ctx.family().get(f"evo_vs_grad_{r}") for r in regimes}
    if any(c is None for c in tests.values()):
        return Judgement(INCONCLUSIVE, f"{figure}; {NO_SCORES}", "no per-problem scores: no power",
                         "no per-problem scores (scores.npz) to test")
    pre = tests["prealigned"].verdict
    elsewhere = [r for r in regimes[1:] if tests[r].verdict == stats.EFFECT]
    verdict = (INCONCLUSIVE if pre == stats.INCONCLUSIVE else DISAGREES if pre != stats.EFFECT
               else PARTLY if elsewhere else AGREES)
    text = f"{figure}; pre-aligned {_stat(tests['prealigned'], 1, '')}; elsewhere: " + ", ".join(
        tests[r].verdict for r in regimes[1:])
    why = f"at the grid point: pre-aligned {_why(tests['prealigned'])}" + (
        f"; evolution also wins {', '.join(elsewhere)}" if elsewhere else "")
    return Judgement(verdict, text, _power(tests["prealigned"], 1, ""), why)


def _cells_text(cells: list[dict[str, Any]]) -> str:
    """'noise 0, 0.05; budgets 300-3000' for a set of map cells."""
    if not cells:
        return "no cell"
    noise = sorted({float(c["adapter_noise"]) for c in cells})
    budgets = sorted({int(float(c["budget_evals"])) for c in cells})
    b = f"{budgets[0]}" if len(budgets) == 1 else f"{budgets[0]}-{budgets[-1]}"
    return f"noise {', '.join(f'{x:g}' for x in noise)} at budgets {b} ({len(cells)} cells)"


def _judge_sandbox(ctx: Context) -> Judgement:
    """Decided from notebook 13's region map (``region_map.csv``: evolution - gradient per alignment x
    adapter noise x budget cell, each cell's outcome win / loss / tie from its seeds). Pre-aligned = the
    map's highest alignment. agrees: evolution wins in every pre-aligned cell and in no other; partly:
    it wins only in pre-aligned cells but not in all of them (the reason says where it holds and where it
    fails), or in pre-aligned cells and elsewhere too; does not: it wins in no pre-aligned cell. Without
    the map: the four regimes at the notebook's grid point (:func:`_judge_sandbox_grid`)."""
    cells = ctx.summary.get(REGION_MAP)
    if not cells:
        return _judge_sandbox_grid(ctx)
    top = max(float(c["alignment"]) for c in cells)
    pre = [c for c in cells if float(c["alignment"]) == top]
    other = [c for c in cells if float(c["alignment"]) != top]
    win_pre = [c for c in pre if c["outcome"] == "win"]
    fail_pre = [c for c in pre if c["outcome"] != "win"]
    win_other = [c for c in other if c["outcome"] == "win"]
    text = (f"map: evolution beats gradient in {len(win_pre) + len(win_other)} of {len(cells)} cells; "
            f"pre-aligned (alignment {top:g}) {len(win_pre)} of {len(pre)}, elsewhere {len(win_other)} of {len(other)}")
    power = "each cell's outcome from its seeds' interval (notebook 13: win / loss / tie)"
    holds = f"holds where alignment {top:g}, {_cells_text(win_pre)}"
    fails = f"fails where alignment {top:g}, {_cells_text(fail_pre)}"
    if not win_pre:
        return Judgement(DISAGREES, text, power, f"evolution wins in no pre-aligned cell ({len(pre)} cells)"
                         + (f"; it wins elsewhere at {len(win_other)} cell(s)" if win_other else ""))
    if win_other:
        alignments = sorted({float(c["alignment"]) for c in win_other})
        return Judgement(PARTLY, text, power, f"{holds}; but evolution also wins below pre-aligned (alignment "
                         f"{', '.join(f'{a:g}' for a in alignments)}): the 'only' fails")
    if fail_pre:
        return Judgement(PARTLY, text, power, f"{holds}; {fails}; no win elsewhere")
    return Judgement(AGREES, text, power, f"evolution wins in every pre-aligned cell and in no other ({len(cells)} cells)")


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
          _tested("copes_vs_es", _recovery("val_accuracy_at_budget", ("copes", "es"), "base_val_accuracy",
                                           "full_grpo_best_val_accuracy"))),
    Claim("A2", "A", "Standard ES needs about 3x the steps to reach CoPES's budget-level validation accuracy",
          "48 vs 16 steps", "05_fixed_budget_math", ("es_steps_to_match_copes", "budget_steps"),
          _judge_es_steps, none_means=("es_steps_to_match_copes",)),
    Claim("A3", "A", "At the same budget CoPES beats LoRA-GRPO", "91.8% vs 57.7% gain recovery",
          "05_fixed_budget_math", ("gain_recovery_copes", "gain_recovery_lora_grpo"),
          _tested("copes_vs_lora_grpo", _recovery("val_accuracy_at_budget", ("copes", "lora_grpo"),
                                                  "base_val_accuracy", "full_grpo_best_val_accuracy"))),
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
                         "direction only: one checkpoint per method, no per-problem test",
                         "direction only (at best partly): " + ("higher" if a > b else "not higher"))
    judge.__doc__ = "A per-benchmark row without per-problem scores: the direction alone, so at best partly."
    return judge


def _judge_largest_gap(ctx: Context) -> Judgement:
    """Notebook 09, our own question: at the largest size, CoPES (paper protocol) vs ES with the
    notebook's seeds x problems test (stats.compare): effect -> agrees, opposite -> opposite, else
    inconclusive."""
    tag = ctx["largest_size_tag"]
    verdict = ctx.summary.get(f"copes_paper_minus_es_verdict_{tag}")
    estimate = ctx.summary.get(f"copes_paper_minus_es_{tag}")
    low, high = ctx.summary.get(f"copes_paper_minus_es_low_{tag}"), ctx.summary.get(f"copes_paper_minus_es_high_{tag}")
    if verdict is None or estimate is None:
        return Judgement(MISSING, f"no CoPES - ES comparison for size {tag}", "", f"no test recorded for size {tag}")
    interval = f" [{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None and high is not None else ""
    text = f"{tag} ({_fmt(ctx.summary.get(f'n_params_{tag}'))} parameters): {100 * estimate:+.1f} points{interval}"
    mapped = {stats.EFFECT: AGREES, stats.OPPOSITE: OPPOSITE}.get(verdict, INCONCLUSIVE)
    why = {AGREES: "interval excludes 0 in the predicted direction", OPPOSITE: "interval excludes 0 on the wrong side"
           }.get(mapped, "interval spans 0" if low is not None and low <= 0 <= (high or 0) else f"09's test: {verdict}")
    return Judgement(mapped, f"{text} ({verdict})", ctx.summary.get("power_note", ""), why)


def _judge_slope(metric: str, what: str) -> Callable[[Context], Judgement]:
    """A trend over sizes: the least-squares line of the per-size estimates ``<metric>_<size>`` in
    log10(parameters), with the slope's 95% interval from the per-size 95% intervals
    (``<metric>_low_<size>`` / ``_high_<size>``; sizes are independent models, so their variances
    add). Rising interval above 0 -> agrees, below 0 -> opposite, else inconclusive; fewer than 3 sizes
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
                             "gain recovery needs a positive full-GRPO gain at a size",
                             f"{defined}: a trend needs 3")
        slope, _, low, high = stats.slope_interval(*zip(*points))
        text = (f"{what}: slope {_fmt(slope)} per decade of parameters [{_fmt(low)}, {_fmt(high)}], "
                f"{defined}")
        power = (f"95% interval of the slope from the per-size 95% intervals (seeds x problems each); "
                 f"half-width {_fmt((high - low) / 2)} per decade")
        verdict = AGREES if low > 0 else OPPOSITE if high < 0 else INCONCLUSIVE
        why = {AGREES: "slope interval above 0", OPPOSITE: "slope interval below 0 (the other way)"}.get(
            verdict, "slope interval spans 0")
        return Judgement(verdict, text, power, why)
    judge.__doc__ = _judge_slope.__doc__
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


# --------------------------------------------------------------------------- our registered predictions
# Four sets of our own predictions, each registered in docs/ before the runs that test it: the regime
# predictions R1-R8 (docs/regime.md#r4-predictions-ours-registered-before-the-run, machine-readable as
# regime.PREDICTIONS), paper B's regime predictions P1-P6 (docs/molora_regime.md#m5-predictions), the
# mechanism rules (docs/mechanism.md#m2-predictions-and-rules, #m3-the-4b-extrapolation-rule) and L4, low
# rank on 09's map (docs/lowrank_es.md#l4-low-rank-on-the-map). Their rows read paper "ours". Each judge applies the registered rule to the registered quantity; none of them
# adds a test to a notebook's Holm family (each prediction registered its own interval).
OURS = "ours"
# R2-R8: notebook -> the predictions whose quantity it writes as prediction_<Rk>_value / _low / _high
REGIME_PREDICTION_NOTEBOOKS = {"R3": "05_fixed_budget_math", "R4": "05_fixed_budget_math",
                               "R8": "05_fixed_budget_math", "R2": "09_scale_study", "R5": "09_scale_study",
                               "R6": "09_scale_study", "R7": "09_scale_study"}
_RULE = re.compile(r"^(?:(?P<slope>slope )?interval (?P<end>upper|lower) bound )?(?P<op><=|>=|<|>) (?P<x>-?[0-9.]+)$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def parse_rule(rule: str) -> tuple[str, str, float]:
    """A registered threshold ("interval upper bound < 0.03", "slope interval lower bound > 0", "<= 0.05")
    as (which statistic: value / low / high, operator, threshold).

    >>> parse_rule("interval upper bound < 0.03"), parse_rule("<= 0.05")
    (('high', '<', 0.03), ('value', '<=', 0.05))
    """
    m = _RULE.match(rule.strip())
    if m is None:
        raise ValueError(f"rule {rule!r} is not of the form '[slope ]interval upper|lower bound <op> x' or '<op> x'")
    end = {"upper": "high", "lower": "low", None: "value"}[m["end"]]
    return end, m["op"], float(m["x"])


def _holds(rule: str, stat: dict[str, float]) -> tuple[bool, str]:
    end, op, x = parse_rule(rule)
    value = stat[end]
    what = {"high": "upper bound", "low": "lower bound", "value": "value"}[end]
    return _OPS[op](value, x), f"{what} {value:.3g} {op if _OPS[op](value, x) else 'not ' + op} {x:g}"


def _judge_prediction(pred: regime.Prediction, notebook: str) -> Callable[[Context], Judgement]:
    keys = [f"prediction_{pred.prediction_id}_{part}" for part in ("value", "low", "high")]

    def judge(ctx: Context) -> Judgement:
        value, low, high = (ctx.summary.get(k) for k in keys)
        power = "the notebook's 95% interval (seeds x problems, docs/statistics.md#s2-two-sources-of-noise)"
        if any(v is None or not math.isfinite(float(v)) for v in (value, low, high)):
            return Judgement(INCONCLUSIVE, f"{pred.quantity}: undefined ({', '.join(keys)} = "
                             f"{', '.join(_fmt(v) for v in (value, low, high))})", power,
                             f"{notebook} wrote the keys but the quantity is undefined there")
        stat = {"value": float(value), "low": float(low), "high": float(high)}
        text = f"{pred.quantity}: {stat['value']:.3g} [{stat['low']:.3g}, {stat['high']:.3g}]"
        agrees, why_a = _holds(pred.agrees_if, stat)
        disagrees, why_d = _holds(pred.disagrees_if, stat)
        if agrees:
            return Judgement(AGREES, text, power, f"{why_a} (agrees if {pred.agrees_if})")
        if disagrees:
            return Judgement(DISAGREES, text, power, f"{why_d} (does not if {pred.disagrees_if})")
        return Judgement(INCONCLUSIVE, text, power, f"neither: {why_a}, {why_d} (agrees if {pred.agrees_if}; "
                         f"does not if {pred.disagrees_if})")
    judge.__doc__ = (f"Registered rule (regime.PREDICTIONS): on {notebook}'s prediction_{pred.prediction_id}_value / "
                     f"_low / _high ({pred.quantity}): agrees if {pred.agrees_if}; does not if {pred.disagrees_if}; "
                     "inconclusive otherwise or where the quantity is undefined (None); not in regime when 01's "
                     "regime_criterion_met is false.")
    return judge


def _judge_r1(ctx: Context) -> Judgement:
    """Registered rule (regime.judge_r1) on 01's regime_math_strict_accuracy (greedy, whole validation
    split): agrees if <= 0.05; does not if > 0.15; inconclusive between; not in regime where the base is
    not a latent-protocol one (warm_protocol is not latent). Judged in regime or not (its quantity is one of
    the criterion's own values); 01's own reading (prediction_R1) is shown and must be the same."""
    strict, protocol = float(ctx["regime_math_strict_accuracy"]), ctx["warm_protocol"]
    reading = regime.judge_r1(strict, protocol == "latent")
    recorded = ctx.summary.get("prediction_R1")
    text = f"strict math accuracy of 01's base {strict:.3g} (warm_protocol {protocol}, p = " \
           f"{_fmt(ctx.summary.get('warm_latent_p'))})"
    note = "" if recorded in (None, reading) else f"; NOTE: 01 recorded prediction_R1 = {recorded!r}"
    power = "one greedy evaluation of the base on the validation split"
    if protocol != "latent":
        return Judgement(NOT_IN_REGIME, text, power, f"not a latent-protocol base (warm_protocol {protocol}): "
                         f"R1 is a prediction about a latent-protocol base{note}")
    why = {AGREES: "<= 0.05", DISAGREES: "> 0.15"}.get(reading, "between 0.05 and 0.15")
    return Judgement(reading, text, power, f"strict accuracy {strict:.3g} {why}{note}")


def _regime_prediction_claims() -> tuple[Claim, ...]:
    rows = []
    for pred in regime.PREDICTIONS:
        if pred.prediction_id == "R1":
            rows.append(Claim("R1", OURS, f"(ours) {pred.statement}", "registered, docs/regime.md R4",
                              REGIME_NOTEBOOK, ("regime_math_strict_accuracy", "warm_protocol"), _judge_r1))
            continue
        nb = REGIME_PREDICTION_NOTEBOOKS[pred.prediction_id]
        keys = tuple(f"prediction_{pred.prediction_id}_{part}" for part in ("value", "low", "high"))
        rows.append(Claim(pred.prediction_id, OURS, f"(ours) {pred.statement}", "registered, docs/regime.md R4",
                          nb, keys, _judge_prediction(pred, nb), none_means=keys))
    return tuple(rows)


REGIME_PREDICTION_CLAIMS = _regime_prediction_claims()

# ---- paper B's regime (notebooks 11 and 12): P1-P6
P_MOLORA_REGIME = ("P4", "P5", "P6")  # read "not in regime" where P3 fails (docs/molora_regime.md#m5-predictions)
MOLORA_REGIME_KEY = "r0_collapsed_in_collapsing_setting"
_READING = {"holds": AGREES, "fails": DISAGREES, "not in regime": NOT_IN_REGIME, "not on the grid": INCONCLUSIVE}


def _judge_p1(ctx: Context) -> Judgement:
    """R0's monopoly count rises by at most 1 slot from each grid value to the next larger one, along the
    learning rate, the input scale and the steps (11's prediction_p1_monotone, one seed): agrees if it
    holds; does not if any step rises by more (the reason names where, from p1_rises)."""
    reading = ctx["prediction_p1_monotone"]
    rises = ctx.summary.get("p1_rises") or ""
    verdict = _READING.get(reading, INCONCLUSIVE)
    why = {AGREES: "no count rose by more than 1 slot", DISAGREES: f"rises by more than 1 slot: {rises}"}.get(
        verdict, f"11's reading {reading!r}")
    return Judgement(verdict, f"11's map: {reading}" + (f" ({rises})" if rises else ""),
                     "counts from one run per map cell (one seed): no noise model", why)


def _judge_p2(ctx: Context) -> Judgement:
    """At the paper-matched learning rate (x 25,000 / steps) and input scale 1, R0 is not collapsed
    (m > S / 4): agrees if 11's monopoly_slots_r0_paper_matched > n_slots / 4; does not if <= (collapsed);
    inconclusive where that setting was not on the grid. 11's own reading is shown and must match."""
    reading = ctx["prediction_p2_paper_budget_alone_no_collapse"]
    m, slots = ctx.summary.get("monopoly_slots_r0_paper_matched"), ctx.summary.get("n_slots")
    lr_x = ctx.summary.get("paper_matched_router_lr_x")
    power = "one run (one seed): no noise model"
    if m is None or slots is None:
        return Judgement(INCONCLUSIVE, f"11's reading: {reading}", power,
                         "the paper-matched setting is not on the map's grid" if reading == "not on the grid"
                         else "monopoly_slots_r0_paper_matched or n_slots not recorded")
    verdict = AGREES if m > slots / 4 else DISAGREES
    note = "" if _READING.get(reading) == verdict else f"; NOTE: 11 read {reading!r}"
    return Judgement(verdict, f"R0 at lr x{_fmt(lr_x)}, input scale 1: {m} of {slots} slots carry 90%", power,
                     (f"m = {m} > {slots}/4: not collapsed" if verdict == AGREES else
                      f"m = {m} <= {slots}/4: collapsed") + note)


def _judge_p3(ctx: Context) -> Judgement:
    """At the collapsing setting (12's collapse_router_lr_x x the router rate, collapse_input_scale x R0's
    input) the B3 (collapsing) cells of a majority of seeds are collapsed (m <= S / 4; 3 of the cpu
    profile's 5): agrees if so (12's r0_collapsed_in_collapsing_setting), does not otherwise; then P4-P6
    read "not in regime"."""
    collapsed, seeds = ctx["collapsed_seeds_b3_collapsing"], ctx.summary.get("n_seeds")
    met = bool(ctx[MOLORA_REGIME_KEY])
    text = (f"B3 (collapsing) collapsed in {collapsed} of {_fmt(seeds)} seeds (mean m "
            f"{_fmt(ctx.summary.get('monopoly_slots_b3_collapsing'))}) at lr x{_fmt(ctx.summary.get('collapse_router_lr_x'))}, "
            f"input x{_fmt(ctx.summary.get('collapse_input_scale'))}")
    return Judgement(AGREES if met else DISAGREES, text, "a count over the factorial's seeds",
                     "a majority of seeds collapsed" if met else "no majority of seeds collapsed (m <= S/4)")


def _judge_interval(key: str, predicted: str, threshold: float, what: str, reading_key: str
                    ) -> Callable[[Context], Judgement]:
    """(``predicted`` "above": the registered reading holds when the 95% paired t-interval's lower end is
    above ``threshold``; "below": when its upper end is below it.)"""
    def judge(ctx: Context) -> Judgement:
        delta, low, high = ctx[key], ctx[f"{key}_low"], ctx[f"{key}_high"]
        p = ctx.summary.get(f"p_{key[len('delta_'):]}")
        n = ctx.summary.get("n_seeds")
        text = f"{what} {delta:+.4f} nats [{low:+.4f}, {high:+.4f}]" + (f", p = {p:.2g}" if p is not None else "")
        power = f"95% paired t-interval over {_fmt(n)} seeds (factorial.paired_test; not Holm-corrected: as registered)"
        if predicted == "above":
            verdict = AGREES if low > threshold else DISAGREES if high <= threshold else INCONCLUSIVE
        else:
            verdict = AGREES if high < threshold else DISAGREES if low >= threshold else INCONCLUSIVE
        why = {AGREES: f"the interval is {predicted} {threshold:g}",
               DISAGREES: f"the whole interval is on the other side of {threshold:g}"}.get(
            verdict, f"the interval straddles {threshold:g}: 12 reads {ctx.summary.get(reading_key)!r}, "
                     "the data do not rule the prediction out")
        regime_met = ctx.summary.get(MOLORA_REGIME_KEY)
        if regime_met is False:
            return Judgement(NOT_IN_REGIME, text, power, f"P3 fails ({MOLORA_REGIME_KEY} is false): the contrast does "
                             f"not test the paper's mechanism; the data alone would read {verdict} ({why})")
        return Judgement(verdict, text, power, why)
    judge.__doc__ = (f"Registered rule: agrees if the 95% paired t-interval of {key} (over seeds) is {predicted} "
                     f"{threshold:g}; does not if the whole interval is on the other side; inconclusive if it straddles "
                     f"{threshold:g} (12's binary reading {reading_key} counts that as fails: shown in the reason); "
                     "not in regime where P3 fails.")
    return judge


_P = "registered, docs/molora_regime.md M5"
MOLORA_PREDICTION_CLAIMS: tuple[Claim, ...] = (
    Claim("P1", OURS, "(ours) Along each axis of 11's map (router rate, input scale, steps) R0's monopoly count "
          "does not rise by more than 1 slot", _P, "11_molora_router", ("prediction_p1_monotone",), _judge_p1),
    Claim("P2", OURS, "(ours) The paper's budget alone is not enough: at the paper-matched router rate and input "
          "scale 1, R0 does not collapse", _P, "11_molora_router", ("prediction_p2_paper_budget_alone_no_collapse",),
          _judge_p2),
    Claim("P3", OURS, "(ours) The collapsing setting is in regime: R0 collapses there in a majority of seeds", _P,
          "12_molora_factorial", ("collapsed_seeds_b3_collapsing", MOLORA_REGIME_KEY), _judge_p3),
    Claim("P4", OURS, "(ours) The router rewrite helps where R0 collapses (Delta_R,c > 0)", _P, "12_molora_factorial",
          ("delta_router_collapsing", "delta_router_collapsing_low", "delta_router_collapsing_high"),
          _judge_interval("delta_router_collapsing", "above", 0.0, "Delta_R,c",
                          "prediction_p4_router_helps_where_collapsed")),
    Claim("P5", OURS, "(ours) The rewrite helps more where R0 collapses than at the defaults (Delta_R,c - Delta_R > 0)",
          _P, "12_molora_factorial", ("delta_router_collapsing_minus_default", "delta_router_collapsing_minus_default_low",
                                      "delta_router_collapsing_minus_default_high"),
          _judge_interval("delta_router_collapsing_minus_default", "above", 0.0, "Delta_R,c - Delta_R",
                          "prediction_p5_more_than_default")),
    Claim("P6", OURS, "(ours) But far less than the paper's: Delta_R,c's upper end is below 0.01 nats", _P,
          "12_molora_factorial", ("delta_router_collapsing", "delta_router_collapsing_low", "delta_router_collapsing_high"),
          _judge_interval("delta_router_collapsing", "below", 0.01, "Delta_R,c", "prediction_p6_below_0p01_nats")),
)

# ---- the mechanism rules (notebook 09, per size)
MECH_UPDATES = ("es", "copes_paper")


def _size_verdicts(ctx: Context, key: str) -> dict[str, str]:
    return {t: ctx.summary[f"{key}_{t}"] for t in (ctx.summary.get("sizes") or [])
            if ctx.summary.get(f"{key}_{t}") is not None}


def _mech_missing(keys: list[str]) -> Judgement:
    return Judgement(MISSING, f"not yet measured ({', '.join(f'{k}_<size>' for k in keys)})", "",
                     f"09_scale_study's summary lacks {', '.join(f'{k}_<size>' for k in keys)} at every size")


def _per_size(readings: dict[str, str], good: tuple[str, ...], bad: tuple[str, ...], sizes: list[str],
              text: str, power: str, extra: dict[str, str] | None = None) -> Judgement:
    """agrees if every size reads ``good``; does not if any reads ``bad``; inconclusive otherwise (a size
    undecided or unmeasured), each size's reading and why in the reason."""
    extra = extra or {}
    parts = [f"{t}: {readings.get(t, 'not measured')}{extra.get(t, '')}" for t in sizes]
    if any(readings.get(t) in bad for t in sizes):
        return Judgement(DISAGREES, text, power, "; ".join(parts))
    if sizes and all(readings.get(t) in good for t in sizes):
        return Judgement(AGREES, text, power, "; ".join(parts))
    return Judgement(INCONCLUSIVE, text, power, "; ".join(parts))


_MECH_POWER = "per size: MECH_RANDOM random directions (permutation p_tail), one base (docs/mechanism.md#m1-what-is-measured)"


def _judge_mech_power(ctx: Context) -> Judgement:
    """Rule 1 at every size (09's mech_power_verdict_<size>): agrees if every size where full GRPO gained
    reads powered (the GRPO direction's p_tail < 0.05); does not if any reads unpowered; inconclusive where no
    size has a reference (GRPO did not gain, or its gradient is zero)."""
    v = _size_verdicts(ctx, "mech_power_verdict")
    if not v:
        return _mech_missing(["mech_power_verdict"])
    ref = [t for t in ctx["sizes"] if v.get(t) != "no reference"]
    p = {t: f" (p_tail {_fmt(ctx.summary.get(f'mech_grpo_p_tail_{t}'))})" for t in ctx["sizes"]}
    text = ", ".join(f"{t} {v.get(t, 'not measured')}" for t in ctx["sizes"])
    if not [t for t in ref if t in v]:
        return Judgement(INCONCLUSIVE, text, _MECH_POWER, "no size has a reference (GRPO did not gain or its "
                         "gradient is zero): " + "; ".join(f"{t}: {v.get(t, 'not measured')}" for t in ctx["sizes"]))
    return _per_size(v, ("powered",), ("unpowered",), ref, text, _MECH_POWER, p)


def _judge_mech_chance(ctx: Context) -> Judgement:
    """Rule 2 at every size, ES and CoPES (mech_<update>_chance_verdict_<size>): does not if any update beats
    chance (p_tail < 0.05); agrees if every update is at chance at every size AND rule 1 reads powered
    there (where it is unpowered or has no reference, "at chance" is not evidence: inconclusive, the
    reason says "unpowered"); inconclusive also where an update is undefined (zero)."""
    per = {u: _size_verdicts(ctx, f"mech_{u}_chance_verdict") for u in MECH_UPDATES}
    if not any(per.values()):
        return _mech_missing([f"mech_{u}_chance_verdict" for u in MECH_UPDATES])
    sizes, power = ctx["sizes"], _size_verdicts(ctx, "mech_power_verdict")
    readings = {}
    for t in sizes:
        vs = [per[u].get(t) for u in MECH_UPDATES]
        if "beats chance" in vs:
            readings[t] = "beats chance"
        elif all(x == "at chance" for x in vs):
            readings[t] = "at chance" if power.get(t) == "powered" else f"at chance but {power.get(t, 'power not measured')}"
        else:
            readings[t] = "undecided (" + ", ".join(f"{u} {per[u].get(t, 'not measured')}" for u in MECH_UPDATES) + ")"
    text = "; ".join(f"{t}: " + ", ".join(f"{u} {per[u].get(t, 'not measured')}" for u in MECH_UPDATES) for t in sizes)
    return _per_size(readings, ("at chance",), ("beats chance",), sizes, text, _MECH_POWER)


def _judge_mech_bound(ctx: Context) -> Judgement:
    """Rule 3 at every size, ES and CoPES (mech_<update>_bound_verdict_<size>): agrees if every update is
    within bound (z <= sqrt(rho^2_high N) + 1.96) at every size; does not if any is above bound;
    inconclusive otherwise (undefined: no bound or no z)."""
    per = {u: _size_verdicts(ctx, f"mech_{u}_bound_verdict") for u in MECH_UPDATES}
    if not any(per.values()):
        return _mech_missing([f"mech_{u}_bound_verdict" for u in MECH_UPDATES])
    sizes = ctx["sizes"]
    readings = {t: ("above bound" if "above bound" in vs else "within bound" if all(x == "within bound" for x in vs)
                    else "undefined") for t in sizes for vs in [[per[u].get(t) for u in MECH_UPDATES]]}
    extra = {t: f" (z ES {_fmt(ctx.summary.get(f'mech_es_z_{t}'))}, CoPES {_fmt(ctx.summary.get(f'mech_copes_paper_z_{t}'))}"
                f" vs Z* {_fmt(ctx.summary.get(f'mech_z_bound_{t}'))})" for t in sizes}
    text = "; ".join(f"{t}: " + ", ".join(f"{u} {per[u].get(t, 'not measured')}" for u in MECH_UPDATES) for t in sizes)
    return _per_size(readings, ("within bound",), ("above bound",), sizes, text, _MECH_POWER, extra)


def _judge_mech_copes_vs_es(ctx: Context) -> Judgement:
    """Rule 4 at every size (mech_copes_vs_es_verdict_<size>): agrees if every size reads tie (|z_CoPES -
    z_ES| <= 1.96 sqrt(2)); does not if any reads CoPES higher or ES higher; inconclusive otherwise. Rule 1's
    reading is shown beside it (a tie of two updates at chance where the test is unpowered says little)."""
    v = _size_verdicts(ctx, "mech_copes_vs_es_verdict")
    if not v:
        return _mech_missing(["mech_copes_vs_es_verdict"])
    sizes, power = ctx["sizes"], _size_verdicts(ctx, "mech_power_verdict")
    extra = {t: f" (rule 1: {power.get(t, 'not measured')})" for t in sizes}
    text = ", ".join(f"{t} {v.get(t, 'not measured')}" for t in sizes)
    return _per_size(v, ("tie",), ("CoPES higher", "ES higher"), sizes, text, _MECH_POWER, extra)


def _judge_mech_efficiency(ctx: Context) -> Judgement:
    """Rule 5 at every size (mech_efficiency_verdict_<size>): agrees if every size reads consistent or ES below
    prediction (E_pred = rho^2_high N / (d_eff + N - 1) in or above E_meas's 95% interval); does not if any
    reads ES above prediction; inconclusive otherwise (undefined: E_meas or d_eff undefined)."""
    v = _size_verdicts(ctx, "mech_efficiency_verdict")
    if not v:
        return _mech_missing(["mech_efficiency_verdict"])
    sizes = ctx["sizes"]
    extra = {t: f" (E_pred {_fmt(ctx.summary.get(f'mech_predicted_efficiency_{t}'))}, E_meas "
                f"[{_fmt(ctx.summary.get(f'mech_measured_efficiency_low_{t}'))}, "
                f"{_fmt(ctx.summary.get(f'mech_measured_efficiency_high_{t}'))}])" for t in sizes}
    text = ", ".join(f"{t} {v.get(t, 'not measured')}" for t in sizes)
    return _per_size(v, ("consistent", "ES below prediction"), ("ES above prediction",), sizes, text,
                     "E_meas: a t-interval over ES's seeds (GRPO's gain taken as known); E_pred an upper bound", extra)


MECH_MIN_FIT_POINTS = 4  # docs/mechanism.md#m3-the-4b-extrapolation-rule


def _judge_mech_extrapolation(ctx: Context) -> Judgement:
    """The 4B extrapolation rule, for every metric 09 fits (<metric>_extrapolation_allowed): a 4B value
    (<metric>_extrapolated_4b) is shown exactly where at least 4 sizes have the metric with an interval
    (_fit_points) and the slope's 95% interval (_slope_low, _slope_high) excludes 0. agrees if every
    metric obeys it; does not if any shows a 4B value the rule does not allow (or hides one it allows)."""
    metrics = sorted(k[: -len("_extrapolation_allowed")] for k in ctx.summary if k.endswith("_extrapolation_allowed"))
    if not metrics:
        return Judgement(MISSING, "not yet measured (<metric>_extrapolation_allowed)", "",
                         "09_scale_study's summary lacks <metric>_extrapolation_allowed")
    broken, allowed = [], []
    for m in metrics:
        s = ctx.summary
        low, high, points = s.get(f"{m}_slope_low"), s.get(f"{m}_slope_high"), s.get(f"{m}_fit_points") or 0
        ok = (points >= MECH_MIN_FIT_POINTS and low is not None and high is not None and (low > 0 or high < 0))
        shown = s.get(f"{m}_extrapolated_4b") is not None
        if ok:
            allowed.append(m)
        if shown != ok or bool(s.get(f"{m}_extrapolation_allowed")) != ok:
            broken.append(f"{m} ({points} points, slope [{_fmt(low)}, {_fmt(high)}], 4B value "
                          f"{'shown' if shown else 'hidden'})")
    text = (f"4B value allowed for {len(allowed)} of {len(metrics)} metrics"
            + (f" ({', '.join(allowed)})" if allowed else ""))
    if broken:
        return Judgement(DISAGREES, text, DETERMINISTIC, "the rule is not followed for " + "; ".join(broken))
    return Judgement(AGREES, text, DETERMINISTIC, f"every metric follows the rule (>= {MECH_MIN_FIT_POINTS} sizes "
                     f"and a slope interval excluding 0); {ctx.summary.get('n_sizes', '?')} sizes run")


_M = "registered, docs/mechanism.md M2"
MECHANISM_CLAIMS: tuple[Claim, ...] = (
    Claim("MECH1", OURS, "(ours) The direction test has power where a signal exists: the GRPO direction lands in "
          "the random directions' tail at every size where GRPO gains", _M, "09_scale_study", ("sizes",),
          _judge_mech_power),
    Claim("MECH2", OURS, "(ours) ES's and CoPES's one-step updates are not better than chance at the cpu sizes", _M,
          "09_scale_study", ("sizes",), _judge_mech_chance),
    Claim("MECH3", OURS, "(ours) Nothing beats the first-order bound (z <= sqrt(rho^2 N) + 1.96)", _M,
          "09_scale_study", ("sizes",), _judge_mech_bound),
    Claim("MECH4", OURS, "(ours) CoPES is no better an estimator than ES per unit step (z tie)", _M,
          "09_scale_study", ("sizes",), _judge_mech_copes_vs_es),
    Claim("MECH5", OURS, "(ours) ES's measured per-step efficiency is at or below rho^2 N / (d_eff + N - 1)", _M,
          "09_scale_study", ("sizes",), _judge_mech_efficiency),
    Claim("MECH-4B", OURS, "(ours) A 4B value is shown only where >= 4 sizes and a slope interval excluding 0 allow it",
          "registered, docs/mechanism.md M3", "09_scale_study", ("sizes",), _judge_mech_extrapolation),
)

# ---- low rank on the map (notebook 09): L4, docs/lowrank_es.md#l4-low-rank-on-the-map
# The registered margin and rule: regime.LOWRANK_MARGIN / regime.lowrank_reading (09 reads by the same)
LOWRANK_MARGIN = regime.LOWRANK_MARGIN
# low-rank arm -> its full-rank arm, with the name the reason gives them (scale_study.MAP_LOWRANK_ARMS)
LOWRANK_PAIRS = (("es_lowrank", "es", "ES"), ("copes_lowrank", "copes", "CoPES"))
# a verdict in 09's own words for its per-cell reading (regime.lowrank_reading; "not judged" apart)
_LOWRANK_READING = {AGREES: "agrees", DISAGREES: "does not agree", INCONCLUSIVE: "inconclusive"}


def lowrank_reading(low: float | None, high: float | None, moved: bool,
                    margin: float = LOWRANK_MARGIN) -> tuple[str, str]:
    """(verdict, why) of one cell and arm by L4's registered rule (:func:`regime.lowrank_reading`):
    ``not judged`` where neither arm moved (read inconclusive: both returned the base, the difference is
    0 by construction), else the rule's reading with its reason."""
    if not moved:
        return INCONCLUSIVE, ("not judged: neither arm made an update (mean update norm 0 over every seed), so "
                              "both returned the base and the difference is 0 by construction")
    reading = regime.lowrank_reading(low, high, margin)
    m = f"{100 * margin:g} pts"
    if reading == "agrees":
        return AGREES, f"inside +-{m}"
    if reading == "does not agree":
        return DISAGREES, f"excludes 0, not inside +-{m}"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE, "no interval"
    return INCONCLUSIVE, f"holds 0 but is wider than +-{m}"


def _judge_lowrank(ctx: Context) -> Judgement:
    """Registered rule L4 (docs/lowrank_es.md#l4-low-rank-on-the-map) on 09's map_<low>_minus_<full>_<c>
    / _low_<c> / _high_<c> (low-rank minus full-rank strict accuracy, 95%, stats.compare, seeds paired) for
    every cell c of map_lowrank_cells and both arms (low-rank ES vs ES, low-rank CoPES vs CoPES), margin
    +-0.05: per cell and arm agrees if the interval lies inside (-0.05, +0.05); does not if it excludes 0
    (and is not inside the margin); inconclusive otherwise or without an interval; "not judged" (both
    arms' map_<arm>_update_norm_<c> 0: both returned the base, a difference of 0 by construction) reads
    inconclusive, never agrees. Overall: agrees if every reading agrees; does not if any does not;
    inconclusive otherwise. Missing where 09 ran no low-rank arms or a cell's keys are absent. 09's own
    reading (map_<low>_minus_<full>_prediction_<c>) is shown where it differs."""
    s = ctx.summary
    cells, rank = list(s["map_lowrank_cells"] or []), s["map_lowrank_rank"]
    if not cells:
        return Judgement(MISSING, f"no low-rank arms (map_lowrank_rank {_fmt(rank)}, map_lowrank_cells [])", "",
                         "09_scale_study ran no low-rank arms (MAP_LOWRANK_RANK 0 or no map): L4 is not measured")
    readings, parts, notes, absent = [], [], [], []
    for c in cells:
        for low_arm, full, name in LOWRANK_PAIRS:
            d = f"map_{low_arm}_minus_{full}"
            keys = [f"{d}_{c}", f"{d}_low_{c}", f"{d}_high_{c}", f"map_{low_arm}_update_norm_{c}",
                    f"map_{full}_update_norm_{c}"]
            gone = [k for k in (keys[0], *keys[3:]) if s.get(k) is None]  # None bounds: no interval, judged
            if gone or keys[1] not in s or keys[2] not in s:
                absent += gone + [k for k in keys[1:3] if k not in s]
                continue
            value, low, high, norm_low, norm_full = (s[k] for k in keys)
            moved = norm_low > 0 or norm_full > 0
            verdict, why = lowrank_reading(low, high, moved=moved)
            readings.append(verdict)
            interval = (f" [{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None and high is not None
                        and math.isfinite(low) and math.isfinite(high) else "")
            parts.append(f"{c} {name}: {100 * value:+.1f} pts{interval} -> {verdict}")
            notes.append(f"{c} {name}: {why}")
            recorded = s.get(f"{d}_prediction_{c}")
            if recorded is not None and recorded != (_LOWRANK_READING[verdict] if moved else "not judged"):
                notes[-1] += f" (NOTE: 09 read {recorded!r})"
    margin = s.get("map_lowrank_margin")
    power = (f"95% interval of the paired difference (stats.compare, seeds paired, seeds x problems); registered "
             f"margin +-{100 * LOWRANK_MARGIN:g} pts; rank {_fmt(rank)}")
    if margin is not None and not math.isclose(float(margin), LOWRANK_MARGIN):
        power += f"; NOTE: 09 recorded map_lowrank_margin {_fmt(margin)}, judged by the registered one"
    if absent:
        return Judgement(MISSING, f"not yet measured ({', '.join(absent)})", "",
                         f"09_scale_study's summary lacks {', '.join(absent)}")
    verdict = (DISAGREES if DISAGREES in readings else AGREES if all(r == AGREES for r in readings)
               else INCONCLUSIVE)
    lead = {AGREES: "every cell and arm agrees", DISAGREES: "a cell and arm does not agree (low rank changes that "
            "arm's strict accuracy there by more than the margin)",
            INCONCLUSIVE: "not every cell and arm agrees and none does not"}[verdict]
    return Judgement(verdict, f"low-rank (r = {_fmt(rank)}) minus full-rank strict accuracy: " + "; ".join(parts),
                     power, f"{lead}; " + "; ".join(notes))


LOWRANK_CLAIMS: tuple[Claim, ...] = (
    Claim("L4", OURS, "(ours) Low-rank noise does not change where ES works on 09's map: in each low-rank cell, for "
          "ES and for CoPES, low-rank minus full-rank strict accuracy is within 5 points",
          "registered, docs/lowrank_es.md L4", "09_scale_study", ("map_lowrank_cells", "map_lowrank_rank"),
          _judge_lowrank),
)
OUR_CLAIMS = REGIME_PREDICTION_CLAIMS + MOLORA_PREDICTION_CLAIMS + MECHANISM_CLAIMS + LOWRANK_CLAIMS


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


def _regime_gate(summaries: dict[str, dict[str, Any]]) -> str | None:
    """The reason paper A's method claims are not in the papers' regime, or None (criterion met or not
    recorded: then the claims are judged as usual)."""
    s = summaries.get(REGIME_NOTEBOOK, {})
    if s.get(REGIME_KEY) is False:
        note = s.get("regime_note") or s.get("regime_reason")
        return (f"not in the papers' regime: {REGIME_NOTEBOOK}'s {REGIME_KEY} is false"
                + (f" ({note})" if note else ""))
    return None


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
    gate = _regime_gate(summaries)
    measured = tuple(c for c in BENCHMARK_CLAIMS if all(k in summaries.get(c.notebook, {}) for k in c.keys))
    for claim in CLAIMS + SCALE_CLAIMS + OUR_CLAIMS + measured:
        summary = summaries.get(claim.notebook, {})
        absent = [k for k in claim.keys
                  if k not in summary or (summary[k] is None and k not in claim.none_means)]
        if absent:
            j = Judgement(MISSING, f"not yet measured ({', '.join(absent)})", "",
                          f"{claim.notebook}'s summary lacks {', '.join(absent)}")
        else:
            ctx = contexts.setdefault(claim.notebook, Context(claim.notebook, summaries, families))
            j = claim.judge(ctx)
            if gate and claim.claim_id.split("-")[0] in REGIME_CLAIMS:
                j = dataclasses.replace(j, verdict=NOT_IN_REGIME,
                                        reason=f"{gate}; the data alone would read {j.verdict} ({j.reason})")
        if claim.notebook in stale and j.verdict != MISSING:
            j = dataclasses.replace(j, verdict=STALE,
                                    reason=f"{stale[claim.notebook]}; its data would read {j.verdict} ({j.reason})")
        rows.append({"claim": claim.claim_id, "paper": claim.paper, "statement": claim.statement,
                     "paper_figure": claim.paper_figure, "ours": j.ours, "verdict": j.verdict,
                     "reason": j.reason, "power": j.power, "notebook": claim.notebook})
    return rows


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
             "(generated by notebooks/99_summary.ipynb; do not edit by hand).", "",
             "| claim | statement | paper | ours | verdict | reason | power | notebook |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        link = f"[{r['notebook']}]({link_prefix}{r['notebook']}.ipynb)"
        lines.append(f"| {r['claim']} | {r['statement']} | {r['paper_figure']} | {r['ours']} | "
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
    lines = ["Generated from `copes_lib/claims.py` and `copes_lib/paper.py` (`claims.rules_markdown()`; "
             "`tests/test_claims.py` checks this copy is current).", "",
             f"Verdicts: {', '.join(f'`{v}`' for v in VERDICTS)}.", "",
             f"- **not in regime**: claims {', '.join(REGIME_CLAIMS)} read `{NOT_IN_REGIME}` when "
             f"`results/<profile>/{REGIME_NOTEBOOK}/summary.json` has `{REGIME_KEY}: false` (the reason keeps what "
             "the data alone would read); without the key they are judged as below.",
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
