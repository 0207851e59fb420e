"""The intervals notebooks 06 and 07 write themselves are cluster-aware (docs/statistics.md S6), as 05's and 09's:
07's test-F1 keys (``f1_ci_*``, CoPES - ES), 06's per-arm accuracies (Table 3, the figure, the summary) and its
norm curve's points resample the seeds, the latent units and the problems within them and report how many units;
a file without unit ids counts every problem as its own unit and says so."""

import numpy as np
import pytest

from copes_lib.protocols import tables
from copes_lib.protocols.paper_a import ablations, fixed_budget, norm_curve

UNITS, PER_UNIT, SEEDS = 24, 20, 5
UNIT_IDS = tuple(np.repeat([f"U{u:02d}" for u in range(UNITS)], PER_UNIT))
CARRIERS = np.isin(UNIT_IDS, ["U00", "U01", "U02"])  # the units that carry CoPES's whole edge


def _clustered_f1(seed=0):
    """Per-problem test F1 of 24 units x 20 problems, 5 paired seeds: a unit's problems are alike (its own mean F1,
    shared by every arm and seed), a little seed and problem noise; CoPES's edge sits on 3 units."""
    rng = np.random.default_rng(seed)
    unit_mean = np.repeat(rng.uniform(0.1, 0.9, UNITS), PER_UNIT)
    problem = np.clip(unit_mean + rng.normal(0, 0.03, unit_mean.size), 0, 1)

    def arm(shift=0.0, seeds=SEEDS):
        noise = rng.normal(0, 0.02, (seeds, problem.size))
        return np.clip(problem + np.where(CARRIERS, shift, 0.0) + noise, 0, 1)
    return {"es": arm(), "copes": arm(0.6), "es_sqrtk_alpha": arm(), "base": arm(seeds=1), "full_grpo": arm(seeds=1)}


def _width(keys, low, high):
    return keys[high] - keys[low]


def test_07s_f1_keys_resample_units_and_name_them():
    f1 = _clustered_f1()
    over_units = fixed_budget.qa_f1_intervals(f1, UNIT_IDS)
    independent = fixed_budget.qa_f1_intervals(f1, None)
    for m in f1:  # every method's mean F1: much wider over 24 units than over 480 problems taken as independent
        assert _width(over_units, f"f1_ci_low_{m}", f"f1_ci_high_{m}") > 2 * _width(independent, f"f1_ci_low_{m}",
                                                                                   f"f1_ci_high_{m}"), m
        assert over_units[f"f1_units_{m}"] == UNITS and independent[f"f1_units_{m}"] == UNITS * PER_UNIT
        assert over_units[f"f1_ci_low_{m}"] <= f1[m].mean() <= over_units[f"f1_ci_high_{m}"]
    d, d_flat = "copes_minus_es_f1_ci_low", "copes_minus_es_f1_ci_high"
    assert _width(over_units, d, d_flat) > 2 * _width(independent, d, d_flat)  # the edge sits on 3 units
    assert over_units["copes_minus_es_f1"] == pytest.approx(f1["copes"].mean() - f1["es"].mean())
    assert over_units["copes_minus_es_f1_ci_low"] <= over_units["copes_minus_es_f1"] <= over_units[d_flat]
    assert over_units["copes_minus_es_f1_units"] == over_units["f1_interval_units"] == UNITS
    assert over_units["copes_minus_es_f1_units_effective"] == pytest.approx(UNITS)
    assert over_units["f1_interval_unit_ids"] is True and independent["f1_interval_unit_ids"] is False
    assert "latent units" in over_units["f1_interval_method"]
    assert "problems as independent units" in independent["f1_interval_method"]
    # the flat test calls a 3-unit edge significant; the unit-aware one is less sure of it
    assert independent["copes_minus_es_f1_p"] < over_units["copes_minus_es_f1_p"]
    with pytest.raises(ValueError, match="units"):
        fixed_budget.qa_f1_intervals(f1, UNIT_IDS[:10])


def _clustered_accuracy(seed=1):
    """0/1 validation scores of 24 units x 20 problems: each unit has its own solve rate, shared by every arm."""
    rng = np.random.default_rng(seed)
    rate = np.repeat(rng.uniform(0.05, 0.95, UNITS), PER_UNIT)
    scores = {arm: (rng.random((n, rate.size)) < rate).astype(float) for arm, n in (("k1", 5), ("k4", 5), ("k8", 2))}
    per_seed = {arm: [float(row.mean()) for row in x] for arm, x in scores.items()}  # the logged accuracies
    return per_seed, scores


