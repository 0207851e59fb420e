"""benchmarks/bench_es.py's matmul replay (the ceiling of the rollouts' compute fraction): its FLOP count per op
and, on the benchmark's own tiny fallback model, a replay that finds every matmul of the step."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_es  # noqa: E402

from copes_lib.es import ESConfig  # noqa: E402


@pytest.mark.parametrize("name,shapes,flops", [
    ("aten::bmm", [[8, 16, 160], [8, 160, 480]], 2 * 8 * 16 * 160 * 480),
    ("aten::mm", [[16, 160], [160, 64]], 2 * 16 * 160 * 64),
    ("aten::addmm", [[64], [16, 160], [160, 64]], 2 * 16 * 160 * 64),
    ("aten::bmm", [[16, 160], [160, 64]], None),  # not the shapes of a bmm: not replayed
    ("aten::matmul", [[16, 160], [160, 64]], None),
])
def test_matmul_flops_reads_the_profilers_shapes(name, shapes, flops):
    assert bench_es._matmul_flops(name, shapes) == flops


def test_the_replay_finds_the_steps_matmuls_on_the_fallback_model():
    model, objective, _ = bench_es._fallback(batch=2)
    config = ESConfig(population=2, subspaces=1, sigma=1e-2, alpha=5e-3, chunk_size=4096)
    replay = bench_es.matmul_replay(model, objective, config)
    assert replay["unreplayed_calls"] == 0 and replay["matmul_calls"] > 0 and replay["replay_cpu_s"] > 0
    # the replayed products are the rollouts' (2 x matmul parameters x tokens), give or take the attention's
    # own matmuls and rows that are computed but not counted
    assert 0.5 < replay["replayed_gflop"] / replay["rollout_gflop_estimate"] < 2.0, replay
    assert replay["ceiling_fraction_of_matmul"] > 0
    # the step's attention calls are found too (sdpa on the fallback model), and counting their time lowers
    # the ceiling
    assert replay["attention_calls"] > 0 and replay["attention_replay_cpu_s"] > 0, replay
    assert 0 < replay["ceiling_with_attention_fraction"] < replay["ceiling_fraction_of_matmul"]


def test_streamed_weights_times_a_decode_steps_matmuls_both_ways():
    model, _, _ = bench_es._fallback(batch=2)
    out = bench_es.streamed_weights(model, members=2, rows=2, repeats=2)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert out["weights_mb"] == pytest.approx(2 * sum(m.weight.numel() for m in linears) * 4 / 1e6)
    assert out["streamed_ms_per_decode_step"] > 0 and out["hot_ms_per_decode_step"] > 0
    assert out["streamed_fraction_of_matmul"] > 0 and out["hot_fraction_of_matmul"] > 0


def test_the_variants_run_the_batched_step_with_each_change(monkeypatch):
    model, objective, _ = bench_es._fallback(batch=2)
    seen = []
    real = bench_es.ESConfig

    def recording(**values):
        seen.append({k: values[k] for k in ("backend", "members_per_batch", "noise_rank") if k in values})
        return real(**values)

    monkeypatch.setattr(bench_es, "ESConfig", recording)
    config = ESConfig(population=4, subspaces=1, sigma=1e-2, alpha=5e-3, chunk_size=4096)
    out = bench_es.variants(model, objective, config, bench_es.CpuClock(objective), repeats=1)
    assert set(out) == set(bench_es.VARIANTS)
    assert all(v["fraction_of_matmul"] > 0 for v in out.values())
    assert {"backend": "batched", "members_per_batch": 2} in seen  # to_dict leaves out noise_rank 0
    assert {"backend": "batched", "members_per_batch": 0, "noise_rank": 4} in seen
