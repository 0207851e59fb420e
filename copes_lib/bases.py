"""Shipped bases: the warm-started base models committed with the repository, as a paper ships its checkpoint.

A base (one task kind, one warm-start seed, one recipe) is two files in ``bases/<profile>/``:

- ``<kind>-seed<seed>-<key>.safetensors``: the weights, byte for byte the ``model.safetensors`` the warm start
  saved in its cache entry;
- ``<kind>-seed<seed>-<key>.json``: the sidecar. ``recipe_key`` (``<key>``, the warm start's cache key) and
  ``recipe`` (the dict it hashes: the warm-start config, the data fingerprint, the library version), the
  recipe overlay it was shipped under, ``weights_sha256`` (sha256 of the file), ``state_digest`` (the state
  dict's digest, :func:`state_digest`, what a rebuild is compared on), ``tokenizer_sha256`` (the tokenizer is
  not shipped: it is rebuilt from the data in seconds, deterministically, and must be the one the base was
  trained with), the model's ``config.json``, the warm start's ``info`` (curve, steps, stopping rule),
  ``trained_on`` (commit, CPU vendor and model, torch) and ``preflight`` (its entry in the committed
  pre-run seed check, when there is one).

The key in the file name makes the lookup exact: a base is used only by a run whose recipe hashes to the same
key, whatever overlay or profile section produced it. Where the warm start is resolved
(:func:`copes_lib.substrate.warm_start_folder`), a cache with no entry for a key that is shipped gets one
materialised from these files after the weights' sha256 is checked against the sidecar (:func:`materialise`):
the cache stays the one place code reads a base from, so every notebook and worker that asks for it gets the
shipped one. Shipping (``make bases``) and rebuilding to compare (``REBUILD_BASES=1``) live in
:mod:`copes_lib.protocols.testbed.shipped_bases`.

Departure from the paper: the paper ships nothing of its own base (Qwen3.5-4B is public); ours are trained
here, so shipping them is what lets a fresh clone skip the warm start (cpu: about 40 min per base).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from copes_lib import runs

#: Where the shipped bases live: ``bases/<profile>/`` (tests point it at a temporary folder).
BASES_ROOT = runs.REPO_ROOT / "bases"
#: The sidecar's layout version; a reader refuses another.
FORMAT = 1
#: Files of a saved HF model folder besides the weights; their content travels inside the sidecar.
MODEL_JSON_FILES = ("config.json", "generation_config.json")


class ShippedBaseError(RuntimeError):
    """A shipped base cannot be used as it is (its weights do not match their digest, its sidecar cannot be
    read); the one-line message names the file and what to do."""


def state_digest(model_or_state: torch.nn.Module | Mapping[str, torch.Tensor]) -> str:
    """sha256 of a state dict: for each key in sorted order, the key, the dtype, the shape, then the bytes.

    >>> a = {"w": torch.zeros(2, 3), "b": torch.ones(3)}
    >>> state_digest(a) == state_digest(dict(reversed(list(a.items()))))  # canonical order
    True
    >>> state_digest(a) == state_digest({"w": torch.zeros(3, 2), "b": torch.ones(3)})  # the shape counts
    False
    >>> state_digest(a) == state_digest({"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.ones(3)})
    False
    """
    state = model_or_state.state_dict() if isinstance(model_or_state, torch.nn.Module) else model_or_state
    h = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        h.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """sha256 of the tokenizer's serialised form (vocabulary, merges, added tokens, pre-tokenizer)."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


def stem(kind: str, seed: int, key: str) -> str:
    """A shipped base's file name without its suffix.

    >>> stem("math", 0, "0123abcd0123abcd")
    'math-seed0-0123abcd0123abcd'
    """
    return f"{kind}-seed{int(seed)}-{key}"


def paths(profile: str, kind: str, seed: int, key: str, root: str | Path | None = None) -> tuple[Path, Path]:
    """(weights, sidecar) of a shipped base."""
    folder = Path(root if root is not None else BASES_ROOT) / profile
    name = stem(kind, seed, key)
    return folder / f"{name}.safetensors", folder / f"{name}.json"


def shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (messages name files the way a user types them)."""
    path = Path(path)
    return str(path.relative_to(runs.REPO_ROOT)) if path.is_relative_to(runs.REPO_ROOT) else str(path)


def read_sidecar(path: str | Path) -> dict[str, Any]:
    """The sidecar at ``path``; a :class:`ShippedBaseError` naming it when it cannot be read or is of another
    layout."""
    path = Path(path)
    restore = (f"restore it (git checkout -- {shown(path.parent)}) or delete it and its .safetensors to train "
               "the base instead")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ShippedBaseError(f"{shown(path)}: the shipped base's sidecar cannot be read ({type(exc).__name__}: "
                               f"{str(exc)[:120]}); {restore}") from None
    needed = ("format", "recipe_key", "weights_sha256", "state_digest", "tokenizer_sha256", "model_files", "info")
    if not isinstance(data, dict) or data.get("format") != FORMAT or any(k not in data for k in needed):
        raise ShippedBaseError(f"{shown(path)}: not a shipped-base sidecar of format {FORMAT} (needs {list(needed)}); "
                               f"{restore}")
    return data


def shipped(profile: str, kind: str | None = None, seed: int | None = None,
            root: str | Path | None = None) -> list[Path]:
    """The sidecars shipped for ``profile`` (of ``kind`` and ``seed`` when given), sorted."""
    folder = Path(root if root is not None else BASES_ROOT) / profile
    pattern = f"{kind or '*'}-seed{'*' if seed is None else int(seed)}-*.json"
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


def not_shipped_line(profile: str, kind: str, seed: int, key: str, root: str | Path | None = None) -> str:
    """What to say before training a base no shipped file covers (the same kind and seed shipped under other
    keys are named: another recipe, or a changed library version or data)."""
    others = [p.stem.rsplit("-", 1)[-1] for p in shipped(profile, kind, seed, root)]
    folder = shown(Path(root if root is not None else BASES_ROOT) / profile)
    return (f"[warm_start {kind}] seed {seed}: no shipped base with recipe key {key} in {folder}/ "
            + (f"(shipped for {kind} seed {seed}: key {', '.join(others)}, another recipe) " if others else "")
            + f"- training it (make bases PROFILE={profile} ships the bases of a profile's recipe)")


def materialise(profile: str, kind: str, seed: int, key: str, folder: Path, tokenizer, *,
                root: str | Path | None = None, log=print) -> bool:
    """Fill the cache entry ``folder`` (``model/`` and ``info.json``) from the shipped base of ``key``, if there is
    one; True when it did. The weights' sha256 must equal the sidecar's (else :class:`ShippedBaseError`: a
    damaged or edited file is never used, nor silently replaced by training). A base trained with another
    tokenizer than ``tokenizer`` (the data or the tokenizers library changed without changing the key) is not
    used: False, and the caller trains."""
    weights, sidecar = paths(profile, kind, seed, key, root)
    if not sidecar.exists() and not weights.exists():
        return False
    if not sidecar.exists() or not weights.exists():
        present, absent = (weights, sidecar) if weights.exists() else (sidecar, weights)
        raise ShippedBaseError(f"{shown(absent)} is missing beside {shown(present)}: a shipped base is both files; "
                               f"restore it (git checkout -- {shown(absent.parent)}) or delete {shown(present)} to "
                               "train the base instead")
    meta = read_sidecar(sidecar)
    if meta["recipe_key"] != key:
        raise ShippedBaseError(f"{shown(sidecar)}: its recipe_key {meta['recipe_key']} is not the {key} of its name; "
                               f"restore it (git checkout -- {shown(sidecar.parent)}) or delete both files")
    actual = file_sha256(weights)
    if actual != meta["weights_sha256"]:
        raise ShippedBaseError(
            f"{shown(weights)}: sha256 {actual[:16]}... does not match {meta['weights_sha256'][:16]}... recorded in "
            f"{sidecar.name} (a damaged, truncated or edited file; a Git LFS pointer?); restore it (git checkout -- "
            f"{shown(weights)}; git lfs pull if it is a pointer) or delete both files to train the base instead")
    here = tokenizer_sha256(tokenizer)
    if here != meta["tokenizer_sha256"]:
        log(f"[warm_start {kind}] seed {seed}: {shown(weights)} was trained with another tokenizer (sha256 "
            f"{meta['tokenizer_sha256'][:12]}, this checkout's: {here[:12]}: the data or the tokenizers version "
            f"changed); not used - training the base (make bases PROFILE={profile} ships it again)")
        return False
    if (folder / "model").exists() and (folder / "info.json").exists():  # another process got there first
        return True
    tmp = folder / f".model.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(weights, tmp / "model.safetensors")
    for name, content in meta["model_files"].items():
        (tmp / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for path in [tmp, *tmp.iterdir()]:  # the cache's one mode (as substrate._save_atomically)
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~runs._UMASK)
    if file_sha256(tmp / "model.safetensors") != meta["weights_sha256"]:  # the copy itself (a full disk)
        shutil.rmtree(tmp, ignore_errors=True)
        raise ShippedBaseError(f"copying {shown(weights)} into {shown(folder)} gave other bytes (a full disk?); "
                               f"free space and rerun")
    if (folder / "model").exists() and (folder / "info.json").exists():  # finished meanwhile by another process:
        shutil.rmtree(tmp, ignore_errors=True)  # never pull a model folder from under its reader
        return True
    shutil.rmtree(folder / "model", ignore_errors=True)
    os.replace(tmp, folder / "model")
    record = {"file": shown(weights), "sha256": meta["weights_sha256"], "state_digest": meta["state_digest"],
              "verified": "the weights' sha256 equals the sidecar's", "trained_on": meta.get("trained_on")}
    runs.atomic_write_json(folder / "info.json", {**meta["info"], "cache_dir": str(folder), "shipped": record})
    log(f"[warm_start {kind}] seed {seed}: loaded the shipped base {shown(weights)} (sha256 verified), "
        f"not trained")
    return True


def write(profile: str, kind: str, seed: int, key: str, folder: Path, *, recipe: Mapping[str, Any],
          tokenizer, state: str, extra: Mapping[str, Any] | None = None, root: str | Path | None = None) -> Path:
    """Ship the cache entry ``folder`` (a complete warm start) as the base ``kind`` / ``seed`` / ``key``: its
    weights file and the sidecar (see the module docstring; ``extra``: more sidecar fields, e.g. the preflight
    record's entry). Both written atomically; returns the sidecar's path."""
    weights, sidecar = paths(profile, kind, seed, key, root)
    model = Path(folder) / "model"
    info = runs.read_json(Path(folder) / "info.json")
    info = {k: v for k, v in info.items() if k not in ("cache_dir", "cached", "shipped")}
    data = model.joinpath("model.safetensors").read_bytes()
    meta = {"format": FORMAT, "profile": profile, "kind": kind, "seed": int(seed), "recipe_key": key,
            "recipe": dict(recipe), "weights": weights.name, "weights_sha256": hashlib.sha256(data).hexdigest(),
            "weights_bytes": len(data), "state_digest": state, "tokenizer_sha256": tokenizer_sha256(tokenizer),
            "vocab_size": len(tokenizer),
            "model_files": {name: runs.read_json(model / name) for name in MODEL_JSON_FILES
                            if (model / name).exists()},
            "info": info, "trained_on": info.get("trained_on"), **dict(extra or {})}
    runs.atomic_write_bytes(weights, data)
    runs.atomic_write_json(sidecar, meta)
    return sidecar


__all__ = ["BASES_ROOT", "FORMAT", "ShippedBaseError", "state_digest", "file_sha256", "tokenizer_sha256", "stem",
           "paths", "read_sidecar", "shipped", "not_shipped_line", "materialise", "write"]
