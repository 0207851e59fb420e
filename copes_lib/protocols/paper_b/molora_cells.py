"""Paper B's shared protocol pieces: the substrate notebook 10 builds under a profile (what 11 and 12
adapt), read from the profile's parameters so the engine (``copes_lib.molora.lm``) never reads one; and
notebook 11's map of where the softmax router collapses (docs/molora_regime.md#m3-the-map)."""

from __future__ import annotations

import torch

from copes_lib.config import build, profile_params
from copes_lib.molora import adapt, metrics
from copes_lib.molora.lm import Substrate, get_substrate
from copes_lib.protocols.paper_b.molora_params import MoloraSubstrateParams


def substrate_for_profile(profile: str, device="cpu", dtype=torch.float32) -> Substrate:
    """The substrate notebook 10 builds under ``profile`` (its profiles/*.yaml values): what 11 and 12 use."""
    params = build(MoloraSubstrateParams, {**profile_params(profile, MoloraSubstrateParams), "PROFILE": profile})
    return get_substrate(profile, params.substrate_config(), device=device, dtype=dtype)[0]


# =========================================================================== notebook 11's collapse map
# docs/molora_regime.md#m3-the-map: R0 over router learning rate x input scale (one run each), steps from
# every run's history; the collapse metric of docs/molora_regime.md#m2-collapse-metric
PAPER_ADAPTER_STEPS = 25_000  # adaptation steps per cell (docs/paper_b_molora.md#b1-system)


def paper_matched_lr_x(map_steps: int) -> float:
    """The router learning-rate multiplier at which ``map_steps`` AdamW steps can move a weight as far as the
    paper's 25,000 (AdamW moves a weight by about its learning rate per step): 25,000 / map_steps."""
    return PAPER_ADAPTER_STEPS / map_steps


def map_row(router: str, lr_x: float, scale: float, steps: int, result: dict, n_slots: int) -> dict:
    """One map run as a table row: the setting, the monopoly count and its collapse level (test windows,
    end of run), the top-4 share, the routing entropy, the balanced log-PPL and the steps to collapse
    (training windows of the run's history; None if it never collapsed)."""
    return {"router": router, "router_lr_x": lr_x, "input_scale": scale, "steps": steps,
            "monopoly_slots": result["monopoly_slots"],
            "collapse_level": metrics.collapse_level(result["monopoly_slots"], n_slots),
            "top4_share": metrics.top_share(result["shares"]), "routing_entropy": result["routing_entropy"],
            "balanced_log_ppl": result["balanced_log_ppl"],
            "steps_to_collapse": metrics.steps_to_collapse(result["history"], n_slots)}


def run_collapse_map(profile: str, sub: Substrate, params, force: bool = False, on_row=None) -> dict[tuple, dict]:
    """{(router_lr_x, input_scale): cell result} of R0 over the map's grid (``MoloraRouterParams``),
    ``MAP_STEPS`` steps each, seed SEED; every run is a cached adapter cell."""
    out = {}
    for lr_x in params.floats("MAP_ROUTER_LR_MULTIPLIERS"):
        for scale in params.floats("MAP_INPUT_SCALES"):
            cell = params.cell("r0", steps=params.MAP_STEPS, router_lr=params.ROUTER_LR * lr_x, input_scale=scale)
            out[lr_x, scale] = adapt.run_adapter_cell(profile, sub, cell, force=force)
            if on_row:
                on_row(map_row("r0", lr_x, scale, params.MAP_STEPS, out[lr_x, scale], params.N_SLOTS))
    return out


def _rises(counts: list[int], tolerance: int = 1) -> bool:
    return any(b > a + tolerance for a, b in zip(counts, counts[1:]))


def map_readings(grid: dict[tuple, dict], histories: list[list[dict]], n_slots: int, map_steps: int) -> dict:
    """Predictions P1 and P2 of docs/molora_regime.md#m5-predictions, read off the map.

    P1 holds when R0's monopoly count rises by at most 1 slot from each grid value to the next larger one,
    along the learning rate (at each input scale), the input scale (at each rate) and the steps (each run's
    history in ``histories``). P2 holds when, at the paper-matched rate (within 1% of 25,000 / map_steps)
    and input scale 1, R0 is not collapsed; "not on the grid" when that setting was not run."""
    lrs = sorted({lr for lr, _ in grid})
    scales = sorted({s for _, s in grid})
    count = {key: r["monopoly_slots"] for key, r in grid.items()}
    rising = [f"lr x{lrs[i + 1]:g} at scale {s:g}" for s in scales for i in range(len(lrs) - 1)
              if count[lrs[i + 1], s] > count[lrs[i], s] + 1]
    rising += [f"scale {scales[i + 1]:g} at lr x{lr:g}" for lr in lrs for i in range(len(scales) - 1)
               if count[lr, scales[i + 1]] > count[lr, scales[i]] + 1]
    rising += [f"steps in run {k}" for k, history in enumerate(histories)
               if _rises([int(row["moe/monopoly_slots"]) for row in history])]
    target = paper_matched_lr_x(map_steps)
    matched = [lr for lr in lrs if abs(lr - target) <= 0.01 * target]
    if matched and 1.0 in scales:
        m = count[matched[0], 1.0]
        p2 = "fails" if metrics.collapse_level(m, n_slots) == "collapsed" else "holds"
    else:
        p2 = "not on the grid"
    return {"prediction_p1_monotone": "holds" if not rising else "fails", "p1_rises": "; ".join(rising),
            "paper_matched_router_lr_x": target,
            "monopoly_slots_r0_paper_matched": count[matched[0], 1.0] if p2 != "not on the grid" else None,
            "prediction_p2_paper_budget_alone_no_collapse": p2}
