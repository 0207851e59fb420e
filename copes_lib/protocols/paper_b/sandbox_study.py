"""Notebook 13's tables, figures, verdict and summary (paper B's synthetic sandbox: where does evolving the
routing pay?).

The experiment and its pre-stated rules are in ``copes_lib.molora.sandbox`` (``run_experiment``,
``claim_check``, ``alignment_boundary``, ``region_table``, ``claim_region``); this module arranges their
rows into the notebook's tables and figures, words the verdict from the rule's outcome and builds the flat
summary with the per-seed scores claim B6 reads. The sandbox's departures from the paper: the notebook."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from copes_lib import stats
from copes_lib.molora import sandbox as sb

ORDER = {r: i for i, r in enumerate(sb.REGIMES)} | {o: i for i, o in enumerate(sb.OPTIMISERS)}  # display order
COLOURS = {"gradient": "tab:blue", "evolution": "tab:red", "hybrid": "tab:green"}
MAP_MARKS = {"win": "E", "loss": "G", "tie": "="}  # the region map's letters: evolution / gradient wins, tie


def _ci(row: dict[str, Any], metric: str, digits: int = 4) -> str:
    return f"{row[metric]:.{digits}f} [{row[metric + '_low']:.{digits}f}, {row[metric + '_high']:.{digits}f}]"


def _diff(d: dict[str, float]) -> str:
    return f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def regime_rows(grid: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over seeds with the 95% t-interval per (regime, optimiser), in the display order."""
    return sorted(sb.summary_table(grid, ("regime", "optimiser")),
                  key=lambda r: (ORDER[r["regime"]], ORDER[r["optimiser"]]))


def regime_table(table_rows: list[dict[str, Any]]):
    """The regime x optimiser table as shown: excess loss, normalised excess and routing accuracy (known slot
    and best relabelling) with their intervals, function evaluations and seconds per run."""
    import pandas as pd

    return pd.DataFrame([{
        "regime": r["regime"], "optimiser": r["optimiser"], "seeds": r["seeds"],
        "excess loss [95% CI]": _ci(r, "excess_loss"),
        "normalised excess": _ci(r, "excess_loss_normalised", 3),
        "routing acc (known)": _ci(r, "routing_accuracy", 3),
        "routing acc (relabelled)": _ci(r, "routing_accuracy_relabelled", 3),
        "function evals": int(r["function_evals"]),
        "wall s / run": round(r["wall_s"], 2),
    } for r in table_rows])


def evo_minus_grad_table(check: dict[str, Any], hybrid: dict[str, Any], evo_only: dict[str, Any]):
    """Per regime, evolution - gradient paired by seed (negative: evolution better) for the claim's evolution,
    the routing-only search and the hybrid, with the pre-stated rule's "helps"."""
    import pandas as pd

    return pd.DataFrame([{
        "regime": reg,
        "evo - grad (claim's evo)": _diff(d),
        "claim's evo is": "hybrid" if reg == "cotrained" else "evolution",
        "evolution helps (CI < 0)": check["helps"][reg],
        "evolution-only - grad": _diff(evo_only[reg]),
        "hybrid - grad": _diff(hybrid[reg]),
    } for reg, d in check["diffs"].items()])


