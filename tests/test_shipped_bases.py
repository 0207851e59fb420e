"""Shipped bases (bases/<profile>/, copes_lib.bases): a base whose recipe key is shipped is loaded from there with its
sha256 checked, never trained; a damaged file is a one-line error naming it; another recipe key trains and says so;
a rebuild compares bitwise. Temporary caches and bases folders throughout (smoke size, a few steps): the real cache/
is neither read nor written; the committed smoke bases are checked last."""

import dataclasses
import shutil

import pytest

from copes_lib import bases, runs, substrate, threads
from copes_lib.protocols.testbed import shipped_bases
from copes_lib.protocols.testbed.substrate_setup import substrate_config

# a smoke-size math base trained for a handful of steps: the shipping path, not the recipe, is under test
SMALL = dict(math_steps=12, math_target=0.0, eval_every=6, eval_problems=4)


def _config(**changes):
    return dataclasses.replace(substrate_config("smoke"), **{**SMALL, **changes})


def _quiet(*args, **kwargs):
    pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A temporary cache holding the small base (math, seed 0) and a bases folder shipping it."""
    root = tmp_path_factory.mktemp("shipped")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bases, "BASES_ROOT", root / "bases")
        mp.setattr(runs, "CACHE_ROOT", root / "trained")
        rows = shipped_bases.ship("smoke", [("math", 0)], _config(), log=_quiet)
    return root, rows[0]


@pytest.fixture
def shipped(trained, tmp_path, monkeypatch):
    """This test's copy of the shipped folder and an empty cache (but for the tokenizer, rebuilt in seconds, copied
    to save them); the sidecar and weights paths of the shipped base."""
    root, row = trained
    shutil.copytree(root / "bases", tmp_path / "bases")
    for tokenizer in (root / "trained" / "smoke").glob("tokenizer-*"):
        shutil.copytree(tokenizer, tmp_path / "cache" / "smoke" / tokenizer.name)
    monkeypatch.setattr(bases, "BASES_ROOT", tmp_path / "bases")
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "cache")
    key = substrate.warm_start_recipe("smoke", "math", 0, _config())[1]
    weights, sidecar = bases.paths("smoke", "math", 0, key)
    return {"row": row, "key": key, "weights": weights, "sidecar": sidecar, "trained_cache": root / "trained"}


def _no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("trained a base that should have been loaded from bases/")

    monkeypatch.setattr(substrate, "train_warm_start", refuse)


def _fake_training(monkeypatch):
    """Count trainings instead of running them (what is cached is what matters)."""
    trained = []

    def quick(*args, **kwargs):
        trained.append(1)
        return [{"step": 0, "loss": 1.0, "val_score": 0.0, "time_s": 0.0}]

    monkeypatch.setattr(substrate, "train_warm_start", quick)
    return trained


def test_a_shipped_base_is_loaded_verified_and_not_trained(shipped, monkeypatch):
    _no_training(monkeypatch)
    config, key = _config(), shipped["key"]
    # the workers' builder finds it, so no worker trains it (the check materialises it into the cache)
    assert substrate.build_warm_starts("smoke", [("math", 0)], config, jobs=2, log=_quiet) == {}
    lines = []
    model, _, info = substrate.warm_start("smoke", "math", 0, config=config, log=lines.append)
    assert info["cached"] and info["shipped"]["file"] == bases.shown(shipped["weights"])
    assert info["shipped"]["sha256"] == bases.file_sha256(shipped["weights"])
    assert bases.state_digest(model) == shipped["row"]["state_digest"]
    assert info["steps"] == 12 and len(info["curve"]) == 3  # the trained base's curve travels with it
    assert not lines  # materialised by build_warm_starts above; warm_start only loads the cache entry

    meta = bases.read_sidecar(shipped["sidecar"])
    assert runs.cache_key(meta["recipe"]["config"], version=meta["recipe"]["library_version"]) == key
    assert meta["trained_on"]["cpu"]["vendor"] == threads.cpu_model()["vendor"] and meta["kind"] == "math"
    assert meta["weights_bytes"] == shipped["weights"].stat().st_size and meta["vocab_size"] > 0

    keys = shipped_bases.report("smoke", 0, {"math": model}, {"math": info}, config=config, log=lines.append)
    assert keys == {"base_source_math_seed0": "shipped", "base_shipped_math_seed0": bases.shown(shipped["weights"]),
                    "base_rebuild_math_seed0": None}
    assert any("loaded from" in line and "sha256 verified" in line for line in lines)


def test_warm_start_says_it_loaded_the_shipped_base(shipped, monkeypatch):
    _no_training(monkeypatch)
    lines = []
    _, _, info = substrate.warm_start("smoke", "math", 0, config=_config(), log=lines.append)
    assert info["shipped"] and lines == [f"[warm_start math] seed 0: loaded the shipped base "
                                         f"{bases.shown(shipped['weights'])} (sha256 verified), not trained"]


def test_a_damaged_cache_entry_is_refilled_from_the_shipped_base(shipped, monkeypatch):
    _no_training(monkeypatch)
    _, _, info = substrate.warm_start("smoke", "math", 0, config=_config(), log=_quiet)
    cached = runs.CACHE_ROOT / "smoke" / info["cache_dir"].split("/")[-1] / "model" / "model.safetensors"
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 2])
    with pytest.warns(runs.CorruptCacheWarning):
        model, _, info = substrate.warm_start("smoke", "math", 0, config=_config(), log=_quiet)
    assert info["shipped"] and bases.state_digest(model) == shipped["row"]["state_digest"]  # not retrained


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "sidecar", "weights missing"])
def test_a_damaged_shipped_base_is_a_one_line_error_naming_the_file(shipped, monkeypatch, damage):
    _no_training(monkeypatch)
    weights, sidecar = shipped["weights"], shipped["sidecar"]
    data = bytearray(weights.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x01
        weights.write_bytes(bytes(data))
    elif damage == "truncated":
        weights.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "sidecar":
        sidecar.write_text(sidecar.read_text()[:50])
    else:
        weights.unlink()
    with pytest.raises(bases.ShippedBaseError) as caught:
        substrate.warm_start("smoke", "math", 0, config=_config(), log=_quiet)
    message = str(caught.value)
    named = sidecar if damage == "sidecar" else weights
    assert "\n" not in message and bases.shown(named) in message
    assert "restore it" in message and "delete" in message
    if damage in ("flipped byte", "truncated"):
        assert "does not match" in message and "sha256" in message
    folder = substrate.warm_start_folder("smoke", "math", 0, config=_config(), shipped=False)[0]
    assert not (folder / "model").exists()  # nothing half-copied into the cache


def test_a_recipe_key_with_no_shipped_base_trains_and_says_so(shipped, monkeypatch):
    trained = _fake_training(monkeypatch)
    other = _config(math_steps=6, eval_every=3)
    other_key = substrate.warm_start_recipe("smoke", "math", 0, other)[1]
    assert other_key != shipped["key"]
    lines = []
    model, _, info = substrate.warm_start("smoke", "math", 0, config=other, log=lines.append)
    assert len(trained) == 1 and not info["cached"] and "shipped" not in info
    assert any(f"no shipped base with recipe key {other_key}" in line and shipped["key"] in line
               and "training it" in line for line in lines), lines
    keys = shipped_bases.report("smoke", 0, {"math": model}, {"math": info}, config=other, log=lines.append)
    assert keys["base_source_math_seed0"] == "trained" and keys["base_shipped_math_seed0"] is None
    # FORCE retrains and never reads the shipped base
    substrate.warm_start("smoke", "math", 0, force=True, config=_config(), log=_quiet)
    assert len(trained) == 2


def test_a_base_shipped_with_another_tokenizer_is_trained_instead(shipped, monkeypatch):
    trained = _fake_training(monkeypatch)
    meta = runs.read_json(shipped["sidecar"])
    runs.atomic_write_json(shipped["sidecar"], {**meta, "tokenizer_sha256": "0" * 64})
    lines = []
    _, _, info = substrate.warm_start("smoke", "math", 0, config=_config(), log=lines.append)
    assert len(trained) == 1 and "shipped" not in info
    assert any("another tokenizer" in line and "not used" in line for line in lines), lines


def test_a_rebuild_compares_bitwise_and_names_the_cpu_vendors(shipped, monkeypatch):
    config = _config()
    model, _, info = substrate.warm_start("smoke", "math", 0, config=config, log=_quiet)
    assert info["shipped"]
    before = sorted(p.name for p in (runs.CACHE_ROOT / "smoke").iterdir())
    keys = shipped_bases.report("smoke", 0, {"math": model}, {"math": info}, config=config, rebuild=True, log=_quiet)
    assert keys["base_rebuild_math_seed0"] == "equal"  # retrained from scratch in a temporary cache
    assert sorted(p.name for p in (runs.CACHE_ROOT / "smoke").iterdir()) == before  # this cache untouched
    assert shipped_bases.compare("smoke", [("qa", 0)], config, log=_quiet) == {("qa", 0): "not shipped"}
    meta = bases.read_sidecar(shipped["sidecar"])
    other = {**meta, "trained_on": {"cpu": {"vendor": "GenuineIntel"}}}
    assert shipped_bases.verdict(meta["state_digest"], other) == "equal"
    assert shipped_bases.verdict("f" * 64, other) == f"differs (CPU vendor GenuineIntel vs {threads.cpu_model()['vendor']})"
    # a base trained here beside a shipped one of its recipe is compared with it at no cost
    monkeypatch.setenv(shipped_bases.REBUILD_ENV, "0")
    keys = shipped_bases.report("smoke", 0, {"math": model}, {"math": {**info, "shipped": None, "cached": False}},
                                config=config, log=_quiet)
    assert keys["base_source_math_seed0"] == "trained" and keys["base_rebuild_math_seed0"] == "equal"


def test_make_bases_never_overwrites_a_different_shipped_base(shipped, monkeypatch):
    monkeypatch.setattr(runs, "CACHE_ROOT", shipped["trained_cache"])  # where the shipped base was trained
    _no_training(monkeypatch)
    assert [r["status"] for r in shipped_bases.ship("smoke", [("math", 0)], _config(), log=_quiet)] == ["unchanged"]
    meta = runs.read_json(shipped["sidecar"])
    runs.atomic_write_json(shipped["sidecar"], {**meta, "state_digest": "e" * 64})
    with pytest.raises(bases.ShippedBaseError, match="REPLACE=1"):
        shipped_bases.ship("smoke", [("math", 0)], _config(), log=_quiet)
    rows = shipped_bases.ship("smoke", [("math", 0)], _config(), replace=True, log=_quiet)
    assert rows[0]["status"] == "replaced" and runs.read_json(shipped["sidecar"])["state_digest"] == meta["state_digest"]


def test_the_command_line_errors_are_one_line(capsys):
    assert shipped_bases.main(["--profile", "smoke", "--kinds", "chess"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'chess' is not a task kind" in err and "math" in err
    assert shipped_bases.main(["--profile", "smoke", "--seeds", "0,x"]) == 1
    assert "comma-separated integers" in capsys.readouterr().err


def test_the_command_says_when_a_base_is_not_shipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bases, "BASES_ROOT", tmp_path / "bases")
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "cache")
    assert shipped_bases.main(["--profile", "smoke", "--kinds", "qa", "--seeds", "3", "--rebuild"]) == 2
    assert "qa seed 3: not shipped (make bases PROFILE=smoke ships it)" in capsys.readouterr().out


# --------------------------------------------------------------------------- the committed smoke bases
@pytest.mark.parametrize("profile", ["smoke", "cpu"])
def test_the_committed_bases_are_the_profiles_and_intact(profile):
    """bases/<profile>/ ships every base a run of the profile uses, under the key the profile's recipe has now, its
    weights matching their digest: so a run loads them instead of training. After a change of the recipe, the
    data or the library version: `make bases PROFILE=<profile>` (and commit bases/<profile>/). The cpu bases are
    the very weights the default's pre-run seed check measured (their state digest is the record's)."""
    from copes_lib.protocols.testbed.substrate_setup import use_profile_data

    config = substrate_config(profile)
    use_profile_data(profile)
    for kind, seed in shipped_bases.default_pairs(profile):
        key = substrate.warm_start_recipe(profile, kind, seed, config)[1]
        weights, sidecar = bases.paths(profile, kind, seed, key)
        assert sidecar.exists(), (f"no shipped {profile} base for {kind} seed {seed} with key {key} (shipped: "
                                  f"{[p.name for p in bases.shipped(profile, kind, seed)]}): run make bases PROFILE={profile}")
        meta = bases.read_sidecar(sidecar)
        assert bases.file_sha256(weights) == meta["weights_sha256"], weights
        assert meta["recipe_key"] == key and meta["kind"] == kind and meta["seed"] == seed
        if profile == "cpu":
            record = runs.read_json(runs.REPO_ROOT / "results" / "preflight" / "cpu.json")
            assert meta["state_digest"] == record["kinds"][f"{kind} seed {seed}"]["base_digest"]


@pytest.mark.slow(cost=90)  # one smoke math warm start: about 60 s of CPU measured (23 min of wall under load 20)
def test_the_shipped_smoke_math_base_rebuilds_bitwise_on_its_cpu_vendor(tmp_path, monkeypatch):
    """The shipped smoke math base, retrained from scratch in a temporary cache, is the same bits on a machine of
    the CPU vendor it was trained on (another vendor: reported as differing, docs/reproducibility.md; skipped)."""
    monkeypatch.setattr(runs, "CACHE_ROOT", tmp_path / "cache")  # the caller's cache: neither read nor written
    config = substrate_config("smoke")
    key = substrate.warm_start_recipe("smoke", "math", 0, config)[1]
    meta = bases.read_sidecar(bases.paths("smoke", "math", 0, key)[1])
    result = shipped_bases.compare("smoke", [("math", 0)], config, log=_quiet)[("math", 0)]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("model"))
    here, there = threads.cpu_model()["vendor"], shipped_bases.cpu_vendor(meta["trained_on"])
    if here != there:
        assert result in ("equal", f"differs (CPU vendor {there} vs {here})")
        pytest.skip(f"shipped on {there}, this machine is {here}: {result}")
    assert result == "equal"
