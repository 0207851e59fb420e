"""Our own claims and registered predictions, beyond the papers: the scale claims S1-S3 (notebook 09),
the regime predictions R1-R8, paper B's regime predictions P1-P6, the mechanism rules MECH1-MECH5 and
MECH-4B, and L4 (low rank on 09's map). Each is judged by the rule registered in docs/ before its run."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from copes_lib import regime, stats
from copes_lib.claims.verdicts import (
    AGREES,
    DETERMINISTIC,
    DISAGREES,
    INCONCLUSIVE,
    MISSING,
    NOT_IN_REGIME,
    OPPOSITE,
    REGIME_NOTEBOOK,
    Claim,
    Context,
    Judgement,
    _fmt,
)


def _judge_largest_gap(ctx: Context) -> Judgement:
    """Notebook 09, our own question: at the largest size, CoPES (paper protocol) vs ES with the
    notebook's seeds x latent units x problems test (stats.compare): effect -> agrees, opposite -> opposite,
    else inconclusive."""
    tag = ctx["largest_size_tag"]
    verdict = ctx.summary.get(f"copes_paper_minus_es_verdict_{tag}")
    estimate = ctx.summary.get(f"copes_paper_minus_es_{tag}")
    low, high = ctx.summary.get(f"copes_paper_minus_es_low_{tag}"), ctx.summary.get(f"copes_paper_minus_es_high_{tag}")
    if verdict is None or estimate is None:
        return Judgement(MISSING, f"no CoPES - ES comparison for size {tag}", "", f"no test recorded for size {tag}")
    interval = f" [{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None and high is not None else ""
    units = ctx.summary.get(f"units_{tag}")  # None: a 09 run before unit ids (problems treated as independent)
    interval += f" over {units} latent units" if units is not None and interval else ""
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
        power = (f"95% interval of the slope from the per-size 95% intervals (seeds x latent units x problems "
                 f"within units each); "
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
        if all(v is None for v in (value, low, high)):  # the notebook writes None where its run lacks the cells
            return Judgement(INCONCLUSIVE, f"{pred.quantity}: not measured", power,
                             f"{notebook} recorded no value: the quantity is undefined for its run, which lacks "
                             "the settings or cells it needs (docs/regime.md#r4-predictions-ours-registered-before-the-run)")
        if any(v is None or not math.isfinite(float(v)) for v in (value, low, high)):
            return Judgement(INCONCLUSIVE, f"{pred.quantity}: undefined (value, interval = "
                             f"{', '.join(_fmt(v) for v in (value, low, high))})", power,
                             f"{notebook} wrote the quantity but it is undefined there (not finite)")
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
                     "regime_criterion_met_math is false (a math prediction, gated by math's criterion).")
    return judge


def _judge_r1(ctx: Context) -> Judgement:
    """Registered rule (regime.judge_r1) on 01's regime_math_strict_accuracy (greedy, whole validation
    split): agrees if <= 0.05; does not if > 0.15; inconclusive between; not in regime where the base is
    not a latent-protocol one (warm_protocol is not latent). Judged in regime or not (its quantity is one of
    the criterion's own values); 01's own reading (prediction_R1) is shown and must be the same."""
    strict, protocol = float(ctx["regime_math_strict_accuracy"]), ctx["warm_protocol"]
    reading = regime.judge_r1(strict, protocol == "latent")
    recorded = ctx.summary.get("prediction_R1")
    latent_p = ctx.summary.get("warm_latent_p")  # None: a protocol without a latent p (paper, skill_gap)
    text = f"strict math accuracy of 01's base {strict:.3g} (warm_protocol {protocol}" + \
           (f", p = {_fmt(latent_p)})" if latent_p is not None else ")")
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
