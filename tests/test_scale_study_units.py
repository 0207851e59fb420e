"""Notebook 09's intervals are cluster-aware (docs/statistics.md S6): the size axis's CoPES - ES gap and gain
recovery, the map's cells, its R analogue and the predictions resample the latent units (and the problems within
them) every cell and map base carries, report how many, and save them beside the scores; a cued base's unit is
its cue letter (docs/regime.md R11), and a base without unit ids gets them from its tasks."""

import types

import numpy as np
import pytest
from test_scale_study import map_params, params

from copes_lib import stats
from copes_lib.protocols import study as ss
from copes_lib.tasks import load_tasks

UNITS, PER_UNIT, SEEDS = 24, 10, 5
UNIT_IDS = [f"U{u:02d}" for u in range(UNITS) for _ in range(PER_UNIT)]
CARRIERS = np.isin(UNIT_IDS, ["U00", "U01", "U02"])  # the units that carry the whole edge


def _rows(rng, rate, n, carried_rate=None):
    """n rows of 0/1 scores; where ``carried_rate`` is given, the carrier units' problems take it instead."""
    rows = (rng.random((n, len(UNIT_IDS))) < rate).astype(float)
    if carried_rate is not None:
        rows[:, CARRIERS] = (rng.random((n, CARRIERS.sum())) < carried_rate).astype(float)
    return rows


def _size_cell(rng, units=True):
    """A size-axis cell whose CoPES - ES gap (and CoPES's gain) sits on 3 of 24 units; full GRPO gains on every unit."""
    base = _rows(rng, 0.3, 1)[0]
    shared = _rows(rng, 0.3, SEEDS)
    es, copes = shared.copy(), shared.copy()
    copes[:, CARRIERS] = 1.0
    grpo = _rows(rng, 0.9, 1)
    cell = {"n_params": 1000, "warm_steps": 10, "base": {"scores": base.tolist(), "accuracy": float(base.mean())},
            "grpo": [{"scores": grpo[0].tolist(), "horizon_scores": grpo[0].tolist()}],
            "es": [{"scores": r.tolist(), "mean_update_norm": 1.0} for r in es],
            "copes_paper": [{"scores": r.tolist(), "mean_update_norm": 1.0} for r in copes],
            "copes_step_matched": [{"scores": r.tolist(), "mean_update_norm": 1.0} for r in es], "mechanism": None}
    if units:
        cell["units"] = list(UNIT_IDS)
    return cell


def _width(c):
    return c.high - c.low


def test_the_size_axis_gap_and_gain_recovery_resample_units_and_report_them():
    rng = np.random.default_rng(0)
    cell = _size_cell(rng)
    flat = {k: v for k, v in cell.items() if k != "units"}
    assert ss.cell_units(flat) is None and ss.cell_units(cell) == tuple(UNIT_IDS)
    assert _width(ss.gap(cell)) > 2 * _width(ss.gap(flat))
    assert ss.gap(cell).n_units == UNITS and ss.gap(flat).n_units is None
    rec, rec_flat = ss.gain_recovery(cell, "copes_paper"), ss.gain_recovery(flat, "copes_paper")
    assert rec["mean"] == pytest.approx(rec_flat["mean"])
    assert rec["high"] - rec["low"] > 1.5 * (rec_flat["high"] - rec_flat["low"])
    assert f"{UNITS} units" in rec["note"]
    p = params(PROTOCOLS="paper,step_matched")
    summary = ss.cell_summary(p, cell, "t")
    assert summary["units_t"] == UNITS and summary["units_effective_t"] == pytest.approx(UNITS)
    assert summary["copes_paper_minus_es_low_t"] == pytest.approx(ss.gap(cell).low)
    assert ss.cell_summary(p, flat, "t")["units_t"] == UNITS * PER_UNIT  # no ids: every problem its own unit
    assert ss.size_table(p, {"smoke": cell})["units"].tolist() == [UNITS]


