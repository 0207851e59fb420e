"""Notebook 09's figures: the scale axis (gain recovery and CoPES - ES over sizes, the direction test,
the efficiency prediction), the phase diagram of the map and low rank on the map.

Each function takes the notebook's results (cells, ``map_keys``) and returns a matplotlib figure; the
notebook saves and shows it. The slope test behind each trend line is :func:`size_fits` (its numbers go
into the summary, so they are computed once, apart from drawing)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from copes_lib.protocols.study.base import (
    QWEN35_4B_PARAMS,
    ScaleStudyParams,
    es_family_arms,
    gain_recovery,
    gap,
)
from copes_lib.protocols.study.map_study import MAP_LOWRANK_ARMS, MAP_PRECONDITIONS, map_bases, map_tag
from copes_lib.protocols.study.size_axis import slope_test

ARM_COLORS = {"es": "tab:blue", "copes_paper": "tab:orange", "copes_step_matched": "tab:green", "grpo": "tab:red"}
# the phase diagram's rows: (map key, title, scale)
PHASE_QUANTITIES = (("es_gain_recovery", "ES gain recovery (strict)", 1.0),
                    ("copes_minus_es", "CoPES - ES (strict, points)", 100.0),
                    ("es_delta_protocol", "ES's protocol part, Delta S - Delta L (points)", 100.0))
LOWRANK_COLORS = {"es": "C0", "es_lowrank": "C9", "copes": "C1", "copes_lowrank": "C3"}


def size_fits(params: ScaleStudyParams, cells: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The slope test over sizes (:func:`slope_test`) of each ES-family arm's gain recovery
    (``gain_recovery_<arm>``) and of each protocol's CoPES - ES gap (``copes_<protocol>_minus_es``)."""
    n_params = [c["n_params"] for c in cells.values()]
    fits = {}
    for arm in es_family_arms(params):
        recs = [gain_recovery(c, arm) for c in cells.values()]
        fits[f"gain_recovery_{arm}"] = slope_test(n_params, [r["mean"] for r in recs], [r["low"] for r in recs],
                                                  [r["high"] for r in recs])
    for protocol in params.protocols():
        comps = [gap(c, protocol) for c in cells.values()]
        fits[f"copes_{protocol}_minus_es"] = slope_test(n_params, [c.estimate for c in comps], [c.low for c in comps],
                                                        [c.high for c in comps])
    return fits


def _trend(ax, fit: dict[str, Any], n_params: list[int], color: str, scale: float = 1.0) -> None:
    """The fitted line out to 4B, drawn only where the 4B rule allows it (docs/mechanism.md#m3-the-4b-extrapolation-rule)."""
    if fit["extrapolation_allowed"]:
        xs = np.logspace(math.log10(min(n_params)), math.log10(QWEN35_4B_PARAMS), 50)
        ax.plot(xs, scale * (fit["intercept"] + fit["slope_per_decade"] * np.log10(xs)), ls=":", color=color,
                alpha=0.6)
        ax.plot([QWEN35_4B_PARAMS], [scale * fit["at"]], marker="x", color=color)


def _size_axis(ax, n_params: list[int], fits: dict[str, dict[str, Any]]) -> None:
    ax.set_xscale("log")
    right = QWEN35_4B_PARAMS * 2 if any(f["extrapolation_allowed"] for f in fits.values()) else max(n_params) * 2
    ax.set_xlim(min(n_params) / 2, right)
    ax.set_xlabel("parameters (log)")


def _no_panel(ax, why: str) -> None:
    """A panel with fewer than 2 points says nothing: say why instead of drawing one point."""
    ax.cla()
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=9, wrap=True, transform=ax.transAxes)


def _errorbar_mean(ax, xs, mean, low, high, **kwargs) -> None:
    ax.errorbar(xs, mean, yerr=[[m - lo for m, lo in zip(mean, low)], [hi - m for m, hi in zip(mean, high)]],
                **kwargs)


def _gain_recovery_panel(ax, params, cells, n_params, fits) -> None:
    for arm in es_family_arms(params):
        recs = [gain_recovery(c, arm) for c in cells.values()]
        ok = [i for i, r in enumerate(recs) if r["mean"] is not None]
        mean = [recs[i]["mean"] for i in ok]
        low = [recs[i]["low"] if recs[i]["low"] is not None else recs[i]["mean"] for i in ok]
        high = [recs[i]["high"] if recs[i]["high"] is not None else recs[i]["mean"] for i in ok]
        _errorbar_mean(ax, [n_params[i] for i in ok], mean, low, high, marker="o", capsize=3, color=ARM_COLORS[arm],
                       label=arm)
        _trend(ax, fits[f"gain_recovery_{arm}"], n_params, ARM_COLORS[arm])
    ax.axhline(0, color="k", lw=0.5)
    # the x range reaches 4B where this panel's own lines are extrapolated
    _size_axis(ax, n_params, {k: f for k, f in fits.items() if k.startswith("gain_recovery_")})
    ax.set_ylabel("gain recovery (fraction of GRPO's gain)")
    ax.set_title("gain recovery at the budget (95% interval: seeds x latent units x problems)")
    ax.legend(fontsize=7)


