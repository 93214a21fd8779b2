"""The outer search: plans fit in the simulator, are deterministic, and win for the right reasons."""

import re
from dataclasses import replace

import numpy as np
import pytest

from planner.calibration import Calibration
from planner.errors import InfeasibleError, PplanError, ScheduleError
from planner.partition import PartitionSettings, partition, summary_dict, summary_text
from planner.partition.synthetic import gpt_like, synthetic_profile, uniform_layers
from planner.plan import StagePlan, plan_to_json
from planner.simulate import simulate
from planner.units import parse_bytes

from helpers.oracles import dp_plan_fits_the_simulator
from helpers.profiles import random_profile


def test_dp_feasible_plans_fit_in_the_simulator_on_random_instances():
    rng = np.random.default_rng(2024)
    checked = 0
    for case in range(60):
        checked += dp_plan_fits_the_simulator(rng, case, random_profile(rng, int(rng.integers(2, 11)))) is not None
    assert checked >= 25


@pytest.fixture(scope="module")
def gpt():
    return gpt_like(n_blocks=12, hidden=512, seq=256, vocab=32000)


def test_plan_is_deterministic_and_simulates_to_its_prediction(gpt):
    settings = PartitionSettings(n_devices=4, memory_bytes=parse_bytes("4GiB"), global_batch=32)
    a, b = partition(gpt, settings), partition(gpt, settings)
    assert plan_to_json(a.plan) == plan_to_json(b.plan)
    a.plan.validate(gpt.n_layers)
    again = simulate(a.plan, gpt)
    assert again.iteration_ms == pytest.approx(a.plan.predicted.iteration_ms, rel=1e-12)
    assert again.fits
    assert a.plan.model == gpt.meta["model"] and a.plan.seed == 0 and a.plan.n_layers == gpt.n_layers
    assert a.plan.profile_sha256 == gpt.sha256
    search = a.plan.search
    assert search.candidates[0].iteration_ms == a.plan.predicted.iteration_ms
    assert {r.method for r in search.baselines} == {"uniform", "params", "time"} - {a.chosen.origin} | ({"dp"} if a.chosen.origin != "dp" else set())
    # each baseline row is what its cuts really simulate to, and its slowdown is that time over the
    # plan's (">= 1" alone would hold by construction: the plan is the fastest candidate)
    for row in search.baselines:
        c = row.cuts
        alt = replace(a.plan, schedule=row.schedule, n_microbatches=row.n_microbatches,
                      micro_batch_size=row.micro_batch_size,
                      stages=tuple(StagePlan(i, (c[i], c[i + 1])) for i in range(len(c) - 1)))
        sim = simulate(alt, gpt)
        assert sim.iteration_ms == pytest.approx(row.iteration_ms, rel=1e-12), row.method
        assert max(sim.peak_memory_bytes) == pytest.approx(row.peak_memory_bytes, rel=1e-12)
        assert row.fits == (max(sim.peak_memory_bytes) <= parse_bytes("4GiB"))
        assert row.slowdown_vs_plan == pytest.approx(row.iteration_ms / a.plan.predicted.iteration_ms, rel=1e-12)
    assert max(r.slowdown_vs_plan for r in search.baselines) > 1.1  # the uniform split loses on this model
    text = summary_text(a)
    assert "bottleneck: stage" in text and "baselines" in text and "<- plan" in text
    assert summary_dict(a)["stages"][0]["first_name"] == "embed"


def test_dp_method_is_at_least_as_balanced_as_baselines(gpt):
    res = partition(gpt, PartitionSettings(n_devices=4, memory_bytes=None, global_batch=32, method="dp",
                                           schedule="1f1b", microbatches=8))
    dp = next(c for c in res.search.candidates if c.method == "dp")
    assert res.chosen.iteration_ms <= dp.iteration_ms
    same_point = [c for c in res.search.candidates if c.point == dp.point and c.origin != "dp" and not c.polished]
    assert {c.method for c in same_point} == {"uniform", "params", "time"}  # the comparison below is not empty
    for c in same_point:
        assert dp.bottleneck_ms <= c.bottleneck_ms + 1e-9


def _overhead_profile(overhead_samples: float):
    n = 16
    return synthetic_profile([f"l{i}" for i in range(n)], np.full(n, 1.0), np.full(n, 1e6), np.full(n, 1e5), np.full(n, 1e3),
                  overhead_samples, (1, 2, 4, 8, 16, 32, 64), {})


def test_microbatch_count_weighs_inefficiency_against_the_bubble():
    settings = PartitionSettings(n_devices=4, memory_bytes=None, global_batch=64, schedule="1f1b")
    efficient = partition(_overhead_profile(0.0), settings).plan.n_microbatches
    wasteful = partition(_overhead_profile(16.0), settings).plan.n_microbatches
    assert efficient == 64  # free micro-batching: the smallest bubble wins
    assert 4 <= wasteful < efficient  # a costly micro-batch: fewer, larger ones win (no "M >= 4K" rule)