def _map_base(rng, regime, p):
    """A map base (every cell at the map's populations) whose ES and CoPES strict gains sit on 3 of 24 units; each
    problem has its own ease, shared by every arm (mostly, as a real problem's difficulty is)."""
    ease = rng.random(len(UNIT_IDS))

    def runs(rate, n, carried=None):
        rates = np.where(CARRIERS, rate if carried is None else carried, rate)
        strict = (0.8 * ease + 0.2 * rng.random((n, len(UNIT_IDS))) < rates).astype(float)
        lenient = _rows(rng, 0.6, n)
        return [{"strict": s.tolist(), "lenient": le.tolist(), "scores": s.tolist(), "mean_update_norm": 1.0,
                 "mean_step_s": 0.1} for s, le in zip(strict, lenient)]
    base = runs(0.2, 1)[0]
    base["criterion"] = {"met": True}
    grpo = runs(0.2, 3, carried=1.0)
    for r in grpo:
        r["horizon_strict"], r["horizon_lenient"] = r["strict"], r["lenient"]
    def edge(es_runs):  # CoPES: ES's scores, every carrier problem solved
        return [{**r, "strict": np.where(CARRIERS, 1.0, r["strict"]).tolist()} for r in es_runs]

    cells = {n: {"es": (es := runs(0.2, 3, carried=0.6)), "copes": edge(es)} for n in (20, 40, 80)}
    cells[40].update(es_shuffled=runs(0.2, 3), es_sqrtk=runs(0.2, 3, carried=0.6))
    return {"regime": regime, "p": p, "n_params": 45280, "warm_steps": 10, "converged": True, "base": base,
            "grpo": grpo, "cells": cells, "mechanism": {"curvature": {"d_eff": 50.0}}, "units": list(UNIT_IDS)}


def test_the_map_cells_and_predictions_resample_units_and_save_them(tmp_path):
    rng = np.random.default_rng(1)
    p = map_params()
    bases = {("latent", q): _map_base(rng, "latent", q) for q in (0.0, 0.1, 0.3)}
    bases[("skill_gap", None)] = _map_base(rng, "skill_gap", None)
    flat = {k: {**b, "units": []} for k, b in bases.items()}  # the same scores, problems as independent
    s, s_flat = ss.map_summary(p, bases), ss.map_summary(p, flat)
    cell = "latent_p0_1_n40"
    width = lambda d, key: d[f"map_{key}_high_{cell}"] - d[f"map_{key}_low_{cell}"]  # noqa: E731
    for key in ("es_delta_s", "copes_minus_es", "es_minus_es_shuffled", "es_gain_recovery"):
        assert width(s, key) > 1.3 * width(s_flat, key), key
    assert s["map_units_latent_p0_1"] == UNITS and s_flat["map_units_latent_p0_1"] == UNITS * PER_UNIT
    assert s["map_units_effective_latent_p0_1"] == pytest.approx(UNITS)
    # the predictions read the cluster-aware intervals: R2 (ES's Delta S at p = 0) is wider over units
    r2 = lambda d: d["prediction_R2_high"] - d["prediction_R2_low"]  # noqa: E731
    assert r2(s) > 1.5 * r2(s_flat) and s["prediction_R2_value"] == pytest.approx(s_flat["prediction_R2_value"])
    assert ss.map_table(p, bases, s)["units"].tolist()[0] == UNITS
    ss.save_map_scores(p, tmp_path, bases)
    loaded = stats.load_scores(tmp_path)[f"map_strict_{cell}"]
    assert loaded.units == tuple(UNIT_IDS)
    assert loaded.compare("copes", "es").n_units == UNITS  # the claims' tests (L4) see the same units


def test_a_cued_base_resamples_cue_letters_and_a_base_without_units_gets_them_from_its_tasks():
    val = load_tasks("smoke", "math", "val")[:16]
    names = ss.val_units(val)
    assert names == tuple(t.unit_id for t in val) and all(names)
    letters = ss.val_units(val, cued=True)
    assert letters == tuple(t.unit_id[:1].upper() for t in val)
    assert len(set(letters)) <= len(set(names))
    p = params()
    by_key = types.SimpleNamespace(key={"val_ids": [t.id for t in val]})  # a base that carries only its ids
    assert ss.substrate_units(p, by_key) == names
    assert ss.substrate_units(p, by_key, cued=True) == letters
    assert ss.substrate_units(p, types.SimpleNamespace(units=("a",) * 16)) == ("a",) * 16
    assert ss.substrate_units(p, types.SimpleNamespace(key={})) is None