def _gap_panel(ax, params, cells, n_params, fits) -> None:
    for protocol in params.protocols():
        comps = [gap(c, protocol) for c in cells.values()]
        color = ARM_COLORS[f"copes_{protocol}"]
        ax.errorbar(n_params, [100 * c.estimate for c in comps],
                    yerr=[[100 * (c.estimate - c.low) for c in comps], [100 * (c.high - c.estimate) for c in comps]],
                    marker="o", capsize=3, color=color, label=f"CoPES ({protocol}) - ES")
        _trend(ax, fits[f"copes_{protocol}_minus_es"], n_params, color, 100)
    ax.axhline(0, color="k", lw=0.5)
    _size_axis(ax, n_params, fits)  # as drawn since the first run: 4B where any line of the figure reaches it
    ax.set_ylabel("validation accuracy difference (points)")
    ax.set_title("CoPES - ES at the budget (95% interval, seeds x latent units x problems)")
    ax.legend(fontsize=7)


def _direction_test_panel(ax, params, cells, mech_by_size) -> bool:
    """Each size's random-direction distribution (grey) and the three updates on it; False if no size had
    a non-zero update."""
    tested = [s for s in cells if mech_by_size[s] and cells[s]["mechanism"]["direction_test"]]
    for j, s in enumerate(tested):
        test = cells[s]["mechanism"]["direction_test"]
        deltas = np.asarray(test["random"]["deltas"])
        ax.scatter(j + np.linspace(-0.15, 0.15, len(deltas)), np.sort(deltas), s=8, color="gray", alpha=0.6,
                   label="random directions" if j == 0 else None)
        for k, name in enumerate(("es", "copes_paper", "grpo")):
            if name in test["updates"]:
                ax.plot([j + 0.25 + 0.08 * k], [test["updates"][name]["delta"]], marker="D", color=ARM_COLORS[name],
                        ls="none", label=name if j == 0 else None)
    ax.set_xticks(range(len(tested)), [f"{s}\n{cells[s]['n_params']:,}" for s in tested])
    ax.axhline(0, color="k", lw=0.5)
    ax.set_ylabel("held-out fitness change")
    ax.set_title(f"one step along each update vs {params.MECH_RANDOM} random directions (same norm)")
    ax.legend(fontsize=7)
    return bool(tested)


def _efficiency_panel(ax, mech_by_size) -> int:
    """The prediction rho^2 N / (d_eff + N - 1) beside ES's measured per-step efficiency, per size;
    returns how many points are defined."""
    measured = [s for s, m in mech_by_size.items() if m]
    x = np.arange(len(measured))
    pred = [mech_by_size[s]["mech_predicted_efficiency"] for s in measured]
    meas = [mech_by_size[s]["mech_measured_efficiency"] for s in measured]
    lo = [mech_by_size[s]["mech_measured_efficiency_low"] for s in measured]
    hi = [mech_by_size[s]["mech_measured_efficiency_high"] for s in measured]
    ok = [i for i in range(len(measured)) if meas[i] is not None and lo[i] is not None]
    _errorbar_mean(ax, x[ok] + 0.05, [meas[i] for i in ok], [lo[i] for i in ok], [hi[i] for i in ok], marker="o",
                   ls="none", capsize=3, color=ARM_COLORS["es"], label="measured: ES gain / GRPO gain (budget)")
    okp = [i for i in range(len(measured)) if pred[i] is not None]
    ax.plot(x[okp] - 0.05, [pred[i] for i in okp], marker="s", ls="none", color="k",
            label="predicted: rho^2 N / (d_eff + N - 1)")
    labels = []
    for s in measured:
        d = mech_by_size[s]["mech_d_eff"]
        labels.append(f"{s}\nd_eff " + (f"{d:.3g}" if d is not None else "undef."))
    ax.set_xticks(x, labels)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_ylabel("ES's per-step efficiency")
    ax.set_title("prediction vs measurement (undefined points are left out)")
    ax.legend(fontsize=7)
    return len(ok) + len(okp)