def test_06s_arm_intervals_resample_units_and_name_them():
    per_seed, scores = _clustered_accuracy()
    val = ablations.arm_intervals(per_seed, scores, UNIT_IDS)
    flat = ablations.arm_intervals(per_seed, scores, None)
    for arm in scores:
        assert val[arm]["high"] - val[arm]["low"] > 2 * (flat[arm]["high"] - flat[arm]["low"]), arm
        assert val[arm]["mean"] == pytest.approx(np.mean(per_seed[arm])) == flat[arm]["mean"]
        assert (val[arm]["units"], flat[arm]["units"], val[arm]["n"]) == (UNITS, UNITS * PER_UNIT, len(per_seed[arm]))
    assert val["k4"]["over"] == f"seeds x {UNITS} latent units"
    assert flat["k4"]["over"] == f"seeds x {UNITS * PER_UNIT} problems as independent units (no unit ids)"
    keys = ablations.arm_keys(val)
    assert keys["val_accuracy_k8"] == pytest.approx(np.mean(per_seed["k8"]))
    assert (keys["val_accuracy_k8_ci_low"], keys["val_accuracy_k8_ci_high"]) == (val["k8"]["low"], val["k8"]["high"])
    assert keys["val_accuracy_k1_units"] == keys["interval_units"] == UNITS and keys["interval_unit_ids"] is True
    assert ablations.arm_keys(flat)["interval_unit_ids"] is False
    t3 = tables.table3_frame(val, {arm: 1.0 for arm in scores}).set_index("variant")
    assert t3.loc["K=4 (default)", "interval over"] == f"seeds x {UNITS} latent units"
    with pytest.raises(ValueError, match="k1"):
        ablations.arm_intervals({**per_seed, "k1": per_seed["k1"][:2]}, scores, UNIT_IDS)


def test_06s_norm_curve_points_resample_units_and_name_them():
    _, scores = _clustered_accuracy(2)
    es = [scores["k1"], scores["k1"][::-1]]
    copes = [scores["k4"], scores["k4"][::-1]]
    norms = lambda v: [[v] * 5, [2 * v] * 5]  # noqa: E731

    def judge(units):
        return norm_curve.judge_curve(es, norms(1.0), copes, norms(1.5), units=units, margin=None,
                                      es_multipliers=(1.0, 2.0), copes_multipliers=(1.0, 2.0), n_boot=500)
    curve, flat = judge(UNIT_IDS), judge([str(i) for i in range(len(UNIT_IDS))])  # every problem its own unit
    for p, q in zip(curve.points, flat.points, strict=True):
        assert p.high - p.low > 2 * (q.high - q.low), p.name
        assert p.low <= np.mean(p.accuracy) <= p.high
    frame = curve.frame()
    assert set(frame["units"]) == {UNITS} and set(flat.frame()["units"]) == {UNITS * PER_UNIT}
    assert list(frame["95% low"]) == [p.low for p in curve.points]


# ----------------------------------------------------------------------------- 05's validation-curve band
def test_training_records_per_problem_validation_scores_beside_the_run(tmp_path):
    """train_es records an objective's per-problem validation scores by step in val_scores.json (not in the
    history, whose rows stay scalars); a known start (base_validation) brings its scores for step 0."""
    from copes_lib.es import ESConfig
    from copes_lib.es_objective import QuadraticObjective, toy_quadratic
    from copes_lib.es_training import read_val_scores, train_es

    class PerProblem(QuadraticObjective):
        def validate(self, model):
            score = self.fitness(model, 0)
            return {"score": score, "per_problem": [score, 2 * score]}

    model, quad = toy_quadratic(seed=5)
    objective = PerProblem(quad.target)
    config = ESConfig(population=4, subspaces=1, sigma=0.1, alpha=0.05, chunk_size=64, seed=3)
    run = train_es(model, objective, config, steps=3, val_every=2, run_dir=tmp_path / "a")
    recorded = read_val_scores(tmp_path / "a")
    logged = dict(zip(*run.curve()))
    assert sorted(recorded) == sorted(logged) == [0, 2, 3]
    assert all(recorded[s] == pytest.approx([v, 2 * v]) for s, v in logged.items())
    assert not any("per_problem" in key for row in run.history for key in row)
    start = {"score": logged[0], "per_problem": [0.5, 0.25]}
    train_es(toy_quadratic(seed=5)[0], objective, config, steps=1, val_every=2, run_dir=tmp_path / "b",
             base_validation=start)
    assert read_val_scores(tmp_path / "b")[0] == [0.5, 0.25]
    assert read_val_scores(tmp_path / "none") == {}  # a run cached before scores were recorded


