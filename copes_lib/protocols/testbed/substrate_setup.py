"""The profile's substrate, as every paper-A notebook uses it: notebook 01's parameters under a
profile (``profiles/<profile>.yaml`` over the dataclass defaults) turned into the engine's
:class:`~copes_lib.substrate.WarmStartConfig`, and the gpu profile's data paths handed to
``copes_lib.tasks``. The engines take these configs as arguments and never read a profile."""

from __future__ import annotations

from copes_lib import tasks
from copes_lib.config import build, profile_params
from copes_lib.protocols.params import SubstrateNotebookParams
from copes_lib.substrate import WarmStartConfig

SUBSTRATE_NOTEBOOK = "01_substrate_and_agent"


def substrate_params(profile: str) -> SubstrateNotebookParams:
    """Notebook 01's parameters under ``profile`` (profile yaml over the dataclass defaults)."""
    return build(SubstrateNotebookParams, {**profile_params(profile, SubstrateNotebookParams), "PROFILE": profile})


def substrate_config(profile: str) -> WarmStartConfig:
    """The substrate every notebook of ``profile`` shares (what notebook 01 trains and caches)."""
    use_profile_data(profile)
    return substrate_params(profile).warm_start_config()


def run_seeds(profile: str, kind: str) -> list[int]:
    """The warm-start seeds of ``kind`` a run of ``profile`` builds: notebook 01's SEED (the base every
    experiment uses) and, for math, its spread seeds (``WARM_SPREAD_SEEDS``). P2's targets gate on each
    (docs/preflight.md#p85-the-bases-targets-gate-on-every-seed-the-run-uses)."""
    params = substrate_params(profile)
    return [params.SEED, *(params.spread_seeds() if kind == "math" else [])]


def control_config(profile: str) -> WarmStartConfig:
    """The skill-gap control base of ``profile`` (docs/regime.md#r3-the-latent-protocol-warm-start): the
    profile's substrate with every trace in the paper's protocol and the target stopping rule, the base
    of the regime's control arm (notebook 05); the same cache entry as a profile whose base is that one."""
    import dataclasses

    return dataclasses.replace(substrate_config(profile), protocol="paper")


def use_profile_data(profile: str) -> None:
    """Give ``copes_lib.tasks`` the profile's agent tool limits, its QA data variant (``QA_DATA``) and, on the
    gpu profile, its local data files (smoke and cpu tasks are generated)."""
    params = substrate_params(profile)
    tasks.use_tool_settings(profile, params.tool_settings())
    tasks.use_qa_data(profile, params.QA_DATA)
    if profile == "gpu":
        tasks.use_gpu_data(params.gpu_data_paths())