def plot_alignment_sweep(sweep_rows: list[dict[str, Any]], boundaries: dict[str, dict[str, Any]], n_seeds: int,
                         budget_evals: int):
    """Left: excess loss per optimiser over alignment (seed mean and 95% t-band, clipped at 1e-5 on the log
    axis). Right: evo - gradient (symlog) per reading in ``boundaries`` (name -> ``sb.alignment_boundary``),
    with the boundary and its bootstrap interval."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for opt in sb.OPTIMISERS:
        rs = [r for r in sweep_rows if r["optimiser"] == opt]
        al = [r["alignment"] for r in rs]
        ax1.plot(al, [r["excess_loss"] for r in rs], "o-", color=COLOURS[opt], label=opt)
        ax1.fill_between(al, [max(r["excess_loss_low"], 1e-5) for r in rs], [r["excess_loss_high"] for r in rs],
                         color=COLOURS[opt], alpha=0.2)
    ax1.set_yscale("log")
    ax1.set_xlabel("alignment a (0 = misaligned, 1 = pre-aligned)")
    ax1.set_ylabel("excess test loss over the known optimum")
    ax1.set_title(f"{n_seeds} seeds, {budget_evals} function evals per run")
    ax1.legend()
    for name, b in boundaries.items():
        diff = np.array(b["diff"])
        mean = diff.mean(axis=0)
        half = np.array([stats.mean_ci(col)[2] - m if len(col) > 1 else 0.0 for col, m in zip(diff.T, mean)])
        ax2.plot(b["alignments"], mean, "o-", color=COLOURS[name], label=f"{name} - gradient")
        ax2.fill_between(b["alignments"], mean - half, mean + half, color=COLOURS[name], alpha=0.2)
        if b["alignment_boundary"] is not None:
            ax2.axvline(b["alignment_boundary"], color=COLOURS[name], ls="--",
                        label=f"{name} boundary {b['alignment_boundary']:.2f}")
            ax2.axvspan(b["alignment_boundary_low"], b["alignment_boundary_high"], color=COLOURS[name], alpha=0.08)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_yscale("symlog", linthresh=1e-3)
    ax2.set_xlabel("alignment a")
    ax2.set_ylabel("excess loss: evo - gradient (< 0: evo better)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


def boundary_sentence(name: str, b: dict[str, Any]) -> str:
    """Where evolution starts to pay along the alignment sweep, its bootstrap interval and per-seed crossings."""
    where = ("never pays (evo - grad >= 0 even at a = 1)" if b["alignment_boundary"] is None else
             f"pays from a = {b['alignment_boundary']:.3f} [95% bootstrap {b['alignment_boundary_low']:.3f}, "
             f"{b['alignment_boundary_high']:.3f}]")
    return (f"{name}: {where}; per-seed crossings {b['per_seed']}; "
            f"share of bootstrap resamples with no crossing {b['bootstrap_share_no_crossing']:.2f}")


def plot_region_map(map_cells: list[dict[str, Any]], n_seeds: int):
    """Evolution - gradient over alignment x adapter noise, one panel per budget, on one symmetric log colour
    scale (wins are small, losses large), each cell lettered by the pre-stated rule (:data:`MAP_MARKS`)."""
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt
    import pandas as pd

    from copes_lib.protocols import plots

    plots.style()
    map_bu = sorted({c["budget_evals"] for c in map_cells})
    frame = pd.DataFrame(map_cells)
    frame["mark"] = [f"{MAP_MARKS[o]}\n{v:+.3f}" for o, v in zip(frame["outcome"], frame["evo_minus_grad"])]
    limit = max(abs(c["evo_minus_grad"]) for c in map_cells) or 1.0
    norm = mcolors.SymLogNorm(linthresh=1e-3, vmin=-limit, vmax=limit)
    fig, axes = plt.subplots(1, len(map_bu), figsize=(3.8 * len(map_bu) + 1.2, 3.6), squeeze=False)
    for j, (ax, bu) in enumerate(zip(axes[0], map_bu)):
        cells = frame[frame["budget_evals"] == bu]
        marks = cells.pivot(index="adapter_noise", columns="alignment", values="mark")
        plots.heatmap(ax, cells, index="adapter_noise", columns="alignment", values="evo_minus_grad", marks=marks,
                      cmap="RdBu_r", norm=norm, center=None, cbar=j == len(map_bu) - 1,
                      label="excess loss: evolution - gradient")
        ax.set_xlabel("alignment a")
        ax.set_ylabel("adapter noise (relative)" if j == 0 else "")
        ax.set_title(f"{bu} function evals")
    fig.suptitle(f"{n_seeds} seeds per cell; E / G: 95% interval excludes 0 (evolution / gradient better); =: tie",
                 fontsize=9, y=1.03)
    return fig


def claim_verdict(check: dict[str, Any], map_verdict: str, adapter_noise: float, budget_evals: int) -> str:
    """The claim's verdict in words, from ``sb.claim_check``'s outcome at the grid's point (its adapter noise
    and budget), followed by the region map's sentence."""
    d = check["diffs"]
    point = f"at adapter noise {adapter_noise:g} and {budget_evals} function evaluations"
    if check["holds"]:
        verdict = (f"HOLDS {point}: evolution on routing beats gradient with pre-aligned adapters "
                   f"({d['prealigned']['mean']:+.4f}) and does not in any other regime.")
    else:
        reasons = []
        if not check["helps"]["prealigned"]:
            reasons.append(f"with pre-aligned adapters evolution does not beat gradient "
                           f"(evo - grad {_diff(d['prealigned'])})")
        for r in sb.REGIMES:
            if r != "prealigned" and check["helps"][r]:
                reasons.append(f"evolution beats gradient in the {r} regime ({d[r]['mean']:+.4f})")
        verdict = f"DOES NOT HOLD as stated {point}: " + "; ".join(reasons) + "."
    return verdict + f" Over the map: {map_verdict}."


