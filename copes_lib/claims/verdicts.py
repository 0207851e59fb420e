"""The verdict machinery: the verdicts, the Holm families of tests, and how a test reads as a verdict.

A claim (:class:`Claim`) names the notebook whose summary it reads and a judge, a function of a
:class:`Context` that returns a :class:`Judgement`. The statistical judges compare two arms of a
notebook's family (:data:`FAMILIES`), Holm-corrected together, each data set tested once
(:class:`Families`); :func:`_tested` turns one such test into a judge with a rule (:func:`_beats`,
:func:`_no_effect`). The claims themselves live beside this module: one module per paper and one for
our own predictions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from copes_lib import paper, stats

AGREES, PARTLY, DISAGREES, INCONCLUSIVE, MISSING = "agrees", "partly", "does not", "inconclusive", "missing"
STALE = "stale"  # the notebook's results predate those of a notebook it builds on
OPPOSITE, NOT_IN_REGIME, NOT_ACTIONABLE = "opposite", "not in regime", "not actionable"
# the claim's task's base was built without a passing 5-seed check (UNCHECKED_BASES), or not built at all
# (copes_lib/protocols/testbed/base_gate.py, issue 47 decision 3)
NOT_CHECKED = "not checked"
VERDICTS = (AGREES, PARTLY, DISAGREES, OPPOSITE, INCONCLUSIVE, NOT_IN_REGIME, NOT_ACTIONABLE, NOT_CHECKED, STALE,
            MISSING)
SCORES = "_scores"  # load_summaries puts a notebook's stats.load_scores() under this key of its summary
REGION_MAP = "_region_map"  # ... and notebook 13's region_map.csv rows (dicts) under this one
WRITTEN = "_written"  # ... and the time its run ended (manifest.json's ``ended``), when it has a manifest
NO_SCORES = "inconclusive (no per-problem scores)"
DETERMINISTIC = "deterministic (analytic or one measurement): no sampling noise to test"
# Paper A's method claims and our regime predictions R2-R8 need the papers' regime (notebook 01's
# regime_criterion_met); R1 is judged on any latent-protocol base (docs/regime.md#r4-predictions-ours-registered-before-the-run).
REGIME_NOTEBOOK, REGIME_KEY = "01_substrate_and_agent", "regime_criterion_met"
REGIME_CLAIMS = ("A1", "A2", "A3", "A4", "A5", "A6", "A7", "A7-curve", "A7-qa", "A8", "R2", "R3", "R4", "R5", "R6", "R7", "R8")
# Gates per claim (docs/regime.md#r10-gates-per-claim-registered-2026-12-03): each gated claim is judged against the
# criterion (and the preflight) of the task it is measured on, not of every task: A1-A7 and the math predictions
# R2-R8 by math's, A8 and A7-qa (the norm-matched control on QA, docs/regime.md R12) by QA's. A QA base that
# misses its criterion says nothing about a math contrast.
GATE_TASKS = ("math", "qa")
# The rule a run's claims are gated by is the one registered before that run: 01 writes ``gate_rule`` = GATE_RULE
# from R10 on, and a summary without it (the committed graded-base run, 6180831, registered under R2's combined
# math AND QA criterion) is judged by the combined keys, whatever per-task keys it also holds: re-gating a run
# under a rule registered after it was seen would be tuning its verdicts.
GATE_RULE_KEY, GATE_RULE = "gate_rule", "per_task"
CLAIM_TASK = {**{claim: "math" for claim in REGIME_CLAIMS if claim not in ("A8", "A7-qa")}, "A8": "qa", "A7-qa": "qa"}


def gate_task(claim_id: str) -> str | None:
    """The task whose criterion gates ``claim_id`` (its family: ``A1-math500`` is A1's), None if ungated.

    >>> gate_task("A1"), gate_task("A8-2wiki"), gate_task("R8"), gate_task("A9"), gate_task("A7-qa")
    ('math', 'qa', 'math', None, 'qa')
    """
    return CLAIM_TASK.get(claim_id, CLAIM_TASK.get(claim_id.split("-")[0]))


def regime_key(task: str) -> str:
    """01's summary key of ``task``'s base-regime criterion; a clear error for an unknown task.

    >>> regime_key("qa")
    'regime_criterion_met_qa'
    """
    if task not in GATE_TASKS:
        raise ValueError(f"task must be one of {', '.join(GATE_TASKS)} (the tasks with a base-regime criterion), "
                         f"got {task!r}")
    return f"{REGIME_KEY}_{task}"


def gates_per_task(s01: dict) -> bool:
    """Whether 01's summary ``s01`` was written under the per-task gates (R10): True only when it says so.

    >>> gates_per_task({"gate_rule": "per_task"}), gates_per_task({"regime_criterion_met_math": True})
    (True, False)
    """
    return s01.get(GATE_RULE_KEY) == GATE_RULE


@dataclasses.dataclass(frozen=True)
class Judgement:
    verdict: str
    ours: str
    power: str = ""
    reason: str = ""
    plain: str = ""  # what the data show in plain words (effect / no effect / undecided, interval, units)


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
    # A8 and (docs/regime.md R12) A7-qa, CoPES vs norm-matched ES: Holm over both where both arms ran
    "07_multihop_qa": (Contrast("copes_vs_es_f1", "test_f1", "copes", "es"),
                       Contrast("copes_vs_es_sqrtk_alpha_f1", "test_f1", "copes", "es_sqrtk_alpha")),
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
                  "copes_vs_es_f1": "A8", "copes_vs_es_sqrtk_alpha_f1": "A7-qa", "router": "B2", "lifecycle": "B3", "full_vs_b3": "B4",
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


def math_reference_gain(ctx: Context) -> float | None:
    """Our math reference gain (full GRPO's reference - base) from this summary, else 05's: the seed-mean
    reference of R4 where it was written, else seed 0's best (see :func:`_scales`)."""
    gain = ctx.reference_gain("base_val_accuracy", "full_grpo_reference_val_accuracy")
    return gain if gain is not None else ctx.reference_gain("base_val_accuracy", "full_grpo_best_val_accuracy")


def _scales(ctx: Context, contrast: Contrast) -> tuple[float | None, float | None]:
    """(the paper's effect in our units, the equivalence margin) for one contrast, or None where none.

    Paper A: the paper's effect as a share of its reference gain (``paper.EFFECT_SHARE_A``) times our
    reference gain; margin ``paper.EQUIVALENCE_FRACTION`` x that. Paper B: the paper's effect in nats
    and ``paper.equivalence_margin_b`` (from the paper's effect sizes, never from ours).

    On math our reference gain is the one the gain recoveries divide by: 05's
    ``full_grpo_reference_val_accuracy`` (the mean over full GRPO's seeds of each seed's best,
    docs/reference.md#r4-notebook-05s-references-carry-every-seed-registered-2026-12-03) minus the base; a 05
    summary written before that key existed falls back to ``full_grpo_best_val_accuracy`` (seed 0's best)."""
    if ctx.notebook in ("05_fixed_budget_math", "06_copes_ablations", "07_multihop_qa"):
        share = paper.EFFECT_SHARE_A.get(contrast.name)
        gain = (ctx.reference_gain("f1_base", "f1_full_grpo") if ctx.notebook == "07_multihop_qa"
                else math_reference_gain(ctx))
        if share is None or gain is None or gain <= 0:
            return None, None
        effect = share * gain
        return effect, paper.EQUIVALENCE_FRACTION * abs(effect)
    if ctx.notebook == "12_molora_factorial":
        return paper.PAPER_B_EFFECT_NATS.get(contrast.name), paper.equivalence_margin_b(contrast.name)
    return None, None


def units_text(c: stats.Comparison, latent: bool = True) -> str:
    """How many independent units an interval rests on: the latent units (and Kish's effective number where
    unit sizes differ), or the problems, said to be treated as independent, where no unit ids were saved
    (``latent``: the testbed has latent units; paper B's windows have none, so they are simply counted)."""
    if c.n_units is None:
        return (f"{c.n_problems} problems as independent units (no unit ids saved)" if latent
                else f"{c.n_problems} scored items")
    eff = c.n_units_effective
    return f"{c.n_units} units" + (f" (effective {eff:.0f})" if eff is not None and round(eff) < c.n_units else "")


def _power(c: stats.Comparison, scale: float, unit: str, latent: bool = True) -> str:
    text = (f"MDE {c.mde * scale:.2g}{unit} at {c.power:.0%} power (alpha {c.alpha}/{c.family_size}); "
            f"{c.n_seeds[0]}/{c.n_seeds[1]} seeds x {c.n_problems} problems"
            + (f" in {units_text(c)}" if latent else ""))
    if c.paper_effect is not None:
        text += f"; paper's effect here {c.paper_effect * scale:.2g}{unit}"
    if c.margin is not None:
        text += f"; equivalence margin +-{c.margin * scale:.2g}{unit}"
    return text


def _stat(c: stats.Comparison, scale: float, unit: str, latent: bool = True) -> str:
    f = lambda x: f"{x * scale:+.2g}{unit}"  # noqa: E731
    return (f"{f(c.estimate)} [{f(c.low)}, {f(c.high)}] over {units_text(c, latent)}, Holm p = {c.p_holm:.2g} -> "
            f"{c.verdict}")


_ARM_WORDS = {"copes": "CoPES", "es": "ES", "lora_grpo": "LoRA-GRPO", "full_grpo": "full GRPO", "k1": "K=1",
              "k2": "K=2", "k4": "K=4", "k8": "K=8", "indep_z": "independent z", "es_2sigma": "ES with 2 sigma",
              "es_sqrtk_alpha": "ES with sqrt(K) x alpha", "copes_matched_step": "CoPES at ES's step",
              "evolution": "evolution", "gradient": "gradient"}


def _contrast_words(name: str) -> str:
    """'CoPES - ES' for a family's contrast (its arms in words), else its name."""
    for contrasts in FAMILIES.values():
        for contrast in contrasts:
            if contrast.name == name:
                return f"{_ARM_WORDS.get(contrast.a, contrast.a)} - {_ARM_WORDS.get(contrast.b, contrast.b)}"
    return name


def plain_reading(c: stats.Comparison, scale: float = 100.0, unit: str = " pts", latent: bool = True) -> str:
    """What a test's data show, in plain words: ``effect`` (the interval excludes 0 the predicted way, Holm),
    ``effect, the other way``, ``no effect`` (inside the declared margin) or ``undecided``, then the
    contrast, its estimate and 95% interval and the units it rests on.

    >>> c = stats.compare([[1, 1, 0, 1] * 10] * 3, [[0, 1, 0, 0] * 10] * 3, name="copes_vs_es", units=list("abcd") * 10)
    >>> plain_reading(c).split(":")[0], "over 4 units" in plain_reading(c)  # two of 4 units carry it all
    ('undecided', True)
    """
    f = lambda x: f"{x * scale:+.2g}{unit}"  # noqa: E731
    word = ("effect, the other way" if _significant_opposite(c) else "effect" if c.verdict == stats.EFFECT
            else f"no effect (within +-{abs(c.margin) * scale:.2g}{unit})" if c.verdict == stats.EQUIVALENT
            else "undecided")
    text = f"{word}: {_contrast_words(c.name)} {f(c.estimate)} [{f(c.low)}, {f(c.high)}] over {units_text(c, latent)}"
    return text + ("" if c.seed_noise_counted else "; an arm has 1 seed")


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
            scale: float = 100.0, unit: str = " pts", latent: bool = True) -> Callable[[Context], Judgement]:
    def judge(ctx: Context) -> Judgement:
        c = ctx.family().get(contrast)
        if c is None:
            return Judgement(INCONCLUSIVE, f"{figure(ctx)}; {NO_SCORES}", "no per-problem scores: no power",
                             "no per-problem scores (scores.npz) to test")
        return Judgement(rule(c), f"{figure(ctx)}; {_stat(c, scale, unit, latent)}", _power(c, scale, unit, latent),
                         _why(c, scale, unit) + _shared_note(ctx, contrast), plain_reading(c, scale, unit, latent))
    judge.__doc__ = rule.__doc__
    return judge


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


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

