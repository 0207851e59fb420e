"""Paper B's claims (evolutionary mixture-of-LoRA; docs/paper_b_molora.md#b2-results) and their rules:
router collapse (B1), the factorial's contrasts in nats of log-PPL (B2-B5) and the sandbox boundary (B6)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from copes_lib import paper, stats
from copes_lib.claims.verdicts import (
    AGREES,
    DISAGREES,
    INCONCLUSIVE,
    NO_SCORES,
    PARTLY,
    REGION_MAP,
    Claim,
    Context,
    Judgement,
    _no_effect,
    _power,
    _stat,
    _tested,
    _why,
)


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
    text = f"{figure}; pre-aligned {_stat(tests['prealigned'], 1, '', latent=False)}; elsewhere: " + ", ".join(
        tests[r].verdict for r in regimes[1:])
    why = f"at the grid point: pre-aligned {_why(tests['prealigned'])}" + (
        f"; evolution also wins {', '.join(elsewhere)}" if elsewhere else "")
    return Judgement(verdict, text, _power(tests["prealigned"], 1, "", latent=False), why)


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


_NATS = {"scale": 1.0, "unit": " nats", "latent": False}  # windows of text: no latent units


PAPER_B_CLAIMS: tuple[Claim, ...] = (
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
