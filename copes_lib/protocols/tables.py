"""Paper A's tables with our numbers beside the paper's (Tables 1, 3, 4)."""

from __future__ import annotations

from typing import Any

from copes_lib import paper
from copes_lib.protocols.paper_a.ablations import ABLATION_KEYS


def table1_frame(ours: dict[str, dict[str, Any]]):
    """Table 1 in the paper's layout: our test pass@1, steps, est. device-hours and validation accuracy
    beside the paper's (MATH-500 pass@1 shown as the paper's closest benchmark; all % )."""
    import pandas as pd

    rows = []
    for key, label in (("base", "base (warm start)"), ("full_grpo_best", "full GRPO (best ckpt)"),
                       ("es_best", "standard ES (best ckpt)"), ("lora_grpo_at_budget", "LoRA-GRPO @budget"),
                       ("es_at_budget", "standard ES @budget"), ("copes_at_budget", "CoPES @budget")):
        theirs = paper.TABLE1[key.replace("_at_budget", "_at_16")]
        mine = ours.get(key, {})
        rows.append({
            "method": label,
            "paper MATH-500 pass@1": theirs["pass1"][3],
            "ours test pass@1": _pct(mine.get("test_pass1")),
            "paper steps": theirs["steps"], "ours steps": mine.get("steps"),
            "paper est. GPU-h": theirs["gpu_hours"], "ours est. device-h": mine.get("device_hours"),
            "paper val acc": theirs["val_acc"], "ours val acc": _pct(mine.get("val_acc")),
            "ours val acc 95% CI": mine.get("val_ci", ""),
        })
    return pd.DataFrame(rows)


def table3_frame(val: dict[str, dict[str, Any]], update_norms: dict[str, float]):
    """Table 3 beside ours: the paper's MATH-500 pass@1 (%) and our validation accuracy at the budget, its 95%
    interval and what that interval resamples (``ablations.arm_intervals``: seeds x the latent units)."""
    import pandas as pd

    names = {"k1": "K=1 (standard ES)", "k2": "K=2", "k4": "K=4 (default)", "k8": "K=8",
             "indep_z": "independent z-score, K=4", "es_2sigma": "ES with 2 sigma",
             "es_sqrtk_alpha": "ES with sqrt(K) x alpha (our control)",
             "copes_matched_step": "CoPES K=4 with alpha / sqrt(K) (our control)"}
    theirs = {"k1": "k1", "k2": "k2", "k4": "k4", "k8": "k8", "indep_z": "indep_z_k4", "es_2sigma": "es_2sigma"}
    rows = []
    for key in ABLATION_KEYS:
        s = val.get(key, {})
        rows.append({"variant": names[key],
                     "paper MATH-500 pass@1": paper.TABLE3[theirs[key]][3] if key in theirs else None,
                     "ours val acc": _pct(s.get("mean")),
                     "ours 95% CI": _ci_text(s), "interval over": s.get("over", "seeds" if s else None),
                     "seeds": s.get("n"),
                     "mean update norm": update_norms.get(key)})
    return pd.DataFrame(rows)


def table4_frame(ours: dict[str, dict[str, float]]):
    """Table 4 (Acc / EM / F1, %) of the paper's three benchmarks beside our generated QA test split."""
    import pandas as pd

    rows = []
    for method, label in (("base", "base"), ("full_grpo", "full GRPO"), ("es", "standard ES"), ("copes", "CoPES")):
        row = {"method": label}
        for bench, cells in paper.TABLE4.items():
            row[f"paper {bench} Acc/EM/F1"] = "/".join(f"{v:.2f}" for v in cells[method])
        mine = ours.get(method)
        row["ours Acc/EM/F1"] = ("/".join(f"{100 * mine[k]:.2f}" for k in ("acc", "em", "f1")) if mine else "")
        rows.append(row)
    return pd.DataFrame(rows)


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 2)


def _ci_text(s: dict[str, Any]) -> str:
    if not s or s.get("low") is None:
        return ""
    return f"[{100 * s['low']:.1f}, {100 * s['high']:.1f}]"


def ci_text(s: dict[str, Any]) -> str:
    """An interval of accuracies as ``[low, high]`` in %, empty when there is only one seed."""
    return _ci_text(s)
