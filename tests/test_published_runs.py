"""Predicted vs published throughput of real 3-D parallel runs (planner/bench/published.py, docs/parallel.md)."""

import pytest

from planner.bench.published import COMPUTE_SCALE, PUBLISHED_RUNS, TOLERANCE, predict, published_table
from planner.parallel import ParallelConfig

RUNS = {r.name: r for r in PUBLISHED_RUNS}


def test_published_data_is_consistent():
    for r in PUBLISHED_RUNS:
        assert r.dp * r.pp * r.tp == r.gpus, r.name
        assert r.global_batch % r.dp == 0 and r.source
        assert 100 < r.tflops_per_gpu < 312  # below the A100's 312 TFLOP/s peak
    assert 0.5 < COMPUTE_SCALE < 2.0  # one global constant, not per row


@pytest.mark.parametrize("name", list(RUNS))
def test_forced_prediction_within_tolerance_of_published(name):
    run = RUNS[name]
    best = predict(run).best
    assert best.config == ParallelConfig(dp=run.dp, pp=run.pp, tp=run.tp, zero=run.zero)
    assert best.fits
    err = best.tflops_per_gpu / run.tflops_per_gpu - 1.0
    assert abs(err) <= TOLERANCE, f"{name}: predicted {best.tflops_per_gpu:.1f} vs published {run.tflops_per_gpu}"


@pytest.mark.parametrize("name", ["megatron-1.7B", "megatron-18.4B", "megatron-145.6B", "megatron-529.6B", "bloom-176B"])
def test_auto_never_slower_than_the_published_layout(name):
    run = RUNS[name]
    forced, auto = predict(run).best, predict(run, auto=True).best
    assert auto.config.gpus == run.gpus
    assert auto.iteration_ms <= forced.iteration_ms * (1 + 1e-9)


def test_table_has_every_run():
    t = published_table(auto=False)
    assert [r[0] for r in t.rows] == list(RUNS)
    assert t.summary["max_abs_error"] <= TOLERANCE
