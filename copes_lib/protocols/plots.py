"""Figures the notebooks share, in one style (:func:`style`, seaborn's).

Uncertainty is drawn the same way everywhere: each seed faint (or as a point, labelled with its real
seed), the mean bold with its 95% interval, bands clipped to the metric's range (an accuracy band never
leaves [0, 1]), and every panel's legend says how many seeds its own lines average.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from copes_lib import stats

UNIT_RANGE = (0.0, 1.0)  # accuracy, F1, pass@k: the range every band of these metrics is clipped to


def style() -> list[str]:
    """Apply the suite's plotting style (seaborn ``whitegrid``, colour-blind palette) to matplotlib;
    returns the palette's colours. Call once per notebook, before its first figure."""
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind", font_scale=0.85,
                  rc={"legend.fontsize": 7, "axes.titlesize": 10, "figure.dpi": 100})
    return sns.color_palette("colorblind").as_hex()


def clip_band(low: Sequence[float], high: Sequence[float], limits: tuple[float, float] | None = UNIT_RANGE
              ) -> tuple[np.ndarray, np.ndarray]:
    """An interval band clipped to the metric's range (None: unclipped).

    >>> [list(map(float, x)) for x in clip_band([-0.4, 0.2], [0.5, 1.3])]
    [[0.0, 0.2], [0.5, 1.0]]
    """
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    if limits is None:
        return low, high
    return np.clip(low, *limits), np.clip(high, *limits)