def test_recompute_only_where_memory_needs_it(gpt):
    free = partition(gpt, PartitionSettings(n_devices=4, memory_bytes=None, global_batch=32))
    assert all(not st.recompute for st in free.plan.stages)
    roomy = max(free.plan.predicted.devices[d].peak_memory_bytes for d in range(4))
    tight_limit = int(roomy * 0.35)
    tight = partition(gpt, PartitionSettings(n_devices=4, memory_bytes=tight_limit, global_batch=32))
    assert tight.chosen.fits and max(tight.chosen.sim.peak_memory_bytes) <= tight_limit
    assert any(st.recompute for st in tight.plan.stages)  # the limit made recompute worth it here
    # Without recompute a plan still fits this limit (a fixed synthetic model: no try/except
    # either way), but only a slower one: the recompute was chosen because it pays. (>= would
    # hold by construction, since the recompute search includes every no-recompute plan.)
    none = partition(gpt, PartitionSettings(n_devices=4, memory_bytes=tight_limit, global_batch=32, recompute="none"))
    assert all(not st.recompute for st in none.plan.stages)
    assert none.plan.predicted.iteration_ms > tight.plan.predicted.iteration_ms * 1.01
    assert tight.plan.predicted.iteration_ms > free.plan.predicted.iteration_ms * 1.01  # the limit costs time


def test_closed_form_uniform_stages_without_communication():
    prof = uniform_layers(n_layers=8, fwd_ms=1.0, out_bytes=0.0, sizes=(1, 2))
    for name in ("gpipe", "1f1b"):
        res = partition(prof, PartitionSettings(n_devices=4, memory_bytes=None, global_batch=8, microbatches=8,
                                                schedule=name, latency_ms=0.0))
        f, b = 2 * 1.0, 2 * 2.0  # two layers per stage, micro-batch of 1
        assert res.plan.predicted.iteration_ms == pytest.approx((8 + 4 - 1) * (f + b))
        assert res.plan.predicted.bubble_fraction == pytest.approx((4 - 1) / (8 + 4 - 1))
        assert [st.layers for st in res.plan.stages] == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_infeasible_memory_names_a_memory_and_device_count_that_work(gpt):
    settings = PartitionSettings(n_devices=2, memory_bytes=parse_bytes("500MiB"), global_batch=16)
    with pytest.raises(InfeasibleError) as info:
        partition(gpt, settings)
    msg = info.value.one_line()
    need = re.search(r"--memory (\S+GiB|\S+MiB)", msg).group(1)
    devs = int(re.search(r"--devices (\d+)", msg).group(1))
    assert partition(gpt, PartitionSettings(n_devices=2, memory_bytes=parse_bytes(need), global_batch=16)).chosen.fits
    assert partition(gpt, PartitionSettings(n_devices=devs, memory_bytes=parse_bytes("500MiB"), global_batch=16)).chosen.fits
    with pytest.raises(InfeasibleError):
        partition(gpt, PartitionSettings(n_devices=devs - 1, memory_bytes=parse_bytes("500MiB"), global_batch=16))
    with pytest.raises(InfeasibleError):
        partition(gpt, PartitionSettings(n_devices=2, memory_bytes=int(parse_bytes(need) * 0.99), global_batch=16))


@pytest.mark.parametrize("kwargs, error", [
    (dict(n_devices=0), PplanError),
    (dict(n_devices=15), PplanError),  # 14 layers
    (dict(microbatches=5), PplanError),
    (dict(schedule="pipedream"), ScheduleError),
    (dict(method="magic"), PplanError),
    (dict(recompute="some"), PplanError),
    (dict(optimizer="lion"), PplanError),
    (dict(schedule="1f1b", microbatches=2), ScheduleError),
    (dict(schedule="interleaved", n_devices=8), PplanError),
])
def test_bad_settings_raise_one_line_errors(gpt, kwargs, error):
    base = dict(n_devices=4, memory_bytes=None, global_batch=32)
    with pytest.raises(error) as info:
        partition(gpt, PartitionSettings(**{**base, **kwargs}))
    assert "\n" not in info.value.one_line()


def test_interpolated_micro_batch_sizes_are_flagged():
    prof = uniform_layers(n_layers=8, sizes=(1, 4))
    res = partition(prof, PartitionSettings(n_devices=2, memory_bytes=None, global_batch=8, microbatches=4, schedule="gpipe"))
    assert res.plan.micro_batch_size == 2 and res.plan.predicted.interpolated is True


def test_calibration_enters_the_prediction():
    prof = uniform_layers(n_layers=8, out_bytes=0.0, sizes=(1, 2))
    settings = PartitionSettings(n_devices=2, memory_bytes=None, global_batch=4, microbatches=4, schedule="gpipe", latency_ms=0.0)
    plain = partition(prof, settings).plan.predicted.iteration_ms
    scaled = partition(prof, settings, calibration=Calibration(compute_scale=2.0)).plan
    assert scaled.predicted.iteration_ms == pytest.approx(2 * plain)
    assert scaled.search.calibrated is True


def test_ilp_method_reaches_the_dp_objective():
    prof = random_profile(np.random.default_rng(5), 6)
    res = partition(prof, PartitionSettings(n_devices=2, memory_bytes=None, global_batch=4, method="ilp", schedule="1f1b"))
    assert res.chosen.origin == "ilp" and res.plan.search.optimal is True
    for point in {c.point for c in res.search.candidates}:
        ilp = next(c for c in res.search.candidates if c.point == point and c.method == "ilp")
        dp = next(c for c in res.search.candidates if c.point == point and c.method == "dp")
        assert ilp.bottleneck_ms == pytest.approx(dp.bottleneck_ms, rel=1e-9)


def test_baseline_methods_produce_their_own_cuts(gpt):
    res = partition(gpt, PartitionSettings(n_devices=4, memory_bytes=None, global_batch=32, method="uniform",
                                           schedule="1f1b", microbatches=8))
    assert res.chosen.method == "uniform"
    assert [st.layers for st in res.plan.stages] == [(0, 4), (4, 8), (8, 11), (11, 14)]
