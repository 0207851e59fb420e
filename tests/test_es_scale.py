"""ES at scale, on the CPU: fp32 master weights under bf16 compute weights, exact member restore, and
the Ray backend (two actors, lockstep seeds, a dying actor and the resume after it)."""

from __future__ import annotations

import copy
import functools
import os
import sys
import types

import pytest
import torch
from torch import nn

from copes_lib.config import ConfigError
from copes_lib.es import ES, ESConfig, es_step
from copes_lib.es_objective import QuadraticObjective, toy_quadratic
from copes_lib.es_training import train_es

torch.set_num_threads(1)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float().clone() for t in tensors])


class CyclingRewards:
    """Fitness that ignores the model: the same reward sequence whatever the weights' dtype, so a
    bf16 run and an fp32 run make the same updates."""

    def __init__(self):
        self.calls = 0

    def fitness(self, model, step):
        self.calls += 1
        return float((self.calls * 7919) % 13) / 13.0

    def validate(self, model):
        return {"score": 0.0}


class Norms(nn.Module):
    """RMSNorm-like weights at 1.0, the case bf16 updates lose."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(256))
        self.proj = nn.Parameter(torch.linspace(-1, 1, 512))


def test_bf16_small_update_is_kept_in_the_fp32_master():
    config = ESConfig(population=8, subspaces=2, sigma=1e-3, alpha=5e-4, chunk_size=128, seed=1)
    ref_model, half_model = Norms(), Norms().to(torch.bfloat16)
    # the bf16 replica starts from the exact fp32 values (as a Ray worker does)
    ref, half = ES(ref_model, config), ES(half_model, config, master=[p.data for p in Norms().parameters()])
    assert half.mixed and not ref.mixed and ref.master[0] is ref.params[0]
    ref_objective, half_objective = CyclingRewards(), CyclingRewards()
    for step in (1, 2, 3):
        es_step(ref, step, ref_objective)
        es_step(half, step, half_objective)
    # the master followed the fp32 run exactly; a plain bf16 update would not have moved weights at 1.0
    assert torch.equal(flat(half.master), flat(ref.params))
    moved = (half.master[0] - 1.0).abs()
    assert moved.max() > 0 and moved.max() < 2 ** -9  # below bf16's half-spacing at 1.0
    assert torch.equal(half_model.weight, half.master[0].to(torch.bfloat16))  # compute = round(master)
    naive = torch.ones(256, dtype=torch.bfloat16) + (half.master[0] - 1.0).to(torch.bfloat16)
    assert torch.equal(naive, torch.ones(256, dtype=torch.bfloat16))  # ...which adding in bf16 loses


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_member_is_made_and_undone_exactly(dtype):
    model = Norms().to(dtype)
    es = ES(model, ESConfig(population=4, subspaces=2, sigma=0.3, chunk_size=100, seed=2))
    plan, before = es.plan(1), flat(model.parameters())
    backup = es.backup()
    for k, i in plan.members():
        es.perturb(plan, k, i)
        assert not torch.equal(flat(model.parameters()), before)
        es.restore(plan, k, i, backup)
        assert torch.equal(flat(model.parameters()), before)


def test_subtract_restore_is_refused_for_bf16():
    with pytest.raises(ConfigError, match="restore"):
        ES(Norms().to(torch.bfloat16), ESConfig(population=4, subspaces=2, restore="subtract"))


def test_bf16_resume_keeps_the_master(tmp_path):
    config = ESConfig(population=4, subspaces=2, sigma=1e-3, alpha=5e-4, chunk_size=128, seed=1)
    full, part = Norms().to(torch.bfloat16), Norms().to(torch.bfloat16)
    train_es(full, CyclingRewards(), config, steps=3, val_every=10, run_dir=tmp_path / "full")
    objective = CyclingRewards()
    train_es(part, objective, config, steps=2, val_every=10, run_dir=tmp_path / "part")
    resumed = Norms().to(torch.bfloat16)  # a fresh process: only the checkpoint survives
    train_es(resumed, objective, config, steps=3, val_every=10, run_dir=tmp_path / "part")
    assert torch.equal(flat(full.parameters()), flat(resumed.parameters()))
    saved = torch.load(tmp_path / "part" / "last.pt", weights_only=False)
    assert "master" in saved and saved["master"][0].dtype == torch.float32


# ----------------------------------------------------------------------------- ray
class DyingQuadratic(QuadraticObjective):
    """Kills its worker process at ``die_at`` (a crashed GPU, an OOM-killed actor); in-process
    (the fake cluster) it raises instead."""

    def __init__(self, target, die_at: int, hard: bool):
        super().__init__(target)
        self.die_at, self.hard = die_at, hard

    def fitness(self, model, step):
        if step == self.die_at:
            if self.hard:
                os._exit(3)
            raise RuntimeError("worker crashed")
        return super().fitness(model, step)


def dying_quadratic(seed: int, die_at: int, hard: bool = True):
    model, objective = toy_quadratic(seed)
    return model, DyingQuadratic(objective.target, die_at, hard)


def fake_ray_modules() -> dict[str, types.ModuleType]:
    """An in-process stand-in for the parts of Ray that RayBackend uses: actors are objects whose
    arguments and results are deep-copied (as if they crossed a process boundary), and a method
    that raises surfaces as a RayError at ``get``. It tests the backend's logic where a real local
    cluster cannot start (an overloaded machine); the real-cluster test below runs the same checks."""
    ray = types.ModuleType("ray")
    ray.exceptions = types.SimpleNamespace(RayError=type("RayError", (Exception,), {}))

    class Ref:
        def __init__(self, call):
            try:
                self.value, self.error = copy.deepcopy(call()), None
            except Exception as err:  # noqa: BLE001 - what a remote task raises
                self.value, self.error = None, err

    class Handle:
        def __init__(self, instance):
            self._instance = instance

        def __getattr__(self, name):
            method = getattr(self._instance, name)
            return types.SimpleNamespace(remote=lambda *a: Ref(lambda: method(*copy.deepcopy(a))))

    class ActorClass:
        def __init__(self, cls):
            self.cls = cls

        def options(self, **kw):
            return self

        def remote(self, *args):
            return Handle(self.cls(*copy.deepcopy(args)))

    def get(refs, timeout=None):
        single = isinstance(refs, Ref)
        out = []
        for ref in [refs] if single else refs:
            if ref.error is not None:
                raise ray.exceptions.RayError(f"actor died: {ref.error!r}")
            out.append(ref.value)
        return out[0] if single else out

    ray.is_initialized = lambda: True
    ray.cluster_resources = lambda: {"CPU": 2.0}
    ray.remote = lambda **kw: ActorClass
    ray.put = lambda value: value
    ray.get = get
    ray.kill = lambda handle: None
    group_module = types.ModuleType("ray.util.placement_group")
    group_module.placement_group = lambda bundles, strategy: types.SimpleNamespace(
        bundles=bundles, ready=lambda: Ref(lambda: True))
    group_module.remove_placement_group = lambda group: None
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.PlacementGroupSchedulingStrategy = lambda **kw: kw
    util = types.ModuleType("ray.util")
    return {"ray": ray, "ray.util": util, "ray.util.placement_group": group_module,
            "ray.util.scheduling_strategies": strategies}


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    from ray_local import isolated_ray

    with isolated_ray(prefix="ray_scale_") as ray:  # a cluster of its own: never another Ray user's
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
        yield ray


def _config(**kw) -> ESConfig:
    return ESConfig(**{**dict(population=8, subspaces=2, sigma=0.1, alpha=0.05, chunk_size=64, seed=3,
                              ray_workers=2), **kw})


def _two_workers_then_a_dying_one_and_resume(tmp_path, hard: bool):
    # the single-process reference: 3 steps
    ref_model, objective = toy_quadratic(9)
    ref = train_es(ref_model, objective, _config(), steps=3, val_every=10, run_dir=tmp_path / "ref").history

    # two workers, same seeds: the same member rewards and parameters, step by step
    model, _ = toy_quadratic(9)
    ray_config = _config(backend="ray")
    history = train_es(model, objective, ray_config, steps=3, val_every=10, run_dir=tmp_path / "ray",
                       worker_factory=functools.partial(toy_quadratic, 9)).history
    assert [r.get("reward/mean") for r in history] == [r.get("reward/mean") for r in ref]
    assert [r.get("reward/std") for r in history] == [r.get("reward/std") for r in ref]
    assert torch.equal(flat(model.parameters()), flat(ref_model.parameters()))

    # a worker dies at step 2: the step fails with its error and nothing is written to the model
    model, _ = toy_quadratic(9)
    run_dir = tmp_path / "dies"
    with pytest.raises(RuntimeError, match="Ray worker failed during step 2"):
        train_es(model, objective, ray_config, steps=3, val_every=10, run_dir=run_dir,
                 worker_factory=functools.partial(dying_quadratic, 9, 2, hard))
    assert torch.load(run_dir / "last.pt", weights_only=False)["step"] == 1
    after_step_1 = ES(toy_quadratic(9)[0], _config())
    es_step(after_step_1, 1, objective)
    assert torch.equal(flat(model.parameters()), flat(after_step_1.params))

    # the rerun resumes from the step-1 checkpoint and ends where the uninterrupted run did
    resumed_model, _ = toy_quadratic(9)
    resumed = train_es(resumed_model, objective, ray_config, steps=3, val_every=10, run_dir=run_dir,
                       worker_factory=functools.partial(toy_quadratic, 9)).history
    assert [r["reward/mean"] for r in resumed[1:]] == [r["reward/mean"] for r in ref[1:]]
    assert torch.equal(flat(resumed_model.parameters()), flat(ref_model.parameters()))


def test_ray_backend_logic_in_process(tmp_path, monkeypatch):
    for name, module in fake_ray_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    _two_workers_then_a_dying_one_and_resume(tmp_path, hard=False)


def test_ray_two_actors_then_a_dying_actor_and_resume(ray_cluster, tmp_path):
    _two_workers_then_a_dying_one_and_resume(tmp_path, hard=True)