def _seeds_text(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def seed_band(ax: Any, histories: Sequence[Sequence[dict[str, Any]]], *, color: str, label: str,
              metric: str = "eval/val_accuracy", marker: str = "o",
              limits: tuple[float, float] | None = UNIT_RANGE, band: dict[str, Any] | None = None) -> None:
    """Each seed's validation curve faint, the mean over seeds bold with its 95% band clipped to ``limits`` (at
    the steps every seed validated): ``band`` (``fixed_budget.curve_band``: seeds x latent units, its label
    saying so) where given, else the Student-t band over the seeds (one seed: no band). The label says how many
    seeds."""
    from copes_lib.protocols.histories import mean_curve, val_points

    for h in histories:
        ax.plot(*val_points(h, metric), "-", color=color, alpha=0.25, lw=0.8)
    steps, _ = mean_curve(histories, metric)
    by_step = [[dict(zip(*val_points(h, metric)))[s] for h in histories] for s in steps]
    cis = [stats.mean_ci(v) if len(v) > 1 else (v[0], math.nan, math.nan) for v in by_step]
    mean = np.array([c[0] for c in cis])
    n = len(histories)
    if band is not None:
        if list(band["steps"]) != list(steps):
            raise ValueError(f"band covers steps {band['steps']}, the curves {steps}: pass curve_band of the same runs")
        cis = [(m, math.nan if lo is None else lo, math.nan if hi is None else hi)
               for m, lo, hi in zip(mean, band["low"], band["high"], strict=True)]
    text = band["label"] if band is not None else "95% band" if n > 1 else ""
    ax.plot(steps, mean, f"-{marker}", color=color, ms=3,
            label=f"{label} (mean of {_seeds_text(n)}" + (f", {text})" if text else ")"))
    if any(math.isfinite(c[1]) for c in cis):
        low, high = clip_band([c[1] for c in cis], [c[2] for c in cis], limits)
        ax.fill_between(steps, low, high, color=color, alpha=0.2, lw=0)


def seed_points(ax: Any, per_seed: dict[str, Sequence[float]], seeds: dict[str, Sequence[int]], *,
                intervals: dict[str, tuple[float, float | None, float | None]] | None = None,
                limits: tuple[float, float] | None = UNIT_RANGE, interval_label: str = "mean, 95% interval") -> None:
    """Per-arm points for every seed (coloured by the real seed number, one legend entry per seed) and
    the arm's mean with its interval (``intervals``: arm -> (mean, low, high), e.g. seeds x problems; by
    default the Student-t interval over the seeds), clipped to ``limits``. Arms are the x axis."""
    import pandas as pd
    import seaborn as sns

    arms = list(per_seed)
    frame = pd.DataFrame([{"arm": arm, "value": float(v), "seed": f"seed {s}"}
                          for arm in arms for v, s in zip(per_seed[arm], seeds[arm], strict=True)])
    sns.stripplot(data=frame, x="arm", y="value", hue="seed", order=arms, dodge=False, jitter=0.15, size=4,
                  alpha=0.8, ax=ax, palette="crest")
    for i, arm in enumerate(arms):
        mean, low, high = (intervals[arm] if intervals and arm in intervals else stats.mean_ci(per_seed[arm]))
        if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
            low = high = mean
        (low,), (high,) = clip_band([low], [high], limits)
        ax.errorbar([i], [mean], yerr=[[mean - low], [high - mean]], fmt="D", ms=5, color="black", capsize=5,
                    lw=1.4, zorder=5, label=interval_label if i == 0 else None)
    counts = sorted({len(per_seed[a]) for a in arms})
    ax.set_xlabel("")
    ax.legend(fontsize=6, title=f"{'/'.join(map(str, counts))} seed(s) per arm", title_fontsize=7)


def heatmap(ax: Any, frame: Any, *, index: str, columns: str, values: str, center: float | None = 0.0,
            fmt: str = "+.2f", cmap: str = "vlag", label: str = "", marks: Any = None, **kwargs: Any) -> None:
    """An annotated heatmap of ``values`` over ``index`` x ``columns`` (a long table), e.g. a region map,
    ``index`` growing upwards; ``marks`` (a pivoted table of strings) overrides the annotations (e.g. win /
    loss); other keyword arguments go to ``seaborn.heatmap`` (``norm``, ``cbar``, ``vmin``...)."""
    import seaborn as sns

    grid = frame.pivot_table(index=index, columns=columns, values=values, aggfunc="mean").sort_index(ascending=False)
    annot = True if marks is None else marks.reindex(index=grid.index, columns=grid.columns).to_numpy()
    if kwargs.get("cbar", True):
        kwargs.setdefault("cbar_kws", {"label": label or values})
    sns.heatmap(grid, ax=ax, center=center, cmap=cmap, annot=annot, fmt=fmt if marks is None else "",
                linewidths=0.5, annot_kws={"fontsize": 7}, **kwargs)


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

    from copes_lib.protocols.paper_b import factorial

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


def plot_ablations(arm_runs: dict[str, list[Any]], norms: dict[str, float], per_seed: dict[str, list[float]],
                   val: dict[str, dict[str, float]], family: dict[str, stats.Comparison], *, base: float, budget: int,
                   es_seed: int, seed_counts: str):
    """Notebook 06's figure: one small panel per arm with every seed's update norm per step (no arm hides
    another), then the mean update norm, the accuracy at the budget (each seed, the seed mean with its 95%
    interval: ``val`` from ``ablations.arm_intervals``, seeds x latent units) and the k4 - X contrasts (green: effect; red: opposite). ``es_seed`` is the first noise seed
    (a run's label is ``es_seed + seed_index``); ``seed_counts`` titles the norm legend."""
    import matplotlib.pyplot as plt

    arms = list(arm_runs)
    fig = plt.figure(figsize=(15, 7.5), layout="constrained")
    upper, lower = fig.subfigures(2, 1, height_ratios=[1, 1.3])
    top = np.atleast_1d(upper.subplots(1, len(arms), sharey=True))
    for ax, key in zip(top, arms, strict=True):
        for r in arm_runs[key]:
            rows = [row for row in r.history if "es/update_norm" in row]
            ax.plot([row["step"] for row in rows], [row["es/update_norm"] for row in rows], "o-", ms=3, lw=1,
                    label=f"seed {es_seed + r.seed_index}")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    top[0].set_ylabel("||update|| per step")
    top[0].set_yscale("log")
    top[0].legend(fontsize=6, title=seed_counts, title_fontsize=6)
    ax_norm, ax_acc, ax_diff = lower.subplots(1, 3)
    ax_norm.bar(arms, [norms[k] for k in arms], color="tab:gray")
    ax_norm.set_ylabel("mean ||update||")
    ax_norm.set_title("mean update norm")
    ax_norm.tick_params(axis="x", rotation=45)
    ax_acc.axhline(base, color="gray", ls="--", label="warm start")
    seed_points(ax_acc, per_seed, {k: [es_seed + r.seed_index for r in arm_runs[k]] for k in arms},
                intervals={k: (val[k]["mean"], val[k]["low"], val[k]["high"]) for k in arms},
                interval_label=f"mean, 95% interval ({val[arms[0]].get('over', 'seeds')})")
    ax_acc.tick_params(axis="x", rotation=45)
    ax_acc.set_ylabel(f"validation accuracy @ {budget}")
    ax_acc.set_title("accuracy at the budget")
    names = list(family)
    for j, name in enumerate(names):
        c = family[name]
        colour = {stats.EFFECT: "tab:green", stats.OPPOSITE: "tab:red"}.get(c.verdict, "tab:gray")
        (low,), (high,) = clip_band([c.low], [c.high], (-1.0, 1.0))  # a difference of accuracies: [-1, 1]
        ax_diff.errorbar(100 * c.estimate, j, xerr=[[100 * (c.estimate - low)], [100 * (high - c.estimate)]],
                         fmt="o", capsize=4, color=colour)
    ax_diff.axvline(0, color="k", lw=0.8)
    ax_diff.set_yticks(range(len(names)), [f"k4 - {n}" for n in names])
    ax_diff.invert_yaxis()
    units = {c.n_units or c.n_problems for c in family.values()}
    ax_diff.set_xlabel(f"difference (points), 95% interval: seeds x {'/'.join(map(str, sorted(units)))} "
                       f"{'units' if all(c.n_units for c in family.values()) else 'problems'}")
    ax_diff.set_title(f"contrasts (Holm over {len(names)}; green: effect)")
    return fig
