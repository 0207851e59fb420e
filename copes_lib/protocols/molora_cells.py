"""Paper B's shared protocol pieces: the substrate notebook 10 builds under a profile (what 11 and 12
adapt), read from the profile's parameters so the engine (``copes_lib.molora.lm``) never reads one."""

from __future__ import annotations

import torch

from copes_lib.config import build, profile_params
from copes_lib.molora.lm import Substrate, get_substrate
from copes_lib.protocols.molora_params import MoloraSubstrateParams


def substrate_for_profile(profile: str, device="cpu", dtype=torch.float32) -> Substrate:
    """The substrate notebook 10 builds under ``profile`` (its profiles/*.yaml values): what 11 and 12 use."""
    params = build(MoloraSubstrateParams, {**profile_params(profile, MoloraSubstrateParams), "PROFILE": profile})
    return get_substrate(profile, params.substrate_config(), device=device, dtype=dtype)[0]
