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