def plot_scale_axis(params: ScaleStudyParams, cells: dict[str, dict[str, Any]],
                    mech_by_size: dict[str, dict[str, Any]], fits: dict[str, dict[str, Any]]):
    """2 x 2 figure over sizes: gain recovery and CoPES - ES with their trend lines (out to 4B only where
    the rule allows it), the direction test, and the efficiency prediction vs the measurement. A panel
    that cannot draw a comparison (one size, no update, fewer than 2 defined points) says why instead."""
    import matplotlib.pyplot as plt

    sizes = list(cells)
    n_params = [cells[s]["n_params"] for s in sizes]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    _gain_recovery_panel(axes[0, 0], params, cells, n_params, fits)
    _gap_panel(axes[0, 1], params, cells, n_params, fits)
    if len(sizes) < 2:
        for ax in axes[0]:
            _no_panel(ax, f"one size ({sizes[0]}): no trend over sizes to draw (the tables above hold its values)")
    tested = _direction_test_panel(axes[1, 0], params, cells, mech_by_size)
    if _efficiency_panel(axes[1, 1], mech_by_size) < 2:
        _no_panel(axes[1, 1], "prediction vs measured efficiency: defined at fewer than 2 points "
                  "(mech_efficiency_verdict in the table above says why)")
    if not tested:
        _no_panel(axes[1, 0], "direction test: no size had a non-zero update")
    fig.tight_layout()
    return fig


def _phase_grid(params: ScaleStudyParams, map_keys: dict[str, Any], key: str, scale: float, regime: str):
    """One regime's grid of ``key`` (rows: populations, columns: priors) and its annotations: the value,
    '*' where its 95% interval excludes 0, "n/a" where it is undefined."""
    ps = [p for r, p in map_bases(params) if r == regime]
    pops = params.map_populations()
    values = np.full((len(pops), len(ps)), np.nan)
    marks = np.full((len(pops), len(ps)), "n/a", dtype=object)
    for j, p in enumerate(ps):
        for i, n in enumerate(pops):
            v, lo, hi = (map_keys.get(f"map_{key}{part}_{map_tag(regime, p, n)}") for part in ("", "_low", "_high"))
            if v is not None:
                values[i, j] = scale * v
                marks[i, j] = f"{scale * v:.2g}" + ("*" if lo is not None and hi is not None and (lo > 0 or hi < 0) else "")
    return ps, values, marks


