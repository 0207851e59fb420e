"""The papers' regime on any base: the criterion evaluator and our registered predictions
(docs/regime.md).

:func:`measure_regime` rolls a base out greedily on validation problems and judges the declared
criterion (strict / lenient accuracy, protocol share of failures, tool-call rate;
docs/regime.md#r2-the-base-regime-criterion) with :mod:`copes_lib.tasks.regime`. Notebook 01 calls
it on its base; 05-07 and 09's map can call it on any base (a latent-protocol warm start at another
p, the skill-gap control, a trained checkpoint) to split a gain into protocol and skill.

:data:`PREDICTIONS` is the machine-readable copy of docs/regime.md#r4-predictions-ours-registered-before-the-run
(a test keeps the two equal): each row names its quantity and the thresholds of its decision rule,
for the claims layer to judge once the notebooks that measure them exist.
"""

from __future__ import annotations

import dataclasses

from copes_lib.tasks.regime import CRITERIA, RegimeCriterion, regime_from_batches


def measure_regime(model, tokenizer, tasks, env, rollout_config, criterion: RegimeCriterion | None = None,
                   seed: int = 0) -> dict:
    """The criterion's values on ``tasks`` (greedy as ``rollout_config`` says) and whether
    ``criterion`` (default: the declared one of ``env.kind``) is met; also the rollout's metrics
    under ``"evaluation"`` (``copes_lib.rollout.evaluate``'s keys)."""
    from copes_lib.rollout import evaluate

    result = evaluate(model, tokenizer, tasks, env, rollout_config, seed=seed, return_batches=True)
    regime = regime_from_batches(result.pop("batches"), env.kind, criterion or CRITERIA[env.kind])
    return {**regime, "evaluation": result}


def sampled_protocol(model, tokenizer, tasks, env, rollout_config, temperature: float = 1.0, seed: int = 0) -> dict:
    """The latent prior as the base holds it: at ``temperature`` (GRPO's rollouts: 1.0) the share of
    sampled trajectories in the reward's answer form (answer block and boxed value, r_f = 0) and their
    strict accuracy. Greedy decoding hides p (the argmax takes the majority form); sampling shows it.
    A diagnostic beside the criterion, not part of it (docs/regime.md#r3-the-latent-protocol-warm-start)."""
    from copes_lib.rollout import evaluate

    sampled = dataclasses.replace(rollout_config, temperature=temperature)
    result = evaluate(model, tokenizer, tasks, env, sampled, seed=seed, return_batches=True)
    regime = regime_from_batches(result["batches"], env.kind)
    return {"protocol_rate": result["format_ok_rate"], "strict": regime["strict"], "lenient": regime["lenient"],
            "temperature": temperature}


