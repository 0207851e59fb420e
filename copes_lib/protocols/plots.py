"""Figures the paper-A notebooks share."""

from __future__ import annotations

from typing import Any

import numpy as np


def plot_learning_curves(histories: dict[str, list[dict[str, Any]]]):
    """2 x 2 figure: validation accuracy vs steps and vs device-hours, reward mean +- std (spread of
    the population) vs steps, update norm per subspace vs steps."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for label, history in histories.items():
        val = [r for r in history if "eval/val_accuracy" in r]
        train = [r for r in history if "reward/mean" in r]
        axes[0, 0].plot([r["step"] for r in val], [r["eval/val_accuracy"] for r in val], "o-", label=label)
        axes[0, 1].plot([r["time/device_hours"] for r in val], [r["eval/val_accuracy"] for r in val], "o-",
                        label=label)
        steps = np.array([r["step"] for r in train])
        mean = np.array([r["reward/mean"] for r in train])
        std = np.array([r["reward/std"] for r in train])
        (line,) = axes[1, 0].plot(steps, mean, label=label)
        axes[1, 0].fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        k = 0
        while train and f"es/update_norm_k{k}" in train[0]:
            axes[1, 1].plot(steps, [r[f"es/update_norm_k{k}"] for r in train], color=line.get_color(),
                            alpha=0.4 + 0.6 / (k + 1), label=f"{label} k={k}")
            k += 1
    titles = [("step", "validation accuracy (greedy)"), ("device-hours (measured, steps only)", "validation accuracy"),
              ("step", "population reward: mean +- std"), ("step", "update norm ||alpha P_k g_k||")]
    for ax, (xlabel, ylabel) in zip(axes.ravel(), titles):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_sigma_sweeps(sweeps: dict[str, Any], title: str):
    """Validation accuracy after the sweep steps vs sigma (alpha = ratio x sigma), one line per sweep
    (rows with ``sigma``, ``final_val_accuracy``, ``base_val_accuracy``), the warm start dashed."""
    import matplotlib.pyplot as plt
    import pandas as pd

    fig, ax = plt.subplots(figsize=(5, 3.5))
    base = None
    for (label, rows), style in zip(sweeps.items(), ("o-", "s--", "^-.", "v:")):
        frame = pd.DataFrame(rows)
        ax.plot(frame["sigma"], frame["final_val_accuracy"], style, label=label)
        base = frame["base_val_accuracy"].iloc[0] if base is None else base
    ax.axhline(base, color="gray", ls="--", label="warm start")
    ax.set_xscale("log")
    ax.set_xlabel("sigma (alpha = ratio x sigma)")
    ax.set_ylabel("validation accuracy")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def plot_factorial(contrasts: list[dict[str, Any]], log_ppl: dict[str, list[float]], seeds: list[int]):
    """Notebook 12's figure. Left: each contrast's Delta (mean and 95% paired t-interval), its per-seed
    differences and the paper's Delta (written at the edge, with an arrow, when outside our range).
    Right: every cell's balanced log-PPL per seed, cells side by side within a seed (the pairing).
    ``contrasts``: rows of ``factorial.contrast_table``; ``log_ppl``: cell name -> value per seed."""
    import math

    import matplotlib.pyplot as plt

    from copes_lib.protocols import factorial

    by_name = {row["contrast"]: row for row in contrasts}
    order = [c for c in factorial.CONTRASTS if c in by_name]
    diffs = {name: factorial.paired_test(log_ppl[by_name[name]["test"]], log_ppl[by_name[name]["reference"]])["diffs"]
             for name in order}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    ax = axes[0]
    for i, name in enumerate(order):
        row = by_name[name]
        ax.scatter(diffs[name], [i + 0.18] * len(diffs[name]), color="grey", s=12, zorder=2,
                   label="seeds" if i == 0 else None)
        if math.isfinite(row["delta_low"]):
            ax.errorbar(row["delta_nats"], i, xerr=[[row["delta_nats"] - row["delta_low"]],
                                                    [row["delta_high"] - row["delta_nats"]]],
                        fmt="o", color="tab:blue", capsize=4, zorder=3,
                        label="ours: mean, 95% t-interval" if i == 0 else None)
        else:
            ax.scatter([row["delta_nats"]], [i], color="tab:blue", zorder=3)
    # the x range is ours (intervals and seeds); a paper value outside it is written at the edge, with its arrow
    ours = [v for name in order for v in (by_name[name]["delta_low"], by_name[name]["delta_high"], *diffs[name])
            if math.isfinite(v)]
    span = max(max(ours) - min(ours), 1e-6)
    low_x, high_x = min(min(ours), 0.0) - 0.15 * span, max(max(ours), 0.0) + 0.15 * span
    for i, name in enumerate(order):
        paper = by_name[name]["paper_delta_nats"]
        if paper is None or (isinstance(paper, float) and math.isnan(paper)):
            continue
        if low_x <= paper <= high_x:
            ax.scatter([paper], [i - 0.18], marker="D", color="tab:red", zorder=3, label="paper")
        else:
            edge, align, arrow = (high_x, "right", "\u2192") if paper > high_x else (low_x, "left", "\u2190")
            text = f"paper {paper:+.4f} {arrow}" if paper > high_x else f"{arrow} paper {paper:+.4f}"
            ax.text(edge, i - 0.22, text, color="tab:red", ha=align, va="center", fontsize=8)
    ax.set_xlim(low_x, high_x)
    ax.axvline(0, color="k", lw=0.8)
    ax.set(yticks=np.arange(len(order)), yticklabels=order, xlabel="Delta balanced log-PPL (nats, + = factor helps)",
           title=f"Contrasts, {len(seeds)} seeds (df = {len(seeds) - 1})")
    ax.invert_yaxis()
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="best", fontsize=8)
    ax = axes[1]
    # a categorical seed axis; cells side by side within each seed so no point hides another
    seed_pos = np.arange(len(seeds))
    width = 0.8 / len(log_ppl)
    for k, name in enumerate(log_ppl):
        ax.scatter(seed_pos - 0.4 + width * (k + 0.5), log_ppl[name], marker="os^vDP"[k % 6], label=name, zorder=2)
    ax.set_xticks(seed_pos, [f"seed {s}" for s in seeds])
    for edge in seed_pos[:-1] + 0.5:
        ax.axvline(edge, color="0.85", lw=0.8, zorder=1)
    ax.set(ylabel="test balanced log-PPL (nats)",
           title="Cells per seed (paired within a seed; +R+E = +R by construction)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_collapse_map(rows: list[dict[str, Any]], histories: dict[str, list[dict[str, Any]]], n_slots: int):
    """Notebook 11's collapse map (docs/molora_regime.md#m3-the-map). Left: a heatmap of R0's monopoly
    count (slots for 90% of the gate mass, test windows) over router learning rate x input scale, each cell
    annotated with the count and the top-4 share; the colour scale ends at S and its collapsed band
    (<= S/4) is marked on the colour bar. Right: the count against steps (training windows) for each run in
    ``histories`` ({label: history}), the collapsed band shaded. ``rows``: ``molora_cells.map_row`` rows."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    frame = pd.DataFrame(rows)
    counts = frame.pivot(index="router_lr_x", columns="input_scale", values="monopoly_slots").sort_index()
    top4 = frame.pivot(index="router_lr_x", columns="input_scale", values="top4_share").loc[counts.index]
    labels = counts.astype(int).astype(str) + "\n" + top4.map(lambda v: f"top-4 {v:.2f}")
    counts.index = [f"x{v:g}" for v in counts.index]
    counts.columns = [f"x{v:g}" for v in counts.columns]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [1, 1.3]})
    ax = sns.heatmap(counts, annot=labels, fmt="", cmap="magma", vmin=1, vmax=n_slots, ax=axes[0],
                     cbar_kws={"label": "slots for 90% of gate mass"}, linewidths=0.5, linecolor="white")
    ax.collections[0].colorbar.ax.axhspan(1, n_slots / 4, color="cyan", alpha=0.35)
    ax.invert_yaxis()  # larger learning rates up
    ax.set(xlabel="R0 input scale", ylabel="router learning rate multiplier",
           title=f"R0 monopoly count (collapsed <= {n_slots // 4}, cyan on the bar)")
    ax = axes[1]
    for label, history in histories.items():
        ax.plot([r["step"] for r in history], [r["moe/monopoly_slots"] for r in history], marker=".", label=label)
    ax.axhspan(0.5, n_slots / 4, color="cyan", alpha=0.15, label=f"collapsed (<= {n_slots // 4})")
    ax.set(xlabel="adapter step", ylabel="slots for 90% of mass (training batches)", ylim=(0.5, n_slots + 0.5),
           title="R0 over training (steps axis)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