def plot_phase_diagram(params: ScaleStudyParams, map_keys: dict[str, Any]):
    """The map's phase diagram: one row per quantity (:data:`PHASE_QUANTITIES`), one column per regime
    (the latent one as wide as its priors), one symmetric colour scale per row so regimes compare at a
    glance; '*' where the cell's 95% interval excludes 0, grey "n/a" where the value is undefined (gain
    recovery: full GRPO did not gain on that base)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    regimes = params.map_regimes()
    pops = params.map_populations()
    widths = [sum(r == regime for r, _ in map_bases(params)) for regime in regimes] or [1]
    fig, axes = plt.subplots(len(PHASE_QUANTITIES), len(widths),
                             figsize=(2.2 * sum(widths) + 2, 2.6 * len(PHASE_QUANTITIES)),
                             squeeze=False, gridspec_kw={"width_ratios": widths})
    for row, (key, title, scale) in enumerate(PHASE_QUANTITIES):
        grids = {regime: _phase_grid(params, map_keys, key, scale, regime) for regime in regimes}
        finite = [abs(x) for _, v, _ in grids.values() for x in v.ravel() if np.isfinite(x)]
        lim = max(finite + [1e-9])
        for col, regime in enumerate(regimes):
            ps, values, marks = grids[regime]
            ax = axes[row, col]
            ax.set_facecolor("0.85")  # undefined cells
            sns.heatmap(values, ax=ax, annot=marks, fmt="", cmap="RdBu_r", vmin=-lim, vmax=lim,
                        cbar=col == len(regimes) - 1, annot_kws={"fontsize": 8},
                        xticklabels=[f"p {p:g}" if p is not None else regime.replace("_", " ") for p in ps],
                        yticklabels=[f"N {n} (K {params.map_subspaces(n)})" for n in pops])
            for i in range(len(pops)):
                for j in range(len(ps)):
                    if not np.isfinite(values[i, j]):
                        ax.text(j + 0.5, i + 0.5, "n/a", ha="center", va="center", fontsize=8, color="0.3")
            ax.set_title(f"{title}: {regime}" if col == 0 else regime, fontsize=9)
    fig.suptitle(f"Where ES and CoPES work ({params.MAP_SIZE}, {params.MAP_STEPS} steps, {params.MAP_SEEDS} seeds "
                 "per cell; * : 95% interval excludes 0)", fontsize=10)
    fig.tight_layout()
    return fig


VERDICT_VALUES = {"holds": 1.0, "fails": 0.0}  # "not measured": grey


def plot_map_preflight(params: ScaleStudyParams, map_keys: dict[str, Any]):
    """Where each precondition fails on the map: one row per map base, one column per measured precondition
    (G1, G2, E1 of docs/preflight.md#p1-the-preconditions) and R's analogue (the map's full-GRPO reference),
    green where it holds, red where it fails, grey where not measured; each cell shows the measured value."""
    import matplotlib.pyplot as plt

    tags = [map_tag(*b) for b in map_bases(params)]
    cols = [*MAP_PRECONDITIONS, "R analogue"]
    names = [f"preflight_{c.lower()}" if c != "R analogue" else "preflight_r_analogue" for c in cols]
    verdicts = np.array([[VERDICT_VALUES.get(map_keys.get(f"map_{n}_verdict_{t}"), np.nan) for n in names]
                         for t in tags], dtype=float).reshape(len(tags), len(cols))
    fig, ax = plt.subplots(figsize=(1.6 * len(cols) + 2.5, 0.45 * len(tags) + 1.4))
    ax.set_facecolor("0.85")
    ax.imshow(np.ma.masked_invalid(verdicts), cmap="RdYlGn", vmin=-0.3, vmax=1.3, aspect="auto")
    for i, t in enumerate(tags):
        for j, n in enumerate(names):
            v = map_keys.get(f"map_{n}_{t}")
            # E1 without a value but failing: no sigma of the ladder made half the members differ (P3 rule 1)
            missing = "no sigma" if n == "preflight_e1" and verdicts[i, j] == 0.0 else "n/a"
            ax.text(j, i, missing if v is None else f"{v:+.2f}" if j == len(cols) - 1 else f"{v:.2f}",
                    ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(tags)), tags)
    ax.set_title("Preconditions per map base (green holds, red fails, grey not measured; docs/preflight.md P1)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def _interval(map_keys: dict[str, Any], name: str, cell: str) -> tuple[float, float, float] | None:
    v, lo, hi = (map_keys.get(f"{name}{part}_{cell}") for part in ("", "_low", "_high"))
    return None if v is None or lo is None or hi is None else (v, lo, hi)


def plot_lowrank_map(params: ScaleStudyParams, map_keys: dict[str, Any], lowrank_cells: list[str]):
    """Low rank on the map (docs/lowrank_es.md#l4-low-rank-on-the-map): per low-rank cell, the strict gain
    Delta S of each arm (left) and the paired low-rank minus full-rank difference with the registered
    margin and its reading (right)."""
    import matplotlib.pyplot as plt

    fig, (ax_gain, ax_diff) = plt.subplots(1, 2, figsize=(11, 3.8))
    for j, c in enumerate(lowrank_cells):
        for k, arm in enumerate(LOWRANK_COLORS):
            if (got := _interval(map_keys, f"map_{arm}_delta_s", c)) is not None:
                v, lo, hi = got
                ax_gain.errorbar([j + 0.15 * (k - 1.5)], [100 * v], yerr=[[100 * (v - lo)], [100 * (hi - v)]],
                                 marker="o", capsize=3, color=LOWRANK_COLORS[arm], label=arm if j == 0 else None)
        for k, (low, full) in enumerate(MAP_LOWRANK_ARMS.items()):
            if (got := _interval(map_keys, f"map_{low}_minus_{full}", c)) is None:
                continue
            v, lo, hi = got
            reading = map_keys.get(f"map_{low}_minus_{full}_prediction_{c}")
            ax_diff.errorbar([j + 0.2 * (k - 0.5)], [100 * v], yerr=[[100 * (v - lo)], [100 * (hi - v)]], marker="s",
                             capsize=3, color=LOWRANK_COLORS[low], label=f"{low} - {full}" if j == 0 else None)
            ax_diff.annotate(reading, (j + 0.2 * (k - 0.5), 100 * hi), textcoords="offset points", xytext=(0, 4),
                             ha="center", fontsize=7)
    margin = 100 * map_keys["map_lowrank_margin"]
    ax_diff.axhspan(-margin, margin, color="0.9", zorder=0, label=f"margin +-{margin:g} points")
    for ax in (ax_gain, ax_diff):
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xticks(range(len(lowrank_cells)), lowrank_cells)
        ax.legend(fontsize=7)
    ax_gain.set_ylabel("strict gain Delta S (points)")
    ax_gain.set_title(f"full rank vs rank {params.MAP_LOWRANK_RANK} (95% interval, seeds x latent units x problems)", fontsize=9)
    ax_diff.set_ylabel("low rank - full rank, strict (points)")
    ax_diff.set_title(f"paired by seed; overall reading: {map_keys['map_lowrank_prediction']}", fontsize=9)
    fig.tight_layout()
    return fig
