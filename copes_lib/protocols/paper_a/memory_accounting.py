"""Notebook 08's tables, figures and measurements: Table S7 and Fig. 2 rebuilt from Qwen3.5-4B's facts,
the same lines for other public architectures, Table 2's feasibility under each sharding rule, the
measured memory scaling of our substrate against the analytic model, the device-hour accounting of one
ES and one GRPO step, the GRPO memory check and the 4B feasibility of the shipped configurations.

The engines hold the arithmetic (``memory_model``, ``budget``, ``grpo_memory``); this module arranges it
into the paper's tables and figures and caches the measurements (``runs.cached``), so the notebook
narrates and calls. Departures from the paper are stated in the notebook."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np

from copes_lib import budget, grpo_memory, memory_model, paper, runs
from copes_lib.protocols.paper_a import grpo_arm

NOTEBOOK = "08_memory_and_gpu_hours"
METHOD_LABELS = {"es": "ES / CoPES", "full_grpo": "full GRPO", "lora_grpo": "LoRA-GRPO"}
ACCOUNT_STEPS = (16, 48, 64, 112)  # step budgets of the GPU-hour extrapolation
GRPO_4B_CONTEXTS_K = (32, 128)


# --------------------------------------------------------------------------- 1. Table S7 and Fig. 2
def table_s7_frame(lines_paper: dict[str, Any], lines_exact: dict[str, Any]):
    """Table S7 beside ours: intercept (GiB), slope (GiB per 1K tokens) and the value at 128K, in the paper's
    units (the KV slope read as MiB / 1000) and exact ones (GiB, 1K = 1,024 tokens), with our parts."""
    import pandas as pd

    rows = []
    for method in memory_model.METHODS:
        ref = paper.TABLE_S7[method]
        rows.append({"method": method,
                     "paper intercept": ref["intercept_gib"], "ours intercept": lines_paper[method].intercept_gib,
                     "paper slope": ref["slope_gib_per_k"], "ours slope (paper units)": lines_paper[method].slope_gib_per_k,
                     "ours slope (exact)": lines_exact[method].slope_gib_per_k,
                     "paper @128K": ref["at_128k_gib"], "ours @128K (paper units)": lines_paper[method].at(128),
                     "ours @128K (exact)": lines_exact[method].at(128),
                     "parts": ", ".join(f"{k} {v:.2f}" for k, v in lines_paper[method].parts.items())})
    return pd.DataFrame(rows)


def plot_memory_vs_context(lines_paper: dict[str, Any]):
    """Fig. 2: each method's Table S7 line over 1K-128K tokens (log memory) with 24 and 48 GB GPUs marked."""
    import matplotlib.pyplot as plt

    context_k = np.linspace(1, 128, 128)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method, line in lines_paper.items():
        ax.plot(context_k, [line.at(c) for c in context_k],
                label=f"{METHOD_LABELS[method]}: {line.intercept_gib:.2f} + {line.slope_gib_per_k:.3g} L")
    for capacity, style in ((24, ":"), (48, "--")):
        ax.axhline(capacity, color="gray", linestyle=style, linewidth=1)
        ax.text(2, capacity * 1.08, f"{capacity} GB GPU", color="gray", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("context length L (K tokens)")
    ax.set_ylabel("memory (GiB)")
    ax.set_title("Qwen3.5-4B analytic memory (Table S7)")
    ax.legend(fontsize=8)
    return fig


def other_architectures_frame():
    """The Table S7 lines of every model description at 128K (exact units): the paper's activation term and
    a derived one where the sizes are known, and whether each method fits its setup under Table 2's
    ``zero3_sp_offload`` rule."""
    import pandas as pd

    rows = []
    for name in memory_model.model_description_names():
        desc = memory_model.load_model_description(name)
        lines = memory_model.paper_table_s7(desc, convention="exact")
        derived = (memory_model.activation_bytes_per_token(desc) * 1024 / memory_model.GIB) if desc.is_dense_known else None
        row = {"model": desc.name, "params (B)": desc.params / 1e9, "KV KiB/token": memory_model.kv_bytes_per_token(desc) / 1024,
               "ES @128K": lines["es"].at(128), "full GRPO @128K (paper term)": lines["full_grpo"].at(128),
               "LoRA-GRPO @128K (paper term)": lines["lora_grpo"].at(128), "derived term GiB/1K": derived}
        if derived is not None:
            row["full GRPO @128K (derived term)"] = lines["full_grpo"].intercept_gib + derived * 128
        for method, setup in (("es", "1x24"), ("full_grpo", "8x48"), ("lora_grpo", "8x48")):
            n_gpus, capacity = memory_model.GPU_SETUPS[setup]
            need = memory_model.per_gpu_gib(lines[method], 128, n_gpus, "zero3_sp_offload")
            row[f"{method} fits {setup} @128K"] = bool(need <= capacity)
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- 2. Table 2
def table2_matching_rules(lines_paper: dict[str, Any]) -> list[str]:
    """The sharding rules (``memory_model.SHARDING_RULES``) under which our lines give the paper's Table 2
    fits at 128K, for every method and GPU setup."""
    setups = list(memory_model.GPU_SETUPS)
    want = {m: paper.TABLE2_FITS_AT_128K[m] for m in memory_model.METHODS}
    matching = []
    for rule in memory_model.SHARDING_RULES:
        rows = memory_model.feasibility_table(lines_paper, [128], rule)
        if {r["method"]: {s: r[f"fits_{s}"] for s in setups} for r in rows} == want:
            matching.append(rule)
    return matching


def table2_beside_paper(lines_paper: dict[str, Any]):
    """The paper's Table 2 fits at 128K beside ours under every rule (Y / n per GPU setup)."""
    import pandas as pd

    rows = []
    for method in ("es", "copes", "full_grpo", "lora_grpo"):
        line = lines_paper["es" if method == "copes" else method]
        row = {"method": method, **{f"paper {s}": paper.TABLE2_FITS_AT_128K[method][s] for s in memory_model.GPU_SETUPS}}
        for rule in memory_model.SHARDING_RULES:
            fits = [memory_model.per_gpu_gib(line, 128, n, rule) <= cap for n, cap in memory_model.GPU_SETUPS.values()]
            row[rule] = "".join("Y" if f else "n" for f in fits)
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- 3. measured memory scaling
def measure_memory_scaling(params, force: bool = False):
    """Peak memory of every method at every context length on the substrate (``budget.measure_peak_bytes``,
    cached), beside the analytic prediction with and without ES's prefill transient."""
    import pandas as pd

    sizes = params.sizes
    key = runs.cache_key({"sizes": sizes.to_dict(), "contexts": params.context_lengths, "sequences": params.SEQUENCES,
                          "lora_rank": params.LORA_RANK, "device": params.DEVICE, "seed": params.SEED,
                          "version": budget.MEASUREMENT_VERSION})
    cache_file = runs.cache_dir(params.PROFILE, "08_memory_scaling", key) / "measurements.json"

    def measure_all():
        rows = []
        for method in runs.progress(memory_model.METHODS, desc="memory"):
            for length in params.context_lengths:
                result = budget.measure_peak_bytes(method, sizes, length, params.SEQUENCES, params.SEED,
                                                   lora_rank=params.LORA_RANK, device=params.DEVICE)
                rows.append({"method": method, "context_len": length, **result})
                runs.summary_line("mem", length, {"method": method, "peak_mib": result["peak_bytes"] / 2**20})
        return rows

    measured = pd.DataFrame(runs.cached(cache_file, measure_all, force=force))
    pairs = list(zip(measured["method"], measured["context_len"]))
    measured["predicted_bytes"] = [budget.predict_substrate_bytes(m, sizes, c, params.SEQUENCES, params.LORA_RANK)
                                   for m, c in pairs]
    measured["predicted_kv_only_bytes"] = [budget.predict_substrate_bytes(m, sizes, c, params.SEQUENCES, params.LORA_RANK,
                                                                          es_prefill=False) for m, c in pairs]
    measured["peak_mib"] = measured["peak_bytes"] / 2**20
    measured["predicted_kv_only_mib"] = measured["predicted_kv_only_bytes"] / 2**20
    measured["predicted_mib"] = measured["predicted_bytes"] / 2**20
    measured["measured / predicted"] = measured["peak_bytes"] / measured["predicted_bytes"]
    return measured


def memory_fits(measured, sequences: int):
    """Per method, the straight line (``budget.fit_line``) through the measured and the predicted peaks over
    tokens (context length x sequences): slope in KiB per token, intercept in MiB."""
    import pandas as pd

    fits = []
    for method, group in measured.groupby("method", sort=False):
        tokens = (group["context_len"] * sequences).tolist()
        slope, intercept = budget.fit_line(tokens, group["peak_bytes"].tolist())
        p_slope, p_intercept = budget.fit_line(tokens, group["predicted_bytes"].tolist())
        fits.append({"method": method, "measured slope KiB/token": slope / 1024, "predicted slope KiB/token": p_slope / 1024,
                     "measured intercept MiB": intercept / 2**20, "predicted intercept MiB": p_intercept / 2**20})
    return pd.DataFrame(fits).set_index("method")


def peak_ratios(measured, longest: int) -> dict[str, float]:
    """GRPO's and LoRA-GRPO's peak over ES's at the longest context, measured and predicted (and predicted
    against ES's weights + KV cache only)."""
    at = measured[measured["context_len"] == longest].set_index("method")
    return {
        "measured_grpo_to_es_peak_ratio": at.loc["full_grpo", "peak_bytes"] / at.loc["es", "peak_bytes"],
        "predicted_grpo_to_es_peak_ratio": at.loc["full_grpo", "predicted_bytes"] / at.loc["es", "predicted_bytes"],
        "measured_lora_to_es_peak_ratio": at.loc["lora_grpo", "peak_bytes"] / at.loc["es", "peak_bytes"],
        "predicted_lora_to_es_peak_ratio": at.loc["lora_grpo", "predicted_bytes"] / at.loc["es", "predicted_bytes"],
        "predicted_grpo_to_es_peak_ratio_kv_only": at.loc["full_grpo", "predicted_bytes"] / at.loc["es", "predicted_kv_only_bytes"],
    }


def plot_measured_scaling(measured, fits, sequences: int, device: str, n_params: int):
    """One panel per method: measured peak, the analytic model (and ES's weights + KV only) and the fitted
    line, over context length."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, method in zip(axes, memory_model.METHODS):
        group = measured[measured["method"] == method]
        ax.plot(group["context_len"], group["peak_mib"], "o-", label="measured")
        ax.plot(group["context_len"], group["predicted_mib"], "s--", label="analytic model (fp32)")
        if method == "es":
            ax.plot(group["context_len"], group["predicted_kv_only_mib"], "^:", label="weights + KV only")
        slope, intercept = fits.loc[method, "measured slope KiB/token"], fits.loc[method, "measured intercept MiB"]
        xs = np.array(group["context_len"])
        ax.plot(xs, intercept + slope * xs * sequences / 1024, ":", color="gray", label="fit")
        ax.set_title(METHOD_LABELS[method])
        ax.set_xlabel("context length (tokens)")
    axes[0].set_ylabel(f"peak memory (MiB), {sequences} sequence(s)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"measured vs predicted peak memory ({device}, {n_params / 1e6:.2f}M-param Qwen3)")
    return fig


# --------------------------------------------------------------------------- 4. device-hour accounting
def measure_step_costs(params, force: bool = False):
    """One ES and one GRPO step timed by phase (cached): with ``ACCOUNT_ENGINE`` "agent", the profile's
    warm-started agent (notebook 01's cache when present) on math prompts with its real tools; with "plain",
    a random model and ``generate``. Adds each phase's share of the step in percent."""
    import pandas as pd

    sizes = params.sizes
    acc_config = {"engine": params.ACCOUNT_ENGINE, "population": params.ACCOUNT_POPULATION,
                  "prompts": params.ACCOUNT_PROMPTS, "group": params.ACCOUNT_GROUP, "device": params.DEVICE,
                  "seed": params.SEED, "version": budget.MEASUREMENT_VERSION}
    if params.ACCOUNT_ENGINE == "plain":
        acc_config.update(sizes=sizes.to_dict(), prompt_len=params.ACCOUNT_PROMPT_LEN, new_tokens=params.ACCOUNT_NEW_TOKENS)
        acc_ids = None
    else:
        from copes_lib import substrate
        from copes_lib.protocols.testbed.substrate_setup import substrate_config
        from copes_lib.rollout import make_env
        from copes_lib.tasks import load_tasks

        # the profile's default warm start (seed 0, math), reused from notebook 01's cache when present
        agent, tokenizer, warm_info = substrate.warm_start(params.PROFILE, "math", config=substrate_config(params.PROFILE))
        agent = agent.to(params.DEVICE)
        account_tasks = load_tasks(params.PROFILE, "math", "train")[: params.ACCOUNT_PROMPTS]
        rollout_config = substrate.warm_rollout_config(substrate_config(params.PROFILE))
        acc_config.update(warm_start=str(warm_info["cache_dir"]), rollout=rollout_config.to_dict())
        acc_ids = [t.id for t in account_tasks]
        print(f"agent: {warm_info['params']:,} params from {warm_info['cache_dir']}; {len(account_tasks)} math prompts")
    acc_file = runs.cache_dir(params.PROFILE, "08_step_costs", runs.cache_key(acc_config, acc_ids)) / "step_costs.json"

    def measure_costs():
        if params.ACCOUNT_ENGINE == "plain":
            return [budget.measure_step_costs(method, sizes, prompts=params.ACCOUNT_PROMPTS,
                                              population=params.ACCOUNT_POPULATION, group=params.ACCOUNT_GROUP,
                                              prompt_len=params.ACCOUNT_PROMPT_LEN,
                                              new_tokens=params.ACCOUNT_NEW_TOKENS, seed=params.SEED,
                                              device=params.DEVICE)
                    for method in ("es", "grpo")]
        rows = []
        with make_env("math", params.PROFILE) as env:
            for method in ("es", "grpo"):  # each on a fresh copy: the update changes the model
                rows.append(budget.measure_agent_step_costs(method, copy.deepcopy(agent), tokenizer, env, account_tasks,
                                                            rollout_config, params.ACCOUNT_POPULATION,
                                                            params.ACCOUNT_GROUP, params.SEED))
        return rows

    costs = pd.DataFrame(runs.cached(acc_file, measure_costs, force=force)).set_index("method")
    for phase in budget.PHASES:
        costs[f"{phase} %"] = 100 * costs[f"{phase}_s"] / costs["step_s"]
    return costs


def gpu_hours_tables(costs):
    """The paper's GPU-hour rows with ours at the same steps, and both extrapolated to
    :data:`ACCOUNT_STEPS` (ours in device-hours of this machine)."""
    import pandas as pd

    per_step_h = {"es_class": costs.loc["es", "step_s"] / 3600, "grpo_class": costs.loc["grpo", "step_s"] / 3600}
    paper_rows = pd.DataFrame(budget.paper_gpu_hours_table())
    paper_rows["ours device-h (same steps)"] = [per_step_h[c] * s for c, s in zip(paper_rows["class"], paper_rows["steps"])]
    steps = list(ACCOUNT_STEPS)
    extrapolated = pd.DataFrame({"steps": steps,
                                 "paper ES class GPU-h": [budget.PAPER_GPU_HOURS_PER_STEP["es_class"] * s for s in steps],
                                 "paper GRPO class GPU-h": [budget.PAPER_GPU_HOURS_PER_STEP["grpo_class"] * s for s in steps],
                                 "ours ES device-h": [per_step_h["es_class"] * s for s in steps],
                                 "ours GRPO device-h": [per_step_h["grpo_class"] * s for s in steps]})
    return paper_rows, extrapolated


# --------------------------------------------------------------------------- 5. GRPO memory check, 4B feasibility
def grpo_memory_configs(params) -> dict[str, Any]:
    """Notebook 04's GRPO under this profile at this notebook's measurement sizes (``ACCOUNT_PROMPTS``
    prompts x ``ACCOUNT_GROUP`` trajectories, one optimizer step, one group per forward / backward), full
    and LoRA, with full-vocabulary logits and with log-probs in chunks of 32 tokens."""
    configs = {}
    for use_lora in (False, True):
        for chunk in (0, 32):
            config = dataclasses.replace(
                grpo_arm.grpo_config(params.PROFILE, use_lora), prompt_batch_size=params.ACCOUNT_PROMPTS,
                group_size=params.ACCOUNT_GROUP, mini_batch_size=params.ACCOUNT_PROMPTS,
                micro_batch_size=params.ACCOUNT_GROUP, amp_dtype="none", lora_r=params.LORA_RANK,
                lora_alpha=2 * params.LORA_RANK, logprob_chunk=chunk)
            configs[f"{'lora' if use_lora else 'full'}_grpo_{'chunk' + str(chunk) if chunk else 'full_logits'}"] = config
    return configs


def grpo_update_tokens(params) -> tuple[int, int]:
    """Prompt and completion tokens of the measured GRPO update: the shortest context, a quarter prompt."""
    shortest = min(params.context_lengths)
    prompt_tokens = max(8, shortest // 4)
    return prompt_tokens, shortest - prompt_tokens


def grpo_memory_check(params, force: bool = False):
    """The measured peak of one real GRPO update (the second, AdamW's moments live; live tensor bytes on the
    CPU) against ``grpo_memory``'s prediction, per configuration of :func:`grpo_memory_configs` (cached)."""
    import pandas as pd

    configs = grpo_memory_configs(params)
    prompt_tokens, completion_tokens = grpo_update_tokens(params)
    key = runs.cache_key({"sizes": params.sizes.to_dict(), "configs": {k: c.to_dict() for k, c in configs.items()},
                          "prompt": prompt_tokens, "completion": completion_tokens, "seed": params.SEED,
                          "version": budget.MEASUREMENT_VERSION})
    mem_file = runs.cache_dir(params.PROFILE, "08_grpo_memory", key) / "grpo_memory.json"

    def measure():
        return [{"configuration": name, **grpo_memory.measure_update_peak(c, params.sizes, prompt_tokens,
                                                                          completion_tokens, params.SEED)}
                for name, c in configs.items()]

    grpo_mem = pd.DataFrame(runs.cached(mem_file, measure, force=force))
    grpo_mem["measured_mib"] = grpo_mem["measured_bytes"] / 2**20
    grpo_mem["predicted_mib"] = grpo_mem["predicted_bytes"] / 2**20
    grpo_mem["within_15pct"] = (grpo_mem["ratio"] - 1).abs() <= 0.15
    return grpo_mem


def grpo_4b_feasibility():
    """Full and LoRA GRPO at 32K and 128K tokens on 8 x 48 GB for Qwen3-4B's shape (the proxy whose every
    layer is known), in two shipped configurations: the gpu profile's notebook 04 as written and the
    sharded engine's (micro-batch 1, log-probs in chunks of 1,024, rollouts in micro-batches of 8).
    Predictions only: not yet run on a GPU."""
    import pandas as pd

    proxy = memory_model.load_model_description("qwen3_4b")
    shipped = {"gpu profile (04 as in gpu.yaml)": lambda lora: grpo_arm.grpo_config("gpu", lora),
               "sharded engine (micro 1, chunk 1024)": lambda lora: dataclasses.replace(
                   grpo_arm.grpo_config("gpu", lora), micro_batch_size=1, logprob_chunk=1024, rollout_batch_size=8)}
    rows = []
    for setup, make in shipped.items():
        for use_lora in (False, True):
            for context_k in GRPO_4B_CONTEXTS_K:
                row = grpo_memory.feasibility(proxy, make(use_lora), context_k * 1024, processes=8, capacity_gib=48.0)
                rows.append({"configuration": setup, "method": "lora_grpo" if use_lora else "full_grpo",
                             "context_k": context_k, "gib_per_gpu_8x48": row["gib_per_gpu"], "fits_8x48": row["fits"],
                             "what_would_fit": row["advice"], "source": "predicted (not yet run on a GPU)"})
    return pd.DataFrame(rows)


def grpo_memory_keys(grpo_mem, feasible) -> dict[str, Any]:
    """The summary keys of section 5: the headline ratio (full GRPO with chunked log-probs, the sharded
    engine's log-prob path), every configuration's ratio, and the 4B feasibility per configuration."""
    ratios_by_config = dict(zip(grpo_mem["configuration"], grpo_mem["ratio"]))
    keys: dict[str, Any] = {"grpo_measured_to_predicted_peak_ratio": float(ratios_by_config["full_grpo_chunk32"])}
    keys.update({f"grpo_memory_ratio_{name}": float(r) for name, r in ratios_by_config.items()})
    keys["grpo_memory_ratio_max_abs_error"] = float((grpo_mem["ratio"] - 1).abs().max())
    keys["grpo_memory_within_15pct_all"] = bool(grpo_mem["within_15pct"].all())
    engine_rows = feasible[feasible["configuration"].str.startswith("sharded")]
    profile_rows = feasible[feasible["configuration"].str.startswith("gpu profile")]
    for rows, tag in ((engine_rows, "engine"), (profile_rows, "gpu_profile")):
        for r in rows.itertuples():
            keys[f"qwen3_4b_{r.method}_{tag}_gib_per_gpu_8x48_at_{r.context_k}k"] = float(r.gib_per_gpu_8x48)
            keys[f"qwen3_4b_{r.method}_{tag}_fits_8x48_at_{r.context_k}k"] = bool(r.fits_8x48)
    keys["grpo_4b_feasibility_source"] = "analytic prediction; not yet run on a GPU"
    return keys


def step_cost_keys(costs) -> dict[str, Any]:
    """The summary keys of section 4: each step's seconds, the ES / GRPO cost ratio beside the paper's, the
    tool share of an ES step and the update share of a GRPO step."""
    return {
        "es_step_s": costs.loc["es", "step_s"],
        "grpo_step_s": costs.loc["grpo", "step_s"],
        "measured_es_to_grpo_step_cost_ratio": costs.loc["es", "step_s"] / costs.loc["grpo", "step_s"],
        "paper_es_to_grpo_step_cost_ratio": (budget.PAPER_GPU_HOURS_PER_STEP["es_class"]
                                             / budget.PAPER_GPU_HOURS_PER_STEP["grpo_class"]),
        "es_step_tool_fraction": costs.loc["es", "tool_s"] / costs.loc["es", "step_s"],
        "grpo_step_update_fraction": costs.loc["grpo", "update_s"] / costs.loc["grpo", "step_s"],
        "tool_backend": costs.loc["es", "tool_backend"],
    }


def fit_keys(fits) -> dict[str, Any]:
    """Per method, the measured slope and intercept and the predicted slope of :func:`memory_fits`."""
    keys = {}
    for method in memory_model.METHODS:
        keys[f"measured_{method}_slope_kib_per_token"] = fits.loc[method, "measured slope KiB/token"]
        keys[f"measured_{method}_intercept_mib"] = fits.loc[method, "measured intercept MiB"]
        keys[f"predicted_{method}_slope_kib_per_token"] = fits.loc[method, "predicted slope KiB/token"]
    return keys