def _finite_or_none(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def per_seed(grid: list[dict[str, Any]], regime: str, optimiser: str) -> tuple[list[list[float]], list[int]]:
    """Per-seed excess test loss of one regime and optimiser (each seed builds its own problem: nested)."""
    by_seed = {r["seed"]: r["excess_loss"] for r in grid if r["regime"] == regime and r["optimiser"] == optimiser}
    return [[by_seed[s]] for s in sorted(by_seed)], sorted(by_seed)


def save_regime_scores(out_dir, grid: list[dict[str, Any]]) -> None:
    """The regime grid's per-seed scores for claim B6: "evolution" is the claim's evolution (routing-only
    CMA-ES, the hybrid when co-trained), as in ``evo_minus_grad_excess_loss_<regime>``; the routing-only
    search and the hybrid are stored beside it."""
    for reg in sb.REGIMES:
        claim_evo = "hybrid" if reg == "cotrained" else "evolution"
        arms, arm_seeds = {}, {}
        for arm, opt in (("gradient", "gradient"), ("evolution", claim_evo), ("evolution_routing_only", "evolution"),
                         ("hybrid", "hybrid")):
            arms[arm], arm_seeds[arm] = per_seed(grid, reg, opt)
        stats.save_scores(out_dir, f"excess_loss_{reg}", arms, arm_seeds, nested=True)


def sandbox_summary(params, results: dict[str, Any], table_rows: list[dict[str, Any]], check: dict[str, Any],
                    check_hybrid: dict[str, Any], hybrid: dict[str, Any], evo_only: dict[str, Any],
                    sweeps: dict[str, dict[str, Any]], boundaries: dict[str, dict[str, Any]],
                    region: dict[str, Any], verdict: str, map_verdict: str) -> dict[str, Any]:
    """The flat summary (keys: the notebook's opening cell): the grid's readings per regime and optimiser,
    the sweeps' headline differences (``sweeps``: "noise" by adapter noise, "budget" by function evaluations),
    the alignment boundaries (``boundaries``: "" for the primary reading, "_hybrid"), the region map and the
    power note. ``scores_sha256`` is added by the notebook once the scores are saved."""
    grid = results["grid"]
    all_runs = {id(r): r for r in grid + results["sweep"] + results["map"]}.values()  # noise, budget: map slices
    budgets = sorted(sweeps["budget"])
    means = {(r["regime"], r["optimiser"]): r for r in table_rows}
    summary = {
        "function_evals_budget": params.BUDGET_EVALS,
        "chance_routing_accuracy": 1.0 / params.NUM_TASKS,
        "oracle_test_loss_mean": float(np.mean([r["oracle_test_loss"] for r in grid])),
        "gap_base_to_oracle_mean": float(np.mean([r["base_test_loss"] - r["oracle_test_loss"] for r in grid])),
        "wall_s_total": float(sum(r["wall_s"] for r in all_runs)),
        "paper_claim_holds": bool(check["holds"]),
        "paper_claim_holds_hybrid_reading": bool(check_hybrid["holds"]),
        "verdict": verdict,
        "evolution_only_minus_grad_excess_loss_cotrained": evo_only["cotrained"]["mean"],
        "noise_sweep_evo_minus_grad_at_zero_noise": sweeps["noise"][0.0]["mean"],
        "budget_sweep_evo_minus_grad_prealigned_smallest_budget": sweeps["budget"][budgets[0]]["mean"],
        "budget_sweep_smallest_budget_evals": budgets[0],
        "regime_grid_adapter_noise": params.ADAPTER_NOISE,
        "map_cells": region["cells"],
        "map_win_fraction": region["win_fraction"],
        "map_loss_fraction": region["loss_fraction"],
        "map_region_min_alignment": region["min_alignment"],
        "map_region_max_noise": region["max_noise"],
        "map_region_min_budget_evals": min(region["budgets_with_wins"], default=None),
        "map_region_max_budget_evals": max(region["budgets_with_wins"], default=None),
        "map_region_monotone": bool(region["monotone"]),
        "map_claim_holds_somewhere": bool(region["holds_somewhere"]),
        "map_verdict": map_verdict,
    }
    for reg in sb.REGIMES:
        for prefix, dd in (("evo", check["diffs"][reg]), ("hybrid", hybrid[reg])):
            summary[f"{prefix}_minus_grad_excess_loss_{reg}"] = dd["mean"]
            summary[f"{prefix}_minus_grad_excess_loss_{reg}_low"] = _finite_or_none(dd["low"])
            summary[f"{prefix}_minus_grad_excess_loss_{reg}_high"] = _finite_or_none(dd["high"])
        for opt in sb.OPTIMISERS:
            summary[f"excess_loss_{reg}_{opt}"] = means[(reg, opt)]["excess_loss"]
            summary[f"routing_accuracy_{reg}_{opt}"] = means[(reg, opt)]["routing_accuracy"]
    for suffix, b in boundaries.items():
        summary[f"alignment_boundary{suffix}"] = b["alignment_boundary"]
        summary[f"alignment_boundary{suffix}_low"] = b["alignment_boundary_low"]
        summary[f"alignment_boundary{suffix}_high"] = b["alignment_boundary_high"]
        summary[f"alignment_boundary{suffix}_bootstrap_share_no_crossing"] = b["bootstrap_share_no_crossing"]
    grad_pre, evo_pre = (np.array(per_seed(grid, "prealigned", o)[0]) for o in ("gradient", "evolution"))
    summary["power_note"] = "pre-aligned, evolution vs gradient: " + (
        stats.power_note(evo_pre, grad_pre, n_seeds=2 * len(params.seeds), nested=True) if len(params.seeds) >= 2
        else "one seed: seed noise not measured")
    return summary