def _curve_runs(tmp_path, record=True, seeds=SEEDS, seed=3):
    """ES runs validated at steps 0, 4, 8 whose per-problem 0/1 scores have unit-level solve rates (24 units x 20
    problems, rising with the step): what es_training records beside a run, and the accuracy it logs."""
    from copes_lib.es_training import record_val_scores
    from copes_lib.protocols.paper_a.es_arm import ESRun

    rng = np.random.default_rng(seed)
    unit_rate = np.repeat(rng.uniform(0.05, 0.8, UNITS), PER_UNIT)
    out = []
    for i in range(seeds):
        folder = tmp_path / f"run{i}"
        folder.mkdir(parents=True)
        history = []
        for step in (0, 4, 8):
            row = (rng.random(unit_rate.size) < np.clip(unit_rate + 0.02 * step, 0, 1)).astype(float)
            if record:
                record_val_scores(folder, step, row.tolist())
            history.append({"step": step, "eval/val_accuracy": float(row.mean()), "eval/val_score": float(row.mean())})
        out.append(ESRun(f"es seed {i}", None, history, folder, i))
    return out


def test_05s_curve_band_resamples_units_per_point_and_names_them(tmp_path):
    runs_ = _curve_runs(tmp_path)
    band = fixed_budget.curve_band(runs_, UNIT_IDS)
    flat = fixed_budget.curve_band(runs_, None)
    assert band["steps"] == [0, 4, 8] and band["over_units"] == [True] * 3
    assert band["units"] == UNITS and flat["units"] == UNITS * PER_UNIT
    assert band["label"] == f"95% band: seeds x {UNITS} latent units"
    assert fixed_budget.curve_band(runs_[:1], UNIT_IDS)["label"] == f"95% band: {UNITS} latent units"  # one seed
    assert "problems as independent units" in flat["label"]
    for k, step in enumerate(band["steps"]):
        assert band["high"][k] - band["low"][k] > 2 * (flat["high"][k] - flat["low"][k]), step
        assert band["low"][k] <= band["mean"][k] <= band["high"][k]
        assert band["mean"][k] == pytest.approx(np.mean([r.history[k]["eval/val_accuracy"] for r in runs_]))
    # the seeds-only t-band the curve had before (the same runs, no scores recorded) is far narrower than the units'
    t_band = fixed_budget.curve_band(_curve_runs(tmp_path / "old", record=False), UNIT_IDS)
    assert t_band["over_units"] == [False] * 3 and t_band["units"] is None
    assert t_band["label"] == "95% band: t over seeds (no per-problem scores recorded)"
    assert t_band["mean"] == band["mean"]
    for k in range(3):
        assert band["high"][k] - band["low"][k] > 1.5 * (t_band["high"][k] - t_band["low"][k])


def test_05s_curve_band_falls_back_where_a_run_recorded_no_scores_and_says_so(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from copes_lib.protocols import plots

    runs_ = _curve_runs(tmp_path)
    (runs_[0].folder / "val_scores.json").unlink()  # one seed cached before the scores were recorded
    band = fixed_budget.curve_band(runs_, UNIT_IDS)
    assert band["over_units"] == [False] * 3 and "t over seeds" in band["label"]
    mixed = _curve_runs(tmp_path / "mixed")
    (mixed[0].folder / "val_scores.json").write_text('{"0": ' + str([0.0] * len(UNIT_IDS)) + "}")
    band = fixed_budget.curve_band(mixed, UNIT_IDS)
    assert band["over_units"] == [True, False, False]
    assert band["label"] == f"95% band: seeds x {UNITS} latent units at 1 of 3 steps, else t over seeds"
    fig, ax = plt.subplots()
    plots.seed_band(ax, [r.history for r in mixed], color="tab:blue", label="ES", band=band)
    assert band["label"] in ax.get_legend_handles_labels()[1][0]
    with pytest.raises(ValueError, match="steps"):
        plots.seed_band(ax, [r.history[:2] for r in mixed], color="tab:blue", label="ES", band=band)
    plt.close(fig)