def paper_analogue(kind: str) -> dict:
    """The paper's base in the criterion's terms (fractions; docs/regime.md#the-papers-analogue-and-the-targets-derived-from-it),
    from ``copes_lib.paper``: math, strict = GSM8K pass@1, lenient >= MATH-500 pass@1 (a lower bound of
    the skill), protocol share >= (lenient - strict) / (1 - strict); QA, strict = HotpotQA EM, lenient =
    HotpotQA Acc. The paper does not report the base's tool-call rate (None).

    >>> {k: round(v, 3) for k, v in paper_analogue("math").items() if v is not None}
    {'strict': 0.092, 'lenient': 0.574, 'protocol_share': 0.531}
    """
    from copes_lib import paper

    if kind == "math":
        pass1 = dict(zip(paper.BENCHMARKS_MATH, paper.TABLE1["base"]["pass1"]))
        strict, lenient = pass1["GSM8K"] / 100, pass1["MATH-500"] / 100
    else:
        acc, em, _f1 = paper.TABLE4["HotpotQA"]["base"]
        strict, lenient = em / 100, acc / 100
    return {"strict": strict, "lenient": lenient, "protocol_share": (lenient - strict) / (1 - strict),
            "tool_rate": None}


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One registered prediction: agrees when the quantity's statistic clears ``agrees_if``, does not
    when it clears ``disagrees_if``, else inconclusive; "not in regime" when 01's base misses the
    criterion (R1 excepted: it is judged on any latent-protocol base)."""

    prediction_id: str
    statement: str
    quantity: str
    agrees_if: str
    disagrees_if: str


PREDICTIONS: tuple[Prediction, ...] = (
    Prediction("R1", "At greedy decoding the latent base's strict math accuracy is near 0 for p < 0.5: the "
               "argmax takes the majority answer form", "strict math accuracy of 01's base", "<= 0.05", "> 0.15"),
    Prediction("R2", "At p = 0 ES recovers ~0 of the reward's headroom: its strict gain at the budget is below "
               "0.03 (3 points of accuracy)", "Delta S of ES at p = 0", "interval upper bound < 0.03", "interval lower bound > 0.03"),
    Prediction("R3", "ES's gains in the latent regime are mostly protocol, not skill",
               "Delta S - 2 Delta L of ES at the headline p", "interval lower bound > 0", "interval upper bound < 0"),
    Prediction("R4", "GRPO's gains in the latent regime are mostly protocol, not skill",
               "Delta S - 2 Delta L of full GRPO at the headline p", "interval lower bound > 0",
               "interval upper bound < 0"),
    Prediction("R5", "ES recovers more of full GRPO's strict gain in the latent regime than in the skill-gap "
               "control", "ES gain recovery (latent, headline p) minus ES gain recovery (skill gap), same N and "
               "budget", "interval lower bound > 0", "interval upper bound < 0"),
    Prediction("R6", "ES's gain recovery grows with the latent prior p",
               "slope of ES gain recovery over p (>= 3 values, 0 included)", "slope interval lower bound > 0",
               "slope interval upper bound < 0"),
    Prediction("R7", "CoPES - ES grows with N / d_eff",
               "slope of CoPES - ES (strict gain) over log(N / d_eff), d_eff measured at each base",
               "slope interval lower bound > 0", "slope interval upper bound < 0"),
    Prediction("R8", "In the latent regime at the headline p, CoPES beats standard ES at the budget (the paper's "
               "ordering, 88.0 vs 77.6)", "CoPES - ES strict accuracy", "interval lower bound > 0",
               "interval upper bound < 0"),
)


def judge_r1(strict_math_accuracy: float, latent_base: bool, prior: str = "homogeneous") -> str:
    """R1's verdict from notebook 01's summary (the one prediction 01 itself measures). It is judged
    on any latent-protocol base with the homogeneous prior, in regime or not: its quantity is one of
    the criterion's own values. A cued prior puts the reward's form on about p of the problems by
    design (docs/regime.md#r3-the-latent-protocol-warm-start), which is not what R1 is about.

    >>> judge_r1(0.0, True), judge_r1(0.1, True), judge_r1(0.3, True), judge_r1(0.0, False)
    ('agrees', 'inconclusive', 'does not', 'not a latent-protocol base')
    >>> judge_r1(0.08, True, "cued")
    'not judged: cued prior (R1 is about the homogeneous prior)'
    """
    if not latent_base:
        return "not a latent-protocol base"
    if prior != "homogeneous":
        return f"not judged: {prior} prior (R1 is about the homogeneous prior)"
    return "agrees" if strict_math_accuracy <= 0.05 else "does not" if strict_math_accuracy > 0.15 else "inconclusive"


__all__ = ["measure_regime", "sampled_protocol", "paper_analogue", "Prediction", "PREDICTIONS", "judge_r1"]


# ---- L4, low rank on 09's map (docs/lowrank_es.md#l4-low-rank-on-the-map): set in docs before the run
LOWRANK_MARGIN = 0.05  # strict accuracy: |low-rank - full-rank| inside this is "no change"


def lowrank_reading(low: float | None, high: float | None, margin: float = LOWRANK_MARGIN) -> str:
    """L4's rule for one cell and arm, on the 95% interval [low, high] of low-rank minus full-rank strict
    accuracy (seeds paired): ``agrees`` (low rank changes nothing) if it lies inside (-margin, margin),
    ``does not agree`` if it excludes 0, else ``inconclusive`` (also without a finite interval). Notebook
    09 and the claims layer both read by it."""
    import math

    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive"
    if -margin < low and high < margin:
        return "agrees"
    if low > 0 or high < 0:
        return "does not agree"
    return "inconclusive"

