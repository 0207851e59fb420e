"""The shared figure helpers: bands stay inside the metric's range, legends say their own seed counts, seeds
carry their real numbers."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from copes_lib.protocols import plots  # noqa: E402


def _history(values):
    return [{"step": 4 * i, "eval/val_accuracy": v} for i, v in enumerate(values)]


def test_seed_band_is_clipped_and_labelled_with_its_seed_count():
    plots.style()
    fig, ax = plt.subplots()
    # two seeds far apart near 0: the Student-t band would run far below 0
    plots.seed_band(ax, [_history([0.0, 0.02]), _history([0.3, 0.5])], color="tab:blue", label="ES")
    plots.seed_band(ax, [_history([0.1, 0.2])], color="tab:red", label="CoPES")
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() >= 0.0 and band[:, 1].max() <= 1.0
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["ES (mean of 2 seeds, 95% band)", "CoPES (mean of 1 seed)"]
    plt.close(fig)


def test_seed_points_use_real_seed_numbers_and_clip_intervals():
    fig, ax = plt.subplots()
    plots.seed_points(ax, {"k1": [0.4, 0.5], "k4": [0.9, 1.0]}, {"k1": [33, 34], "k4": [33, 34]},
                      intervals={"k1": (0.45, 0.3, 0.6), "k4": (0.95, 0.7, 1.4)})
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "seed 33" in texts and "seed 34" in texts and "seed 0" not in texts
    assert "2 seed(s) per arm" in ax.get_legend().get_title().get_text()
    tops = [seg[:, 1].max() for coll in ax.collections if hasattr(coll, "get_segments") for seg in coll.get_segments()]
    assert tops and max(tops) <= 1.0
    plt.close(fig)


def test_heatmap_of_a_long_table():
    frame = pd.DataFrame([{"alignment": a, "noise": n, "d": a - n} for a in (0.0, 1.0) for n in (0.0, 0.1)])
    fig, ax = plt.subplots()
    plots.heatmap(ax, frame, index="alignment", columns="noise", values="d", label="evo - grad")
    assert len(ax.texts) == 4 and np.isclose(float(ax.texts[0].get_text()), 1.0)
    plt.close(fig)
