"""benchmarks/bench_es.py's matmul replay (the ceiling of the rollouts' compute fraction): its FLOP count per op
and, on the benchmark's own tiny fallback model, a replay that finds every matmul of the step."""

import sys
from pathlib import Path

import pytest

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
